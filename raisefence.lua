-- Raises a lock's fence to the last token a hold handed out locally
-- (Peer.RaiseFence), before a release that runs on the lock's key alone
-- while its slot migrates between Redis Cluster nodes: that release cannot
-- reach the fence, which must not fall behind the tokens handed out (see
-- release.lua), or the next draw, after the move, could hand one of them
-- out again. It is this one key's call, which Redis serves wherever the
-- key is during the move. Uses exactBelow (drawtoken.lua), which
-- internal/protocol puts before it.
-- Returns 1 when the fence was raised, 0 when it was not behind. A fence
-- of another type (made by hand) is an error that names it, and not a
-- WRONGTYPE reply, which the registry reads as the lock key's.
local fenceKey, handedOut, leaseMs = KEYS[1], ARGV[1], ARGV[2]
local stored = redis.pcall('GET', fenceKey)
if type(stored) == 'table' then
  error('lockreg: ' .. fenceKey .. ': ' .. stored.err)
end
local last = tonumber(stored)
local behind = not last or last < tonumber(handedOut)
if last and math.max(last, tonumber(handedOut)) >= exactBelow and string.match(stored, '^%d+$') then
  -- Exact beyond 2^53 (drawtoken.lua): digits without leading zeros
  -- compare by length, then as text.
  local a, b = string.match(stored, '^0*(%d+)$'), string.match(handedOut, '^0*(%d+)$')
  behind = #a < #b or #a == #b and a < b
end
if not behind then
  return 0
end
redis.call('SET', fenceKey, handedOut, 'PX', leaseMs)
return 1
