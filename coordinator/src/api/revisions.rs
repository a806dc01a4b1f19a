//! The metadata history (PROTOCOL §22): revisions of a group or stream document (role
//! `viewer`), the diff of two revisions of a group, and the restore of a group to a revision
//! (role `admin`; audited and rate-limited by the access middleware).

use super::AppState;
use super::extract::{Json, Path, Query};
use crate::auth::Principal;
use crate::http_error::ApiError;
use crate::revisions::{DiffView, RestorePlan, RestoreRequest, RevisionsPage};
use axum::extract::State;
use rsc_protocol::{GroupId, StreamId};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(group_revisions))
        .routes(routes!(stream_revisions))
        .routes(routes!(group_diff))
        .routes(routes!(restore_group))
}

/// A page of revisions, newest first.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct PageQuery {
    /// Only records of revisions below this one (the `next_before` of the previous page).
    before: Option<u64>,
    /// Records per page (1..=1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// The two revisions to compare.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DiffQuery {
    /// The earlier revision (0: before the group existed).
    from: u64,
    /// The later revision.
    to: u64,
}

/// The group document's kept history, newest first: per committed change its revision,
/// time, cause, principal and changed paths (PROTOCOL §22).
#[utoipa::path(
    get, path = "/v1/groups/{group}/revisions", tag = "monitoring",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing"), PageQuery),
    responses(
        (status = 200, description = "A page of the group's revisions", body = RevisionsPage),
        (status = 404, description = "GROUP_NOT_FOUND", body = rsc_protocol::ErrorBody),
    )
)]
async fn group_revisions(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Query(q): Query<PageQuery>,
) -> Result<Json<RevisionsPage>, ApiError> {
    Ok(Json(
        s.coordinator
            .group_revisions(&group, q.before, q.limit)
            .await?,
    ))
}

/// The stream document's kept history, newest first (PROTOCOL §22).
#[utoipa::path(
    get, path = "/v1/streams/{stream}/revisions", tag = "monitoring",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders"), PageQuery),
    responses(
        (status = 200, description = "A page of the stream's revisions", body = RevisionsPage),
        (status = 404, description = "STREAM_NOT_FOUND", body = rsc_protocol::ErrorBody),
    )
)]
async fn stream_revisions(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
    Query(q): Query<PageQuery>,
) -> Result<Json<RevisionsPage>, ApiError> {
    Ok(Json(
        s.coordinator
            .stream_revisions(&stream, q.before, q.limit)
            .await?,
    ))
}

/// What changed in the group document from revision `from` to revision `to` (both kept).
#[utoipa::path(
    get, path = "/v1/groups/{group}/diff", tag = "monitoring",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing"), DiffQuery),
    responses(
        (status = 200, description = "The changed paths", body = DiffView),
        (status = 400, description = "INVALID_REQUEST: a revision is not kept", body = rsc_protocol::ErrorBody),
        (status = 404, description = "GROUP_NOT_FOUND", body = rsc_protocol::ErrorBody),
    )
)]
async fn group_diff(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Query(q): Query<DiffQuery>,
) -> Result<Json<DiffView>, ApiError> {
    Ok(Json(s.coordinator.group_diff(&group, q.from, q.to).await?))
}

/// Restore the group's settings as they were at `revision`: every member removed, group and
/// assignment epochs 1000 above every epoch recorded, so no fenced member becomes valid
/// again; members rejoin. Refused while members are live unless `force`; with `dry_run`,
/// only the plan (PROTOCOL §22).
#[utoipa::path(
    post, path = "/v1/groups/{group}/restore", tag = "admin",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    request_body = RestoreRequest,
    responses(
        (status = 200, description = "The plan (carried out unless dry_run)", body = RestorePlan),
        (status = 400, description = "INVALID_REQUEST: the revision is not kept or not earlier", body = rsc_protocol::ErrorBody),
        (status = 409, description = "GROUP_NOT_EMPTY: live members and no force", body = rsc_protocol::ErrorBody),
    )
)]
async fn restore_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Json(req): Json<RestoreRequest>,
) -> Result<Json<RestorePlan>, ApiError> {
    Ok(Json(s.coordinator.restore_revision(&group, &req).await?))
}
