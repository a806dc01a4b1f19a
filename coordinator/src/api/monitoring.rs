//! Monitoring routes (role `viewer`; a member may read its own group), the audit log,
//! Prometheus metrics, and unauthenticated health checks.

use super::AppState;
use super::extract::{Json, Path, Query};
use crate::auth::Principal;
use crate::http_error::ApiError;
use crate::metrics::{self, LagProbe};
use crate::store::{AUDIT_RETAINED, AuditFilter, AuditLog};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use rsc_protocol::{
    AuditEntry, AuditList, ErrorCode, GroupHistory, GroupList, GroupView, ScalingView,
    StaleConsumer, StreamList, StreamView,
};
use rsc_protocol::{GroupId, StreamId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Default and largest `limit` of `GET /v1/audit`.
const AUDIT_DEFAULT_LIMIT: usize = 100;
const AUDIT_MAX_LIMIT: usize = 1000;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_groups))
        .routes(routes!(describe_group))
        .routes(routes!(group_scaling))
        .routes(routes!(group_history))
        .routes(routes!(list_streams))
        .routes(routes!(describe_stream))
        .routes(routes!(dlq_list))
        .routes(routes!(audit))
        .routes(routes!(prometheus_metrics))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Fills `lag`, `pending`, `time_lag_ms` and the position (`last_delivered_id`,
/// `last_delivered_ms`) of the view's shards from the data Redis, when configured.
async fn with_lag(lag: Option<&LagProbe>, mut view: GroupView, now_ms: u64) -> GroupView {
    if let Some(probe) = lag {
        let keys: Vec<(u32, String)> = view
            .shards
            .iter()
            .map(|s| (s.shard, s.key.clone()))
            .collect();
        let positions = probe.group_positions(&view.group, &keys).await;
        for s in &mut view.shards {
            if let Some(p) = positions.get(&s.shard) {
                let st = &p.stats;
                s.lag = st.lag;
                s.pending = st.pending;
                s.time_lag_ms = st.time_lag_ms(now_ms);
                s.last_delivered_ms = id_ms(&p.last_delivered);
                s.last_delivered_id = Some(p.last_delivered.clone());
            }
        }
    }
    view
}

/// The Unix ms of an entry id (`None` for `0-0` and for what is not an id).
fn id_ms(id: &str) -> Option<u64> {
    rsc_protocol::routing::parse_entry_id(id)
        .filter(|&(ms, seq)| (ms, seq) != (0, 0))
        .map(|(ms, _)| ms)
}

/// Fills each shard's oldest pending entry (`oldest_pending_id`, `oldest_pending_age_ms`)
/// from the data Redis, when configured and something is pending there. Single-group view
/// only: one `XPENDING` summary per shard with entries pending.
async fn with_oldest_pending(
    lag: Option<&LagProbe>,
    mut view: GroupView,
    now_ms: u64,
) -> GroupView {
    let Some(probe) = lag else {
        return view;
    };
    let keys: Vec<(u32, String)> = view
        .shards
        .iter()
        .filter(|s| s.pending.is_some_and(|p| p > 0))
        .map(|s| (s.shard, s.key.clone()))
        .collect();
    if keys.is_empty() {
        return view;
    }
    let oldest = probe.oldest_pending(&view.group, &keys).await;
    for s in &mut view.shards {
        if let Some(Some(id)) = oldest.get(&s.shard) {
            s.oldest_pending_age_ms = id_ms(id).map(|ms| now_ms.saturating_sub(ms));
            s.oldest_pending_id = Some(id.clone());
        }
    }
    view
}

/// Fills each shard's `stale_consumers` (consumers of the shard's Redis consumer group that
/// are not members of the group) from the data Redis, when configured. Single-group view
/// only: one `XINFO CONSUMERS` per shard.
async fn with_stale_consumers(lag: Option<&LagProbe>, mut view: GroupView) -> GroupView {
    let Some(probe) = lag else {
        return view;
    };
    let keys: Vec<(u32, String)> = view
        .shards
        .iter()
        .map(|s| (s.shard, s.key.clone()))
        .collect();
    let consumers = probe.group_consumers(&view.group, &keys).await;
    let members: std::collections::HashSet<&str> =
        view.members.iter().map(|m| m.member_id.as_str()).collect();
    let mut stale = std::collections::HashMap::new();
    for (shard, list) in consumers {
        let list: Vec<StaleConsumer> = list
            .into_iter()
            .filter(|(name, _)| !members.contains(name.as_str()))
            .map(|(name, pending)| StaleConsumer { name, pending })
            .collect();
        stale.insert(shard, list);
    }
    for s in &mut view.shards {
        if let Some(list) = stale.remove(&s.shard) {
            s.stale_consumers = list;
        }
    }
    view
}

/// Every group the token's group scope covers.
#[utoipa::path(
    get, path = "/v1/groups", tag = "monitoring",
    responses((status = 200, description = "Groups by id", body = GroupList))
)]
async fn list_groups(
    State(s): State<AppState>,
    principal: Principal,
) -> Result<Json<GroupList>, ApiError> {
    let mut groups = Vec::new();
    for g in s.coordinator.list_groups().await? {
        if principal.may_group(&g.group) {
            groups.push(with_lag(s.lag.as_deref(), g, s.coordinator.clock().now_ms()).await);
        }
    }
    Ok(Json(GroupList { groups }))
}

