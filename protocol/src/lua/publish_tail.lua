-- The end of a producer's write (PROTOCOL §15, §21), queued inside its MULTI after the XADDs.
-- KEYS: the same as publish_check.lua's (markers, then records for an idempotent producer, then the abort key): queued with the same keys, an ACL that refuses the check refuses this
-- too, and the transaction is aborted at EXEC (EXECABORT) instead of running unchecked. An
-- idempotent producer then adds the k shard keys, in the same order.
-- ARGV[1]: the records' idle expiry (ms); ARGV[2]: the shard count k; ARGV[3]: how to ring
-- (PUBLISH, or SPUBLISH on a Redis Cluster); idempotent only, then per shard the highest
-- sequence written, the lowest and how many records; then, idempotent only, how many writes
-- a record names (H: the producer's publishes in flight); then the doorbell channels to ring
-- (§16).
-- An idempotent write sets in each record s (the last sequence), f (the lowest), n (the
-- count) and i (the id of the shard's last entry, which this transaction wrote: its n entries
-- end there, contiguous), so that a retry reads their ids without any field in the entries;
-- with H > 1 the write it replaces moves to the front of h ("f n i", joined by ','), which
-- keeps the H - 1 writes before the last: a retry of a write that later ones of the lane
-- followed (several in flight) still finds it.
local k = tonumber(ARGV[2])
local i = 4
if #KEYS == 3 * k + 1 then
  local keep = tonumber(ARGV[4 + 3 * k]) - 1
  for j = 1, k do
    local rec = KEYS[k + j]
    local last = redis.call('XREVRANGE', KEYS[2 * k + 1 + j], '+', '-', 'COUNT', 1)
    if keep > 0 then
      local o = redis.call('HMGET', rec, 'f', 'n', 'i', 'h')
      if o[1] and o[2] and o[3] then
        local h = o[1] .. ' ' .. o[2] .. ' ' .. o[3]
        if o[4] and o[4] ~= '' then h = h .. ',' .. o[4] end
        local at, c = 0, 0
        while true do
          at = string.find(h, ',', at + 1, true)
          if not at then break end
          c = c + 1
          if c == keep then
            h = string.sub(h, 1, at - 1)
            break
          end
        end
        redis.call('HSET', rec, 'h', h)
      end
    end
    redis.call('HSET', rec, 's', ARGV[i], 'f', ARGV[i + 1], 'n', ARGV[i + 2], 'i', last[1][1])
    redis.call('PEXPIRE', rec, ARGV[1])
    i = i + 3
  end
  i = i + 1
end
for x = i, #ARGV do redis.call(ARGV[3], ARGV[x], '') end
return 0
