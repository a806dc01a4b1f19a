//! Batch listeners: the shard worker hands its entries over in batches of up to
//! `max_batch`, waits up to `linger` for a fuller batch, and settles each message on its own
//! (acknowledged, retried as part of a smaller batch, or dead-lettered).

use super::conn::WorkerConn;
use super::{Outcome, ShardWorker};
use crate::consumer::backoff::retry_delay;
use crate::consumer::reply::OrderedRead;
use crate::handler::{FailureAction, HandlerError};
use crate::listener::{AckMode, ErasedBatch};
use crate::message::Entry;
use futures::FutureExt;
use redis::RedisError;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Instrument, debug, info_span, warn};

impl ShardWorker {
    /// [`ShardWorker::handle_batch`] for a batch listener. `false` when stopped before the
    /// end.
    pub(super) async fn handle_batches(
        &mut self,
        conn: &mut WorkerConn,
        mut entries: Vec<Entry>,
        flush: bool,
        handler: Arc<dyn ErasedBatch>,
    ) -> bool {
        let settings = self.shared.listener.settings.clone();
        // Only new entries read in lease mode linger for company: not a takeover claim, not a
        // re-read after a lost reply, not a guarded read (its reads go through the fence).
        if !flush
            && !settings.linger.is_zero()
            && entries.len() < settings.max_batch
            && self.pending_from.is_none()
            && self.flags.token().is_none()
            && !self.linger_more(conn, &mut entries, &settings).await
        {
            self.flush_acks(conn).await;
            return false;
        }
        let entries: Vec<Arc<Entry>> = entries.into_iter().map(Arc::new).collect();
        let mut complete = true;
        for chunk in entries.chunks(settings.max_batch) {
            if *self.shared.paused.borrow() {
                self.flush_acks(conn).await;
            }
            if !self.wait_unpaused().await || self.shared.lease_expired() {
                complete = false;
                break;
            }
            if !self.process_batch(conn, chunk, &handler).await {
                complete = false;
                break;
            }
        }
        if flush || !complete {
            self.flush_acks(conn).await;
        }
        complete
    }

    /// Waits `linger` (unless stopped), then reads what arrived meanwhile, up to
    /// `max_batch` in all, without blocking. `false` when stopped.
    async fn linger_more(
        &mut self,
        conn: &mut WorkerConn,
        entries: &mut Vec<Entry>,
        settings: &crate::listener::Settings,
    ) -> bool {
        if !self.pause_for(settings.linger).await {
            return false;
        }
        let room = settings.max_batch - entries.len();
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
            Ok(reply) => entries.extend(
                reply
                    .into_iter()
                    .flat_map(|r| r.keys)
                    .flat_map(|k| k.ids)
                    .map(|s| super::entry_from(s.id, s.map, 1)),
            ),
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
        true
    }

    /// Runs the batch handler on `chunk` until every message is settled: handled, or
    /// dead-lettered (its retries exhausted, or the handler said so). Failed messages are
    /// retried together, after the longest backoff any of them asked for. `false` when
    /// stopped before every message was settled (the unsettled ones stay pending).
    async fn process_batch(
        &mut self,
        conn: &mut WorkerConn,
        chunk: &[Arc<Entry>],
        handler: &Arc<dyn ErasedBatch>,
    ) -> bool {
        let mut pending: Vec<(Arc<Entry>, u32)> = chunk.iter().map(|e| (e.clone(), 1)).collect();
        loop {
            let verdicts = self.call_batch(handler, &pending).await;
            let Some((retry, delay)) = self.settle(pending, verdicts).await else {
                return false;
            };
            if retry.is_empty() {
                return true;
            }
            self.shared.metrics.retried.increment(retry.len() as u64);
            self.flush_acks(conn).await;
            if !self.pause_for(delay).await {
                return false;
            }
            pending = retry;
        }
    }

    /// Calls the batch handler once on `pending` (entry, attempt): each message's verdict,
    /// in order (`None`: handled). A payload that does not decode fails its message before
    /// the call; a panic or an error for the whole batch fails every message not failed yet.
    async fn call_batch(
        &self,
        handler: &Arc<dyn ErasedBatch>,
        pending: &[(Arc<Entry>, u32)],
    ) -> Vec<Option<HandlerError>> {
        let span = info_span!(
            "batch",
            entries = pending.len(),
            first_id = %pending[0].0.id,
            attempt = pending.iter().map(|(_, a)| *a).max().unwrap_or(1)
        );
        crate::otel::link_all(&span, pending.iter().map(|(e, _)| &**e));
        let started = Instant::now();
        let (decode_failed, call) = handler.call(pending, &self.origin);
        let mut verdicts: Vec<Option<HandlerError>> = pending.iter().map(|_| None).collect();
        for (i, e) in decode_failed {
            verdicts[i] = Some(e);
        }
        let Some(call) = call else {
            return verdicts;
        };
        let result = AssertUnwindSafe(call).catch_unwind().instrument(span).await;
        self.shared
            .metrics
            .duration
            .record(started.elapsed().as_secs_f64());
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

    /// Settles each message by its verdict: a handled one is acknowledged (with
    /// [`AckMode::Auto`]), a failed one dead-lettered when its retries are exhausted or the
    /// handler said so, else kept for the retry. Returns the messages to retry (next
    /// attempt) and the longest delay any asked for; `None` when stopped while
    /// dead-lettering.
    async fn settle(
        &mut self,
        pending: Vec<(Arc<Entry>, u32)>,
        verdicts: Vec<Option<HandlerError>>,
    ) -> Option<(Vec<(Arc<Entry>, u32)>, Duration)> {
        let shared = self.shared.clone();
        let settings = &shared.listener.settings;
        let m = &shared.metrics;
        let auto = settings.ack_mode == AckMode::Auto;
        let mut retry = Vec::new();
        let mut delay = Duration::ZERO;
        for ((entry, attempt), verdict) in pending.into_iter().zip(verdicts) {
            let Some(err) = verdict else {
                m.handled.increment(1);
                if auto {
                    self.acks.push(entry.id.clone());
                }
                continue;
            };
            m.failed.increment(1);
            if err.action() == FailureAction::DeadLetter || attempt > settings.max_retries {
                match self.dead_letter(&entry, &err, attempt).await {
                    Outcome::DeadLettered => self.acks.push(entry.id.clone()),
                    _ => return None,
                }
                continue;
            }
            delay = delay.max(match err.action() {
                FailureAction::RetryAfter(d) => d,
                _ => retry_delay(attempt, settings.retry_min, settings.retry_max),
            });
            debug!(entry_id = %entry.id, attempt, error = %err, "batch message failed; will retry");
            retry.push((entry, attempt + 1));
        }
        Some((retry, delay))
    }
}
