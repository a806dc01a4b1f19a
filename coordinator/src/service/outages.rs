//! The driver of [`StoreOutages`]: a [`StoreLayer`] under the coordinator that reports the
//! outcome of every store call, so that no caller's failure goes unseen (a member's
//! heartbeat held on a frozen server counts as much as the expiry sweep's call).

use crate::clock::Clock;
use crate::outage::StoreOutages;
use crate::store::{StoreError, StoreLayer};
use std::future::Future;
use std::sync::{Arc, Mutex};
use tracing::info;

/// Records every store call's success or unavailability in the shared [`StoreOutages`].
#[derive(Debug)]
pub(super) struct OutageWatch {
    pub(super) outages: Arc<Mutex<StoreOutages>>,
    pub(super) clock: Arc<dyn Clock>,
}

impl StoreLayer for OutageWatch {
    async fn around<T: Send>(
        &self,
        _operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let started = self.clock.now_ms();
        let r = call.await;
        let now = self.clock.now_ms();
        match &r {
            Ok(_) => self.answered(now),
            // A lock held by another request is no outage of the store.
            Err(e) if e.is_outage() => self.lock().failed(started, now),
            Err(_) => {}
        }
        r
    }
}

impl OutageWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, StoreOutages> {
        // The record stays usable after a panic elsewhere: it only ever grows a credit.
        self.outages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store answered at `now`: closes an outage if calls were failing.
    fn answered(&self, now: u64) {
        let Some(c) = self.lock().ok(now) else {
            return;
        };
        info!(
            outage_ms = c.length_ms,
            "metadata store reachable again: sessions are extended by the outage's length for \
             one session timeout"
        );
        ::metrics::counter!("rsc_store_outages_total").increment(1);
        ::metrics::gauge!("rsc_store_last_outage_seconds").set(c.length_ms as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn unanswered_calls_count_and_a_busy_lock_does_not() {
        let watch = OutageWatch {
            outages: Arc::default(),
            clock: Arc::new(ManualClock::new(1_000)),
        };
        let ok = watch.around("load_group", async { Ok::<_, StoreError>(()) });
        ok.await.unwrap();
        let busy = StoreError::busy("lock group:g held by another request".into());
        let _ = watch.around("lock", async { Err::<(), _>(busy) }).await;
        assert!(!watch.lock().failing(), "a lock wait is no outage");
        let down = StoreError::timed_out("load_group: no reply".into());
        let _ = watch
            .around("load_group", async { Err::<(), _>(down) })
            .await;
        assert!(watch.lock().failing());
    }
}
