//! Lag and pending entries per shard, read from the data Redis (`XINFO GROUPS`).
//!
//! Only when a data Redis URL is configured (`--data-redis-url`, a cluster with
//! `--data-redis-cluster`). On a standalone Redis the keys are asked in pipelines; on a
//! cluster, where shard keys live in different slots, one `XINFO GROUPS` per key, all in
//! flight at once (each routed to its slot's node). Every read is bounded by
//! a timeout; an unreachable Redis, a missing shard key or a shard whose Redis consumer
//! group does not exist yet simply leaves the numbers out — never an error to the caller.
//!
//! What views read (a group's view, `/scaling`, `/metrics`, retention's view) is kept for
//! [`VIEW_MAX_AGE`] ([`super::recent`]): however often they are asked, each shard key costs
//! the data Redis at most one `XINFO GROUPS`, one `XINFO CONSUMERS` per group and one
//! `XRANGE` per position per interval. The lag sampler reads fresh and refreshes them.

use super::recent::Recent;
use redis::streams::{StreamInfoConsumersReply, StreamInfoGroupsReply};
use rsc_redis::{Conn, LazyRedis};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

/// How long a view's reading of the data Redis is answered again (PROTOCOL §12).
pub(crate) const VIEW_MAX_AGE: Duration = Duration::from_secs(1);

/// Keys asked per pipeline round trip (per batch of concurrent commands on a cluster).
const PIPELINE_CHUNK: usize = 512;

/// One shard's numbers for one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ShardStats {
    /// Entries not yet delivered to the group (`lag` of `XINFO GROUPS`; absent when Redis
    /// cannot tell, e.g. after deletions).
    pub lag: Option<u64>,
    /// Entries delivered and not yet acknowledged.
    pub pending: Option<u64>,
    /// The group's read counter (`entries-read`): entries delivered so far.
    pub entries_read: Option<u64>,
    /// The milliseconds of the id of the first entry after the group's last-delivered one
    /// (read by [`LagProbe::group_stats`] only; `None` when none or not read).
    pub oldest_undelivered_ms: Option<u64>,
}

/// A group's position on a shard, as a view shows it (PROTOCOL §18).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Position {
    /// Its numbers.
    pub stats: ShardStats,
    /// Its `last-delivered-id`.
    pub last_delivered: String,
}

impl ShardStats {
    /// Time lag at `now_ms` (PROTOCOL §18): the age of the oldest undelivered entry, `0` when
    /// nothing waits, `None` when unknown.
    pub(crate) fn time_lag_ms(&self, now_ms: u64) -> Option<u64> {
        if self.lag == Some(0) {
            return Some(0);
        }
        self.oldest_undelivered_ms
            .map(|ms| now_ms.saturating_sub(ms))
    }
}

/// One Redis consumer group on a shard key, as `XINFO GROUPS` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupReading {
    /// The Redis consumer group (the coordinator's group id).
    pub group: String,
    /// Its `last-delivered-id`.
    pub last_delivered: String,
    /// Its numbers.
    pub stats: ShardStats,
}

/// What one `XINFO GROUPS` of a shard key answered: the Redis consumer groups on it, or
/// `None` when the key does not exist.
pub(crate) type KeyReading = Option<Vec<GroupReading>>;

/// A connection to the data Redis for reading lag (standalone Redis or Redis Cluster). The
/// short history of what is sampled through it is [`super::history`]'s, which uses the probe
/// (not the other way round).
pub(crate) struct LagProbe {
    redis: LazyRedis,
    timeout: Duration,
    /// `XINFO GROUPS` per shard key.
    groups: Mutex<Recent<String, KeyReading>>,
    /// The milliseconds of the first entry after (key, id), `None` when there is none.
    first: Mutex<Recent<(String, String), Option<u64>>>,
    /// `XINFO CONSUMERS` per (group, key).
    consumers: Mutex<Recent<(String, String), Consumers>>,
    /// The oldest pending entry's id (`XPENDING` summary) per (group, key).
    oldest_pending: Mutex<Recent<(String, String), Option<String>>>,
}

/// A Redis consumer group's consumers on one key: (name, pending entries).
type Consumers = Vec<(String, u64)>;

