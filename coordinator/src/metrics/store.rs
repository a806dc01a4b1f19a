//! A [`MetadataStore`] decorator timing every operation and counting failures.

use crate::engine::{GroupDoc, StreamDoc};
use crate::store::{
    AuditFilter, LivenessChange, LockGuard, LockResource, MetadataStore, SteadyTouch, StoreError,
    TouchOutcome, Versioned,
};
use async_trait::async_trait;
use rsc_protocol::AuditEntry;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// Wraps any store: `rsc_store_operation_duration_seconds{operation}` and
/// `rsc_store_errors_total{operation,error}` (`unavailable`, `conflict`, `corrupt`).
#[derive(Debug)]
pub(crate) struct InstrumentedStore {
    inner: Arc<dyn MetadataStore>,
}

impl InstrumentedStore {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<dyn MetadataStore>) -> Self {
        InstrumentedStore { inner }
    }
}

async fn timed<T>(
    operation: &'static str,
    f: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let start = Instant::now();
    let r = f.await;
    metrics::histogram!("rsc_store_operation_duration_seconds", "operation" => operation)
        .record(start.elapsed().as_secs_f64());
    if let Err(e) = &r {
        let kind = match e {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Conflict(_) => "conflict",
            StoreError::Corrupt { .. } => "corrupt",
        };
        metrics::counter!("rsc_store_errors_total", "operation" => operation, "error" => kind)
            .increment(1);
    }
    r
}

#[async_trait]
impl MetadataStore for InstrumentedStore {
    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError> {
        timed("load_group", self.inner.load_group(group)).await
    }
    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError> {
        timed("load_stream", self.inner.load_stream(stream)).await
    }
    async fn put_group(&self, doc: &GroupDoc, expected: u64) -> Result<u64, StoreError> {
        timed("put_group", self.inner.put_group(doc, expected)).await
    }
    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError> {
        timed("delete_group", self.inner.delete_group(group, expected)).await
    }
    async fn put_stream(&self, doc: &StreamDoc, expected: u64) -> Result<u64, StoreError> {
        timed("put_stream", self.inner.put_stream(doc, expected)).await
    }
    async fn list_groups(&self) -> Result<Vec<String>, StoreError> {
        timed("list_groups", self.inner.list_groups()).await
    }
    async fn list_streams(&self) -> Result<Vec<String>, StoreError> {
        timed("list_streams", self.inner.list_streams()).await
    }
    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError> {
        timed("lock", self.inner.lock(resource)).await
    }
    async fn touch(&self, group: &str, member: &str, now_ms: u64) -> Result<(), StoreError> {
        timed("touch", self.inner.touch(group, member, now_ms)).await
    }
    async fn forget(&self, group: &str, members: &[String]) -> Result<(), StoreError> {
        timed("forget", self.inner.forget(group, members)).await
    }
    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError> {
        timed("liveness", self.inner.liveness(group)).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        timed("ping", self.inner.ping()).await
    }
    async fn load_group_live(
        &self,
        group: &str,
    ) -> Result<Option<(Versioned<GroupDoc>, HashMap<String, u64>)>, StoreError> {
        timed("load_group_live", self.inner.load_group_live(group)).await
    }
    async fn put_group_live(
        &self,
        doc: &GroupDoc,
        expected: u64,
        change: &LivenessChange,
    ) -> Result<u64, StoreError> {
        timed(
            "put_group_live",
            self.inner.put_group_live(doc, expected, change),
        )
        .await
    }
    async fn touch_if(
        &self,
        group: &str,
        revision: u64,
        member: &str,
        now_ms: u64,
        max_silence_ms: Option<u64>,
    ) -> Result<TouchOutcome, StoreError> {
        timed(
            "touch_if",
            self.inner
                .touch_if(group, revision, member, now_ms, max_silence_ms),
        )
        .await
    }
    async fn group_revision(&self, group: &str) -> Result<Option<u64>, StoreError> {
        timed("group_revision", self.inner.group_revision(group)).await
    }
    async fn stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        timed("stream_revision", self.inner.stream_revision(stream)).await
    }
    async fn lower_deadline(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: u64,
    ) -> Result<(), StoreError> {
        timed(
            "lower_deadline",
            self.inner.lower_deadline(group, revision, deadline_ms),
        )
        .await
    }
    async fn reschedule(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        timed(
            "reschedule",
            self.inner.reschedule(group, revision, deadline_ms),
        )
        .await
    }
    async fn claim_due(
        &self,
        buckets: &[u32],
        now_ms: u64,
        claim_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        timed(
            "claim_due",
            self.inner.claim_due(buckets, now_ms, claim_ms, limit),
        )
        .await
    }
    async fn register_coordinator(
        &self,
        id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        timed(
            "register_coordinator",
            self.inner.register_coordinator(id, now_ms, ttl_ms),
        )
        .await
    }
    async fn touch_steady(&self, t: &SteadyTouch<'_>) -> Result<TouchOutcome, StoreError> {
        timed("touch_steady", self.inner.touch_steady(t)).await
    }
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        timed("append_audit", self.inner.append_audit(entry)).await
    }
    async fn read_audit(
        &self,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        timed("read_audit", self.inner.read_audit(limit, filter)).await
    }
}
