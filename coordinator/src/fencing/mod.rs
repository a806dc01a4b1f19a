//! Data-path fencing (PROTOCOL §5.6, docs/FENCING.md): owner tokens in the data Redis.
//!
//! With `fencing: strict` the coordinator writes, for every shard of a member's assignment,
//! the owner token [`rsc_protocol::owner::OwnerToken`] to `{<shard key>}:owner:<group>` (same
//! cluster slot as the shard key) before the heartbeat answer that carries the grant is sent.
//! Members read and acknowledge through scripts that compare their token with that key, so a
//! member whose shards moved on (paused past its session, cut off) is refused by Redis itself.
//!
//! Every heartbeat of a strict group re-asserts its member's tokens. On a standalone Redis the
//! re-assertions of the heartbeats in flight at the same time are group-committed
//! (`coordinator/src/group_commit.rs`): one `MGET` reads their owner keys, and only the keys
//! that do not hold their token (a new grant, a lost token, a later grant's) go through the
//! script, in one call; a steady heartbeat so costs Redis a key read. That read goes through
//! a connection with `CLIENT TRACKING` on, and the keys it found in place are kept until
//! Redis says they changed (or the connection is lost): while all of an assertion's keys are
//! kept, it needs no read at all (`fencing/tracking.rs`). On a Redis Cluster,
//! where the owner keys of one assignment live in different slots, each key is read on its
//! own (`GET`, then the script only if needed), all sent at once (each routed to its slot's
//! node). The script is loaded on `NOSCRIPT`. A token lost in a crash between the document
//! write and the token write, or in a data Redis restart, is repaired by the first heartbeat
//! after the loss was known here (at once on a cluster; with tracking, once Redis's
//! invalidation or the closed connection arrived).
//! The script never replaces a token of a later grant (the
//! `(created_ms, grant_epoch)` pair orders them), so a slow or retried write cannot hand a
//! shard back to its previous owner.

mod seals;
mod tracking;

pub use seals::{SealProgress, Sealer};
pub use tracking::CONNECTION_NAME as TRACKING_CONNECTION_NAME;

use crate::group_commit::Queues;
use rsc_redis::{Conn, LazyRedis};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tracing::{debug, warn};

/// Writes owner tokens to the data Redis (standalone Redis or Redis Cluster).
pub struct OwnerTokens(Arc<Writer>);

struct Writer {
    redis: LazyRedis,
    script: redis::Script,
    timeout: Duration,
    /// Standalone Redis: the assertions waiting for the next script call (one queue).
    waiting: Queues<(), WaitingAssert>,
    /// Standalone Redis or behind sentinels: the owner keys Redis tracks for us.
    tracking: Option<tracking::Tracking>,
}

/// The owner keys and tokens of one assertion, and where its codes go.
struct WaitingAssert {
    pairs: Vec<(String, String)>,
    reply: oneshot::Sender<Result<Vec<i64>, FencingError>>,
}

/// Most owner keys in one script call (bounds the script's run time in Redis).
const MAX_KEYS_PER_CALL: usize = 256;

const WRITING: &str = "writing owner tokens";

