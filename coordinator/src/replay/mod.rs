//! Seeks (PROTOCOL §18): moving a group's position on its shards in the data Redis, so that
//! it is delivered again (or skips) entries — Kafka's `kafka-consumer-groups --reset-offsets`.
//!
//! A seek is planned, then carried out:
//!
//! 1. **Plan** (also the whole of a dry run): each shard key is read in one step
//!    (`position.lua`: the stream's counters and the group's Redis consumer group); the target
//!    is resolved to an id ([`plan::resolve`]; a shift walks that many entries,
//!    `walk.lua`); the entries after the new id are counted, from the stream's counters when
//!    the id is outside the entries, else by walking the shorter side ([`plan::count_after`]).
//!    That count is the group's lag right after the seek, and gives the id's read counter.
//! 2. **Move**: `XGROUP SETID <key> <group> <id> ENTRIESREAD <n>` (`XGROUP CREATE … MKSTREAM
//!    ENTRIESREAD <n>` where the consumer group does not exist yet). With the read counter
//!    given, Redis' `XINFO GROUPS` keeps answering the exact lag after the seek (without it,
//!    Redis 7 answers no lag at all after a `SETID` to an id inside the stream).
//! 3. **Ring**: the shard's doorbell (`PUBLISH`/`SPUBLISH {<key>}:ring`, PROTOCOL §16), so that
//!    a worker waiting on it reads at once — no producer announces a seek, and the fallback
//!    poll looks only for entries after the last one the worker saw, which a seek back does
//!    not add. The worker also reads at once when its group is resumed.

pub(crate) mod plan;
#[cfg(test)]
mod tests;

use futures::{StreamExt, TryStreamExt};
use plan::{Count, Id, ShardRead, Target, Walked, fmt_id, id_ms};
use rsc_protocol::routing::{parse_entry_id, ring_channel, ring_command};
use rsc_protocol::{SeekShardPlan, StartPosition};
use rsc_redis::{Conn, LazyRedis};
use std::time::Duration;

/// Entries walked per script call (each call holds Redis for about a millisecond per
/// thousand entries).
const WALK_PAGE: u64 = 20_000;

/// Why a seek could not be planned or carried out.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The request cannot be carried out on these shards (e.g. an id past a shard's end).
    #[error("{0}")]
    Invalid(String),
    /// The data Redis failed or did not answer in time.
    #[error("{0}")]
    Redis(String),
}

impl From<redis::RedisError> for ReplayError {
    fn from(e: redis::RedisError) -> Self {
        ReplayError::Redis(e.to_string())
    }
}

/// One shard's move: where the group is and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardMove {
    /// Shard index.
    pub(crate) shard: u32,
    /// Shard key.
    pub(crate) key: String,
    /// What was read there.
    pub(crate) read: ShardRead,
    /// The new last-delivered id.
    pub(crate) new: Id,
    /// Its read counter (`ENTRIESREAD`).
    pub(crate) entries_read: u64,
    /// Entries after it.
    pub(crate) lag_after: u64,
    /// Entries not yet delivered before the seek (`None` without a consumer group).
    pub(crate) lag_before: Option<u64>,
}

impl ShardMove {
    /// The shard's line of the answer.
    pub(crate) fn to_wire(&self) -> SeekShardPlan {
        let current = self.read.group.map(|g| g.last_delivered);
        let lag_before = self.lag_before;
        SeekShardPlan {
            shard: self.shard,
            key: self.key.clone(),
            current_id: current.map(fmt_id),
            current_ms: current.and_then(id_ms),
            new_id: fmt_id(self.new),
            new_ms: id_ms(self.new),
            lag_before,
            lag_after: self.lag_after,
            redelivered: lag_before.map_or(0, |b| self.lag_after.saturating_sub(b)),
            skipped: lag_before.map_or(0, |b| b.saturating_sub(self.lag_after)),
            pending: self.read.group.map_or(0, |g| g.pending),
        }
    }
}

/// Plans and carries out seeks on the data Redis (see the module docs).
pub(crate) struct Replayer {
    redis: LazyRedis,
    position: redis::Script,
    walk: redis::Script,
    timeout: Duration,
    /// Entries walked per script call ([`WALK_PAGE`]; smaller in tests).
    page: u64,
}

impl std::fmt::Debug for Replayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer")
            .field("cluster", &self.redis.is_cluster())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// How many shards a seek reads or moves at a time, on one multiplexed connection. Not all
/// at once: thousands of calls queued together on a busy server would each wait behind the
/// others longer than the connection's response timeout, and the seek would fail (`503`)
/// where it only had to take its time.
const SHARDS_AT_ONCE: usize = 64;

