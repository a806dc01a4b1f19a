//! Error codes of the HTTP API (PROTOCOL §4) and the error body every failure carries.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Every error code the coordinator answers with, and its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// Malformed JSON, bad name, out-of-range number, unknown field (400).
    InvalidRequest,
    /// No or unknown token (401).
    Unauthenticated,
    /// The token lacks the role or the group/stream scope (403).
    Forbidden,
    /// The group does not exist (404).
    GroupNotFound,
    /// The stream does not exist (404).
    StreamNotFound,
    /// Heartbeat or leave with epoch > 0 from a member the group does not know (404).
    UnknownMemberId,
    /// The epoch is neither the member's current one nor the tolerated previous one (409).
    FencedMemberEpoch,
    /// A group with this id exists already (409).
    GroupAlreadyExists,
    /// Group created on an existing stream with another shard count (409).
    ShardCountMismatch,
    /// A reshard or rollback was asked while one runs (409).
    ReshardInProgress,
    /// Rollback asked after the rollback window closed (409).
    RollbackWindowExpired,
    /// Rollback asked with no reshard to undo, or of a rollback (409).
    NothingToRollback,
    /// Delete of a group with live members without `?force=true` (409).
    GroupNotEmpty,
    /// Join beyond the group's `max_members` (409).
    GroupMaxSizeReached,
    /// Join of a static member whose id is held by another live process (another
    /// `incarnation` that has not left with epoch -2 and whose session has not expired) (409).
    MemberIdInUse,
    /// Request body over the limit (413).
    PayloadTooLarge,
    /// The heartbeat's `protocol_version` is not spoken by this coordinator (400).
    UnsupportedProtocolVersion,
    /// Admin mutation over the per-principal rate (429).
    RateLimited,
    /// The metadata store cannot be reached (503); retry with backoff.
    StoreUnavailable,
    /// Compare-and-set retries exhausted (503); retry with backoff.
    StoreConflict,
    /// Unknown route (404).
    NotFound,
    /// Known route, wrong method (405).
    MethodNotAllowed,
    /// An unexpected server fault (500). The coordinator aims never to answer it.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order of PROTOCOL §4.2.
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::GroupNotFound,
        ErrorCode::StreamNotFound,
        ErrorCode::UnknownMemberId,
        ErrorCode::FencedMemberEpoch,
        ErrorCode::GroupAlreadyExists,
        ErrorCode::ShardCountMismatch,
        ErrorCode::ReshardInProgress,
        ErrorCode::RollbackWindowExpired,
        ErrorCode::NothingToRollback,
        ErrorCode::GroupNotEmpty,
        ErrorCode::GroupMaxSizeReached,
        ErrorCode::MemberIdInUse,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedProtocolVersion,
        ErrorCode::RateLimited,
        ErrorCode::StoreUnavailable,
        ErrorCode::StoreConflict,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Internal,
    ];

    /// The HTTP status this code is answered with.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidRequest | UnsupportedProtocolVersion => 400,
            Unauthenticated => 401,
            Forbidden => 403,
            GroupNotFound | StreamNotFound | UnknownMemberId | NotFound => 404,
            MethodNotAllowed => 405,
            FencedMemberEpoch
            | GroupAlreadyExists
            | ShardCountMismatch
            | ReshardInProgress
            | RollbackWindowExpired
            | NothingToRollback
            | GroupNotEmpty
            | GroupMaxSizeReached
            | MemberIdInUse => 409,
            PayloadTooLarge => 413,
            RateLimited => 429,
            Internal => 500,
            StoreUnavailable | StoreConflict => 503,
        }
    }

    /// The code as written on the wire, e.g. `"FENCED_MEMBER_EPOCH"`.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidRequest => "INVALID_REQUEST",
            Unauthenticated => "UNAUTHENTICATED",
            Forbidden => "FORBIDDEN",
            GroupNotFound => "GROUP_NOT_FOUND",
            StreamNotFound => "STREAM_NOT_FOUND",
            UnknownMemberId => "UNKNOWN_MEMBER_ID",
            FencedMemberEpoch => "FENCED_MEMBER_EPOCH",
            GroupAlreadyExists => "GROUP_ALREADY_EXISTS",
            ShardCountMismatch => "SHARD_COUNT_MISMATCH",
            ReshardInProgress => "RESHARD_IN_PROGRESS",
            RollbackWindowExpired => "ROLLBACK_WINDOW_EXPIRED",
            NothingToRollback => "NOTHING_TO_ROLLBACK",
            GroupNotEmpty => "GROUP_NOT_EMPTY",
            GroupMaxSizeReached => "GROUP_MAX_SIZE_REACHED",
            MemberIdInUse => "MEMBER_ID_IN_USE",
            PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            UnsupportedProtocolVersion => "UNSUPPORTED_PROTOCOL_VERSION",
            RateLimited => "RATE_LIMITED",
            StoreUnavailable => "STORE_UNAVAILABLE",
            StoreConflict => "STORE_CONFLICT",
            NotFound => "NOT_FOUND",
            MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Internal => "INTERNAL",
        }
    }

    /// Whether a client should retry the same request later (with backoff).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::StoreUnavailable
                | ErrorCode::StoreConflict
                | ErrorCode::RateLimited
                | ErrorCode::Internal
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error answer: `{"error": {"code": "…", "message": "…"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// The `error` object of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
    /// When a later retry may succeed, how long until then (ms): for `MEMBER_ID_IN_USE`,
    /// until the holder's session runs out if it does not heartbeat again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl ErrorBody {
    /// Builds an error body.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code,
                message: message.into(),
                retry_after_ms: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_match_serde() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).unwrap();
            assert_eq!(back, code);
        }
    }

    #[test]
    fn statuses_follow_the_spec() {
        assert_eq!(ErrorCode::FencedMemberEpoch.http_status(), 409);
        assert_eq!(ErrorCode::UnknownMemberId.http_status(), 404);
        assert_eq!(ErrorCode::UnsupportedProtocolVersion.http_status(), 400);
        assert_eq!(ErrorCode::PayloadTooLarge.http_status(), 413);
        assert_eq!(ErrorCode::StoreConflict.http_status(), 503);
        assert_eq!(ErrorCode::RateLimited.http_status(), 429);
    }

    #[test]
    fn body_shape() {
        let body = ErrorBody::new(ErrorCode::GroupNotFound, "no group g");
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"error": {"code": "GROUP_NOT_FOUND", "message": "no group g"}})
        );
    }
}
