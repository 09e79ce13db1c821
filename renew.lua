-- Extends the lease of every key this registry still owns, atomically.
-- KEYS: lock keys (one slot on Redis Cluster); scripts.go builds the
-- arguments (renewArgs): the registry's client id and the lease in
-- milliseconds.
local clientID, leaseMs = ARGV[1], ARGV[2]
-- Returns, per key, 1 if renewed, 0 if it expired or has another owner
-- (which is left untouched).
local renewed = {}
for i, lockKey in ipairs(KEYS) do
  if redis.call('GET', lockKey) == clientID then
    redis.call('PEXPIRE', lockKey, leaseMs)
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
