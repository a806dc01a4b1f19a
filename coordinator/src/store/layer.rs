//! Store decorators that cannot skip a method.
//!
//! A decorator (metrics, audit recording, a test's gate) is a [`StoreLayer`]: it hooks the
//! calls it cares about and nothing else. [`Layered`] is the one [`MetadataStore`] that
//! forwards every method to the store it wraps, written once here; a method added to the
//! trait fails to compile until it is forwarded here, so no decorator silently takes a
//! slower path (the trait has no default bodies for the same reason).

use super::{
    AuditFilter, AuditLog, HistoryBounds, HistoryRecord, LivenessChange, LockGuard, LockResource,
    MetadataStore, SteadyTouch, StoreError, TouchOutcome, Versioned,
};
use super::{DocKind, Note, RevisionRecord};
use crate::engine::{GroupDoc, StreamDoc};
use async_trait::async_trait;
use rsc_protocol::AuditEntry;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

/// A document a successful write changed ([`StoreLayer::wrote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Document<'a> {
    /// A group document.
    Group(&'a str),
    /// A stream document.
    Stream(&'a str),
}

impl std::fmt::Display for Document<'_> {
    /// `group:NAME` or `stream:NAME`, as the audit log names documents.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Document::Group(g) => write!(f, "group:{g}"),
            Document::Stream(s) => write!(f, "stream:{s}"),
        }
    }
}

/// What a decorator adds to the store it wraps. Both hooks default to doing nothing; the
/// forwarding itself is [`Layered`]'s.
pub trait StoreLayer: Send + Sync + std::fmt::Debug + 'static {
    /// Runs `call`, one call of the wrapped store; `operation` is the method's name
    /// (`"load_group"`, `"touch_steady"`, …). The call starts when the returned future is
    /// first polled; the default runs it as it is.
    fn around<T: Send>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        let _ = operation;
        call
    }

    /// Called after a successful write moved `document` from revision `before` to `after`
    /// (0: deleted), inside [`Self::around`].
    fn wrote(&self, document: Document<'_>, before: u64, after: u64) {
        let _ = (document, before, after);
    }

    /// Runs after a successful write stored `write` (the document as written, at its new
    /// revision), inside [`Self::around`]; the write's caller waits for it. It cannot fail
    /// the write (a decorator that mirrors documents elsewhere retries on its own).
    fn stored(&self, write: Stored<'_>) -> impl Future<Output = ()> + Send {
        let _ = write;
        async {}
    }

    /// Runs before a group document is deleted; an error refuses the delete (nothing was
    /// deleted). Used to remove a copy first, so that no copy outlives its document.
    fn deleting(&self, group: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = group;
        async { Ok(()) }
    }
}

