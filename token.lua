-- Draws the fencing token of a hold (Hold.Token), if this registry still
-- holds the lock. Uses drawToken (drawtoken.lua), which scripts.go puts
-- before it; scripts.go builds the arguments (tokenArgs).
local lockKey, fenceKey = KEYS[1], KEYS[2]
local clientID, leaseMs = ARGV[1], ARGV[2]
-- Returns the token, or 0 when the key expired or has another owner.
-- Called with the lock's key alone while its slot migrates between Redis
-- Cluster nodes: the token is then the clock's, in microseconds.
if redis.call('GET', lockKey) ~= clientID then
  return 0
end
local now = redis.call('TIME')
if not fenceKey then
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end
return drawToken(fenceKey, now, leaseMs, 0)
