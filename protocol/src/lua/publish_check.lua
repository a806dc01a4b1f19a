-- The check of a producer's write (PROTOCOL §15 fence, §21 idempotence), sent in one pipeline:
-- WATCH <markers> [<records>]; EVAL <this>; MULTI; XADD …; EVAL <publish_tail.lua>; EXEC.
-- KEYS: the epoch markers {<shard key>}:epoch of the k shards written; for an idempotent
-- producer then their producer records {<shard key>}:producer:<id> and their shard keys, in
-- the same order (3k keys). A record holds s = the highest sequence the id wrote to the shard.
-- ARGV[1]: the producer's routing epoch; ARGV[2]: the producer id ('' none); ARGV[3]: the
-- records' idle expiry (ms); then, idempotent only, per shard: the count c of its records
-- and their c sequences, ascending.
-- Returns nil when the transaction may run (it still aborts if a watched key changes before
-- the EXEC). Else it touches a watched key, which aborts the transaction (EXEC answers nil),
-- and returns per shard {refused, id_1, …}: refused = the marker when it is not ARGV[1] (0
-- when it is or is absent); the ids only for a shard with records written before (sequence
-- <= s: a retry of what had landed): the entry id ('' when not found), false = not written.
-- Duplicates are resolved before the marker: a retry of a landed write is recognised even
-- after a reshard moved the marker.
local idem = ARGV[2] ~= ''
local k = idem and #KEYS / 3 or #KEYS
local ttl = tonumber(ARGV[3])
-- The entries of the id's last write to a shard (contiguous: one transaction), by sequence:
-- read backwards from the write's time (the record's expiry less the idle time), then from
-- the stream's end (a stream whose last id is ahead of this server's clock; a Redis before 7.0,
-- without PEXPIRETIME). An error here would let the transaction run unchecked: none is raised.
local function landed(stream, rec, want, left)
  local found = {}
  local function scan(hi, cap)
    while left > 0 and cap > 0 do
      local es = redis.call('XREVRANGE', stream, hi, '-', 'COUNT', 64)
      for _, e in ipairs(es) do
        local f = e[2]
        local n = #f
        local q = f[n]
        if f[n - 2] == ARGV[2] and f[n - 3] == 'producer_id' and want[q] and not found[q] then
          found[q] = e[1]
          left = left - 1
        end
      end
      if #es < 64 then return end
      hi = '(' .. es[#es][1]
      cap = cap - #es
    end
  end
  local at = redis.pcall('PEXPIRETIME', rec)
  if type(at) == 'number' and at > 0 then scan(string.format('%d', at - ttl), 1024) end
  if left > 0 then scan('+', 16384) end
  return found
end
local out, abort = {}, false
local i = 4
for j = 1, k do
  local m = redis.call('GET', KEYS[j])
  local refused = 0
  if m and m ~= ARGV[1] then refused = tonumber(m) or 1 end
  local part = {refused}
  if idem then
    local c = tonumber(ARGV[i])
    local s = redis.call('HGET', KEYS[k + j], 's')
    local hw = tonumber(s or '-1')
    if c > 0 and tonumber(ARGV[i + 1]) <= hw then
      local want, left = {}, 0
      for x = 1, c do
        if tonumber(ARGV[i + x]) <= hw then want[ARGV[i + x]] = true; left = left + 1 end
      end
      local found = landed(KEYS[2 * k + j], KEYS[k + j], want, left)
      for x = 1, c do
        local q = ARGV[i + x]
        if want[q] then part[x + 1] = found[q] or '' else part[x + 1] = false end
      end
      redis.call('HSET', KEYS[k + j], 's', s)
      abort = true
    end
    i = i + 1 + c
  end
  if refused ~= 0 then
    redis.call('SET', KEYS[j], m, 'KEEPTTL')
    abort = true
  end
  out[j] = part
end
if abort then return out end
return nil
