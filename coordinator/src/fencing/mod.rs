//! Data-path fencing (PROTOCOL §5.6, docs/FENCING.md): owner tokens in the data Redis.
//!
//! With `fencing: strict` the coordinator writes, for every shard of a member's assignment,
//! the owner token [`rsc_protocol::owner::OwnerToken`] to `{<shard key>}:owner:<group>` (same
//! cluster slot as the shard key) before the heartbeat answer that carries the grant is sent.
//! Members read and acknowledge through scripts that compare their token with that key, so a
//! member whose shards moved on (paused past its session, cut off) is refused by Redis itself.
//!
//! Every heartbeat of a strict group re-asserts its member's tokens: on a standalone Redis
//! with one pipelined script call (one round trip); on a Redis Cluster, where the owner keys
//! of one assignment live in different slots, with one script call per key, all sent at
//! once (each routed to its slot's node, the script loaded on `NOSCRIPT`). A token lost in a
//! crash between the document write and the token write, or in a data Redis restart, is
//! repaired within one heartbeat. The script never replaces a token of a later grant (the
//! `(created_ms, grant_epoch)` pair orders them), so a slow or retried write cannot hand a
//! shard back to its previous owner.

mod seals;

pub use seals::{SealProgress, Sealer};

use rsc_redis::{Conn, LazyRedis};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{debug, warn};

/// Writes owner tokens to the data Redis (standalone Redis or Redis Cluster).
pub struct OwnerTokens {
    redis: LazyRedis,
    script: redis::Script,
    timeout: Duration,
}

impl std::fmt::Debug for OwnerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: do not print it.
        f.debug_struct("OwnerTokens")
            .field("cluster", &self.redis.is_cluster())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why fencing state (owner tokens, epoch markers, seals) could not be written or read in
/// the data Redis.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FencingError {
    /// The data Redis refused the call or the connection failed.
    #[error("data Redis error while {doing}: {source}")]
    Redis {
        /// What the coordinator was doing.
        doing: &'static str,
        /// Redis's error.
        #[source]
        source: redis::RedisError,
    },
    /// The data Redis did not answer in time.
    #[error("the data Redis did not answer within {timeout:?} while {doing}")]
    Timeout {
        /// What the coordinator was doing.
        doing: &'static str,
        /// The limit.
        timeout: Duration,
    },
    /// A shard's epoch marker is past the switch but its seal of the switch is missing.
    #[error("shard {shard} of {stream} is fenced past epoch {epoch} without its seal")]
    MissingSeal {
        /// The stream.
        stream: String,
        /// The shard.
        shard: u32,
        /// The routing epoch of the switch.
        epoch: u64,
    },
}

/// Runs one data-Redis call within `timeout`; `doing` names it in the error. (A macro, not an
/// `async fn`: one more future layer overflows the `Send` proof of the HTTP handlers.)
macro_rules! within {
    ($timeout:expr, $doing:expr, $call:expr $(,)?) => {{
        let timeout: std::time::Duration = $timeout;
        let doing: &'static str = $doing;
        match tokio::time::timeout(timeout, $call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err($crate::fencing::FencingError::Redis { doing, source: e }),
            Err(_) => Err($crate::fencing::FencingError::Timeout { doing, timeout }),
        }
    }};
}
use within;

/// What one assertion did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asserted {
    /// Tokens written (new grants, or repairs).
    pub written: usize,
    /// Tokens already in place.
    pub unchanged: usize,
    /// Tokens refused because a later grant's token is in place.
    pub refused: usize,
}

impl OwnerTokens {
    /// A writer to the data Redis `redis` (connected on first use); each assertion fails
    /// past `timeout`.
    pub fn new(redis: LazyRedis, timeout: Duration) -> Self {
        OwnerTokens {
            redis,
            script: redis::Script::new(rsc_protocol::owner::ASSERT_OWNER_LUA),
            timeout,
        }
    }

    async fn connection(&self) -> Result<Conn, FencingError> {
        within!(self.timeout, "connecting", self.redis.get())
    }

