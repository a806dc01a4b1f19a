//! The documents this coordinator last read or wrote, by revision.

use crate::engine::{GroupDoc, StreamDoc};
use crate::store::Versioned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The documents this coordinator last read or wrote, by revision: what a steady heartbeat
/// is answered from (after checking the revisions in the store). A group document unused for
/// `idle` is dropped (see [`ServiceConfig::cache_idle`]).
///
/// A poisoned lock is taken over (`into_inner`), which cannot fail open: nothing is answered
/// from a cached document before the store confirmed its revision
/// ([`crate::store::MetadataStore::touch_steady`]), so a stale or half-updated entry only
/// sends a heartbeat down the full path.
#[derive(Debug)]
pub(super) struct DocCache {
    groups: Mutex<HashMap<String, CachedGroup>>,
    streams: Mutex<HashMap<String, Arc<Versioned<StreamDoc>>>>,
    /// Deadline-index updates that failed: group → (revision, deadline), retried by the sweep.
    owed: Mutex<HashMap<String, (u64, u64)>>,
    idle: Duration,
}

/// A cached group document and when it was last used.
type CachedGroup = (Arc<Versioned<GroupDoc>>, Instant);

impl DocCache {
    pub(super) fn new(idle: Duration) -> Self {
        DocCache {
            groups: Mutex::default(),
            streams: Mutex::default(),
            owed: Mutex::default(),
            idle,
        }
    }

    pub(super) fn group(&self, group: &str) -> Option<Arc<Versioned<GroupDoc>>> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let (doc, used) = groups.get_mut(group)?;
        if used.elapsed() >= self.idle {
            groups.remove(group);
            return None;
        }
        *used = Instant::now();
        Some(doc.clone())
    }

    /// Drops group documents unused for longer than `idle`.
    pub(super) fn evict_idle(&self) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|_, (_, used)| used.elapsed() < self.idle);
    }

    pub(super) fn stream(&self, stream: &str) -> Option<Arc<Versioned<StreamDoc>>> {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.get(stream).cloned()
    }

    pub(super) fn put_group(&self, revision: u64, doc: GroupDoc) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.insert(
            doc.group.clone(),
            (Arc::new(Versioned { revision, doc }), Instant::now()),
        );
    }

    pub(super) fn put_stream(&self, v: Versioned<StreamDoc>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.insert(v.doc.stream.clone(), Arc::new(v));
    }

    /// Remembers a deadline-index update that failed, for the next sweep to retry.
    pub(super) fn owe_deadline(&self, group: &str, revision: u64, deadline: u64) {
        let mut owed = self.owed.lock().unwrap_or_else(|p| p.into_inner());
        let entry = owed.entry(group.to_owned()).or_insert((revision, deadline));
        *entry = (entry.0.max(revision), entry.1.min(deadline));
    }

    pub(super) fn take_owed(&self) -> Vec<(String, u64, u64)> {
        let mut owed = self.owed.lock().unwrap_or_else(|p| p.into_inner());
        owed.drain().map(|(g, (r, d))| (g, r, d)).collect()
    }

    pub(super) fn forget_group(&self, group: &str) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.remove(group);
    }
}
