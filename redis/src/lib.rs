//! The Redis connection of the Redis Stream Coordinator and its client.
//!
//! [`sentinel::SentinelRedis`] finds a master through Redis Sentinel, connects on first use,
//! and drops a connection to a master that died or was demoted (`READONLY`), so that the
//! next command asks the sentinels again.
//!
//! # Example
//!
//! ```no_run
//! use rsc_redis::sentinel::{SentinelConfig, SentinelRedis, parse_addrs};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = SentinelRedis::open(SentinelConfig {
//!     sentinels: parse_addrs("sentinel-0:26379,sentinel-1:26379")?,
//!     master_name: "data".into(),
//!     sentinel_username: None,
//!     sentinel_password: None,
//!     master: redis::RedisConnectionInfo::default(),
//!     connect_timeout: Duration::from_secs(1),
//!     response_timeout: Duration::from_secs(5),
//! })?;
//! let mut conn = redis.get().await?;
//! let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
//! assert_eq!(pong, "PONG");
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod sentinel;
