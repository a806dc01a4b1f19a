//! The in-process store: the development default, for one coordinator.

use super::{
    AUDIT_RETAINED, AuditFilter, AuditLog, DocKind, HistoryBounds, HistoryRecord, LivenessChange,
    LockGuard, LockResource, MetadataStore, Note, RevisionRecord, RevisionRetention, SteadyTouch,
    StoreError, TouchOutcome, Versioned,
};
use crate::engine::{GroupDoc, StreamDoc};
use async_trait::async_trait;
use rsc_protocol::AuditEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long [`MemoryStore::lock`] waits before answering an unavailable [`StoreError`].
const LOCK_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Inner {
    groups: BTreeMap<String, Versioned<GroupDoc>>,
    streams: BTreeMap<String, Versioned<StreamDoc>>,
    live: HashMap<String, HashMap<String, u64>>,
    /// The audit log of mutations, oldest first, at most `audit_capacity` entries.
    audit: VecDeque<AuditEntry>,
    /// The audit log of refusals, oldest first, at most `audit_capacity` entries.
    refusals: VecDeque<AuditEntry>,
    /// Revision of deleted groups' tombstones, with the time of the deletion: a group
    /// created again continues from there, so that a revision never names two documents (as
    /// in the Redis store). Collected after the tombstone retention.
    tombstones: HashMap<String, (u64, Instant)>,
    /// The deadline index, ordered by due time: (due ms, group).
    due: BTreeSet<(u64, String)>,
    /// Each indexed group's due time and the newest revision that lowered or set it.
    due_at: HashMap<String, (u64, u64)>,
    /// Live coordinators: id → registered until (ms).
    coordinators: HashMap<String, u64>,
    /// Lag history per group, oldest first.
    history: HashMap<String, VecDeque<HistoryRecord>>,
    /// Metadata history per document, oldest first (PROTOCOL §22).
    revisions: HashMap<(DocKind, String), VecDeque<RevisionRecord>>,
}

impl Inner {
    /// Sets `group`'s index entry to `due` (or removes it), recording `revision`.
    fn set_due(&mut self, group: &str, due: Option<u64>, revision: u64) {
        if let Some((old, _)) = self.due_at.remove(group) {
            self.due.remove(&(old, group.to_owned()));
        }
        if let Some(due) = due {
            self.due.insert((due, group.to_owned()));
            self.due_at.insert(group.to_owned(), (due, revision));
        }
    }

    /// Appends `note` (the change that made `revision` of the document) to its metadata
    /// history, then drops what `retention` no longer keeps.
    fn append_revision(
        &mut self,
        kind: DocKind,
        name: &str,
        revision: u64,
        note: &Note,
        retention: RevisionRetention,
    ) {
        let Ok(record) = serde_json::from_str::<RevisionRecord>(&note.record_json(revision)) else {
            return;
        };
        let series = self.revisions.entry((kind, name.to_owned())).or_default();
        series.push_back(record);
        let cutoff = note.t_ms.saturating_sub(retention.max_age_ms);
        while series.len() > retention.max_revisions.max(1)
            || series.front().is_some_and(|r| r.t_ms < cutoff)
        {
            series.pop_front();
        }
    }

    /// Forgets tombstones older than `retention`.
    fn collect_tombstones(&mut self, retention: Duration) {
        self.tombstones
            .retain(|_, (_, deleted)| deleted.elapsed() < retention);
    }
}

/// Documents kept in process memory, with the same revision and lock semantics as the
/// Redis store. State is lost when the process exits.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    locks: Mutex<HashMap<LockResource, Arc<tokio::sync::Mutex<()>>>>,
    audit_capacity: usize,
    tombstone_retention: Duration,
    revision_retention: RevisionRetention,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_audit_capacity(AUDIT_RETAINED)
    }
}

impl MemoryStore {
    /// An empty store keeping the newest [`AUDIT_RETAINED`] audit entries.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose audit ring keeps the newest `capacity` entries (at least 1).
    pub fn with_audit_capacity(capacity: usize) -> Self {
        MemoryStore {
            inner: Mutex::default(),
            locks: Mutex::default(),
            audit_capacity: capacity.max(1),
            tombstone_retention: super::TOMBSTONE_RETENTION,
            revision_retention: RevisionRetention::default(),
        }
    }

    /// Keeps this much metadata history per document (default
    /// [`RevisionRetention::default`]).
    pub fn with_revision_retention(mut self, retention: RevisionRetention) -> Self {
        self.revision_retention = retention;
        self
    }

    /// Keeps a deleted group's revision tombstone this long (default
    /// [`super::TOMBSTONE_RETENTION`]).
    pub fn with_tombstone_retention(mut self, retention: Duration) -> Self {
        self.tombstone_retention = retention;
        self
    }