/// A group: config, epochs, members, shard ownership (with lag and pending entries when the
/// data Redis is reachable) and the stream's reshard.
#[utoipa::path(
    get, path = "/v1/groups/{group}", tag = "monitoring",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    responses((status = 200, description = "The group", body = GroupView))
)]
async fn describe_group(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
) -> Result<Json<GroupView>, ApiError> {
    let view = s.coordinator.describe_group(&group).await?;
    let now_ms = s.coordinator.clock().now_ms();
    let view = with_lag(s.lag.as_deref(), view, now_ms).await;
    let view = with_oldest_pending(s.lag.as_deref(), view, now_ms).await;
    Ok(Json(with_stale_consumers(s.lag.as_deref(), view).await))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ScalingQuery {
    /// Members per consumer process, for `max_replicas` (1..=1024; default: the largest
    /// concurrency the members report, else 1).
    #[param(minimum = 1, maximum = 1024)]
    concurrency: Option<u32>,
}

/// The group's autoscaling signal: lag and pending entries summed over its shards, shards,
/// members, and the most consumer processes worth running. Shaped for KEDA's `metrics-api`
/// scaler (`valueLocation: backlog`); the same numbers as the `rsc_group_*` gauges.
#[utoipa::path(
    get, path = "/v1/groups/{group}/scaling", tag = "monitoring",
    params(
        ("group" = inline(GroupId), Path, description = "Group id", example = "billing"),
        ScalingQuery,
    ),
    responses((status = 200, description = "The group's scaling signal", body = ScalingView))
)]
async fn group_scaling(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
    Query(q): Query<ScalingQuery>,
) -> Result<Json<ScalingView>, ApiError> {
    if let Some(c) = q.concurrency
        && !(1..=1024).contains(&c)
    {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("concurrency is {c}; it must be within 1..=1024"),
        ));
    }
    let view = s.coordinator.describe_group(&group).await?;
    let view = with_lag(s.lag.as_deref(), view, s.coordinator.clock().now_ms()).await;
    Ok(Json(metrics::scaling::scaling(&view, q.concurrency)))
}

/// The group's lag, pending entries and handled entries per second over the last 10
/// minutes, sampled from the data Redis by one of the coordinators and kept in the metadata
/// store, so every coordinator answers the same (no samples without a data Redis).
#[utoipa::path(
    get, path = "/v1/groups/{group}/history", tag = "monitoring",
    params(("group" = inline(GroupId), Path, description = "Group id", example = "billing")),
    responses((status = 200, description = "The group's recent lag and handling rate", body = GroupHistory))
)]
async fn group_history(
    State(s): State<AppState>,
    _principal: Principal,
    Path(group): Path<GroupId>,
) -> Result<Json<GroupHistory>, ApiError> {
    // 404 for a group that does not exist.
    s.coordinator.describe_group(&group).await?;
    Ok(Json(match s.lag.as_deref() {
        Some(_) => s
            .history
            .get(s.coordinator.store().as_ref(), &group)
            .await
            .map_err(crate::service::ServiceError::from)?,
        None => GroupHistory {
            group: group.into(),
            interval_ms: metrics::DEFAULT_HISTORY_INTERVAL.as_millis() as u64,
            samples: Vec::new(),
        },
    }))
}

