-- Steady-state heartbeats, batched (several groups on standalone Redis, one group on a
-- cluster): each touches its member's liveness only while its group document (and, on
-- standalone Redis, its stream document) is still at the revision its answer was computed
-- from, and the member's session is not over.
-- KEYS     per group, `per` keys: the group document, its liveness, and (standalone only; on
--          a cluster the stream lives in another slot and the caller checks its revision
--          itself) the stream document
-- ARGV[1]  per: 2 or 3 keys per group
-- ARGV[2]  n, then n times: group index (1-based, into KEYS by `per`), group revision,
--          stream revision, member, now (Unix ms), longest allowed silence (ms)
-- Returns n outcomes: 1 touched, 0 stale (a document moved on; nothing written), -1 not
-- live (no liveness, or silent longer than allowed; nothing written).
--
-- This runs once per batch of steady heartbeats, the store's most frequent call, so it
-- converts as little as it can: revisions are compared as the decimal strings both sides
-- write (the documents' scripts store integers, the coordinator sends integers), and `now`
-- goes back to ZADD as the string it came as unless it has to move.
local per = tonumber(ARGV[1])
local revisions = {}
local function revision(key)
  local r = revisions[key]
  if r == nil then
    r = redis.call('HGET', key, 'revision') or '0'
    revisions[key] = r
  end
  return r
end
local out = {}
for i = 0, tonumber(ARGV[2]) - 1 do
  local b = 3 + i * 6
  local base = (tonumber(ARGV[b]) - 1) * per
  local group_revision = revision(KEYS[base + 1])
  local outcome = 0
  if group_revision ~= '0' and group_revision == ARGV[b + 1]
      and (per < 3 or revision(KEYS[base + 3]) == ARGV[b + 2]) then
    local live = KEYS[base + 2]
    local member = ARGV[b + 3]
    local previous = redis.call('ZSCORE', live, member)
    local now = ARGV[b + 4]
    local gap = previous and tonumber(now) - tonumber(previous)
    if not gap or gap > tonumber(ARGV[b + 5]) then
      outcome = -1
    else
      -- Liveness only moves forward, and strictly: max(now, previous + 1).
      if gap < 1 then
        now = tonumber(previous) + 1
      end
      redis.call('ZADD', live, now, member)
      outcome = 1
    end
  end
  out[i + 1] = outcome
end
return out
