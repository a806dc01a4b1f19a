-- How far a group is from a seal on one shard (ordered resharding, PROTOCOL §15).
-- KEYS[1]: <shard key>   ARGV[1]: group   ARGV[2]: seal id   ARGV[3]: count cap
-- Returns {undelivered, pending}: entries with id <= seal not yet delivered to the group
-- (after its last-delivered id) and delivered but not acknowledged, each counted up to the
-- cap. {0, 0} means every entry up to the seal was handled and acknowledged by the group.
-- -1 as undelivered: the group does not exist on the shard although entries precede the seal.
if ARGV[2] == '0-0' then return {0, 0} end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then return {0, 0} end
local cap = tonumber(ARGV[3])
local ld = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, last = nil, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  if name == ARGV[1] then ld = last end
end
if not ld then
  if #redis.call('XRANGE', KEYS[1], '-', ARGV[2], 'COUNT', 1) == 0 then return {0, 0} end
  return {-1, 0}
end
local undelivered = #redis.call('XRANGE', KEYS[1], '(' .. ld, ARGV[2], 'COUNT', cap)
local pending = #redis.call('XPENDING', KEYS[1], ARGV[1], '-', ARGV[2], cap)
return {undelivered, pending}
