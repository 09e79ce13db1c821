-- A library, put before the scripts that use it (see internal/protocol's
-- NewScripts).
-- drawToken draws a key's next fencing token: the larger of the last one + 1
-- and the server clock in microseconds (now, from TIME), and above floor (a
-- token already handed out, or 0). The stored last token keeps tokens
-- strictly increasing while it lives (for lease ms); the clock keeps them
-- increasing after Redis lost it (a restart without persistence, a failover
-- to a lagging replica). Microseconds stay below 2^53, exact in Lua's
-- doubles. One call in the usual case: store the new token and read the
-- last; only if that was not lower (the same microsecond, or a clock that
-- stepped back) store last + 1 instead. Returns the token and its text,
-- which a caller that sends the token on reuses: formatting a number costs
-- the server more than most commands do (see markwaiting.lua). A stored
-- token written by hand may exceed what '%d' formats, hence '%.0f'.
-- Beyond 2^53 (a stored token written by hand: the clock's microseconds
-- stay below it), doubles skip integers, and last + 1 would round back to
-- last, or below it: tokens would repeat or fall. There the token is the
-- stored text plus one, added digit by digit, and callers reply its text,
-- which Go reads as exactly (ReadToken, ReadRelease, ReadObtain).
local exactBelow = 9007199254740992
-- floor is a number, or the text of one (a token Go handed out), which is
-- read exactly beyond 2^53. The exact path's arithmetic is written inline:
-- a helper function would be made anew on every call of every script this
-- library is put before, which would cost the usual call.
local function drawToken(fence, now, lease, floor)
  local token = math.max(tonumber(now[1]) * 1000000 + tonumber(now[2]), tonumber(floor) + 1)
  -- base: beyond 2^53, the larger of floor and the stored token, as digits.
  local base
  if token < exactBelow or type(floor) ~= 'string' then
    local text = string.format('%.0f', token)
    local stored = redis.pcall('SET', fence, text, 'PX', lease, 'GET')
    if type(stored) == 'table' then
      -- A fence of another type (made by hand), which SET ... GET leaves
      -- as it is: an error that names it, and not a WRONGTYPE reply,
      -- which callers read as the lock key's (a hold overwritten).
      error('lockreg: ' .. fence .. ': ' .. stored.err)
    end
    local last = tonumber(stored)
    if not last or last < token then
      return token, text
    end
    if last < exactBelow - 1 then
      token = last + 1
      text = string.format('%.0f', token)
      redis.call('SET', fence, text, 'PX', lease)
      return token, text
    end
    -- Beyond 2^53, a stored token spelled otherwise by hand ('1e16') is
    -- read as its double's digits, which '%.0f' writes exactly: last + 1
    -- would round back to last. NaN and the infinities have no digits,
    -- and no token can follow them: the fence is put back, and the draw
    -- refused with an error that names it (NaN would reply -2^63).
    base = string.match(stored, '^0*(%d+)$') or string.match(string.format('%.0f', last), '^%d+$')
    if not base then
      redis.call('SET', fence, stored, 'PX', lease)
      error('lockreg: ' .. fence .. ' holds ' .. string.sub(stored, 1, 40) .. ', which no token can follow')
    end
  else
    base = string.match(floor, '^0*(%d+)$')
    local stored = string.match(redis.call('GET', fence) or '', '^0*(%d+)$')
    if stored and (#stored > #base or #stored == #base and stored > base) then
      base = stored
    end
  end
  -- base plus one, digit by digit, without leading zeros, as '%.0f' writes
  -- it: a give-back compares the stored text with the grant's token.
  local i = #base
  while i > 0 and string.byte(base, i) == 57 do -- '9'
    i = i - 1
  end
  local text = string.rep('0', #base - i)
  if i == 0 then
    text = '1' .. text
  else
    text = string.sub(base, 1, i - 1) .. string.char(string.byte(base, i) + 1) .. text
  end
  redis.call('SET', fence, text, 'PX', lease)
  return tonumber(text), text
end