/// Bounds one Redis call.
async fn within<T>(
    timeout: Duration,
    what: &str,
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, ReplayError> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(ReplayError::Redis(format!(
            "{what}: no answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

impl Replayer {
    /// A replayer on the data Redis `redis`; each Redis call fails past `timeout`.
    pub(crate) fn new(redis: LazyRedis, timeout: Duration) -> Self {
        Replayer {
            redis,
            position: redis::Script::new(include_str!("position.lua")),
            walk: redis::Script::new(include_str!("walk.lua")),
            timeout,
            page: WALK_PAGE,
        }
    }

    /// The same, walking `page` entries per script call.
    #[cfg(test)]
    pub(crate) fn with_page(mut self, page: u64) -> Self {
        self.page = page.max(1);
        self
    }

    async fn connection(&self) -> Result<Conn, ReplayError> {
        within(
            self.timeout,
            "connecting to the data Redis",
            self.redis.get(),
        )
        .await
    }

    /// The plan of moving `group` to `target` on each `(shard, key)` (`start`: where the
    /// group's consumer groups start). Nothing is written. [`SHARDS_AT_ONCE`] shards are read
    /// at a time.
    pub(crate) async fn plan(
        &self,
        group: &str,
        start: StartPosition,
        shards: &[(u32, String)],
        target: Target,
    ) -> Result<Vec<ShardMove>, ReplayError> {
        let conn = self.connection().await?;
        // (Collected first: a stream over the borrowing closure is not `Send` for every
        // lifetime, which the route's future must be.)
        let plans: Vec<_> = shards
            .iter()
            .map(|(shard, key)| {
                let conn = conn.clone();
                async move {
                    self.plan_shard(conn, group, start, *shard, key, target)
                        .await
                }
            })
            .collect();
        futures::stream::iter(plans)
            .buffered(SHARDS_AT_ONCE)
            .try_collect()
            .await
    }

    async fn plan_shard(
        &self,
        mut conn: Conn,
        group: &str,
        start: StartPosition,
        shard: u32,
        key: &str,
        target: Target,
    ) -> Result<ShardMove, ReplayError> {
        let read = self.read(&mut conn, group, key).await?;
        let new = match plan::resolve(target, &read, start, key).map_err(ReplayError::Invalid)? {
            plan::Resolved::At(id) => id,
            plan::Resolved::Shift { from, by } => {
                let walk = if by < 0 {
                    let (max, from) = (by.unsigned_abs() + 1, fmt_id(from));
                    self.walk(&mut conn, key, "rev", &from, "-", max).await?
                } else {
                    let from = format!("({}", fmt_id(from));
                    self.walk(&mut conn, key, "fwd", &from, "+", by.unsigned_abs())
                        .await?
                };
                plan::shifted(from, by, &walk)
            }
        };
        let (lag_after, entries_read) = self.count_after(&mut conn, key, &read, new).await?;
        let lag_before = match read.group {
            None => None,
            Some(g) => match g.lag {
                Some(lag) => Some(lag),
                // Redis cannot tell (e.g. after an earlier SETID without ENTRIESREAD): count.
                None => Some(
                    self.count_after(&mut conn, key, &read, g.last_delivered)
                        .await?
                        .0,
                ),
            },
        };
        Ok(ShardMove {
            shard,
            key: key.to_owned(),
            read,
            new,
            entries_read,
            lag_after,
            lag_before,
        })
    }

    /// `position.lua` on `key`.
    async fn read(
        &self,
        conn: &mut Conn,
        group: &str,
        key: &str,
    ) -> Result<ShardRead, ReplayError> {
        let mut call = self.position.key(key);
        call.arg(group);
        let v: Vec<redis::Value> = within(
            self.timeout,
            "reading the shard's position",
            call.invoke_async(conn),
        )
        .await?;
        parse_read(&v).ok_or_else(|| {
            ReplayError::Redis(format!("unexpected answer reading the position on {key}"))
        })
    }

    /// One `walk.lua` call of at most `max` entries.
    async fn walk_once(
        &self,
        conn: &mut Conn,
        key: &str,
        dir: &str,
        from: &str,
        to: &str,
        max: u64,
    ) -> Result<Walked, ReplayError> {
        let mut call = self.walk.key(key);
        call.arg(dir).arg(from).arg(to).arg(max);
        let (walked, last, added, length): (u64, String, i64, u64) =
            within(self.timeout, "walking the shard", call.invoke_async(conn)).await?;
        Ok(Walked {
            walked,
            last: parse_entry_id(&last),
            entries_added: u64::try_from(added).unwrap_or(0),
            length,
        })
    }

    /// `(entries after at, read counter of at)` on `key` (see [`plan::count_after`]): walks
    /// when the counters cannot tell.
    async fn count_after(
        &self,
        conn: &mut Conn,
        key: &str,
        read: &ShardRead,
        at: Id,
    ) -> Result<(u64, u64), ReplayError> {
        let count = plan::count_after(read, at);
        let walked = match count {
            Count::Known { .. } => Walked::default(),
            Count::Forward => {
                let from = format!("({}", fmt_id(at));
                self.walk(conn, key, "fwd", &from, "+", u64::MAX).await?
            }
            Count::Backward => {
                self.walk(conn, key, "rev", &fmt_id(at), "-", u64::MAX)
                    .await?
            }
        };
        Ok(plan::counted(count, walked.walked, &walked))
    }

    /// Walks up to `max` entries of `key` from `from` towards `to` (see `walk.lua`), in calls
    /// of at most [`WALK_PAGE`] entries (`self.page`), so that Redis is never held long: the entries walked
    /// in all, the last one, and the counters of the last call.
    async fn walk(
        &self,
        conn: &mut Conn,
        key: &str,
        dir: &str,
        from: &str,
        to: &str,
        max: u64,
    ) -> Result<Walked, ReplayError> {
        let mut from = from.to_owned();
        let mut total = 0u64;
        let mut last = None;
        loop {
            let want = self.page.min(max - total);
            let page = self.walk_once(conn, key, dir, &from, to, want).await?;
            total += page.walked;
            last = page.last.or(last);
            match page.last {
                Some(l) if page.walked == want && total < max => from = format!("({}", fmt_id(l)),
                _ => {
                    return Ok(Walked {
                        walked: total,
                        last,
                        ..page
                    });
                }
            }
        }
    }

    /// Carries out `moves` for `group`: each shard's consumer group set (created where
    /// missing) with its read counter, then its doorbell rung; [`SHARDS_AT_ONCE`] shards at a
    /// time.
    pub(crate) async fn apply(&self, group: &str, moves: &[ShardMove]) -> Result<(), ReplayError> {
        let conn = self.connection().await?;
        let cluster = conn.is_cluster();
        let calls: Vec<_> = moves
            .iter()
            .map(|m| {
                let mut conn = conn.clone();
                async move {
                    self.set(&mut conn, group, m).await?;
                    let ring: redis::RedisResult<i64> = redis::cmd(ring_command(cluster))
                        .arg(ring_channel(&m.key))
                        .arg("")
                        .query_async(&mut conn)
                        .await;
                    if let Err(e) = ring {
                        // The worker still reads when the group is resumed (PROTOCOL §18).
                        tracing::warn!(key = %m.key, error = %e, "seek: the doorbell ring failed");
                    }
                    Ok::<(), ReplayError>(())
                }
            })
            .collect();
        futures::stream::iter(calls)
            .buffer_unordered(SHARDS_AT_ONCE)
            .try_collect()
            .await
    }

    /// `XGROUP SETID … ENTRIESREAD n`, or `XGROUP CREATE … MKSTREAM ENTRIESREAD n` where the
    /// consumer group (or the key) does not exist yet.
    async fn set(&self, conn: &mut Conn, group: &str, m: &ShardMove) -> Result<(), ReplayError> {
        let id = fmt_id(m.new);
        let xgroup = |op: &str| {
            let mut c = redis::cmd("XGROUP");
            c.arg(op).arg(&m.key).arg(group).arg(&id);
            if op == "CREATE" {
                c.arg("MKSTREAM");
            }
            c.arg("ENTRIESREAD").arg(m.entries_read);
            c
        };
        // The consumer group may appear or vanish between the plan and now (a worker
        // creating it, Redis restarting): one more try the other way.
        let first = if m.read.group.is_some() {
            "SETID"
        } else {
            "CREATE"
        };
        let r = tokio::time::timeout(self.timeout, xgroup(first).query_async::<()>(conn))
            .await
            .map_err(|_| ReplayError::Redis("moving the consumer group: no answer".into()))?;
        let Err(e) = r else { return Ok(()) };
        let text = e.to_string();
        let retry = match first {
            "SETID" if text.contains("NOGROUP") || text.contains("requires the key to exist") => {
                "CREATE"
            }
            "CREATE" if text.contains("BUSYGROUP") => "SETID",
            _ => return Err(e.into()),
        };
        within(
            self.timeout,
            "moving the consumer group",
            xgroup(retry).query_async::<()>(conn),
        )
        .await
    }
}

/// The answer of `position.lua` (see the script's header).
fn parse_read(v: &[redis::Value]) -> Option<ShardRead> {
    use redis::Value;
    let int = |i: usize| -> Option<i64> {
        match v.get(i)? {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    };
    let id = |i: usize| -> Option<Id> {
        match v.get(i)? {
            Value::BulkString(b) => parse_entry_id(std::str::from_utf8(b).ok()?),
            Value::SimpleString(t) => parse_entry_id(t),
            _ => None,
        }
    };
    if int(0)? == 0 {
        return Some(ShardRead::default());
    }
    let known = |n: i64| u64::try_from(n).ok();
    let length = known(int(1)?)?;
    let group = if int(6)? == 1 {
        Some(plan::GroupRead {
            last_delivered: id(7)?,
            entries_read: known(int(8)?),
            lag: known(int(9)?),
            pending: known(int(10)?)?,
        })
    } else {
        None
    };
    Some(ShardRead {
        exists: true,
        length,
        // A server that does not count (before Redis 7.0): as if nothing was ever trimmed.
        entries_added: known(int(2)?).unwrap_or(length),
        last_generated: id(3)?,
        first: id(4),
        last: id(5),
        group,
    })
}
