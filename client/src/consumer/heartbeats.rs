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
//! - **Alignment**: [`grid_point`] on [`Heartbeats::grid`] puts a member's next periodic heartbeat
//!   on a process-wide grid, so that members with the same interval keep sharing requests.

use crate::error::CoordinatorError;
use futures::future::{BoxFuture, join_all};
use rsc_api::CoordinatorClient;
use rsc_protocol::{
    BatchedHeartbeat, BatchedHeartbeatResult, ErrorCode, HeartbeatBatchRequest, HeartbeatRequest,
    HeartbeatResponse, MAX_HEARTBEAT_BATCH, MemberEpoch,
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
    /// The heartbeat path of an app running `members` members: batched when `batching` is on
    /// and there is more than one member, else the single route.
    pub(crate) fn for_app(coord: CoordinatorClient, batching: bool, members: u64) -> Self {
        if batching && members > 1 {
            Self::batched(coord)
        } else {
            Self::single(coord)
        }
    }

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
            && !MemberEpoch::new(req.member_epoch).is_leave()
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
    #[cfg(test)]
    pub(crate) fn next_periodic(&self, sent_at: Instant, interval: Duration) -> Instant {
        match self.grid() {
            Some(base) => grid_point(base, interval, sent_at),
            None => sent_at + interval,
        }
    }

    /// The base of the process-wide grid of batched heartbeats (`None`: the single route).
    pub(crate) fn grid(&self) -> Option<Instant> {
        self.batch.is_some().then_some(self.base)
    }
}

