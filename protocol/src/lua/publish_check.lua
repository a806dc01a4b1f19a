-- The check of a producer's write (PROTOCOL §15 fence, §21 idempotence), sent in one pipeline:
-- WATCH <markers> [<records>] <abort>; EVAL <this>; MULTI; XADD …; EVAL <publish_tail.lua>; EXEC.
-- KEYS: the epoch markers {<shard key>}:epoch of the k shards written; for an idempotent
-- producer then their producer records {<shard key>}:producer:<id>, in the same order; last
-- the abort key {<first shard key>}:publish-abort, which never holds a value (k + 1 or
-- 2k + 1 keys). A record holds s = the highest sequence the id wrote to the shard.
-- ARGV[1]: the producer's routing epoch; ARGV[2]: the producer id ('' none); idempotent only,
-- then per shard the lowest sequence of its records (f), then per shard the last sequence the
-- producer knows it wrote there (known; 0: nothing to compare), then per shard the last
-- sequence the record must hold for this write to follow the lane's earlier ones (prev; 0:
-- none asked; absent: known).
-- A record holds s (the last sequence of the id's last write to the shard), that write's f, n
-- and i, and h: the writes before it, newest first ("f n i" joined by ','; publish_tail.lua).
-- Returns nil when the transaction may run (it still aborts if a watched key changes before
-- the EXEC); when it may run but a shard's record is behind the sequence the producer knows
-- it wrote there (those writes are gone: a failover lost them, or the record was deleted),
-- {'behind', b_1, ..., b_k} with b_j = the record's s (0 when there is none) for such a shard,
-- -1 for the others: no key is touched, the transaction runs. Else it touches a watched key,
-- which aborts the transaction (EXEC answers nil), and returns per shard {refused, w}:
-- refused = the marker when it is not ARGV[1] (0 when it is or is absent); w = f when the
-- record names a write starting at f (a retry of what had landed; its entry ids are read by
-- publish_landed.lua), -2 when the record does not end at prev (an earlier write of the lane
-- is missing: refused for order, nothing written), else -1.
-- A record not at prev is a loss only when prev is what the producer knows written (prev ==
-- known: nothing of the lane before this write is in flight); otherwise an earlier write is
-- still in flight, was refused or aborted, and this one must not overtake it.
-- Duplicates and the marker are both reported: a retry of a landed write is recognised even
-- after a reshard moved the marker.
-- Fails closed: on any error (a key of the wrong type, a refused write, a Lua error) it sets
-- and deletes the abort key (both invalidate the WATCH, nothing is left; no user key is
-- written) and answers the error, naming the key it was reading: nothing is written.
local idem = ARGV[2] ~= ''
local k = idem and (#KEYS - 1) / 2 or #KEYS - 1
local at = KEYS[1]
local function check()
  local out, abort, behind, lost, order = {}, false, {'behind'}, false, false
  for j = 1, k do
    at = KEYS[j]
    local m = redis.call('GET', at)
    local refused = 0
    if m and m ~= ARGV[1] then
      refused = tonumber(m) or 1
      redis.call('SET', at, m, 'KEEPTTL')
      abort = true
    end
    local hw, b = -1, -1
    if idem then
      at = KEYS[k + j]
      local r = redis.call('HMGET', at, 's', 'f', 'h')
      local f = ARGV[2 + j]
      local known = tonumber(ARGV[2 + k + j] or '0') or 0
      local prev = tonumber(ARGV[2 + 2 * k + j] or known) or known
      local s = tonumber(r[1]) or 0
      if r[1] and (r[2] == f or (r[3] and string.find(',' .. r[3], ',' .. f .. ' ', 1, true))) then
        hw = tonumber(f)
        redis.call('HSET', at, 's', r[1])
        abort = true
      elseif prev > 0 and s ~= prev then
        if prev == known then
          b = s
          lost = true
        else
          hw = -2
          order = true
        end
      end
    end
    out[j] = {refused, hw}
    behind[j + 1] = b
  end
  if order then
    redis.call('SET', KEYS[#KEYS], '1')
    redis.call('DEL', KEYS[#KEYS])
    return out
  end
  if abort then return out end
  if lost then return behind end
  return nil
end
local ok, res = pcall(check)
if ok then return res end
redis.pcall('SET', KEYS[#KEYS], '1')
redis.pcall('DEL', KEYS[#KEYS])
local msg = type(res) == 'table' and tostring(res.err) or tostring(res)
if not msg:match('^%u+ ') then msg = 'ERR ' .. msg end
return redis.error_reply(msg .. ' (publish check, key ' .. at .. ': nothing written)')
