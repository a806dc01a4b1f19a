//! Taking a shard over: the Redis consumer group exists, the previous owner's pending
//! entries are claimed and handled, departed consumers are cleaned up.

use super::conn::WorkerConn;
use super::{ShardWorker, entry_from};
use crate::consumer::backoff::Backoff;
use crate::consumer::fence;
use crate::consumer::reply::{OrderedClaim, OrderedId};
use crate::message::Entry;
use redis::RedisError;
use tracing::{debug, info, warn};

/// How many pending entries one `XAUTOCLAIM` takes over.
const CLAIM_COUNT: usize = 100;

impl ShardWorker {
    /// `XGROUP CREATE <key> <group> <start> MKSTREAM`, retried until it works or the worker
    /// is stopped.
    pub(super) async fn ensure_group(&self, conn: &mut WorkerConn, backoff: &mut Backoff) -> bool {
        loop {
            if self.stop.is_cancelled() {
                return false;
            }
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
                    backoff.reset();
                    return true;
                }
                Err(e) if e.code() == Some("BUSYGROUP") => {
                    backoff.reset();
                    return true;
                }
                Err(e) => {
                    warn!(error = %e, "XGROUP CREATE failed; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Takes over and handles every entry pending in the group on this shard. `false` when
    /// stopped.
    pub(super) async fn claim_pending(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
    ) -> bool {
        let mut cursor = "0-0".to_owned();
        let mut claimed_total = 0usize;
        loop {
            if !self.wait_unpaused().await {
                return false;
            }
            match self.claim(conn, &cursor).await {
                Ok(None) => {
                    self.flags.refuse("claim");
                    return false;
                }
                Ok(Some(reply)) => {
                    backoff.reset();
                    let entries = self.claimed_entries(conn, reply.claimed).await;
                    claimed_total += entries.len();
                    if !entries.is_empty() && !self.handle_claimed(conn, entries).await {
                        return false;
                    }
                    if reply.next_stream_id == "0-0" {
                        if claimed_total > 0 {
                            info!(claimed = claimed_total, "took over pending entries");
                        }
                        return true;
                    }
                    cursor = reply.next_stream_id;
                }
                Err(e) if e.code() == Some("NOGROUP") => {
                    // The group vanished (e.g. Redis restarted without persistence): nothing
                    // is pending any more.
                    return self.ensure_group(conn, backoff).await;
                }
                Err(e) => {
                    warn!(error = %e, "XAUTOCLAIM failed; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Handles claimed entries (held for their parents where ordered resharding says so)
    /// until each is settled, through the dispatch's lanes. `false` when stopped.
    async fn handle_claimed(&mut self, conn: &mut WorkerConn, entries: Vec<Entry>) -> bool {
        match self.admit(entries).await {
            Some(ready) => {
                self.dispatch
                    .offer(ready.into_iter().map(std::sync::Arc::new));
                self.settle_all(conn).await
            }
            None => false,
        }
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
