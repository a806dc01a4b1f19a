//! A [`MetadataStore`](crate::store::MetadataStore) decorator timing every operation and counting failures.

use crate::store::{Layered, StoreError, StoreLayer};
use std::future::Future;
use std::time::Instant;

/// Times every operation of the store it wraps and counts failures:
/// `rsc_store_operation_duration_seconds{operation}` and
/// `rsc_store_errors_total{operation,error}` (`unavailable`, `conflict`, `corrupt`).
#[derive(Debug, Default)]
pub(crate) struct StoreMetrics;

impl StoreLayer for StoreMetrics {
    async fn around<T: Send>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let r = call.await;
        duration(operation).record(start.elapsed().as_secs_f64());
        if let Err(e) = &r {
            let kind = e.kind().as_str();
            metrics::counter!("rsc_store_errors_total", "operation" => operation, "error" => kind)
                .increment(1);
        }
        r
    }
}

/// `rsc_store_operation_duration_seconds{operation}` (a steady heartbeat's touch records
/// here every time).
fn duration(operation: &'static str) -> metrics::Histogram {
    static HANDLES: super::Handles<&'static str, metrics::Histogram> = super::Handles::new();
    HANDLES.get(operation, || {
        let h =
            metrics::histogram!("rsc_store_operation_duration_seconds", "operation" => operation);
        (operation, h)
    })
}

/// Wraps any store in [`StoreMetrics`].
pub(crate) type InstrumentedStore = Layered<StoreMetrics>;
