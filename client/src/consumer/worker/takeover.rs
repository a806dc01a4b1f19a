//! Taking a shard over: the Redis consumer group exists, the previous owner's pending
//! entries are claimed and handled, departed consumers are cleaned up.

use super::conn::WorkerConn;
use super::machine::Event;
use super::{ShardWorker, entry_from};
use crate::consumer::fence;
use crate::consumer::reply::{OrderedClaim, OrderedId};
use crate::message::Entry;
use redis::RedisError;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// How many pending entries one `XAUTOCLAIM` takes over.
const CLAIM_COUNT: usize = 100;

impl ShardWorker {
    /// [`Step::CreateGroup`](super::machine::Step::CreateGroup): `XGROUP CREATE <key>
    /// <group> <start> MKSTREAM` (`BUSYGROUP`: it exists already).
    pub(super) async fn create_group(&self, conn: &mut WorkerConn) -> Event<Arc<Entry>> {
        let r: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.origin.shard_key)
            .arg(&self.origin.group)
            .arg(self.start.xgroup_id())
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match r {
            Ok(()) => {
                info!(
                    start = self.start.xgroup_id(),
                    "created the Redis consumer group"
                );
                Event::GroupReady
            }
            Err(e) if e.code() == Some("BUSYGROUP") => Event::GroupReady,
            Err(e) => {
                warn!(error = %e, "XGROUP CREATE failed; retrying");
                Event::GroupFailed
            }
        }
    }

    /// [`Step::Claim`](super::machine::Step::Claim): takes over a page of the entries
    /// pending in the group from `cursor`, with their delivery counts, admitted through the
    /// hold (ordered resharding). `None` when stopped meanwhile.
    pub(super) async fn claim_page(
        &mut self,
        conn: &mut WorkerConn,
        cursor: &str,
    ) -> Option<Event<Arc<Entry>>> {
        let mut calls = std::mem::take(&mut self.calls);
        let event = match calls.beside(self.claim(conn, cursor)).await {
            Ok(None) => {
                self.flags.refuse("claim");
                Some(Event::Fenced)
            }
            Ok(Some(reply)) => {
                let entries = calls
                    .beside(self.claimed_entries(conn, reply.claimed))
                    .await;
                self.claimed += entries.len();
                if reply.next_stream_id == "0-0" && self.claimed > 0 {
                    info!(claimed = self.claimed, "took over pending entries");
                }
                calls
                    .beside(self.admit(entries, None))
                    .await
                    .map(|ready| Event::Claimed {
                        ready: ready.into_iter().map(Arc::new).collect(),
                        next: reply.next_stream_id,
                        held: self.held(),
                    })
            }
            // The group vanished (e.g. Redis restarted without persistence): nothing is
            // pending any more.
            Err(e) if e.code() == Some("NOGROUP") => Some(Event::ClaimFailed { nogroup: true }),
            Err(e) => {
                warn!(error = %e, "XAUTOCLAIM failed; retrying");
                Some(Event::ClaimFailed { nogroup: false })
            }
        };
        self.calls = calls;
        event
    }

    /// One `XAUTOCLAIM … 0 <cursor> COUNT <n>` (through the fence with an owner token);
    /// `None` when Redis refused the token.
    async fn claim(
        &self,
        conn: &mut WorkerConn,
        cursor: &str,
    ) -> Result<Option<OrderedClaim>, RedisError> {
        if let Some(token) = self.flags.token() {
            return fence::claim(conn, &self.origin, &token, cursor, CLAIM_COUNT).await;
        }
        redis::cmd("XAUTOCLAIM")
            .arg(&self.origin.shard_key)
            .arg(&self.origin.group)
            .arg(&self.origin.member_id)
            .arg(0)
            .arg(cursor)
            .arg("COUNT")
            .arg(CLAIM_COUNT)
            .query_async(conn)
            .await
            .map(Some)
    }

    /// The claimed entries, with Redis's delivery counts.
    async fn claimed_entries(&self, conn: &mut WorkerConn, claimed: Vec<OrderedId>) -> Vec<Entry> {
        let ids: Vec<String> = claimed.iter().map(|s| s.id.clone()).collect();
        let counts = self.delivery_counts(conn, &ids).await;
        claimed
            .into_iter()
            .map(|s| {
                let n = counts
                    .iter()
                    .find(|(id, _)| *id == s.id)
                    .map_or(1, |(_, n)| *n);
                entry_from(s.id, s.map, n)
            })
            .collect()
    }

    /// After the takeover claim: deletes the shard's other consumers that hold no pending
    /// entry (departed members; see [`super::hygiene`]). A failure is only logged: the next
    /// takeover tries again.
    pub(super) async fn clean_consumers(&self, conn: &mut WorkerConn) {
        let o = &self.origin;
        match crate::consumer::hygiene::clean_shard(conn, &o.shard_key, &o.group, &o.member_id)
            .await
        {
            Ok(done) => {
                if !done.deleted.is_empty() {
                    info!(deleted = ?done.deleted, "deleted departed consumers of the shard");
                    metrics::counter!("rsc_client_consumers_deleted_total", "group" => o.group.clone())
                        .increment(done.deleted.len() as u64);
                }
                if !done.kept.is_empty() {
                    info!(kept = ?done.kept, "departed consumers still hold pending entries: kept for a later cleanup");
                }
            }
            Err(e) => debug!(error = %e, "could not clean up the shard's consumers"),
        }
    }

    /// Redis's delivery counts of entries this member now holds (after a claim).
    pub(super) async fn delivery_counts(
        &self,
        conn: &mut WorkerConn,
        ids: &[String],
    ) -> Vec<(String, u64)> {
        let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
            return Vec::new();
        };
        let r: Result<redis::streams::StreamPendingCountReply, RedisError> = redis::cmd("XPENDING")
            .arg(&self.origin.shard_key)
            .arg(&self.origin.group)
            .arg(first)
            .arg(last)
            .arg(ids.len())
            .arg(&self.origin.member_id)
            .query_async(conn)
            .await;
        match r {
            Ok(r) => r
                .ids
                .into_iter()
                .map(|p| (p.id, p.times_delivered as u64))
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}
