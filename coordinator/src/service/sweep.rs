//! The expiry sweep over the deadline index, and the purge of retired shard keys.

use super::{Coordinator, Result, ServiceError};
use crate::engine::{GroupDoc, GroupEvent};
use crate::store::Versioned;
use futures::StreamExt;
use std::future::Future;
use tracing::{debug, info, warn};

/// How many due groups one sweep visits at once.
const SWEEP_CONCURRENCY: usize = 16;

impl Coordinator {
    /// The group as the expiry sweep needs it. When the cached document is still the stored
    /// one only the liveness is read: the sweep runs every 250 ms, and decoding a document of
    /// 1,000 members × 4,096 shards that often cost a third of the steady-heartbeat throughput.
    async fn sweep_view(&self, group: &str) -> Result<Versioned<GroupDoc>> {
        if let Some(cached) = self.cache.group(group)
            && self.store.group_revision(group).await? == Some(cached.revision)
        {
            let live = self.store.liveness(group).await?;
            let mut v = Versioned::clone(&cached);
            self.overlay_liveness(group, &mut v.doc, &live);
            return Ok(v);
        }
        self.load_group(group).await
    }

    /// The stream's layout version: from the cache while its revision is the stored one.
    async fn layout_version(&self, stream: &str) -> Result<u64> {
        if let Some(cached) = self.cache.stream(stream)
            && self.store.stream_revision(stream).await? == Some(cached.revision)
        {
            return Ok(cached.doc.layout_version);
        }
        Ok(self.load_stream(stream).await?.doc.layout_version)
    }

