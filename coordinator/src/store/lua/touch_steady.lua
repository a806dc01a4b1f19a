-- Steady-state heartbeats of one group, batched: each touches its member's liveness only
-- while the group document (and, on standalone Redis, the stream document) is still at the
-- revision its answer was computed from, and the member's session is not over.
-- KEYS[1]  the group document, KEYS[2] its liveness,
-- KEYS[3]  the stream document (standalone only: on a cluster it lives in another slot and
--          the caller checks its revision itself)
-- ARGV[1]  n, then n times: group revision, stream revision, member, now (Unix ms),
--          longest allowed silence (ms)
-- Returns n outcomes: 1 touched, 0 stale (a document moved on; nothing written), -1 not
-- live (no liveness, or silent longer than allowed; nothing written).
local group_revision = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
local stream_revision = nil
if #KEYS >= 3 then
  stream_revision = tonumber(redis.call('HGET', KEYS[3], 'revision') or '0')
end
local out = {}
for i = 0, tonumber(ARGV[1]) - 1 do
  local b = 2 + i * 5
  local outcome = 0
  if group_revision ~= 0 and group_revision == tonumber(ARGV[b])
      and (not stream_revision or stream_revision == tonumber(ARGV[b + 1])) then
    local member = ARGV[b + 2]
    local now = tonumber(ARGV[b + 3])
    local previous = redis.call('ZSCORE', KEYS[2], member)
    if not previous or now - tonumber(previous) > tonumber(ARGV[b + 4]) then
      outcome = -1
    else
      -- Liveness only moves forward, and strictly: max(now, previous + 1).
      if tonumber(previous) + 1 > now then
        now = tonumber(previous) + 1
      end
      redis.call('ZADD', KEYS[2], now, member)
      outcome = 1
    end
  end
  out[#out + 1] = outcome
end
return out
