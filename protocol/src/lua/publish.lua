-- A producer's write to one shard (PROTOCOL §15 fence, §21 idempotence), atomic.
-- KEYS[1]: the shard key; KEYS[2]: its epoch marker {<shard key>}:epoch; KEYS[3] (only for
-- an idempotent producer): its record {<shard key>}:producer:<producer id>, a hash
-- s = the highest sequence written, f = the id of the first entry of the last write,
-- n = how many entries that write added.
-- ARGV[1]: the producer's routing epoch; ARGV[2]: the record's idle expiry (ms);
-- ARGV[3]: the doorbell channel to ring after a write ('' none, §16); ARGV[4]: the producer
-- id; then per entry: its sequence, its field count 2k, and k name/value pairs.
-- Returns {refused, id_1, …}: refused = the epoch marker when it is not ARGV[1] (0 when it
-- is or is absent); id_i = the entry's id, written now or found written before (sequence
-- <= s: a retry of what had landed); false = not written (refused).
-- Duplicates are resolved before the marker: a retry of a landed write is recognised even
-- after a reshard moved the marker.
local m = redis.call('GET', KEYS[2])
local refused = 0
if m and m ~= ARGV[1] then refused = tonumber(m) or 1 end
local idem = KEYS[3] ~= nil
local hw, first, cnt = -1, nil, 0
if idem then
  local r = redis.call('HMGET', KEYS[3], 's', 'f', 'n')
  if r[1] then hw = tonumber(r[1]); first = r[2]; cnt = tonumber(r[3]) or 0 end
end
local known
local function landed(seq)
  if not known then
    known = {}
    if first then
      for _, e in ipairs(redis.call('XRANGE', KEYS[1], first, '+', 'COUNT', cnt)) do
        local f, pid, s = e[2], nil, nil
        for j = 1, #f, 2 do
          if f[j] == 'producer_id' then pid = f[j + 1] end
          if f[j] == 'producer_seq' then s = f[j + 1] end
        end
        if pid == ARGV[4] and s then known[s] = e[1] end
      end
    end
  end
  return known[seq] or ''
end
local out = {refused}
local top, topn, newfirst, added = hw, nil, nil, 0
local i = 5
while i <= #ARGV do
  local seq, k = ARGV[i], tonumber(ARGV[i + 1])
  local n = tonumber(seq)
  local id = false
  if idem and n <= hw then
    id = landed(seq)
  elseif refused == 0 then
    id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 2, i + 1 + k))
    newfirst = newfirst or id
    added = added + 1
    if n > top then top, topn = n, seq end
  end
  out[#out + 1] = id
  i = i + 2 + k
end
if added > 0 then
  if idem then
    redis.call('HSET', KEYS[3], 's', topn or tostring(top), 'f', newfirst, 'n', added)
  end
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], '') end
end
if idem and (added > 0 or hw >= 0) then redis.call('PEXPIRE', KEYS[3], ARGV[2]) end
return out
