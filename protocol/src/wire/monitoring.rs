//! What the read-only views answer (PROTOCOL §3, §14): routing, group and stream views with
//! their member, shard and reshard states, lag, scaling signals and history.

use serde::{Deserialize, Serialize};

use super::admin::{RetentionPolicy, SeekRecord};
use super::member::ClientInfo;
#[cfg(feature = "openapi")]
use super::shard_map_schema;
use super::{FencingMode, OrderingMode, StartPosition};

/// A member's reconciliation state (KIP-848).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// At the assignment epoch with nothing to revoke and nothing to wait for.
    #[default]
    Stable,
    /// Asked to revoke shards it still reports owning; gets no new shards meanwhile.
    Unrevoked,
    /// At the assignment epoch, waiting for shards other members still hold.
    Unreleased,
}

/// The state of a group as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum GroupState {
    /// No members.
    Empty,
    /// Every member is stable at the assignment epoch.
    Stable,
    /// Some member is still moving towards the target assignment.
    Reconciling,
}

/// The lifecycle state of a shard of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ShardState {
    /// Part of the routing layout: producers write to it.
    Active,
    /// Beyond the shard count after a scale-down: still read until every group drained it.
    Draining,
}

/// Progress of a reshard (PROTOCOL §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ReshardState {
    /// Scale-down shards are still being drained.
    Draining,
    /// The new layout is in force and no shard is left to drain.
    Complete,
}

/// A reshard's progress, as shown in routing, group and stream views.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReshardingView {
    /// Shard count before.
    pub from: u32,
    /// Shard count after.
    pub to: u32,
    /// `draining` or `complete`.
    pub state: ReshardState,
    /// Whether this reshard is a rollback.
    pub rollback: bool,
    /// When it started (Unix ms).
    pub started_ms: u64,
    /// When it completed (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_ms: Option<u64>,
    /// Shards still draining, with the groups that drained each and those still draining it.
    #[serde(default)]
    pub draining: Vec<DrainingShardView>,
    /// The routing epoch it switched to (PROTOCOL §15; absent in answers of older coordinators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_epoch: Option<u64>,
    /// Ordered resharding (PROTOCOL §15): per shard sealed at the switch, the last entry id
    /// written under the previous epoch (shard index as the key). Absent when the
    /// coordinator has no data Redis (no fence, no per-key order through the reshard).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = seals_schema))]
    pub seals: std::collections::BTreeMap<u32, String>,
}

/// [`ReshardingView::seals`]' schema.
#[cfg(feature = "openapi")]
fn seals_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    shard_map_schema(
        "Ordered resharding (PROTOCOL §15): per shard sealed at the switch, the last entry id \
         written under the previous epoch (shard index as the key). Absent when the \
         coordinator has no data Redis.",
    )
}

/// One draining shard's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainingShardView {
    /// Shard index.
    pub shard: u32,
    /// Groups that reported it drained.
    pub drained_groups: Vec<String>,
    /// Groups still reading it.
    pub waiting_groups: Vec<String>,
}

/// `GET /v1/streams/{stream}/routing`: what a producer needs to route (PROTOCOL §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoutingResponse {
    /// The stream.
    pub stream: String,
    /// The shard count producers route over.
    pub shard_count: u32,
    /// Bumped on every layout change.
    pub routing_epoch: u64,
    /// Always `xxh3_64-jump`.
    pub hash: String,
    /// The shard keys, index order.
    pub shard_keys: Vec<String>,
    /// The running reshard, if any.
    pub resharding: Option<ReshardingView>,
}

/// One member in a group view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberView {
    /// Member id.
    pub member_id: String,
    /// Current epoch.
    pub member_epoch: i64,
    /// Reconciliation state.
    pub state: MemberState,
    /// What the client said about itself.
    pub client: Option<ClientInfo>,
    /// Time since the coordinator last heard from it.
    pub last_heartbeat_ms_ago: u64,
    /// What the coordinator wants it to own.
    pub target_shards: Vec<u32>,
    /// What it reported owning in its last heartbeat.
    pub owned_shards: Vec<u32>,
    /// What the coordinator last allowed it to own (its `assignment`).
    pub assigned_shards: Vec<u32>,
    /// Shards it was asked to revoke and still reports owning.
    pub pending_revocation: Vec<u32>,
    /// Static members only: whether it is static (joined with an `incarnation`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_static: bool,
    /// A static member that left with epoch -2: how long ago. Its shards stay assigned to
    /// it, unread, until it joins again or its session expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub away_ms: Option<u64>,
}

