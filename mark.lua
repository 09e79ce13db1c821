-- markWaiting marks a registry as waiting for a key: member, in the key's
-- waiting marker (a sorted set scored by when its marks lapse), lapsing ms
-- milliseconds after nowMs. Registries with longer retry intervals mark for
-- longer, so the marker's TTL only ever grows: a short mark that cut it
-- would delete a longer one with the marker.
local function markWaiting(marker, nowMs, ms, member)
  redis.call('ZADD', marker, nowMs + ms, member)
  if redis.call('PTTL', marker) < ms then
    redis.call('PEXPIRE', marker, ms)
  end
end

