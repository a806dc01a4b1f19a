-- Guarded acknowledgement (strict fencing).
-- KEYS[1] {<shard key>}:owner:<group>   KEYS[2] <shard key>
-- ARGV[1] token  ARGV[2] group  ARGV[3..] ids
-- Returns -1 when the token is not the shard's, else XACK's count.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
return redis.call('XACK', KEYS[2], ARGV[2], unpack(ARGV, 3))
