-- The check of a producer's fenced write (ordered resharding, PROTOCOL §15).
-- Sent in one pipeline: WATCH <markers>; EVAL <this> <n> <markers> <epoch>; MULTI; XADD …; EXEC.
-- KEYS: the epoch markers {<shard key>}:epoch of the shards written; ARGV[1]: the routing
-- epoch the producer routed with.
-- Every marker must equal ARGV[1] (or be absent: a stream never resharded since ordering came
-- in). A marker that differs is written again with its own value: that touch aborts the
-- watching transaction (EXEC answers nil), so nothing of the batch is written, and the
-- highest such marker is returned (an integer). nil: the transaction may run; it still
-- aborts if the coordinator moves a marker before the EXEC.
local refused
for _, k in ipairs(KEYS) do
  local m = redis.call('GET', k)
  if m and m ~= ARGV[1] then
    redis.call('SET', k, m, 'KEEPTTL')
    local n = tonumber(m) or 0
    if not refused or n > refused then refused = n end
  end
end
return refused
