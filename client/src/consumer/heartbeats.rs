//! How the members of one consumer app send their heartbeats: one request per heartbeat on
//! `POST /v1/groups/{group}/heartbeat`, or — when the app runs more than one member — batched
//! with the other members' on `POST /v1/heartbeats` (group commit).
//!
//! - **Group commit**: a member's heartbeat goes into a queue. When no batch is in flight, the
//!   batcher waits a very short linger (so members whose timers fire together ride one
//!   request) and sends everything queued; heartbeats arriving while a batch is in flight go
//!   in the next one. Batches are chunked at [`MAX_HEARTBEAT_BATCH`].
//! - **Same answers**: each member gets exactly the `Result` the single route would give it:
//!   an item error becomes the same [`CoordinatorError::Api`]; a whole-request failure fails
//!   every heartbeat of that request with that error (each member retries as it would).
//!   `413` splits the request in halves (and the batcher remembers the smaller size).
//! - **Send time**: every heartbeat of a batch is answered with the instant the batch request
//!   was sent (after it was queued, before it left): the member's lease counts from it.
//! - **Older coordinators**: `404 NOT_FOUND` from the batch route re-sends that batch's
//!   heartbeats on the single route, and uses the single route for [`REPROBE_AFTER`] before
//!   trying the batch route again.
//! - **Alignment**: [`Heartbeats::next_periodic`] puts a member's next periodic heartbeat on a
//!   process-wide grid, so that members with the same interval keep sharing requests.

use crate::coordinator::CoordinatorClient;
use crate::error::CoordinatorError;
use futures::future::{BoxFuture, join_all};
use rsc_protocol::{
    BatchedHeartbeat, BatchedHeartbeatResult, ErrorCode, HeartbeatBatchRequest, HeartbeatRequest,
    HeartbeatResponse, MAX_HEARTBEAT_BATCH,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{Instrument, debug, debug_span, info};

/// How long the batcher waits, once a heartbeat arrives in an empty queue, for the heartbeats
/// of other members whose timers fire at the same instant.
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// After a coordinator answered the batch route with `404 NOT_FOUND` (an older version), how
/// long the single route is used before the batch route is tried again.
pub(crate) const REPROBE_AFTER: Duration = Duration::from_secs(300);

/// A heartbeat's answer and the instant its request was sent (the lease counts from it).
pub(crate) type Answer = (Instant, Result<HeartbeatResponse, CoordinatorError>);

/// The heartbeat path of every member of one app. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Heartbeats {
    coord: CoordinatorClient,
    /// `None`: every heartbeat on the single route.
    batch: Option<BatchHandle>,
    /// The process-wide origin of the heartbeat grid.
    base: Instant,
}

#[derive(Clone)]
struct BatchHandle {
    queue: mpsc::UnboundedSender<Pending>,
    state: Arc<BatchState>,
}

/// What the handles and the batcher task share.
struct BatchState {
    /// While in the future: the coordinator has no batch route; heartbeats take the single one.
    single_until: Mutex<Option<Instant>>,
    /// Whether the fallback is active (for logging the way back once).
    fallen_back: AtomicBool,
    /// Whether the fallback was logged at info already.
    announced: AtomicBool,
    /// Most heartbeats per request: [`MAX_HEARTBEAT_BATCH`], less after a `413`.
    max_items: AtomicUsize,
    reprobe_after: Duration,
}

impl BatchState {
    fn use_single(&self, now: Instant) -> bool {
        self.single_until
            .lock()
            .map(|until| until.is_some_and(|u| now < u))
            .unwrap_or(false)
    }

    fn fall_back(&self, now: Instant, url: &str) {
        if let Ok(mut until) = self.single_until.lock() {
            *until = Some(now + self.reprobe_after);
        }
        self.fallen_back.store(true, Ordering::Relaxed);
        let again = self.reprobe_after;
        if !self.announced.swap(true, Ordering::Relaxed) {
            info!(url, retry_in = ?again, "the coordinator has no batched heartbeat route (an older version): \
                heartbeats use the single-member route");
        } else {
            debug!(url, retry_in = ?again, "the coordinator still has no batched heartbeat route");
        }
    }
}

/// A queued heartbeat.
struct Pending {
    item: BatchedHeartbeat,
    timeout: Duration,
    reply: oneshot::Sender<Answer>,
}

impl Heartbeats {
    /// Every heartbeat on the single route (one member, or batching turned off).
    pub(crate) fn single(coord: CoordinatorClient) -> Self {
        Heartbeats {
            coord,
            batch: None,
            base: Instant::now(),
        }
    }

