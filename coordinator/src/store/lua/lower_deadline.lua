-- Lowers a group's entry in the deadline index (creating it when absent) after a write of
-- the group document, and records the newest revision the index has heard of.
-- KEYS[1]  the bucket's sorted set (group -> due time, Unix ms)
-- KEYS[2]  the bucket's hash (group -> newest revision that lowered or set the entry)
-- ARGV[1]  group, ARGV[2] the revision written, ARGV[3] its next deadline (Unix ms)
redis.call('ZADD', KEYS[1], 'LT', ARGV[3], ARGV[1])
local seen = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) > seen then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return 1
