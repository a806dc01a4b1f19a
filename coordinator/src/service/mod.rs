//! The coordinator service: store reads, engine decisions and store writes, in order.
//!
//! Every mutation runs as: take the document's lock, read it with its revision, let the
//! [`crate::engine`] decide, compare-and-set the result; for a group document that is one
//! write cycle ([`write`]: lock → load → expire → engine → compare-and-set → deadline → wake),
//! shared by operators' mutations, the sweep and the full heartbeat. A lost compare-and-set
//! (the lock expired under a slow replica) reruns the whole cycle a bounded number of times
//! and then answers [`ServiceError::Store`] with a conflict [`StoreError`]
//! (`503 STORE_CONFLICT`). Locks are taken stream first, then one group.
//!
//! A steady-state heartbeat (nothing to change, PROTOCOL §5.1) skips all of that: the coordinator
//! keeps the documents it last read or wrote, by revision, and answers from them when
//! [`GroupDoc::steady_heartbeat`] says the heartbeat changes nothing, after one conditional
//! liveness touch that succeeds only while the group and stream documents are still at those
//! revisions ([`MetadataStore::touch_steady`]: one Redis round trip, batched with concurrent
//! heartbeats of the same group; two commands sent together on a cluster, where the two
//! documents live in different slots). Removing a member for silence
//! is committed with the liveness it was based on, so a heartbeat touched in between makes
//! that write lose and rerun (see [`crate::store`], "Liveness").
//!
//! The service is split by concern, each file one `impl Coordinator` block:
//! - `heartbeat`: the member protocol — single and batched heartbeats (the steady fast path
//!   and the full one) and leave;
//! - `admin`: operators' mutations — groups, members, pause, reshard and rollback, and the
//!   layout fan-out to the groups of a stream;
//! - `sweep`: the expiry sweep over the deadline index and the purge of retired shard keys;
//! - `views`: the read-only views (describe, list, routing);
//! - `write`: the write cycle of a group document;
//! - `cache`: the documents this coordinator last read or wrote, for the steady path;
//! - `dlq` and `redrive`: the dead letters of a stream — depth, list, purge and redrive.

mod admin;
mod cache;
mod dlq;
mod heartbeat;
mod outages;
mod recovery;
mod redrive;
mod revisions;
mod sweep;
mod views;
mod write;

use cache::DocCache;
pub(crate) use dlq::ListRequest as DlqListRequest;
pub use recovery::Restored;
pub use sweep::PurgedKeys;
use write::Mutated;

use crate::clock::Clock;
use crate::engine::{EngineError, GroupDoc, GroupEvent, StreamDoc, members_to_wake};
use crate::fencing::{FencingError, OwnerTokens, Sealer};
use crate::outage::StoreOutages;
use crate::store::{Layered, LockGuard, LockResource, MetadataStore, StoreError, Versioned};
use crate::wake::WakeHub;
use rsc_protocol::names::validate_name;
use rsc_protocol::{ErrorCode, FencingMode};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, warn};

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// How long after a reshard completed it may be rolled back (ms).
    pub rollback_window_ms: u64,
    /// How many times a lost compare-and-set is retried before `STORE_CONFLICT`.
    pub cas_retries: u32,
    /// A cached group document unused for this long is dropped (and read again when needed):
    /// half the store's tombstone retention, so that no coordinator still caches a deleted
    /// group when its tombstone is collected and the name may start a new revision sequence.
    pub cache_idle: Duration,
    /// How long a sweep's claim on a due group lasts: if the sweeper dies before it has
    /// rescheduled the group, the group is due again this much later, for any coordinator.
    pub claim_ms: u64,
    /// Most due groups one sweep claims.
    pub sweep_batch: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            rollback_window_ms: 15 * 60 * 1000,
            cas_retries: 5,
            cache_idle: crate::store::TOMBSTONE_RETENTION / 2,
            claim_ms: 2_000,
            sweep_batch: 512,
        }
    }
}

