-- A producer's fenced XADD (ordered resharding, issue 16).
-- KEYS[1]: <shard key>   KEYS[2]: {<shard key>}:epoch
-- ARGV[1]: the routing epoch the producer routed with; then, per entry: the number of
-- field/value pairs n, then the n pairs.
-- The shard's epoch marker must equal ARGV[1] (or be absent: a stream never resharded since
-- ordering came in). Otherwise nothing is written and the marker's epoch is returned (an
-- integer): the producer refreshes its routing and writes again on the right shard.
-- Returns the ids of the entries written, in order.
local m = redis.call('GET', KEYS[2])
if m and m ~= ARGV[1] then return tonumber(m) end
local ids = {}
local i = 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 1, i + 2 * n))
  i = i + 1 + 2 * n
end
return ids
