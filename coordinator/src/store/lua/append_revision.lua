-- Appends one record to a document's metadata history (PROTOCOL §22), in the script that
-- writes the document (the history shares its hash-tag slot), then trims it by count and
-- by age. The record is built here, `{"t":<time>,"r":<revision>,` + body, because only the
-- script knows the revision it commits; its time comes first so that trimming reads it
-- without decoding the record.
-- key       the history list (oldest first)
-- revision  the revision the write commits
-- t         the commit time (Unix ms, decimal string)
-- body      the rest of the record: `"c":…,"d":[…],"p":…}`
-- keep      records kept at most
-- max_age   ms: older records are dropped, and the list expires that long after a write
local function append_revision(key, revision, t, body, keep, max_age)
  redis.call('RPUSH', key, '{"t":' .. t .. ',"r":' .. revision .. ',' .. body)
  redis.call('LTRIM', key, -tonumber(keep), -1)
  local cutoff = tonumber(t) - tonumber(max_age)
  for _ = 1, 64 do
    local oldest = redis.call('LINDEX', key, 0)
    local at = oldest and tonumber(string.match(oldest, '^{"t":(%d+)'))
    if not at or at >= cutoff then
      break
    end
    redis.call('LPOP', key)
  end
  redis.call('PEXPIRE', key, max_age)
end
