//! Member routes (role `member`): heartbeat, batched heartbeats and leave.

use super::AppState;
use super::error::{ApiError, Json, Path};
use crate::auth::{Principal, check_item_group};
use crate::metrics;
use axum::extract::State;
use rsc_protocol::{
    BatchedHeartbeatResult, ErrorCode, HeartbeatBatchRequest, HeartbeatBatchResponse,
    HeartbeatRequest, HeartbeatResponse, LeaveRequest, LeaveResponse, MAX_HEARTBEAT_BATCH,
};
use tracing::Instrument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(heartbeat))
        .routes(routes!(heartbeat_batch))
        .routes(routes!(leave))
}

/// Heartbeat: join (epoch 0), stay (current epoch) or leave (epoch -1); answers the
/// member's assignment (SPEC §5).
#[utoipa::path(
    post, path = "/v1/groups/{group}/heartbeat", tag = "members",
    params(("group" = String, Path, description = "Group id", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", example = "billing")),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "The member's epoch and assignment", body = HeartbeatResponse),
        (status = 409, description = "FENCED_MEMBER_EPOCH or GROUP_MAX_SIZE_REACHED", body = rsc_protocol::ErrorBody),
    )
)]
async fn heartbeat(
    State(s): State<AppState>,
    Path(group): Path<String>,
    Json(req): Json<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
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
    if n == 0 || n > MAX_HEARTBEAT_BATCH {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a heartbeat batch carries 1 to {MAX_HEARTBEAT_BATCH} heartbeats \
                 (MAX_HEARTBEAT_BATCH), not {n}; split larger batches"
            ),
        ));
    }
    let span = tracing::debug_span!("heartbeat_batch", items = n);
    async move {
        metrics::record_heartbeat_batch(n);
        // The group scope, per item: an item out of scope is refused alone, unprocessed.
        let scoped: Vec<Result<(), ApiError>> = req
            .heartbeats
            .iter()
            .map(|h| check_item_group(&principal, &h.group))
            .collect();
        let admitted: Vec<(&str, &HeartbeatRequest)> = req
            .heartbeats
            .iter()
            .zip(&scoped)
            .filter(|(_, scope)| scope.is_ok())
            .map(|(h, _)| (h.group.as_str(), &h.heartbeat))
            .collect();
        let mut answers = s.coordinator.heartbeat_batch(&admitted).await.into_iter();
        let mut server_errors = 0usize;
        let results = req
            .heartbeats
            .into_iter()
            .zip(scoped)
            .map(|(h, scope)| {
                let outcome = scope.and_then(|()| {
                    let r = answers.next().unwrap_or_else(|| {
                        Err(crate::store::StoreError::Conflict(
                            "heartbeat left unanswered; retry".into(),
                        )
                        .into())
                    });
                    metrics::record_heartbeat(
                        &h.group,
                        r.as_ref().map(|_| ()).map_err(|e| e.code()),
                    );
                    r.map_err(ApiError::from)
                });
                let member_id = h.heartbeat.member_id;
                match outcome {
                    Ok(response) => BatchedHeartbeatResult {
                        group: h.group,
                        member_id,
                        status: 200,
                        response: Some(response),
                        error: None,
                    },
                    Err(e) => {
                        let status = e.code.http_status();
                        if status >= 500 {
                            server_errors += 1;
                        }
                        BatchedHeartbeatResult {
                            group: h.group,
                            member_id,
                            status,
                            response: None,
                            error: Some(e.into_detail()),
                        }
                    }
                }
            })
            .collect();
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

/// Leave the group at once; the member's shards are freed without waiting.
#[utoipa::path(
    post, path = "/v1/groups/{group}/leave", tag = "members",
    params(("group" = String, Path, description = "Group id", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", example = "billing")),
    request_body = LeaveRequest,
    responses(
        (status = 200, description = "The member left", body = LeaveResponse),
        (status = 409, description = "FENCED_MEMBER_EPOCH", body = rsc_protocol::ErrorBody),
    )
)]
async fn leave(
    State(s): State<AppState>,
    Path(group): Path<String>,
    Json(req): Json<LeaveRequest>,
) -> Result<Json<LeaveResponse>, ApiError> {
    let r = s.coordinator.leave(&group, &req).await;
    if let Err(e) = &r
        && e.code() == rsc_protocol::ErrorCode::FencedMemberEpoch
    {
        metrics::record_stale_epoch(&group);
    }
    Ok(Json(r?))
}
