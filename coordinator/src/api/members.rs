//! Member routes (role `member`): heartbeat and leave.

use super::AppState;
use super::error::{ApiError, Json, Path};
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use rsc_protocol::{HeartbeatRequest, HeartbeatResponse, LeaveRequest, LeaveResponse};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/groups/{group}/heartbeat", post(heartbeat))
        .route("/v1/groups/{group}/leave", post(leave))
}

async fn heartbeat(
    State(s): State<AppState>,
    Path(group): Path<String>,
    Json(req): Json<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    Ok(Json(s.coordinator.heartbeat(&group, &req).await?))
}

async fn leave(
    State(s): State<AppState>,
    Path(group): Path<String>,
    Json(req): Json<LeaveRequest>,
) -> Result<Json<LeaveResponse>, ApiError> {
    Ok(Json(s.coordinator.leave(&group, &req).await?))
}
