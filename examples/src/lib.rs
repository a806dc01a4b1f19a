//! Sample pods of Redis Stream Coordinator (SPEC §8) and a minimal listener to copy.
//!
//! - `sample-consumer`: a consumer pod with flags for tests and demos (handling time, failure
//!   rate, a record stream of every successful handling).
//! - `sample-producer`: publishes `N` keyed messages, optionally at a rate.
//! - `quickstart`: the smallest real listener program; start from this one.
#![deny(missing_docs)]

pub mod health;

use std::time::Duration;

/// The data Redis master found through Redis Sentinel (`sentinels`: `HOST:PORT`,
/// comma-separated; `redis_url`'s credentials and database apply to the master), for the
/// sample pods' own commands beside the client's.
pub fn sentinel(
    sentinels: &str,
    master: &str,
    redis_url: &str,
    password: Option<String>,
) -> anyhow::Result<rsc_redis::sentinel::SentinelRedis> {
    let master_settings = redis::IntoConnectionInfo::into_connection_info(redis_url)?
        .redis_settings()
        .clone();
    Ok(rsc_redis::sentinel::SentinelRedis::open(
        rsc_redis::sentinel::SentinelConfig {
            sentinels: rsc_redis::sentinel::parse_addrs(sentinels)?,
            master_name: master.to_owned(),
            sentinel_username: None,
            sentinel_password: password,
            master: master_settings,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
        },
    )?)
}

/// Installs the Prometheus recorder for the client's metrics (`rsc_client_*`) and returns
/// the handle that renders them (served at `/metrics` by [`health::Health::serve`]).
pub fn install_metrics() -> anyhow::Result<metrics_exporter_prometheus::PrometheusHandle> {
    Ok(metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?)
}

/// Sets up logging to stderr: `RSC_LOG` (default `info`), as text.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RSC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
