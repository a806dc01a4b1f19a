//! Request and response bodies of the `/v1` HTTP API (PROTOCOL §4, §5).
//!
//! Request types reject unknown fields (`INVALID_REQUEST`), so that a typo in a field name is
//! an error rather than a silently ignored setting. Ids in request bodies are typed
//! ([`crate::GroupId`], [`crate::StreamId`], [`crate::MemberId`]): a bad one is refused when
//! the body is parsed. The `pattern` literals below are utoipa's (it takes no constant);
//! the coordinator's OpenAPI test checks each equals [`crate::names::NAME_PATTERN`].

use serde::{Deserialize, Serialize};

/// Where a Redis consumer group starts on a shard it creates (`XGROUP CREATE` id).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// From the first entry (`0`): the existing backlog is consumed. The default.
    #[default]
    Earliest,
    /// From the next new entry (`$`): the existing backlog is skipped.
    Latest,
}

impl StartPosition {
    /// The id to pass to `XGROUP CREATE`.
    pub fn xgroup_id(self) -> &'static str {
        match self {
            StartPosition::Earliest => "0",
            StartPosition::Latest => "$",
        }
    }
}

/// How a group fences the data path (PROTOCOL §5.6, docs/FENCING.md).
///
/// `strict`: the coordinator writes an owner token per shard into the data Redis
/// (`{<shard key>}:owner:<group>`) before a member can learn of a grant, and members read and
/// acknowledge through scripts that refuse a token that no longer matches, so a paused or
/// cut-off member can neither read nor acknowledge after its shards moved. `lease`: members
/// rely on their heartbeat lease alone (self-fence, PROTOCOL §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FencingMode {
    /// Owner tokens checked by Redis on every read and acknowledgement.
    Strict,
    /// The heartbeat lease only.
    Lease,
}

/// Per-key ordering through reshards (PROTOCOL §15), per group. `key` (the default): a key's
/// entries written after a reshard are handled only after its entries in its previous shard
/// up to that shard's seal were handled and acknowledged by the group; keys that did not
/// move are never delayed. `none`: no waiting (at-least-once, per-key order only between
/// reshards).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum OrderingMode {
    /// Parent shard first, per key.
    #[default]
    Key,
    /// No waiting after a reshard.
    None,
}

impl OrderingMode {
    /// `key` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderingMode::Key => "key",
            OrderingMode::None => "none",
        }
    }

    /// Whether it is the default (`key`): omitted on the wire.
    pub fn is_key(&self) -> bool {
        *self == OrderingMode::Key
    }
}

impl FencingMode {
    /// `strict` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            FencingMode::Strict => "strict",
            FencingMode::Lease => "lease",
        }
    }
}

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

/// What the client reports about itself in heartbeats (shown in the group view).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClientInfo {
    /// The pod's IP address. At most 256 bytes ([`crate::limits::MAX_CLIENT_FIELD_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub pod_ip: Option<String>,
    /// The pod's host name. At most 256 bytes ([`crate::limits::MAX_CLIENT_FIELD_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub host: Option<String>,
    /// The client library's version. At most 256 bytes ([`crate::limits::MAX_CLIENT_FIELD_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub version: Option<String>,
    /// How many members this listener runs in the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// Most heartbeats one `POST /v1/heartbeats` request may carry; a larger batch is refused
/// with `400 INVALID_REQUEST` (split it).
pub const MAX_HEARTBEAT_BATCH: usize = 1000;

/// `POST /v1/heartbeats` body: the heartbeats of several logical members of one process, of
/// any mix of groups, answered in one response (a compatible v1 addition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBatchRequest {
    /// One entry per member heartbeat (1 to [`MAX_HEARTBEAT_BATCH`]).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub heartbeats: Vec<BatchedHeartbeat>,
}

/// One heartbeat of a [`HeartbeatBatchRequest`]: the group, and the body
/// `POST /v1/groups/{group}/heartbeat` would take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchedHeartbeat {
    /// The group the member belongs to.
    // Kept a string: a bad group is answered in its own result (PROTOCOL §10), not by
    // refusing the whole batch.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub group: String,
    /// The heartbeat itself.
    pub heartbeat: HeartbeatRequest,
}

/// `POST /v1/heartbeats` answer: one result per heartbeat, in the order of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatBatchResponse {
    /// The results, index for index with the request's `heartbeats`.
    pub results: Vec<BatchedHeartbeatResult>,
}

