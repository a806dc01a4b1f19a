//! The wake-up channel of a consumer app: one `POST /v1/wakeups` server-sent event stream
//! for all the app's members, so that a member heartbeats as soon as the coordinator has
//! changed what it must do (shards to take, to revoke, released by their previous owner, a
//! reshard, its removal) instead of at its next interval.
//!
//! A wake-up is only a hint: the member heartbeats, and the answer decides. Nothing depends
//! on the channel: while it is down (coordinator restart, an older coordinator without the
//! route, the coordinator's channel limit) the members learn of changes at their heartbeat
//! interval, as before. The task reconnects with jittered backoff; after the coordinator's
//! idle close it reconnects at once; it retries a coordinator without the route after
//! [`REPROBE_AFTER`].

use super::backoff::Backoff;
use crate::error::CoordinatorError;
use rsc_api::CoordinatorClient;
use rsc_protocol::{ErrorCode, MAX_WAKE_MEMBERS, WakeChannelRequest, WakeEvent, WakeMember};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// After a coordinator answered `404` (no wake-up route: an older version, or turned off),
/// how long before the route is tried again.
pub(crate) const REPROBE_AFTER: Duration = Duration::from_secs(300);
/// How long to wait after a `429` that names no `Retry-After` (the coordinator sends one).
const RETRY_AFTER_429: Duration = Duration::from_secs(30);
/// No byte on an open channel for this long (the coordinator sends a keep-alive every 15 s):
/// the connection is taken for dead and reopened.
const SILENCE: Duration = Duration::from_secs(45);
/// Members per channel: a body of this many names stays well under the default body limit.
const MEMBERS_PER_CHANNEL: usize = 250;

/// The wake-up signal of each member, by (group, member id).
pub(crate) type WakeSignals = HashMap<(String, String), Arc<Notify>>;

/// Spawns the channel task(s) for `members` (one channel per [`MEMBERS_PER_CHANNEL`]);
/// returns each member's signal. The tasks end when `stop` is cancelled.
pub(crate) fn spawn(
    coord: CoordinatorClient,
    members: Vec<WakeMember>,
    stop: CancellationToken,
) -> WakeSignals {
    let signals: WakeSignals = members
        .iter()
        .map(|m| {
            (
                (m.group.to_string(), m.member_id.to_string()),
                Arc::new(Notify::new()),
            )
        })
        .collect();
    let signals_shared = Arc::new(signals.clone());
    for chunk in members.chunks(MEMBERS_PER_CHANNEL.min(MAX_WAKE_MEMBERS)) {
        let req = WakeChannelRequest {
            members: chunk.to_vec(),
        };
        let task = run(coord.clone(), req, signals_shared.clone(), stop.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = task => {}
            }
        });
    }
    signals
}

/// How one channel connection ended.
enum Ended {
    /// The coordinator closed it (idle timeout, shutdown): reopen at once.
    Closed,
    /// Failed: reopen after a backoff.
    Failed(CoordinatorError),
    /// The connection went silent or broke mid-stream.
    Broken(String),
}

