//! Member routes (role `member`): heartbeat, batched heartbeats, leave and the wake-up
//! channel.
//!
//! The edge of what members write (PROTOCOL §4.3, §8): every heartbeat is checked against the
//! field limits before it reaches the service ([`over_limit`]), and a principal whose ACL entry
//! carries `members` globs may name only those member ids ([`check_member`]).

use super::AppState;
use super::extract::{Json, Path};
use crate::auth::{Credential, Principal, check_item_group};
use crate::http_error::ApiError;
use crate::metrics;
use crate::service::ServiceError;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use rsc_protocol::GroupId;
use rsc_protocol::{
    BatchedHeartbeat, BatchedHeartbeatResult, ErrorCode, HeartbeatBatchRequest,
    HeartbeatBatchResponse, HeartbeatRequest, HeartbeatResponse, LeaveRequest, LeaveResponse,
    LimitError, MAX_HEARTBEAT_BATCH, MAX_WAKE_MEMBERS, WakeChannelRequest, WakeEvent,
    WakeEventName,
};
use std::convert::Infallible;
use tracing::Instrument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// How long a member refused a wake-up channel (the coordinator holds its maximum) waits
/// before asking again (`Retry-After`); its heartbeats work meanwhile.
const WAKE_RETRY_AFTER_MS: u64 = 30_000;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(heartbeat))
        .routes(routes!(heartbeat_batch))
        .routes(routes!(leave))
        .routes(routes!(wakeups))
}

/// Heartbeat: join (epoch 0), stay (current epoch) or leave (epoch -1); answers the
/// member's assignment (PROTOCOL §5).
#[utoipa::path(
    post, path = "/v1/groups/{group}/heartbeat", tag = "members",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "The member's epoch and assignment", body = HeartbeatResponse),
        (status = 400, description = "INVALID_REQUEST: malformed body, bad name, or a field over its limit (PROTOCOL §4.3)", body = rsc_protocol::ErrorBody),
        (status = 403, description = "FORBIDDEN: no member role, the group out of scope, or a member id the principal is not bound to", body = rsc_protocol::ErrorBody),
        (status = 409, description = "FENCED_MEMBER_EPOCH or GROUP_MAX_SIZE_REACHED", body = rsc_protocol::ErrorBody),
    )
)]
async fn heartbeat(
    State(s): State<AppState>,
    principal: Principal,
    Path(group): Path<GroupId>,
    Json(req): Json<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    req.check_limits()
        .map_err(|e| over_limit(&principal, e, true))?;
    check_member(&principal, &req.member_id, true)?;
    let r = s.coordinator.heartbeat(&group, &req).await;
    metrics::record_heartbeat(&group, r.as_ref().map(|_| ()).map_err(|e| e.code()));
    Ok(Json(r?))
}

/// Batched heartbeats: the heartbeats of several members, of any mix of groups, in one
/// request. Each item is answered as `POST /v1/groups/{group}/heartbeat` would answer it, in
/// its own result (`status` 200 with `response`, or the single route's error status with
/// `error`), in request order; a failing item never fails the others. A coordinator without
/// this route answers 404 `NOT_FOUND`: clients then send single heartbeats.
#[utoipa::path(
    post, path = "/v1/heartbeats", tag = "members",
    request_body = HeartbeatBatchRequest,
    responses(
        (status = 200, description = "One result per heartbeat, in request order", body = HeartbeatBatchResponse),
        (status = 400, description = "INVALID_REQUEST: malformed body, unknown field, or not 1 to 1000 heartbeats", body = rsc_protocol::ErrorBody),
    )
)]
async fn heartbeat_batch(
    State(s): State<AppState>,
    principal: Principal,
    Json(req): Json<HeartbeatBatchRequest>,
) -> Result<Json<HeartbeatBatchResponse>, ApiError> {
    let n = req.heartbeats.len();
    check_batch_size(n)?;
    let span = tracing::debug_span!("heartbeat_batch", items = n);
    async move {
        metrics::record_heartbeat_batch(n);
        let scoped = admit_items(&principal, &req.heartbeats);
        let admitted: Vec<(&str, &HeartbeatRequest)> = req
            .heartbeats
            .iter()
            .zip(&scoped)
            .filter(|(_, scope)| scope.is_ok())
            .map(|(h, _)| (h.group.as_str(), &h.heartbeat))
            .collect();
        let mut answers = s.coordinator.heartbeat_batch(&admitted).await.into_iter();
        let results: Vec<BatchedHeartbeatResult> = req
            .heartbeats
            .into_iter()
            .zip(scoped)
            .map(|(h, scope)| {
                let outcome = scope.and_then(|()| {
                    // The service answers every admitted item, in order: a missing answer
                    // would be its bug, answered as the service's conflict the member retries.
                    let r = answers
                        .next()
                        .unwrap_or_else(|| Err(ServiceError::unanswered()))
                        .map_err(ApiError::from);
                    metrics::record_heartbeat(&h.group, r.as_ref().map(|_| ()).map_err(|e| e.code));
                    r
                });
                batch_result(h, outcome)
            })
            .collect();
        let server_errors = results.iter().filter(|r| r.status >= 500).count();
        if server_errors > 0 {
            tracing::warn!(
                items = n,
                failed = server_errors,
                "heartbeats of a batch failed with a server error"
            );
        }
        Ok(Json(HeartbeatBatchResponse { results }))
    }
    .instrument(span)
    .await
}

