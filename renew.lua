-- Extends the lease of every key this registry still owns, atomically.
-- KEYS: lock keys (one slot on Redis Cluster); ARGV[1]: the registry's
-- client id; ARGV[2]: the lease in milliseconds.
-- Returns, per key, 1 if renewed, 0 if it expired or has another owner
-- (which is left untouched).
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
