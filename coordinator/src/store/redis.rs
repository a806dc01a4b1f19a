//! The Redis store (PROTOCOL §2): the production store, shared by several coordinators, on a
//! standalone Redis or a Redis Cluster.
//!
//! Layout, with the configurable prefix `P` (default `rsc`):
//! - `P:group:{G}` — a hash: `revision` and `doc` (the whole group document, JSON). Deleting
//!   the group leaves a tombstone (`revision` alone), so that a group created again under the
//!   same name continues the revision sequence: a revision never names two documents, and a
//!   coordinator that cached the old group can never take it for the new one;
//! - `P:live:{G}` — a sorted set: member → last heard from (Unix ms), beside the group
//!   document in the same cluster slot, so that a steady heartbeat does not rewrite it. From
//!   16 members on it also holds [`LIVENESS_PAD`], scored `+inf`, which keeps Redis from
//!   storing it as a listpack (`lua/liveness_pad.lua` says why); readers skip it;
//! - `P:stream:{S}` — a hash: `revision` and `doc` (the stream document);
//! - `P:lock:{G}` / `P:lock:stream:{S}` — mutexes: `SET NX PX` with a random token, released
//!   by a compare-and-delete script, held at most [`RedisStoreConfig::lock_hold`];
//! - `P:groups` / `P:streams` — index sets, so that listing works on a cluster without
//!   `SCAN` over every node. A name enters the index before its document is first written and
//!   leaves it after the document is deleted; listings skip names whose document is gone.
//! - `P:due:{N}` / `P:duerev:{N}` — the deadline index, in [`super::DUE_BUCKETS`] buckets
//!   (each its own slot): a sorted set group → the time the sweep must look at the group next
//!   (never later than its next session or revocation deadline), and a hash group → the newest
//!   document revision that set or lowered the entry (see [`MetadataStore::reschedule`]);
//! - `P:coordinators` — a sorted set coordinator id → registered until (Unix ms): the live
//!   coordinators, which divide the buckets among themselves.
//! - `P:history:{G}` — a list of JSON [`HistoryRecord`]s, oldest first: the group's lag
//!   history, appended by whichever coordinator samples the group (`append_history.lua`),
//!   read by all of them; it expires when no one appends any more.
//! - `P:revisions:{G}` / `P:revisions:stream:{S}` — lists of JSON [`RevisionRecord`]s,
//!   oldest first: the metadata history of a group or stream document, appended by the
//!   script that writes the document (same slot), trimmed by [`RevisionRetention`].
//!
//! Every document write is a Lua compare-and-set on `revision` (the scripts are the `.lua`
//! files beside this one). Scripts touch one slot only: a document, its liveness and its lock
//! share the `{…}` hash tag. (The one exception, `touch_steady.lua` reading the stream
//! document too, runs so only on standalone Redis; on a cluster the stream revision is read
//! by a second command sent at the same time.)
//!
//! Steady heartbeats ([`MetadataStore::touch_steady`]) are group-committed
//! (`coordinator/src/group_commit.rs`; on standalone Redis for all groups together, on a
//! cluster per group, whose keys share a slot): the touches that arrive while a script call
//! is in flight go out together in the next one. Alone, a steady heartbeat costs one round
//! trip; under load, a fraction.
//!
//! Failures: every operation is bounded ([`RedisStoreConfig::operation_timeout`]); a refused
//! or timed-out connection is an unavailable [`StoreError`] at once, and the next operation
//! reconnects, so the coordinator recovers by itself when Redis returns.

use super::{
    AUDIT_RETAINED, AuditFilter, AuditLog, DocKind, HistoryBounds, HistoryRecord, LivenessChange,
    LockGuard, LockResource, MetadataStore, Note, RevisionRecord, RevisionRetention, SteadyTouch,
    StoreError, TouchOutcome, Versioned,
};
use crate::engine::{GroupDoc, StreamDoc};
use async_trait::async_trait;
use futures::StreamExt;
use redis::{RedisError, Script, Value};
use rsc_protocol::AuditEntry;
use rsc_protocol::redact::ExposeSecret;
use rsc_redis::{Conn, ConnSettings, LazyRedis, Names, Reconnect, RedisSettings};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::{debug, warn};

/// Settings of the Redis store.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// The Redis (a server, a cluster's seed nodes or the master the sentinels name, TLS
    /// files); errors name its settings as `serve`'s `--redis-*` flags.
    pub redis: RedisSettings,
    /// Prefix of every key (PROTOCOL §2 default `rsc`).
    pub key_prefix: String,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time to wait for one reply. The redis-rs default (500 ms) is too tight for a large
    /// group document under an `appendfsync always` server; one second still fails fast.
    pub response_timeout: Duration,
    /// Upper bound of one store operation, reconnects and retries included: past it the
    /// request is answered `503 STORE_UNAVAILABLE`.
    pub operation_timeout: Duration,
    /// Longest a lock is held (`PX`): a coordinator that dies holding one delays the group's
    /// next change by at most this; the revision compare-and-set covers a lock that expired.
    pub lock_hold: Duration,
    /// Longest [`MetadataStore::lock`] waits for a held lock. Longer than `lock_hold`, so a
    /// lock left by a crashed coordinator is taken over rather than refused.
    pub lock_wait: Duration,
    /// How long a deleted group's revision tombstone is kept before Redis expires it.
    pub tombstone_retention: Duration,
    /// Replicas that must have a group document commit before it is acknowledged
    /// (`WAIT N` on the same connection, bounded by a short timeout); 0: no wait.
    pub wait_replicas: u32,
    /// How much metadata history each document keeps (PROTOCOL §22).
    pub revisions: RevisionRetention,
}

