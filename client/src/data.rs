//! The data Redis: one server, a Redis Cluster, or a master found through Redis Sentinel,
//! reached through [`rsc_redis`]'s connection type.
//!
//! Two kinds of connection:
//!
//! - the [`rsc_redis::LazyRedis`] handle itself: one multiplexed connection shared by every member and
//!   worker of an app, for commands that answer at once (manual acknowledgements, dead
//!   letters, drain checks, the producer's `XADD`s). On a cluster each command is routed by
//!   its key; a pipeline must stay within one slot.
//! - [`NodeConn`]: a shard worker's own connection, to the node that serves the shard's slot
//!   (blocking reads, strict fencing's `WATCH`), made by [`rsc_redis::LazyRedis::dedicated`].
//!
//! The client rides out a short restart of the data Redis ([`Reconnect::Patient`]) rather
//! than failing fast: its callers are workers that retry anyway.

pub(crate) use rsc_redis::NodeConn;
use rsc_redis::{ConnSettings, Reconnect};
use std::time::Duration;

/// How the client connects to the data Redis: 2 s to connect, 5 s for a non-blocking
/// command on the shared connection (the cluster's bound of one command too).
pub(crate) const SETTINGS: ConnSettings = ConnSettings {
    connect_timeout: Duration::from_secs(2),
    response_timeout: Duration::from_secs(5),
    operation_timeout: Duration::from_secs(5),
    reconnect: Reconnect::Patient,
};

/// The producer's settings: as [`SETTINGS`], but failing fast ([`Reconnect::Quick`]): a
/// publish to a data Redis that does not answer fails at once, naming it, and the app
/// decides whether to try again.
pub(crate) const PRODUCER_SETTINGS: ConnSettings = ConnSettings {
    reconnect: Reconnect::Quick,
    ..SETTINGS
};
