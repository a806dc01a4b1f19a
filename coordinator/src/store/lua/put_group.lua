-- Compare-and-set of a group document, with the liveness changes that go with it, in one
-- atomic step (the document and its liveness share a hash-tag slot).
-- KEYS[1]  the group document: a hash with fields `revision` and `doc` (a deleted group
--          leaves a tombstone: `revision` alone, so that revisions of the key never repeat)
-- KEYS[2]  the group's liveness: a sorted set, member -> last heard from (Unix ms)
-- KEYS[3]  the group's metadata history (append_revision.lua)
-- ARGV[1]  the revision the writer read (0: the document must not exist)
-- ARGV[2]  the new document (JSON)
-- ARGV[3..6] the history record's time, body, how many records are kept and how long
-- ARGV[7]  n, then n pairs (member, liveness the writer saw): members the write expires for
--          silence; any of them heard from since (liveness now newer) fails the write
-- then     m, then m members whose liveness is deleted
-- then     a member to touch ('' for none), then the time to touch it with
-- Returns {1, new revision}, {0, current revision} when the revision differs, or
-- {-1, current revision, member} when an expired member was heard from after the decision.
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
local seen = 0
if redis.call('HEXISTS', KEYS[1], 'doc') == 1 then
  seen = current
end
if seen ~= tonumber(ARGV[1]) then
  return {0, seen}
end
local i = 7
local expired = tonumber(ARGV[i])
i = i + 1
for _ = 1, expired do
  local seen = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if seen and tonumber(seen) > tonumber(ARGV[i + 1]) then
    return {-1, current, ARGV[i]}
  end
  i = i + 2
end
local revision = current + 1
redis.call('HSET', KEYS[1], 'revision', revision, 'doc', ARGV[2])
append_revision(KEYS[3], revision, ARGV[3], ARGV[4], ARGV[5], ARGV[6])
if seen == 0 then
  -- Created over a tombstone: the tombstone's expiry must not take the new group with it.
  redis.call('PERSIST', KEYS[1])
end
local forget = tonumber(ARGV[i])
i = i + 1
for _ = 1, forget do
  redis.call('ZREM', KEYS[2], ARGV[i])
  i = i + 1
end
if ARGV[i] ~= '' then
  -- Liveness only moves forward, and strictly: max(now, previous + 1).
  local now = tonumber(ARGV[i + 1])
  local previous = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if previous and tonumber(previous) + 1 > now then
    now = tonumber(previous) + 1
  end
  redis.call('ZADD', KEYS[2], now, ARGV[i])
  pad_liveness(KEYS[2])
end
return {1, revision}