    /// Expires silent members and members that outlived their rebalance timeout, in the
    /// groups of the deadline-index `buckets` that are due. Returns how many members were
    /// removed. A group that fails stays claimed and is due again after the claim
    /// ([`super::ServiceConfig::claim_ms`]); the first failure is returned after the others ran.
    ///
    /// Only due groups are visited: every group document write records the group's next
    /// deadline (session or revocation) in the index, and a visit that finds nothing due
    /// (members heartbeated since) reschedules the group at its real next deadline.
    pub async fn sweep(&self, buckets: &[u32]) -> Result<usize> {
        for (group, revision, deadline) in self.cache.take_owed() {
            if let Err(e) = self.store.lower_deadline(&group, revision, deadline).await {
                self.cache.owe_deadline(&group, revision, deadline);
                return Err(e.into());
            }
        }
        self.cache.evict_idle();
        let now = self.now();
        let due = match self
            .store
            .claim_due(buckets, now, self.config.claim_ms, self.config.sweep_batch)
            .await
        {
            Ok(due) => due,
            Err(e) => return Err(e.into()),
        };
        if due.is_empty() {
            return Ok(0);
        }
        ::metrics::counter!("rsc_sweep_visits_total").increment(due.len() as u64);
        let visits: Vec<(String, Result<usize>)> = futures::stream::iter(due)
            .map(|group| async move {
                let r = self.visit(&group).await;
                (group, r)
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .collect()
            .await;
        let mut removed = 0;
        let mut failure = None;
        for (group, r) in visits {
            match r {
                Ok(n) => removed += n,
                Err(e) => {
                    warn!(group, error = %e, "expiry sweep of the group failed; it is due again after the claim");
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// One due group: expire what is due (and apply a layout change the group missed), then
    /// reschedule the group at its next deadline.
    #[tracing::instrument(level = "debug", skip(self))]
    async fn visit(&self, group: &str) -> Result<usize> {
        let v = match self.sweep_view(group).await {
            Ok(v) => v,
            Err(ServiceError::GroupNotFound(_)) => {
                // Deleted: its index entry goes too.
                self.store.reschedule(group, u64::MAX, None).await?;
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        let now = self.now();
        let layout_stale = match self.layout_version(&v.doc.stream).await {
            Ok(layout) => layout != v.doc.layout_version,
            Err(ServiceError::StreamNotFound(_)) => false,
            Err(e) => return Err(e),
        };
        // After a store outage, deadlines are judged on a clock set back by its length.
        let judged = self.expiry_now(now, v.doc.config.session_timeout_ms);
        let due = v.doc.next_deadline_ms().is_some_and(|t| t <= judged);
        let (removed, revision, deadline) = if due || layout_stale {
            let m = match self
                .mutate_group_at(group, |_doc, _stream, _now| Ok(Vec::new()))
                .await
            {
                Ok(m) => m,
                Err(ServiceError::GroupNotFound(_) | ServiceError::StreamNotFound(_)) => {
                    return Ok(0);
                }
                Err(e) => return Err(e),
            };
            let removed = m
                .events
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        GroupEvent::SessionExpired(_) | GroupEvent::RebalanceTimedOut(_)
                    )
                })
                .count();
            (removed, m.revision, m.next_deadline_ms)
        } else {
            (0, v.revision, v.doc.next_deadline_ms())
        };
        let deadline = deadline.map(|t| t + (now - judged));
        let set = self.store.reschedule(group, revision, deadline).await?;
        debug!(group, due, layout_stale, ?deadline, set, "swept");
        Ok(removed)
    }

    /// Deletes the keys of retired shards whose latest reshard is at least `delay_ms` past
    /// completion (so no rollback can bring them back), at most `budget` keys in all.
    ///
    /// Per stream, under the stream's lock: reload the document, take the shards still
    /// retired (never one active or draining again, e.g. after a rollback or a new reshard),
    /// `delete` their keys in the data Redis, then forget them in the document. A reshard
    /// waits for the lock, so it cannot reactivate a shard between the check and the delete.
    /// A failed delete leaves the document as it was (retried on the next pass).
    pub async fn purge_retired<F, Fut>(
        &self,
        delay_ms: u64,
        budget: usize,
        delete: F,
    ) -> Result<Vec<PurgedKeys>>
    where
        F: Fn(Vec<String>) -> Fut,
        Fut: Future<Output = std::result::Result<(), String>>,
    {
        let mut out = Vec::new();
        let mut left = budget;
        for name in self.store.list_streams().await? {
            if left == 0 {
                break;
            }
            // A cheap look without the lock first: most streams have nothing to delete.
            let Some(v) = self.store.load_stream(&name).await? else {
                continue;
            };
            if v.doc.deletable_retired(self.now(), delay_ms).is_empty() {
                continue;
            }
            let _lock = self.lock_stream(&name).await?;
            let Some(Versioned { revision, mut doc }) = self.store.load_stream(&name).await? else {
                continue;
            };
            let mut shards = doc.deletable_retired(self.now(), delay_ms);
            shards.truncate(left);
            if shards.is_empty() {
                continue;
            }
            let keys: Vec<String> = shards
                .iter()
                .map(|&s| rsc_protocol::routing::shard_key(&name, s))
                .collect();
            if let Err(e) = delete(with_retry_streams(&keys, &doc.groups)).await {
                ::metrics::counter!("rsc_retired_key_delete_errors_total", "stream" => name.clone())
                    .increment(1);
                warn!(stream = %name, ?shards, error = %e, "could not delete retired shard keys; retrying next pass");
                continue;
            }
            let before = doc.clone();
            doc.forget_retired(&shards);
            let note = self.note(crate::revisions::Cause::Reshard, Some(&before), &doc);
            let after = self.store.put_stream(&doc, revision, &note).await?;
            info!(stream = %name, ?shards, ?keys, "deleted retired shard keys");
            left -= shards.len();
            out.push(PurgedKeys {
                stream: name,
                shards,
                keys,
                revision_before: revision,
                revision_after: after,
            });
        }
        Ok(out)
    }
}

/// The shard keys and, with them, every retry stream their groups may have left there
/// (PROTOCOL §2.2 "Retry stages": a shard is drained only once they are empty, so they hold
/// nothing; all in the shard's slot, so a Redis Cluster deletes them in the same call).
fn with_retry_streams(keys: &[String], groups: &std::collections::BTreeSet<String>) -> Vec<String> {
    let stages = rsc_protocol::retry::MAX_STAGES as u32;
    let mut all = keys.to_vec();
    for key in keys {
        for group in groups {
            all.extend(
                (1..=stages).map(|stage| rsc_protocol::routing::retry_key(key, group, stage)),
            );
        }
    }
    all
}

/// Retired shard keys one [`Coordinator::purge_retired`] pass deleted on one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgedKeys {
    /// The stream.
    pub stream: String,
    /// The retired shards.
    pub shards: Vec<u32>,
    /// Their keys, deleted from the data Redis.
    pub keys: Vec<String>,
    /// The stream document's revision before the pass.
    pub revision_before: u64,
    /// And after.
    pub revision_after: u64,
}
