//! The member protocol (PROTOCOL §5): heartbeats, one at a time or batched, leaves, and
//! the wake-up channel that tells a member to heartbeat now.

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use super::shard_map_schema;
use super::{OrderingMode, StartPosition};

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

/// [`HeartbeatResponse::owner_tokens`]' schema.
#[cfg(feature = "openapi")]
fn owner_tokens_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    shard_map_schema(
        "With `fencing: strict`: the owner token of each shard in `assignment` (shard index \
         as the key). Absent in lease mode.",
    )
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
