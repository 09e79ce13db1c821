-- Takes or refreshes the lock and draws its fencing token, atomically.
-- KEYS[1]: the lock's Redis key; KEYS[2]: its fence key; KEYS[3]: its
-- waiting marker (all in one slot).
-- ARGV[1]: the registry's client id; ARGV[2]: the lease in milliseconds;
-- ARGV[3]: how long, in milliseconds, a failed attempt marks this registry
-- as waiting for the key; ARGV[4]: '1' if an earlier attempt marked it.
-- Returns the new fencing token (> 0) when this registry holds the key
-- afterwards, 0 when another owner does (its value and TTL untouched).
-- Called with KEYS[1] alone while the slot migrates between Redis Cluster
-- nodes (Redis refuses a script whose keys are split or missing then): it
-- neither marks nor reads the fence, and the token is the clock's.
local now = redis.call('TIME')
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    if #KEYS > 1 then
      -- Tell the holder who waits (a sorted set of client ids, scored by
      -- when the mark lapses), so that it publishes its release.
      local nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
      redis.call('ZADD', KEYS[3], nowMs + tonumber(ARGV[3]), ARGV[1])
      redis.call('PEXPIRE', KEYS[3], ARGV[3])
    end
    return 0
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
-- The token is the larger of the last token + 1 and the server clock in
-- microseconds: the stored token keeps tokens strictly increasing while it
-- lives, and the clock keeps them increasing after Redis lost the stored
-- one (a restart without persistence, a failover to a lagging replica).
-- Microseconds stay below 2^53, exact in Lua's doubles.
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if #KEYS == 1 then
  return token
end
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
-- One call in the usual case: store the clock's token and read the last
-- one; only if that was not lower (the same microsecond, or a clock that
-- stepped back) store last + 1 instead.
local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[2], 'GET'))
if last and last >= token then
  token = last + 1
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[2])
end
return token
