-- A library, put before the scripts that use it (see internal/protocol's
-- NewScripts).
-- markWaiting marks a registry as waiting for a key: member, in the key's
-- waiting marker (a sorted set scored by when its marks lapse), lapsing ms
-- milliseconds after nowMs, and in its queue (scored by when each
-- registry began to wait). Registries with longer retry intervals mark for
-- longer, so the marker's TTL only ever grows: a short mark that cut it
-- would delete a longer one with the marker. The queue lives as long as
-- the marker.
-- A registry renews its mark with every attempt while it waits, which
-- moves its lapse but keeps its place in the queue: releases grant the key
-- first come, first served (see release.lua). A mark new to the marker
-- starts a wait, and a place left from an earlier one is replaced.
local function markWaiting(marker, queue, nowMs, ms, member)
  if redis.call('ZADD', marker, nowMs + ms, member) == 1 then
    redis.call('ZADD', queue, nowMs, member)
  else
    redis.call('ZADD', queue, 'NX', nowMs, member)
  end
  local ttl = redis.call('PTTL', marker)
  if ttl < ms then
    redis.call('PEXPIRE', marker, ms)
    ttl = ms
  end
  redis.call('PEXPIRE', queue, ttl)
end
