//! The Redis connection of the Redis Stream Coordinator and its client: one handle for a
//! standalone Redis, a Redis Cluster, or a master found through Redis Sentinel.
//!
//! - [`LazyRedis`] connects on first use (a process started while Redis is down runs, and
//!   connects when it is up) and is cheap to clone. [`LazyRedis::get`] hands out a [`Conn`],
//!   which implements [`redis::aio::ConnectionLike`] over each kind of server; the handle
//!   itself does too, connecting for each command. On a cluster every command is routed to
//!   the node that owns its key's slot (`MOVED`/`ASK` followed), multi-key `DEL`/`UNLINK` are
//!   split per slot, and a pipeline must stay within one slot: callers that touch several
//!   slots send one command per key instead.
//! - [`LazyRedis::dedicated`] makes a [`NodeConn`], a connection of its own to the node that
//!   serves one slot, for blocking reads and `WATCH`: it follows `MOVED` itself and numbers
//!   its connections, so that a caller knows when a `WATCH` was lost with one.
//! - [`cluster`]: for callers that address a cluster's nodes rather than keys: the slot map,
//!   a command sent to one node, and a RESP3 connection for sharded pub/sub.
//! - Behind Redis Sentinel ([`LazyRedis::open_sentinel`], [`sentinel`]) the master is looked
//!   up through the sentinels; a connection to a master that died or was demoted
//!   (`READONLY`) is dropped and the new master looked up on next use, and one watcher per
//!   process and master name ([`watch`]) moves every connection as soon as the sentinels
//!   name a new master.
//!
//! - TLS ([`tls`]): a `rediss://` URL connects over TLS (standalone, cluster seeds, the
//!   master behind sentinels), verified against the system's roots or the CA of a [`Tls`]
//!   (loaded from files by [`TlsFiles::load`]), with an optional client certificate; the
//!   sentinels themselves over TLS with [`sentinel::SentinelTarget::tls`].
//!
//! Nothing is retried beyond one command's reconnection ([`Reconnect`]): a failed command
//! returns its error, and the caller's own retry lands on the recovered server.
//!
//! # Example
//!
//! ```no_run
//! use rsc_redis::{ConnSettings, LazyRedis, Reconnect, Tls};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = ConnSettings {
//!     connect_timeout: Duration::from_secs(1),
//!     response_timeout: Duration::from_secs(1),
//!     operation_timeout: Duration::from_secs(2),
//!     reconnect: Reconnect::Quick,
//! };
//! // Three seed nodes of a Redis Cluster; nothing is connected yet.
//! let urls = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000", "redis://10.0.0.3:7000"]
//!     .map(String::from);
//! let redis = LazyRedis::open(&urls, true, &settings, &Tls::default())?;
//! let mut conn = redis.get().await?;
//! let () = redis::cmd("SET").arg("greeting").arg("hello").query_async(&mut conn).await?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod cluster;
mod conn;
mod node;
pub mod sentinel;
mod settings;
pub mod tls;
pub mod watch;

pub use conn::{Conn, ConnSettings, LazyRedis, ModeError, OpenError, Reconnect, check_mode};
pub use node::NodeConn;
pub use settings::{Names, RedisSettings, SettingsError};
pub use tls::{Tls, TlsError, TlsFiles};
