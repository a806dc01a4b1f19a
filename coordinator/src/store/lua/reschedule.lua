-- Sets (or removes) a group's entry in the deadline index, as computed by a sweeper from
-- the group document at a revision, unless a write at a newer revision lowered it since.
-- KEYS[1]  the bucket's sorted set, KEYS[2] the bucket's revision hash
-- ARGV[1]  group, ARGV[2] the revision the deadline was computed from,
-- ARGV[3]  the deadline (Unix ms), or '' to remove the entry
-- Returns 1 when set, 0 when a newer revision had been recorded (nothing written).
local seen = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if seen > tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return 1