    /// How many entries the store holds for groups, streams, liveness, tombstones, the
    /// deadline index and locks (what must not grow with deleted groups).
    /// Tombstones past their retention are collected first.
    pub fn footprint(&self) -> usize {
        let mut inner = self.inner();
        inner.collect_tombstones(self.tombstone_retention);
        let locks = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            prune_locks(&mut locks);
            locks.len()
        };
        inner.groups.len()
            + inner.streams.len()
            + inner.live.len()
            + inner.tombstones.len()
            + inner.due.len()
            + inner.due_at.len()
            + locks
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave a half-written document: every
        // mutation below is a single map operation. Recover the data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Drops lock entries nobody holds or awaits (only the map has them).
fn prune_locks(locks: &mut HashMap<LockResource, Arc<tokio::sync::Mutex<()>>>) {
    locks.retain(|_, m| Arc::strong_count(m) > 1);
}

/// Moves a liveness time strictly forward (see the module docs of [`super`]).
fn advance(t: &mut u64, now_ms: u64) {
    *t = now_ms.max(t.saturating_add(1));
}

/// [`MetadataStore::touch_if`] on the locked state.
fn touch_if(
    inner: &mut Inner,
    group: &str,
    revision: u64,
    member: &str,
    now_ms: u64,
    max_silence_ms: Option<u64>,
) -> TouchOutcome {
    if revision == 0 || inner.groups.get(group).map_or(0, |v| v.revision) != revision {
        return TouchOutcome::Stale;
    }
    let live = inner.live.entry(group.to_owned()).or_default();
    match (live.get_mut(member), max_silence_ms) {
        (Some(t), Some(max)) if now_ms.saturating_sub(*t) > max => TouchOutcome::NotLive,
        (Some(t), _) => {
            advance(t, now_ms);
            TouchOutcome::Touched
        }
        (None, Some(_)) => TouchOutcome::NotLive,
        (None, None) => {
            live.insert(member.to_owned(), now_ms);
            TouchOutcome::Touched
        }
    }
}

/// Compare-and-set (`doc`) or compare-and-delete (`None`, returning the tombstone revision)
/// of `key`; a document absent from `map` continues from `tombstone`.
fn cas<T: Clone>(
    map: &mut BTreeMap<String, Versioned<T>>,
    key: &str,
    doc: Option<&T>,
    expected: u64,
    tombstone: u64,
) -> Result<u64, StoreError> {
    let current = map.get(key).map_or(0, |v| v.revision);
    if current != expected {
        return Err(StoreError::conflict(key.to_owned()));
    }
    let next = current.max(tombstone) + 1;
    match doc {
        Some(doc) => {
            let revision = next;
            map.insert(
                key.to_owned(),
                Versioned {
                    revision,
                    doc: doc.clone(),
                },
            );
            Ok(revision)
        }
        None => {
            map.remove(key);
            Ok(next)
        }
    }
}

#[async_trait]
impl MetadataStore for MemoryStore {
    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError> {
        Ok(self.inner().groups.get(group).cloned())
    }

    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError> {
        Ok(self.inner().streams.get(stream).cloned())
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
        let mut inner = self.inner();
        inner.collect_tombstones(self.tombstone_retention);
        let existed = inner.groups.contains_key(group);
        let tombstone = inner.tombstones.get(group).map_or(0, |t| t.0);
        let tombstone = cas(&mut inner.groups, group, None, expected, tombstone)?;
        if existed {
            inner
                .tombstones
                .insert(group.to_owned(), (tombstone, Instant::now()));
            inner.live.remove(group);
            inner.history.remove(group);
            inner.revisions.remove(&(DocKind::Group, group.to_owned()));
            inner.set_due(group, None, 0);
        }
        Ok(())
    }

