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
-- The numbers go to Redis as text formatted here with '%d': redis.call
-- formats a Lua number with '%.17g', a float formatting that cost the
-- server more than the ZADD it feeds. They are milliseconds of the
-- server's clock, exact integers far below 2^63.
-- A marker or queue of another type (made by hand) is an error, returned
-- for the caller to reply, which names the key and leaves nothing written:
-- a mark the marker took is taken back, as the acquisition that the error
-- ends withdraws it, since a release could grant the key to it.
local function markWaiting(marker, queue, nowMs, ms, member)
  local since = string.format('%d', nowMs)
  local added = redis.pcall('ZADD', marker, string.format('%d', nowMs + ms), member)
  if type(added) == 'table' then
    return {err = added.err .. ' (' .. marker .. ')'}
  end
  local queued
  if added == 1 then
    queued = redis.pcall('ZADD', queue, since, member)
  else
    queued = redis.pcall('ZADD', queue, 'NX', since, member)
  end
  if type(queued) == 'table' then
    redis.call('ZREM', marker, member)
    return {err = queued.err .. ' (' .. queue .. ')'}
  end
  local ttl = redis.call('PTTL', marker)
  if ttl < ms then
    ttl = ms
    redis.call('PEXPIRE', marker, string.format('%d', ttl))
  end
  redis.call('PEXPIRE', queue, string.format('%d', ttl))
end
