//! What operators send and get back (PROTOCOL §6, §7, §18): group and stream settings,
//! retention, seeks, dead-letter redrives and purges, reshards, and the audit log with the
//! store revisions each entry wrote.

use serde::{Deserialize, Serialize};

use super::{FencingMode, OrderingMode, StartPosition};

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
