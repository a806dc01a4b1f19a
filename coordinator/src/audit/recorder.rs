//! Captures the revisions an audited request writes, through a task-local scope.

use crate::store::{Document, Layered, StoreLayer};
use rsc_protocol::RevisionChange;
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

/// A [`StoreLayer`] that reports successful document writes to the current
/// [`RevisionLog`] scope, if any; outside a scope (heartbeats, the sweep) there is nothing to
/// record.
#[derive(Debug, Default)]
pub(crate) struct RevisionRecorder;

impl StoreLayer for RevisionRecorder {
    fn wrote(&self, document: Document<'_>, before: u64, after: u64) {
        let _ = REVISIONS.try_with(|log| {
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(RevisionChange {
                    document: document.to_string(),
                    before,
                    after,
                });
        });
    }
}

/// A [`MetadataStore`](crate::store::MetadataStore) decorator that reports successful
/// document writes to the current [`RevisionLog`] scope, if any. Everything else passes
/// through unchanged.
pub(crate) type RevisionRecordingStore = Layered<RevisionRecorder>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{GroupConfig, GroupDoc, StreamDoc};
    use crate::store::{MemoryStore, MetadataStore};

    #[tokio::test]
    async fn writes_inside_a_scope_are_recorded() {
        let store = RevisionRecordingStore::new(Arc::new(MemoryStore::new()));
        let stream = StreamDoc::new("s", 2, 0).unwrap();
        let log = RevisionLog::new();
        log.scope(async {
            store
                .put_stream(&stream, 0, &crate::revisions::Note::blank())
                .await
                .unwrap();
            let g = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
            store
                .put_group(&g, 0, &crate::revisions::Note::blank())
                .await
                .unwrap();
            store
                .put_group(&g, 1, &crate::revisions::Note::blank())
                .await
                .unwrap();
            // A lost compare-and-set is not a write.
            assert!(
                store
                    .put_group(&g, 1, &crate::revisions::Note::blank())
                    .await
                    .is_err()
            );
            store.delete_group("g", 2).await.unwrap();
        })
        .await;
        // Outside the scope: not recorded, no panic.
        store
            .put_stream(&stream, 1, &crate::revisions::Note::blank())
            .await
            .unwrap();
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
