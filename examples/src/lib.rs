//! Sample pods of Redis Stream Coordinator (PROTOCOL §8) and a minimal listener to copy.
//!
//! - `sample-consumer`: a consumer pod with flags for tests and demos (handling time, failure
//!   rate, a record stream of every successful handling).
//! - `sample-producer`: publishes `N` keyed messages, optionally at a rate.
//! - `quickstart`: the smallest real listener program; start from this one.
#![deny(missing_docs)]

use rsc_redis::sentinel::{SentinelTarget, parse_addrs};
use rsc_redis::{ConnSettings, LazyRedis, Reconnect, TlsFiles};
use std::time::Duration;

/// The data Redis, for the sample pods' own commands beside the client's: `redis_url` (with
/// `cluster`, seed nodes, comma-separated), or with `sentinel` (`HOST:PORT` addresses,
/// comma-separated, and the master's name) the master the sentinels name, with `redis_url`'s
/// credentials and database and `RSC_REDIS_SENTINEL_PASSWORD` as the sentinels' password.
/// TLS as the client library reads it from the environment: a `rediss://` URL,
/// `RSC_REDIS_TLS_CA`, `RSC_REDIS_TLS_CERT`, `RSC_REDIS_TLS_KEY`, `RSC_REDIS_SENTINEL_TLS`.
/// Connects on first use.
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
    let urls: Vec<String> = redis_url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let tls = TlsFiles {
        ca: env("RSC_REDIS_TLS_CA").map(Into::into),
        cert: env("RSC_REDIS_TLS_CERT").map(Into::into),
        key: env("RSC_REDIS_TLS_KEY").map(Into::into),
    }
    .load()?;
    let Some((sentinels, master)) = sentinel else {
        return Ok(LazyRedis::open(&urls, cluster, &settings, &tls)?);
    };
    let target = SentinelTarget {
        sentinels: parse_addrs(sentinels)?,
        master_name: master.to_owned(),
        username: None,
        password: std::env::var("RSC_REDIS_SENTINEL_PASSWORD")
            .ok()
            .map(Into::into),
        tls: env("RSC_REDIS_SENTINEL_TLS").is_some_and(|v| {
            matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes")
        }),
    };
    Ok(LazyRedis::open_sentinel(
        &target, redis_url, &settings, &tls,
    )?)
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
