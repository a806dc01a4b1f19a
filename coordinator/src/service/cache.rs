//! The documents this coordinator last read or wrote, by revision.

use crate::engine::{GroupDoc, StreamDoc};
use crate::store::Versioned;
use std::collections::{BTreeMap, HashMap};
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
    /// Per group, when this coordinator first saw each of its latest revisions (Unix ms):
    /// how far back a rollback went ([`Self::went_back`]).
    seen: Mutex<HashMap<String, SeenRevisions>>,
    /// Per group, the liveness this coordinator wrote for each member (Unix ms): a store
    /// found holding an older one went back in time ([`Self::restore_liveness`]).
    touches: Mutex<HashMap<String, HashMap<String, Touch>>>,
    idle: Duration,
}

/// A member's liveness this coordinator wrote, and whether a store found behind it was
/// reported already.
#[derive(Debug, Default, Clone, Copy)]
struct Touch {
    at_ms: u64,
    reported: bool,
}

/// A group's latest revisions, each with when it was first seen (Unix ms), and when they
/// were last used.
type SeenRevisions = (BTreeMap<u64, u64>, Instant);

/// How many revisions per group [`DocCache::went_back`] remembers.
const SEEN_REVISIONS: usize = 256;

/// A cached group document and when it was last used.
type CachedGroup = (Arc<Versioned<GroupDoc>>, Instant);

impl DocCache {
    pub(super) fn new(idle: Duration) -> Self {
        DocCache {
            groups: Mutex::default(),
            streams: Mutex::default(),
            owed: Mutex::default(),
            seen: Mutex::default(),
            touches: Mutex::default(),
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
        drop(groups);
        // Unused this long, a group may have been deleted and its tombstone collected: its
        // revisions may start again at 1.
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, (_, used)| used.elapsed() < self.idle);
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

    /// Records that `group` was read at `revision` at `now_ms`. When this coordinator saw a
    /// higher revision before, the store went back in time (a rollback): returns how far,
    /// from when it first saw the revision after `revision` (the earliest time the store
    /// can have lost; the oldest remembered when that one is forgotten). A group created
    /// again is not a rollback: revisions continue over its tombstone (PROTOCOL §2).
    pub(super) fn went_back(&self, group: &str, revision: u64, now_ms: u64) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (revs, used) = seen
            .entry(group.to_owned())
            .or_insert_with(|| (BTreeMap::new(), Instant::now()));
        *used = Instant::now();
        let back = match revs.last_key_value() {
            Some((&top, _)) if top > revision => {
                let lost_from = revs
                    .range(revision + 1..)
                    .next()
                    .map_or(now_ms, |(_, &t)| t);
                // Revisions past the rollback will be written again: forget them.
                revs.retain(|&r, _| r <= revision);
                Some(now_ms.saturating_sub(lost_from))
            }
            _ => None,
        };
        revs.entry(revision).or_insert(now_ms);
        while revs.len() > SEEN_REVISIONS {
            revs.pop_first();
        }
        back
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
        drop(groups);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.remove(group);
        drop(seen);
        let mut touches = self.touches.lock().unwrap_or_else(|p| p.into_inner());
        touches.remove(group);
    }

    /// This coordinator recorded `member`'s heartbeat at `at_ms` in the store.
    pub(super) fn touched(&self, group: &str, member: &str, at_ms: u64) {
        let mut touches = self.touches.lock().unwrap_or_else(|p| p.into_inner());
        // On the steady-heartbeat path: allocate the names only the first time.
        if !touches.contains_key(group) {
            touches.insert(group.to_owned(), HashMap::new());
        }
        let Some(members) = touches.get_mut(group) else {
            return;
        };
        if !members.contains_key(member) {
            members.insert(member.to_owned(), Touch::default());
        }
        let Some(t) = members.get_mut(member) else {
            return;
        };
        if at_ms > t.at_ms {
            *t = Touch {
                at_ms,
                reported: false,
            };
        }
    }

    /// Gives each member of `doc` at least the liveness this coordinator wrote for it: a
    /// heartbeat it recorded was heard, whatever a store that lost the write says. Returns
    /// how far the store was behind at most, counting each lost touch once (`None`:
    /// nowhere, or already told). Members no longer in `doc` are forgotten.
    pub(super) fn restore_liveness(&self, group: &str, doc: &mut GroupDoc) -> Option<u64> {
        let mut touches = self.touches.lock().unwrap_or_else(|p| p.into_inner());
        let written = touches.get_mut(group)?;
        written.retain(|m, _| doc.members.contains_key(m));
        let mut behind = None;
        for (id, m) in doc.members.iter_mut() {
            if let Some(t) = written.get_mut(id)
                && t.at_ms > m.last_heartbeat_ms
            {
                if !t.reported {
                    behind = behind.max(Some(t.at_ms - m.last_heartbeat_ms));
                    t.reported = true;
                }
                m.last_heartbeat_ms = t.at_ms;
            }
        }
        behind
    }
}

#[cfg(test)]
mod rollback_tests {
    use super::*;

    #[test]
    fn a_revision_lower_than_one_seen_is_a_rollback_measured_from_the_lost_revision() {
        let c = DocCache::new(Duration::from_secs(60));
        assert_eq!(c.went_back("g", 1, 1_000), None);
        assert_eq!(c.went_back("g", 2, 2_000), None);
        assert_eq!(c.went_back("g", 3, 5_000), None);
        assert_eq!(c.went_back("g", 3, 6_000), None, "read again");
        // The store lost revisions 2 and 3: back to how it was since 2 000.
        assert_eq!(c.went_back("g", 1, 12_000), Some(10_000));
        // Revision 2 written again: not a rollback.
        assert_eq!(c.went_back("g", 2, 12_100), None);
        assert_eq!(c.went_back("other", 1, 12_100), None);
        c.forget_group("g");
        assert_eq!(
            c.went_back("g", 1, 13_000),
            None,
            "deleted, then created again"
        );
    }
}
