-- A producer's fenced XADD (ordered resharding, issue 16).
-- KEYS[1]: <shard key>   KEYS[2]: {<shard key>}:epoch
-- ARGV[1]: the routing epoch the producer routed with; then, per entry: the number of
-- field/value pairs n, then the n pairs.
-- The shard's epoch marker must equal ARGV[1] (or be absent: a stream never resharded since
-- ordering came in). Otherwise nothing is written and the marker's epoch is returned (an
-- integer): the producer refreshes its routing and writes again on the right shard.
-- Returns the ids of the entries written, in order.
local call = redis.call
local m = call('GET', KEYS[2])
if m and m ~= ARGV[1] then return tonumber(m) end
local key, argv = KEYS[1], ARGV
local ids, k = {}, 0
local i, last = 2, #argv
while i <= last do
  local n2 = 2 * tonumber(argv[i])
  k = k + 1
  ids[k] = call('XADD', key, '*', unpack(argv, i + 1, i + n2))
  i = i + 1 + n2
end
return ids
