-- Compare-and-set of a document (SPEC §2).
-- KEYS[1]  the document: a hash with fields `revision` and `doc` (a deleted document leaves
--          a tombstone: `revision` alone, so that revisions of the key never repeat)
-- KEYS[2]  the document's metadata history (append_revision.lua)
-- ARGV[1]  the revision the writer read (0: the document must not exist)
-- ARGV[2]  the new document (JSON)
-- ARGV[3..6] the history record's time, body, how many records are kept and how long
-- Returns {1, new revision} or {0, current revision} when the revision differs.
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
local exists = redis.call('HEXISTS', KEYS[1], 'doc') == 1
local seen = 0
if exists then
  seen = current
end
if seen ~= tonumber(ARGV[1]) then
  return {0, seen}
end
local revision = current + 1
redis.call('HSET', KEYS[1], 'revision', revision, 'doc', ARGV[2])
append_revision(KEYS[2], revision, ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return {1, revision}
