-- The entry ids of records an idempotent producer's earlier attempt wrote to a shard (PROTOCOL
-- §21), read only when publish_check.lua reported such records (a retry).
-- KEYS[1]: the shard key; KEYS[2]: the producer record {<shard key>}:producer:<id>.
-- ARGV[1]: the producer id; ARGV[2]: the records' idle expiry (ms); ARGV[3..]: the sequences.
-- Returns each sequence's entry id, in order ('' when not found: written, id unknown).
-- The record names the id's last write to the shard (publish_tail.lua: f its lowest sequence,
-- n its count, i its last entry id) and, in h, the writes before it: when the sequences asked
-- are one of those writes', its n entries ending at its i are the answer. Otherwise (a record of an older producer) the entries' own
-- producer_id and producer_seq fields are matched, where the producer wrote them:
-- The entries of the id's last write to the shard are contiguous (one transaction): they are
-- read backwards from the write's time (the record's expiry less the idle time), then from the
-- stream's end (a stream whose last id is ahead of this server's clock; a Redis before 7.0,
-- without PEXPIRETIME), at most 1,024 and 16,384 entries.
local asked = #ARGV - 2
local r = redis.call('HMGET', KEYS[2], 'f', 'n', 'i', 'h')
local last = nil
if r[1] == ARGV[3] and tonumber(r[2]) == asked and r[3] then
  last = r[3]
elseif r[4] then
  -- A write that later ones of the lane followed: its "f n i" in h.
  for e in string.gmatch(r[4], '[^,]+') do
    local f, n, id = string.match(e, '^(%S+) (%S+) (%S+)$')
    if f == ARGV[3] and tonumber(n) == asked then
      last = id
      break
    end
  end
end
if last then
  local es = redis.call('XREVRANGE', KEYS[1], last, '-', 'COUNT', asked)
  if #es == asked and es[1][1] == last then
    local out = {}
    for x = asked, 1, -1 do out[#out + 1] = es[x][1] end
    return out
  end
end
local want, left, found = {}, 0, {}
for x = 3, #ARGV do
  want[ARGV[x]] = true
  left = left + 1
end
local function scan(hi, cap)
  while left > 0 and cap > 0 do
    local es = redis.call('XREVRANGE', KEYS[1], hi, '-', 'COUNT', 64)
    for _, e in ipairs(es) do
      local f = e[2]
      local n = #f
      local q = f[n]
      if f[n - 2] == ARGV[1] and f[n - 3] == 'producer_id' and want[q] and not found[q] then
        found[q] = e[1]
        left = left - 1
      end
    end
    if #es < 64 then return end
    hi = '(' .. es[#es][1]
    cap = cap - #es
  end
end
local at = redis.pcall('PEXPIRETIME', KEYS[2])
if type(at) == 'number' and at > 0 then
  scan(string.format('%d', at - tonumber(ARGV[2])), 1024)
end
if left > 0 then scan('+', 16384) end
local out = {}
for x = 3, #ARGV do out[#out + 1] = found[ARGV[x]] or '' end
return out