/// A document a successful write stored ([`StoreLayer::stored`]).
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// A group document at this revision.
    Group(&'a GroupDoc, u64),
    /// A stream document at this revision.
    Stream(&'a StreamDoc, u64),
}

/// A [`MetadataStore`] that forwards every call to `inner` through `layer`'s hooks.
#[derive(Debug)]
pub struct Layered<L> {
    inner: Arc<dyn MetadataStore>,
    layer: L,
}

impl<L: StoreLayer> Layered<L> {
    /// Wraps `inner` in `layer`.
    pub fn with_layer(inner: Arc<dyn MetadataStore>, layer: L) -> Self {
        Layered { inner, layer }
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

impl<L: StoreLayer + Default> Layered<L> {
    /// Wraps `inner` in a default `L`.
    pub fn new(inner: Arc<dyn MetadataStore>) -> Self {
        Self::with_layer(inner, L::default())
    }
}

#[async_trait]
impl<L: StoreLayer> MetadataStore for Layered<L> {
    async fn load_group(&self, group: &str) -> Result<Option<Versioned<GroupDoc>>, StoreError> {
        let call = self.inner.load_group(group);
        self.layer.around("load_group", call).await
    }
    async fn load_stream(&self, stream: &str) -> Result<Option<Versioned<StreamDoc>>, StoreError> {
        let call = self.inner.load_stream(stream);
        self.layer.around("load_stream", call).await
    }
    async fn put_group(
        &self,
        doc: &GroupDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError> {
        let call = async {
            let after = self.inner.put_group(doc, expected, note).await?;
            self.layer
                .wrote(Document::Group(&doc.group), expected, after);
            self.layer.stored(Stored::Group(doc, after)).await;
            Ok(after)
        };
        self.layer.around("put_group", call).await
    }
    async fn delete_group(&self, group: &str, expected: u64) -> Result<(), StoreError> {
        let call = async {
            self.layer.deleting(group).await?;
            self.inner.delete_group(group, expected).await?;
            self.layer.wrote(Document::Group(group), expected, 0);
            Ok(())
        };
        self.layer.around("delete_group", call).await
    }
    async fn put_stream(
        &self,
        doc: &StreamDoc,
        expected: u64,
        note: &Note,
    ) -> Result<u64, StoreError> {
        let call = async {
            let after = self.inner.put_stream(doc, expected, note).await?;
            self.layer
                .wrote(Document::Stream(&doc.stream), expected, after);
            self.layer.stored(Stored::Stream(doc, after)).await;
            Ok(after)
        };
        self.layer.around("put_stream", call).await
    }
    async fn read_revisions(
        &self,
        kind: DocKind,
        name: &str,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        let call = self.inner.read_revisions(kind, name);
        self.layer.around("read_revisions", call).await
    }
    async fn list_groups(&self) -> Result<Vec<String>, StoreError> {
        let call = self.inner.list_groups();
        self.layer.around("list_groups", call).await
    }
    async fn list_streams(&self) -> Result<Vec<String>, StoreError> {
        let call = self.inner.list_streams();
        self.layer.around("list_streams", call).await
    }
    async fn lock(&self, resource: &LockResource) -> Result<LockGuard, StoreError> {
        let call = self.inner.lock(resource);
        self.layer.around("lock", call).await
    }
    async fn liveness(&self, group: &str) -> Result<HashMap<String, u64>, StoreError> {
        let call = self.inner.liveness(group);
        self.layer.around("liveness", call).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        let call = self.inner.ping();
        self.layer.around("ping", call).await
    }
    async fn run_ids(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let call = self.inner.run_ids();
        self.layer.around("run_ids", call).await
    }
    async fn append_audit(&self, log: AuditLog, entry: &AuditEntry) -> Result<(), StoreError> {
        let call = self.inner.append_audit(log, entry);
        self.layer.around("append_audit", call).await
    }
    async fn read_audit(
        &self,
        log: AuditLog,
        limit: usize,
        filter: &AuditFilter,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let call = self.inner.read_audit(log, limit, filter);
        self.layer.around("read_audit", call).await
    }
    async fn load_group_live(
        &self,
        group: &str,
    ) -> Result<Option<(Versioned<GroupDoc>, HashMap<String, u64>)>, StoreError> {
        let call = self.inner.load_group_live(group);
        self.layer.around("load_group_live", call).await
    }
    async fn put_group_live(
        &self,
        doc: &GroupDoc,
        expected: u64,
        change: &LivenessChange,
        note: &Note,
    ) -> Result<u64, StoreError> {
        let call = async {
            let after = self
                .inner
                .put_group_live(doc, expected, change, note)
                .await?;
            self.layer
                .wrote(Document::Group(&doc.group), expected, after);
            self.layer.stored(Stored::Group(doc, after)).await;
            Ok(after)
        };
        self.layer.around("put_group_live", call).await
    }
    async fn touch_if(
        &self,
        group: &str,
        revision: u64,
        member: &str,
        now_ms: u64,
        max_silence_ms: Option<u64>,
    ) -> Result<TouchOutcome, StoreError> {
        let call = self
            .inner
            .touch_if(group, revision, member, now_ms, max_silence_ms);
        self.layer.around("touch_if", call).await
    }
    async fn stream_revision(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let call = self.inner.stream_revision(stream);
        self.layer.around("stream_revision", call).await
    }
    async fn group_revision(&self, group: &str) -> Result<Option<u64>, StoreError> {
        let call = self.inner.group_revision(group);
        self.layer.around("group_revision", call).await
    }
    async fn lower_deadline(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: u64,
    ) -> Result<(), StoreError> {
        let call = self.inner.lower_deadline(group, revision, deadline_ms);
        self.layer.around("lower_deadline", call).await
    }
    async fn reschedule(
        &self,
        group: &str,
        revision: u64,
        deadline_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        let call = self.inner.reschedule(group, revision, deadline_ms);
        self.layer.around("reschedule", call).await
    }
    async fn claim_due(
        &self,
        buckets: &[u32],
        now_ms: u64,
        claim_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let call = self.inner.claim_due(buckets, now_ms, claim_ms, limit);
        self.layer.around("claim_due", call).await
    }
    async fn register_coordinator(
        &self,
        id: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        let call = self.inner.register_coordinator(id, now_ms, ttl_ms);
        self.layer.around("register_coordinator", call).await
    }
    async fn touch_steady(&self, t: &SteadyTouch<'_>) -> Result<TouchOutcome, StoreError> {
        let call = self.inner.touch_steady(t);
        self.layer.around("touch_steady", call).await
    }
    async fn touch_steady_batch(
        &self,
        touches: &[SteadyTouch<'_>],
    ) -> Vec<Result<TouchOutcome, StoreError>> {
        // One call for the layer: it fails (for the layer's accounting) with the first
        // failure among the touches; each touch keeps its own outcome.
        let mut outcomes = Vec::new();
        let call = async {
            outcomes = self.inner.touch_steady_batch(touches).await;
            match outcomes.iter().find_map(|r| r.as_ref().err()) {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            }
        };
        let _ = self.layer.around("touch_steady_batch", call).await;
        outcomes
    }
    async fn append_history(
        &self,
        group: &str,
        record: &HistoryRecord,
        bounds: HistoryBounds,
    ) -> Result<bool, StoreError> {
        let call = self.inner.append_history(group, record, bounds);
        self.layer.around("append_history", call).await
    }
    async fn read_history(
        &self,
        group: &str,
        last: Option<usize>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let call = self.inner.read_history(group, last);
        self.layer.around("read_history", call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::RevisionRecordingStore;
    use crate::engine::GroupConfig;
    use crate::metrics::InstrumentedStore;
    use crate::store::MemoryStore;
    use std::sync::Mutex;

    /// Records the name of every call that reaches the store it wraps.
    #[derive(Debug, Default)]
    struct Calls(Arc<Mutex<Vec<&'static str>>>);

    impl StoreLayer for Calls {
        fn around<T: Send>(
            &self,
            operation: &'static str,
            call: impl Future<Output = Result<T, StoreError>> + Send,
        ) -> impl Future<Output = Result<T, StoreError>> + Send {
            self.0.lock().unwrap().push(operation);
            call
        }
    }

    #[tokio::test]
    async fn decorated_stores_keep_the_fast_paths() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let counted = Layered::with_layer(Arc::new(MemoryStore::new()), Calls(calls.clone()));
        let store =
            RevisionRecordingStore::new(Arc::new(InstrumentedStore::new(Arc::new(counted))));
        let stream = StreamDoc::new("s", 2, 0).unwrap();
        store
            .put_stream(&stream, 0, &crate::revisions::Note::blank())
            .await
            .unwrap();
        let group = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
        store
            .put_group(&group, 0, &crate::revisions::Note::blank())
            .await
            .unwrap();
        calls.lock().unwrap().clear();
        let touch = SteadyTouch {
            group: "g",
            revision: 1,
            stream: "s",
            stream_revision: 1,
            member: "m",
            now_ms: 1_000,
            max_silence_ms: 500,
        };
        store.touch_steady(&touch).await.unwrap();
        assert_eq!(store.group_revision("g").await.unwrap(), Some(1));
        let touched = store.touch_steady_batch(&[touch, touch]).await;
        assert_eq!(touched.len(), 2);
        assert_eq!(
            *calls.lock().unwrap(),
            ["touch_steady", "group_revision", "touch_steady_batch"],
            "each call reaches the inner store as itself, not as a default's parts"
        );
    }

    /// Records what `stored` and `deleting` saw; refuses deletes while `refuse` is set.
    #[derive(Debug, Default)]
    struct Copies {
        seen: Mutex<Vec<String>>,
        refuse: std::sync::atomic::AtomicBool,
    }

    impl StoreLayer for Arc<Copies> {
        async fn stored(&self, write: Stored<'_>) {
            let line = match write {
                Stored::Group(g, r) => format!("group {} at {r}", g.group),
                Stored::Stream(s, r) => format!("stream {} at {r}", s.stream),
            };
            self.seen.lock().unwrap().push(line);
        }

        async fn deleting(&self, group: &str) -> Result<(), StoreError> {
            self.seen.lock().unwrap().push(format!("deleting {group}"));
            if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(StoreError::unavailable("no copy store".into()));
            }
            Ok(())
        }
    }

    /// Every committed document write reaches `stored` with the document and its new
    /// revision (a refused compare-and-set does not), and `deleting` runs before a delete,
    /// which it can refuse (the document is then still there).
    #[tokio::test]
    async fn every_committed_write_is_seen_whole_and_a_delete_can_be_refused_first() {
        let copies = Arc::new(Copies::default());
        let store = Layered::with_layer(Arc::new(MemoryStore::new()), copies.clone());
        let stream = StreamDoc::new("s", 2, 0).unwrap();
        store
            .put_stream(&stream, 0, &crate::revisions::Note::blank())
            .await
            .unwrap();
        let group = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
        store
            .put_group(&group, 0, &crate::revisions::Note::blank())
            .await
            .unwrap();
        store
            .put_group_live(
                &group,
                1,
                &LivenessChange::default(),
                &crate::revisions::Note::blank(),
            )
            .await
            .unwrap();
        assert!(
            store
                .put_group(&group, 1, &crate::revisions::Note::blank())
                .await
                .is_err(),
            "a lost compare-and-set"
        );
        copies
            .refuse
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(store.delete_group("g", 2).await.is_err());
        assert_eq!(
            store.group_revision("g").await.unwrap(),
            Some(2),
            "not deleted"
        );
        copies
            .refuse
            .store(false, std::sync::atomic::Ordering::Relaxed);
        store.delete_group("g", 2).await.unwrap();
        assert_eq!(
            *copies.seen.lock().unwrap(),
            [
                "stream s at 1",
                "group g at 1",
                "group g at 2",
                "deleting g",
                "deleting g"
            ]
        );
    }
}
