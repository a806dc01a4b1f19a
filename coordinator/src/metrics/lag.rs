//! Lag and pending entries per shard, read from the data Redis (`XINFO GROUPS`).
//!
//! Only when a data Redis URL is configured (`--data-redis-url`). Every read is bounded by
//! a timeout; an unreachable Redis, a missing shard key or a shard whose Redis consumer
//! group does not exist yet simply leaves the numbers out — never an error to the caller.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::streams::StreamInfoGroupsReply;
use std::collections::HashMap;
use std::time::Duration;
use tracing::debug;

/// Keys asked per pipeline round trip.
const PIPELINE_CHUNK: usize = 512;

/// One shard's numbers for one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Entries not yet delivered to the group (`lag` of `XINFO GROUPS`; absent when Redis
    /// cannot tell, e.g. after deletions).
    pub lag: Option<u64>,
    /// Entries delivered and not yet acknowledged.
    pub pending: Option<u64>,
}

/// A connection to the data Redis for reading lag (standalone Redis).
pub struct LagProbe {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    timeout: Duration,
}

impl std::fmt::Debug for LagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: do not print it.
        f.debug_struct("LagProbe")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl LagProbe {
    /// A probe for the Redis at `url`; connects lazily, on first use. Fails only on a
    /// malformed URL.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, redis::RedisError> {
        Ok(LagProbe {
            client: redis::Client::open(url)?,
            conn: tokio::sync::Mutex::new(None),
            timeout,
        })
    }

    async fn connection(&self) -> Option<ConnectionManager> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Some(c.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let connect = ConnectionManager::new_with_config(self.client.clone(), config);
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(c)) => {
                *slot = Some(c.clone());
                Some(c)
            }
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
    pub async fn group_stats(
        &self,
        group: &str,
        keys: &[(u32, String)],
    ) -> HashMap<u32, ShardStats> {
        let mut out = HashMap::new();
        if keys.is_empty() {
            return out;
        }
        let Some(mut conn) = self.connection().await else {
            return out;
        };
        for chunk in keys.chunks(PIPELINE_CHUNK) {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (_, key) in chunk {
                pipe.cmd("XINFO").arg("GROUPS").arg(key);
            }
            let query =
                pipe.query_async::<Vec<redis::RedisResult<StreamInfoGroupsReply>>>(&mut conn);
            let replies = match tokio::time::timeout(self.timeout, query).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    debug!(group, error = %e, "XINFO GROUPS failed; lag not reported");
                    return out;
                }
                Err(_) => {
                    debug!(group, "XINFO GROUPS timed out; lag not reported");
                    return out;
                }
            };
            for ((shard, _), reply) in chunk.iter().zip(replies) {
                // A missing key answers an error: nothing to report for that shard.
                let Ok(reply) = reply else { continue };
                if let Some(g) = reply.groups.iter().find(|g| g.name == group) {
                    out.insert(
                        *shard,
                        ShardStats {
                            lag: g.lag.map(|l| l as u64),
                            pending: Some(g.pending as u64),
                        },
                    );
                }
            }
        }
        out
    }
}
