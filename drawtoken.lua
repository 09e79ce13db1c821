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
-- plusOne is the decimal digits text plus one, exactly.
local function plusOne(text)
  local i = #text
  while i > 0 and string.byte(text, i) == 57 do -- '9'
    i = i - 1
  end
  if i == 0 then
    return '1' .. string.rep('0', #text)
  end
  return string.sub(text, 1, i - 1) .. string.char(string.byte(text, i) + 1) .. string.rep('0', #text - i)
end
-- notBelow reports whether the decimal digits a are at least b's.
local function notBelow(a, b)
  a, b = string.match(a, '^0*(%d*)$'), string.match(b, '^0*(%d*)$')
  if #a ~= #b then
    return #a > #b
  end
  return a >= b
end
-- floor is a number, or the text of one (a token Go handed out), which is
-- read exactly beyond 2^53.
local function drawToken(fence, now, lease, floor)
  local token = math.max(tonumber(now[1]) * 1000000 + tonumber(now[2]), tonumber(floor) + 1)
  local text
  if token < exactBelow or type(floor) ~= 'string' then
    text = string.format('%.0f', token)
  else
    text = plusOne(floor)
  end
  local stored = redis.call('SET', fence, text, 'PX', lease, 'GET')
  local last = tonumber(stored)
  if last and last >= exactBelow - 1 and string.match(stored, '^%d+$') and string.match(text, '^%d+$') then
    if notBelow(stored, text) then
      -- Without leading zeros, as '%.0f' writes it: a give-back compares
      -- the stored text with the grant's token.
      text = plusOne(string.match(stored, '^0*(%d+)$'))
      token = tonumber(text)
      redis.call('SET', fence, text, 'PX', lease)
    end
  elseif last and last >= token then
    token = last + 1
    text = string.format('%.0f', token)
    redis.call('SET', fence, text, 'PX', lease)
  end
  return token, text
end