/// The checks of each item of a batch, in order: the field limits, the group scope and the
/// member binding. An item that fails one is refused alone, unprocessed. Refusals are logged
/// once for the batch.
fn admit_items(principal: &Principal, items: &[BatchedHeartbeat]) -> Vec<Result<(), ApiError>> {
    let (mut over, mut unbound) = (0, 0);
    let admitted = items
        .iter()
        .map(|h| {
            h.check_limits().map_err(|e| {
                over += 1;
                over_limit(principal, e, false)
            })?;
            check_item_group(principal, &h.group)?;
            check_member(principal, &h.heartbeat.member_id, false).inspect_err(|_| unbound += 1)
        })
        .collect();
    if over + unbound > 0 {
        tracing::info!(
            principal = principal.name(),
            items = items.len(),
            over_limits = over,
            not_bound = unbound,
            "heartbeats of a batch refused: fields over their limits (PROTOCOL §4.3), or \
             member ids the principal is not bound to (§8)"
        );
    }
    admitted
}

/// `400 INVALID_REQUEST` for a field over its limit (PROTOCOL §4.3), naming the field and
/// the limit; counted in `rsc_invalid_requests_total{reason, field}`. `log` says whether to
/// log it here (a batch logs once for all its items).
fn over_limit(principal: &Principal, e: LimitError, log: bool) -> ApiError {
    ::metrics::counter!(
        "rsc_invalid_requests_total",
        "reason" => e.reason(),
        "field" => e.field()
    )
    .increment(1);
    if log {
        tracing::info!(
            principal = principal.name(),
            field = e.field(),
            reason = e.reason(),
            "heartbeat refused: a field over its limit (PROTOCOL §4.3)"
        );
    }
    ApiError::new(ErrorCode::InvalidRequest, e.to_string())
}

/// `403 FORBIDDEN` unless the principal may act as member `member_id` (its ACL entry's
/// `members` globs cover it, or it has none; PROTOCOL §8), counted as an access refusal
/// (`rsc_access_refusals_total`) and, with `log`, logged. The id is at most 200 bytes here
/// (checked before).
fn check_member(principal: &Principal, member_id: &str, log: bool) -> Result<(), ApiError> {
    if principal.may_member(member_id) {
        return Ok(());
    }
    ::metrics::counter!("rsc_access_refusals_total", "code" => ErrorCode::Forbidden.as_str())
        .increment(1);
    if log {
        tracing::info!(
            principal = principal.name(),
            member = member_id,
            "member route refused: the principal is not bound to the member id"
        );
    }
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "principal {} is not bound to member id {member_id:?}: its ACL entry's members \
             globs do not cover it (PROTOCOL §8)",
            principal.name()
        ),
    ))
}

/// Refuses a batch of `n` heartbeats unless 1 ≤ `n` ≤ [`MAX_HEARTBEAT_BATCH`].
fn check_batch_size(n: usize) -> Result<(), ApiError> {
    if n == 0 || n > MAX_HEARTBEAT_BATCH {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a heartbeat batch carries 1 to {MAX_HEARTBEAT_BATCH} heartbeats \
                 (MAX_HEARTBEAT_BATCH), not {n}; split larger batches"
            ),
        ));
    }
    Ok(())
}

/// One item's result in a batch answer: its answer, or the single route's error status with
/// the error.
fn batch_result(
    h: BatchedHeartbeat,
    outcome: Result<HeartbeatResponse, ApiError>,
) -> BatchedHeartbeatResult {
    let (status, response, error) = match outcome {
        Ok(response) => (200, Some(response), None),
        Err(e) => (e.code.http_status(), None, Some(e.into_detail())),
    };
    BatchedHeartbeatResult {
        group: h.group,
        member_id: h.heartbeat.member_id,
        status,
        response,
        error,
    }
}

/// Leave the group at once; the member's shards are freed without waiting.
#[utoipa::path(
    post, path = "/v1/groups/{group}/leave", tag = "members",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    request_body = LeaveRequest,
    responses(
        (status = 200, description = "The member left", body = LeaveResponse),
        (status = 403, description = "FORBIDDEN: no member role, the group out of scope, or a member id the principal is not bound to", body = rsc_protocol::ErrorBody),
        (status = 409, description = "FENCED_MEMBER_EPOCH", body = rsc_protocol::ErrorBody),
    )
)]
async fn leave(
    State(s): State<AppState>,
    principal: Principal,
    Path(group): Path<GroupId>,
    Json(req): Json<LeaveRequest>,
) -> Result<Json<LeaveResponse>, ApiError> {
    check_member(&principal, &req.member_id, true)?;
    let r = s.coordinator.leave(&group, &req).await;
    if let Err(e) = &r
        && e.code() == rsc_protocol::ErrorCode::FencedMemberEpoch
    {
        metrics::record_stale_epoch(&group);
    }
    Ok(Json(r?))
}

