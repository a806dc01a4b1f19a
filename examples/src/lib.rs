//! Sample pods of Redis Stream Coordinator (PROTOCOL §8) and a minimal listener to copy.
//!
//! - `sample-consumer`: a consumer pod with flags for tests and demos (handling time, failure
//!   rate, a record stream of every successful handling).
//! - `sample-producer`: publishes `N` keyed messages, optionally at a rate.
//! - `quickstart`: the smallest real listener program; start from this one.
#![deny(missing_docs)]

use rsc_redis::{ConnSettings, LazyRedis, Names, Reconnect};
use std::time::Duration;

/// The data Redis, for the sample pods' own commands beside the client's: `redis_url` (with
/// `cluster`, seed nodes, comma-separated), or with `sentinel` (`HOST:PORT` addresses,
/// comma-separated, and the master's name) the master the sentinels name, with `redis_url`'s
/// credentials and database. The other settings (sentinel password and TLS, TLS files) as the
/// client library reads them from the environment (`RSC_REDIS_*`). Connects on first use.
pub fn data_redis(
    redis_url: &str,
    cluster: bool,
    sentinel: Option<(&str, &str)>,
) -> anyhow::Result<LazyRedis> {
    let settings = ConnSettings {
        connect_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(5),
        operation_timeout: Duration::from_secs(5),
        reconnect: Reconnect::Patient,
    };
    let mut redis = rsc_client::ClientConfig::from_env().redis;
    (redis.url, redis.cluster) = (Some(redis_url.into()), cluster);
    (redis.sentinel, redis.sentinel_master) = sentinel.map(|(s, m)| (s.into(), m.into())).unzip();
    let redis = redis.ignoring_unused_sentinel_options();
    Ok(redis.open(Names::Env("RSC_REDIS"), &settings)?)
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
