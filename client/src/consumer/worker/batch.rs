//! Batch listeners: the linger for a fuller batch (a batch's attempt is in
//! [`crate::layer`]).

use super::ShardWorker;
use super::conn::WorkerConn;
use crate::consumer::reply::OrderedRead;
use crate::message::Entry;
use redis::RedisError;
use std::sync::atomic::Ordering;
use tracing::debug;

impl ShardWorker {
    /// A batch listener with a `linger`: after a read of new entries that returned fewer
    /// than `max_batch`, waits `linger` (unless stopped), then reads what arrived meanwhile,
    /// up to `max_batch` in all, without blocking. Only new entries read in lease mode with
    /// ordering `none` linger for company: not a takeover claim, not a re-read after a lost
    /// reply, not a guarded read (its reads go through the fence), not under ordered
    /// resharding (an entry read while lingering would bypass the ordering check).
    pub(super) async fn linger(
        &mut self,
        conn: &mut WorkerConn,
        mut entries: Vec<Entry>,
        from: &str,
    ) -> Vec<Entry> {
        let settings = &self.shared.listener.settings;
        let (linger, max) = (settings.linger, settings.max_batch);
        if !self.shared.listener.is_batch()
            || from != ">"
            || linger.is_zero()
            || entries.len() >= max
            || self.pending_from.is_some()
            || self.flags.token().is_some()
            || self.shared.ordered.load(Ordering::Relaxed)
        {
            return entries;
        }
        let mut calls = std::mem::take(&mut self.calls);
        let lingered = calls.beside(self.pause_for(linger)).await;
        self.calls = calls;
        if !lingered {
            return entries;
        }
        let room = (max - entries.len()).min(self.dispatch.room()).max(1);
        let r: Result<Option<OrderedRead>, RedisError> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.origin.group)
            .arg(&self.origin.member_id)
            .arg("COUNT")
            .arg(room)
            .arg("STREAMS")
            .arg(&self.origin.shard_key)
            .arg(">")
            .query_async(conn)
            .await;
        match r {
            Ok(reply) => {
                let more: Vec<Entry> = reply
                    .into_iter()
                    .flat_map(|r| r.keys)
                    .flat_map(|k| k.ids)
                    .map(|s| super::entry_from(s.id, s.map, 1))
                    .collect();
                if let Some(last) = more.last() {
                    self.cursor.read_entries(&last.id);
                }
                entries.extend(more);
            }
            // What the lost reply delivered is read again from this member's pending entries.
            Err(e) => {
                debug!(error = %e, "linger read failed");
                self.pending_from = Some(
                    entries
                        .last()
                        .map_or_else(|| "0".to_owned(), |e| e.id.clone()),
                );
            }
        }
        entries
    }
}
