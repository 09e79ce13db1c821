-- Gives up the lock if this registry owns it, atomically: passes it to the
-- registry that has waited longest, or deletes it.
-- KEYS[1]: the lock's Redis key; KEYS[2]: its fence key; KEYS[3]: its
-- waiting marker; KEYS[4]: its queue (see mark.lua).
-- ARGV[1]: the registry's client id. The rest are sent only when the
-- registry expects them to be needed (see releaseRedis): ARGV[2]: the last
-- fencing token the registry handed out locally for this key, or 0;
-- ARGV[3]: the lease in milliseconds; ARGV[4]: the channel to notify
-- waiters on, or '' for none (a grant goes to ARGV[4]:<grantee's client
-- id>, which only the grantee subscribes to); ARGV[5]: the lock's key in its registry;
-- ARGV[6], only when giving back a grant nobody took: '<token>:<ms>', the
-- grant's token, which the key's last token must still be (an acquisition
-- of this registry that found the key its own drew a newer one, and keeps
-- the key), and the grant's lease, which the key's time to live must not
-- exceed (a hold this registry took with a plain SET NX once the grant had
-- expired leaves the grant's token the last, but has a full lease); else
-- ''. ARGV[7] and ARGV[8], only when a goroutine of this registry
-- waits for the key: the registry's mark and how long it lasts, in
-- milliseconds (obtain.lua's ARGV[5] and ARGV[3]); a grant then marks
-- this registry as waiting, as that goroutine's failed attempt would have.
-- Returns 0 when the key had expired or has another owner (which is left
-- untouched), 1 when deleted, 2 when deleted while another registry waits
-- (its mark, set by a failed attempt, has not lapsed), 3 when granted to a
-- waiting registry, or minus the grant's token if ARGV[7] marked this one,
-- and 4, changing nothing, when another registry waits and only ARGV[1]
-- was sent: call again with all the arguments.
-- A grant sets the key to the waiter's client id with the lease its mark
-- names, draws its token and publishes 'g<token>:<client id>:<key>'; a
-- release others wait for publishes 'w<key>' to wake them.
-- Called with KEYS[1] alone while the slot migrates between Redis Cluster
-- nodes: it only deletes the key; waiters find it free by polling.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[6] and ARGV[6] ~= '' then
  local token, lease = string.match(ARGV[6], '^(%d+):(%d+)$')
  if #KEYS == 1 or redis.call('GET', KEYS[2]) ~= token or redis.call('PTTL', KEYS[1]) > tonumber(lease) then
    return 0
  end
end
if #KEYS == 1 then
  redis.call('DEL', KEYS[1])
  return 1
end
local handedOut = tonumber(ARGV[2] or '0')
local now, nowMs, waiter
if #ARGV > 1 and ARGV[4] ~= '' then
  -- A release that may grant pops the first registry in the queue, and
  -- the next while the one popped has no live mark (it lapsed, or was
  -- withdrawn): fewer and cheaper calls than reading the queue and then
  -- removing from it, and a grant waits for this script to end.
  local popped = redis.call('ZPOPMIN', KEYS[4])
  if popped[1] then
    now = redis.call('TIME')
    nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    repeat
      local lapses = tonumber(redis.call('ZSCORE', KEYS[3], popped[1]))
      if lapses and lapses >= nowMs then
        waiter = popped[1]
      else
        if lapses then
          redis.call('ZREM', KEYS[3], popped[1])
        end
        popped = redis.call('ZPOPMIN', KEYS[4])
      end
    until waiter or not popped[1]
  end
  if waiter then
    local grantee, lease = string.match(waiter, '^(.*):(%d+)$')
    if grantee then
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('SET', KEYS[1], grantee, 'PX', lease)
      local token = drawToken(KEYS[2], now, ARGV[3], handedOut)
      redis.call('PUBLISH', ARGV[4] .. ':' .. grantee, 'g' .. string.format('%.0f', token) .. ':' .. grantee .. ':' .. ARGV[5])
      if ARGV[7] then
        markWaiting(KEYS[3], KEYS[4], nowMs, tonumber(ARGV[8]), ARGV[7])
        return -token
      end
      return 3
    end
    -- A mark that takes no grants has had its turn: a wake-up for all,
    -- in which it races the others. It goes to the back of the queue, so
    -- that it cannot hold grants up for the registries behind it while it
    -- loses races; popping the queue's last member deleted the queue with
    -- its TTL.
    redis.call('ZADD', KEYS[4], nowMs, waiter)
    local ttl = redis.call('PTTL', KEYS[3])
    if ttl > 0 then
      redis.call('PEXPIRE', KEYS[4], ttl)
    end
  end
end
-- With no grant to make (no channel, ARGV[1] alone, or no live mark in
-- the queue: an earlier version of the library marked in the marker
-- alone), a live mark makes this a release others wait for.
if not waiter and redis.call('EXISTS', KEYS[3]) == 1 then
  now = redis.call('TIME')
  nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  waiter = redis.call('ZRANGEBYSCORE', KEYS[3], nowMs, '+inf', 'LIMIT', 0, 1)[1]
  if waiter and #ARGV == 1 then
    return 4
  end
end
redis.call('DEL', KEYS[1])
-- Local hand-offs raise the token without a round trip; the stored token
-- must not fall behind them.
if handedOut > 0 then
  local last = tonumber(redis.call('GET', KEYS[2]))
  if not last or last < handedOut then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
end
if not waiter then
  return 1
end
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], 'w' .. ARGV[5])
end
return 2
