-- Releases a lock only if it is still ours (compare-and-delete on the random token).
-- KEYS[1]  the lock, ARGV[1] our token
-- Returns 1 when released, 0 when it had expired or another holder has it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
