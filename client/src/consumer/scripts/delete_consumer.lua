-- Deletes a consumer from a shard's Redis consumer group only if it has no pending entry.
-- Atomic: a consumer that reads again between a check and the delete cannot lose the entries
-- it just read (XGROUP DELCONSUMER drops a consumer's pending entries from the PEL).
-- KEYS[1] shard key; ARGV[1] group; ARGV[2] consumer.
-- Returns 1 when deleted, 0 when kept (it has pending entries), -1 when it did not exist.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then
  return 0
end
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, c in ipairs(consumers) do
  -- RESP2 inside scripts: each consumer is a flat array name, <name>, pending, <n>, ...
  if c[2] == ARGV[2] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
    return 1
  end
end
return -1
