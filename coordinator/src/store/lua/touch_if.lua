-- The steady-state heartbeat: touches a member's liveness only while the group document is
-- still at the revision the answer was computed from.
-- KEYS[1]  the group document, KEYS[2] its liveness
-- ARGV[1]  expected revision, ARGV[2] member, ARGV[3] now (Unix ms),
-- ARGV[4]  longest allowed silence in ms, or '' (then a missing liveness is created)
-- Returns 1 touched, 0 stale (another revision; nothing written), -1 not live (no liveness,
-- or silent longer than allowed; nothing written).
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if current == 0 or current ~= tonumber(ARGV[1]) then
  return 0
end
local now = tonumber(ARGV[3])
local previous = redis.call('ZSCORE', KEYS[2], ARGV[2])
if ARGV[4] ~= '' then
  if not previous or now - tonumber(previous) > tonumber(ARGV[4]) then
    return -1
  end
end
if previous and tonumber(previous) + 1 > now then
  now = tonumber(previous) + 1
end
redis.call('ZADD', KEYS[2], now, ARGV[2])
pad_liveness(KEYS[2])
return 1
