-- Takes or refreshes the lock, atomically. (An acquisition's first attempt
-- on a key that looks free is a plain SET NX PX instead: see
-- Peer.SetIfFree.) Uses drawToken (drawtoken.lua) and markWaiting
-- (markwaiting.lua), which internal/protocol puts before it; Peer.Obtain
-- builds the arguments below, and ReadObtain reads the reply.
local lockKey, fenceKey, markerKey, queueKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- clientID: the registry's; leaseMs: the lease; markMs: how long a failed
-- attempt marks this registry as waiting for the key, or '0' for an
-- attempt that will not wait (it leaves no mark); wasMarked: '1' if an
-- earlier attempt marked it; mark: the client id, or '<client id>:<ms>'
-- if a release may grant this registry the key, with a lease of that
-- many milliseconds.
local clientID, leaseMs, markMs, wasMarked, mark = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
-- Called with the lock's key alone while its slot migrates between Redis
-- Cluster nodes (Redis refuses a script whose keys are split or missing
-- then): it neither marks nor withdraws nor draws.
local migrating = #KEYS == 1
-- Returns 1 when this registry holds the key afterwards (its fencing token
-- is drawn when asked for: see token.lua). When another owner does (its
-- value and TTL untouched), it returns minus the key's last token if it
-- marked the registry, storing one drawn from the clock if none is stored,
-- or 0 if it did not mark: a grant that follows this attempt comes with a
-- larger token.
-- A fence, marker or queue of another type (made by hand) fails the
-- attempt with an error that names it, and nothing written: the fence is
-- read before the mark is set, and a key taken before a withdrawal fails
-- is given back.
local took = redis.call('SET', lockKey, clientID, 'NX', 'PX', leaseMs)
if not took then
  if redis.call('GET', lockKey) ~= clientID then
    if migrating or markMs == '0' then
      return 0
    end
    local stored = redis.pcall('GET', fenceKey)
    if type(stored) == 'table' then
      return {err = stored.err .. ' (' .. fenceKey .. ')'}
    end
    -- Tell the holder who waits, so that it grants the key on release.
    local now = redis.call('TIME')
    local nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    local failed = markWaiting(markerKey, queueKey, nowMs, tonumber(markMs), mark)
    if failed then
      return failed
    end
    -- A stored value below 1 is no token (one written by hand): minus it
    -- would read as held (-1) or as no mark, so one is drawn instead.
    local last = tonumber(stored)
    if not last or last < 1 then
      last = drawToken(fenceKey, now, leaseMs, 0)
    elseif last >= exactBelow and string.match(stored, '^%d+$') then
      -- Beyond 2^53 a number reply would round the token, maybe below
      -- it, and a grant drawn before this mark would pass the trust rule
      -- (see drawtoken.lua): its text is exact.
      return '-' .. stored
    end
    return -last
  end
  -- The key is this registry's already: a grant whose waiter was abandoned,
  -- being given back (see release.lua's giveBack). Drawing a token moves
  -- the key's last token past the grant's, so that the give-back spares
  -- the key this acquisition now holds.
  -- The token first: a fence of another type fails it before any write.
  if not migrating then
    drawToken(fenceKey, redis.call('TIME'), leaseMs, 0)
  end
  redis.call('PEXPIRE', lockKey, leaseMs)
end
if not migrating and wasMarked == '1' then
  local failed, key = redis.pcall('ZREM', markerKey, mark), markerKey
  if type(failed) ~= 'table' then
    failed, key = redis.pcall('ZREM', queueKey, mark), queueKey
  end
  if type(failed) == 'table' then
    if took then
      redis.call('DEL', lockKey)
    end
    return {err = failed.err .. ' (' .. key .. ')'}
  end
end
return 1