/// The grid point `base + k·interval` in `(sent_at, sent_at + interval]` (`sent_at + interval`
/// before `base`, or for an empty interval).
pub(crate) fn grid_point(base: Instant, interval: Duration, sent_at: Instant) -> Instant {
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
            retry_after_ms: error.retry_after_ms,
        }),
        _ => Err(unexpected(
            got.status,
            "a batched heartbeat result without its response or error".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Json;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use rsc_protocol::{ErrorBody, HeartbeatBatchResponse, StartPosition};
    use std::collections::BTreeMap;

    /// What the stub's batch route does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum BatchMode {
        Answer,
        /// An older coordinator: `404 NOT_FOUND`, as for any unknown route.
        Missing,
        /// `503 STORE_UNAVAILABLE` for the whole request.
        Unavailable,
        /// `413` above this many heartbeats.
        Limit(usize),
    }

    /// A tiny coordinator: member ids starting with `fenced` get `409 FENCED_MEMBER_EPOCH`,
    /// others `200` with their epoch + 1.
    struct Stub {
        mode: Mutex<BatchMode>,
        /// The size of every batch request, answered or not.
        batches: Mutex<Vec<usize>>,
        singles: AtomicUsize,
    }

    type S = Arc<Stub>;

    fn answer(group: &str, req: &HeartbeatRequest) -> Result<HeartbeatResponse, ErrorBody> {
        if req.member_id.starts_with("fenced") {
            return Err(ErrorBody::new(
                ErrorCode::FencedMemberEpoch,
                format!(
                    "epoch {} of {} in {group} is stale",
                    req.member_epoch, req.member_id
                ),
            ));
        }
        Ok(HeartbeatResponse {
            paused: false,
            member_id: req.member_id.clone(),
            member_epoch: req.member_epoch + 1,
            heartbeat_interval_ms: 100,
            session_timeout_ms: 1000,
            assignment: vec![],
            stream: "s".into(),
            shard_count: 4,
            routing_epoch: 1,
            start: StartPosition::Earliest,
            owner_tokens: BTreeMap::new(),
            ordering: Default::default(),
            rebalance_timeout_ms: 60_000,
        })
    }

    fn error(code: ErrorCode, message: &str) -> Response {
        let status = StatusCode::from_u16(code.http_status()).unwrap();
        (status, Json(ErrorBody::new(code, message))).into_response()
    }

    async fn single(
        State(stub): State<S>,
        Path(group): Path<String>,
        Json(req): Json<HeartbeatRequest>,
    ) -> Response {
        stub.singles.fetch_add(1, Ordering::SeqCst);
        match answer(&group, &req) {
            Ok(resp) => Json(resp).into_response(),
            Err(e) => (StatusCode::CONFLICT, Json(e)).into_response(),
        }
    }

    async fn batch(State(stub): State<S>, Json(req): Json<HeartbeatBatchRequest>) -> Response {
        stub.batches.lock().unwrap().push(req.heartbeats.len());
        let mode = *stub.mode.lock().unwrap();
        match mode {
            BatchMode::Missing => return error(ErrorCode::NotFound, "no such route"),
            BatchMode::Unavailable => return error(ErrorCode::StoreUnavailable, "store down"),
            BatchMode::Limit(n) if req.heartbeats.len() > n => {
                return error(ErrorCode::PayloadTooLarge, "body too large");
            }
            _ => {}
        }
        let results = req
            .heartbeats
            .iter()
            .map(|b| {
                let (status, response, error) = match answer(&b.group, &b.heartbeat) {
                    Ok(r) => (200, Some(r), None),
                    Err(e) => (409, None, Some(e.error)),
                };
                BatchedHeartbeatResult {
                    group: b.group.clone(),
                    member_id: b.heartbeat.member_id.clone(),
                    status,
                    response,
                    error,
                }
            })
            .collect();
        Json(HeartbeatBatchResponse { results }).into_response()
    }

    /// Serves the stub on a free port; returns it and a client of it.
    async fn serve(mode: BatchMode) -> (S, CoordinatorClient) {
        let stub = Arc::new(Stub {
            mode: Mutex::new(mode),
            batches: Mutex::new(Vec::new()),
            singles: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .route("/v1/groups/{group}/heartbeat", post(single))
            .route("/v1/heartbeats", post(batch))
            .fallback(|| async { error(ErrorCode::NotFound, "no such route") })
            .with_state(stub.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (stub, CoordinatorClient::builder([url]).build().unwrap())
    }

    fn req(member: &str, epoch: i64) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: rsc_protocol::PROTOCOL_VERSION,
            member_id: member.into(),
            member_epoch: epoch,
            owned_shards: Some(vec![]),
            drained_shards: vec![],
            client: None,
            incarnation: None,
        }
    }

    /// A linger long enough for every heartbeat a test fires at once to ride one request.
    const TEST_LINGER: Duration = Duration::from_millis(100);
    const TIMEOUT: Duration = Duration::from_secs(5);

    /// Sends the members' heartbeats at once; the answers in member order, with the instant
    /// before they were handed over.
    async fn fire(hb: &Heartbeats, members: &[String]) -> (Instant, Vec<Answer>) {
        let before = Instant::now();
        let answers = join_all(
            members
                .iter()
                .enumerate()
                .map(|(i, m)| hb.heartbeat("g", req(m, i as i64), TIMEOUT)),
        )
        .await;
        (before, answers)
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    fn api_parts(e: &CoordinatorError) -> (String, u16, ErrorCode, String) {
        match e {
            CoordinatorError::Api {
                url,
                status,
                code,
                message,
                ..
            } => (url.clone(), *status, *code, message.clone()),
            other => panic!("not an API error: {other:?}"),
        }
    }

    #[tokio::test]
    async fn heartbeats_fired_together_ride_one_request_answered_in_order() {
        let (stub, coord) = serve(BatchMode::Answer).await;
        let hb = Heartbeats::batched_with(coord, TEST_LINGER, REPROBE_AFTER);
        let members = vec![
            "m-0".to_owned(),
            "fenced-1".into(),
            "m-2".into(),
            "m-3".into(),
        ];
        let (before, answers) = fire(&hb, &members).await;
        let after = Instant::now();
        assert_eq!(*stub.batches.lock().unwrap(), [4]);
        assert_eq!(stub.singles.load(Ordering::SeqCst), 0);
        let sent = answers[0].0;
        for (i, (sent_at, result)) in answers.iter().enumerate() {
            // One request: one send instant, after the hand-over, before the answer.
            assert_eq!(*sent_at, sent);
            assert!(*sent_at >= before && *sent_at <= after);
            match result {
                Ok(resp) => {
                    assert_eq!(resp.member_id, members[i]);
                    assert_eq!(resp.member_epoch, i as i64 + 1);
                }
                Err(e) => {
                    assert_eq!(i, 1, "{e}");
                    assert_eq!(e.code(), Some(ErrorCode::FencedMemberEpoch));
                }
            }
        }
        // A leave is not batched.
        let (_, left) = hb.heartbeat("g", req("m-0", -1), TIMEOUT).await;
        assert!(left.is_ok());
        assert_eq!(stub.singles.load(Ordering::SeqCst), 1);
        assert_eq!(stub.batches.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_heartbeat_arriving_during_the_linger_rides_the_same_request() {
        let (stub, coord) = serve(BatchMode::Answer).await;
        let hb = Heartbeats::batched_with(coord, TEST_LINGER, REPROBE_AFTER);
        // Let the batcher wait on an empty queue.
        tokio::task::yield_now().await;
        let first = hb.heartbeat("g", req("m-0", 0), TIMEOUT);
        let second = async {
            tokio::time::sleep(TEST_LINGER / 4).await;
            hb.heartbeat("g", req("m-1", 0), TIMEOUT).await
        };
        let before = Instant::now();
        let ((a, ra), (b, rb)) = futures::join!(first, second);
        assert!(ra.is_ok() && rb.is_ok());
        assert_eq!(a, b);
        assert!(a >= before + TEST_LINGER, "sent before the linger ended");
        assert_eq!(*stub.batches.lock().unwrap(), [2]);
    }

    #[tokio::test]
    async fn an_item_error_is_the_error_of_the_single_route() {
        let (_stub, coord) = serve(BatchMode::Answer).await;
        let batched = Heartbeats::batched_with(coord.clone(), TEST_LINGER, REPROBE_AFTER);
        let single = Heartbeats::single(coord);
        let (_, via_batch) = batched.heartbeat("g", req("fenced-7", 3), TIMEOUT).await;
        let (_, via_single) = single.heartbeat("g", req("fenced-7", 3), TIMEOUT).await;
        let (b, s) = (via_batch.unwrap_err(), via_single.unwrap_err());
        assert_eq!(api_parts(&b), api_parts(&s));
        assert_eq!(api_parts(&b).1, 409);
        assert_eq!(b.to_string(), s.to_string());
        assert!(!b.is_retriable());
    }

    #[tokio::test]
    async fn a_coordinator_without_the_batch_route_gets_single_heartbeats_until_the_reprobe() {
        let (stub, coord) = serve(BatchMode::Missing).await;
        let reprobe = Duration::from_millis(300);
        let hb = Heartbeats::batched_with(coord, TEST_LINGER, reprobe);
        let members = names("m", 3);
        let (before, answers) = fire(&hb, &members).await;
        for (i, (sent_at, result)) in answers.iter().enumerate() {
            assert_eq!(result.as_ref().unwrap().member_id, members[i]);
            // The single request's send instant, not the refused batch's.
            assert!(*sent_at > before);
        }
        assert_eq!(*stub.batches.lock().unwrap(), [3]);
        assert_eq!(stub.singles.load(Ordering::SeqCst), 3);
        // From now on: the single route, no batch request.
        let (_, answers) = fire(&hb, &members).await;
        assert!(answers.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(stub.batches.lock().unwrap().len(), 1);
        assert_eq!(stub.singles.load(Ordering::SeqCst), 6);
        // The coordinator is upgraded: picked up after the reprobe delay.
        *stub.mode.lock().unwrap() = BatchMode::Answer;
        let deadline = Instant::now() + Duration::from_secs(10);
        while stub.batches.lock().unwrap().len() < 2 {
            assert!(
                Instant::now() < deadline,
                "the batch route was never tried again"
            );
            let (_, answers) = fire(&hb, &members).await;
            assert!(answers.iter().all(|(_, r)| r.is_ok()));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let singles = stub.singles.load(Ordering::SeqCst);
        let (_, answers) = fire(&hb, &members).await;
        assert!(answers.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(stub.singles.load(Ordering::SeqCst), singles);
        assert_eq!(*stub.batches.lock().unwrap().last().unwrap(), 3);
    }

    #[tokio::test]
    async fn a_failed_batch_request_fails_every_heartbeat_of_it() {
        let (stub, coord) = serve(BatchMode::Unavailable).await;
        let hb = Heartbeats::batched_with(coord, TEST_LINGER, REPROBE_AFTER);
        let (_, answers) = fire(&hb, &names("m", 3)).await;
        assert_eq!(*stub.batches.lock().unwrap(), [3]);
        for (_, r) in &answers {
            let e = r.as_ref().unwrap_err();
            assert_eq!(api_parts(e).1, 503);
            assert_eq!(e.code(), Some(ErrorCode::StoreUnavailable));
            assert!(e.is_retriable());
        }
        assert_eq!(stub.singles.load(Ordering::SeqCst), 0);

        // Unreachable: every heartbeat gets the transport error.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let hb = Heartbeats::batched_with(
            CoordinatorClient::builder([url]).build().unwrap(),
            TEST_LINGER,
            REPROBE_AFTER,
        );
        let (_, answers) = fire(&hb, &names("m", 3)).await;
        for (_, r) in &answers {
            let e = r.as_ref().unwrap_err();
            assert!(matches!(e, CoordinatorError::Transport { .. }), "{e:?}");
            assert!(e.is_retriable());
        }
    }

    #[tokio::test]
    async fn without_batching_every_heartbeat_takes_the_single_route() {
        let (stub, coord) = serve(BatchMode::Answer).await;
        assert!(!Heartbeats::for_app(coord.clone(), true, 1).is_batched());
        assert!(Heartbeats::for_app(coord.clone(), true, 2).is_batched());
        let hb = Heartbeats::for_app(coord, false, 8);
        assert!(!hb.is_batched());
        let members = names("m", 4);
        let (before, answers) = fire(&hb, &members).await;
        for (i, (sent_at, r)) in answers.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().member_id, members[i]);
            assert!(*sent_at >= before);
        }
        assert_eq!(stub.singles.load(Ordering::SeqCst), 4);
        assert!(stub.batches.lock().unwrap().is_empty());
        // And no grid: the next heartbeat one interval after the send, as always.
        let t = Instant::now();
        let i = Duration::from_millis(300);
        assert_eq!(hb.next_periodic(t, i), t + i);
    }

    #[tokio::test]
    async fn batches_are_chunked_and_split_on_413() {
        let (stub, coord) = serve(BatchMode::Answer).await;
        let hb = Heartbeats::batched_with(coord.clone(), TEST_LINGER, REPROBE_AFTER);
        let members = names("m", MAX_HEARTBEAT_BATCH + 1);
        let (_, answers) = fire(&hb, &members).await;
        for (i, (_, r)) in answers.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().member_id, members[i]);
        }
        let mut sizes = stub.batches.lock().unwrap().clone();
        sizes.sort_unstable();
        assert_eq!(sizes, [500, 501]);

        let (stub, coord) = serve(BatchMode::Limit(2)).await;
        let hb = Heartbeats::batched_with(coord, TEST_LINGER, REPROBE_AFTER);
        let members = names("m", 8);
        let (_, answers) = fire(&hb, &members).await;
        for (i, (_, r)) in answers.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().member_id, members[i]);
        }
        // 8 refused, 4 + 4 refused, 4 × 2 answered; then at most 2 per request at once.
        assert_eq!(stub.batches.lock().unwrap().len(), 7);
        stub.batches.lock().unwrap().clear();
        let (_, answers) = fire(&hb, &members).await;
        assert!(answers.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(*stub.batches.lock().unwrap(), [2, 2, 2, 2]);
        assert_eq!(stub.singles.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_next_periodic_heartbeat_is_on_the_grid_and_never_later() {
        let base = Instant::now();
        let i = Duration::from_millis(300);
        for offset_ms in [0u64, 1, 150, 299, 300, 301, 12_345] {
            let sent = base + Duration::from_millis(offset_ms);
            let next = grid_point(base, i, sent);
            assert!(next > sent && next <= sent + i, "{offset_ms}");
            assert_eq!((next - base).as_nanos() % i.as_nanos(), 0, "{offset_ms}");
        }
        // Members sent in the same interval land on the same instant.
        assert_eq!(
            grid_point(base, i, base + Duration::from_millis(310)),
            grid_point(base, i, base + Duration::from_millis(590))
        );
        // Degenerate cases: as the single route.
        let before = base.checked_sub(Duration::from_millis(5)).unwrap_or(base);
        if before < base {
            assert_eq!(grid_point(base, i, before), before + i);
        }
        assert_eq!(grid_point(base, Duration::ZERO, base), base);
    }
}
