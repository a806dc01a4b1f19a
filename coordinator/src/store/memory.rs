//! The in-process store: the development default, for one coordinator.

use super::{
    AUDIT_RETAINED, AuditFilter, LockGuard, LockResource, MetadataStore, StoreError, Versioned,
};
use crate::engine::{GroupDoc, StreamDoc};
use async_trait::async_trait;
use rsc_protocol::AuditEntry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long [`MemoryStore::lock`] waits before answering `StoreError::Unavailable`.
const LOCK_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Inner {
    groups: BTreeMap<String, Versioned<GroupDoc>>,
    streams: BTreeMap<String, Versioned<StreamDoc>>,
    live: HashMap<String, HashMap<String, u64>>,
    /// The audit log, oldest first, at most `audit_capacity` entries.
    audit: VecDeque<AuditEntry>,
}

/// Documents kept in process memory, with the same revision and lock semantics as the
/// Redis store. State is lost when the process exits.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    locks: Mutex<HashMap<LockResource, Arc<tokio::sync::Mutex<()>>>>,
    audit_capacity: usize,
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
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave a half-written document: every
        // mutation below is a single map operation. Recover the data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn cas<T: Clone>(
    map: &mut BTreeMap<String, Versioned<T>>,
    key: &str,
    doc: Option<&T>,
    expected: u64,
) -> Result<u64, StoreError> {
    let current = map.get(key).map_or(0, |v| v.revision);
    if current != expected {
        return Err(StoreError::Conflict(key.to_owned()));
    }
    match doc {
        Some(doc) => {
            let revision = current + 1;
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
            Ok(0)
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

    async fn put_group(&self, doc: &GroupDoc, expected: u64) -> Result<u64, StoreError> {
        cas(&mut self.inner().groups, &doc.group, Some(doc), expected)
    }

    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError> {
        let mut inner = self.inner();
        cas(&mut inner.groups, group, None, expected)?;
        inner.live.remove(group);
        Ok(())
    }

    async fn put_stream(&self, doc: &StreamDoc, expected: u64) -> Result<u64, StoreError> {
        cas(&mut self.inner().streams, &doc.stream, Some(doc), expected)
    }

    async fn list_groups(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.inner().groups.keys().cloned().collect())
    }

    async fn list_streams(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.inner().streams.keys().cloned().collect())
    }

    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError> {
        let mutex = self
            .locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(resource.clone())
            .or_default()
            .clone();
        match tokio::time::timeout(LOCK_WAIT, mutex.lock_owned()).await {
            Ok(guard) => Ok(LockGuard::new(guard)),
            Err(_) => Err(StoreError::Unavailable(format!(
                "lock on {resource:?} not acquired within {LOCK_WAIT:?}"
            ))),
        }
    }

    async fn touch(&self, group: &str, member: &str, now_ms: u64) -> Result<(), StoreError> {
        let mut inner = self.inner();
        let t = inner
            .live
            .entry(group.to_owned())
            .or_default()
            .entry(member.to_owned())
            .or_default();
        *t = (*t).max(now_ms);
        Ok(())
    }

    async fn forget(&self, group: &str, members: &[String]) -> Result<(), StoreError> {
        if let Some(live) = self.inner().live.get_mut(group) {
            for m in members {
                live.remove(m);
            }
        }
        Ok(())
    }

    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError> {
        Ok(self.inner().live.get(group).cloned().unwrap_or_default())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        let mut inner = self.inner();
        while inner.audit.len() >= self.audit_capacity {
            inner.audit.pop_front();
        }
        inner.audit.push_back(entry.clone());
        Ok(())
    }

    async fn read_audit(
        &self,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(self
            .inner()
            .audit
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
            store.append_audit(&entry(i, g)).await.unwrap();
        }
        let all = store.read_audit(10, &AuditFilter::default()).await.unwrap();
        let times: Vec<u64> = all.iter().map(|e| e.time_ms).collect();
        assert_eq!(times, vec![4, 3, 2], "newest first, oldest two dropped");
        let even = AuditFilter {
            group: Some("even".into()),
            stream: None,
        };
        let times: Vec<u64> = store
            .read_audit(1, &even)
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
        assert!(store.read_audit(10, &none).await.unwrap().is_empty());
    }
}