    async fn put_stream(
        &self,
        doc: &StreamDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError> {
        let mut inner = self.inner();
        let revision = cas(&mut inner.streams, &doc.stream, Some(doc), expected, 0)?;
        let retention = self.revision_retention;
        inner.append_revision(DocKind::Stream, &doc.stream, revision, note, retention);
        Ok(revision)
    }

    async fn read_revisions(
        &self,
        kind: DocKind,
        name: &str,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        let inner = self.inner();
        Ok(inner
            .revisions
            .get(&(kind, name.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn list_groups(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.inner().groups.keys().cloned().collect())
    }

    async fn list_streams(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.inner().streams.keys().cloned().collect())
    }

    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError> {
        let mutex = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            // Amortized: entries of deleted groups must not pile up.
            if locks.len() >= 64 && locks.len().is_power_of_two() {
                prune_locks(&mut locks);
            }
            locks.entry(resource.clone()).or_default().clone()
        };
        match tokio::time::timeout(LOCK_WAIT, mutex.lock_owned()).await {
            Ok(guard) => Ok(LockGuard::new(guard)),
            Err(_) => Err(StoreError::busy(format!(
                "lock on {resource:?} not acquired within {LOCK_WAIT:?}"
            ))),
        }
    }

    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError> {
        Ok(self.inner().live.get(group).cloned().unwrap_or_default())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn run_ids(&self) -> Result<BTreeMap<String, String>, StoreError> {
        // The documents live as long as this store: one id for its whole life.
        Ok(BTreeMap::from([(String::new(), "memory".to_owned())]))
    }

    async fn load_group_live(
        &self,
        group: &str,
    ) -> Result<Option<(Versioned<GroupDoc>, HashMap<String, u64>)>, StoreError> {
        let inner = self.inner();
        Ok(inner.groups.get(group).map(|v| {
            (
                v.clone(),
                inner.live.get(group).cloned().unwrap_or_default(),
            )
        }))
    }

    async fn put_group_live(
        &self,
        doc: &GroupDoc,
        expected: u64,
        change: &LivenessChange,
        note: &Note,
    ) -> Result<u64, StoreError> {
        let mut inner = self.inner();
        let current = inner.groups.get(&doc.group).map_or(0, |v| v.revision);
        if current != expected {
            return Err(StoreError::conflict(doc.group.clone()));
        }
        if let Some(live) = inner.live.get(&doc.group) {
            for (member, seen) in &change.expired {
                if live.get(member).is_some_and(|t| t > seen) {
                    return Err(StoreError::conflict(format!(
                        "{} (member {member} was heard from after it was found silent)",
                        doc.group
                    )));
                }
            }
        }
        if expected == 0 {
            inner.collect_tombstones(self.tombstone_retention);
        }
        let tombstone = inner.tombstones.get(&doc.group).map_or(0, |t| t.0);
        let revision = cas(
            &mut inner.groups,
            &doc.group,
            Some(doc),
            expected,
            tombstone,
        )?;
        let retention = self.revision_retention;
        inner.append_revision(DocKind::Group, &doc.group, revision, note, retention);
        let live = inner.live.entry(doc.group.clone()).or_default();
        for member in &change.forget {
            live.remove(member);
        }
        if let Some((member, now_ms)) = &change.touch {
            match live.get_mut(member) {
                Some(t) => advance(t, *now_ms),
                None => {
                    live.insert(member.clone(), *now_ms);
                }
            }
        }
        Ok(revision)
    }

    async fn touch_if(
        &self,
        group: &str,
        revision: u64,
        member: &str,
        now_ms: u64,
        max_silence_ms: Option<u64>,
    ) -> Result<TouchOutcome, StoreError> {
        Ok(touch_if(
            &mut self.inner(),
            group,
            revision,
            member,
            now_ms,
            max_silence_ms,
        ))
    }

    async fn stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.inner().streams.get(stream).map(|v| v.revision))
    }

    async fn group_revision(&self, group: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.inner().groups.get(group).map(|v| v.revision))
    }

    async fn touch_steady(&self, t: &SteadyTouch<'_>) -> Result<TouchOutcome, StoreError> {
        // Both checks and the touch under one lock: atomic, like the Redis script.
        let mut inner = self.inner();
        if inner.streams.get(t.stream).map(|v| v.revision) != Some(t.stream_revision) {
            return Ok(TouchOutcome::Stale);
        }
        Ok(touch_if(
            &mut inner,
            t.group,
            t.revision,
            t.member,
            t.now_ms,
            Some(t.max_silence_ms),
        ))
    }

