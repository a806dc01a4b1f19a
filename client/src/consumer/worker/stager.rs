//! A listener's retry stages on one shard (PROTOCOL §2.2 "Retry stages"): what the worker's
//! calls and its stage loop share. The script and the loop are [`super::retries`]'.

use super::ShardFlags;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Moves entries into and between a shard's retry stages (shared by the worker's calls and
/// its stage loop).
#[derive(Clone)]
pub(super) struct Stager {
    /// Each stage's delay.
    pub(super) delays: Arc<[Duration]>,
    /// The shard worker's flags (stopping, lease).
    pub(super) flags: Arc<ShardFlags>,
    /// Rung when an entry was appended to stage 1.
    pub(super) appended: Arc<Notify>,
    /// `rsc_client_retry_stage_entries_total{group,stream,stage}`, per stage.
    pub(super) staged: Arc<[metrics::Counter]>,
}

impl Stager {
    /// The stager of a listener with `delays` (`None`: no stage, retries in place).
    pub(super) fn new(
        delays: &[Duration],
        flags: Arc<ShardFlags>,
        group: &str,
        stream: &str,
    ) -> Option<Self> {
        if delays.is_empty() {
            return None;
        }
        let staged = (1..=delays.len())
            .map(|stage| {
                metrics::counter!("rsc_client_retry_stage_entries_total",
                    "group" => group.to_owned(), "stream" => stream.to_owned(),
                    "stage" => stage.to_string())
            })
            .collect();
        Some(Stager {
            delays: delays.into(),
            flags,
            appended: Arc::new(Notify::new()),
            staged,
        })
    }
}