/// One shard in a group view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardView {
    /// Shard index.
    pub shard: u32,
    /// Redis Stream key.
    pub key: String,
    /// Member the target assignment gives it to.
    pub target_owner: Option<String>,
    /// Member holding it now (assigned or pending revocation).
    pub current_owner: Option<String>,
    /// `active` or `draining`.
    pub state: ShardState,
    /// Entries not yet delivered to the group, where the data Redis is reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// Entries delivered but not acknowledged, where the data Redis is reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
    /// Time lag (PROTOCOL §18): how old (ms, from its id) the oldest entry not yet delivered
    /// to the group is; `0` when nothing waits. Where the data Redis is reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_lag_ms: Option<u64>,
    /// The group's position on the shard: its Redis consumer group's last-delivered id
    /// (PROTOCOL §18), where the data Redis is reachable and the consumer group exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_id: Option<String>,
    /// The Unix ms of `last_delivered_id` (absent for `0-0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered_ms: Option<u64>,
    /// The oldest entry delivered and not yet acknowledged (`XPENDING` summary); read from
    /// the data Redis in the single-group view only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pending_id: Option<String>,
    /// How old (ms, from its id) `oldest_pending_id` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pending_age_ms: Option<u64>,
    /// Consumers of the shard's Redis consumer group that are not members of the group
    /// (departed members not yet cleaned up), with their pending entries; read from the
    /// data Redis in the single-group view only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_consumers: Vec<StaleConsumer>,
}

/// A consumer of a shard's Redis consumer group that is not a member of the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StaleConsumer {
    /// The consumer name (a departed member's id).
    pub name: String,
    /// Entries still pending for it: it is deleted once the shard's owner claimed them.
    pub pending: u64,
}

/// `GET /v1/groups/{group}`: the whole state of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupView {
    /// Group id.
    pub group: String,
    /// Stream it reads.
    pub stream: String,
    /// Overall state.
    pub state: GroupState,
    /// Where Redis consumer groups start.
    pub start: StartPosition,
    /// Session timeout.
    pub session_timeout_ms: u64,
    /// Heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// Rebalance timeout.
    pub rebalance_timeout_ms: u64,
    /// Member limit (none when absent).
    pub max_members: Option<u32>,
    /// Assignor name.
    pub assignor: String,
    /// Data-path fencing mode.
    pub fencing: FencingMode,
    /// Ordering through reshards (PROTOCOL §15).
    #[serde(default)]
    pub ordering: OrderingMode,
    /// Ordering `key`, while a reshard's moved keys wait: each parent shard with how far the
    /// group is from its seal (PROTOCOL §15). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_on_parents: Vec<ParentProgress>,
    /// Paused by an operator (`POST /v1/groups/{group}/pause`): members fetch nothing new.
    /// A v1 addition (PROTOCOL §14); absent means not paused.
    #[serde(default)]
    pub paused: bool,
    /// When the group was paused (Unix ms), while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_since_ms: Option<u64>,
    /// The group's last seek (PROTOCOL §18), when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seek: Option<SeekRecord>,
    /// Bumped on every change of membership, layout or config.
    pub group_epoch: u64,
    /// The group epoch the target was computed for.
    pub assignment_epoch: u64,
    /// Members, by id.
    pub members: Vec<MemberView>,
    /// Shards, by index.
    pub shards: Vec<ShardView>,
    /// The stream's running reshard.
    pub resharding: Option<ReshardingView>,
    /// Document revision in the store.
    pub revision: u64,
}

/// How far a group is from a parent shard's seal (ordered resharding, PROTOCOL §15): the keys
/// that moved out of `parent` at the switch to `routing_epoch` wait until both counts are 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ParentProgress {
    /// The parent shard (the moved keys' shard before the switch).
    pub parent: u32,
    /// The routing epoch the switch started.
    pub routing_epoch: u64,
    /// The parent's seal: its last entry id written before the switch.
    pub seal: String,
    /// The shards its moved keys went to (they hold those keys' new entries until the
    /// parent reached its seal).
    pub children: Vec<u32>,
    /// Entries up to the seal not yet delivered to the group (counted up to 10,000; -1: the
    /// group has no consumer group on the parent yet).
    pub undelivered: i64,
    /// Entries up to the seal delivered and not yet acknowledged (counted up to 10,000).
    pub pending: i64,
}

/// `GET /v1/groups` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupList {
    /// Every group, by id.
    pub groups: Vec<GroupView>,
}