/// The answer to one heartbeat of a batch: exactly what `POST /v1/groups/{group}/heartbeat`
/// would have answered, as its HTTP status and either its body or its error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchedHeartbeatResult {
    /// The group of the heartbeat.
    pub group: String,
    /// The member of the heartbeat.
    pub member_id: String,
    /// The HTTP status the single-heartbeat route would have answered (200 on success).
    pub status: u16,
    /// The heartbeat's answer (status 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeartbeatResponse>,
    /// The heartbeat's error (any other status), as in the error body of PROTOCOL §4.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::ErrorDetail>,
}

/// Most members one wake-up channel (`POST /v1/wakeups`) may cover; a larger list is
/// refused with `400 INVALID_REQUEST` (open several channels).
pub const MAX_WAKE_MEMBERS: usize = 1000;

/// `POST /v1/wakeups` body: the members of one process whose wake-ups the channel carries
/// (a compatible v1 addition). The answer is a `text/event-stream` of [`WakeEvent`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WakeChannelRequest {
    /// The members (1 to [`MAX_WAKE_MEMBERS`]).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub members: Vec<WakeMember>,
}

/// One member of a [`WakeChannelRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WakeMember {
    /// The member's group.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub group: crate::GroupId,
    /// The member id.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub member_id: crate::MemberId,
}

/// The `data` of the first event of a wake-up channel, `event: ready`: the channel is
/// subscribed and covers `members` members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReadyEvent {
    /// How many members the channel covers.
    pub members: u64,
}

/// One event of a wake-up channel as it travels in the `text/event-stream` (the OpenAPI
/// document's schema of the stream's items): its name, and its data, the JSON text of a
/// [`ReadyEvent`] (`ready`, first) or a [`WakeEvent`] (`wake`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WakeChannelEvent {
    /// `ready` or `wake`.
    pub event: WakeEventName,
    /// The event's data (JSON text).
    pub data: String,
}

/// The name of a wake-up channel event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum WakeEventName {
    /// The channel is subscribed ([`ReadyEvent`]).
    Ready,
    /// A member must heartbeat now ([`WakeEvent`]).
    Wake,
}

impl WakeEventName {
    /// The name as it travels on the `event:` line of the stream (`ready`, `wake`).
    pub const fn as_str(self) -> &'static str {
        match self {
            WakeEventName::Ready => "ready",
            WakeEventName::Wake => "wake",
        }
    }

    /// The event named `name` on an `event:` line; `None` for a name this version does not
    /// know (a reader skips such an event).
    pub fn parse(name: &str) -> Option<Self> {
        [WakeEventName::Ready, WakeEventName::Wake]
            .into_iter()
            .find(|e| e.as_str() == name)
    }
}

impl std::fmt::Display for WakeEventName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `data` of one `event: wake` of a wake-up channel: "the group changed in a way this
/// member must act on: heartbeat now". A hint only: the heartbeat's answer is the authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WakeEvent {
    /// The member's group.
    pub group: String,
    /// The member to wake.
    pub member_id: String,
}

/// `POST /v1/groups/{group}/heartbeat` body (PROTOCOL §5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// Must be [`crate::PROTOCOL_VERSION`].
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1))]
    pub protocol_version: u32,
    /// The member's id (`<pod_ip>-<group>-<index>` for the sample pods).
    // Kept a string: in a batch, a bad member id is answered in that heartbeat's own result
    // (PROTOCOL §10); the single route checks it as it enters the service.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub member_id: String,
    /// 0 joins, -1 leaves, -2 leaves for a while (a static member's restart: it keeps its
    /// shards until it joins again or its session expires), otherwise the epoch of the last
    /// answer received.
    #[cfg_attr(feature = "openapi", schema(minimum = -2))]
    pub member_epoch: i64,
    /// The shards the member owns right now. Missing (or `null`) means "unchanged since
    /// the last heartbeat", as in KIP-848 (PROTOCOL §5): the coordinator then takes the
    /// member to still own every shard it holds, so a heartbeat without the field releases
    /// nothing, and one at the tolerated previous epoch is `FENCED_MEMBER_EPOCH` (§5.4). In a
    /// join (epoch 0) missing means empty; in a leave (-1, -2) it is not read.
    /// At most 4096 items, each below 4096 ([`crate::limits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_items = 4096))]
    pub owned_shards: Option<Vec<u32>>,
    /// Draining shards the member has found empty (nothing pending, nothing unread). At most
    /// 4096 items, each below 4096 ([`crate::limits`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 4096))]
    pub drained_shards: Vec<u32>,
    /// Facts about the client, shown to operators.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "client_object"
    )]
    pub client: Option<ClientInfo>,
    /// Static membership: a token unique to this run of the process (e.g. random at start),
    /// sent with the join (epoch 0). A member that joins with one is static: it may leave
    /// with epoch -2 and keep its shards until it joins again under the same member id; a
    /// join with another incarnation while the member is live and has not left with -2 is
    /// refused with `MEMBER_ID_IN_USE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub incarnation: Option<String>,
}