/// Why a service call failed. Each variant maps to one protocol error code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    /// The protocol refused.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The data Redis failed a fencing step (owner tokens, docs/FENCING.md; seals of ordered
    /// resharding, PROTOCOL §15): its kind and cause kept as the source. Answered as the
    /// store's unavailability (`503 STORE_UNAVAILABLE`): the request was not carried out.
    #[error("{source}{after}")]
    Fencing {
        /// What failed.
        source: FencingError,
        /// What it means for the request, appended to the message (may be empty).
        after: &'static str,
    },
    /// No such group.
    #[error("group {0} does not exist")]
    GroupNotFound(String),
    /// No such stream.
    #[error("stream {0} does not exist")]
    StreamNotFound(String),
    /// The group exists.
    #[error("group {0} already exists")]
    GroupAlreadyExists(String),
    /// Create on an existing stream with another shard count.
    #[error("stream {stream} has {existing} shards, not {requested}")]
    ShardCountMismatch {
        /// Stream.
        stream: String,
        /// Its shard count.
        existing: u32,
        /// What the request said.
        requested: u32,
    },
    /// Delete of a group with members, without force.
    #[error("group {group} has {members} live members; delete with ?force=true to remove them")]
    GroupNotEmpty {
        /// Group.
        group: String,
        /// Live members.
        members: usize,
    },
    /// Seek of a running group with live members (PROTOCOL §18).
    #[error(
        "group {group} has {members} live members and is not paused: pause it first \
         (rsc-coordinator group pause {group}, or POST /v1/groups/{group}/pause), then seek"
    )]
    SeekWhileLive {
        /// Group.
        group: String,
        /// Live members.
        members: usize,
    },
    /// The data Redis failed or is not configured for a data-path operation.
    #[error("data Redis: {0}")]
    DataRedis(String),
}

impl ServiceError {
    /// The protocol error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServiceError::Engine(e) => e.code(),
            ServiceError::Store(e) if e.is_conflict() => ErrorCode::StoreConflict,
            ServiceError::Store(_) | ServiceError::Fencing { .. } => ErrorCode::StoreUnavailable,
            ServiceError::GroupNotFound(_) => ErrorCode::GroupNotFound,
            ServiceError::StreamNotFound(_) => ErrorCode::StreamNotFound,
            ServiceError::GroupAlreadyExists(_) => ErrorCode::GroupAlreadyExists,
            ServiceError::ShardCountMismatch { .. } => ErrorCode::ShardCountMismatch,
            ServiceError::GroupNotEmpty { .. } | ServiceError::SeekWhileLive { .. } => {
                ErrorCode::GroupNotEmpty
            }
            ServiceError::DataRedis(_) => ErrorCode::StoreUnavailable,
        }
    }

    /// When retrying may succeed, how long until then (ms).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ServiceError::Engine(e) => e.retry_after_ms(),
            _ => None,
        }
    }

    fn is_conflict(&self) -> bool {
        matches!(self, ServiceError::Store(e) if e.is_conflict())
    }

    /// A failure of the data Redis during a fencing step; `after` says what it means for
    /// the request (appended to the message).
    pub(crate) fn fencing(e: FencingError, after: &'static str) -> Self {
        ServiceError::Fencing { source: e, after }
    }

    /// The answer to a heartbeat of a batch that the service left unanswered: a conflict the
    /// member retries. Unreachable: the service answers every item it is given, in order.
    pub(crate) fn unanswered() -> Self {
        StoreError::conflict("heartbeat left unanswered; retry".into()).into()
    }
}

type Result<T> = std::result::Result<T, ServiceError>;

fn invalid(msg: String) -> ServiceError {
    ServiceError::Engine(EngineError::Invalid(msg))
}

fn check_name(kind: &str, name: &str) -> Result<()> {
    validate_name(kind, name).map_err(|e| invalid(e.to_string()))
}

/// The coordinator: one per process, shared by every HTTP handler and the expiry sweep.
#[derive(Debug, Clone)]
pub struct Coordinator {
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    config: ServiceConfig,
    cache: Arc<DocCache>,
    fencing: Option<Arc<OwnerTokens>>,
    sealer: Option<Arc<Sealer>>,
    /// Store outages seen, so that one does not expire the members it kept silent.
    outages: Arc<Mutex<StoreOutages>>,
    wakes: Option<Arc<WakeHub>>,
    /// The recovery copy of the documents, when the coordinator knows the data Redis
    /// (PROTOCOL §2.3).
    recovery: Option<Arc<recovery::Recovery>>,
    /// The dead letters counted per group of each stream asked about (PROTOCOL §18).
    dlq_depth: Arc<crate::dlq::depth::DepthCache>,
}

