-- Non-blocking retries (PROTOCOL §2.2 "Retry stages"): takes an entry out of where it is
-- and, with a third key, appends it to a retry stage; fenced like an acknowledgement.
-- KEYS[1] {<shard key>}:owner:<group>   KEYS[2] where the entry is: the shard key (with a
-- group: XACK) or a retry stream (without: XDEL)   KEYS[3] (optional) the retry stream to
-- append to
-- ARGV[1] owner token ('': lease fencing, not checked)  ARGV[2] group ('': KEYS[2] is a
-- retry stream)  ARGV[3] the entry's id in KEYS[2]  ARGV[4..] the fields to append
-- Returns -1 when the token is not the shard's, 0 when the entry was not there any more
-- (acknowledged or moved already: nothing appended), else 1.
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local n
if ARGV[2] ~= '' then
  n = redis.call('XACK', KEYS[2], ARGV[2], ARGV[3])
else
  n = redis.call('XDEL', KEYS[2], ARGV[3])
end
if n == 0 then return 0 end
if KEYS[3] then redis.call('XADD', KEYS[3], '*', unpack(ARGV, 4)) end
return 1
