//! Wire types, error codes and the routing hash of Redis Stream Coordinator.
//!
//! This crate is shared by the coordinator server and the client framework. It performs no
//! I/O: it only describes what travels over HTTP (the `/v1` JSON API) and how a producer maps
//! a message key to a shard (PROTOCOL §3).
//!
//! "PROTOCOL §n" in these docs is a section of `docs/PROTOCOL.md` in the project's
//! repository: the behavioural contract (model, Redis key layout, routes, heartbeat rules,
//! fencing, resharding, error codes) that these types carry.
//!
//! ```
//! use rsc_protocol::routing::{shard_for_key, shard_key};
//!
//! // Every producer, in any language, must send key "order-1001" of a 16-shard stream
//! // to shard 11: the routing hash is xxh3_64 (seed 0) followed by jump consistent hash.
//! let shard = shard_for_key(b"order-1001", 16);
//! assert_eq!(shard, 11);
//! assert_eq!(shard_key("orders", shard), "orders:11");
//! ```
#![deny(missing_docs)]

pub mod entry;
pub mod epoch;
pub mod error;
pub mod limits;
pub mod names;
pub mod owner;
pub mod redact;
pub mod retry;
pub mod routing;
pub mod wire;

pub use epoch::MemberEpoch;
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use limits::LimitError;
pub use names::{GroupId, IdError, MemberId, StreamId};
pub use wire::*;

/// The protocol version this crate speaks (`protocol_version` in heartbeats).
pub const PROTOCOL_VERSION: u32 = 1;

/// How a dynamic member's `incarnation` begins (PROTOCOL §17): it names its process run, so a
/// second live process with the same member id is refused, but it is not a static member (it
/// leaves with -1, never steps away with -2).
pub const DYNAMIC_INCARNATION_PREFIX: &str = "dynamic:";

/// Whether `incarnation` is a static member's (PROTOCOL §11, §17).
pub fn is_static_incarnation(incarnation: &str) -> bool {
    !incarnation.starts_with(DYNAMIC_INCARNATION_PREFIX)
}
