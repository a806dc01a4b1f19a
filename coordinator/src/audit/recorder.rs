//! Captures the revisions an audited request writes, through a task-local scope.

use crate::engine::{GroupDoc, StreamDoc};
use crate::store::{
    AuditFilter, LivenessChange, LockGuard, LockResource, MetadataStore, SteadyTouch, StoreError,
    TouchOutcome, Versioned,
};
use async_trait::async_trait;
use rsc_protocol::{AuditEntry, RevisionChange};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

tokio::task_local! {
    static REVISIONS: Arc<Mutex<Vec<RevisionChange>>>;
}

/// The document writes made while a future runs in [`RevisionLog::scope`].
#[derive(Debug, Clone, Default)]
pub(crate) struct RevisionLog(Arc<Mutex<Vec<RevisionChange>>>);

impl RevisionLog {
    /// An empty log.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Runs `f`; writes through a [`RevisionRecordingStore`] inside it are recorded here.
    pub(crate) async fn scope<F: Future>(&self, f: F) -> F::Output {
        REVISIONS.scope(self.0.clone(), f).await
    }

    /// The writes recorded so far, in order.
    pub(crate) fn take(&self) -> Vec<RevisionChange> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn record(document: String, before: u64, after: u64) {
    // Outside a scope (heartbeats, the sweep) there is nothing to record.
    let _ = REVISIONS.try_with(|log| {
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(RevisionChange {
                document,
                before,
                after,
            });
    });
}

/// A [`MetadataStore`] decorator that reports successful document writes to the current
/// [`RevisionLog`] scope, if any. Everything else passes through unchanged.
#[derive(Debug)]
pub(crate) struct RevisionRecordingStore {
    inner: Arc<dyn MetadataStore>,
}

impl RevisionRecordingStore {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<dyn MetadataStore>) -> Self {
        RevisionRecordingStore { inner }
    }
}

#[async_trait]
impl MetadataStore for RevisionRecordingStore {
    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError> {
        self.inner.load_group(group).await
    }
    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError> {
        self.inner.load_stream(stream).await
    }
    async fn put_group(&self, doc: &GroupDoc, expected: u64) -> Result<u64, StoreError> {
        let after = self.inner.put_group(doc, expected).await?;
        record(format!("group:{}", doc.group), expected, after);
        Ok(after)
    }
    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError> {
        self.inner.delete_group(group, expected).await?;
        record(format!("group:{group}"), expected, 0);
        Ok(())
    }
    async fn put_stream(&self, doc: &StreamDoc, expected: u64) -> Result<u64, StoreError> {
        let after = self.inner.put_stream(doc, expected).await?;
        record(format!("stream:{}", doc.stream), expected, after);
        Ok(after)
    }
    async fn list_groups(&self) -> Result<Vec<String>, StoreError> {
        self.inner.list_groups().await
    }
    async fn list_streams(&self) -> Result<Vec<String>, StoreError> {
        self.inner.list_streams().await
    }
    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError> {
        self.inner.lock(resource).await
    }
    async fn touch(&self, group: &str, member: &str, now_ms: u64) -> Result<(), StoreError> {
        self.inner.touch(group, member, now_ms).await
    }
    async fn forget(&self, group: &str, members: &[String]) -> Result<(), StoreError> {
        self.inner.forget(group, members).await
    }
    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError> {
        self.inner.liveness(group).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
    async fn load_group_live(
        &self,
        group: &str,
    ) -> Result<Option<(Versioned<GroupDoc>, HashMap<String, u64>)>, StoreError> {
        self.inner.load_group_live(group).await
    }
    async fn put_group_live(
        &self,
        doc: &GroupDoc,
        expected: u64,
        change: &LivenessChange,
    ) -> Result<u64, StoreError> {
        let after = self.inner.put_group_live(doc, expected, change).await?;
        record(format!("group:{}", doc.group), expected, after);
        Ok(after)
    }
    async fn touch_if(
        &self,
        group: &str,
        revision: u64,
        member: &str,
        now_ms: u64,
        max_silence_ms: Option<u64>,
    ) -> Result<TouchOutcome, StoreError> {
        self.inner
            .touch_if(group, revision, member, now_ms, max_silence_ms)
            .await
    }
    async fn group_revision(&self, group: &str) -> Result<Option<u64>, StoreError> {
        self.inner.group_revision(group).await
    }
    async fn stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        self.inner.stream_revision(stream).await
    }
    async fn lower_deadline(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: u64,
    ) -> Result<(), StoreError> {
        self.inner
            .lower_deadline(group, revision, deadline_ms)
            .await
    }
    async fn reschedule(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        self.inner.reschedule(group, revision, deadline_ms).await
    }
    async fn claim_due(
        &self,
        buckets: &[u32],
        now_ms: u64,
        claim_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.claim_due(buckets, now_ms, claim_ms, limit).await
    }
    async fn register_coordinator(
        &self,
        id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.register_coordinator(id, now_ms, ttl_ms).await
    }
    async fn touch_steady(&self, t: &SteadyTouch<'_>) -> Result<TouchOutcome, StoreError> {
        self.inner.touch_steady(t).await
    }
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.inner.append_audit(entry).await
    }
    async fn read_audit(
        &self,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.read_audit(limit, filter).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{GroupConfig, StreamDoc};
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn writes_inside_a_scope_are_recorded() {
        let store = RevisionRecordingStore::new(Arc::new(MemoryStore::new()));
        let stream = StreamDoc::new("s", 2, 0).unwrap();
        let log = RevisionLog::new();
        log.scope(async {
            store.put_stream(&stream, 0).await.unwrap();
            let g = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
            store.put_group(&g, 0).await.unwrap();
            store.put_group(&g, 1).await.unwrap();
            // A lost compare-and-set is not a write.
            assert!(store.put_group(&g, 1).await.is_err());
            store.delete_group("g", 2).await.unwrap();
        })
        .await;
        // Outside the scope: not recorded, no panic.
        store.put_stream(&stream, 1).await.unwrap();
        let got: Vec<(String, u64, u64)> = log
            .take()
            .into_iter()
            .map(|c| (c.document, c.before, c.after))
            .collect();
        assert_eq!(
            got,
            vec![
                ("stream:s".into(), 0, 1),
                ("group:g".into(), 0, 1),
                ("group:g".into(), 1, 2),
                ("group:g".into(), 2, 0),
            ]
        );
    }
}
