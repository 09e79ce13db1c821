-- Extends the lease of every key this registry still owns, atomically.
-- KEYS: lock keys (one slot on Redis Cluster); Peer.Renew and
-- Peer.RenewTracked build the arguments: the registry's client id, the
-- lease in milliseconds, and whether to read the renewed keys again
-- ('1': the call runs on the registry's tracking connection).
local clientID, leaseMs, trackAgain = ARGV[1], ARGV[2], ARGV[3] == '1'
-- Returns, per key, 1 if renewed, 0 if it is gone (expired, deleted), 2
-- if it holds another value (left untouched): protocol.ReadRenew.
-- One MGET reads every key's owner: each redis.call costs the server
-- about a microsecond of its own, so one call for all the reads, rather
-- than a GET per key, leaves a call per key renewed.
if #KEYS == 0 then
  return {}
end
local owners = redis.pcall('MGET', unpack(KEYS))
-- readByKey says that the owners were read with a GET each.
local readByKey = owners.err ~= nil
if readByKey then
  -- An ACL written for an earlier version of the library may allow GET
  -- but not MGET: read key by key then.
  owners = {}
  for i, lockKey in ipairs(KEYS) do
    owners[i] = redis.call('GET', lockKey)
  end
end
local renewed, renewedKeys = {}, {}
for i, lockKey in ipairs(KEYS) do
  if owners[i] == clientID then
    renewed[i] = 1
    renewedKeys[#renewedKeys + 1] = lockKey
  elseif owners[i] then
    renewed[i] = 2
  else
    if not readByKey then
      -- MGET reads a key of another type as nil: GET fails on it with
      -- WRONGTYPE, as the native renewal (SET ... IFEQ) does. It fails
      -- before any PEXPIRE: on the tracking connection, a PEXPIRE that
      -- the failure kept from the read below would leave its key
      -- untracked, and NOLOOP would tell nobody.
      redis.call('GET', lockKey)
    end
    renewed[i] = 0
  end
end
for _, lockKey in ipairs(renewedKeys) do
  redis.call('PEXPIRE', lockKey, leaseMs)
end
if trackAgain and #renewedKeys > 0 then
  -- On the tracking connection, whose NOLOOP spares it the invalidation
  -- of its own PEXPIRE, the PEXPIRE still ended the key's tracking: a
  -- read tracks it again, in the same atomic step, so that no change
  -- can come between. EXISTS tracks the keys it names as MGET does, and
  -- replies one number instead of every value, which the script would
  -- copy into Lua strings only to drop them.
  redis.call('EXISTS', unpack(renewedKeys))
end
return renewed