    /// Batched on `POST /v1/heartbeats`; spawns the batcher task (it ends when the last
    /// handle is dropped). Needs a Tokio runtime.
    pub(crate) fn batched(coord: CoordinatorClient) -> Self {
        Self::batched_with(coord, LINGER, REPROBE_AFTER)
    }

    fn batched_with(coord: CoordinatorClient, linger: Duration, reprobe_after: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(BatchState {
            single_until: Mutex::new(None),
            fallen_back: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            max_items: AtomicUsize::new(MAX_HEARTBEAT_BATCH),
            reprobe_after,
        });
        tokio::spawn(run_batcher(coord.clone(), state.clone(), rx, linger));
        Heartbeats {
            coord,
            batch: Some(BatchHandle { queue: tx, state }),
            base: Instant::now(),
        }
    }

    /// Whether heartbeats are batched (they may still take the single route for a while
    /// after an older coordinator refused the batch route).
    pub(crate) fn is_batched(&self) -> bool {
        self.batch.is_some()
    }

    /// Sends one member's heartbeat; answers what `POST /v1/groups/{group}/heartbeat` would,
    /// with the instant the request carrying it was sent.
    pub(crate) async fn heartbeat(
        &self,
        group: &str,
        req: HeartbeatRequest,
        timeout: Duration,
    ) -> Answer {
        // A leave is not batched: it is sent once, on shutdown.
        if let Some(batch) = &self.batch
            && req.member_epoch >= 0
            && !batch.state.use_single(Instant::now())
        {
            let (reply, answer) = oneshot::channel();
            let pending = Pending {
                item: BatchedHeartbeat {
                    group: group.to_owned(),
                    heartbeat: req.clone(),
                },
                timeout,
                reply,
            };
            if batch.queue.send(pending).is_ok()
                && let Ok(answer) = answer.await
            {
                return answer;
            }
            // The batcher is gone (it only ends when every handle is dropped, or panicked):
            // the single route still works.
            debug!("heartbeat batcher unavailable: single route");
        }
        let sent_at = Instant::now();
        let result = self.coord.heartbeat(group, &req, timeout).await;
        (sent_at, result)
    }

    /// When a member whose last heartbeat was sent at `sent_at` sends its next periodic one.
    /// Single route: `sent_at + interval`. Batched: the point of the process-wide grid
    /// `base + k·interval` in `(sent_at, sent_at + interval]` — never later than the single
    /// route would, and the same instant for every member with that interval.
    pub(crate) fn next_periodic(&self, sent_at: Instant, interval: Duration) -> Instant {
        if self.batch.is_none() {
            return sent_at + interval;
        }
        grid_point(self.base, interval, sent_at)
    }
}

/// The grid point `base + k·interval` in `(sent_at, sent_at + interval]` (`sent_at + interval`
/// before `base`, or for an empty interval).
fn grid_point(base: Instant, interval: Duration, sent_at: Instant) -> Instant {
    let step = interval.as_nanos();
    if step == 0 || sent_at < base {
        return sent_at + interval;
    }
    let k = (sent_at - base).as_nanos() / step + 1;
    match u64::try_from(k * step) {
        Ok(nanos) => base + Duration::from_nanos(nanos),
        Err(_) => sent_at + interval,
    }
}

/// The batcher task: group commit of the queued heartbeats until every handle is dropped.
async fn run_batcher(
    coord: CoordinatorClient,
    state: Arc<BatchState>,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    linger: Duration,
) {
    loop {
        let first = match queue.try_recv() {
            // Queued while the previous batch was in flight: it has waited long enough.
            Ok(p) => p,
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                let Some(p) = queue.recv().await else {
                    return;
                };
                // Members whose timers fire together join this one.
                tokio::time::sleep(linger).await;
                p
            }
        };
        let mut items = vec![first];
        while let Ok(p) = queue.try_recv() {
            items.push(p);
        }
        flush(&coord, &state, items).await;
    }
}

/// Sends the queued heartbeats: in requests of at most `max_items`, in parallel.
async fn flush(coord: &CoordinatorClient, state: &Arc<BatchState>, mut items: Vec<Pending>) {
    if state.use_single(Instant::now()) {
        send_single(coord, items).await;
        return;
    }
    let cap = state.max_items.load(Ordering::Relaxed).max(1);
    let requests = items.len().div_ceil(cap);
    let per_request = items.len().div_ceil(requests);
    let mut chunks = Vec::with_capacity(requests);
    while items.len() > per_request {
        let rest = items.split_off(per_request);
        chunks.push(std::mem::replace(&mut items, rest));
    }
    chunks.push(items);
    join_all(chunks.into_iter().map(|c| send_batch(coord, state, c))).await;
}

