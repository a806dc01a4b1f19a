//! Monitoring routes (role `viewer`) and unauthenticated health checks.

use super::AppState;
use super::error::{ApiError, Json, Path};
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use rsc_protocol::{ErrorCode, GroupList, GroupView, StreamList, StreamView};
use serde_json::{Value, json};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/groups", get(list_groups))
        .route("/v1/groups/{group}", get(describe_group))
        .route("/v1/streams", get(list_streams))
        .route("/v1/streams/{stream}", get(describe_stream))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn list_groups(State(s): State<AppState>) -> Result<Json<GroupList>, ApiError> {
    Ok(Json(GroupList {
        groups: s.coordinator.list_groups().await?,
    }))
}

async fn describe_group(
    State(s): State<AppState>,
    Path(group): Path<String>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(s.coordinator.describe_group(&group).await?))
}

async fn list_streams(State(s): State<AppState>) -> Result<Json<StreamList>, ApiError> {
    Ok(Json(StreamList {
        streams: s.coordinator.list_streams().await?,
    }))
}

async fn describe_stream(
    State(s): State<AppState>,
    Path(stream): Path<String>,
) -> Result<Json<StreamView>, ApiError> {
    Ok(Json(s.coordinator.describe_stream(&stream).await?))
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    s.coordinator
        .store()
        .ping()
        .await
        .map_err(|e| ApiError::new(ErrorCode::StoreUnavailable, e.to_string()))?;
    Ok(Json(json!({"status": "ready"})))
}