impl Coordinator {
    /// A coordinator over `store`, telling time by `clock`.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        clock: Arc<dyn Clock>,
        config: ServiceConfig,
    ) -> Self {
        let outages: Arc<Mutex<StoreOutages>> = Arc::default();
        // Every call's outcome feeds the outage record (see `crate::outage`).
        let watch = outages::OutageWatch {
            outages: outages.clone(),
            clock: clock.clone(),
        };
        Coordinator {
            store: Arc::new(Layered::with_layer(store, watch)),
            clock,
            cache: Arc::new(DocCache::new(config.cache_idle)),
            config,
            fencing: None,
            sealer: None,
            outages,
            wakes: None,
            recovery: None,
            dlq_depth: Arc::new(crate::dlq::depth::DepthCache::new(Duration::from_secs(1))),
        }
    }

    /// Fences producers and records seal positions in the data Redis at every routing-epoch
    /// switch, before the reshard request is answered (ordered resharding, PROTOCOL §15).
    /// Without it, reshards keep at-least-once but not per-key order.
    pub fn with_sealer(mut self, sealer: Arc<Sealer>) -> Self {
        self.sealer = Some(sealer);
        self
    }

    /// The sealer, when the coordinator knows the data Redis.
    pub fn sealer(&self) -> Option<&Arc<Sealer>> {
        self.sealer.as_ref()
    }

    /// The time expiry is judged at, for a group with `session_timeout_ms`: `now` set back
    /// by a recent store outage (see [`crate::outage`]). Called after the store answered.
    fn expiry_now(&self, now: u64, session_timeout_ms: u64) -> u64 {
        let shift = self
            .outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shift_ms(now, session_timeout_ms);
        now.saturating_sub(shift)
    }

    /// Wakes the members a write concerns through `hub` (the wake-up channels); without it
    /// members learn of changes at their next heartbeat.
    pub fn with_wakeups(mut self, hub: Arc<WakeHub>) -> Self {
        self.wakes = Some(hub);
        self
    }

    /// The wake-up hub, if any.
    pub fn wakeups(&self) -> Option<&Arc<WakeHub>> {
        self.wakes.as_ref()
    }

    /// After a write of `group` succeeded: wakes the members it concerns (all of them when
    /// `after` is `None`: deleted), except `requester`, which gets its answer directly.
    fn wake(
        &self,
        group: &str,
        before: Option<&GroupDoc>,
        after: Option<&GroupDoc>,
        requester: Option<&str>,
    ) {
        let Some(hub) = &self.wakes else { return };
        let mut members = members_to_wake(before, after);
        if let Some(r) = requester {
            members.retain(|m| m != r);
        }
        hub.wake(group, members);
    }

    /// Writes owner tokens of strict-fencing groups to the data Redis through `tokens`
    /// (without it, groups default to lease fencing and `strict` is refused).
    pub fn with_fencing(mut self, tokens: Arc<OwnerTokens>) -> Self {
        self.fencing = Some(tokens);
        self
    }

    /// Checks that a requested fencing mode can be served.
    fn check_fencing(&self, mode: Option<FencingMode>) -> Result<()> {
        if mode == Some(FencingMode::Strict) && self.fencing.is_none() {
            return Err(invalid(
                "fencing \"strict\" needs the data Redis: start the coordinator with --data-redis-url"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The store (for readiness checks).
    pub fn store(&self) -> &Arc<dyn MetadataStore> {
        &self.store
    }

    /// The coordinator's clock.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// The coordinator's clock, now (Unix ms).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Runs `op` again while it loses a compare-and-set, at most `cas_retries` more times.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Err(e) if e.is_conflict() && attempt < self.config.cas_retries => {
                    attempt += 1;
                    debug!(attempt, error = %e, "compare-and-set lost; retrying");
                }
                other => return other,
            }
        }
    }

    /// Takes the lock of group `group`'s document (held until the guard drops).
    async fn lock_group(&self, group: &str) -> Result<LockGuard> {
        Ok(self
            .store
            .lock(&LockResource::Group(group.to_owned()))
            .await?)
    }

    /// Takes the lock of stream `stream`'s document (held until the guard drops).
    async fn lock_stream(&self, stream: &str) -> Result<LockGuard> {
        Ok(self
            .store
            .lock(&LockResource::Stream(stream.to_owned()))
            .await?)
    }

    async fn load_group(&self, group: &str) -> Result<Versioned<GroupDoc>> {
        let mut loaded = self.store.load_group_live(group).await?;
        if loaded.is_none() && self.recover_group_boxed(group).await? {
            // The store had lost it; restored from the recovery copy (PROTOCOL §2.3).
            loaded = self.store.load_group_live(group).await?;
        }
        let Some((mut v, live)) = loaded else {
            // Deleted (perhaps through another coordinator): drop what this one cached.
            self.cache.forget_group(group);
            return Err(ServiceError::GroupNotFound(group.to_owned()));
        };
        self.overlay_liveness(group, &mut v.doc, &live);
        self.saw_revision(group, v.revision);
        Ok(v)
    }

    /// `group` was read or written at `revision`: when the store went back in time (a
    /// rollback, see [`crate::outage`]), sessions are extended by how far.
    pub(super) fn saw_revision(&self, group: &str, revision: u64) {
        let now = self.now();
        if let Some(back_ms) = self.cache.went_back(group, revision, now) {
            self.rolled_back(group, "revision", back_ms, now);
        }
    }

    /// The liveness of `doc` as read from the store (`live`), and at least what this
    /// coordinator wrote: a steady heartbeat's touch changes no revision, so a store that
    /// lost touches (a failover, PROTOCOL §12) is found out here, and sessions are extended
    /// by how far it went back — beyond [`CLOCK_SKEW_MS`], which coordinators' clocks may
    /// differ by.
    pub(super) fn overlay_liveness(
        &self,
        group: &str,
        doc: &mut GroupDoc,
        live: &HashMap<String, u64>,
    ) {
        overlay_liveness(doc, live);
        if let Some(back_ms) = self.cache.restore_liveness(group, doc)
            && back_ms > CLOCK_SKEW_MS
        {
            self.rolled_back(group, "liveness", back_ms, self.now());
        }
    }

    /// The store was found `back_ms` behind what this coordinator had seen of `group`
    /// (`what`: a document revision or a member's liveness): a credit like an outage's.
    fn rolled_back(&self, group: &str, what: &'static str, back_ms: u64, now: u64) {
        let credit = self
            .outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rolled_back(now, back_ms);
        warn!(
            group,
            what,
            back_ms,
            credit_ms = credit.length_ms,
            "the metadata store went back in time (a failover lost writes): sessions are \
             extended by that much for one session timeout instead of expiring members"
        );
        ::metrics::counter!("rsc_store_rollbacks_total", "what" => what).increment(1);
        ::metrics::gauge!("rsc_store_last_outage_seconds").set(credit.length_ms as f64 / 1000.0);
    }

    async fn load_stream(&self, stream: &str) -> Result<Versioned<StreamDoc>> {
        let loaded = match self.store.load_stream(stream).await? {
            Some(v) => Some(v),
            // The store may have lost it: restored from the recovery copy (PROTOCOL §2.3).
            None => self.recover_stream_boxed(stream).await?,
        };
        loaded.ok_or_else(|| ServiceError::StreamNotFound(stream.to_owned()))
    }

    /// Lock, load, apply `f`, write if the document changed, log. Returns what happened.
    async fn mutate_group<F>(&self, group: &str, f: F) -> Result<Vec<GroupEvent>>
    where
        F: Fn(&mut GroupDoc, &StreamDoc, u64) -> std::result::Result<Vec<GroupEvent>, EngineError>,
    {
        Ok(self.mutate_group_at(group, f).await?.events)
    }

    /// [`Coordinator::mutate_group`], also telling the revision and next deadline of the
    /// group document it left (written or not). One write cycle ([`write`]) per attempt.
    async fn mutate_group_at<F>(&self, group: &str, f: F) -> Result<Mutated>
    where
        F: Fn(&mut GroupDoc, &StreamDoc, u64) -> std::result::Result<Vec<GroupEvent>, EngineError>,
    {
        self.retrying(|| async {
            let mut w = self.open_write(group, None).await?;
            match f(&mut w.doc, &w.stream.doc, w.now) {
                Ok(events) => w.events.extend(events),
                Err(e) => return self.refuse_write(w, e).await,
            }
            self.commit_write(&mut w, None).await?;
            Ok(self.close_write(w))
        })
        .await
    }

    /// After a write of `doc` at `revision`: brings the group's entry in the deadline index
    /// forward to the document's next deadline, if that is earlier. A failure is logged and
    /// remembered: the sweep retries it (until then the member's expiry may come late, never
    /// early).
    async fn lower_deadline(&self, doc: &GroupDoc, revision: u64) {
        if let Some(deadline) = doc.next_deadline_ms() {
            self.schedule(&doc.group, revision, deadline).await;
        }
    }

    /// Brings `group`'s deadline-index entry forward to `deadline` (recorded as seen at
    /// `revision`); on failure remembers it for the next sweep to retry.
    async fn schedule(&self, group: &str, revision: u64, deadline: u64) {
        if let Err(e) = self.store.lower_deadline(group, revision, deadline).await {
            warn!(group, deadline, error = %e, "could not record the group's next deadline; the sweep retries");
            self.cache.owe_deadline(group, revision, deadline);
        }
    }
}