/// `client` must be a JSON object (serde alone would also take an array of its fields).
fn client_object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ClientInfo>, D::Error> {
    use serde::de::Error;
    let map: Option<serde_json::Map<String, serde_json::Value>> = Option::deserialize(d)?;
    map.map(|m| serde_json::from_value(serde_json::Value::Object(m)).map_err(D::Error::custom))
        .transpose()
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    /// Echo of the member id.
    pub member_id: String,
    /// The member's epoch: send it with the next heartbeat. -1 after a leave.
    pub member_epoch: i64,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// After this long without a heartbeat the member is expired.
    pub session_timeout_ms: u64,
    /// The full set of shards the member may own now.
    pub assignment: Vec<u32>,
    /// The stream the group reads.
    pub stream: String,
    /// The stream's current shard count (routing layout).
    pub shard_count: u32,
    /// The stream's routing epoch.
    pub routing_epoch: u64,
    /// Where new Redis consumer groups start.
    pub start: StartPosition,
    /// With `fencing: strict`: the owner token of each shard in `assignment` (JSON object,
    /// shard index as the key). Reads and acknowledgements of the shard go through scripts
    /// that compare it with `{<shard key>}:owner:<group>` in the data Redis. Absent in lease
    /// mode (an addition to PROTOCOL §5: responses may gain fields).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = owner_tokens_schema))]
    pub owner_tokens: std::collections::BTreeMap<u32, String>,
    /// The group's ordering through reshards (PROTOCOL §15; absent means `key`).
    #[serde(default, skip_serializing_if = "OrderingMode::is_key")]
    pub ordering: OrderingMode,
    /// The group is paused by an operator (`POST /v1/groups/{group}/pause`): the member
    /// keeps its shards and keeps heartbeating, finishes the messages in flight, and fetches
    /// nothing new until an answer says otherwise. Absent (false) when not paused: a v1
    /// addition (PROTOCOL §14).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The group's `rebalance_timeout_ms`: a member that has not finished revoking within it
    /// of the answer that first asked it to is removed (PROTOCOL §5.3). A member stops
    /// waiting for the handlers of revoked shards before then. Absent from an older
    /// coordinator: 60000 (the default).
    #[serde(default = "default_rebalance_timeout_ms")]
    pub rebalance_timeout_ms: u64,
}

fn default_rebalance_timeout_ms() -> u64 {
    60_000
}

/// `POST /v1/groups/{group}/leave` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LeaveRequest {
    /// The leaving member.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub member_id: crate::MemberId,
    /// Its current epoch.
    #[cfg_attr(feature = "openapi", schema(minimum = -1))]
    pub member_epoch: i64,
}

/// The answer to a leave: `{member_id, member_epoch: -1}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaveResponse {
    /// The member that left.
    pub member_id: String,
    /// Always -1.
    pub member_epoch: i64,
}

/// `POST /v1/groups` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateGroupRequest {
    /// The group id.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub group: crate::GroupId,
    /// The stream it reads.
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub stream: crate::StreamId,
    /// Required when the stream is new (1..=4096); must match when it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4096))]
    pub shard_count: Option<u32>,
    /// Where the Redis consumer groups start (default `earliest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartPosition>,
    /// Default 45000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_timeout_ms: Option<u64>,
    /// Default 3000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
    /// Default 60000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance_timeout_ms: Option<u64>,
    /// No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_members: Option<u32>,
    /// The assignor's name (default `sticky`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignor: Option<String>,
    /// Data-path fencing: `strict` (default when the coordinator has a data Redis) or
    /// `lease` (the default otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingMode>,
    /// Ordering through reshards: `key` (default) or `none` (PROTOCOL §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingMode>,
    /// The stream's retention policy, when this creates the stream (PROTOCOL §18; default
    /// `keep_acked_ms` 1 h). For an existing stream it must equal the stream's policy (else
    /// `400 INVALID_REQUEST`: change it with `PATCH /v1/streams/{stream}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicy>,
}