/// How errors name the store's Redis settings: as `serve`'s flags (`--redis-url`, …).
pub const STORE_REDIS: Names = Names::Flags("redis");

/// How long a commit waits for [`RedisStoreConfig::wait_replicas`] replicas. Short: the
/// `WAIT` holds back the store's other commands on the shared connection meanwhile.
pub(crate) const WAIT_TIMEOUT: Duration = Duration::from_millis(250);

impl RedisStoreConfig {
    fn settings(&self) -> ConnSettings {
        ConnSettings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            operation_timeout: self.operation_timeout,
            reconnect: Reconnect::Quick,
        }
    }
}

impl Default for RedisStoreConfig {
    fn default() -> Self {
        RedisStoreConfig {
            redis: RedisSettings {
                url: Some("redis://127.0.0.1:6379".into()),
                ..RedisSettings::default()
            },
            key_prefix: "rsc".into(),
            connect_timeout: Duration::from_millis(1000),
            response_timeout: Duration::from_millis(1000),
            operation_timeout: Duration::from_millis(2500),
            lock_hold: Duration::from_millis(2000),
            lock_wait: Duration::from_millis(3000),
            tombstone_retention: super::TOMBSTONE_RETENTION,
            wait_replicas: 0,
            revisions: RevisionRetention::default(),
        }
    }
}

/// Checks a key prefix: non-empty, `[A-Za-z0-9._:-]` only (no `{}`: it must not become a
/// cluster hash tag).
pub fn validate_key_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty()
        || prefix.len() > 64
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
    {
        return Err(format!(
            "key prefix {prefix:?} is invalid: use 1 to 64 characters of A-Z a-z 0-9 . _ : -"
        ));
    }
    Ok(())
}

struct Keys {
    prefix: String,
}

impl Keys {
    fn group(&self, group: &str) -> String {
        format!("{}:group:{{{group}}}", self.prefix)
    }
    fn live(&self, group: &str) -> String {
        format!("{}:live:{{{group}}}", self.prefix)
    }
    fn stream(&self, stream: &str) -> String {
        format!("{}:stream:{{{stream}}}", self.prefix)
    }
    fn lock(&self, resource: &LockResource) -> String {
        match resource {
            LockResource::Group(g) => format!("{}:lock:{{{g}}}", self.prefix),
            LockResource::Stream(s) => format!("{}:lock:stream:{{{s}}}", self.prefix),
        }
    }
    fn groups(&self) -> String {
        format!("{}:groups", self.prefix)
    }
    fn streams(&self) -> String {
        format!("{}:streams", self.prefix)
    }
    fn audit(&self, log: AuditLog) -> String {
        match log {
            AuditLog::Mutations => format!("{}:audit", self.prefix),
            AuditLog::Refusals => format!("{}:audit:refusals", self.prefix),
        }
    }
    fn due(&self, bucket: u32) -> String {
        format!("{}:due:{{{bucket}}}", self.prefix)
    }
    fn due_revisions(&self, bucket: u32) -> String {
        format!("{}:duerev:{{{bucket}}}", self.prefix)
    }
    fn coordinators(&self) -> String {
        format!("{}:coordinators", self.prefix)
    }
    fn revisions(&self, kind: DocKind, name: &str) -> String {
        match kind {
            DocKind::Group => format!("{}:revisions:{{{name}}}", self.prefix),
            DocKind::Stream => format!("{}:revisions:stream:{{{name}}}", self.prefix),
        }
    }
    fn history(&self, group: &str) -> String {
        format!("{}:history:{{{group}}}", self.prefix)
    }
}

struct Scripts {
    put_doc: Script,
    put_group: Script,
    delete_group: Script,
    load_group: Script,
    touch_if: Script,
    touch_steady: Script,
    unlock: Script,
    lower_deadline: Script,
    reschedule: Script,
    claim_due: Script,
    append_history: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            put_doc: Script::new(concat!(
                include_str!("lua/append_revision.lua"),
                include_str!("lua/put_doc.lua")
            )),
            put_group: Script::new(concat!(
                include_str!("lua/liveness_pad.lua"),
                include_str!("lua/append_revision.lua"),
                include_str!("lua/put_group.lua")
            )),
            delete_group: Script::new(include_str!("lua/delete_group.lua")),
            load_group: Script::new(include_str!("lua/load_group.lua")),
            touch_if: Script::new(concat!(
                include_str!("lua/liveness_pad.lua"),
                include_str!("lua/touch_if.lua")
            )),
            touch_steady: Script::new(include_str!("lua/touch_steady.lua")),
            unlock: Script::new(include_str!("lua/unlock.lua")),
            lower_deadline: Script::new(include_str!("lua/lower_deadline.lua")),
            reschedule: Script::new(include_str!("lua/reschedule.lua")),
            claim_due: Script::new(include_str!("lua/claim_due.lua")),
            append_history: Script::new(include_str!("lua/append_history.lua")),
        }
    }
}

struct Inner {
    redis: LazyRedis,
    keys: Keys,
    scripts: Scripts,
    config: RedisStoreConfig,
    /// Steady-heartbeat touches waiting to be sent.
    touches: TouchQueues,
    /// Stream-revision reads in flight on a cluster, by stream: concurrent touch batches of
    /// the stream's groups share one read instead of sending one each.
    stream_reads: std::sync::Mutex<HashMap<String, StreamRead>>,
}

