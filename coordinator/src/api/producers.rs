//! Producer routes (role `producer`): routing metadata.

use super::AppState;
use super::extract::{Json, Path};
use crate::auth::Principal;
use crate::http_error::ApiError;
use axum::extract::State;
use rsc_protocol::RoutingResponse;
use rsc_protocol::StreamId;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(routing))
}

/// The routing layout producers use: shard count, routing epoch, hash, shard keys.
#[utoipa::path(
    get, path = "/v1/streams/{stream}/routing", tag = "producers",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    responses(
        (status = 200, description = "The stream's routing", body = RoutingResponse),
    )
)]
async fn routing(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
) -> Result<Json<RoutingResponse>, ApiError> {
    Ok(Json(s.coordinator.routing(&stream).await?))
}
