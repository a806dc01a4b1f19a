-- Guarded read (strict fencing): acknowledge the previous batch, then read new entries,
-- only while the caller's owner token is the shard's.
-- KEYS[1] {<shard key>}:owner:<group>   KEYS[2] <shard key>
-- ARGV[1] token  ARGV[2] group  ARGV[3] consumer  ARGV[4] count  ARGV[5..] ids to acknowledge
-- Returns {'fenced'} | {'entries', <XREADGROUP reply>} | {'idle', <last entry id or 0-0>}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'fenced'} end
if #ARGV > 4 then redis.call('XACK', KEYS[2], ARGV[2], unpack(ARGV, 5)) end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[2], '>')
if r then return {'entries', r} end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if last[1] then return {'idle', last[1][1]} end
return {'idle', '0-0'}