/// A stream-revision read that several touch batches await together.
type StreamRead =
    futures::future::Shared<futures::future::BoxFuture<'static, Result<Option<u64>, StoreError>>>;

/// Most touches sent in one script call (bounds the script's run time).
const MAX_TOUCH_BATCH: usize = 256;

/// Steady-heartbeat touches waiting to be sent (group commit, [`crate::group_commit`]): one
/// queue on standalone Redis, one per group on a cluster (a script touches one slot only).
type TouchQueues = crate::group_commit::Queues<String, WaitingTouch>;

struct WaitingTouch {
    group: String,
    stream: String,
    revision: u64,
    stream_revision: u64,
    member: String,
    now_ms: u64,
    max_silence_ms: u64,
    reply: oneshot::Sender<Result<TouchOutcome, StoreError>>,
}

/// Where a queued touch's outcome arrives.
type TouchAnswer = oneshot::Receiver<Result<TouchOutcome, StoreError>>;

/// A queued touch's outcome.
async fn answer_of(answer: Option<TouchAnswer>) -> Result<TouchOutcome, StoreError> {
    match answer {
        Some(answer) => answer.await.unwrap_or_else(|_| {
            Err(StoreError::unavailable(
                "the steady-heartbeat batch was abandoned".into(),
            ))
        }),
        None => Err(StoreError::unavailable(
            "the steady-heartbeat touch was not queued".into(),
        )),
    }
}

/// Group and stream documents in Redis (PROTOCOL §2), safe for several coordinators.
///
/// Cheap to clone (one shared connection). Connects lazily: a coordinator started while
/// Redis is down answers `503` until it is up.
#[derive(Clone)]
pub struct RedisStore(Arc<Inner>);

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.0.config.redis)
            .field("key_prefix", &self.0.keys.prefix)
            .finish()
    }
}

fn unavailable(what: &str, e: RedisError) -> StoreError {
    StoreError::from_redis(what, e)
}

impl RedisStore {
    /// A store with these settings. Checks the settings; when Redis answers, also checks
    /// that it is (or is not) a cluster node as configured. When Redis does not answer yet,
    /// the store is returned anyway and connects on first use.
    pub async fn open(config: RedisStoreConfig) -> Result<Self, StoreError> {
        validate_key_prefix(&config.key_prefix).map_err(StoreError::unavailable)?;
        let redis = (config.redis.open(STORE_REDIS, &config.settings()))
            .map_err(|e| StoreError::unavailable(e.to_string()))?;
        let sentinel = config.redis.sentinel.is_some();
        let store = RedisStore(Arc::new(Inner {
            redis,
            keys: Keys {
                prefix: config.key_prefix.clone(),
            },
            scripts: Scripts::new(),
            config,
            touches: Default::default(),
            stream_reads: Default::default(),
        }));
        if !sentinel {
            // Behind sentinels the master is checked when it is looked up (`ROLE`).
            store.check_mode().await?;
        }
        Ok(store)
    }

    /// Refuses a standalone configuration against a cluster node and the reverse, when the
    /// first server answers; logs and carries on when it does not.
    async fn check_mode(&self) -> Result<(), StoreError> {
        let config = &self.0.config;
        let url = config.redis.urls().remove(0);
        let tls =
            (config.redis.tls(STORE_REDIS)).map_err(|e| StoreError::unavailable(e.to_string()))?;
        rsc_redis::check_mode(
            url.expose_secret(),
            config.redis.cluster,
            "--redis-cluster",
            &config.settings(),
            &tls,
        )
        .await
        // The message says it all (a wrong mode or a refused TLS handshake): no source, so
        // that it is not printed twice.
        .map_err(|e| StoreError::unavailable(e.to_string()))
    }

    /// After a committed `put_group` reply: with [`RedisStoreConfig::wait_replicas`] set,
    /// `WAIT`s for them on the same connection; `Some(acknowledged)` when too few did.
    async fn wait_replicas(
        &self,
        c: &mut Conn,
        reply: &[Value],
    ) -> Result<Option<i64>, RedisError> {
        let want = self.0.config.wait_replicas;
        if want == 0 || !matches!(reply.first(), Some(Value::Int(1))) {
            return Ok(None);
        }
        let acked: i64 = redis::cmd("WAIT")
            .arg(want)
            .arg(WAIT_TIMEOUT.as_millis() as u64)
            .query_async(c)
            .await?;
        Ok((acked < i64::from(want)).then_some(acked))
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        self.0
            .redis
            .get()
            .await
            .map_err(|e| unavailable("connection", e))
    }

