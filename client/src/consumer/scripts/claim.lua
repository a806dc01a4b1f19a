-- Guarded takeover of pending entries (strict fencing).
-- KEYS[1] {<shard key>}:owner:<group>   KEYS[2] <shard key>
-- ARGV[1] token  ARGV[2] group  ARGV[3] consumer  ARGV[4] cursor  ARGV[5] count
-- Returns {'fenced'} | {'claimed', <XAUTOCLAIM reply>}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'fenced'} end
return {'claimed', redis.call('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[4], 'COUNT', ARGV[5])}
