//! One handler call, run to its end beside the worker's reads: the handler's attempts with
//! their retries (the listener's backoff) and dead letters. A single-message listener's call
//! is a batch of one: both kinds of listener go through the same settling rules.

use super::dispatch::{Call, CallId, Verdict};
use crate::consumer::MemberShared;
use crate::consumer::backoff::{Backoff, retry_delay};
use crate::handler::{FailureAction, HandlerError};
use crate::message::{Entry, Origin};
use futures::future::BoxFuture;
use redis::RedisError;
use rsc_protocol::entry as fields;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// What a call returns to the driver: its name and a verdict per settled entry (an entry
/// without one was abandoned).
pub(super) type Done = (CallId, Vec<(String, Verdict)>);

/// Entries waiting for their next attempt, with the attempt's number.
type Attempts = Vec<(Arc<Entry>, u32)>;

/// What a call needs, owned, so that calls run beside the worker's reads.
#[derive(Clone)]
pub(super) struct Runner {
    pub(super) shared: Arc<MemberShared>,
    pub(super) origin: Arc<Origin>,
    pub(super) stop: CancellationToken,
    /// Entries (with several lanes: keys) waiting out a retry's backoff on this shard.
    pub(super) parked: metrics::Gauge,
    /// Non-blocking retries: a failed entry goes to a retry stage instead of being retried
    /// in place (`None`: no stage configured).
    pub(super) stager: Option<super::stager::Stager>,
}