    /// Runs one operation on a connection, bounded by the operation timeout.
    async fn run<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let limit = self.0.config.operation_timeout;
        let work = async {
            let conn = self.conn().await?;
            op(conn).await.map_err(|e| unavailable(what, e))
        };
        match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::timed_out(format!(
                "redis {what}: no answer within {limit:?}"
            ))),
        }
    }

    /// Queues steady-heartbeat touches (under one lock) and starts the flushes they need;
    /// returns where each one's outcome will arrive, in order.
    fn queue_touches(&self, touches: &[SteadyTouch<'_>]) -> Vec<TouchAnswer> {
        let cluster = self.0.config.redis.cluster;
        let mut answers = Vec::with_capacity(touches.len());
        let waiting = touches.iter().map(|t| {
            let (reply, answer) = oneshot::channel();
            answers.push(answer);
            let key = if cluster { t.group } else { "" };
            let touch = WaitingTouch {
                group: t.group.to_owned(),
                stream: t.stream.to_owned(),
                revision: t.revision,
                stream_revision: t.stream_revision,
                member: t.member.to_owned(),
                now_ms: t.now_ms,
                max_silence_ms: t.max_silence_ms,
                reply,
            };
            (key.to_owned(), touch)
        });
        for key in self.0.touches.push(waiting) {
            tokio::spawn(self.clone().flush_touches(key));
        }
        answers
    }

    /// Sends the waiting steady-heartbeat touches of one group, a batch at a time, until
    /// none is left. Under load, a heartbeat that arrives while a batch is in flight rides
    /// in the next one: one script call answers many heartbeats.
    async fn flush_touches(self, key: String) {
        while let Some(batch) = self.0.touches.next_batch(&key, MAX_TOUCH_BATCH, |_| 1) {
            match self.touch_batch(&batch).await {
                Ok(outcomes) => {
                    for (w, outcome) in batch.into_iter().zip(outcomes) {
                        let _ = w.reply.send(Ok(outcome));
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

    /// One script call for a batch of touches. On standalone Redis the batch may span groups
    /// and the script checks the stream revisions too; on a cluster the batch is of one group
    /// and its stream's revision is read alongside (another slot).
    async fn touch_batch(&self, batch: &[WaitingTouch]) -> Result<Vec<TouchOutcome>, StoreError> {
        let keys = &self.0.keys;
        let cluster = self.0.config.redis.cluster;
        // Each group once, in order of first appearance; a touch names its group by index.
        let mut groups: Vec<(&str, &str)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for w in batch {
            index.entry(&w.group).or_insert_with(|| {
                groups.push((&w.group, &w.stream));
                groups.len()
            });
        }
        let (groups, index) = (&groups, &index);
        let touch = self.run("touch", |mut c| async move {
            let mut inv = self.0.scripts.touch_steady.prepare_invoke();
            for (group, stream) in groups {
                inv.key(keys.group(group)).key(keys.live(group));
                if !cluster {
                    inv.key(keys.stream(stream));
                }
            }
            inv.arg(if cluster { 2 } else { 3 }).arg(batch.len());
            for w in batch {
                inv.arg(index[w.group.as_str()])
                    .arg(w.revision)
                    .arg(w.stream_revision)
                    .arg(&w.member)
                    .arg(w.now_ms)
                    .arg(w.max_silence_ms);
            }
            inv.invoke_async::<Vec<i64>>(&mut c).await
        });
        let (replies, stream_revision) = match (cluster, groups.as_slice()) {
            (true, [(_, stream)]) => {
                let (r, s) = futures::join!(touch, self.shared_stream_revision(stream));
                (r?, s?)
            }
            _ => (touch.await?, None),
        };
        if replies.len() != batch.len() {
            return Err(StoreError::unavailable(format!(
                "touch script answered {} outcomes for {} touches",
                replies.len(),
                batch.len()
            )));
        }
        Ok(replies
            .into_iter()
            .zip(batch)
            .map(|(r, w)| match r {
                1 if cluster && stream_revision != Some(w.stream_revision) => TouchOutcome::Stale,
                1 => TouchOutcome::Touched,
                -1 => TouchOutcome::NotLive,
                _ => TouchOutcome::Stale,
            })
            .collect())
    }

    /// The stream's revision, read once for all the touch batches that ask while the read is
    /// in flight. A batch may so see a revision read a moment before it was sent: safe,
    /// because a layout change also rewrites every group of the stream (the group revision,
    /// checked atomically with the touch, then differs), and no assignment changes without a
    /// group write.
    async fn shared_stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        use futures::FutureExt;
        let read = {
            let mut reads = self
                .0
                .stream_reads
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match reads.get(stream) {
                Some(read) => read.clone(),
                None => {
                    let (this, name) = (self.clone(), stream.to_owned());
                    let read = async move {
                        let r = this.stream_revision(&name).await;
                        let mut reads = this
                            .0
                            .stream_reads
                            .lock()
                            .unwrap_or_else(|p| p.into_inner());
                        reads.remove(&name);
                        r
                    }
                    .boxed()
                    .shared();
                    reads.insert(stream.to_owned(), read.clone());
                    read
                }
            }
        };
        read.await
    }

    /// Runs a deadline-index script on `group`'s bucket.
    async fn due_script(
        &self,
        script: &Script,
        group: &str,
        revision: u64,
        deadline: Option<u64>,
    ) -> Result<i64, StoreError> {
        let bucket = super::due_bucket(group);
        let keys = &self.0.keys;
        let (due, revisions) = (keys.due(bucket), keys.due_revisions(bucket));
        self.run("deadline index", |mut c| async move {
            let mut inv = script.key(&due);
            inv.key(&revisions).arg(group).arg(revision);
            match deadline {
                Some(d) => inv.arg(d),
                None => inv.arg(""),
            };
            inv.invoke_async(&mut c).await
        })
        .await
    }

    async fn load_doc<T: DeserializeOwned>(
        &self,
        key: String,
    ) -> Result<Option<Versioned<T>>, StoreError> {
        let k = key.clone();
        let (revision, doc): (Option<u64>, Option<Vec<u8>>) = self
            .run("load", |mut c| async move {
                redis::cmd("HMGET")
                    .arg(&k)
                    .arg("revision")
                    .arg("doc")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        match (revision, doc) {
            (Some(revision), Some(doc)) => Ok(Some(Versioned {
                revision,
                doc: decode(&key, &doc)?,
            })),
            // Absent, or the tombstone of a deleted document.
            (_, None) => Ok(None),
            (None, Some(_)) => Err(StoreError::corrupt(&key, "the hash lacks `revision`")),
        }
    }

    async fn put_doc<T: Serialize>(
        &self,
        (key, revisions): (String, String),
        doc: &T,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError> {
        let json = encode(doc)?;
        let k = key.clone();
        let keep = self.0.config.revisions;
        let reply: Vec<i64> = self
            .run("put", |mut c| async move {
                self.0
                    .scripts
                    .put_doc
                    .key(&k)
                    .key(&revisions)
                    .arg(expected)
                    .arg(json)
                    .arg(note.t_ms)
                    .arg(&note.body)
                    .arg(keep.max_revisions.max(1))
                    .arg(keep.max_age_ms.max(1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        cas_reply(&key, expected, &reply)
    }

    async fn add_to_index(&self, index: String, name: &str) -> Result<(), StoreError> {
        self.run("index", |mut c| async move {
            redis::cmd("SADD")
                .arg(&index)
                .arg(name)
                .query_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    /// Index members whose document exists, sorted.
    async fn list(
        &self,
        index: String,
        doc_key: impl Fn(&str) -> String,
    ) -> Result<Vec<String>, StoreError> {
        let names: Vec<String> = self
            .run("list", |mut c| async move {
                redis::cmd("SMEMBERS").arg(&index).query_async(&mut c).await
            })
            .await?;
        let checks = futures::stream::iter(names.into_iter().map(|name| {
            let key = doc_key(&name);
            async move {
                // HEXISTS, not EXISTS: a deleted group leaves a tombstone hash.
                let exists: bool = self
                    .run("exists", |mut c| async move {
                        redis::cmd("HEXISTS")
                            .arg(&key)
                            .arg("doc")
                            .query_async(&mut c)
                            .await
                    })
                    .await?;
                Ok::<_, StoreError>(exists.then_some(name))
            }
        }))
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
        let mut out = Vec::new();
        for c in checks {
            out.extend(c?);
        }
        out.sort();
        Ok(out)
    }
}

/// Counts a group document commit refused because the server may no longer be the master
/// (`reason`: `switched`, the sentinels named another; `replicas`, too few replicas
/// acknowledged it).
fn refused(reason: &'static str) {
    ::metrics::counter!("rsc_store_commits_refused_total", "reason" => reason).increment(1);
}

fn encode<T: Serialize>(doc: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(doc).map_err(|e| StoreError::corrupt("<new document>", &e).with_source(e))
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::corrupt(key, &e).with_source(e))
}

/// Reads a `{status, revision[, member]}` reply of a compare-and-set script.
/// Each server's `run_id` in a reply to `INFO server`: one text (keyed `""`), or a map
/// address → text (a cluster's primaries). `None` when a text holds no run id.
fn run_ids_of(reply: Value) -> Option<BTreeMap<String, String>> {
    let run_id = |v: Value| {
        let text: String = redis::from_redis_value(v).ok()?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("run_id:"))
            .map(str::to_owned)
    };
    match reply {
        Value::Map(nodes) => nodes
            .into_iter()
            .map(|(addr, v)| Some((redis::from_redis_value(addr).ok()?, run_id(v)?)))
            .collect(),
        text => Some(BTreeMap::from([(String::new(), run_id(text)?)])),
    }
}

fn cas_reply(key: &str, expected: u64, reply: &[i64]) -> Result<u64, StoreError> {
    match reply {
        [1, revision, ..] => Ok(*revision as u64),
        [0, current, ..] => Err(StoreError::conflict(format!(
            "{key} (at revision {current}, expected {expected})"
        ))),
        _ => Err(StoreError::unavailable(format!(
            "unexpected compare-and-set reply for {key}: {reply:?}"
        ))),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The padding entry of a group's liveness (`lua/liveness_pad.lua`, which writes the same
/// text; the store contract tests fail if the two differ): not a member (no member id starts
/// with `#`), longer than the 64 bytes up to which Redis may keep a sorted set as a listpack.
const LIVENESS_PAD: &str =
    "#rsc-liveness-padding: an entry over 64 bytes keeps this sorted set a skiplist";

/// A group's liveness from `ZRANGE … WITHSCORES`: member → last heard from, without
/// [`LIVENESS_PAD`].
fn liveness_pairs(flat: &[Value]) -> HashMap<String, u64> {
    flat.chunks(2)
        .filter_map(|pair| match pair {
            [m, t] => {
                let member = text(m).filter(|m| m != LIVENESS_PAD)?;
                let t: f64 = text(t)?.parse().ok()?;
                Some((member, t.max(0.0) as u64))
            }
            _ => None,
        })
        .collect()
}

/// A held Redis lock; releases itself (compare-and-delete) when dropped.
struct RedisLock {
    conn: Conn,
    key: String,
    token: String,
    unlock: Script,
}

impl Drop for RedisLock {
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime (shutdown): the lock expires by itself after its hold time.
            return;
        };
        let mut conn = self.conn.clone();
        let key = std::mem::take(&mut self.key);
        let token = std::mem::take(&mut self.token);
        let unlock = self.unlock.clone();
        rt.spawn(async move {
            let r: Result<i64, RedisError> =
                unlock.key(&key).arg(&token).invoke_async(&mut conn).await;
            match r {
                Ok(1) => {}
                Ok(_) => warn!(lock = %key, "lock had expired before it was released; the revision check guarded the write"),
                Err(e) => debug!(lock = %key, error = %e, "lock release failed; it expires by itself"),
            }
        });
    }
}

#[async_trait]
impl MetadataStore for RedisStore {
    async fn append_audit(&self, log: AuditLog, entry: &AuditEntry) -> Result<(), StoreError> {
        let key = self.0.keys.audit(log);
        let json = encode(entry)?;
        self.run("audit append", |mut c| async move {
            redis::cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(AUDIT_RETAINED)
                .arg("*")
                .arg("entry")
                .arg(json)
                .query_async::<String>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    async fn read_audit(
        &self,
        log: AuditLog,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        const PAGE: usize = 200;
        let key = self.0.keys.audit(log);
        let mut out = Vec::new();
        let mut end = "+".to_owned();
        // Newest first, a page at a time, until `limit` entries match or the log ends.
        while out.len() < limit {
            let k = key.clone();
            let e = end.clone();
            let page: Vec<(String, HashMap<String, Vec<u8>>)> = self
                .run("audit read", |mut c| async move {
                    redis::cmd("XREVRANGE")
                        .arg(&k)
                        .arg(&e)
                        .arg("-")
                        .arg("COUNT")
                        .arg(PAGE)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            let full = page.len() == PAGE;
            for (id, fields) in &page {
                let Some(bytes) = fields.get("entry") else {
                    continue;
                };
                let entry: AuditEntry = decode(&format!("{key} {id}"), bytes)?;
                if filter.matches(&entry) && out.len() < limit {
                    out.push(entry);
                }
            }
            match page.last() {
                Some((id, _)) if full => end = format!("({id}"),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError> {
        self.load_doc(self.0.keys.group(group)).await
    }

    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError> {
        self.load_doc(self.0.keys.stream(stream)).await
    }

    async fn put_group(
        &self,
        doc: &GroupDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError> {
        self.put_group_live(doc, expected, &LivenessChange::default(), note)
            .await
    }

    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError> {
        let (key, live) = (self.0.keys.group(group), self.0.keys.live(group));
        let revisions = self.0.keys.revisions(DocKind::Group, group);
        let k = key.clone();
        let reply: Vec<i64> = self
            .run("delete", |mut c| async move {
                self.0
                    .scripts
                    .delete_group
                    .key(&k)
                    .key(&live)
                    .key(&revisions)
                    .arg(expected)
                    .arg(self.0.config.tombstone_retention.as_millis() as u64)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        cas_reply(&key, expected, &reply)?;
        // After the document: a crash in between leaves a name that listings skip, and an
        // index entry the sweep removes when it finds the group gone.
        let index = self.0.keys.groups();
        let unlisted = self.run("index", |mut c| async move {
            redis::cmd("SREM")
                .arg(&index)
                .arg(group)
                .query_async::<i64>(&mut c)
                .await
        });
        let unscheduled = self.reschedule(group, u64::MAX, None);
        let history = self.0.keys.history(group);
        let forgotten = self.run("history", |mut c| async move {
            redis::cmd("UNLINK")
                .arg(&history)
                .query_async::<i64>(&mut c)
                .await
        });
        let (unlisted, unscheduled, forgotten) = futures::join!(unlisted, unscheduled, forgotten);
        unlisted?;
        unscheduled?;
        forgotten?;
        Ok(())
    }

    async fn put_stream(
        &self,
        doc: &StreamDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError> {
        if expected == 0 {
            // Before the document: a crash in between leaves a name listings skip, never
            // a document no listing shows.
            self.add_to_index(self.0.keys.streams(), &doc.stream)
                .await?;
        }
        let keys = (
            self.0.keys.stream(&doc.stream),
            self.0.keys.revisions(DocKind::Stream, &doc.stream),
        );
        self.put_doc(keys, doc, expected, note).await
    }

    async fn read_revisions(
        &self,
        kind: DocKind,
        name: &str,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        let key = self.0.keys.revisions(kind, name);
        let k = key.clone();
        let raw: Vec<Vec<u8>> = self
            .run("revisions read", |mut c| async move {
                redis::cmd("LRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        raw.iter().map(|bytes| decode(&key, bytes)).collect()
    }

    async fn list_groups(&self) -> Result<Vec<String>, StoreError> {
        self.list(self.0.keys.groups(), |g| self.0.keys.group(g))
            .await
    }

    async fn list_streams(&self) -> Result<Vec<String>, StoreError> {
        self.list(self.0.keys.streams(), |s| self.0.keys.stream(s))
            .await
    }

    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError> {
        let key = self.0.keys.lock(resource);
        let token = format!("{:032x}", rand::random::<u128>());
        let hold = self.0.config.lock_hold.as_millis() as u64;
        let wait = self.0.config.lock_wait;
        let start = Instant::now();
        let mut pause_ms = 2u64;
        loop {
            let (k, t) = (&key, &token);
            let taken: Option<String> = self
                .run("lock", |mut c| async move {
                    redis::cmd("SET")
                        .arg(k)
                        .arg(t)
                        .arg("NX")
                        .arg("PX")
                        .arg(hold)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            if taken.is_some() {
                return Ok(LockGuard::new(RedisLock {
                    conn: self.conn().await?,
                    key,
                    token,
                    unlock: self.0.scripts.unlock.clone(),
                }));
            }
            if start.elapsed() >= wait {
                return Err(StoreError::busy(format!(
                    "lock {key} is held by another request and was not released within {wait:?}"
                )));
            }
            // Jittered back-off: spread competing coordinators apart.
            let sleep = rand::random_range(pause_ms / 2..=pause_ms);
            tokio::time::sleep(Duration::from_millis(sleep)).await;
            pause_ms = (pause_ms * 2).min(50);
        }
    }

    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError> {
        let live = self.0.keys.live(group);
        let flat: Vec<Value> = self
            .run("liveness", |mut c| async move {
                redis::cmd("ZRANGE")
                    .arg(&live)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(liveness_pairs(&flat))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run("ping", |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .map(|_| ())
    }

    async fn run_ids(&self) -> Result<BTreeMap<String, String>, StoreError> {
        // On a cluster `INFO` goes to every primary and answers a map address → text.
        let reply: Value = self
            .run("info", |mut c| async move {
                redis::cmd("INFO").arg("server").query_async(&mut c).await
            })
            .await?;
        run_ids_of(reply)
            .ok_or_else(|| StoreError::unavailable("INFO server answered no run_id".to_owned()))
    }

    async fn load_group_live(
        &self,
        group: &str,
    ) -> Result<Option<(Versioned<GroupDoc>, HashMap<String, u64>)>, StoreError> {
        let (key, live) = (self.0.keys.group(group), self.0.keys.live(group));
        let k = key.clone();
        let reply: Value = self
            .run("load", |mut c| async move {
                self.0
                    .scripts
                    .load_group
                    .key(&k)
                    .key(&live)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let parts = match reply {
            Value::Nil => return Ok(None),
            Value::Array(parts) => parts,
            other => {
                return Err(StoreError::unavailable(format!(
                    "unexpected reply reading {key}: {other:?}"
                )));
            }
        };
        let corrupt = |reason: &str| StoreError::corrupt(&key, reason);
        let [revision, doc, flat] = parts.as_slice() else {
            return Err(corrupt("unexpected shape of the stored group"));
        };
        let revision: u64 = text(revision)
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| corrupt("`revision` is not a number"))?;
        let doc: GroupDoc = match doc {
            Value::BulkString(b) => decode(&key, b)?,
            _ => return Err(corrupt("the hash lacks `doc`")),
        };
        let live = match flat {
            Value::Array(flat) => liveness_pairs(flat),
            _ => HashMap::new(),
        };
        Ok(Some((Versioned { revision, doc }, live)))
    }

    async fn put_group_live(
        &self,
        doc: &GroupDoc,
        expected: u64,
        change: &LivenessChange,
        note: &Note,
    ) -> Result<u64, StoreError> {
        if expected == 0 {
            // Before the document: see `put_stream`.
            self.add_to_index(self.0.keys.groups(), &doc.group).await?;
        }
        let json = encode(doc)?;
        let (key, live) = (self.0.keys.group(&doc.group), self.0.keys.live(&doc.group));
        let revisions = self.0.keys.revisions(DocKind::Group, &doc.group);
        let keep = self.0.config.revisions;
        let k = key.clone();
        let (reply, acked) = self
            .run("put", |mut c| async move {
                let mut inv = self.0.scripts.put_group.key(&k);
                inv.key(&live).key(&revisions).arg(expected).arg(json);
                inv.arg(note.t_ms).arg(&note.body);
                inv.arg(keep.max_revisions.max(1))
                    .arg(keep.max_age_ms.max(1));
                inv.arg(change.expired.len());
                for (member, seen) in &change.expired {
                    inv.arg(member).arg(*seen);
                }
                inv.arg(change.forget.len());
                for member in &change.forget {
                    inv.arg(member);
                }
                match &change.touch {
                    Some((member, now)) => inv.arg(member).arg(*now),
                    None => inv.arg("").arg(0),
                };
                let reply: Vec<Value> = inv.invoke_async(&mut c).await.inspect_err(|e| {
                    if rsc_redis::sentinel::is_switched(e) {
                        refused("switched");
                    }
                })?;
                let acked = self.wait_replicas(&mut c, &reply).await?;
                Ok((reply, acked))
            })
            .await?;
        if let Some(acked) = acked {
            refused("replicas");
            return Err(StoreError::unavailable(format!(
                "{key}: committed on a server only {acked} of {} replicas acknowledged within \
                 {WAIT_TIMEOUT:?} (a master cut off from its replicas, or lagging ones): not \
                 acknowledged",
                self.0.config.wait_replicas
            )));
        }
        let status: Vec<i64> = reply
            .iter()
            .take(2)
            .filter_map(|v| match v {
                Value::Int(i) => Some(*i),
                _ => None,
            })
            .collect();
        match status.as_slice() {
            [-1, _] => Err(StoreError::conflict(format!(
                "{key} (member {} was heard from after it was found silent)",
                reply.get(2).and_then(text).unwrap_or_default()
            ))),
            _ => cas_reply(&key, expected, &status),
        }
    }

    async fn touch_if(
        &self,
        group: &str,
        revision: u64,
        member: &str,
        now_ms: u64,
        max_silence_ms: Option<u64>,
    ) -> Result<TouchOutcome, StoreError> {
        let (key, live) = (self.0.keys.group(group), self.0.keys.live(group));
        let reply: i64 = self
            .run("touch", |mut c| async move {
                let mut inv = self.0.scripts.touch_if.key(&key);
                inv.key(&live).arg(revision).arg(member).arg(now_ms);
                match max_silence_ms {
                    Some(ms) => inv.arg(ms),
                    None => inv.arg(""),
                };
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(match reply {
            1 => TouchOutcome::Touched,
            -1 => TouchOutcome::NotLive,
            _ => TouchOutcome::Stale,
        })
    }

    async fn lower_deadline(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: u64,
    ) -> Result<(), StoreError> {
        let lower = &self.0.scripts.lower_deadline;
        self.due_script(lower, group, revision, Some(deadline_ms))
            .await
            .map(drop)
    }

    async fn reschedule(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        let script = &self.0.scripts.reschedule;
        Ok(self
            .due_script(script, group, revision, deadline_ms)
            .await?
            == 1)
    }

    async fn claim_due(
        &self,
        buckets: &[u32],
        now_ms: u64,
        claim_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        // Standalone: every bucket in one script call. Cluster: one call per bucket (slot),
        // all sent at once.
        let calls: Vec<Vec<u32>> = if self.0.config.redis.cluster {
            buckets.iter().map(|&b| vec![b]).collect()
        } else {
            vec![buckets.to_vec()]
        };
        let until = now_ms.saturating_add(claim_ms);
        let claims = futures::future::join_all(calls.iter().map(|bs| {
            self.run("claim due", move |mut c| async move {
                let mut inv = self.0.scripts.claim_due.prepare_invoke();
                for &b in bs {
                    inv.key(self.0.keys.due(b));
                }
                inv.arg(now_ms).arg(until).arg(limit);
                inv.invoke_async::<Vec<String>>(&mut c).await
            })
        }))
        .await;
        let mut out = Vec::new();
        for claimed in claims {
            out.extend(claimed?);
        }
        Ok(out)
    }

    async fn register_coordinator(
        &self,
        id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        let key = self.0.keys.coordinators();
        let mut live: Vec<String> = self
            .run("register", |mut c| async move {
                redis::pipe()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(&key)
                    .arg("-inf")
                    .arg(now_ms)
                    .ignore()
                    .cmd("ZADD")
                    .arg(&key)
                    .arg(now_ms.saturating_add(ttl_ms))
                    .arg(id)
                    .ignore()
                    .cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async::<(Vec<String>,)>(&mut c)
                    .await
                    .map(|(live,)| live)
            })
            .await?;
        live.sort();
        Ok(live)
    }

    async fn append_history(
        &self,
        group: &str,
        record: &HistoryRecord,
        bounds: HistoryBounds,
    ) -> Result<bool, StoreError> {
        let key = self.0.keys.history(group);
        let json = encode(record)?;
        let appended: i64 = self
            .run("history append", |mut c| async move {
                self.0
                    .scripts
                    .append_history
                    .key(&key)
                    .arg(record.sample.t_ms)
                    .arg(bounds.min_gap_ms)
                    .arg(bounds.keep.max(1))
                    .arg(bounds.ttl_ms.max(1))
                    .arg(json)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(appended == 1)
    }

    async fn read_history(
        &self,
        group: &str,
        last: Option<usize>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let key = self.0.keys.history(group);
        let start = last.map_or(0, |n| -(n.max(1) as i64));
        let k = key.clone();
        let raw: Vec<Vec<u8>> = self
            .run("history read", |mut c| async move {
                redis::cmd("LRANGE")
                    .arg(&k)
                    .arg(start)
                    .arg(-1)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        raw.iter().map(|bytes| decode(&key, bytes)).collect()
    }

    async fn touch_steady(&self, t: &SteadyTouch<'_>) -> Result<TouchOutcome, StoreError> {
        let answer = self.queue_touches(std::slice::from_ref(t)).pop();
        answer_of(answer).await
    }

    async fn touch_steady_batch(
        &self,
        touches: &[SteadyTouch<'_>],
    ) -> Vec<Result<TouchOutcome, StoreError>> {
        let answers = self.queue_touches(touches);
        let mut outcomes = Vec::with_capacity(answers.len());
        for answer in answers {
            outcomes.push(answer_of(Some(answer)).await);
        }
        outcomes
    }

    async fn group_revision(&self, group: &str) -> Result<Option<u64>, StoreError> {
        let key = self.0.keys.group(group);
        // A deleted group's tombstone keeps its revision but has no document.
        let (revision, exists): (Option<u64>, bool) = self
            .run("revision", |mut c| async move {
                redis::pipe()
                    .cmd("HGET")
                    .arg(&key)
                    .arg("revision")
                    .cmd("HEXISTS")
                    .arg(&key)
                    .arg("doc")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(revision.filter(|_| exists))
    }

    async fn stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let key = self.0.keys.stream(stream);
        self.run("revision", |mut c| async move {
            redis::cmd("HGET")
                .arg(&key)
                .arg("revision")
                .query_async(&mut c)
                .await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A standalone server answers one text; a cluster a map of its primaries' texts.
    #[test]
    fn run_ids_are_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\ntcp_port:6379\r\n";
        let one = run_ids_of(text(info)).unwrap();
        assert_eq!(one, BTreeMap::from([(String::new(), "abc".to_owned())]));
        let map = Value::Map(vec![
            (text("127.0.0.1:7001"), text("run_id:x\r\n")),
            (text("127.0.0.1:7002"), text("run_id:y\r\n")),
        ]);
        let both = run_ids_of(map).unwrap();
        assert_eq!(both["127.0.0.1:7001"], "x");
        assert_eq!(both["127.0.0.1:7002"], "y");
        assert_eq!(run_ids_of(text("redis_version:7\r\n")), None);
    }
}
