//! Where the group and stream documents live.
//!
//! A [`MetadataStore`] keeps each document with a `revision`; every write is a
//! compare-and-set on it. A per-document lock serializes read-modify-write cycles across
//! coordinator replicas, and liveness (last heartbeat per member) lives beside the group
//! document so that a steady-state heartbeat does not rewrite it. [`MemoryStore`] is the
//! in-process implementation (development default, one coordinator); [`RedisStore`] keeps the
//! documents in Redis or Redis Cluster (PROTOCOL §2) and is shared by several coordinators.
//!
//! ## Liveness
//! Each member's liveness is the time it was last heard from. Every touch moves it strictly
//! forward, to `max(now, previous + 1)`, so a decision taken on an older reading (a sweep
//! that found a member silent) can be detected when it is committed: a group write that
//! expires members names the liveness it based the decision on ([`LivenessChange::expired`])
//! and fails with a conflict ([`StoreError::is_conflict`]) if any of them was heard from since. A steady
//! heartbeat touches liveness only while the group document is still at the revision the
//! answer was computed from ([`MetadataStore::touch_if`]). Together these make it impossible
//! for a member to be told "you are alive, keep your shards" while a concurrent writer
//! removes it.

mod error;
mod layer;
mod memory;
mod redis;

pub use error::{StoreError, StoreErrorKind};
pub use layer::{Document, Layered, StoreLayer, Stored};
pub use memory::MemoryStore;
pub use redis::{RedisStore, RedisStoreConfig, STORE_REDIS, validate_key_prefix};

use crate::engine::{GroupDoc, StreamDoc};
pub use crate::revisions::{Note, Record as RevisionRecord};
use async_trait::async_trait;
use rsc_protocol::{AuditEntry, HistorySample};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// How many audit entries a store keeps at least in each of its two logs; older ones may be
/// dropped (the Redis store trims `rsc:audit` and `rsc:audit:refusals` with
/// `XADD … MAXLEN ~ AUDIT_RETAINED`).
pub const AUDIT_RETAINED: usize = 10_000;

/// The two audit logs (PROTOCOL §7), each with its own retention, so that refused requests
/// never push an admitted admin mutation out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditLog {
    /// Admin mutations the access checks admitted (whatever their outcome), and the
    /// coordinator's own actions: `P:audit`.
    Mutations,
    /// Refused requests, merged and counted per client address, principal, route and code,
    /// without their bodies: `P:audit:refusals`.
    Refusals,
}

/// Which entries [`MetadataStore::read_audit`] returns: every set field must match exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only entries whose target group is this one.
    pub group: Option<String>,
    /// Only entries whose target stream is this one.
    pub stream: Option<String>,
}

impl AuditFilter {
    /// Whether `entry` passes the filter.
    pub fn matches(&self, entry: &AuditEntry) -> bool {
        let eq = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        eq(&self.group, &entry.target.group) && eq(&self.stream, &entry.target.stream)
    }
}

/// A document with the revision it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    /// Revision of the stored document (1 for the first write; 0 means "absent" in writes).
    pub revision: u64,
    /// The document.
    pub doc: T,
}

/// Liveness changes committed atomically with a group document write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LivenessChange {
    /// Members the write removes for silence, each with the liveness (ms) the decision was
    /// based on. The write fails with a conflict ([`StoreError::is_conflict`]) if any of them has a newer
    /// liveness now (it was heard from after the decision).
    pub expired: Vec<(String, u64)>,
    /// Members whose liveness the write deletes (they left, expired or were removed).
    pub forget: Vec<String>,
    /// A member heard from at this time (ms), touched in the same write.
    pub touch: Option<(String, u64)>,
}

/// What a conditional liveness touch found ([`MetadataStore::touch_if`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TouchOutcome {
    /// The group was at the expected revision and the member's liveness was moved forward.
    Touched,
    /// The group document is at another revision (or gone): nothing was written.
    Stale,
    /// The member has no liveness, or has been silent longer than allowed: nothing was
    /// written (the caller takes the full path, which expires it if it must).
    NotLive,
}

