-- Compare-and-delete of a group document and its liveness.
-- KEYS[1]  the group document, KEYS[2] its liveness
-- ARGV[1]  the revision the writer read
-- Returns {1, 0} or {0, current revision} when the revision differs.
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if current ~= tonumber(ARGV[1]) then
  return {0, current}
end
redis.call('DEL', KEYS[1], KEYS[2])
return {1, 0}
