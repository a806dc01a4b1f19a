//! A [`MetadataStore`](crate::store::MetadataStore) decorator timing every operation and counting failures.

use crate::store::{Layered, StoreError, StoreLayer};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{OnceLock, RwLock};
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

/// `rsc_store_operation_duration_seconds{operation}`: looked up in the recorder once per
/// operation and kept (the look-up builds and hashes the labels; a steady heartbeat's touch
/// would pay it every time).
fn duration(operation: &'static str) -> metrics::Histogram {
    static HANDLES: OnceLock<RwLock<HashMap<&'static str, metrics::Histogram>>> = OnceLock::new();
    let handles = HANDLES.get_or_init(|| {
        // Handles taken before the recorder is installed would record nowhere.
        super::prometheus();
        RwLock::default()
    });
    if let Some(h) = handles
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(operation)
    {
        return h.clone();
    }
    let h = metrics::histogram!("rsc_store_operation_duration_seconds", "operation" => operation);
    handles
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(operation, h.clone());
    h
}

/// Wraps any store in [`StoreMetrics`].
pub(crate) type InstrumentedStore = Layered<StoreMetrics>;
