-- Compare-and-delete of a group document and its liveness. The document leaves a tombstone
-- (`revision` alone, one above the last): a group created again under the same name goes on
-- from there, so a revision never names two different documents (a coordinator that cached
-- the old one can never mistake it for the new one). The tombstone expires after ARGV[2]:
-- coordinators drop cached documents they have not used for half of that.
-- KEYS[1]  the group document, KEYS[2] its liveness, KEYS[3] its metadata history
-- ARGV[1]  the revision the writer read (0: must not exist)
-- ARGV[2]  how long the tombstone is kept (ms)
-- Returns {1, tombstone revision} or {0, current revision} when the revision differs.
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
local exists = redis.call('HEXISTS', KEYS[1], 'doc') == 1
local seen = 0
if exists then
  seen = current
end
if seen ~= tonumber(ARGV[1]) then
  return {0, seen}
end
if not exists then
  return {1, current}
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'revision', current + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, current + 1}
