-- Reads a group document and its liveness at one instant.
-- KEYS[1]  the group document, KEYS[2] its liveness
-- Returns false when the document is absent (or a tombstone), else
-- {revision, doc, {member, time, ...}}.
local v = redis.call('HMGET', KEYS[1], 'revision', 'doc')
if not v[2] then
  return false
end
return {v[1], v[2], redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
