//! Acknowledgements: the worker's batched `XACK` ([`Step::Ack`](super::machine::Step::Ack)) (guarded by the owner token under strict
//! fencing), and the [`AckPath`] a message's [`crate::Acker`] uses.

use super::conn::WorkerConn;
use super::{ShardFlags, ShardWorker};
use crate::consumer::backoff::Backoff;
use crate::consumer::fence;
use crate::error::ClientError;
use crate::message::{AckPath, Origin};
use futures::future::BoxFuture;
use redis::RedisError;
use rsc_redis::LazyRedis;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

impl ShardWorker {
    /// `XACK` of handled entries, retried a few times even when stopping (the handlers ran:
    /// an acknowledgement lost here means the entry is handled again by the next owner).
    pub(super) async fn ack(&self, conn: &mut WorkerConn, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        for attempt in 1..=5 {
            let r: Result<i64, RedisError> = match self.flags.token() {
                Some(token) => fence::ack(conn, &self.origin, &token, ids)
                    .await
                    .map(|ok| if ok { 0 } else { -1 }),
                None => {
                    redis::cmd("XACK")
                        .arg(&self.origin.shard_key)
                        .arg(&self.origin.group)
                        .arg(ids)
                        .query_async(conn)
                        .await
                }
            };
            match r {
                Ok(-1) => {
                    self.flags.refuse("ack");
                    return;
                }
                Ok(_) => return,
                Err(e) if e.code() == Some("NOGROUP") => return,
                Err(e) => {
                    warn!(error = %e, attempt, entries = ids.len(), "XACK failed");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
        warn!(
            entries = ids.len(),
            "giving up acknowledging: these entries will be handled again"
        );
    }
}

/// A message's [`AckPath`]: the member's shared connection (never blocked by a read), with
/// the shard's owner token under strict fencing.
#[derive(Debug)]
pub(super) struct ManualAcks {
    conn: LazyRedis,
    flags: Arc<ShardFlags>,
}

impl ManualAcks {
    pub(super) fn new(conn: LazyRedis, flags: Arc<ShardFlags>) -> Self {
        ManualAcks { conn, flags }
    }

    async fn send(&self, origin: &Origin, id: &str) -> Result<(), ClientError> {
        let mut conn = self.conn.clone();
        if let Some(token) = self.flags.token() {
            let ids = [id.to_owned()];
            if !fence::ack(&mut conn, origin, &token, &ids).await? {
                self.flags.refuse("manual ack");
                return Err(ClientError::Fenced {
                    shard_key: origin.shard_key.clone(),
                });
            }
            return Ok(());
        }
        let _: i64 = redis::cmd("XACK")
            .arg(&origin.shard_key)
            .arg(&origin.group)
            .arg(id)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}

impl AckPath for ManualAcks {
    fn ack<'a>(
        &'a self,
        origin: &'a Origin,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(self.send(origin, id))
    }
}