/// `GET /v1/groups/{group}/scaling`: the autoscaling signal of a group, shaped for KEDA's
/// `metrics-api` scaler (`valueLocation: backlog`, or `lag`) and matching the
/// `rsc_group_*` scaling gauges of `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScalingView {
    /// Group id.
    pub group: String,
    /// Stream it reads.
    pub stream: String,
    /// Entries not yet delivered to the group, summed over the shards that reported
    /// (`null` when none did, e.g. without a data Redis).
    pub lag: Option<u64>,
    /// Entries delivered and not yet acknowledged, summed over the shards that reported.
    pub pending: Option<u64>,
    /// `lag + pending`: the work waiting for the group.
    pub backlog: Option<u64>,
    /// Time lag (PROTOCOL §18): the largest of the shards' `time_lag_ms` (the age of the
    /// oldest entry not yet delivered), over the shards that reported; like Kinesis'
    /// `MillisBehindLatest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_lag_ms: Option<u64>,
    /// Shards the group reads (active and draining).
    pub shards: u32,
    /// Shards whose lag was read; below `shards` the sums are partial.
    pub shards_reporting: u32,
    /// Active shards (in the routing layout).
    pub active_shards: u32,
    /// Members of the group.
    pub members: u32,
    /// Members with no shard in the target assignment: members beyond the shard count sit
    /// idle.
    pub idle_members: u32,
    /// Members per consumer process used for `max_replicas` (the `concurrency` query
    /// parameter, else the largest concurrency the members report, else 1).
    pub concurrency: u32,
    /// Consumer processes with a member of the group (distinct pod IP or host).
    pub processes: u32,
    /// Most consumer processes worth running: `ceil(active_shards / concurrency)`. More
    /// only add idle members; to scale further, reshard.
    pub max_replicas: u32,
}

/// One sample of a group's [`GroupHistory`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistorySample {
    /// When it was taken (Unix ms, coordinator clock).
    pub t_ms: u64,
    /// Lag summed over the group's shards (`null` when the data Redis did not answer).
    pub lag: Option<u64>,
    /// Pending entries summed over the group's shards.
    pub pending: Option<u64>,
    /// Entries handled (delivered and acknowledged) per second since the previous sample
    /// (`null` for the first sample, or when Redis cannot tell).
    pub handled_per_s: Option<f64>,
}

/// `GET /v1/groups/{group}/history`: the group's lag and handling rate over the last
/// minutes, sampled from the data Redis by one coordinator and shared through the metadata
/// store, so every coordinator answers the same (empty without a data Redis).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupHistory {
    /// Group id.
    pub group: String,
    /// Time between samples.
    pub interval_ms: u64,
    /// Oldest first.
    pub samples: Vec<HistorySample>,
}

/// `GET /v1/streams/{stream}`: a stream's layout and reshard state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamView {
    /// Stream name.
    pub stream: String,
    /// Current shard count.
    pub shard_count: u32,
    /// Routing epoch.
    pub routing_epoch: u64,
    /// Groups reading it.
    pub groups: Vec<String>,
    /// Active shard keys, index order.
    pub shard_keys: Vec<String>,
    /// The running reshard, if any.
    pub resharding: Option<ReshardingView>,
    /// The latest reshard (running or complete), if any.
    pub last_reshard: Option<ReshardingView>,
    /// Until when (Unix ms) a `rollback` of the latest reshard is accepted, once it completed
    /// (`null` while it runs, or when there is nothing to roll back).
    pub rollback_until_ms: Option<u64>,
    /// Whether a `rollback` would be accepted now (a reshard runs, or completed within the
    /// rollback window).
    #[serde(default)]
    pub rollback_allowed: bool,
    /// Retired shards whose keys are still kept in the data Redis (they are deleted once
    /// the latest reshard is past its rollback window, when the coordinator knows the data
    /// Redis).
    #[serde(default)]
    pub retired_shards: Vec<u32>,
    /// The retention policy of the shards (PROTOCOL §18; absent from coordinators before it).
    #[serde(default)]
    pub retention: RetentionPolicy,
    /// The retention policy of the dead-letter stream `<stream>:dlq`.
    #[serde(default = "dlq_default")]
    pub dlq_retention: RetentionPolicy,
    /// The group holding retention back the most (its oldest needed entry is the oldest of
    /// every group's), when the coordinator's last trimming pass saw one that still needs
    /// entries older than `keep_acked_ms`; `null` otherwise or when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_blocked_by: Option<String>,
    /// Document revision in the store.
    pub revision: u64,
}

fn dlq_default() -> RetentionPolicy {
    RetentionPolicy::dlq_default()
}

/// `GET /v1/streams` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamList {
    /// Every stream, by name.
    pub streams: Vec<StreamView>,
}