impl Runner {
    /// Runs `call` until each of its entries is settled (handled or dead-lettered) or the
    /// worker stops (the rest is abandoned: it stays pending).
    ///
    /// A single-message listener's call may hold several entries (one lane: the queue's
    /// front): they are handled one after the other, in order, each a batch of one with its
    /// own retries; between two, the call waits while the listener is paused and ends when
    /// the lease ran out (the rest stays pending, as the worker stops).
    pub(super) fn run(self, call: Call<Arc<Entry>>) -> BoxFuture<'static, Done> {
        Box::pin(async move {
            let mut verdicts = Vec::with_capacity(call.entries.len());
            if self.shared.listener.is_batch() {
                let pending = call.entries.into_iter().map(|e| (e, 1)).collect();
                self.settle_all(pending, &mut verdicts).await;
                return (call.id, verdicts);
            }
            for (i, entry) in call.entries.into_iter().enumerate() {
                if i > 0 && !self.ready_for_next().await {
                    break;
                }
                if !self.settle_all(vec![(entry, 1)], &mut verdicts).await {
                    break;
                }
            }
            (call.id, verdicts)
        })
    }

    /// Attempts `pending` until each is settled into `verdicts` (handled or dead-lettered),
    /// waiting the backoff between attempts; `false` when stopped first (the rest is
    /// abandoned).
    async fn settle_all(
        &self,
        mut pending: Attempts,
        verdicts: &mut Vec<(String, Verdict)>,
    ) -> bool {
        loop {
            let results = self.attempt(&pending).await;
            let Some((retry, delay)) = self.settle(pending, results, verdicts).await else {
                return false;
            };
            if retry.is_empty() {
                return true;
            }
            let parked = retry.len() as f64;
            self.shared.metrics.retried.increment(retry.len() as u64);
            self.parked.increment(parked);
            let go_on = self.pause_for(delay).await;
            self.parked.decrement(parked);
            if !go_on {
                return false;
            }
            pending = retry;
        }
    }

    /// Between two entries of one call: waits while the listener is paused; `false` when
    /// stopped or past the lease.
    async fn ready_for_next(&self) -> bool {
        !self.shared.lease_expired()
            && super::wait_unpaused(&self.shared.paused, &self.stop).await
            && !self.shared.lease_expired()
    }

    /// Sleeps unless stopped first; `false` when stopped.
    pub(super) async fn pause_for(&self, d: Duration) -> bool {
        super::sleep_unless_stopped(&self.stop, d).await
    }

    /// One attempt on `pending` through the listener's stack (its layers around the
    /// handler, [`crate::layer`]): a verdict per entry, in order (`None`: handled).
    pub(super) async fn attempt(&self, pending: &[(Arc<Entry>, u32)]) -> Vec<Option<HandlerError>> {
        let started = tokio::time::Instant::now();
        let listener = &self.shared.listener;
        let verdicts = if listener.layers.is_empty() {
            // No layers: the handler itself is the stack.
            crate::listener::call(&listener.handler, pending, &self.origin).await
        } else {
            let service = listener
                .service
                .clone()
                .unwrap_or_else(|| crate::listener::stack(&listener.handler, &listener.layers));
            let attempt = crate::layer::Attempt {
                entries: pending.to_vec(),
                origin: self.origin.clone(),
            };
            crate::layer::run(service, attempt).await
        };
        self.shared
            .metrics
            .duration
            .record(started.elapsed().as_secs_f64());
        verdicts
    }

    /// Settles each entry by its verdict into `verdicts`: handled, or dead-lettered when its
    /// retries are exhausted or the handler said so; the others are returned for the next
    /// attempt with the longest delay any asked for. `None` when stopped while
    /// dead-lettering.
    async fn settle(
        &self,
        pending: Attempts,
        results: Vec<Option<HandlerError>>,
        verdicts: &mut Vec<(String, Verdict)>,
    ) -> Option<(Attempts, Duration)> {
        let settings = &self.shared.listener.settings;
        let m = &self.shared.metrics;
        let mut retry = Vec::new();
        let mut delay = Duration::ZERO;
        for ((entry, attempt), result) in pending.into_iter().zip(results) {
            let Some(err) = result else {
                m.handled.increment(1);
                verdicts.push((entry.id.clone(), Verdict::Handled));
                continue;
            };
            if let FailureAction::Defer(d) = err.action() {
                // Not counted: the same attempt again once the delay has passed.
                delay = delay.max(d);
                debug!(entry_id = %entry.id, attempt, reason = %err, "deferred");
                retry.push((entry, attempt));
                continue;
            }
            m.failed.increment(1);
            if let Some(stager) = &self.stager {
                // Non-blocking retries: to retry stage 1 (or the dead letters), never in place.
                if !self
                    .stage_or_dead_letter(stager, &entry, &err, attempt)
                    .await
                {
                    return None;
                }
                let verdict = if err.action() == FailureAction::DeadLetter {
                    Verdict::DeadLettered
                } else {
                    Verdict::Staged
                };
                verdicts.push((entry.id.clone(), verdict));
                continue;
            }
            if err.action() == FailureAction::DeadLetter || attempt > settings.max_retries {
                if !self.dead_letter(&entry, &err, attempt).await {
                    return None;
                }
                verdicts.push((entry.id.clone(), Verdict::DeadLettered));
                continue;
            }
            delay = delay.max(match err.action() {
                FailureAction::RetryAfter(d) => d,
                _ => retry_delay(attempt, settings.retry_min, settings.retry_max),
            });
            debug!(entry_id = %entry.id, attempt, error = %err, "handler failed; will retry");
            retry.push((entry, attempt + 1));
        }
        Some((retry, delay))
    }

    /// Copies the entry to `<stream>:dlq` with `error`, `origin` (shard key), `origin_id`,
    /// `group`, `member`, `attempts` and `failed_ms`. Retried until written (`true`) or
    /// stopped (`false`).
    pub(super) async fn dead_letter(
        &self,
        entry: &Entry,
        err: &HandlerError,
        attempts: u32,
    ) -> bool {
        let dlq = rsc_protocol::routing::dlq_key(&self.origin.stream);
        let cmd = dead_letter_cmd(&dlq, &self.origin, entry, err, attempts);
        // On the shared connection: on a cluster the dead-letter stream lives in another slot.
        let mut conn = self.shared.ack_conn.clone();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let r: Result<String, RedisError> = cmd.query_async(&mut conn).await;
            match r {
                Ok(_) => {
                    self.shared.metrics.dead_lettered.increment(1);
                    warn!(entry_id = %entry.id, attempts, error = %err, dlq = %dlq, "dead-lettered");
                    return true;
                }
                Err(e) => {
                    warn!(error = %e, "cannot write the dead letter; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return false;
                    }
                }
            }
        }
    }
}

/// The `XADD` of a dead letter (the entry's own fields, then the dead-letter fields).
fn dead_letter_cmd(
    dlq: &str,
    origin: &Origin,
    entry: &Entry,
    err: &HandlerError,
    attempts: u32,
) -> redis::Cmd {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut cmd = redis::cmd("XADD");
    cmd.arg(dlq).arg("*");
    for (name, value) in &entry.fields {
        if !fields::DEAD_LETTER_FIELDS.contains(&name.as_str()) {
            cmd.arg(name).arg(value);
        }
    }
    cmd.arg(fields::ERROR)
        .arg(err.to_string())
        .arg(fields::ORIGIN)
        .arg(&origin.shard_key)
        .arg(fields::ORIGIN_ID)
        .arg(&entry.id)
        .arg(fields::GROUP)
        .arg(&origin.group)
        .arg(fields::MEMBER)
        .arg(&origin.member_id)
        .arg(fields::ATTEMPTS)
        .arg(attempts)
        .arg(fields::FAILED_MS)
        .arg(now_ms);
    cmd
}

#[cfg(test)]
mod tests;
