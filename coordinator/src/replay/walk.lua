-- Walks the entries of one shard key without sending them back (PROTOCOL §18, seek): counts
-- what a seek moves over, a page of 1000 at a time, up to ARGV[4] entries.
--
-- KEYS[1]: the shard key. ARGV[1]: 'fwd' (XRANGE) or 'rev' (XREVRANGE). ARGV[2]: where to
-- start, ARGV[3]: where to stop, both as that command's bounds ('(' before an id makes it
-- exclusive; '-' and '+' are the ends): fwd walks from ARGV[2] up to ARGV[3], rev from
-- ARGV[2] down to ARGV[3]. ARGV[4]: the most entries to walk.
-- Answers {entries walked, the last id walked or '', entries-added, length}: the two
-- counters as they are when the walk ends (a walk that reaches the stream's end counts every
-- entry added before that moment).
-- Read-only; touches only KEYS[1] (one Redis Cluster slot).
local key, from, to = KEYS[1], ARGV[2], ARGV[3]
local cmd = 'XRANGE'
if ARGV[1] == 'rev' then
  cmd = 'XREVRANGE'
end
local max = tonumber(ARGV[4])
local walked, last = 0, ''
while walked < max do
  local want = math.min(1000, max - walked)
  local page = redis.call(cmd, key, from, to, 'COUNT', want)
  walked = walked + #page
  if #page > 0 then
    last = page[#page][1]
    from = '(' .. last
  end
  if #page < want then
    break
  end
end
local added = -1
if redis.call('EXISTS', key) == 1 then
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then
      added = info[i + 1]
    end
  end
end
return {walked, last, added, redis.call('XLEN', key)}
