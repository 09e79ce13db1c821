-- Releases the lock if this registry owns it, atomically: grants it to the
-- registry that has waited longest, or deletes it.
-- Uses drawToken (drawtoken.lua) and markWaiting (markwaiting.lua), which
-- internal/protocol puts before it; Peer.Release builds the arguments
-- below, and ReadRelease reads the reply.
-- Returns 0 when the key had expired or has another owner (which is left
-- untouched; only the fence is raised to the tokens handed out), 1 when
-- deleted, 2 when deleted while another registry waits (its mark, set by
-- a failed attempt, has not lapsed), 3 when granted to a waiting
-- registry, or minus the grant's token if mark marked this one, and 4,
-- changing nothing, when another registry waits and only the client id
-- was sent: call again with all the arguments.
-- A grant sets the key to the waiter's client id with the lease its mark
-- names, draws its token and publishes 'g<token>:<client id>:<key>'; a
-- release others wait for publishes 'w<key>' to wake them.
local lockKey, clientID = KEYS[1], ARGV[1]
local ours = redis.call('GET', lockKey) == clientID
if not ours and (#ARGV == 1 or #KEYS == 1) then
  return 0
end
-- liveMark returns the first mark in marker that has not lapsed, if any.
local function liveMark(marker)
  if redis.call('EXISTS', marker) == 0 then
    return nil
  end
  local now = redis.call('TIME')
  local nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local first = redis.pcall('ZRANGEBYSCORE', marker, string.format('%d', nowMs), '+inf', 'LIMIT', 0, 1)
  if first.err then
    error('lockreg: ' .. marker .. ': ' .. first.err)
  end
  return first[1]
end
-- A marker, queue or fence of another type (made by hand) fails the
-- release with an error that names it, raised before the key's DEL or
-- grant (but for a marker met after the queue was popped, and a fence met
-- by the grant's draw, after its SET), and not a WRONGTYPE
-- reply, which the registry reads as the lock key's: the hold taken for
-- overwritten, its key left held.
-- The client id alone, with the lock's key and the marker, the only keys
-- it reads, is sent unless the registry expects the rest to be needed (see
-- releaseRedis): an uncontended release, which this keeps to the minimal
-- lock's owner-checked GET and DEL, and one EXISTS.
if #ARGV == 1 and #KEYS == 2 then
  if liveMark(KEYS[2]) then
    return 4
  end
  redis.call('DEL', lockKey)
  return 1
end
local fenceKey, markerKey, queueKey = KEYS[2], KEYS[3], KEYS[4]
-- Else every argument is sent. handedOut: the last fencing token the
-- registry handed out locally for this key, or '0'; leaseMs: the lease;
-- channel: the channel to notify waiters on, or '' for none (a grant goes
-- to <channel>:<grantee's client id>, which only the grantee subscribes
-- to); key: the lock's key in its registry; giveBack, only for a grant
-- nobody took: '<token>:<ms>', the grant's token, which the key's last
-- token must still be (an acquisition of this registry that found the key
-- its own drew a newer one, and keeps the key), and the grant's lease,
-- which the key's time to live must not exceed (a hold this registry took
-- with a plain SET NX once the grant had expired leaves the grant's token
-- the last, but has a full lease), else ''; mark and markMs, only when a
-- goroutine of this registry waits for the key: the registry's mark and
-- how long it lasts (as obtain.lua's), so that a grant marks this registry
-- as waiting, as that goroutine's failed attempt would have.
local handedOut, leaseMs, channel, key, giveBack, mark, markMs =
  tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
-- A note refused (an ACL without PUBLISH, or without the namespace's
-- channels) comes after the key was deleted or granted, which a script
-- does not undo: the release is done, and its reply says so, with the
-- refusal beside it, {reply, error}. The waiters, not told, take the key
-- when they poll (obtain.lua takes a key granted to its registry). It is
-- written out at both notes: a helper function would be made anew on
-- every call, which would cost every grant.
-- Called with the lock's key alone while its slot migrates between Redis
-- Cluster nodes: it only deletes the key; waiters find it free by polling.
-- It cannot reach the fence then: the registry raises it to handedOut
-- first, with raisefence.lua on the fence alone.
local migrating = #KEYS == 1
-- A key that is not ours is left as it is, and only the fence is raised
-- (below).
if ours and giveBack and giveBack ~= '' then
  local token, grantMs = string.match(giveBack, '^(%d+):(%d+)$')
  if migrating or redis.call('GET', fenceKey) ~= token or redis.call('PTTL', lockKey) > tonumber(grantMs) then
    return 0
  end
end
if migrating then
  redis.call('DEL', lockKey)
  return 1
end
local now, nowMs, waiter
if ours and channel ~= '' then
  -- A release that may grant pops the first registry in the queue, and
  -- the next while the one popped has no live mark (it lapsed, or was
  -- withdrawn): fewer and cheaper calls than reading the queue and then
  -- removing from it, and a grant waits for this script to end.
  local popped = redis.pcall('ZPOPMIN', queueKey)
  if popped.err then
    error('lockreg: ' .. queueKey .. ': ' .. popped.err)
  end
  if popped[1] then
    now = redis.call('TIME')
    nowMs = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    repeat
      local lapses = redis.pcall('ZSCORE', markerKey, popped[1])
      if type(lapses) == 'table' then
        error('lockreg: ' .. markerKey .. ': ' .. lapses.err)
      end
      lapses = tonumber(lapses)
      if lapses and lapses >= nowMs then
        waiter = popped[1]
      else
        if lapses then
          redis.call('ZREM', markerKey, popped[1])
        end
        popped = redis.call('ZPOPMIN', queueKey)
      end
    until waiter or not popped[1]
  end
  if waiter then
    local grantee, grantMs = string.match(waiter, '^(.*):(%d+)$')
    if grantee then
      redis.call('ZREM', markerKey, waiter)
      redis.call('SET', lockKey, grantee, 'PX', grantMs)
      -- The handed-out token as its text, exact beyond 2^53 (drawtoken.lua).
      local token, tokenText = drawToken(fenceKey, now, leaseMs, ARGV[2])
      local sent = redis.pcall('PUBLISH', channel .. ':' .. grantee, 'g' .. tokenText .. ':' .. grantee .. ':' .. key)
      local reply = 3
      -- ZPOPMIN and ZSCORE above found the queue and the marker sorted
      -- sets (or none): only an ACL without ZADD fails markWaiting here.
      -- The key is granted all the same, and the reply says that this
      -- registry is not marked: its goroutine must attempt for itself.
      if mark and not markWaiting(markerKey, queueKey, nowMs, tonumber(markMs), mark) then
        reply = -token
        if token >= exactBelow then
          reply = '-' .. tokenText -- exact, where a number would round
        end
      end
      if type(sent) == 'table' then
        return {reply, sent.err}
      end
      return reply
    end
    -- A mark that takes no grants has had its turn: a wake-up for all,
    -- in which it races the others. It goes to the back of the queue, so
    -- that it cannot hold grants up for the registries behind it while it
    -- loses races; popping the queue's last member deleted the queue with
    -- its TTL.
    redis.call('ZADD', queueKey, string.format('%d', nowMs), waiter)
    local ttl = redis.call('PTTL', markerKey)
    if ttl > 0 then
      redis.call('PEXPIRE', queueKey, string.format('%d', ttl))
    end
  end
end
-- With no grant to make (no channel, or no live mark in the queue: an
-- earlier version of the library marked in the marker alone), a live mark
-- makes this a release others wait for.
if ours and not waiter then
  waiter = liveMark(markerKey)
end
-- Local hand-offs raise the token without a round trip; the stored token
-- must not fall behind them, even if the key was taken from the hold that
-- handed them out: while the stored token is ahead of the clock, the next
-- draw would hand one of them out again. It is read before the DEL. A
-- fence of another type fails every later draw, so no token can repeat:
-- a key not ours is only said to be not ours, which loses the hold.
local stored = handedOut > 0 and redis.pcall('GET', fenceKey)
if type(stored) == 'table' then
  if not ours then
    return 0
  end
  error('lockreg: ' .. fenceKey .. ': ' .. stored.err)
end
if ours then
  redis.call('DEL', lockKey)
end
if handedOut > 0 then
  local last = tonumber(stored)
  local behind = not last or last < handedOut
  if last and math.max(last, handedOut) >= exactBelow and string.match(stored, '^%d+$') then
    -- Exact beyond 2^53 (drawtoken.lua): digits without leading zeros
    -- compare by length, then as text.
    local a, b = string.match(stored, '^0*(%d+)$'), string.match(ARGV[2], '^0*(%d+)$')
    behind = #a < #b or #a == #b and a < b
  end
  if behind then
    redis.call('SET', fenceKey, ARGV[2], 'PX', leaseMs)
  end
end
if not ours then
  return 0
end
if not waiter then
  return 1
end
local sent = channel ~= '' and redis.pcall('PUBLISH', channel, 'w' .. key)
if type(sent) == 'table' then
  return {2, sent.err}
end
return 2