impl CreateGroupRequest {
    /// A request for `group` on `stream` with every setting left to its default.
    pub fn new(group: crate::GroupId, stream: crate::StreamId) -> Self {
        CreateGroupRequest {
            group,
            stream,
            shard_count: None,
            start: None,
            session_timeout_ms: None,
            heartbeat_interval_ms: None,
            rebalance_timeout_ms: None,
            max_members: None,
            assignor: None,
            fencing: None,
            ordering: None,
            retention: None,
        }
    }
}

/// `PATCH /v1/groups/{group}` body: the settings to change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PatchGroupRequest {
    /// New session timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_timeout_ms: Option<u64>,
    /// New heartbeat interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
    /// New rebalance timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance_timeout_ms: Option<u64>,
    /// New member limit; `0` removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_members: Option<u32>,
    /// New data-path fencing mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingMode>,
    /// Ordering through reshards: `key` (default) or `none` (PROTOCOL §15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingMode>,
}

/// A stream's retention policy (PROTOCOL §18): what the coordinator trims from its shard
/// keys with `XTRIM <key> MINID ~ <id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// An entry every group of the stream has acknowledged is trimmed once it is this old
    /// (ms, from its id; `0`: at once). Default 3600000 (1 h).
    #[cfg_attr(feature = "openapi", schema(maximum = 31_536_000_000_u64))]
    pub keep_acked_ms: u64,
    /// Hard cap: entries older than this are trimmed even when a group has not handled them
    /// yet (each such entry counted in `rsc_retention_dropped_undelivered_total`). Absent: no
    /// cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_age_ms: Option<u64>,
    /// Hard cap: at most about this many entries per shard key, the oldest trimmed even when
    /// a group has not handled them yet. Absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_entries_per_shard: Option<u64>,
}

impl RetentionPolicy {
    /// The default `keep_acked_ms`: one hour (docs/RUNBOOK.md "Retention").
    pub const DEFAULT_KEEP_ACKED_MS: u64 = 3_600_000;
    /// The longest `keep_acked_ms` accepted: 365 days.
    pub const MAX_KEEP_ACKED_MS: u64 = 365 * 24 * 3_600_000;
    /// The default `max_age_ms` of a dead-letter stream `<stream>:dlq`: 7 days.
    pub const DLQ_DEFAULT_MAX_AGE_MS: u64 = 7 * 24 * 3_600_000;

    /// Whether a cap that may drop undelivered entries is set.
    pub fn has_hard_cap(&self) -> bool {
        self.max_age_ms.is_some() || self.max_entries_per_shard.is_some()
    }

    /// Why the policy is refused (`INVALID_REQUEST`), if it is.
    pub fn problem(&self) -> Option<String> {
        if self.keep_acked_ms > Self::MAX_KEEP_ACKED_MS {
            return Some(format!(
                "retention.keep_acked_ms is {}; it must be at most {} (365 days)",
                self.keep_acked_ms,
                Self::MAX_KEEP_ACKED_MS
            ));
        }
        match (self.max_age_ms, self.max_entries_per_shard) {
            (Some(0), _) => Some("retention.max_age_ms must be at least 1".into()),
            (_, Some(0)) => Some("retention.max_entries_per_shard must be at least 1".into()),
            (Some(age), _) if age < self.keep_acked_ms => Some(format!(
                "retention.max_age_ms ({age}) is below keep_acked_ms ({}): acknowledged \
                 entries would never be kept that long",
                self.keep_acked_ms
            )),
            _ => None,
        }
    }
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            keep_acked_ms: Self::DEFAULT_KEEP_ACKED_MS,
            max_age_ms: None,
            max_entries_per_shard: None,
        }
    }
}

/// `PATCH /v1/streams/{stream}` body: the stream settings to change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PatchStreamRequest {
    /// The new retention policy of the stream's shards (replaces the whole policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicy>,
    /// The new retention policy of its dead-letter stream `<stream>:dlq` (only `max_age_ms`
    /// and `max_entries_per_shard` apply there: nothing acknowledges a dead letter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dlq_retention: Option<RetentionPolicy>,
}

