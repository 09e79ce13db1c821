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
local function drawToken(fence, now, lease, floor)
  local token = math.max(tonumber(now[1]) * 1000000 + tonumber(now[2]), floor + 1)
  local text = string.format('%.0f', token)
  local last = tonumber(redis.call('SET', fence, text, 'PX', lease, 'GET'))
  if last and last >= token then
    token = last + 1
    text = string.format('%.0f', token)
    redis.call('SET', fence, text, 'PX', lease)
  end
  return token, text
end

