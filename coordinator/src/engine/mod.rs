//! The protocol engine: a pure, synchronous state machine over the group and stream documents.
//!
//! Every operation takes a document, the time (`now_ms`, from the injected clock) and a
//! request, mutates the document in place and returns a decision. Nothing here does I/O, so
//! the whole protocol — join, heartbeat, revoke-before-assign, epochs and fencing, expiry,
//! resharding and rollback — is tested without Redis or HTTP. The stores persist the
//! documents; the [`crate::service`] layer sequences engine calls with store reads and writes.

mod group;
mod stream;
mod view;
mod wake;

pub use group::{GroupEvent, HeartbeatOutcome};
pub use stream::{ReshardRecord, StreamDoc, validate_shard_count};
pub use view::{group_view, routing_view, stream_view};
pub use wake::{members_to_wake, settled};

use rsc_protocol::{ClientInfo, ErrorCode, FencingMode, MemberState, StartPosition};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Largest shard count of a stream (the protocol's, PROTOCOL §1).
pub const MAX_SHARDS: u32 = rsc_protocol::limits::MAX_SHARDS;
/// Smallest and largest accepted timeout / interval, in ms.
pub const TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// A group's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// Where Redis consumer groups start.
    pub start: StartPosition,
    /// A member silent this long is expired.
    pub session_timeout_ms: u64,
    /// How often members heartbeat.
    pub heartbeat_interval_ms: u64,
    /// How long a member may take to revoke shards.
    pub rebalance_timeout_ms: u64,
    /// Member limit.
    pub max_members: Option<u32>,
    /// Assignor name.
    pub assignor: String,
    /// Data-path fencing (documents written before fencing existed read as `lease`).
    #[serde(default = "lease")]
    pub fencing: FencingMode,
    /// Ordering through reshards (PROTOCOL §15; older documents read as `key`).
    #[serde(default)]
    pub ordering: rsc_protocol::OrderingMode,
    /// Paused by an operator since this time (Unix ms): members keep their shards and fetch
    /// nothing new (documents written before pausing existed read as not paused). Not part of
    /// the assignment: pausing and resuming do not bump the group epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_since_ms: Option<u64>,
}

fn lease() -> FencingMode {
    FencingMode::Lease
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            start: StartPosition::Earliest,
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 3_000,
            rebalance_timeout_ms: 60_000,
            max_members: None,
            assignor: crate::assignor::DEFAULT.to_owned(),
            fencing: FencingMode::Lease,
            ordering: rsc_protocol::OrderingMode::Key,
            paused_since_ms: None,
        }
    }
}

impl GroupConfig {
    /// Checks ranges and the heartbeat < session rule.
    pub fn validate(&self) -> Result<(), EngineError> {
        for (name, v) in [
            ("session_timeout_ms", self.session_timeout_ms),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("rebalance_timeout_ms", self.rebalance_timeout_ms),
        ] {
            if !TIMEOUT_RANGE_MS.contains(&v) {
                return Err(EngineError::Invalid(format!(
                    "{name} is {v}; it must be within {}..={}",
                    TIMEOUT_RANGE_MS.start(),
                    TIMEOUT_RANGE_MS.end()
                )));
            }
        }
        if self.heartbeat_interval_ms >= self.session_timeout_ms {
            return Err(EngineError::Invalid(format!(
                "heartbeat_interval_ms ({}) must be less than session_timeout_ms ({})",
                self.heartbeat_interval_ms, self.session_timeout_ms
            )));
        }
        if self.max_members == Some(0) {
            return Err(EngineError::Invalid(
                "max_members must be at least 1".into(),
            ));
        }
        if crate::assignor::by_name(&self.assignor).is_none() {
            return Err(EngineError::Invalid(format!(
                "unknown assignor {:?}; known: {}",
                self.assignor,
                crate::assignor::KNOWN.join(", ")
            )));
        }
        Ok(())
    }
}