async fn run(
    coord: CoordinatorClient,
    req: WakeChannelRequest,
    signals: Arc<WakeSignals>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut announced_missing = false;
    // This channel's members: after a reopen each heartbeats once, to catch up on what a
    // wake-up sent while no channel was open would have said (PROTOCOL §13).
    let mine: Vec<Arc<Notify>> = req
        .members
        .iter()
        .filter_map(|m| {
            signals
                .get(&(m.group.to_string(), m.member_id.to_string()))
                .cloned()
        })
        .collect();
    let mut opened_before = false;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let (url, opened) = coord.open_wake_channel(&req).await;
        let opened_at = tokio::time::Instant::now();
        let ended = match opened {
            Ok(resp) => {
                metrics::gauge!("rsc_client_wake_channel_open").increment(1.0);
                debug!(%url, members = req.members.len(), "wake-up channel open");
                let catch_up = opened_before.then_some(mine.as_slice());
                opened_before = true;
                let ended = read(resp, &signals, &mut backoff, catch_up).await;
                metrics::gauge!("rsc_client_wake_channel_open").decrement(1.0);
                ended
            }
            Err(e) => Ended::Failed(e),
        };
        let lasted = opened_at.elapsed();
        let wait = delay_after(ended, &url, lasted, &mut backoff, &mut announced_missing);
        if !wait.is_zero() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// How long to wait before reopening a channel that ended as `ended` after it `lasted`
/// (logging why).
fn delay_after(
    ended: Ended,
    url: &impl std::fmt::Display,
    lasted: Duration,
    backoff: &mut Backoff,
    announced_missing: &mut bool,
) -> Duration {
    match ended {
        Ended::Closed if lasted >= Duration::from_millis(500) => {
            debug!(%url, "the coordinator closed the wake-up channel; reopening");
            Duration::ZERO
        }
        Ended::Closed => {
            // Closed as soon as opened (a coordinator shutting down): not in a tight loop.
            debug!(%url, "the coordinator closed the wake-up channel at once; reopening after a backoff");
            backoff.next_delay()
        }
        Ended::Broken(why) => {
            info!(%url, why, "wake-up channel lost; reopening (members heartbeat on their interval meanwhile)");
            backoff.next_delay()
        }
        Ended::Failed(CoordinatorError::Api {
            status: 404,
            code: ErrorCode::NotFound,
            ..
        }) => {
            if !*announced_missing {
                *announced_missing = true;
                info!(%url, retry_in = ?REPROBE_AFTER, "the coordinator has no wake-up channel (an older version, or turned off): \
                    members learn of changes at their heartbeat interval");
            }
            REPROBE_AFTER
        }
        Ended::Failed(e @ CoordinatorError::Api { status: 429, .. }) => {
            warn!(%url, error = %e, "wake-up channel refused; retrying later (members heartbeat on their interval meanwhile)");
            // The coordinator's `Retry-After`, plus backoff so that refused clients spread.
            e.retry_after().unwrap_or(RETRY_AFTER_429) + backoff.next_delay()
        }
        Ended::Failed(
            e @ CoordinatorError::Api {
                status: 400..=499, ..
            },
        ) => {
            warn!(%url, error = %e, "wake-up channel refused; retrying later (members heartbeat on their interval meanwhile)");
            REPROBE_AFTER
        }
        Ended::Failed(e) => {
            debug!(%url, error = %e, "wake-up channel could not be opened; retrying");
            backoff.next_delay()
        }
    }
}

/// Reads one open channel until it ends, waking the members it names; on its `ready`, wakes
/// every member of `catch_up` (a reopened channel's).
async fn read(
    mut resp: reqwest::Response,
    signals: &WakeSignals,
    backoff: &mut Backoff,
    catch_up: Option<&[Arc<Notify>]>,
) -> Ended {
    let mut parser = SseParser::default();
    loop {
        let chunk = match tokio::time::timeout(SILENCE, resp.chunk()).await {
            Err(_) => return Ended::Broken(format!("no keep-alive for {SILENCE:?}")),
            Ok(Err(e)) => return Ended::Broken(e.to_string()),
            Ok(Ok(None)) => return Ended::Closed,
            Ok(Ok(Some(c))) => c,
        };
        for (event, data) in parser.push(&chunk) {
            match rsc_protocol::WakeEventName::parse(&event) {
                Some(rsc_protocol::WakeEventName::Ready) => {
                    backoff.reset();
                    if let Some(members) = catch_up {
                        debug!(
                            members = members.len(),
                            "wake-up channel reopened: each member heartbeats once to catch up"
                        );
                        members.iter().for_each(|n| n.notify_one());
                    }
                }
                Some(rsc_protocol::WakeEventName::Wake) => {
                    match serde_json::from_str::<WakeEvent>(&data) {
                        Ok(w) => {
                            if let Some(n) = signals.get(&(w.group.clone(), w.member_id.clone())) {
                                metrics::counter!("rsc_client_wakeups_total", "group" => w.group.clone())
                                .increment(1);
                                debug!(group = %w.group, member = %w.member_id, "woken: heartbeat now");
                                n.notify_one();
                            }
                        }
                        Err(e) => debug!(error = %e, data, "unreadable wake-up event ignored"),
                    }
                }
                // A newer coordinator's event: not ours to act on.
                None => {}
            }
        }
    }
}

/// A minimal `text/event-stream` parser: complete events as (event name, data).
#[derive(Debug, Default)]
struct SseParser {
    buf: String,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
        self.buf.push_str(&String::from_utf8_lossy(bytes));
        if self.buf.contains('\r') {
            self.buf = self.buf.replace("\r\n", "\n");
        }
        let mut out = Vec::new();
        while let Some(end) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..end + 2).collect();
            let mut event = String::from("message");
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                }
            }
            if !data.is_empty() || event != "message" {
                out.push((event, data.join("\n")));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn the_parser_splits_events_across_chunks_and_skips_comments() {
        let mut p = SseParser::default();
        assert!(p.push(b"event: ready\ndata: {\"members\":2}\n").is_empty());
        let got =
            p.push(b"\n:\n\nevent: wake\ndata: {\"group\":\"g\",\"member_id\":\"m\"}\n\nevent: wa");
        assert_eq!(
            got,
            vec![
                ("ready".to_owned(), "{\"members\":2}".to_owned()),
                (
                    "wake".to_owned(),
                    "{\"group\":\"g\",\"member_id\":\"m\"}".to_owned()
                ),
            ]
        );
        assert_eq!(
            p.push(b"ke\r\ndata: x\r\n\r\n"),
            vec![("wake".to_owned(), "x".to_owned())]
        );
    }

    /// A `429` waits the coordinator's `Retry-After` plus backoff (30 s when it names none).
    #[test]
    fn a_refusal_waits_the_coordinators_retry_after() {
        let refused = |retry_after_ms| {
            Ended::Failed(CoordinatorError::Api {
                url: "http://127.0.0.1:1".into(),
                status: 429,
                code: ErrorCode::RateLimited,
                message: "too many channels".into(),
                retry_after_ms,
            })
        };
        let url = "http://127.0.0.1:1";
        let mut announced = false;
        let max = Duration::from_secs(5);
        for (retry_after_ms, want) in [(Some(2_000), 2), (None, 30)] {
            let mut backoff = Backoff::new(Duration::from_millis(100), max);
            let wait = delay_after(
                refused(retry_after_ms),
                &url,
                Duration::ZERO,
                &mut backoff,
                &mut announced,
            );
            let want = Duration::from_secs(want);
            assert!(wait >= want && wait <= want + max, "{wait:?}");
        }
    }

    fn channel(body: &'static str) -> reqwest::Response {
        reqwest::Response::from(axum::http::Response::new(body))
    }

    /// A reopened channel's `ready` wakes each of its members once (a wake-up sent while no
    /// channel was open is lost); a first opening wakes nobody.
    #[tokio::test]
    async fn a_reopened_channel_wakes_its_members_once_on_ready() {
        let body = "event: ready\ndata: {\"members\":2}\n\n";
        let members = [Arc::new(Notify::new()), Arc::new(Notify::new())];
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let signals = WakeSignals::new();
        let ended = read(channel(body), &signals, &mut backoff, None).await;
        assert!(matches!(ended, Ended::Closed));
        assert!(
            members
                .iter()
                .all(|n| n.notified().now_or_never().is_none())
        );
        let ended = read(channel(body), &signals, &mut backoff, Some(&members)).await;
        assert!(matches!(ended, Ended::Closed));
        for n in &members {
            assert!(n.notified().now_or_never().is_some(), "not woken");
            assert!(n.notified().now_or_never().is_none(), "woken twice");
        }
    }
}
