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
local per = tonumber(ARGV[1])
local revisions = {}
local function revision(key)
  local r = revisions[key]
  if r == nil then
    r = tonumber(redis.call('HGET', key, 'revision') or '0')
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
  if group_revision ~= 0 and group_revision == tonumber(ARGV[b + 1])
      and (per < 3 or revision(KEYS[base + 3]) == tonumber(ARGV[b + 2])) then
    local live = KEYS[base + 2]
    local member = ARGV[b + 3]
    local now = tonumber(ARGV[b + 4])
    local previous = redis.call('ZSCORE', live, member)
    if not previous or now - tonumber(previous) > tonumber(ARGV[b + 5]) then
      outcome = -1
    else
      -- Liveness only moves forward, and strictly: max(now, previous + 1).
      if tonumber(previous) + 1 > now then
        now = tonumber(previous) + 1
      end
      redis.call('ZADD', live, now, member)
      outcome = 1
    end
  end
  out[#out + 1] = outcome
end
return out
