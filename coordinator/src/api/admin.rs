//! Admin routes (role `admin`; audited and rate-limited by the access middleware): groups,
//! members, stream settings, reshard, rollback.

use super::AppState;
use super::extract::{Json, Path, Query};
use crate::auth::Principal;
use crate::http_error::ApiError;
use axum::extract::State;
use axum::http::StatusCode;
use rsc_protocol::{
    CreateGroupRequest, GroupView, PatchGroupRequest, PatchStreamRequest, ReshardRequest,
    StreamView,
};
use rsc_protocol::{GroupId, MemberId, StreamId};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_group))
        .routes(routes!(patch_group, delete_group))
        .routes(routes!(remove_member))
        .routes(routes!(pause_group))
        .routes(routes!(resume_group))
        .routes(routes!(seek_group))
        .routes(routes!(patch_stream))
        .routes(routes!(redrive))
        .routes(routes!(dlq_purge))
        .routes(routes!(reshard))
        .routes(routes!(rollback))
}

/// Create a group, and its stream when the stream is new.
#[utoipa::path(
    post, path = "/v1/groups", tag = "admin",
    request_body = CreateGroupRequest,
    responses(
        (status = 201, description = "The group was created", body = GroupView),
        (status = 409, description = "GROUP_ALREADY_EXISTS or SHARD_COUNT_MISMATCH", body = rsc_protocol::ErrorBody),
    )
)]
async fn create_group(
    State(s): State<AppState>,
    _principal: Principal,
    Json(req): Json<CreateGroupRequest>,
) -> Result<(StatusCode, Json<GroupView>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(s.coordinator.create_group(&req).await?),
    ))
}

/// Change a group's timeouts or member limit (bumps the group epoch).
#[utoipa::path(
    patch, path = "/v1/groups/{group}", tag = "admin",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    request_body = PatchGroupRequest,
    responses(
        (status = 200, description = "The group after the change", body = GroupView),
    )
)]
async fn patch_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Json(req): Json<PatchGroupRequest>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(s.coordinator.patch_group(&group, &req).await?))
}

/// Pause a group: every member, in every process, stops fetching within one heartbeat,
/// finishes the messages in flight, and keeps its shards and its session. Durable: it stays
/// paused through rebalances, member restarts and coordinator restarts, until resumed.
#[utoipa::path(
    post, path = "/v1/groups/{group}/pause", tag = "admin",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    responses(
        (status = 200, description = "The group, paused (pausing a paused group changes nothing)", body = GroupView),
    )
)]
async fn pause_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(s.coordinator.set_group_paused(&group, true).await?))
}

/// Resume a paused group: members fetch again from their next heartbeat answer.
#[utoipa::path(
    post, path = "/v1/groups/{group}/resume", tag = "admin",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    responses(
        (status = 200, description = "The group, running (resuming a running group changes nothing)", body = GroupView),
    )
)]
async fn resume_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(s.coordinator.set_group_paused(&group, false).await?))
}

/// Move a paused (or member-less) group's position on its shards (PROTOCOL §18): to
/// `earliest`, `latest`, a time, a duration back, a shift by N entries or an entry id, on
/// every shard or those `shards` names; with `dry_run`, only the plan. Each shard's doorbell
/// is rung: waiting workers read from the new position at once.
#[utoipa::path(
    post, path = "/v1/groups/{group}/seek", tag = "admin",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    request_body = rsc_protocol::SeekRequest,
    responses(
        (status = 200, description = "Per shard, the position before and after (carried out unless dry_run)", body = rsc_protocol::SeekResponse),
        (status = 400, description = "INVALID_REQUEST: no data Redis, a bad target or shard", body = rsc_protocol::ErrorBody),
        (status = 409, description = "GROUP_NOT_EMPTY: live members and not paused", body = rsc_protocol::ErrorBody),
    )
)]
async fn seek_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Json(req): Json<rsc_protocol::SeekRequest>,
) -> Result<Json<rsc_protocol::SeekResponse>, ApiError> {
    let answer = s.coordinator.seek(&group, &req).await?;
    if !answer.dry_run
        && let Some(probe) = s.lag.as_deref()
    {
        // Views read the moved shards afresh: the backlog shows at once.
        let keys: Vec<String> = answer.shards.keys().cloned().collect();
        probe.forget(&keys);
    }
    Ok(Json(answer))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DeleteParams {
    /// Delete even while the group has live members (they are removed).
    #[serde(default)]
    force: bool,
}

/// Delete a group.
#[utoipa::path(
    delete, path = "/v1/groups/{group}", tag = "admin",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing"), DeleteParams),
    responses(
        (status = 204, description = "The group was deleted"),
        (status = 409, description = "GROUP_NOT_EMPTY: live members and no `force=true`", body = rsc_protocol::ErrorBody),
    )
)]
async fn delete_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Query(p): Query<DeleteParams>,
) -> Result<StatusCode, ApiError> {
    s.coordinator.delete_group(&group, p.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Fence and remove a member; its shards are reassigned at once.
#[utoipa::path(
    delete, path = "/v1/groups/{group}/members/{member}", tag = "admin",
    params(
        ("group" = inline(GroupId), Path, description = "Group id", example = "billing"),
        ("member" = inline(MemberId), Path, description = "Member id", example = "10.0.0.7-billing-0"),
    ),
    responses(
        (status = 204, description = "The member was removed"),
    )
)]
async fn remove_member(
    State(s): State<AppState>,
    _principal: Principal,
    Path((group, member)): Path<(GroupId, MemberId)>,
) -> Result<StatusCode, ApiError> {
    s.coordinator.remove_member(&group, &member).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Change a stream's retention policies (PROTOCOL §18): what the coordinator trims from its
/// shard keys and from its dead-letter stream.
#[utoipa::path(
    patch, path = "/v1/streams/{stream}", tag = "admin",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    request_body = PatchStreamRequest,
    responses(
        (status = 200, description = "The stream after the change", body = StreamView),
    )
)]
async fn patch_stream(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
    Json(req): Json<PatchStreamRequest>,
) -> Result<Json<StreamView>, ApiError> {
    Ok(Json(s.coordinator.patch_stream(&stream, &req).await?))
}

