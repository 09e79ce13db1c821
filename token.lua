-- Draws the fencing token of a hold (Hold.Token), if this registry still
-- holds the lock. Uses drawToken (drawtoken.lua), which internal/protocol
-- puts before it, and builds the arguments for (Peer.DrawToken).
local lockKey, fenceKey = KEYS[1], KEYS[2]
local clientID, leaseMs = ARGV[1], ARGV[2]
-- Returns the token, or 0 when the key expired or has another owner.
-- Called with the lock's key alone while its slot migrates between Redis
-- Cluster nodes, it draws nothing and returns -1: the fence may be on the
-- other node, and a token from the clock alone could fall below one it
-- holds (ForceUnlock raises it past the clock, local hand-offs past the
-- last draw). The caller draws again once the slot has moved.
if redis.call('GET', lockKey) ~= clientID then
  return 0
end
if not fenceKey then
  return -1
end
local token, text = drawToken(fenceKey, redis.call('TIME'), leaseMs, 0)
if token >= exactBelow then
  -- A number reply would round it (see drawtoken.lua): its text is exact.
  return text
end
return token
