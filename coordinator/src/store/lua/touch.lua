-- Records that a member was heard from. Liveness only moves forward, and strictly:
-- max(now, previous + 1), so that a decision based on an older reading can be detected.
-- KEYS[1]  the group's liveness (sorted set)
-- ARGV[1]  member, ARGV[2] now (Unix ms)
local now = tonumber(ARGV[2])
local previous = redis.call('ZSCORE', KEYS[1], ARGV[1])
if previous and tonumber(previous) + 1 > now then
  now = tonumber(previous) + 1
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
return 1
