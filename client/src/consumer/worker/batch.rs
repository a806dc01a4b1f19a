//! Batch listeners: one attempt of the batch handler on a call's entries (their verdicts,
//! one per message), and the linger for a fuller batch.

use super::ShardWorker;
use super::conn::WorkerConn;
use crate::consumer::reply::OrderedRead;
use crate::handler::HandlerError;
use crate::listener::ErasedBatch;
use crate::message::{Entry, Origin};
use futures::FutureExt;
use redis::RedisError;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tracing::{Instrument, debug, info_span, warn};

/// Calls the batch handler once on `pending` (entry, attempt): each message's verdict, in
/// order (`None`: handled). A payload that does not decode fails its message before the call;
/// a panic or an error for the whole batch fails every message not failed yet.
pub(super) async fn call_batch(
    handler: &Arc<dyn ErasedBatch>,
    pending: &[(Arc<Entry>, u32)],
    origin: &Arc<Origin>,
) -> Vec<Option<HandlerError>> {
    let span = info_span!(
        "batch",
        entries = pending.len(),
        first_id = %pending[0].0.id,
        attempt = pending.iter().map(|(_, a)| *a).max().unwrap_or(1)
    );
    crate::otel::link_all(&span, pending.iter().map(|(e, _)| &**e));
    let (decode_failed, call) = handler.call(pending, origin);
    let mut verdicts: Vec<Option<HandlerError>> = pending.iter().map(|_| None).collect();
    for (i, e) in decode_failed {
        verdicts[i] = Some(e);
    }
    let Some(call) = call else {
        return verdicts;
    };
    let result = AssertUnwindSafe(call).catch_unwind().instrument(span).await;
    let all = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => {
            for (id, err) in e.each {
                match pending.iter().position(|(entry, _)| entry.id == id) {
                    Some(i) if verdicts[i].is_none() => verdicts[i] = Some(err),
                    Some(_) => {}
                    None => {
                        warn!(entry_id = %id, "the batch handler failed an entry that is not in the batch")
                    }
                }
            }
            e.all
        }
        Err(panic) => Some(HandlerError::panicked(panic.as_ref())),
    };
    if let Some(all) = all {
        for v in verdicts.iter_mut().filter(|v| v.is_none()) {
            *v = Some(all.duplicate());
        }
    }
    verdicts
}

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
