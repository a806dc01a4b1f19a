-- The end of a producer's write (PROTOCOL §15, §21), queued inside its MULTI after the XADDs.
-- KEYS: the same as publish_check.lua's (markers, then records for an idempotent producer, then the abort key): queued with the same keys, an ACL that refuses the check refuses this
-- too, and the transaction is aborted at EXEC (EXECABORT) instead of running unchecked. An
-- idempotent producer then adds the k shard keys, in the same order.
-- ARGV[1]: the records' idle expiry (ms); ARGV[2]: the shard count k; ARGV[3]: how to ring
-- (PUBLISH, or SPUBLISH on a Redis Cluster); idempotent only, then per shard the highest
-- sequence written, the lowest and how many records; then the doorbell channels to ring (§16).
-- An idempotent write sets in each record s (the highest sequence), f (the lowest), n (the
-- count) and i (the id of the shard's last entry, which this transaction wrote: its n entries
-- end there, contiguous), so that a retry reads their ids without any field in the entries.
local k = tonumber(ARGV[2])
local i = 4
if #KEYS == 3 * k + 1 then
  for j = 1, k do
    local last = redis.call('XREVRANGE', KEYS[2 * k + 1 + j], '+', '-', 'COUNT', 1)
    redis.call('HSET', KEYS[k + j], 's', ARGV[i], 'f', ARGV[i + 1], 'n', ARGV[i + 2], 'i', last[1][1])
    redis.call('PEXPIRE', KEYS[k + j], ARGV[1])
    i = i + 3
  end
end
for x = i, #ARGV do redis.call(ARGV[3], ARGV[x], '') end
return 0