/// The conditional touch of a steady-state heartbeat ([`MetadataStore::touch_steady`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteadyTouch<'a> {
    /// Group.
    pub group: &'a str,
    /// The group document revision the answer was computed from.
    pub revision: u64,
    /// The group's stream.
    pub stream: &'a str,
    /// The stream document revision the answer was computed from.
    pub stream_revision: u64,
    /// The member heard from.
    pub member: &'a str,
    /// Now (Unix ms).
    pub now_ms: u64,
    /// Longest silence after which the member is no longer live (its session timeout).
    pub max_silence_ms: u64,
}

/// How long a deleted group's revision tombstone is kept by default (then collected). A group
/// created again within it continues the revision sequence; coordinators drop cached
/// documents they have not used for half of it, so none can mistake a re-created group for
/// the old one after the tombstone is gone.
pub const TOMBSTONE_RETENTION: std::time::Duration = std::time::Duration::from_secs(3600);

/// How many buckets the deadline index is split into (PROTOCOL §2 extra: `P:due:{N}`). Each
/// bucket is one sorted set in its own cluster slot, so that no single key is hot and
/// coordinators can divide the buckets among themselves.
pub const DUE_BUCKETS: u32 = 16;

/// The deadline-index bucket of `group` (a stable hash of its name).
pub fn due_bucket(group: &str) -> u32 {
    (rsc_protocol::routing::key_hash(group.as_bytes()) % u64::from(DUE_BUCKETS)) as u32
}

/// The buckets of the deadline index that coordinator number `index` of `count` live ones
/// sweeps: every bucket `b` with `b % count == index`.
pub fn buckets_of(index: usize, count: usize) -> Vec<u32> {
    let count = count.max(1) as u32;
    (0..DUE_BUCKETS)
        .filter(|b| b % count == index as u32 % count)
        .collect()
}

/// One sample of a group's lag history as the store keeps it (PROTOCOL §2.1
/// `P:history:{<group>}`): the sample `GET /v1/groups/{group}/history` answers, and what the
/// next sample's rate is computed from, so that whichever coordinator takes the next sample
/// can compute it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// The sample as the API shows it.
    #[serde(flatten)]
    pub sample: HistorySample,
    /// Entries handled so far (`entries-read − pending`, summed over the shards).
    pub handled: Option<u64>,
    /// Shards that answered (a change means the sums are not comparable).
    pub shards: usize,
}

/// How [`MetadataStore::append_history`] bounds a group's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryBounds {
    /// Records kept (the newest).
    pub keep: usize,
    /// A record less than this much newer than the newest kept one is not appended: another
    /// coordinator sampled the group in the meantime (two replicas that briefly disagree on
    /// who samples it).
    pub min_gap_ms: u64,
    /// The history is dropped this long after its last append (Redis: `PEXPIRE`).
    pub ttl_ms: u64,
}

/// Whose metadata history (PROTOCOL §22): a group document's or a stream document's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DocKind {
    /// `P:revisions:{<group>}`.
    Group,
    /// `P:revisions:stream:{<stream>}`.
    Stream,
}

/// How long a document's metadata history is kept (PROTOCOL §22): the newest
/// `max_revisions` records, none older than `max_age_ms` than the newest write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevisionRetention {
    /// Records kept at most (`--history-max-revisions`, default 1000).
    pub max_revisions: usize,
    /// A record older than this (ms) when a newer one is written is dropped, and a history
    /// not written for this long expires (`--history-max-age`, default 7 days).
    pub max_age_ms: u64,
}