/// One `POST /v1/heartbeats` request; answers each heartbeat of it.
fn send_batch<'a>(
    coord: &'a CoordinatorClient,
    state: &'a Arc<BatchState>,
    items: Vec<Pending>,
) -> BoxFuture<'a, ()> {
    Box::pin(async move {
        let members = items.len();
        let timeout = items
            .iter()
            .map(|p| p.timeout)
            .min()
            .unwrap_or(Duration::from_secs(5));
        let (heartbeats, waiters): (Vec<_>, Vec<_>) = items
            .into_iter()
            .map(|p| (p.item, (p.timeout, p.reply)))
            .unzip();
        let body = HeartbeatBatchRequest { heartbeats };
        let span = debug_span!("heartbeat_batch", members);
        let sent_at = Instant::now();
        let (url, result) = coord
            .heartbeat_batch(&body, timeout)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.code().map_or("transport", ErrorCode::as_str),
        };
        metrics::counter!("rsc_client_heartbeat_batches_total", "result" => outcome).increment(1);
        metrics::histogram!("rsc_client_heartbeat_batch_members").record(members as f64);
        span.in_scope(|| {
            debug!(url = %url, result = outcome, elapsed = ?sent_at.elapsed(), "heartbeat batch answered");
        });
        match result {
            Ok(resp) => {
                if state.fallen_back.swap(false, Ordering::Relaxed) {
                    info!(url = %url, "the coordinator answers batched heartbeats again");
                }
                let mut results = resp.results.into_iter();
                for (hb, (_, reply)) in body.heartbeats.iter().zip(waiters) {
                    let _ = reply.send((sent_at, item_result(&url, hb, results.next())));
                }
            }
            Err(CoordinatorError::Api {
                status: 404,
                code: ErrorCode::NotFound,
                ..
            }) => {
                state.fall_back(Instant::now(), &url);
                send_single(coord, repack(body, waiters)).await;
            }
            Err(CoordinatorError::Api { status: 413, .. }) if members > 1 => {
                // Too large for the coordinator's body limit: halves, and smaller from now on.
                let half = members.div_ceil(2);
                state.max_items.fetch_min(half, Ordering::Relaxed);
                debug!(members, half, "heartbeat batch too large: splitting it");
                let mut first = repack(body, waiters);
                let second = first.split_off(half);
                futures::join!(
                    send_batch(coord, state, first),
                    send_batch(coord, state, second)
                );
            }
            Err(e) => {
                for (_, reply) in waiters {
                    let _ = reply.send((sent_at, Err(e.clone())));
                }
            }
        }
    })
}

/// The heartbeats of a request and their waiters, queued again.
fn repack(
    body: HeartbeatBatchRequest,
    waiters: Vec<(Duration, oneshot::Sender<Answer>)>,
) -> Vec<Pending> {
    body.heartbeats
        .into_iter()
        .zip(waiters)
        .map(|(item, (timeout, reply))| Pending {
            item,
            timeout,
            reply,
        })
        .collect()
}

/// Each heartbeat on `POST /v1/groups/{group}/heartbeat`, in parallel.
async fn send_single(coord: &CoordinatorClient, items: Vec<Pending>) {
    join_all(items.into_iter().map(|p| async move {
        let sent_at = Instant::now();
        let result = coord
            .heartbeat(&p.item.group, &p.item.heartbeat, p.timeout)
            .await;
        let _ = p.reply.send((sent_at, result));
    }))
    .await;
}

/// One heartbeat's answer from its batch result: what the single route would have answered.
fn item_result(
    url: &str,
    sent: &BatchedHeartbeat,
    got: Option<BatchedHeartbeatResult>,
) -> Result<HeartbeatResponse, CoordinatorError> {
    // A batch answer that does not answer this heartbeat is the coordinator's fault: 502,
    // retryable, as a failing coordinator would be.
    let unexpected = |status: u16, body: String| CoordinatorError::Unexpected {
        url: url.to_owned(),
        status,
        body,
    };
    let Some(got) = got else {
        return Err(unexpected(
            502,
            "the batched heartbeat answer has no result for this heartbeat".into(),
        ));
    };
    if got.member_id != sent.heartbeat.member_id || got.group != sent.group {
        return Err(unexpected(
            502,
            format!(
                "the batched heartbeat answer has {}/{} where {}/{} was expected",
                got.group, got.member_id, sent.group, sent.heartbeat.member_id
            ),
        ));
    }
    let success = (200..300).contains(&got.status);
    match (got.response, got.error) {
        (Some(resp), _) if success => Ok(resp),
        (_, Some(error)) if !success => Err(CoordinatorError::Api {
            url: url.to_owned(),
            status: got.status,
            code: error.code,
            message: error.message,
        }),
        _ => Err(unexpected(
            got.status,
            "a batched heartbeat result without its response or error".into(),
        )),
    }
}