/// Every stream the token's stream scope covers.
#[utoipa::path(
    get, path = "/v1/streams", tag = "monitoring",
    responses((status = 200, description = "Streams by name", body = StreamList))
)]
async fn list_streams(
    State(s): State<AppState>,
    principal: Principal,
) -> Result<Json<StreamList>, ApiError> {
    let streams = s
        .coordinator
        .list_streams()
        .await?
        .into_iter()
        .filter(|v| principal.may_stream(&v.stream))
        .collect();
    Ok(Json(StreamList { streams }))
}

/// A stream: layout, routing epoch, groups and reshard state.
#[utoipa::path(
    get, path = "/v1/streams/{stream}", tag = "monitoring",
    params(("stream" = inline(StreamId), Path, description = "Stream name", example = "orders")),
    responses((status = 200, description = "The stream", body = StreamView))
)]
async fn describe_stream(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
) -> Result<Json<StreamView>, ApiError> {
    let mut view = s.coordinator.describe_stream(&stream).await?;
    if let Some(probe) = s.lag.as_deref() {
        view.retention_blocked_by =
            crate::retention::blocked_by(probe, &view, s.coordinator.clock().now_ms()).await;
    }
    Ok(Json(view))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DlqQuery {
    /// Only the dead letters of this group.
    #[param(inline)]
    group: Option<GroupId>,
    /// Only those of this routing key.
    key: Option<String>,
    /// Only those whose error contains this text.
    error: Option<String>,
    /// Only those dead-lettered at or after this Unix ms.
    since_ms: Option<u64>,
    /// Only those dead-lettered before this Unix ms.
    until_ms: Option<u64>,
    /// How many (1..=1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    count: Option<u32>,
    /// Start after this dead-letter id (the previous page's `next_after`).
    after: Option<String>,
    /// Newest first (default: oldest first).
    newest_first: Option<bool>,
}

/// A page of a stream's dead letters (PROTOCOL §18), filtered by group, routing key, error
/// text and time, oldest first (or newest first), with the depth per group of the whole
/// dead-letter stream. One list reads at most 20,000 dead letters: a filter that matches
/// few answers fewer and `next_after` where it stopped.
#[utoipa::path(
    get, path = "/v1/streams/{stream}/dlq", tag = "monitoring",
    params(
        ("stream" = inline(StreamId), Path, description = "Stream name", example = "orders"),
        DlqQuery,
    ),
    responses(
        (status = 200, description = "One page of dead letters", body = rsc_protocol::DlqList),
        (status = 400, description = "INVALID_REQUEST (a bad count, id or time window, no data Redis)", body = rsc_protocol::ErrorBody),
        (status = 404, description = "STREAM_NOT_FOUND", body = rsc_protocol::ErrorBody),
    )
)]
async fn dlq_list(
    State(s): State<AppState>,
    _principal: Principal,
    Path(stream): Path<StreamId>,
    Query(q): Query<DlqQuery>,
) -> Result<Json<rsc_protocol::DlqList>, ApiError> {
    let req = crate::service::DlqListRequest {
        filter: crate::dlq::Filter {
            group: q.group.map(|g| g.to_string()),
            key: q.key,
            error: q.error,
            since_ms: q.since_ms,
            until_ms: q.until_ms,
        },
        count: q.count,
        after: q.after,
        newest_first: q.newest_first.unwrap_or(false),
    };
    Ok(Json(s.coordinator.dlq_list(&stream, &req).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// How many entries, newest first (1..=1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// Only entries about this group.
    #[param(inline)]
    group: Option<GroupId>,
    /// Only entries about this stream.
    #[param(inline)]
    stream: Option<StreamId>,
    /// Which log (PROTOCOL §7): `mutations` (admitted admin mutations and the
    /// coordinator's own actions), `refusals` (refused requests, merged and counted), or
    /// `all` (both, merged by time; the default).
    #[param(inline)]
    log: Option<AuditLogParam>,
}

/// The `log` parameter of `GET /v1/audit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum AuditLogParam {
    /// Admitted admin mutations and the coordinator's own actions.
    Mutations,
    /// Refused requests, merged and counted.
    Refusals,
    /// Both, newest first.
    All,
}

/// Whether `p` may read `e`: an entry about groups or streams out of its scopes is left out,
/// and so is every refusal unless its scopes cover everything (a refusal names no group or
/// stream, but its principal and client address belong to the whole deployment).
fn in_scope(p: &Principal, e: &AuditEntry) -> bool {
    if e.count.is_some() && !p.unrestricted() {
        return false;
    }
    e.target.group.as_deref().is_none_or(|g| p.may_group(g))
        && e.target.stream.as_deref().is_none_or(|s| p.may_stream(s))
}

/// The audit log, newest first: admitted admin mutations (with their bodies) and refused
/// requests (merged and counted per client address, principal, route and code, without
/// bodies). Entries about groups or streams outside the token's scopes are left out.
#[utoipa::path(
    get, path = "/v1/audit", tag = "monitoring",
    params(AuditQuery),
    responses((status = 200, description = "Audit entries, newest first", body = AuditList))
)]
async fn audit(
    State(s): State<AppState>,
    principal: Principal,
    Query(q): Query<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let limit = q.limit.unwrap_or(AUDIT_DEFAULT_LIMIT);
    if !(1..=AUDIT_MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("limit is {limit}; it must be within 1..={AUDIT_MAX_LIMIT}"),
        ));
    }
    let filter = AuditFilter {
        group: q.group.map(String::from),
        stream: q.stream.map(String::from),
    };
    // A scoped viewer sees only entries in scope: read further back, then filter.
    let read = if principal.unrestricted() {
        limit
    } else {
        (limit * 10).min(AUDIT_RETAINED)
    };
    let logs: &[AuditLog] = match q.log.unwrap_or(AuditLogParam::All) {
        AuditLogParam::Mutations => &[AuditLog::Mutations],
        AuditLogParam::Refusals => &[AuditLog::Refusals],
        AuditLogParam::All => &[AuditLog::Mutations, AuditLog::Refusals],
    };
    let mut entries: Vec<AuditEntry> = Vec::new();
    for &log in logs {
        entries.extend(
            s.coordinator
                .store()
                .read_audit(log, read, &filter)
                .await
                .map_err(|e| ApiError::new(ErrorCode::StoreUnavailable, e.to_string()))?
                .into_iter()
                .filter(|e| in_scope(&principal, e)),
        );
    }
    // Each log is newest first; merged, the newest of both come first (stable: a mutation
    // before a refusal of the same millisecond).
    entries.sort_by_key(|e| std::cmp::Reverse(e.time_ms));
    entries.truncate(limit);
    Ok(Json(AuditList { entries }))
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(
    get, path = "/metrics", tag = "monitoring",
    responses((status = 200, description = "Metrics in Prometheus text format", body = String, content_type = "text/plain"))
)]
async fn prometheus_metrics(State(s): State<AppState>, _principal: Principal) -> impl IntoResponse {
    let handle = metrics::prometheus();
    handle.run_upkeep();
    let mut body = handle.render();
    let now = s.coordinator.now_ms();
    let dlq = dlq_depths(&s).await;
    body.push_str(
        &metrics::state::render(
            s.coordinator.store().as_ref(),
            now,
            s.lag.as_deref(),
            dlq.as_ref(),
        )
        .await,
    );
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
}

