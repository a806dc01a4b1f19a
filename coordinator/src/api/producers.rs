//! Producer routes (role `producer`): routing metadata.

use super::AppState;
use super::error::{ApiError, Json, Path};
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use rsc_protocol::RoutingResponse;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/v1/streams/{stream}/routing", get(routing))
}

async fn routing(
    State(s): State<AppState>,
    Path(stream): Path<String>,
) -> Result<Json<RoutingResponse>, ApiError> {
    Ok(Json(s.coordinator.routing(&stream).await?))
}
