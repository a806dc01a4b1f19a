-- Seals a shard at a routing-epoch switch (ordered resharding, PROTOCOL §15).
-- KEYS[1]: <shard key>  KEYS[2]: {<shard key>}:epoch  KEYS[3]: {<shard key>}:seals
-- ARGV[1]: the new routing epoch   ARGV[2]: the shard count before the switch
-- Moves the epoch marker forward (never back) and records, once, the last entry id written
-- under the previous epoch. Returns the seal "<id>/<count>" of ARGV[1] (nil: a later switch
-- already sealed the shard without this one, which the stream lock rules out).
local e = tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < e then
  redis.call('SET', KEYS[2], ARGV[1])
  local id = '0-0'
  if redis.call('TYPE', KEYS[1])['ok'] == 'stream' then
    local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    if last[1] then id = last[1][1] end
  end
  redis.call('HSETNX', KEYS[3], ARGV[1], id .. '/' .. ARGV[2])
end
return redis.call('HGET', KEYS[3], ARGV[1])