/// A cache's lock; a poisoned one is still consistent (each entry is written whole).
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for LagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: do not print it.
        f.debug_struct("LagProbe")
            .field("cluster", &self.redis.is_cluster())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl LagProbe {
    /// A probe reading the data Redis `redis` (connected on first use); each read is
    /// abandoned past `timeout`.
    pub(crate) fn new(redis: LazyRedis, timeout: Duration) -> Self {
        LagProbe {
            redis,
            timeout,
            groups: Mutex::new(Recent::new(VIEW_MAX_AGE)),
            first: Mutex::new(Recent::new(VIEW_MAX_AGE)),
            consumers: Mutex::new(Recent::new(VIEW_MAX_AGE)),
            oldest_pending: Mutex::new(Recent::new(VIEW_MAX_AGE)),
        }
    }

    /// Forgets what was read of `keys`: a view asked next reads them from Redis (after a
    /// seek moved a group on them, PROTOCOL §18).
    pub(crate) fn forget(&self, keys: &[String]) {
        let keys: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
        locked(&self.groups).forget(|k| keys.contains(k.as_str()));
        locked(&self.first).forget(|(k, _)| keys.contains(k.as_str()));
        locked(&self.consumers).forget(|(_, k)| keys.contains(k.as_str()));
        locked(&self.oldest_pending).forget(|(_, k)| keys.contains(k.as_str()));
    }

    async fn connection(&self) -> Option<Conn> {
        match tokio::time::timeout(self.timeout, self.redis.get()).await {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => {
                debug!(error = %e, "data Redis unreachable; lag not reported");
                None
            }
            Err(_) => {
                debug!("data Redis did not answer in time; lag not reported");
                None
            }
        }
    }

    /// Lag and pending of `group` on each `(shard, key)`. Shards it could not read are
    /// missing from the answer.
    pub(crate) async fn group_stats(
        &self,
        group: &str,
        keys: &[(u32, String)],
    ) -> HashMap<u32, ShardStats> {
        self.group_positions(group, keys)
            .await
            .into_iter()
            .map(|(shard, p)| (shard, p.stats))
            .collect()
    }

    /// [`Self::group_stats`] with the group's last-delivered id on each shard.
    pub(crate) async fn group_positions(
        &self,
        group: &str,
        keys: &[(u32, String)],
    ) -> HashMap<u32, Position> {
        let names: Vec<String> = keys.iter().map(|(_, k)| k.clone()).collect();
        let readings = self.read_keys(&names).await;
        let mut out: HashMap<u32, Position> = HashMap::new();
        let mut behind: Vec<(u32, String, String)> = Vec::new();
        for (shard, key) in keys {
            let Some(g) = readings
                .get(key)
                .and_then(|r| r.as_ref()?.iter().find(|g| g.group == group))
            else {
                continue;
            };
            if g.stats.lag != Some(0) {
                behind.push((*shard, key.clone(), g.last_delivered.clone()));
            }
            out.insert(
                *shard,
                Position {
                    stats: g.stats,
                    last_delivered: g.last_delivered.clone(),
                },
            );
        }
        for (shard, ms) in self.first_after(&behind).await {
            if let Some(p) = out.get_mut(&shard) {
                p.stats.oldest_undelivered_ms = Some(ms);
            }
        }
        out
    }

    /// The milliseconds of the first entry after each `(shard, key, id)`'s id
    /// (`XRANGE <key> (<id> + COUNT 1`): the oldest undelivered entry. Shards with none, or
    /// not read, are missing. Answered from what was read within [`VIEW_MAX_AGE`] where it
    /// can be.
    async fn first_after(&self, at: &[(u32, String, String)]) -> HashMap<u32, u64> {
        let now = Instant::now();
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let cache = locked(&self.first);
            for item @ (shard, key, id) in at {
                match cache.get(&(key.clone(), id.clone()), now) {
                    Some(ms) => out.extend(ms.map(|ms| (*shard, ms))),
                    None => missing.push(item.clone()),
                }
            }
        }
        if missing.is_empty() {
            return out;
        }
        let Some(mut conn) = self.connection().await else {
            return out;
        };
        for chunk in missing.chunks(PIPELINE_CHUNK) {
            let read = read_first_after(&mut conn, chunk);
            let Ok(Ok(replies)) = tokio::time::timeout(self.timeout, read).await else {
                debug!("XRANGE failed or timed out; time lag not reported");
                return out;
            };
            let mut cache = locked(&self.first);
            for ((shard, key, id), reply) in chunk.iter().zip(replies) {
                let Ok(range) = reply else { continue };
                let first = range.ids.into_iter().next();
                let ms = first.and_then(|e| e.id.split('-').next()?.parse().ok());
                cache.put((key.clone(), id.clone()), ms, now);
                out.extend(ms.map(|ms| (*shard, ms)));
            }
        }
        out
    }

    /// [`Self::read_keys_fresh`] for the keys not read within [`VIEW_MAX_AGE`]; the others
    /// as they were read then.
    pub(crate) async fn read_keys(&self, keys: &[String]) -> HashMap<String, KeyReading> {
        let now = Instant::now();
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let cache = locked(&self.groups);
            for key in keys {
                match cache.get(key, now) {
                    Some(reading) => {
                        out.insert(key.clone(), reading);
                    }
                    None => missing.push(key.clone()),
                }
            }
        }
        if !missing.is_empty() {
            out.extend(self.read_keys_fresh(&missing).await);
        }
        out
    }

    /// `XINFO GROUPS` of each key: every Redis consumer group on it (`None` for a key that
    /// does not exist). Keys it could not read (the data Redis failed or did not answer in
    /// time) are missing from the answer; one command per key, in pipelines of
    /// [`PIPELINE_CHUNK`] on standalone Redis. What is read is answered to views for
    /// [`VIEW_MAX_AGE`] ([`Self::read_keys`]).
    pub(crate) async fn read_keys_fresh(&self, keys: &[String]) -> HashMap<String, KeyReading> {
        let now = Instant::now();
        let mut out = HashMap::new();
        if keys.is_empty() {
            return out;
        }
        let Some(mut conn) = self.connection().await else {
            return out;
        };
        for chunk in keys.chunks(PIPELINE_CHUNK) {
            let replies = match tokio::time::timeout(self.timeout, read(&mut conn, chunk)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    debug!(error = %e, "XINFO GROUPS failed; lag not reported");
                    return out;
                }
                Err(_) => {
                    debug!("XINFO GROUPS timed out; lag not reported");
                    return out;
                }
            };
            for (key, reply) in chunk.iter().zip(replies) {
                // A missing key answers an error: no group there (yet).
                let reading = reply.ok().map(|r| {
                    r.groups
                        .into_iter()
                        .map(|g| GroupReading {
                            stats: ShardStats {
                                lag: g.lag.map(|l| l as u64),
                                pending: Some(g.pending as u64),
                                // Redis answers nil before the group's first read; the lag
                                // is then known only when nothing was read (it is the whole
                                // stream).
                                entries_read: g.entries_read.map(|n| n as u64).or(g.lag.map(|_| 0)),
                                oldest_undelivered_ms: None,
                            },
                            group: g.name,
                            last_delivered: g.last_delivered_id,
                        })
                        .collect()
                });
                locked(&self.groups).put(key.clone(), reading.clone(), now);
                out.insert(key.clone(), reading);
            }
        }
        out
    }
}