/// One member of a group, as the coordinator records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDoc {
    /// Current epoch (the fencing token).
    pub member_epoch: i64,
    /// The epoch before the last change, tolerated once (PROTOCOL §5.4).
    pub previous_epoch: i64,
    /// Reconciliation state.
    pub state: MemberState,
    /// What the coordinator last allowed it to own (its `assignment`).
    pub assigned: BTreeSet<u32>,
    /// Shards it was asked to revoke and still reported owning.
    pub pending_revocation: BTreeSet<u32>,
    /// What the target assignment gives it.
    pub target: BTreeSet<u32>,
    /// What it reported owning in its last heartbeat.
    pub reported: BTreeSet<u32>,
    /// When the response that first asked it to revoke was sent.
    pub revoke_started_ms: Option<u64>,
    /// Last time the coordinator heard from it (liveness may be kept outside the document;
    /// the service overlays the newest value before the engine runs).
    pub last_heartbeat_ms: u64,
    /// When it joined.
    pub joined_ms: u64,
    /// What it said about itself.
    pub client: Option<ClientInfo>,
    /// The member epoch at which each shard of `assigned` was granted (the owner token's
    /// generation, see [`rsc_protocol::owner::OwnerToken`]); kept while the shard stays with the member.
    #[serde(default)]
    pub granted_at: BTreeMap<u32, i64>,
    /// Static membership: the incarnation (process run) that joined last; `None` for a
    /// dynamic member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// A static member that left with epoch -2: when. It keeps its shards (unread) until it
    /// joins again or its session expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub away_since_ms: Option<u64>,
}

impl MemberDoc {
    fn new(now_ms: u64) -> Self {
        MemberDoc {
            member_epoch: 0,
            previous_epoch: 0,
            state: MemberState::Stable,
            assigned: BTreeSet::new(),
            pending_revocation: BTreeSet::new(),
            target: BTreeSet::new(),
            reported: BTreeSet::new(),
            revoke_started_ms: None,
            last_heartbeat_ms: now_ms,
            joined_ms: now_ms,
            client: None,
            granted_at: BTreeMap::new(),
            incarnation: None,
            away_since_ms: None,
        }
    }

    /// Whether the member was removed for the rebalance timeout while its lease still ran
    /// (PROTOCOL §5.3), recorded as member epoch −1: out of the assignment, answered
    /// `UNKNOWN_MEMBER_ID`, it holds what it held (pending revocation) until its lease ends
    /// or it joins again.
    pub fn is_removed(&self) -> bool {
        rsc_protocol::MemberEpoch::new(self.member_epoch) == rsc_protocol::MemberEpoch::LEAVE
    }

    /// Whether the member holds `shard`: assigned to it, or pending revocation from it.
    pub fn holds(&self, shard: u32) -> bool {
        self.assigned.contains(&shard) || self.pending_revocation.contains(&shard)
    }

    /// Whether the two records differ in anything but the heartbeat time (see
    /// [`GroupDoc::differs_beyond_liveness`]). Every field is named, so a new one is compared
    /// unless it is left out here on purpose.
    fn differs_beyond_liveness(&self, other: &MemberDoc) -> bool {
        let MemberDoc {
            member_epoch,
            previous_epoch,
            state,
            assigned,
            pending_revocation,
            target,
            reported,
            revoke_started_ms,
            last_heartbeat_ms: _,
            joined_ms,
            client,
            granted_at,
            incarnation,
            away_since_ms,
        } = self;
        *member_epoch != other.member_epoch
            || *previous_epoch != other.previous_epoch
            || *state != other.state
            || *assigned != other.assigned
            || *pending_revocation != other.pending_revocation
            || *target != other.target
            || *reported != other.reported
            || *revoke_started_ms != other.revoke_started_ms
            || *joined_ms != other.joined_ms
            || *client != other.client
            || *granted_at != other.granted_at
            || *incarnation != other.incarnation
            || *away_since_ms != other.away_since_ms
    }
}

/// The whole state of a consumer group: ONE document (PROTOCOL §2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDoc {
    /// Group id.
    pub group: String,
    /// Stream it reads.
    pub stream: String,
    /// Settings.
    pub config: GroupConfig,
    /// Bumped on every change of membership, layout or config.
    pub group_epoch: u64,
    /// The group epoch the target was computed for.
    pub assignment_epoch: u64,
    /// The stream layout version the target was computed for.
    pub layout_version: u64,
    /// Members by id.
    pub members: BTreeMap<String, MemberDoc>,
    /// When the group was created.
    pub created_ms: u64,
    /// Since when the group has members that are not yet stable at the assignment epoch
    /// (see [`GroupDoc::track_convergence`]); absent while the group is settled or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciling_since_ms: Option<u64>,
    /// The group's last seek (PROTOCOL §18; documents written before seeks were recorded
    /// read as none). Not part of the assignment: recording it bumps nothing but the
    /// document's revision, by which the lag sampler reads the group's shards again at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seek: Option<rsc_protocol::SeekRecord>,
}

