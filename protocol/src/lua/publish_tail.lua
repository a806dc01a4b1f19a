-- The end of a producer's write (PROTOCOL §15, §21), queued inside its MULTI after the XADDs.
-- KEYS: the same as publish_check.lua's (markers, then records for an idempotent producer, then the abort key): queued with the same keys, an ACL that refuses the check refuses this
-- too, and the transaction is aborted at EXEC (EXECABORT) instead of running unchecked.
-- ARGV[1]: the records' idle expiry (ms); ARGV[2]: the shard count k; ARGV[3]: how to ring
-- (PUBLISH, or SPUBLISH on a Redis Cluster); idempotent only, then per shard the highest
-- sequence written; then the doorbell channels to ring (§16).
local k = tonumber(ARGV[2])
local i = 4
if #KEYS == 2 * k + 1 then
  for j = 1, k do
    redis.call('HSET', KEYS[k + j], 's', ARGV[i])
    redis.call('PEXPIRE', KEYS[k + j], ARGV[1])
    i = i + 1
  end
end
for x = i, #ARGV do redis.call(ARGV[3], ARGV[x], '') end
return 0
