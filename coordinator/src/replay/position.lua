-- The position of a group on one shard key, read in one step (PROTOCOL §18, seek): the
-- stream's counters and the group's Redis consumer group.
--
-- KEYS[1]: the shard key. ARGV[1]: the group.
-- Answers {0} when the key does not exist, else
-- {1, length, entries-added, last-generated-id, first entry id or '', last entry id or '',
--  1 when the group has a consumer group there (else 0), its last-delivered-id or '',
--  its entries-read or -1, its lag or -1, its pending count}.
-- Read-only; touches only KEYS[1] (one Redis Cluster slot).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
local s = {}
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do
  s[info[i]] = info[i + 1]
end
local first, last = '', ''
if type(s['first-entry']) == 'table' then
  first = s['first-entry'][1]
end
if type(s['last-entry']) == 'table' then
  last = s['last-entry'][1]
end
local out = {1, s['length'], s['entries-added'] or -1, s['last-generated-id'], first, last,
  0, '', -1, -1, 0}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do
    f[g[i]] = g[i + 1]
  end
  if f['name'] == ARGV[1] then
    out[7] = 1
    out[8] = f['last-delivered-id']
    if f['entries-read'] then
      out[9] = f['entries-read']
    end
    if f['lag'] then
      out[10] = f['lag']
    end
    out[11] = f['pending']
  end
end
return out
