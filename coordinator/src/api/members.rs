//! Member routes (role `member`): heartbeat and leave.

use super::AppState;
use super::error::{ApiError, Json, Path};
use crate::metrics;
use axum::extract::State;
use rsc_protocol::{HeartbeatRequest, HeartbeatResponse, LeaveRequest, LeaveResponse};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(heartbeat))
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
