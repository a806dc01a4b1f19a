//! Handling entries: the handler with its retries, dead letters, and the order of
//! acknowledgements.

use super::conn::WorkerConn;
use super::{Outcome, ShardWorker};
use crate::consumer::backoff::{Backoff, retry_delay};
use crate::handler::{FailureAction, HandlerError};
use crate::listener::AckMode;
use crate::message::Entry;
use futures::FutureExt;
use redis::RedisError;
use rsc_protocol::entry as fields;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tracing::{Instrument, debug, info_span, warn};

impl ShardWorker {
    /// Handles entries in order. `false` when stopped before the end of the batch.
    ///
    /// Acknowledgements are sent in one `XACK` per batch: at the end when `flush` is set (or
    /// when stopped), otherwise with the next read; and early before anything that may wait
    /// (a pause, a retry delay), so that a handled entry is not left pending for long.
    pub(super) async fn handle_batch(
        &mut self,
        conn: &mut WorkerConn,
        entries: Vec<Entry>,
        flush: bool,
    ) -> bool {
        let Some(entries) = self.admit(entries).await else {
            return false;
        };
        if !self.shared.ordered.load(Ordering::Relaxed)
            && let crate::listener::HandlerKind::Batch(h) = &self.shared.listener.handler
        {
            // Ordering none: batches may linger for company (reads past `admit`).
            let h = h.clone();
            return self.handle_batches(conn, entries, flush, h).await;
        }
        let mut complete = self.run_entries(conn, entries).await;
        if complete {
            complete = self.release_held_now(conn).await;
        }
        if flush || !complete {
            self.flush_acks(conn).await;
        }
        complete
    }

    /// Handles entries in order; `false` when stopped before the end (the rest stays
    /// pending for the next owner). A batch listener gets them as batches, without
    /// lingering (an entry read while lingering would bypass the ordering check).
    pub(super) async fn run_entries(&mut self, conn: &mut WorkerConn, entries: Vec<Entry>) -> bool {
        if let crate::listener::HandlerKind::Batch(h) = &self.shared.listener.handler {
            let h = h.clone();
            return self.handle_batches(conn, entries, true, h).await;
        }
        let auto = self.shared.listener.settings.ack_mode == AckMode::Auto;
        let mut complete = true;
        for entry in entries {
            if *self.shared.paused.borrow() {
                self.flush_acks(conn).await;
            }
            if !self.wait_unpaused().await || self.shared.lease_expired() {
                // Stopped, or the lease ran out: the rest stays pending for the next owner.
                complete = false;
                break;
            }
            let entry = Arc::new(entry);
            match self.process(conn, &entry).await {
                Outcome::Handled => {
                    if auto {
                        self.acks.push(entry.id.clone());
                    }
                }
                Outcome::DeadLettered => self.acks.push(entry.id.clone()),
                Outcome::Abandoned => {
                    complete = false;
                    break;
                }
            }
        }
        complete
    }

    /// Runs the handler with retries; dead-letters when retries are exhausted or the handler
    /// asks for it.
    pub(super) async fn process(&mut self, conn: &mut WorkerConn, entry: &Arc<Entry>) -> Outcome {
        let shared = self.shared.clone();
        let settings = &shared.listener.settings;
        let m = &shared.metrics;
        let mut attempt = 1u32;
        loop {
            let span = info_span!("message", entry_id = %entry.id, attempt);
            crate::otel::continue_trace(&span, entry);
            let started = Instant::now();
            let call =
                self.shared
                    .listener
                    .handler
                    .call(entry.clone(), self.origin.clone(), attempt);
            let result = AssertUnwindSafe(call).catch_unwind().instrument(span).await;
            m.duration.record(started.elapsed().as_secs_f64());
            let err = match result {
                Ok(Ok(())) => {
                    m.handled.increment(1);
                    return Outcome::Handled;
                }
                Ok(Err(e)) => e,
                Err(panic) => HandlerError::panicked(panic.as_ref()),
            };
            m.failed.increment(1);
            let dead = err.action() == FailureAction::DeadLetter || attempt > settings.max_retries;
            if dead {
                return self.dead_letter(entry, &err, attempt).await;
            }
            let delay = match err.action() {
                FailureAction::RetryAfter(d) => d,
                _ => retry_delay(attempt, settings.retry_min, settings.retry_max),
            };
            debug!(entry_id = %entry.id, attempt, error = %err, ?delay, "handler failed; will retry");
            m.retried.increment(1);
            self.flush_acks(conn).await;
            if !self.pause_for(delay).await {
                return Outcome::Abandoned;
            }
            attempt += 1;
        }
    }

    /// Copies the entry to `<stream>:dlq` with `error`, `origin` (shard key), `origin_id`,
    /// `group`, `member`, `attempts` and `failed_ms`. Retried until written or stopped.
    pub(super) async fn dead_letter(
        &self,
        entry: &Entry,
        err: &HandlerError,
        attempts: u32,
    ) -> Outcome {
        let dlq = rsc_protocol::routing::dlq_key(&self.origin.stream);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&dlq).arg("*");
        for (name, value) in &entry.fields {
            if !fields::DEAD_LETTER_FIELDS.contains(&name.as_str()) {
                cmd.arg(name).arg(value);
            }
        }
        cmd.arg(fields::ERROR)
            .arg(err.to_string())
            .arg(fields::ORIGIN)
            .arg(&self.origin.shard_key)
            .arg(fields::ORIGIN_ID)
            .arg(&entry.id)
            .arg(fields::GROUP)
            .arg(&self.origin.group)
            .arg(fields::MEMBER)
            .arg(&self.origin.member_id)
            .arg(fields::ATTEMPTS)
            .arg(attempts)
            .arg(fields::FAILED_MS)
            .arg(now_ms);
        // On the shared connection: on a cluster the dead-letter stream lives in another slot.
        let mut conn = self.shared.ack_conn.clone();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let r: Result<String, RedisError> = cmd.query_async(&mut conn).await;
            match r {
                Ok(_) => {
                    self.shared.metrics.dead_lettered.increment(1);
                    warn!(entry_id = %entry.id, attempts, error = %err, dlq = %dlq, "dead-lettered");
                    return Outcome::DeadLettered;
                }
                Err(e) => {
                    warn!(error = %e, "cannot write the dead letter; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }
}
