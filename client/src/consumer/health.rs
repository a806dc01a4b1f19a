//! Whether the data Redis answers: one probe per consumer app (a `PING` every second on the
//! app's shared connection), watched by every member of the app (GUIDE "When the data Redis
//! is unreachable").
//!
//! - A member does not join before the data Redis has answered: a member that cannot read
//!   would hold shards that a healthy member could work.
//! - A member whose data Redis stays unreachable for longer than the app's grace gives its
//!   shards back (it leaves the group, so they move at once) and joins again once the data
//!   Redis answers.
//!
//! The state is a pure value ([`DataRedis`]); [`spawn`] is the thin driver that probes and
//! publishes it on a watch channel.

use rsc_redis::LazyRedis;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// How often the data Redis is probed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long one probe may take before it counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the app knows of its data Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DataRedis {
    /// Not probed yet.
    Unknown,
    /// The last probe was answered.
    Up,
    /// Every probe since `since` failed; `error` is the first failure's.
    Down { since: Instant, error: String },
}

impl DataRedis {
    /// Whether the last probe was answered.
    pub(crate) fn is_up(&self) -> bool {
        matches!(self, DataRedis::Up)
    }

    /// Since when the data Redis has not answered (`None` while it does, or before the
    /// first probe).
    pub(crate) fn down_since(&self) -> Option<Instant> {
        match self {
            DataRedis::Down { since, .. } => Some(*since),
            _ => None,
        }
    }

    /// The state after a probe that ended at `now` with `probe`. A failure keeps the time
    /// and error of the first failure in a row, so that watchers are woken on changes only.
    pub(crate) fn after(&self, probe: Result<(), String>, now: Instant) -> DataRedis {
        match (self, probe) {
            (_, Ok(())) => DataRedis::Up,
            (DataRedis::Down { .. }, Err(_)) => self.clone(),
            (_, Err(error)) => DataRedis::Down { since: now, error },
        }
    }
}

/// Probes the data Redis `redis` (named `label` in logs, password hidden) every
/// [`PROBE_EVERY`] until `stop`, and publishes what it finds. Logs each change once; the gauge
/// `rsc_client_data_redis_up` is 1 while it answers, 0 while it does not.
pub(crate) fn spawn(
    redis: LazyRedis,
    label: String,
    grace: Duration,
    stop: CancellationToken,
) -> watch::Receiver<DataRedis> {
    let (tx, rx) = watch::channel(DataRedis::Unknown);
    tokio::spawn(async move {
        let up = metrics::gauge!("rsc_client_data_redis_up");
        loop {
            let result = tokio::select! {
                () = stop.cancelled() => return,
                r = probe(&redis) => r,
            };
            let now = Instant::now();
            let old = tx.borrow().clone();
            let new = old.after(result, now);
            up.set(if new.is_up() { 1.0 } else { 0.0 });
            log_change(&old, &new, &label, grace, now);
            tx.send_if_modified(|v| {
                let changed = *v != new;
                *v = new;
                changed
            });
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
        }
    });
    rx
}

/// One `PING`, within [`PROBE_TIMEOUT`].
async fn probe(redis: &LazyRedis) -> Result<(), String> {
    let mut conn = redis.clone();
    let cmd = redis::cmd("PING");
    let ping = cmd.query_async::<String>(&mut conn);
    match tokio::time::timeout(PROBE_TIMEOUT, ping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer to PING within {PROBE_TIMEOUT:?}")),
    }
}

fn log_change(old: &DataRedis, new: &DataRedis, label: &str, grace: Duration, now: Instant) {
    match (old, new) {
        (DataRedis::Down { .. }, DataRedis::Down { .. }) | (DataRedis::Up, DataRedis::Up) => {}
        (_, DataRedis::Down { error, .. }) => error!(
            url = %label, %error, grace_ms = grace.as_millis() as u64,
            "the data Redis does not answer: members do not join until it does, and give \
             their shards back if it stays unreachable past the grace"
        ),
        (DataRedis::Down { since, .. }, DataRedis::Up) => info!(
            url = %label, down_ms = (now - *since).as_millis() as u64,
            "the data Redis answers again"
        ),
        (_, _) => info!(url = %label, "the data Redis answers"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_failures_keeps_its_first_time_and_error_and_one_answer_ends_it() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let s = DataRedis::Unknown;
        assert!(!s.is_up() && s.down_since().is_none(), "unknown is neither");
        let down = s.after(Err("refused".into()), t0);
        assert_eq!(down.down_since(), Some(t0));
        let still = down.after(Err("timed out".into()), t1);
        assert_eq!(still, down, "the first failure of the run is kept");
        let up = still.after(Ok(()), t1);
        assert!(up.is_up() && up.down_since().is_none());
        assert_eq!(up.after(Err("x".into()), t1).down_since(), Some(t1));
    }
}