    async fn touch_steady_batch(
        &self,
        touches: &[SteadyTouch<'_>],
    ) -> Vec<Result<TouchOutcome, StoreError>> {
        let mut outcomes = Vec::with_capacity(touches.len());
        for t in touches {
            outcomes.push(self.touch_steady(t).await);
        }
        outcomes
    }

    async fn lower_deadline(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: u64,
    ) -> Result<(), StoreError> {
        let mut inner = self.inner();
        if !inner.groups.contains_key(group) {
            return Ok(());
        }
        let (due, seen) = inner.due_at.get(group).copied().unwrap_or((u64::MAX, 0));
        inner.set_due(group, Some(due.min(deadline_ms)), seen.max(revision));
        Ok(())
    }

    async fn reschedule(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut inner = self.inner();
        let seen = inner.due_at.get(group).map_or(0, |e| e.1);
        if seen > revision {
            return Ok(false);
        }
        inner.set_due(group, deadline_ms, revision);
        Ok(true)
    }

    async fn claim_due(
        &self,
        buckets: &[u32],
        now_ms: u64,
        claim_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut inner = self.inner();
        let claimed: Vec<(u64, String)> = inner
            .due
            .iter()
            .take_while(|(due, _)| *due <= now_ms)
            .filter(|(_, g)| buckets.contains(&super::due_bucket(g)))
            .take(limit)
            .cloned()
            .collect();
        for (_, group) in &claimed {
            let seen = inner.due_at.get(group).map_or(0, |e| e.1);
            inner.set_due(group, Some(now_ms.saturating_add(claim_ms)), seen);
        }
        Ok(claimed.into_iter().map(|(_, g)| g).collect())
    }

    async fn register_coordinator(
        &self,
        id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        let mut inner = self.inner();
        inner.coordinators.retain(|_, until| *until > now_ms);
        inner
            .coordinators
            .insert(id.to_owned(), now_ms.saturating_add(ttl_ms));
        let mut ids: Vec<String> = inner.coordinators.keys().cloned().collect();
        ids.sort();
        Ok(ids)
    }

    async fn append_history(
        &self,
        group: &str,
        record: &HistoryRecord,
        bounds: HistoryBounds,
    ) -> Result<bool, StoreError> {
        let mut inner = self.inner();
        let series = inner.history.entry(group.to_owned()).or_default();
        if let Some(newest) = series.back()
            && newest.sample.t_ms.saturating_add(bounds.min_gap_ms) > record.sample.t_ms
        {
            return Ok(false);
        }
        series.push_back(record.clone());
        while series.len() > bounds.keep.max(1) {
            series.pop_front();
        }
        Ok(true)
    }

    async fn read_history(
        &self,
        group: &str,
        last: Option<usize>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let inner = self.inner();
        let Some(series) = inner.history.get(group) else {
            return Ok(Vec::new());
        };
        let skip = last.map_or(0, |n| series.len().saturating_sub(n));
        Ok(series.iter().skip(skip).cloned().collect())
    }

    async fn append_audit(&self, log: AuditLog, entry: &AuditEntry) -> Result<(), StoreError> {
        let mut inner = self.inner();
        let ring = match log {
            AuditLog::Mutations => &mut inner.audit,
            AuditLog::Refusals => &mut inner.refusals,
        };
        while ring.len() >= self.audit_capacity {
            ring.pop_front();
        }
        ring.push_back(entry.clone());
        Ok(())
    }

    async fn read_audit(
        &self,
        log: AuditLog,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let inner = self.inner();
        let ring = match log {
            AuditLog::Mutations => &inner.audit,
            AuditLog::Refusals => &inner.refusals,
        };
        Ok(ring
            .iter()
            .rev()
            .filter(|e| filter.matches(e))
            .take(limit)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsc_protocol::{AuditRequest, AuditResult, AuditTarget};

    fn entry(i: u64, group: &str) -> AuditEntry {
        AuditEntry {
            client_addr: None,
            count: None,
            since_ms: None,
            credential: None,
            time_ms: i,
            principal: "ops".into(),
            action: "group.update".into(),
            target: AuditTarget {
                group: Some(group.into()),
                ..AuditTarget::default()
            },
            request: AuditRequest {
                method: "PATCH".into(),
                path: format!("/v1/groups/{group}"),
                query: None,
                body: None,
            },
            result: AuditResult {
                status: 200,
                code: None,
            },
            revisions: vec![],
        }
    }

    #[tokio::test]
    async fn audit_ring_keeps_the_newest_and_filters() {
        let store = MemoryStore::with_audit_capacity(3);
        for i in 0..5 {
            let g = if i % 2 == 0 { "even" } else { "odd" };
            store
                .append_audit(AuditLog::Mutations, &entry(i, g))
                .await
                .unwrap();
            // The refusals' ring is another: it pushes no mutation out.
            store
                .append_audit(AuditLog::Refusals, &entry(100 + i, g))
                .await
                .unwrap();
        }
        let all = store
            .read_audit(AuditLog::Mutations, 10, &AuditFilter::default())
            .await
            .unwrap();
        let times: Vec<u64> = all.iter().map(|e| e.time_ms).collect();
        assert_eq!(times, vec![4, 3, 2], "newest first, oldest two dropped");
        let even = AuditFilter {
            group: Some("even".into()),
            stream: None,
        };
        let times: Vec<u64> = store
            .read_audit(AuditLog::Mutations, 1, &even)
            .await
            .unwrap()
            .iter()
            .map(|e| e.time_ms)
            .collect();
        assert_eq!(times, vec![4]);
        let none = AuditFilter {
            group: None,
            stream: Some("s".into()),
        };
        assert!(
            store
                .read_audit(AuditLog::Refusals, 10, &none)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
