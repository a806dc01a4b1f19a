#!lua flags=no-writes,allow-cross-slot-keys
-- The doorbell's fallback poll on one Redis Cluster node (PROTOCOL §16): ARGV holds pairs
-- <shard stream key> <the last entry id its worker saw>, all of streams this node serves.
-- No key is declared (declared keys must share a slot); the flag lets the script read the
-- node's streams of every slot. Answers {found, failed}: the 1-based pair numbers of the
-- streams that hold an entry after their id, and of those the node could not read here
-- (another node serves them now).
local found, failed = {}, {}
for i = 1, #ARGV, 2 do
  local r = redis.pcall('XREAD', 'COUNT', 1, 'STREAMS', ARGV[i], ARGV[i + 1])
  local n = (i + 1) / 2
  if type(r) == 'table' and r.err then
    failed[#failed + 1] = n
  elseif r then
    found[#found + 1] = n
  end
end
return {found, failed}