/// Republish a group's dead letters (PROTOCOL §18): each dead letter of `group` in
/// `<stream>:dlq` (oldest first, since `since_ms`, at most `limit`) is written again to its
/// key's shard under the current routing, with the header `rsc-redrive-count` counting its
/// redrives, and removed from the dead-letter stream once the write is confirmed. Every
/// group of the stream is delivered the republished entry (header `rsc-redrive-group`
/// names the group it was redriven for). `dry_run` only lists what would be redriven.
#[utoipa::path(
    post, path = "/v1/streams/{stream}/dlq/redrive", tag = "admin",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    request_body = rsc_protocol::RedriveRequest,
    responses(
        (status = 200, description = "The dead letters redriven (or, in a dry run, that would be)", body = rsc_protocol::RedriveResponse),
    )
)]
async fn redrive(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
    Json(req): Json<rsc_protocol::RedriveRequest>,
) -> Result<Json<rsc_protocol::RedriveResponse>, ApiError> {
    Ok(Json(s.coordinator.redrive(&stream, &req).await?))
}

/// Delete dead letters (PROTOCOL §18): those of `<stream>:dlq` that every filter given
/// takes (group, routing key, error text, time window), oldest first, at most `limit`. A dry
/// run (`dry_run`, the default) only lists what would be deleted. Audited as
/// `stream.dlq_purge`, dry run or not.
#[utoipa::path(
    post, path = "/v1/streams/{stream}/dlq/purge", tag = "admin",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    request_body = rsc_protocol::DlqPurgeRequest,
    responses(
        (status = 200, description = "The dead letters deleted (or, in a dry run, that would be)", body = rsc_protocol::DlqPurgeResponse),
        (status = 400, description = "INVALID_REQUEST (a bad limit or time window, no data Redis)", body = rsc_protocol::ErrorBody),
        (status = 404, description = "STREAM_NOT_FOUND", body = rsc_protocol::ErrorBody),
    )
)]
async fn dlq_purge(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
    Json(req): Json<rsc_protocol::DlqPurgeRequest>,
) -> Result<Json<rsc_protocol::DlqPurgeResponse>, ApiError> {
    Ok(Json(s.coordinator.dlq_purge(&stream, &req).await?))
}

/// Start resharding a stream to a new shard count (PROTOCOL §6).
#[utoipa::path(
    post, path = "/v1/streams/{stream}/reshard", tag = "admin",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    request_body = ReshardRequest,
    responses(
        (status = 202, description = "The reshard started", body = StreamView),
        (status = 409, description = "RESHARD_IN_PROGRESS", body = rsc_protocol::ErrorBody),
    )
)]
async fn reshard(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
    Json(req): Json<ReshardRequest>,
) -> Result<(StatusCode, Json<StreamView>), ApiError> {
    let view = s.coordinator.reshard(&stream, req.shard_count).await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// Roll back the latest reshard of a stream (PROTOCOL §6).
#[utoipa::path(
    post, path = "/v1/streams/{stream}/rollback", tag = "admin",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    responses(
        (status = 202, description = "The rollback started", body = StreamView),
        (status = 409, description = "RESHARD_IN_PROGRESS, ROLLBACK_WINDOW_EXPIRED or NOTHING_TO_ROLLBACK", body = rsc_protocol::ErrorBody),
    )
)]
async fn rollback(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
) -> Result<(StatusCode, Json<StreamView>), ApiError> {
    Ok((
        StatusCode::ACCEPTED,
        Json(s.coordinator.rollback(&stream).await?),
    ))
}