/// Where `POST /v1/groups/{group}/seek` moves the group (PROTOCOL §18).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum SeekTarget {
    /// `"earliest"`: every entry still in the shards; `"latest"`: only entries written after.
    Position(StartPosition),
    /// `{"time_ms": T}`: the entries whose id is at or after Unix ms `T`.
    Time(SeekTime),
    /// `{"by_duration_ms": D}`: the entries of the last `D` ms (the time `now − D`, on the
    /// coordinator's clock).
    Duration(SeekDuration),
    /// `{"shift_by": N}`: on each shard, `N` entries after (`N > 0`, skipping them) or `|N|`
    /// entries before (`N < 0`, delivering them again) the group's position there.
    Shift(SeekShift),
    /// `{"id": "<ms>-<seq>"}`: the entries after this entry id (the id becomes the group's
    /// last-delivered id); usually with `shards` naming one shard.
    Id(SeekId),
}

/// `{"time_ms": T}` of a [`SeekTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SeekTime {
    /// Unix ms (not in the future).
    pub time_ms: u64,
}

/// `{"by_duration_ms": D}` of a [`SeekTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SeekDuration {
    /// How far back from now, in ms.
    pub by_duration_ms: u64,
}

/// `{"shift_by": N}` of a [`SeekTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SeekShift {
    /// Entries to move by on each shard: negative goes back (those entries are delivered
    /// again), positive goes forward (those entries are skipped); `1..=100000` either way.
    #[cfg_attr(feature = "openapi", schema(minimum = -100000, maximum = 100000))]
    pub shift_by: i64,
}

/// `{"id": "<ms>-<seq>"}` of a [`SeekTarget`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SeekId {
    /// A stream entry id (`<ms>-<seq>`, or `<ms>` for `<ms>-0`), at or before the shard's last
    /// entry id.
    #[cfg_attr(feature = "openapi", schema(example = "1700000000000-0"))]
    pub id: String,
}

/// Largest `shift_by` of a seek, either way.
pub const MAX_SEEK_SHIFT: i64 = 100_000;

/// `POST /v1/groups/{group}/seek` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SeekRequest {
    /// `"earliest"`, `"latest"`, `{"time_ms": T}`, `{"by_duration_ms": D}`,
    /// `{"shift_by": N}` or `{"id": "<ms>-<seq>"}`.
    pub to: SeekTarget,
    /// Only these shards (indexes); absent or empty: every shard the group reads (active and
    /// draining).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<u32>,
    /// Only answer the plan (each shard's position now and after): nothing is moved.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// `POST /v1/groups/{group}/seek` answer: the plan, carried out unless `dry_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeekResponse {
    /// Group id.
    pub group: String,
    /// Nothing was moved: this is what the seek would do.
    #[serde(default)]
    pub dry_run: bool,
    /// The id each shard key's Redis consumer group was set to (would be, in a dry run), by
    /// key.
    pub shards: std::collections::BTreeMap<String, String>,
    /// Per shard, its position before and after the seek, by shard index.
    #[serde(default)]
    pub plan: Vec<SeekShardPlan>,
    /// Entries delivered before and to be delivered again, over the shards.
    #[serde(default)]
    pub redelivered: u64,
    /// Entries not yet delivered that the seek skips, over the shards.
    #[serde(default)]
    pub skipped: u64,
    /// Entries to be delivered after the seek (the group's lag then), over the shards.
    #[serde(default)]
    pub lag_after: u64,
}

/// One shard of a [`SeekResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeekShardPlan {
    /// Shard index.
    pub shard: u32,
    /// Redis Stream key.
    pub key: String,
    /// The group's last-delivered id there before the seek; absent when the shard has no
    /// Redis consumer group of the group yet (the seek creates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_id: Option<String>,
    /// The Unix ms of `current_id` (absent for `0-0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_ms: Option<u64>,
    /// The last-delivered id the seek sets: the group is next delivered the entries after
    /// it.
    pub new_id: String,
    /// The Unix ms of `new_id` (absent for `0-0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_ms: Option<u64>,
    /// Entries not yet delivered before the seek (absent without a Redis consumer group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_before: Option<u64>,
    /// Entries after `new_id`: the lag right after the seek.
    pub lag_after: u64,
    /// Entries delivered before and to be delivered again (`lag_after − lag_before` when
    /// positive).
    pub redelivered: u64,
    /// Entries not yet delivered that the seek skips (`lag_before − lag_after` when
    /// positive).
    pub skipped: u64,
    /// Entries delivered and not yet acknowledged: they stay pending (a seek does not
    /// change them).
    pub pending: u64,
}