impl LagProbe {
    /// The consumers (name, pending entries) of `group`'s Redis consumer group on each
    /// `(shard, key)` (`XINFO CONSUMERS`). Shards it could not read are missing. Answered
    /// from what was read within [`VIEW_MAX_AGE`] where it can be.
    pub(crate) async fn group_consumers(
        &self,
        group: &str,
        keys: &[(u32, String)],
    ) -> HashMap<u32, Vec<(String, u64)>> {
        let now = Instant::now();
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let cache = locked(&self.consumers);
            for (shard, key) in keys {
                match cache.get(&(group.to_owned(), key.clone()), now) {
                    Some(list) => {
                        out.insert(*shard, list);
                    }
                    None => missing.push((*shard, key.clone())),
                }
            }
        }
        if missing.is_empty() {
            return out;
        }
        let Some(mut conn) = self.connection().await else {
            return out;
        };
        for chunk in missing.chunks(PIPELINE_CHUNK) {
            let replies =
                match tokio::time::timeout(self.timeout, read_consumers(&mut conn, group, chunk))
                    .await
                {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        debug!(group, error = %e, "XINFO CONSUMERS failed; consumers not reported");
                        return out;
                    }
                    Err(_) => {
                        debug!(group, "XINFO CONSUMERS timed out; consumers not reported");
                        return out;
                    }
                };
            let mut cache = locked(&self.consumers);
            for ((shard, key), reply) in chunk.iter().zip(replies) {
                let Ok(reply) = reply else { continue };
                let list: Consumers = reply
                    .consumers
                    .into_iter()
                    .map(|c| (c.name, c.pending as u64))
                    .collect();
                cache.put((group.to_owned(), key.clone()), list.clone(), now);
                out.insert(*shard, list);
            }
        }
        out
    }
}