impl GroupDoc {
    /// Whether the two documents differ in anything but their members' heartbeat times: the
    /// one rule by which the service decides that a decision changed the document and must
    /// be written (a heartbeat time alone is liveness, kept beside the document and touched
    /// without a document write, ARCHITECTURE "How a heartbeat travels").
    pub fn differs_beyond_liveness(&self, other: &GroupDoc) -> bool {
        let GroupDoc {
            group,
            stream,
            config,
            group_epoch,
            assignment_epoch,
            layout_version,
            members,
            created_ms,
            reconciling_since_ms,
            last_seek,
        } = self;
        *group != other.group
            || *stream != other.stream
            || *config != other.config
            || *group_epoch != other.group_epoch
            || *assignment_epoch != other.assignment_epoch
            || *layout_version != other.layout_version
            || *created_ms != other.created_ms
            || *reconciling_since_ms != other.reconciling_since_ms
            || *last_seek != other.last_seek
            || members.len() != other.members.len()
            || members
                .iter()
                .zip(&other.members)
                .any(|((a, ma), (b, mb))| a != b || ma.differs_beyond_liveness(mb))
    }
}

/// Why an engine operation was refused. Each maps to one protocol error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Bad input.
    #[error("{0}")]
    Invalid(String),
    /// Unsupported `protocol_version`.
    #[error("protocol_version {0} is not supported; this coordinator speaks 1")]
    UnsupportedProtocolVersion(u32),
    /// The member is not in the group.
    #[error(
        "member {0} is not a member of the group (expired, left or removed); rejoin with epoch 0"
    )]
    UnknownMember(String),
    /// Stale or future epoch.
    #[error("member {member} sent epoch {sent}; its current epoch is {current}")]
    Fenced {
        /// Member id.
        member: String,
        /// Epoch in the request.
        sent: i64,
        /// Epoch the coordinator holds.
        current: i64,
    },
    /// A heartbeat (epoch > 0) naming another process run than the one that holds the
    /// static member id (PROTOCOL §11): a replaced run, fenced as for a stale epoch (Kafka's
    /// `FENCED_INSTANCE_ID`).
    #[error(
        "member {member} is held by another process run than incarnation {sent}: this run was \
         replaced; stop reading every shard (a join with epoch 0 is refused while the holder \
         is live)"
    )]
    FencedIncarnation {
        /// Member id.
        member: String,
        /// The incarnation in the request.
        sent: String,
    },
    /// Join beyond `max_members`.
    #[error("the group has reached its max_members of {0}")]
    MaxSize(u32),
    /// A static member's id is held by another live incarnation.
    #[error(
        "member {member} is held by another live process (another incarnation that has not \
         left with epoch -2); it can join once that process leaves or its session expires \
         (in {retry_after_ms} ms unless it heartbeats)"
    )]
    MemberIdInUse {
        /// The member id.
        member: String,
        /// Until the holder's session runs out, if it does not heartbeat again (ms).
        retry_after_ms: u64,
    },
    /// A reshard or rollback while one runs.
    #[error("stream {0} is being resharded; wait until the reshard completes")]
    ReshardInProgress(String),
    /// Nothing to undo.
    #[error("{0}")]
    NothingToRollback(String),
    /// The rollback window closed.
    #[error("the rollback window of stream {stream} closed at {until_ms} (Unix ms)")]
    RollbackWindowExpired {
        /// Stream name.
        stream: String,
        /// When the window closed.
        until_ms: u64,
    },
}

impl EngineError {
    /// When retrying may succeed, how long until then (ms).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            EngineError::MemberIdInUse { retry_after_ms, .. } => Some(*retry_after_ms),
            _ => None,
        }
    }

    /// The protocol error code for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            EngineError::Invalid(_) => ErrorCode::InvalidRequest,
            EngineError::UnsupportedProtocolVersion(_) => ErrorCode::UnsupportedProtocolVersion,
            EngineError::UnknownMember(_) => ErrorCode::UnknownMemberId,
            EngineError::Fenced { .. } | EngineError::FencedIncarnation { .. } => {
                ErrorCode::FencedMemberEpoch
            }
            EngineError::MaxSize(_) => ErrorCode::GroupMaxSizeReached,
            EngineError::MemberIdInUse { .. } => ErrorCode::MemberIdInUse,
            EngineError::ReshardInProgress(_) => ErrorCode::ReshardInProgress,
            EngineError::NothingToRollback(_) => ErrorCode::NothingToRollback,
            EngineError::RollbackWindowExpired { .. } => ErrorCode::RollbackWindowExpired,
        }
    }
}

#[cfg(test)]
mod kafka_tests;
#[cfg(test)]
mod tests;