/// Wake-up channel: a server-sent event stream that tells the listed members "your
/// assignment changed: heartbeat now" as soon as any coordinator replica writes a change they
/// must act on (new shards, shards to revoke, a shard released by its previous owner, a
/// reshard, removal, group deletion). One channel per process covers all its members. A
/// wake-up is a hint: the heartbeat stays the authority and the liveness signal, and a
/// member without a channel works as before, learning at its next heartbeat.
///
/// The stream starts with `event: ready` (`data: {"members": N}`), then carries
/// `event: wake` with `data: {"group": G, "member_id": M}`, and a keep-alive comment every
/// 15 s. The coordinator ends it after its idle timeout without a wake-up
/// (`--wake-idle-timeout-ms`) or when it shuts down: reopen it. Every item's `group` must be
/// in the token's scope, and every `member_id` one the principal is bound to (else
/// `403 FORBIDDEN` for the whole request). Past the coordinator's channel limit
/// (`--wake-max-channels`) or the principal's (`--wake-max-channels-per-principal`):
/// `429 RATE_LIMITED` with `Retry-After`; a coordinator without the route (older, or the
/// limit set to 0) answers `404 NOT_FOUND`.
#[utoipa::path(
    post, path = "/v1/wakeups", tag = "members",
    request_body = WakeChannelRequest,
    responses(
        (status = 200, description = "A text/event-stream of `ready`, then `wake` events (data: WakeChannelEvent)", body = rsc_protocol::WakeChannelEvent, content_type = "text/event-stream"),
        (status = 400, description = "INVALID_REQUEST: malformed body, bad name, or not 1 to 1000 members", body = rsc_protocol::ErrorBody),
        (status = 404, description = "NOT_FOUND: wake-up channels are turned off on this coordinator", body = rsc_protocol::ErrorBody),
        (status = 403, description = "FORBIDDEN: no member role, or an item's group out of scope or member id the principal is not bound to", body = rsc_protocol::ErrorBody),
        (status = 429, description = "RATE_LIMITED: the coordinator, or the principal, holds its maximum of open channels; retry after Retry-After seconds (heartbeats work meanwhile)", body = rsc_protocol::ErrorBody),
    )
)]
async fn wakeups(
    State(s): State<AppState>,
    principal: Principal,
    Json(req): Json<WakeChannelRequest>,
) -> Result<Response, ApiError> {
    let Some(hub) = s.coordinator.wakeups().cloned() else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "wake-up channels are turned off on this coordinator (--wake-max-channels 0): \
             members learn of changes at their heartbeats",
        ));
    };
    let n = req.members.len();
    if n == 0 || n > MAX_WAKE_MEMBERS {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a wake-up channel covers 1 to {MAX_WAKE_MEMBERS} members (MAX_WAKE_MEMBERS), \
                 not {n}; open several channels"
            ),
        ));
    }
    for m in &req.members {
        check_item_group(&principal, &m.group)?;
        check_member(&principal, &m.member_id, true)?;
    }
    // Channels count against their principal's limit; without an ACL every request is
    // `anonymous` (every process alike): only the coordinator's limit applies (PROTOCOL §13).
    let capped = (principal.credential() != Credential::Anonymous).then(|| principal.name());
    let channel = hub.open(req.members, capped).await.map_err(|e| {
        tracing::warn!(
            open = hub.open_channels(),
            principal = principal.name(),
            reason = e.reason(),
            "wake-up channel refused: {e}"
        );
        ApiError {
            retry_after_ms: Some(WAKE_RETRY_AFTER_MS),
            ..ApiError::new(ErrorCode::RateLimited, e.to_string())
        }
    })?;
    tracing::debug!(members = n, "wake-up channel opened");
    let ready = Event::default()
        .event(WakeEventName::Ready.as_str())
        .json_data(rsc_protocol::ReadyEvent { members: n as u64 })
        .unwrap_or_else(|_| Event::default().event(WakeEventName::Ready.as_str()));
    let wakes = futures::stream::unfold(channel, |mut ch| async move {
        match ch.next().await {
            crate::wake::Next::Wake(events) => Some((events, ch)),
            crate::wake::Next::Close => None,
        }
    })
    .flat_map(|events: Vec<WakeEvent>| {
        futures::stream::iter(events.into_iter().map(|e| {
            Ok::<_, Infallible>(
                Event::default()
                    .event(WakeEventName::Wake.as_str())
                    .json_data(&e)
                    .unwrap_or_else(|_| Event::default().event(WakeEventName::Wake.as_str())),
            )
        }))
    });
    let stream = futures::stream::once(async move { Ok::<_, Infallible>(ready) }).chain(wakes);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(hub.limits().keep_alive))
        .into_response())
}
