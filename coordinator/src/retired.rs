//! Deletion of retired shard keys from the data Redis (PROTOCOL §6).
//!
//! A scale-down retires shards once every group drained them; their keys stay in the data
//! Redis while the reshard may still be rolled back. Once the latest reshard of the stream
//! is `delay` past completion (default: the rollback window), a background task deletes them
//! with `UNLINK` (Redis frees the memory off its main thread), a bounded number per pass,
//! each pass under the stream's lock with the document re-read right before the delete
//! ([`Coordinator::purge_retired`]): a shard that is active or draining again is never
//! deleted.
//!
//! The keys come from the stream document (no `SCAN`), so a Redis Cluster needs nothing
//! more: the cluster connection splits the one `UNLINK` per slot and sends each part to the
//! node that owns it.
//!
//! Each deletion is logged, audited (principal `rsc-coordinator`, action
//! `stream.delete_retired_keys`) and counted (`rsc_retired_keys_deleted_total`); failures
//! are counted (`rsc_retired_key_delete_errors_total`) and retried on the next pass. The
//! keys still kept are the gauge `rsc_stream_retired_keys_kept`.

use crate::audit::Auditor;
use crate::service::{Coordinator, PurgedKeys};
use rsc_protocol::{AuditEntry, AuditRequest, AuditResult, AuditTarget, RevisionChange};
use rsc_redis::LazyRedis;
use std::time::Duration;
use tracing::{info, warn};

/// Keys deleted per pass, over every stream.
pub(crate) const KEYS_PER_PASS: usize = 64;

/// Longest one deletion (connecting included) may take; past it the pass counts a failure
/// and the next pass retries.
pub(crate) const DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of the retired-key cleaner.
#[derive(Debug, Clone)]
pub(crate) struct RetiredKeyCleaner {
    /// The data Redis (standalone or cluster).
    pub redis: LazyRedis,
    /// How long after a reshard completed its retired keys are kept (ms).
    pub delay_ms: u64,
    /// Time between passes.
    pub every: Duration,
}

impl RetiredKeyCleaner {
    /// The pass period for a delay: a tenth of it, within 250 ms..=30 s.
    pub(crate) fn period_for(delay_ms: u64) -> Duration {
        Duration::from_millis(delay_ms / 10)
            .clamp(Duration::from_millis(250), Duration::from_secs(30))
    }

    /// Runs passes forever (abort the task to stop it).
    pub(crate) async fn run(self, coordinator: Coordinator, auditor: Auditor) {
        let data = self.redis;
        info!(
            delay_ms = self.delay_ms,
            every_ms = self.every.as_millis() as u64,
            "retired shard keys are deleted after the delay"
        );
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let delete = |keys: Vec<String>| {
                let data = data.clone();
                async move {
                    let unlink = async {
                        let mut conn = data.get().await?;
                        redis::cmd("UNLINK")
                            .arg(&keys)
                            .query_async::<i64>(&mut conn)
                            .await
                    };
                    match tokio::time::timeout(DELETE_TIMEOUT, unlink).await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("UNLINK timed out after {DELETE_TIMEOUT:?}")),
                    }
                }
            };
            match coordinator
                .purge_retired(self.delay_ms, KEYS_PER_PASS, delete)
                .await
            {
                Ok(purged) => {
                    for p in purged {
                        metrics::counter!("rsc_retired_keys_deleted_total", "stream" => p.stream.clone())
                            .increment(p.keys.len() as u64);
                        auditor.record(audit_entry(auditor.now_ms(), &p)).await;
                    }
                }
                Err(e) => warn!(error = %e, "retired-key pass failed; retrying next pass"),
            }
        }
    }
}

fn audit_entry(now_ms: u64, p: &PurgedKeys) -> AuditEntry {
    AuditEntry {
        client_addr: None,
        count: None,
        since_ms: None,
        credential: None,
        time_ms: now_ms,
        principal: "rsc-coordinator".into(),
        action: "stream.delete_retired_keys".into(),
        target: AuditTarget {
            stream: Some(p.stream.clone()),
            ..AuditTarget::default()
        },
        request: AuditRequest {
            method: "INTERNAL".into(),
            path: format!("/v1/streams/{}", p.stream),
            query: None,
            body: Some(serde_json::json!({ "shards": p.shards, "keys": p.keys })),
        },
        result: AuditResult {
            status: 200,
            code: None,
        },
        revisions: vec![RevisionChange {
            document: format!("stream:{}", p.stream),
            before: p.revision_before,
            after: p.revision_after,
        }],
    }
}
