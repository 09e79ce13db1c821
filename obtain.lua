-- Takes or refreshes the lock, atomically. (An acquisition's first attempt
-- on a key that looks free is a plain SET NX PX instead: see tryObtain.)
-- KEYS[1]: the lock's Redis key; KEYS[2]: its fence key; KEYS[3]: its
-- waiting marker; KEYS[4]: its queue (all in one slot).
-- ARGV[1]: the registry's client id; ARGV[2]: the lease in milliseconds;
-- ARGV[3]: how long, in milliseconds, a failed attempt marks this registry
-- as waiting for the key, or '0' for an attempt that will not wait (it
-- leaves no mark); ARGV[4]: '1' if an earlier attempt marked it;
-- ARGV[5]: the mark: the client id, or '<client id>:<ms>' if a release may
-- grant this registry the key, with a lease of that many milliseconds.
-- Returns 1 when this registry holds the key afterwards (its fencing token
-- is drawn when asked for: see draw.lua). When another owner does (its
-- value and TTL untouched), it returns minus the key's last token if it
-- marked the registry, storing one drawn from the clock if none is stored,
-- or 0 if it did not mark: a grant that follows this attempt comes with a
-- larger token.
-- Called with KEYS[1] alone while the slot migrates between Redis Cluster
-- nodes (Redis refuses a script whose keys are split or missing then): it
-- neither marks nor unmarks nor draws.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    if #KEYS == 1 or ARGV[3] == '0' then
      return 0
    end
    -- Tell the holder who waits, so that it passes the key on or
    -- publishes its release.
    local now = redis.call('TIME')
    local nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    markWaiting(KEYS[3], KEYS[4], nowMs, tonumber(ARGV[3]), ARGV[5])
    return -(tonumber(redis.call('GET', KEYS[2])) or drawToken(KEYS[2], now, ARGV[2], 0))
  end
  -- The key is this registry's already: a grant its waiter gave up on,
  -- being given back (see release.lua's ARGV[6]). Drawing a token moves
  -- the key's last token past the grant's, so that the give-back spares
  -- the key this acquisition now holds.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if #KEYS > 1 then
    drawToken(KEYS[2], redis.call('TIME'), ARGV[2], 0)
  end
end
if #KEYS > 1 and ARGV[4] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('ZREM', KEYS[4], ARGV[5])
end
return 1
