//! Routing-epoch markers and seal positions in the data Redis (ordered resharding, PROTOCOL §15).
//!
//! At every switch of a stream's routing epoch (reshard, rollback) the coordinator runs, on
//! every shard that was or becomes part of the layout (and every draining one), a script that
//! moves the shard's epoch marker `{<shard key>}:epoch` to the new epoch and records in
//! `{<shard key>}:seals` the last entry id written under the previous epoch (the seal) with
//! the previous shard count. It does so before it answers the reshard request: producers
//! write through a script that refuses any write whose routing epoch is not the marker's, so
//! from that answer on no write of a stale producer lands anywhere, and every entry after a
//! seal was written under the new routing. Both keys share the shard's Redis Cluster slot.

use rsc_protocol::routing::{SEAL_PROGRESS_LUA, Seal, epoch_key, seals_key, shard_key};
use rsc_redis::{Conn, LazyRedis};
use std::collections::BTreeMap;
use std::time::Duration;

use super::{FencingError, within};

/// Writes epoch markers and seals, and measures groups' progress towards seals.
pub struct Sealer {
    redis: LazyRedis,
    seal: redis::Script,
    unseal: redis::Script,
    progress: redis::Script,
    timeout: Duration,
}

impl Sealer {
    /// The data Redis it writes to.
    pub fn redis(&self) -> &LazyRedis {
        &self.redis
    }
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("cluster", &self.redis.is_cluster())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// How far one group is from one seal on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealProgress {
    /// Entries up to the seal not yet delivered to the group (capped; -1: the group does not
    /// exist on the shard although entries precede the seal).
    pub undelivered: i64,
    /// Entries up to the seal delivered and not yet acknowledged (capped).
    pub pending: i64,
}

impl SealProgress {
    /// Every entry up to the seal was handled and acknowledged.
    pub fn reached(&self) -> bool {
        self.undelivered == 0 && self.pending == 0
    }
}

impl Sealer {
    /// A sealer over the data Redis `redis`; each call fails past `timeout`.
    pub fn new(redis: LazyRedis, timeout: Duration) -> Self {
        Sealer {
            redis,
            seal: redis::Script::new(include_str!("seal.lua")),
            unseal: redis::Script::new(include_str!("unseal.lua")),
            progress: redis::Script::new(SEAL_PROGRESS_LUA),
            timeout,
        }
    }

    async fn connection(&self) -> Result<Conn, FencingError> {
        within!(self.timeout, "connecting", self.redis.get())
    }

    /// Moves the epoch marker of every shard in `shards` of `stream` to `epoch` and returns
    /// each shard's seal (the last entry id written under the previous epoch, whose shard
    /// count was `from_count`). One script call per shard, all in flight at once.
    #[tracing::instrument(level = "debug", skip(self, shards), fields(shards = shards.len()))]
    pub async fn seal(
        &self,
        stream: &str,
        epoch: u64,
        from_count: u32,
        shards: &[u32],
    ) -> Result<BTreeMap<u32, String>, FencingError> {
        let conn = self.connection().await?;
        let calls = shards.iter().map(|&shard| {
            let key = shard_key(stream, shard);
            let mut conn = conn.clone();
            async move {
                let v: Option<String> = self
                    .seal
                    .key(&key)
                    .key(epoch_key(&key))
                    .key(seals_key(&key))
                    .arg(epoch)
                    .arg(from_count)
                    .invoke_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((shard, v))
            }
        });
        let calls = futures::future::try_join_all(calls);
        let answers = within!(self.timeout, "sealing", calls);
        if answers.is_err() {
            metrics::counter!("rsc_seal_write_failures_total").increment(1);
        }
        let answers = answers?;
        let mut seals = BTreeMap::new();
        for (shard, v) in answers {
            let seal =
                v.as_deref()
                    .and_then(Seal::parse)
                    .ok_or_else(|| FencingError::MissingSeal {
                        stream: stream.to_owned(),
                        shard,
                        epoch,
                    })?;
            seals.insert(shard, seal.id);
        }
        Ok(seals)
    }

    /// Undoes the markers of a switch to `epoch` that was not recorded (best effort).
    pub async fn unseal(&self, stream: &str, epoch: u64, shards: &[u32]) {
        let Ok(conn) = self.connection().await else {
            return;
        };
        let calls = shards.iter().map(|&shard| {
            let key = shard_key(stream, shard);
            let mut conn = conn.clone();
            async move {
                self.unseal
                    .key(epoch_key(&key))
                    .key(seals_key(&key))
                    .arg(epoch)
                    .arg(epoch.saturating_sub(1))
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        });
        if let Err(e) = tokio::time::timeout(self.timeout, futures::future::join_all(calls)).await {
            tracing::warn!(stream, epoch, error = %e, "could not undo the epoch markers");
        }
    }

    /// How far `group` is from `seal` on shard `shard` of `stream` (counts capped at `cap`).
    pub async fn progress(
        &self,
        stream: &str,
        shard: u32,
        group: &str,
        seal: &str,
        cap: u32,
    ) -> Result<SealProgress, FencingError> {
        let mut conn = self.connection().await?;
        let mut invocation = self.progress.key(shard_key(stream, shard));
        invocation.arg(group).arg(seal).arg(cap);
        let call = invocation.invoke_async::<(i64, i64)>(&mut conn);
        let (undelivered, pending) = within!(self.timeout, "reading seal progress", call)?;
        Ok(SealProgress {
            undelivered,
            pending,
        })
    }
}