/// Liveness lives beside the document: a member was last heard from at the later of the two.
/// How far coordinators' clocks may differ: a member's liveness found behind what this
/// coordinator wrote by no more than this is another coordinator's later touch, not a
/// rollback.
const CLOCK_SKEW_MS: u64 = 1_000;

fn overlay_liveness(doc: &mut GroupDoc, live: &HashMap<String, u64>) {
    for (id, m) in doc.members.iter_mut() {
        if let Some(&t) = live.get(id) {
            m.last_heartbeat_ms = m.last_heartbeat_ms.max(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// A fencing failure is answered 503 and keeps what it was (its variant) and why.
    #[test]
    fn a_fencing_error_keeps_its_kind_and_source() {
        let timeout = Duration::from_millis(250);
        let e = ServiceError::fencing(
            FencingError::Timeout {
                doing: "writing owner tokens",
                timeout,
            },
            " (the reshard was not made; retry it)",
        );
        assert_eq!(e.code(), ErrorCode::StoreUnavailable);
        assert!(!e.is_conflict(), "not retried as a lost compare-and-set");
        assert_eq!(
            e.to_string(),
            "the data Redis did not answer within 250ms while writing owner tokens \
             (the reshard was not made; retry it)"
        );
        let source = e.source().expect("the fencing error");
        assert!(matches!(
            source.downcast_ref::<FencingError>(),
            Some(FencingError::Timeout {
                doing: "writing owner tokens",
                ..
            })
        ));

        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e = ServiceError::fencing(
            FencingError::Redis {
                doing: "sealing",
                source: refused,
            },
            "",
        );
        let cause = e.source().and_then(Error::source).expect("Redis's error");
        assert!(cause.downcast_ref::<redis::RedisError>().is_some());
    }

    /// A store that lost steady heartbeats' touches (they change no revision) is found out
    /// by what this coordinator wrote: the member is not expired for it, and sessions are
    /// credited with how far the store went back.
    #[tokio::test]
    async fn touches_a_store_lost_are_restored_from_what_was_written() {
        use crate::clock::ManualClock;
        use crate::store::{MemoryStore, buckets_of};
        use rsc_protocol::{CreateGroupRequest, HeartbeatRequest};
        let clock = ManualClock::new(1_000);
        let c = Coordinator::new(
            Arc::new(MemoryStore::new()),
            Arc::new(clock.clone()),
            ServiceConfig::default(),
        );
        c.create_group(&CreateGroupRequest {
            shard_count: Some(2),
            session_timeout_ms: Some(2_000),
            heartbeat_interval_ms: Some(100),
            ..CreateGroupRequest::new("g".parse().unwrap(), "s".parse().unwrap())
        })
        .await
        .unwrap();
        let hb = |epoch, owned| HeartbeatRequest {
            protocol_version: 1,
            member_id: "m".into(),
            member_epoch: epoch,
            owned_shards: Some(owned),
            drained_shards: vec![],
            client: None,
            incarnation: None,
        };
        let r = c
            .heartbeat(&"g".parse().unwrap(), &hb(0, vec![]))
            .await
            .unwrap();
        c.heartbeat(
            &"g".parse().unwrap(),
            &hb(r.member_epoch, r.assignment.clone()),
        )
        .await
        .unwrap();
        // Heartbeats recorded at 1 500 … 3 000 and acknowledged, then lost by the store (a
        // failover to a replica that never received them): it still says 1 000.
        c.cache.touched("g", "m", 3_000);
        clock.set(3_200);
        assert_eq!(c.sweep(&buckets_of(0, 1)).await.unwrap(), 0, "expired");
        let view = c.describe_group(&"g".parse().unwrap()).await.unwrap();
        assert_eq!(view.members.len(), 1);
        let credit = c.outages.lock().unwrap().shift_ms(3_200, 2_000);
        // The store's last heartbeat (1 000, or the millisecond after) to 3 000.
        assert!(
            (1_990..=2_000).contains(&credit),
            "sessions credited with how far the store went back: {credit}"
        );
        // A member really silent since still expires once the credit is over.
        clock.set(7_500);
        assert_eq!(c.sweep(&buckets_of(0, 1)).await.unwrap(), 1);
    }
}