/// The last seek of a group (PROTOCOL §18), in its view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeekRecord {
    /// When (Unix ms).
    pub at_ms: u64,
    /// The target as asked (`earliest`, `latest`, `time_ms=T`, `by_duration_ms=D`,
    /// `shift_by=N`, `id=I`).
    pub to: String,
    /// The shards moved.
    pub shards: Vec<u32>,
    /// Entries delivered before and to be delivered again, over those shards.
    pub redelivered: u64,
}

impl std::fmt::Display for SeekTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SeekTarget::Position(StartPosition::Earliest) => f.write_str("earliest"),
            SeekTarget::Position(StartPosition::Latest) => f.write_str("latest"),
            SeekTarget::Time(t) => write!(f, "time_ms={}", t.time_ms),
            SeekTarget::Duration(d) => write!(f, "by_duration_ms={}", d.by_duration_ms),
            SeekTarget::Shift(s) => write!(f, "shift_by={}", s.shift_by),
            SeekTarget::Id(i) => write!(f, "id={}", i.id),
        }
    }
}

/// `POST /v1/streams/{stream}/dlq/redrive` body (PROTOCOL §18).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RedriveRequest {
    /// The group whose dead letters are redriven (the `group` field of each dead letter).
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub group: crate::GroupId,
    /// Only dead letters written at or after this Unix ms (by their dead-letter entry id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// At most this many dead letters (1..=10000, default 1000), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
    pub limit: Option<u32>,
    /// Only say what would be redriven: nothing is written or removed.
    #[serde(default)]
    pub dry_run: bool,
}

/// One dead letter of a [`RedriveResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RedrivenEntry {
    /// Its id in `<stream>:dlq`.
    pub dlq_id: String,
    /// Its routing key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The shard it is (or would be) written to, under the stream's current routing.
    pub shard: u32,
    /// The id of the republished entry (absent in a dry run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Why it was dead-lettered (its `error` field).
    pub error: String,
    /// Its `rsc-redrive-count` header once republished (1 on a first redrive).
    pub redrive_count: u64,
}

/// `POST /v1/streams/{stream}/dlq/redrive` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RedriveResponse {
    /// Stream name.
    pub stream: String,
    /// Group id.
    pub group: String,
    /// Whether this was a dry run (nothing written, nothing removed).
    pub dry_run: bool,
    /// Dead letters republished and removed from `<stream>:dlq` (in a dry run: that would be).
    pub redriven: u64,
    /// Each of them, oldest first.
    pub entries: Vec<RedrivenEntry>,
}

/// One dead letter of `<stream>:dlq` as a list or purge answers it (PROTOCOL §18).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeadLetterView {
    /// Its id in `<stream>:dlq` (its milliseconds: when it was dead-lettered).
    pub dlq_id: String,
    /// The group that gave up on it (its `group` field; empty when it has none).
    pub group: String,
    /// Its routing key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Why it was dead-lettered (its `error` field).
    pub error: String,
    /// The shard key it was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Its id on that shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_id: Option<String>,
    /// The member that gave up on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// How many times the handler was tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The first 256 bytes of its payload, as text (invalid UTF-8 replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_preview: Option<String>,
}

/// How many dead letters one group has in `<stream>:dlq` and how old the oldest is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DlqGroupDepth {
    /// Group id (the `group` field of its dead letters).
    pub group: String,
    /// Its dead letters in the stream's dead-letter stream.
    pub entries: u64,
    /// When its oldest dead letter was written (Unix ms, by its id); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_ms: Option<u64>,
}

/// `GET /v1/streams/{stream}/dlq` answer: one page of dead letters and the depth per group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DlqList {
    /// Stream name.
    pub stream: String,
    /// The dead letters that matched, in the order asked (oldest first by default).
    pub entries: Vec<DeadLetterView>,
    /// Pass as `after` for the next page; absent when the scan reached the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
    /// Dead letters per group in the whole dead-letter stream (filters do not apply).
    pub depth: Vec<DlqGroupDepth>,
}