/// The dead letters per group of every stream, for the gauges; `None` without a data Redis.
async fn dlq_depths(s: &AppState) -> Option<metrics::state::DlqDepths> {
    s.lag.as_ref()?;
    let streams = s.coordinator.store().list_streams().await.ok()?;
    let mut out = metrics::state::DlqDepths::new();
    for stream in streams {
        if let Some(d) = s.coordinator.dlq_depths(&stream).await {
            out.insert(stream, d);
        }
    }
    Some(out)
}

/// A health answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HealthStatus {
    /// `ok` (process up) or `ready` (store reachable).
    pub status: String,
}

/// Liveness: the process answers.
#[utoipa::path(
    get, path = "/healthz", tag = "health",
    responses((status = 200, description = "The process is up", body = HealthStatus))
)]
async fn healthz() -> Json<HealthStatus> {
    Json(HealthStatus {
        status: "ok".into(),
    })
}

/// Readiness: the metadata store answers.
#[utoipa::path(
    get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "The store is reachable", body = HealthStatus),
        (status = 503, description = "STORE_UNAVAILABLE", body = rsc_protocol::ErrorBody),
    )
)]
async fn readyz(State(s): State<AppState>) -> Result<Json<HealthStatus>, ApiError> {
    s.coordinator
        .store()
        .ping()
        .await
        .map_err(|e| ApiError::new(ErrorCode::StoreUnavailable, e.to_string()))?;
    Ok(Json(HealthStatus {
        status: "ready".into(),
    }))
}
