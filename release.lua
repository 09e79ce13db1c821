-- Deletes the lock's key only if this registry owns it, atomically.
-- KEYS[1]: the lock's Redis key; KEYS[2]: its fence key; KEYS[3]: its
-- waiting marker.
-- ARGV[1]: the registry's client id; ARGV[2]: the last fencing token the
-- registry handed out locally for this key, or 0; ARGV[3]: the lease in
-- milliseconds; ARGV[4]: the channel to notify waiters on, or '' for none;
-- ARGV[5]: the notification (the lock's key in its registry).
-- Returns 0 when the key had expired or has another owner (which is left
-- untouched), 1 when deleted, 2 when deleted while another registry waits
-- (its mark, set by a failed attempt, has not lapsed).
-- Called with KEYS[1] alone while the slot migrates between Redis Cluster
-- nodes: it only deletes the key; waiters find it free by polling.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if #KEYS == 1 then
  return 1
end
-- Local hand-offs raise the token without a round trip; the stored token
-- must not fall behind them.
if ARGV[2] ~= '0' then
  local last = tonumber(redis.call('GET', KEYS[2]))
  if not last or last < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
local now = redis.call('TIME')
local nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if redis.call('ZCOUNT', KEYS[3], nowMs, '+inf') == 0 then
  return 1
end
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return 2
