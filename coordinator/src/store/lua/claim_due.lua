-- Claims due groups of the deadline index: each due entry moves to the claim's end, so a
-- concurrent sweeper never claims it too, and it is due again if this one dies before it
-- reschedules it.
-- KEYS     one or more buckets' sorted sets (several only on standalone Redis)
-- ARGV[1]  now (Unix ms), ARGV[2] the claim's end (Unix ms), ARGV[3] most groups in all
-- Returns the claimed groups.
local out = {}
local left = tonumber(ARGV[3])
for _, key in ipairs(KEYS) do
  if left <= 0 then
    break
  end
  local due = redis.call('ZRANGEBYSCORE', key, '-inf', ARGV[1], 'LIMIT', 0, left)
  for _, group in ipairs(due) do
    redis.call('ZADD', key, ARGV[2], group)
    out[#out + 1] = group
  end
  left = left - #due
end
return out
