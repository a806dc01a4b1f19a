-- Appends one sample to a group's lag history (ARCHITECTURE "How lag is sampled"), unless
-- the newest sample is less than ARGV[2] ms older: then another coordinator sampled the
-- group in the meantime (two that briefly disagree on who samples it), and one sample per
-- interval is kept.
-- KEYS[1]  the history list (JSON records, oldest first)
-- ARGV[1]  the sample's time (Unix ms)
-- ARGV[2]  the least gap to the newest sample (ms)
-- ARGV[3]  how many samples are kept
-- ARGV[4]  how long the history lives after its last append (ms)
-- ARGV[5]  the record (JSON, with a top-level `t_ms`)
-- Returns 1 when appended, 0 when not.
local newest = redis.call('LINDEX', KEYS[1], -1)
if newest then
  local ok, rec = pcall(cjson.decode, newest)
  if ok and type(rec) == 'table' and tonumber(rec['t_ms']) and
      tonumber(rec['t_ms']) + tonumber(ARGV[2]) > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('RPUSH', KEYS[1], ARGV[5])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[3]), -1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
