-- Prepended to the scripts that add members to a group's liveness (see the Redis store's
-- module documentation, `P:live:{G}`). Redis keeps a sorted set of at most 128 short
-- members as a listpack, where every ZADD that moves a score deletes and re-inserts the
-- entry: at 64 members that costs it about four times a skiplist's update, on every steady
-- heartbeat. An entry longer than 64 bytes makes Redis convert the set to a skiplist for
-- good, so once a group has 16 members its liveness gets one: this padding entry, scored
-- +inf (never silent, so never expired) and named with a '#', which no member id can start
-- with. Readers of the liveness skip it.
local function pad_liveness(live)
  if redis.call('ZCARD', live) >= 16 then
    redis.call('ZADD', live, 'NX', 'inf',
      '#rsc-liveness-padding: an entry over 64 bytes keeps this sorted set a skiplist')
  end
end