impl std::fmt::Debug for OwnerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: do not print it.
        f.debug_struct("OwnerTokens")
            .field("cluster", &self.0.redis.is_cluster())
            .field("timeout", &self.0.timeout)
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
        let tracking =
            (!redis.is_cluster()).then(|| tracking::Tracking::new(redis.clone(), timeout));
        OwnerTokens(Arc::new(Writer {
            redis,
            script: redis::Script::new(rsc_protocol::owner::ASSERT_OWNER_LUA),
            timeout,
            waiting: Queues::default(),
            tracking,
        }))
    }

    /// Makes sure the owner key of each `(shard, token)` of `group` on `stream` holds the
    /// token (or a later grant's). On a standalone Redis one `MGET`, and a script call for
    /// the keys without their token, both shared with the assertions waiting at the same
    /// time; on a cluster one `GET` per key, concurrently, and the script for the keys
    /// without their token.
    /// Always reads Redis: for a heartbeat that changes anything (a grant, a member
    /// reporting that it gave a shard up, which is what a member refused by Redis does).
    pub async fn assert(
        &self,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
    ) -> Result<Asserted, FencingError> {
        self.assert_with(group, stream, tokens, false).await
    }

    /// [`Self::assert`] for a steady heartbeat's re-assertion: answered without a read when
    /// every owner key was read in place since and Redis has pushed no invalidation of it
    /// (standalone Redis or behind sentinels, `CLIENT TRACKING`; PROTOCOL §5.6).
    pub async fn reassert(
        &self,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
    ) -> Result<Asserted, FencingError> {
        self.assert_with(group, stream, tokens, true).await
    }

    /// [`Self::reassert`] when `tracked`, else [`Self::assert`].
    #[tracing::instrument(level = "debug", skip(self, tokens), fields(shards = tokens.len()))]
    async fn assert_with(
        &self,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
        tracked: bool,
    ) -> Result<Asserted, FencingError> {
        if tokens.is_empty() {
            return Ok(Asserted::default());
        }
        let result = self.assert_inner(group, stream, tokens, tracked).await;
        match &result {
            Ok(a) => {
                crate::metrics::record_token_asserts(group, a.written, a.unchanged, a.refused);
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

    /// Waits until the owner keys this coordinator tracks reflect every change the data
    /// Redis made before now (Redis's invalidations are pushed, so they may still be on
    /// their way when a change's command has returned). Without tracking (a Redis Cluster,
    /// or no tracking connection), returns at once: every assertion reads Redis then.
    pub async fn sync_tracking(&self) {
        if let Some(t) = &self.0.tracking {
            t.sync().await;
        }
    }

    /// Whether owner keys are tracked now (a tracking connection is open): steady
    /// re-assertions may then be answered without a read. Always `false` on a Redis Cluster.
    pub fn tracking_live(&self) -> bool {
        self.0.tracking.as_ref().is_some_and(|t| t.live())
    }

    async fn assert_inner(
        &self,
        group: &str,
        stream: &str,
        tokens: &BTreeMap<u32, String>,
        tracked: bool,
    ) -> Result<Asserted, FencingError> {
        let keys: Vec<String> = (tokens.keys())
            .map(|&shard| owner_key(group, stream, shard))
            .collect();
        if tracked
            && let Some(t) = &self.0.tracking
            && t.holds(
                keys.iter()
                    .map(String::as_str)
                    .zip(tokens.values().map(String::as_str)),
            )
        {
            // Read in place since, and Redis has said of no change (PROTOCOL §5.6).
            return Ok(Asserted {
                unchanged: keys.len(),
                ..Asserted::default()
            });
        }
        let pairs = keys.into_iter().zip(tokens.values().cloned());
        let codes = if self.0.redis.is_cluster() {
            self.0.assert_per_key(pairs).await?
        } else {
            self.0.assert_queued(pairs.collect()).await?
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
}

impl Writer {
    async fn connection(&self) -> Result<Conn, FencingError> {
        within!(self.timeout, "connecting", self.redis.get())
    }

    /// Redis Cluster: the owner keys sit in different slots (a script call stays in one), so
    /// each key is handled on its own, all in flight at once: a `GET`, and the script only
    /// when the key does not hold its token (as [`Writer::call`] does for a batch).
    async fn assert_per_key(
        &self,
        pairs: impl Iterator<Item = (String, String)>,
    ) -> Result<Vec<i64>, FencingError> {
        let conn = self.connection().await?;
        let calls = pairs.map(|(key, token)| {
            let mut conn = conn.clone();
            async move {
                let current: Option<Vec<u8>> =
                    redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                if current.as_deref() == Some(token.as_bytes()) {
                    return Ok(1);
                }
                let codes: Vec<i64> = self
                    .script
                    .key(key)
                    .arg(token)
                    .invoke_async(&mut conn)
                    .await?;
                codes.first().copied().ok_or_else(|| {
                    (
                        redis::ErrorKind::UnexpectedReturnType,
                        "the owner-token script answered no code",
                    )
                        .into()
                })
            }
        });
        within!(self.timeout, WRITING, futures::future::try_join_all(calls))
    }

    /// Standalone Redis: queues the assertion for the next call ([`Writer::call`]) and waits
    /// for its codes (one code per pair, in order), at most `timeout`.
    async fn assert_queued(
        self: &Arc<Self>,
        pairs: Vec<(String, String)>,
    ) -> Result<Vec<i64>, FencingError> {
        let (reply, answer) = oneshot::channel();
        for () in self.waiting.push([((), WaitingAssert { pairs, reply })]) {
            tokio::spawn(Arc::clone(self).flush());
        }
        let abandoned = || FencingError::Redis {
            doing: WRITING,
            source: (redis::ErrorKind::Io, "the owner-token call was abandoned").into(),
        };
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(codes)) => codes,
            Ok(Err(_)) => Err(abandoned()),
            Err(_) => Err(FencingError::Timeout {
                doing: WRITING,
                timeout: self.timeout,
            }),
        }
    }

    /// Sends the waiting assertions, a call ([`Writer::call`]) at a time, until none is
    /// left; each assertion gets its own codes, or the call's error.
    async fn flush(self: Arc<Self>) {
        while let Some(batch) =
            self.waiting
                .next_batch(&(), MAX_KEYS_PER_CALL, |w: &WaitingAssert| w.pairs.len())
        {
            match self.call(&batch).await {
                Ok(codes) => {
                    let mut codes = codes.into_iter();
                    for w in batch {
                        let mine = codes.by_ref().take(w.pairs.len()).collect();
                        let _ = w.reply.send(Ok(mine));
                    }
                }
                Err(e) => {
                    for w in batch {
                        let _ = w.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Asserts every pair of `batch`: one `MGET` of the owner keys (on the tracking
    /// connection, which keeps those found in place: `fencing/tracking.rs`), then, for the
    /// keys that do not hold their token (a new grant, a lost or an older token), one script
    /// call. A token read in place is as good as the script's "already there": either way it
    /// was in place at that moment, and a later grant's write is what must win afterwards. So
    /// a steady heartbeat costs Redis a key read, not a script run, and none once tracked.
    async fn call(&self, batch: &[WaitingAssert]) -> Result<Vec<i64>, FencingError> {
        let pairs: Vec<&(String, String)> = batch.iter().flat_map(|w| &w.pairs).collect();
        let (current, stamp) = self.read(&pairs).await?;
        if current.len() != pairs.len() {
            return Err(unexpected(
                "MGET answered a value count other than the keys sent",
            ));
        }
        if let (Some(t), Some(stamp)) = (&self.tracking, stamp) {
            let found = current
                .iter()
                .zip(&pairs)
                .filter_map(|(now, (key, token))| {
                    (now.as_deref() == Some(token.as_bytes()))
                        .then_some((key.as_str(), token.as_str()))
                });
            t.record(stamp, found);
        }
        // Every key "already there" (1), but those that do not hold their token: the script's.
        let mut codes = vec![1_i64; pairs.len()];
        let todo: Vec<usize> = current
            .iter()
            .zip(&pairs)
            .enumerate()
            .filter(|(_, (now, (_, token)))| now.as_deref() != Some(token.as_bytes()))
            .map(|(i, _)| i)
            .collect();
        if todo.is_empty() {
            return Ok(codes);
        }
        let mut conn = self.connection().await?;
        let mut call = self.script.prepare_invoke();
        for &i in &todo {
            call.key(&pairs[i].0).arg(&pairs[i].1);
        }
        let written: Vec<i64> = within!(self.timeout, WRITING, call.invoke_async(&mut conn))?;
        if written.len() != todo.len() {
            return Err(unexpected(
                "the owner-token script answered a code count other than the keys sent",
            ));
        }
        for (i, code) in todo.into_iter().zip(written) {
            codes[i] = code;
        }
        Ok(codes)
    }
}

impl Writer {
    /// The owner keys' values: on the tracking connection when there is one (with the stamp
    /// to record them against), else on the shared one.
    async fn read(
        &self,
        pairs: &[&(String, String)],
    ) -> Result<(Vec<Option<Vec<u8>>>, Option<tracking::Stamp>), FencingError> {
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        if let Some(t) = &self.tracking
            && let Some((values, stamp)) = t.read(&keys).await
        {
            return Ok((values, Some(stamp)));
        }
        let mut conn = self.connection().await?;
        let mut read = redis::cmd("MGET");
        for key in keys {
            read.arg(key);
        }
        let values = within!(self.timeout, WRITING, read.query_async(&mut conn))?;
        Ok((values, None))
    }
}

/// A data-Redis answer of the wrong shape.
fn unexpected(what: &'static str) -> FencingError {
    FencingError::Redis {
        doing: WRITING,
        source: (redis::ErrorKind::UnexpectedReturnType, what).into(),
    }
}

fn owner_key(group: &str, stream: &str, shard: u32) -> String {
    rsc_protocol::routing::owner_key(&rsc_protocol::routing::shard_key(stream, shard), group)
}
