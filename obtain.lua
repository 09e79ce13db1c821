-- Takes or refreshes the lock, atomically.
-- KEYS[1]: the lock's Redis key; ARGV[1]: the registry's client id;
-- ARGV[2]: the lease in milliseconds.
-- Returns 1 when this registry holds the key afterwards, 0 when another
-- owner does (its value and TTL are left untouched).
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
