-- The steady-state heartbeat in one round trip (standalone Redis only: the keys are in
-- different cluster slots). Touches a member's liveness only while the group document and
-- the stream document are both still at the revisions the answer was computed from.
-- KEYS[1]  the group document, KEYS[2] its liveness, KEYS[3] the stream document
-- ARGV[1]  expected group revision, ARGV[2] expected stream revision, ARGV[3] member,
-- ARGV[4]  now (Unix ms), ARGV[5] longest allowed silence in ms
-- Returns 1 touched, 0 stale (a document moved on; nothing written), -1 not live (no
-- liveness, or silent longer than allowed; nothing written).
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if current == 0 or current ~= tonumber(ARGV[1]) then
  return 0
end
if tonumber(redis.call('HGET', KEYS[3], 'revision') or '0') ~= tonumber(ARGV[2]) then
  return 0
end
local now = tonumber(ARGV[4])
local previous = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not previous or now - tonumber(previous) > tonumber(ARGV[5]) then
  return -1
end
if tonumber(previous) + 1 > now then
  now = tonumber(previous) + 1
end
redis.call('ZADD', KEYS[2], now, ARGV[3])
return 1
