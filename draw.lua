-- Draws the fencing token of a hold, if this registry still holds the lock.
-- KEYS[1]: the lock's Redis key; KEYS[2]: its fence key.
-- ARGV[1]: the registry's client id; ARGV[2]: the lease in milliseconds.
-- Returns the token, or 0 when the key expired or has another owner.
-- Called with KEYS[1] alone while the slot migrates between Redis Cluster
-- nodes: the token is the clock's, in microseconds.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local now = redis.call('TIME')
if #KEYS == 1 then
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end
return drawToken(KEYS[2], now, ARGV[2], 0)
