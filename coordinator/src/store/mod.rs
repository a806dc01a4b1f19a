//! Where the group and stream documents live.
//!
//! A [`MetadataStore`] keeps each document with a `revision`; every write is a
//! compare-and-set on it. A per-document lock serializes read-modify-write cycles across
//! coordinator replicas, and liveness (last heartbeat per member) lives beside the group
//! document so that a steady-state heartbeat does not rewrite it. [`MemoryStore`] is the
//! in-process implementation (development default, one coordinator).

mod memory;

pub use memory::MemoryStore;

use crate::engine::{GroupDoc, StreamDoc};
use async_trait::async_trait;
use rsc_protocol::AuditEntry;
use std::collections::HashMap;

/// How many audit entries a store keeps at least; older ones may be dropped (the Redis store
/// trims `rsc:audit` with `XADD … MAXLEN ~ AUDIT_RETAINED`).
pub const AUDIT_RETAINED: usize = 10_000;

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

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or did not answer in time.
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    /// A compare-and-set lost: the document changed since it was read.
    #[error("document {0} changed concurrently")]
    Conflict(String),
    /// A stored document could not be decoded.
    #[error("stored document {key} is unreadable: {reason}")]
    Corrupt {
        /// Store key.
        key: String,
        /// Decoder's message.
        reason: String,
    },
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

/// Persistence of group and stream documents (SPEC §2).
///
/// Locks must be taken stream before group, and at most one group at a time, so that
/// replicas never deadlock.
#[async_trait]
pub trait MetadataStore: Send + Sync + std::fmt::Debug {
    /// Reads a group document.
    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError>;
    /// Reads a stream document.
    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError>;
    /// Writes a group document if its stored revision is `expected` (0: must not exist).
    /// Returns the new revision.
    async fn put_group(&self, doc: &GroupDoc, expected: u64) -> Result<u64, StoreError>;
    /// Deletes a group document (and its liveness) if its stored revision is `expected`.
    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError>;
    /// Writes a stream document if its stored revision is `expected` (0: must not exist).
    async fn put_stream(&self, doc: &StreamDoc, expected: u64) -> Result<u64, StoreError>;
    /// Every group id, sorted.
    async fn list_groups(&self) -> Result<Vec<String>, StoreError>;
    /// Every stream name, sorted.
    async fn list_streams(&self) -> Result<Vec<String>, StoreError>;
    /// Takes the lock on `resource`, waiting a bounded time for it.
    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError>;
    /// Records that `member` of `group` was heard from at `now_ms`.
    async fn touch(&self, group: &str, member: &str, now_ms: u64) -> Result<(), StoreError>;
    /// Forgets the liveness of members that are gone.
    async fn forget(&self, group: &str, members: &[String]) -> Result<(), StoreError>;
    /// Last heartbeat time per member of `group`.
    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError>;
    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// Appends one entry to the audit log (SPEC §7; Redis: `XADD rsc:audit MAXLEN ~`
    /// [`AUDIT_RETAINED`] with the entry as JSON). Keeps at least the newest
    /// [`AUDIT_RETAINED`] entries.
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;
    /// The newest audit entries that match `filter`, newest first, at most `limit`
    /// (Redis: `XREVRANGE rsc:audit + -`, decoding and filtering until `limit` match).
    async fn read_audit(
        &self,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError>;
}
