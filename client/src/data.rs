//! The data Redis: one server, a Redis Cluster, or a master found through Redis Sentinel,
//! reached through [`rsc_redis`]'s connection type.
//!
//! Two kinds of connection:
//!
//! - the [`LazyRedis`] handle itself: one multiplexed connection shared by every member and
//!   worker of an app, for commands that answer at once (manual acknowledgements, dead
//!   letters, drain checks, the producer's `XADD`s). On a cluster each command is routed by
//!   its key; a pipeline must stay within one slot.
//! - [`NodeConn`]: a shard worker's own connection, to the node that serves the shard's slot
//!   (blocking reads, strict fencing's `WATCH`), made by [`LazyRedis::dedicated`].
//!
//! The client rides out a short restart of the data Redis ([`Reconnect::Patient`]) rather
//! than failing fast: its callers are workers that retry anyway.

pub(crate) use rsc_redis::NodeConn;
use rsc_redis::sentinel::SentinelTarget;
use rsc_redis::{ConnSettings, LazyRedis, OpenError, Reconnect, Tls};
use std::time::Duration;

/// How the client connects to the data Redis: 2 s to connect, 5 s for a non-blocking
/// command on the shared connection (the cluster's bound of one command too).
pub(crate) const SETTINGS: ConnSettings = ConnSettings {
    connect_timeout: Duration::from_secs(2),
    response_timeout: Duration::from_secs(5),
    operation_timeout: Duration::from_secs(5),
    reconnect: Reconnect::Patient,
};

/// Checks the URLs (several only with `cluster`; `rediss://` where `tls` is set) without
/// connecting.
pub(crate) fn check(urls: &[String], cluster: bool, tls: &Tls) -> Result<(), String> {
    LazyRedis::check(urls, cluster, tls).map_err(|e| message(e, urls.len()))
}

/// The producer's settings: as [`SETTINGS`], but failing fast ([`Reconnect::Quick`]): a
/// publish to a data Redis that does not answer fails at once, naming it, and the app
/// decides whether to try again.
pub(crate) const PRODUCER_SETTINGS: ConnSettings = ConnSettings {
    reconnect: Reconnect::Quick,
    ..SETTINGS
};

/// The data Redis (checked; connected on first use), with `settings` ([`SETTINGS`] or
/// [`PRODUCER_SETTINGS`]). Needs a Tokio runtime.
pub(crate) fn open(
    urls: &[String],
    cluster: bool,
    sentinel: Option<SentinelTarget>,
    tls: &Tls,
    settings: &ConnSettings,
) -> Result<LazyRedis, String> {
    match sentinel {
        Some(target) => {
            check(urls, cluster, &Tls::default())?;
            LazyRedis::open_sentinel(&target, &urls[0], settings, tls)
        }
        None => LazyRedis::open(urls, cluster, settings, tls),
    }
    .map_err(|e| message(e, urls.len()))
}

/// The client's words for an [`OpenError`]: it names the client's own settings.
fn message(e: OpenError, urls: usize) -> String {
    match e {
        OpenError::NoUrl => "no Redis URL".into(),
        OpenError::SeveralUrls => format!(
            "{urls} Redis URLs given: several seed URLs are only accepted with Redis Cluster \
             (RSC_REDIS_CLUSTER=true or .redis_cluster(true))"
        ),
        e => e.to_string(),
    }
}
