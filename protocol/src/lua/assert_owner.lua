-- Writes an owner token unless a newer one is there (strict fencing, PROTOCOL §5.6).
-- KEYS[1]: {<shard key>}:owner:<group>   ARGV[1]: token "<created_ms>:<grant_epoch>:<member>"
-- The token's text is rsc_protocol::owner::OwnerToken (Display/FromStr); `gen` reads its
-- created_ms and grant_epoch, in that order, and the pair orders tokens.
-- Returns 2 written, 1 already there, 0 refused (a newer grant's token is in place).
local function gen(t)
  local c, e = string.match(t, '^(%d+):(%d+):')
  return tonumber(c), tonumber(e)
end
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == ARGV[1] then return 1 end
  local c1, e1 = gen(cur)
  local c2, e2 = gen(ARGV[1])
  if c1 and (c1 > c2 or (c1 == c2 and e1 > e2)) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1])
return 2