impl Default for RevisionRetention {
    fn default() -> Self {
        RevisionRetention {
            max_revisions: 1000,
            max_age_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

/// What a lock protects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockResource {
    /// A group document.
    Group(String),
    /// A stream document.
    Stream(String),
}

/// A held lock; dropping it releases the lock.
pub struct LockGuard(#[allow(dead_code)] Box<dyn Send + Sync>);

impl LockGuard {
    /// Wraps whatever releases the lock when dropped.
    pub fn new(inner: impl Send + Sync + 'static) -> Self {
        LockGuard(Box::new(inner))
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockGuard")
    }
}

/// Persistence of group and stream documents (PROTOCOL §2).
///
/// No method has a default body: each store answers each call its own (fastest) way, and a
/// decorator is a [`StoreLayer`] inside [`Layered`], which forwards every method.
///
/// Locks must be taken stream before group, and at most one group at a time, so that
/// replicas never deadlock.
#[async_trait]
pub trait MetadataStore: Send + Sync + std::fmt::Debug {
    /// Reads a group document.
    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError>;
    /// Reads a stream document.
    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError>;
    /// Writes a group document if its stored revision is `expected` (0: must not exist),
    /// and appends `note` to its metadata history in the same atomic step (PROTOCOL §22).
    /// Returns the new revision.
    async fn put_group(
        &self,
        doc: &GroupDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError>;
    /// Deletes a group document (its liveness and its metadata history) if its stored
    /// revision is `expected`.
    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError>;
    /// Writes a stream document if its stored revision is `expected` (0: must not exist),
    /// with `note` appended to its metadata history in the same atomic step.
    async fn put_stream(
        &self,
        doc: &StreamDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError>;
    /// The kept metadata history of a document, oldest first (PROTOCOL §22).
    async fn read_revisions(
        &self,
        kind: DocKind,
        name: &str,
    ) -> Result<Vec<RevisionRecord>, StoreError>;
    /// Every group id, sorted.
    async fn list_groups(&self) -> Result<Vec<String>, StoreError>;
    /// Every stream name, sorted.
    async fn list_streams(&self) -> Result<Vec<String>, StoreError>;
    /// Takes the lock on `resource`, waiting a bounded time for it.
    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError>;
    /// Last heartbeat time per member of `group`.
    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError>;
    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// The run id of each server that holds the store, by server (PROTOCOL §2.3): Redis's
    /// `INFO server` `run_id`, of every primary on a cluster (keyed by address; `""` for a
    /// standalone or Sentinel-named server). A new run id is a restarted server or another
    /// one after a failover. The memory store answers one id fixed for the process.
    async fn run_ids(&self) -> Result<BTreeMap<String, String>, StoreError>;
    /// Appends one entry to audit log `log` (PROTOCOL §7; Redis: `XADD rsc:audit MAXLEN ~`
    /// [`AUDIT_RETAINED`] with the entry as JSON, `rsc:audit:refusals` for refusals). Keeps
    /// at least the newest [`AUDIT_RETAINED`] entries of each log.
    async fn append_audit(&self, log: AuditLog, entry: &AuditEntry) -> Result<(), StoreError>;
    /// The newest entries of audit log `log` that match `filter`, newest first, at most
    /// `limit` (Redis: `XREVRANGE <key> + -`, decoding and filtering until `limit` match).
    async fn read_audit(
        &self,
        log: AuditLog,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError>;

    /// Reads a group document and the liveness of its members, at one instant.
    async fn load_group_live(
        &self,
        group: &str,
    ) -> Result<Option<(Versioned<GroupDoc>, HashMap<String, u64>)>, StoreError>;
    /// Writes a group document if its stored revision is `expected` (0: must not exist), and
    /// applies `change` to liveness and appends `note` to its metadata history in the same
    /// atomic step. Fails with
    /// a conflict ([`StoreError::is_conflict`]) when the revision differs or when a member in
    /// `change.expired` was heard from after the liveness given for it. Returns the new
    /// revision.
    async fn put_group_live(
        &self,
        doc: &GroupDoc,
        expected: u64,
        change: &LivenessChange,
        note: &Note,
    ) -> Result<u64, StoreError>;
    /// Touches `member`'s liveness with `now_ms`, only while the group document is at
    /// `revision`, and, when `max_silence_ms` is given, only if the member has liveness no
    /// older than that. Without `max_silence_ms` a missing liveness is created.
    async fn touch_if(
        &self,
        group: &str,
        revision: u64,
        member: &str,
        now_ms: u64,
        max_silence_ms: Option<u64>,
    ) -> Result<TouchOutcome, StoreError>;
    /// The stored revision of a stream document (`None` when absent).
    async fn stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError>;
    /// The stored revision of a group document (`None` when absent), without the document.
    async fn group_revision(&self, group: &str) -> Result<Option<u64>, StoreError>;

    /// Lowers `group`'s entry in the deadline index to `deadline_ms` (creating it when absent),
    /// after a write of the group document at `revision` whose next deadline that is, and
    /// records `revision` as the newest the index has heard of. Called after every group
    /// document write that may have brought a deadline closer (a join, a revocation, …);
    /// it never moves an entry later, so it is safe to call with a stale or early deadline.
    async fn lower_deadline(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: u64,
    ) -> Result<(), StoreError>;

    /// Sets `group`'s entry in the deadline index to `deadline_ms` (`None`: removes it), as
    /// computed by the sweep from the group document at `revision` and the liveness read with
    /// it — but only if no write at a newer revision has lowered the entry since (then the
    /// entry is left as it is and `false` is returned). May move an entry later.
    async fn reschedule(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: Option<u64>,
    ) -> Result<bool, StoreError>;

    /// Claims at most `limit` groups of the deadline-index `buckets` whose entry is due
    /// (`<= now_ms`): each claimed entry moves to `now_ms + claim_ms`, so that concurrent
    /// sweepers never claim the same due group twice, and a sweeper that dies before it
    /// reschedules what it claimed leaves it due again `claim_ms` later for another one.
    async fn claim_due(
        &self,
        buckets: &[u32],
        now_ms: u64,
        claim_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// Registers coordinator `id` as live until `now_ms + ttl_ms`, drops registrations that
    /// ran out, and returns the ids of the live coordinators, sorted: each sweeps the
    /// deadline-index buckets of its rank ([`buckets_of`]).
    async fn register_coordinator(
        &self,
        id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<String>, StoreError>;

    /// Appends `record` to `group`'s lag history, unless the newest record is less than
    /// `bounds.min_gap_ms` older (then nothing is written and `false` is returned); keeps
    /// the newest `bounds.keep` (Redis: the list `P:history:{<group>}` of JSON records,
    /// `append_history.lua`). Deleting the group deletes its history.
    async fn append_history(
        &self,
        group: &str,
        record: &HistoryRecord,
        bounds: HistoryBounds,
    ) -> Result<bool, StoreError>;

    /// The newest `last` records of `group`'s lag history (all with `None`), oldest first;
    /// empty when there is none.
    async fn read_history(
        &self,
        group: &str,
        last: Option<usize>,
    ) -> Result<Vec<HistoryRecord>, StoreError>;

    /// A steady heartbeat's touch: like [`MetadataStore::touch_if`] with
    /// `max_silence_ms`, and [`TouchOutcome::Stale`] as well when the stream document is no
    /// longer at `stream_revision`, checked in one step.
    async fn touch_steady(&self, t: &SteadyTouch<'_>) -> Result<TouchOutcome, StoreError>;

    /// The touches of several steady heartbeats at once (a batch's, PROTOCOL §6): each
    /// outcome, in order, as [`MetadataStore::touch_steady`] gives it.
    async fn touch_steady_batch(
        &self,
        touches: &[SteadyTouch<'_>],
    ) -> Vec<Result<TouchOutcome, StoreError>>;
}