    /// Makes sure the owner key of each `(shard, token)` of `group` on `stream` holds the
    /// token (or a later grant's). On a standalone Redis one round trip (`EVALSHA`, loading
    /// the script on `NOSCRIPT`); on a cluster one script call per key, concurrently.
    #[tracing::instrument(level = "debug", skip(self, tokens), fields(shards = tokens.len()))]
    pub async fn assert(
        &self,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
    ) -> Result<Asserted, FencingError> {
        if tokens.is_empty() {
            return Ok(Asserted::default());
        }
        let result = self.assert_inner(group, stream, tokens).await;
        match &result {
            Ok(a) => {
                for (what, n) in [
                    ("written", a.written),
                    ("unchanged", a.unchanged),
                    ("refused", a.refused),
                ] {
                    if n > 0 {
                        metrics::counter!("rsc_fencing_token_asserts_total",
                            "group" => group.to_owned(), "result" => what)
                        .increment(n as u64);
                    }
                }
                if a.written > 0 {
                    debug!(written = a.written, "owner tokens written");
                }
                if a.refused > 0 {
                    warn!(
                        refused = a.refused,
                        "owner token not written: a later grant's token is in place"
                    );
                }
            }
            Err(e) => {
                metrics::counter!("rsc_fencing_token_write_failures_total",
                    "group" => group.to_owned())
                .increment(1);
                warn!(error = %e, "owner tokens not written");
            }
        }
        result
    }

    async fn assert_inner(
        &self,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
    ) -> Result<Asserted, FencingError> {
        let mut conn = self.connection().await?;
        let codes = if conn.is_cluster() {
            self.assert_per_key(&conn, group, stream, tokens).await?
        } else {
            self.assert_pipelined(&mut conn, group, stream, tokens)
                .await?
        };
        let mut a = Asserted::default();
        for c in codes {
            match c {
                2 => a.written += 1,
                1 => a.unchanged += 1,
                _ => a.refused += 1,
            }
        }
        Ok(a)
    }

    /// Redis Cluster: the owner keys sit in different slots (a pipeline must stay in one),
    /// so each key gets its own script call, all in flight at once.
    async fn assert_per_key(
        &self,
        conn: &Conn,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
    ) -> Result<Vec<i64>, FencingError> {
        let calls = tokens.iter().map(|(&shard, token)| {
            let key = owner_key(group, stream, shard);
            let mut conn = conn.clone();
            async move {
                self.script
                    .key(key)
                    .arg(token)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        });
        let calls = futures::future::try_join_all(calls);
        within!(self.timeout, "writing owner tokens", calls)
    }

    /// Standalone Redis: one pipeline of `EVALSHA`, one round trip.
    async fn assert_pipelined(
        &self,
        conn: &mut Conn,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
    ) -> Result<Vec<i64>, FencingError> {
        let pipe = || {
            let mut pipe = redis::pipe();
            for (&shard, token) in tokens {
                let key = owner_key(group, stream, shard);
                pipe.cmd("EVALSHA")
                    .arg(self.script.get_hash())
                    .arg(1)
                    .arg(key)
                    .arg(token);
            }
            pipe
        };
        const DOING: &str = "writing owner tokens";
        let answer = within!(self.timeout, DOING, pipe().query_async::<Vec<i64>>(conn));
        let noscript = matches!(&answer,
            Err(FencingError::Redis { source, .. }) if source.code() == Some("NOSCRIPT"));
        if !noscript {
            return answer;
        }
        // First use on this Redis (or after a restart / SCRIPT FLUSH): load, then retry.
        within!(
            self.timeout,
            "loading the owner-token script",
            self.script.load_async(conn)
        )?;
        within!(self.timeout, DOING, pipe().query_async::<Vec<i64>>(conn))
    }
}

fn owner_key(group: &str, stream: &str, shard: u32) -> String {
    rsc_protocol::routing::owner_key(&rsc_protocol::routing::shard_key(stream, shard), group)
}
