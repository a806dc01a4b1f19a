//! Admin routes (role `admin`): groups, members, reshard, rollback.

use super::AppState;
use super::error::{ApiError, Json, Path, Query};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, patch, post};
use rsc_protocol::{CreateGroupRequest, GroupView, PatchGroupRequest, ReshardRequest, StreamView};
use serde::Deserialize;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/groups", post(create_group))
        .route(
            "/v1/groups/{group}",
            patch(patch_group).delete(delete_group),
        )
        .route("/v1/groups/{group}/members/{member}", delete(remove_member))
        .route("/v1/streams/{stream}/reshard", post(reshard))
        .route("/v1/streams/{stream}/rollback", post(rollback))
}

async fn create_group(
    State(s): State<AppState>,
    Json(req): Json<CreateGroupRequest>,
) -> Result<(StatusCode, Json<GroupView>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(s.coordinator.create_group(&req).await?),
    ))
}

async fn patch_group(
    State(s): State<AppState>,
    Path(group): Path<String>,
    Json(req): Json<PatchGroupRequest>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(s.coordinator.patch_group(&group, &req).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteParams {
    #[serde(default)]
    force: bool,
}

async fn delete_group(
    State(s): State<AppState>,
    Path(group): Path<String>,
    Query(p): Query<DeleteParams>,
) -> Result<StatusCode, ApiError> {
    s.coordinator.delete_group(&group, p.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn remove_member(
    State(s): State<AppState>,
    Path((group, member)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    s.coordinator.remove_member(&group, &member).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn reshard(
    State(s): State<AppState>,
    Path(stream): Path<String>,
    Json(req): Json<ReshardRequest>,
) -> Result<(StatusCode, Json<StreamView>), ApiError> {
    let view = s.coordinator.reshard(&stream, req.shard_count).await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

async fn rollback(
    State(s): State<AppState>,
    Path(stream): Path<String>,
) -> Result<(StatusCode, Json<StreamView>), ApiError> {
    Ok((
        StatusCode::ACCEPTED,
        Json(s.coordinator.rollback(&stream).await?),
    ))
}
