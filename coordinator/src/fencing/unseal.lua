-- Undoes a seal of a switch that was not recorded (ordered resharding, PROTOCOL §15).
-- KEYS[1]: {<shard key>}:epoch  KEYS[2]: {<shard key>}:seals
-- ARGV[1]: the epoch of the abandoned switch   ARGV[2]: the epoch before it
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
