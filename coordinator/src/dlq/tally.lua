-- Counts the dead letters of KEYS[1] (a `<stream>:dlq`) per group, from ARGV[1] (an
-- XRANGE start: `-` or `(<id>`), at most ARGV[2] of them, on the server: only the counts
-- cross the network, not the dead letters.
-- Returns {entries read, id of the last one read (or ""), group, count, first id, ...}.
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
local tally = {}
local order = {}
for _, e in ipairs(entries) do
  local fields = e[2]
  local group = ''
  for i = 1, #fields, 2 do
    if fields[i] == 'group' then
      group = fields[i + 1]
      break
    end
  end
  local t = tally[group]
  if not t then
    t = {0, e[1]}
    tally[group] = t
    order[#order + 1] = group
  end
  t[1] = t[1] + 1
end
local last = ''
if #entries > 0 then
  last = entries[#entries][1]
end
local out = {#entries, last}
for _, g in ipairs(order) do
  out[#out + 1] = g
  out[#out + 1] = tally[g][1]
  out[#out + 1] = tally[g][2]
end
return out
