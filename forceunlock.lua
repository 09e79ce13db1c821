-- Unlocks the lock whoever holds it (Registry.ForceUnlock), atomically:
-- raises the fence, deletes the key, tells the holder and wakes waiters.
-- Peer.ForceUnlock (internal/protocol) builds the arguments below.
local lockKey, fenceKey = KEYS[1], KEYS[2]
-- channel: the namespace's release channel; key: the lock's key in its
-- registry; margin: how far past the last token and the clock the fence
-- goes (microseconds), above any token the holder's registry may still
-- hand off locally; fenceMs: the least time to live of the raised fence,
-- longer than the clock takes to pass it; forced: the prefix of the
-- holder's forced-unlock channel, '<namespace>:forced:'.
-- only: the client id of the only holder to force open, or '' for any.
local channel, key, margin, fenceMs, forced, only =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
-- Returns the holder's client id, or false when nobody held the key, or
-- only another holder than the one named.
-- Called with the lock's key alone while its slot migrates between Redis
-- Cluster nodes, it cannot reach the fence: the registry first calls it
-- with the fence alone and a seventh argument, '1': it raises the fence
-- only (and returns 1), a one-key call Redis serves wherever the move left
-- the fence, so that no draw after the move repeats a token the holder's
-- registry handed out.
if ARGV[7] == '1' then
  lockKey, fenceKey = nil, KEYS[1]
end
local holder = lockKey and redis.pcall('GET', lockKey)
if type(holder) == 'table' then
  -- A lock key of another type, made by hand, blocks the lock as a
  -- foreign value does, and inspectors show it held by '': it is forced
  -- open as that value would be, else nothing would free it. Any other
  -- error stands.
  if string.sub(holder.err or '', 1, 9) ~= 'WRONGTYPE' then
    return holder
  end
  holder = ''
end
if lockKey and (not holder or (only and only ~= '' and holder ~= only)) then
  return false
end
if fenceKey then
  local now = redis.call('TIME')
  -- A fence of another type (made by hand) fails every token.lua, and
  -- is no reason to keep a stuck hold: it is replaced as a lost fence is,
  -- past the clock, which stands for every token drawn (drawtoken.lua).
  -- Any other error stands.
  local stored = redis.pcall('GET', fenceKey)
  if type(stored) == 'table' then
    if string.sub(stored.err or '', 1, 9) ~= 'WRONGTYPE' then
      return stored
    end
    stored = false
  end
  local last = tonumber(stored) or 0
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local floor = string.format('%.0f', math.max(last, clock) + margin)
  if last >= 9007199254740992 and last > clock and string.match(stored, '^%d+$') then
    -- Beyond 2^53 (a fence written by hand) doubles skip integers, and
    -- last + margin may round below it: add the margin digit by digit.
    local digits, carry = {}, margin
    for i = #stored, 1, -1 do
      local d = string.byte(stored, i) - 48 + carry
      digits[i], carry = d % 10, math.floor(d / 10)
    end
    floor = table.concat(digits)
    if carry > 0 then
      floor = string.format('%d', carry) .. floor
    end
  end
  redis.call('SET', fenceKey, floor, 'PX', math.max(redis.call('PTTL', fenceKey), fenceMs))
end
if not lockKey then
  return 1
end
-- 'f<client id>:<key>' tells the holder's registry, which then signals the
-- hold lost: first on the holder's forced-unlock channel, where its
-- tracking connection's target reads it before the invalidation that the
-- DEL sends it (so the loss names its cause), then, for registries of
-- earlier versions, on the release channel. 'w<key>' wakes the waiters of
-- every registry, as a release does.
local note = 'f' .. holder .. ':' .. key
if forced then
  redis.call('PUBLISH', forced .. holder, note)
end
redis.call('DEL', lockKey)
redis.call('PUBLISH', channel, note)
redis.call('PUBLISH', channel, 'w' .. key)
return holder
