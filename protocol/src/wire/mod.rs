//! Request and response bodies of the `/v1` HTTP API (PROTOCOL §4, §5), by audience: the
//! member protocol (`member`), the operators' routes (`admin`) and the read-only views
//! (`monitoring`); the settings all three carry are here. Every type is re-exported here and
//! from the crate root.
//!
//! Request types reject unknown fields (`INVALID_REQUEST`), so that a typo in a field name is
//! an error rather than a silently ignored setting. Ids in request bodies are typed
//! ([`crate::GroupId`], [`crate::StreamId`], [`crate::MemberId`]): a bad one is refused when
//! the body is parsed. The `pattern` literals of these modules are utoipa's (it takes no
//! constant); the coordinator's OpenAPI test checks each equals [`crate::names::NAME_PATTERN`].

use serde::{Deserialize, Serialize};

mod admin;
mod member;
mod monitoring;

pub use admin::*;
pub use member::*;
pub use monitoring::*;

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