impl LagProbe {
    /// The oldest pending entry's id of `group` on each `(shard, key)` (`XPENDING` summary;
    /// `None` when nothing is pending). Shards it could not read are missing. Answered from
    /// what was read within [`VIEW_MAX_AGE`] where it can be.
    pub(crate) async fn oldest_pending(
        &self,
        group: &str,
        keys: &[(u32, String)],
    ) -> HashMap<u32, Option<String>> {
        let now = Instant::now();
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let cache = locked(&self.oldest_pending);
            for (shard, key) in keys {
                match cache.get(&(group.to_owned(), key.clone()), now) {
                    Some(id) => {
                        out.insert(*shard, id);
                    }
                    None => missing.push((*shard, key.clone())),
                }
            }
        }
        if missing.is_empty() {
            return out;
        }
        let Some(mut conn) = self.connection().await else {
            return out;
        };
        for chunk in missing.chunks(PIPELINE_CHUNK) {
            let read = read_pending(&mut conn, group, chunk);
            let Ok(Ok(replies)) = tokio::time::timeout(self.timeout, read).await else {
                debug!(
                    group,
                    "XPENDING failed or timed out; oldest pending not reported"
                );
                return out;
            };
            let mut cache = locked(&self.oldest_pending);
            for ((shard, key), reply) in chunk.iter().zip(replies) {
                let Ok(reply) = reply else { continue };
                let oldest = match reply {
                    redis::streams::StreamPendingReply::Data(d) => Some(d.start_id),
                    _ => None,
                };
                cache.put((group.to_owned(), key.clone()), oldest.clone(), now);
                out.insert(*shard, oldest);
            }
        }
        out
    }
}

/// `XPENDING <key> <group>` (the summary) of each key, in key order (see [`read`]).
async fn read_pending(
    conn: &mut Conn,
    group: &str,
    chunk: &[(u32, String)],
) -> redis::RedisResult<Vec<redis::RedisResult<redis::streams::StreamPendingReply>>> {
    if conn.is_cluster() {
        let reads = chunk.iter().map(|(_, key)| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("XPENDING")
                    .arg(key)
                    .arg(group)
                    .query_async::<redis::streams::StreamPendingReply>(&mut conn)
                    .await
            }
        });
        return Ok(futures::future::join_all(reads).await);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (_, key) in chunk {
        pipe.cmd("XPENDING").arg(key).arg(group);
    }
    pipe.query_async(conn).await
}

/// `XINFO CONSUMERS` of `group` on each key, in key order (see [`read`]).
async fn read_consumers(
    conn: &mut Conn,
    group: &str,
    chunk: &[(u32, String)],
) -> redis::RedisResult<Vec<redis::RedisResult<StreamInfoConsumersReply>>> {
    if conn.is_cluster() {
        let reads = chunk.iter().map(|(_, key)| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("XINFO")
                    .arg("CONSUMERS")
                    .arg(key)
                    .arg(group)
                    .query_async::<StreamInfoConsumersReply>(&mut conn)
                    .await
            }
        });
        return Ok(futures::future::join_all(reads).await);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (_, key) in chunk {
        pipe.cmd("XINFO").arg("CONSUMERS").arg(key).arg(group);
    }
    pipe.query_async(conn).await
}

/// `XRANGE <key> (<id> + COUNT 1` of each item, in order (see [`read`]).
async fn read_first_after(
    conn: &mut Conn,
    chunk: &[(u32, String, String)],
) -> redis::RedisResult<Vec<redis::RedisResult<redis::streams::StreamRangeReply>>> {
    let cmd = |key: &str, id: &str| {
        let mut c = redis::cmd("XRANGE");
        c.arg(key)
            .arg(format!("({id}"))
            .arg("+")
            .arg("COUNT")
            .arg(1);
        c
    };
    if conn.is_cluster() {
        let reads = chunk.iter().map(|(_, key, id)| {
            let mut conn = conn.clone();
            let c = cmd(key, id);
            async move { c.query_async(&mut conn).await }
        });
        return Ok(futures::future::join_all(reads).await);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (_, key, id) in chunk {
        pipe.add_command(cmd(key, id));
    }
    pipe.query_async(conn).await
}

/// `XINFO GROUPS` of each key, in key order; a failed key (e.g. missing) is an `Err` in
/// its place. A failure of the whole read is the outer `Err`.
async fn read(
    conn: &mut Conn,
    chunk: &[String],
) -> redis::RedisResult<Vec<redis::RedisResult<StreamInfoGroupsReply>>> {
    if conn.is_cluster() {
        // A pipeline must stay within one slot: one command per key, all in flight at once.
        let reads = chunk.iter().map(|key| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("XINFO")
                    .arg("GROUPS")
                    .arg(key)
                    .query_async::<StreamInfoGroupsReply>(&mut conn)
                    .await
            }
        });
        return Ok(futures::future::join_all(reads).await);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for key in chunk {
        pipe.cmd("XINFO").arg("GROUPS").arg(key);
    }
    pipe.query_async(conn).await
}