/// `POST /v1/streams/{stream}/dlq/purge` body (PROTOCOL §18): every filter given must
/// match; a dry run (the default) deletes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DlqPurgeRequest {
    /// Only the dead letters of this group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
    )]
    pub group: Option<crate::GroupId>,
    /// Only those of this routing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Only those whose error contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only those dead-lettered at or after this Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Only those dead-lettered before this Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// At most this many (1..=100000, default 10000), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100000))]
    pub limit: Option<u32>,
    /// Only say what would be deleted (the default); `false` deletes.
    #[serde(default = "dry_run_default")]
    pub dry_run: bool,
}

fn dry_run_default() -> bool {
    true
}

/// `POST /v1/streams/{stream}/dlq/purge` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DlqPurgeResponse {
    /// Stream name.
    pub stream: String,
    /// Whether this was a dry run (nothing deleted).
    pub dry_run: bool,
    /// Dead letters deleted (in a dry run: that would be).
    pub purged: u64,
    /// Whether more dead letters matched beyond `limit` (purge again for them).
    pub more: bool,
    /// Each of them, oldest first.
    pub entries: Vec<DeadLetterView>,
}

/// `POST /v1/streams/{stream}/reshard` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReshardRequest {
    /// The new shard count (1..=4096).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4096))]
    pub shard_count: u32,
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

/// The pattern of a shard index written as a JSON object key (`seals`, `owner_tokens`):
/// decimal digits without a leading zero, at most ten (a `u32`).
pub const SHARD_INDEX_PATTERN: &str = "^(0|[1-9][0-9]{0,9})$";

/// The OpenAPI schema of a JSON object keyed by shard index with string values: JSON keys
/// are strings, so the key is described as a string of decimal digits (an `integer`
/// `propertyNames`, what a `u32` key would derive, no key could ever match).
#[cfg(feature = "openapi")]
fn shard_map_schema(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
    let string = || ObjectBuilder::new().schema_type(Type::String);
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description))
        .property_names(Some(string().pattern(Some(SHARD_INDEX_PATTERN))))
        .additional_properties(Some(AdditionalProperties::RefOr(string().into())))
        .into()
}

/// [`HeartbeatResponse::owner_tokens`]' schema.
#[cfg(feature = "openapi")]
fn owner_tokens_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    shard_map_schema(
        "With `fencing: strict`: the owner token of each shard in `assignment` (shard index \
         as the key). Absent in lease mode.",
    )
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

impl RetentionPolicy {
    /// The default policy of a dead-letter stream: `max_age_ms` 7 days.
    pub fn dlq_default() -> Self {
        RetentionPolicy {
            keep_acked_ms: 0,
            max_age_ms: Some(Self::DLQ_DEFAULT_MAX_AGE_MS),
            max_entries_per_shard: None,
        }
    }
}

/// `GET /v1/streams` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamList {
    /// Every stream, by name.
    pub streams: Vec<StreamView>,
}

/// One audit log entry (PROTOCOL §7): an admin mutation the access checks admitted, whatever
/// its outcome; or refused requests of any protected route, merged and counted, without their
/// bodies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// When the coordinator answered (Unix ms).
    pub time_ms: u64,
    /// Who asked: the ACL entry's `principal`, a JWT's `sub`, or `anonymous` (no ACL, or no
    /// valid credential).
    pub principal: String,
    /// How the principal was authenticated (PROTOCOL §8, §20): `token`, `cert_subject`,
    /// `cert_san_uri` or `cert_san_dns` (a client certificate, by the key of the entry that
    /// named it), `jwt` (a signed JWT a `[[jwt]]` entry accepts), or `anonymous` (no ACL, or
    /// no valid credential). Absent in entries the
    /// coordinator writes itself and in entries older coordinators wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// What was asked, e.g. `group.create`, `stream.reshard`.
    pub action: String,
    /// What it was asked on.
    pub target: AuditTarget,
    /// The request as received (never its credentials).
    pub request: AuditRequest,
    /// How it was answered.
    pub result: AuditResult,
    /// Store documents the request changed, with their revision before and after.
    #[serde(default)]
    pub revisions: Vec<RevisionChange>,
    /// The client's address (PROTOCOL §7): the connection's peer IP, or the first address
    /// of `X-Forwarded-For` that is not a trusted proxy when the peer is one
    /// (`--trusted-proxies`). Absent in entries the coordinator writes itself and in entries
    /// older coordinators wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_addr: Option<String>,
    /// A refusal entry (PROTOCOL §7) stands for this many refused requests alike (same
    /// client address, principal, route and error code) from `since_ms` to `time_ms`.
    /// Absent in entries of single requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// With `count`: when the first of the merged refusals was answered (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
}

