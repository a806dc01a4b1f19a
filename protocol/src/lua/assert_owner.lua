-- Writes owner tokens unless newer ones are there (strict fencing, PROTOCOL §5.6).
-- KEYS[i]: {<shard key>}:owner:<group>   ARGV[i]: its token "<created_ms>:<grant_epoch>:<member>"
-- (any number of pairs; on a Redis Cluster all keys of one call must share a slot).
-- The token's text is rsc_protocol::owner::OwnerToken (Display/FromStr); `gen` reads its
-- created_ms and grant_epoch, in that order, and the pair orders tokens.
-- Returns one code per key, in order: 2 written, 1 already there, 0 refused (a newer
-- grant's token is in place).
local function gen(t)
  local c, e = string.match(t, '^(%d+):(%d+):')
  return tonumber(c), tonumber(e)
end
local function assert_one(key, token)
  local cur = redis.call('GET', key)
  if cur then
    if cur == token then return 1 end
    local c1, e1 = gen(cur)
    local c2, e2 = gen(token)
    if c1 and (c1 > c2 or (c1 == c2 and e1 > e2)) then return 0 end
  end
  redis.call('SET', key, token)
  return 2
end
local codes = {}
for i = 1, #KEYS do
  codes[i] = assert_one(KEYS[i], ARGV[i])
end
return codes
