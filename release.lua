-- Deletes the lock's key only if this registry owns it, atomically.
-- KEYS[1]: the lock's Redis key; ARGV[1]: the registry's client id.
-- Returns 1 when deleted, 0 when the key had expired or has another owner
-- (which is left untouched).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