/// The group, stream and member an audited request names (each when it names one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditTarget {
    /// Group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Stream name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// Member id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

/// An audited request: method, path, query and JSON body (headers, and so tokens, are never
/// recorded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditRequest {
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Query string, without the `?`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The JSON body; a body that is not JSON is kept as a (truncated) string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
}

/// How an audited request was answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditResult {
    /// HTTP status.
    pub status: u16,
    /// The error code when refused or failed; absent on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<crate::ErrorCode>,
}

/// One store document written by an audited request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RevisionChange {
    /// `group:<id>` or `stream:<name>`.
    pub document: String,
    /// Revision before the write (0: the document did not exist).
    pub before: u64,
    /// Revision after the write (0: the document was deleted).
    pub after: u64,
}

/// `GET /v1/audit` answer: newest entry first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditList {
    /// The entries.
    pub entries: Vec<AuditEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names on the `event:` line are the enum's JSON names (the OpenAPI schema's).
    #[test]
    fn wake_event_names_are_their_json_names() {
        for e in [WakeEventName::Ready, WakeEventName::Wake] {
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
            assert_eq!(WakeEventName::parse(e.as_str()), Some(e));
            assert_eq!(e.to_string(), e.as_str());
        }
        assert_eq!(WakeEventName::parse("Wake"), None);
        assert_eq!(WakeEventName::parse("ping"), None);
    }

    #[test]
    fn heartbeat_rejects_unknown_fields() {
        let err = serde_json::from_str::<HeartbeatRequest>(
            r#"{"protocol_version":1,"member_id":"m","member_epoch":0,"owned_shards":[],"bogus":1}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("bogus"));
    }

    #[test]
    fn client_must_be_an_object() {
        let base = r#"{"protocol_version":1,"member_id":"m","member_epoch":0,"client":"#;
        let ok: HeartbeatRequest =
            serde_json::from_str(&format!("{base}{{\"host\":\"h\"}}}}")).unwrap();
        assert_eq!(ok.client.unwrap().host.as_deref(), Some("h"));
        let null: HeartbeatRequest = serde_json::from_str(&format!("{base}null}}")).unwrap();
        assert_eq!(null.client, None);
        assert!(serde_json::from_str::<HeartbeatRequest>(&format!("{base}[null,null]}}")).is_err());
        assert!(
            serde_json::from_str::<HeartbeatRequest>(&format!("{base}{{\"bogus\":1}}}}")).is_err()
        );
    }

    #[test]
    fn heartbeat_minimal_shape() {
        let req: HeartbeatRequest =
            serde_json::from_str(r#"{"protocol_version":1,"member_id":"m","member_epoch":0}"#)
                .unwrap();
        assert!(req.owned_shards.is_none() && req.drained_shards.is_empty());
        assert_eq!(req.client, None);
    }

    #[test]
    fn owned_shards_missing_null_and_empty_are_told_apart() {
        let parse = |owned: &str| {
            serde_json::from_str::<HeartbeatRequest>(&format!(
                r#"{{"protocol_version":1,"member_id":"m","member_epoch":3{owned}}}"#
            ))
            .unwrap()
            .owned_shards
        };
        assert_eq!(parse(""), None, "missing: unchanged");
        assert_eq!(parse(r#","owned_shards":null"#), None, "null: unchanged");
        assert_eq!(
            parse(r#","owned_shards":[]"#),
            Some(vec![]),
            "empty: owns nothing"
        );
        assert_eq!(parse(r#","owned_shards":[2,0]"#), Some(vec![2, 0]));
        // What a client sends round-trips: an empty list stays on the wire, None is left out.
        let mut req = HeartbeatRequest {
            protocol_version: 1,
            member_id: "m".into(),
            member_epoch: 3,
            owned_shards: Some(vec![]),
            drained_shards: vec![],
            client: None,
            incarnation: None,
        };
        assert!(
            serde_json::to_string(&req)
                .unwrap()
                .contains(r#""owned_shards":[]"#)
        );
        req.owned_shards = None;
        assert!(
            !serde_json::to_string(&req)
                .unwrap()
                .contains("owned_shards")
        );
    }

    #[test]
    fn start_position_wire_names() {
        assert_eq!(
            serde_json::to_string(&StartPosition::Latest).unwrap(),
            "\"latest\""
        );
        assert_eq!(StartPosition::default().xgroup_id(), "0");
    }
}
