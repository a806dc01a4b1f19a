//! `rsc-coordinator serve` settings: flags, `RSC_*` environment variables and a TOML file.
//!
//! Precedence: command-line flag, then environment variable, then `--config` file, then the
//! default.

use clap::{Args, ValueEnum};
use rsc_protocol::redact::{redact_opt, redact_url};
use rsc_redis::sentinel::SentinelTarget;
use rsc_redis::{Tls, TlsFiles};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Which metadata store to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In process; for development and a single coordinator.
    #[default]
    Memory,
    /// Redis or Redis Cluster (`--redis-url`, `--redis-cluster`); several coordinators may
    /// share it.
    Redis,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `serve` flags. Every flag is optional here so that a `--config` file can fill it.
/// (`Debug` hides passwords: the Redis URLs' and the sentinels'.)
#[derive(Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeArgs {
    /// TOML file with any of these settings (kebab-case keys, e.g. `listen = "…"`).
    #[arg(long, env = "RSC_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, env = "RSC_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Metadata store [default: memory].
    #[arg(long, env = "RSC_STORE", value_enum)]
    pub store: Option<StoreKind>,
    /// ACL file (TOML, PROTOCOL §8). Without one every request is served as `anonymous`.
    #[arg(long, env = "RSC_ACL")]
    pub acl: Option<PathBuf>,
    /// Redis server for `--store redis` [default: redis://127.0.0.1:6379]. With
    /// `--redis-cluster`, one or more seed nodes separated by commas.
    #[arg(long, env = "RSC_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Talk Redis Cluster protocol (slot routing, MOVED/ASK) to `--redis-url`. Required for a
    /// cluster: the coordinator refuses to start when this does not match what the server
    /// reports (`INFO cluster`).
    #[arg(long, env = "RSC_REDIS_CLUSTER")]
    #[serde(default)]
    pub redis_cluster: bool,
    /// Find the store's Redis master through these Redis Sentinels (`HOST:PORT`, separated
    /// by commas) instead of `--redis-url`'s host; needs `--redis-sentinel-master`. The URL's
    /// user name, password and database number still apply to the master. After a failover
    /// the coordinator finds the new master by itself.
    #[arg(long, env = "RSC_REDIS_SENTINEL")]
    pub redis_sentinel: Option<String>,
    /// The master name the sentinels monitor (`sentinel monitor NAME …`).
    #[arg(long, env = "RSC_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,
    /// Password of the sentinels (`requirepass` in sentinel.conf), if any.
    #[arg(long, env = "RSC_REDIS_SENTINEL_PASSWORD", hide_env_values = true)]
    pub redis_sentinel_password: Option<String>,
    /// Redis store: after each group document commit, wait (`WAIT N 250`) until this many
    /// replicas have it, and refuse the commit (503 STORE_UNAVAILABLE, counted in
    /// `rsc_store_commits_refused_total`) when fewer did: a master that lost its replicas to
    /// a newer master cannot acknowledge group changes (RUNBOOK "Redis Sentinel") [default:
    /// 0, no wait].
    #[arg(long, env = "RSC_STORE_WAIT_REPLICAS")]
    pub store_wait_replicas: Option<u32>,
    /// Connect to the sentinels of `--redis-sentinel` over TLS, and to the master too
    /// (verified as with `rediss://`: `--redis-tls-ca`, else the system's roots).
    #[arg(long, env = "RSC_REDIS_SENTINEL_TLS")]
    #[serde(default)]
    pub redis_sentinel_tls: bool,
    /// CA certificate file (PEM) to verify the store's Redis against when `--redis-url` is
    /// `rediss://` [default: the system's roots]. (`rediss://…/#insecure` skips the check:
    /// for tests only.)
    #[arg(long, env = "RSC_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,
    /// Client certificate file (PEM) for mutual TLS with the store's Redis
    /// (`tls-auth-clients yes`); needs `--redis-tls-key`.
    #[arg(long, env = "RSC_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,
    /// Private key file (PEM) of `--redis-tls-cert`.
    #[arg(long, env = "RSC_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,
    /// Prefix of every Redis key [default: rsc]; characters A-Z a-z 0-9 . _ : -
    #[arg(long, env = "RSC_KEY_PREFIX")]
    pub key_prefix: Option<String>,
    /// Serve without an ACL on a non-loopback address.
    #[arg(long, env = "RSC_ALLOW_ANONYMOUS")]
    #[serde(default)]
    pub allow_anonymous: bool,
    /// Admin mutations per second per principal [default: 10].
    #[arg(long, env = "RSC_ADMIN_RATE")]
    pub admin_rate: Option<u32>,
    /// Burst of admin mutations per principal [default: 20].
    #[arg(long, env = "RSC_ADMIN_BURST")]
    pub admin_burst: Option<u32>,
    /// Proxies whose `X-Forwarded-For` names the client (PROTOCOL §7): addresses and CIDR
    /// ranges separated by commas (`10.0.0.0/8,127.0.0.1`). A request from one of them is
    /// attributed to the rightmost address of the header that is not a trusted proxy; every
    /// other request to its connection's peer. [default: none: the header is ignored]
    #[arg(long, env = "RSC_TRUSTED_PROXIES")]
    pub trusted_proxies: Option<String>,
    /// Requests per second per client address, checked before authentication; 0 turns the
    /// limit off [default: 0].
    #[arg(long, env = "RSC_CLIENT_RATE")]
    pub client_rate: Option<u32>,
    /// Burst of requests per client address [default: twice `--client-rate`].
    #[arg(long, env = "RSC_CLIENT_BURST")]
    pub client_burst: Option<u32>,
    /// Refused requests (401, 403, 413) per second per client address; past its burst an
    /// address is answered 429 RATE_LIMITED before authentication until it is under the rate
    /// again; 0 turns the limit off [default: 20].
    #[arg(long, env = "RSC_CLIENT_REFUSAL_RATE")]
    pub client_refusal_rate: Option<u32>,
    /// Burst of refused requests per client address [default: 200].
    #[arg(long, env = "RSC_CLIENT_REFUSAL_BURST")]
    pub client_refusal_burst: Option<u32>,
    /// Refused requests alike (client address, principal, route, code) are merged into one
    /// counted audit entry per this interval, in ms (PROTOCOL §7) [default: 10000].
    #[arg(long, env = "RSC_AUDIT_REFUSAL_INTERVAL_MS")]
    pub audit_refusal_interval_ms: Option<u64>,
    /// The data Redis (where the shard streams live): owner tokens of strict fencing are
    /// written there, lag and pending entries per shard are read from it (`XINFO GROUPS`)
    /// and retired shard keys are deleted from it. With `--data-redis-cluster`, one or more
    /// seed nodes separated by commas. Unset: nothing is queried.
    #[arg(long, env = "RSC_DATA_REDIS_URL")]
    pub data_redis_url: Option<String>,
    /// Talk Redis Cluster protocol (slot routing, MOVED/ASK) to `--data-redis-url`. Required
    /// when the data Redis is a cluster: the coordinator refuses to start when this does not
    /// match what the server reports (`INFO cluster`).
    #[arg(long, env = "RSC_DATA_REDIS_CLUSTER")]
    #[serde(default)]
    pub data_redis_cluster: bool,
    /// Find the data Redis master through these Redis Sentinels (`HOST:PORT`, separated by
    /// commas); needs `--data-redis-sentinel-master`. `--data-redis-url` is then optional
    /// (its user name, password and database number apply to the master).
    #[arg(long, env = "RSC_DATA_REDIS_SENTINEL")]
    pub data_redis_sentinel: Option<String>,
    /// The data Redis master name the sentinels monitor.
    #[arg(long, env = "RSC_DATA_REDIS_SENTINEL_MASTER")]
    pub data_redis_sentinel_master: Option<String>,
    /// Password of the data Redis's sentinels, if any.
    #[arg(long, env = "RSC_DATA_REDIS_SENTINEL_PASSWORD", hide_env_values = true)]
    pub data_redis_sentinel_password: Option<String>,
    /// Connect to the data Redis's sentinels over TLS, and to its master too.
    #[arg(long, env = "RSC_DATA_REDIS_SENTINEL_TLS")]
    #[serde(default)]
    pub data_redis_sentinel_tls: bool,
    /// CA certificate file (PEM) to verify the data Redis against when `--data-redis-url`
    /// is `rediss://` [default: the system's roots].
    #[arg(long, env = "RSC_DATA_REDIS_TLS_CA")]
    pub data_redis_tls_ca: Option<PathBuf>,
    /// Client certificate file (PEM) for mutual TLS with the data Redis; needs
    /// `--data-redis-tls-key`.
    #[arg(long, env = "RSC_DATA_REDIS_TLS_CERT")]
    pub data_redis_tls_cert: Option<PathBuf>,
    /// Private key file (PEM) of `--data-redis-tls-cert`.
    #[arg(long, env = "RSC_DATA_REDIS_TLS_KEY")]
    pub data_redis_tls_key: Option<PathBuf>,
    /// How long after completion a reshard may be rolled back, in ms [default: 900000].
    #[arg(long, env = "RSC_ROLLBACK_WINDOW_MS")]
    pub rollback_window_ms: Option<u64>,
    /// How long after a reshard completed the keys of the shards it retired are kept in the
    /// data Redis before they are deleted, in ms [default: the rollback window]. Only with
    /// --data-redis-url; never shorter than the rollback window.
    #[arg(long, env = "RSC_RETIRED_KEY_DELAY_MS")]
    pub retired_key_delay_ms: Option<u64>,
    /// How often the expiry sweep runs, in ms [default: 250].
    #[arg(long, env = "RSC_SWEEP_INTERVAL_MS")]
    pub sweep_interval_ms: Option<u64>,
    /// How often each group's lag and handling rate are sampled for the history
    /// (`GET /v1/groups/{group}/history`, the dashboard chart), in ms [default: 5000]. Only
    /// with a data Redis.
    #[arg(long, env = "RSC_HISTORY_INTERVAL_MS")]
    pub history_interval_ms: Option<u64>,
    /// How long a deleted group's revision tombstone is kept before it is collected, in ms
    /// [default: 3600000].
    #[arg(long, env = "RSC_TOMBSTONE_RETENTION_MS")]
    pub tombstone_retention_ms: Option<u64>,
    /// What to do when the metadata store lost a stream or group document that the
    /// recovery copy in the data Redis holds (PROTOCOL §2.3): `auto` restores it at once
    /// (logged, audited, counted), `manual` refuses and logs (`rsc-coordinator store
    /// restore` restores) [default: auto]. Only with a data Redis.
    #[arg(long, env = "RSC_STORE_RECOVERY", value_enum)]
    pub store_recovery: Option<crate::recovery::RecoveryMode>,
    /// Request body limit in bytes [default: 65536].
    #[arg(long, env = "RSC_BODY_LIMIT")]
    pub body_limit: Option<usize>,
    /// Most wake-up channels (`POST /v1/wakeups`) open at once; one more is refused with
    /// 429 RATE_LIMITED and its members heartbeat as usual; 0 turns the route off
    /// [default: 20000].
    #[arg(long, env = "RSC_WAKE_MAX_CHANNELS")]
    pub wake_max_channels: Option<usize>,
    /// A wake-up channel that carried no wake-up for this long is closed (the client reopens
    /// it), in ms [default: 300000].
    #[arg(long, env = "RSC_WAKE_IDLE_TIMEOUT_MS")]
    pub wake_idle_timeout_ms: Option<u64>,
    /// Log format [default: text].
    #[arg(long, env = "RSC_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Serve HTTPS (HTTP/1.1 and HTTP/2) with this certificate chain (PEM, leaf first);
    /// needs `--tls-key`. Re-read when it changes and on SIGHUP (PROTOCOL §20).
    #[arg(long, env = "RSC_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, env = "RSC_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Require a client certificate chaining to these CA certificates (PEM) on every
    /// connection: mutual TLS. ACL entries may then name a certificate subject
    /// (`cert_subject`, PROTOCOL §8). Needs `--tls-cert`.
    #[arg(long, env = "RSC_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

/// Fully resolved serve settings.
/// (`Debug` hides the Redis URLs' passwords.)
#[derive(Clone)]
pub struct ServeConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Store kind.
    pub store: StoreKind,
    /// ACL file.
    pub acl: Option<PathBuf>,
    /// Redis URLs (one, or cluster seed nodes).
    pub redis_urls: Vec<String>,
    /// Redis Cluster mode.
    pub redis_cluster: bool,
    /// The store's master is found through these sentinels.
    pub redis_sentinel: Option<SentinelTarget>,
    /// Replicas that must acknowledge a group document commit (0: none).
    pub store_wait_replicas: u32,
    /// CA and client certificate of the store's TLS connections (loaded).
    pub redis_tls: Tls,
    /// Key prefix.
    pub key_prefix: String,
    /// Allow non-loopback binding without an ACL.
    pub allow_anonymous: bool,
    /// Admin mutations per second per principal.
    pub admin_rate: u32,
    /// Admin mutation burst per principal.
    pub admin_burst: u32,
    /// Trusted proxies (validated list, PROTOCOL §7); `None`: none.
    pub trusted_proxies: Option<String>,
    /// Requests per second per client address (0: off).
    pub client_rate: u32,
    /// Burst of requests per client address.
    pub client_burst: u32,
    /// Refused requests per second per client address (0: off).
    pub client_refusal_rate: u32,
    /// Burst of refused requests per client address.
    pub client_refusal_burst: u32,
    /// Interval over which refusals alike are merged in the audit log, in ms.
    pub audit_refusal_interval_ms: u64,
    /// Data Redis URLs (one, or cluster seed nodes); `None` without a data Redis.
    pub data_redis_urls: Option<Vec<String>>,
    /// The data Redis is a Redis Cluster.
    pub data_redis_cluster: bool,
    /// The data Redis master is found through these sentinels (`data_redis_urls` then only
    /// carries credentials).
    pub data_redis_sentinel: Option<SentinelTarget>,
    /// CA and client certificate of the data Redis's TLS connections (loaded).
    pub data_redis_tls: Tls,
    /// Rollback window.
    pub rollback_window_ms: u64,
    /// Delay before retired shard keys are deleted from the data Redis.
    pub retired_key_delay_ms: u64,
    /// Expiry sweep period.
    pub sweep_interval_ms: u64,
    /// Lag history sampling period.
    pub history_interval_ms: u64,
    /// Retention of deleted groups' revision tombstones.
    pub tombstone_retention_ms: u64,
    /// Restore documents the store lost from the recovery copy by itself, or not.
    pub store_recovery: crate::recovery::RecoveryMode,
    /// Body limit.
    pub body_limit: usize,
    /// Most open wake-up channels (0: the route is off).
    pub wake_max_channels: usize,
    /// Idle timeout of a wake-up channel.
    pub wake_idle_timeout_ms: u64,
    /// Log format.
    pub log_format: LogFormat,
    /// HTTPS on the listener (certificate, key, client CA); `None`: plain HTTP.
    pub listener_tls: Option<crate::tls::ListenerTls>,
}

impl std::fmt::Debug for ServeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeArgs")
            .field("config", &self.config)
            .field("listen", &self.listen)
            .field("store", &self.store)
            .field("acl", &self.acl)
            .field("redis_url", &self.redis_url.as_deref().map(redact_url))
            .field("redis_cluster", &self.redis_cluster)
            .field("redis_sentinel", &self.redis_sentinel)
            .field("redis_sentinel_master", &self.redis_sentinel_master)
            .field(
                "redis_sentinel_password",
                &redact_opt(&self.redis_sentinel_password),
            )
            .field("redis_sentinel_tls", &self.redis_sentinel_tls)
            .field("redis_tls_ca", &self.redis_tls_ca)
            .field("redis_tls_cert", &self.redis_tls_cert)
            .field("redis_tls_key", &self.redis_tls_key)
            .field("key_prefix", &self.key_prefix)
            .field("allow_anonymous", &self.allow_anonymous)
            .field("admin_rate", &self.admin_rate)
            .field("admin_burst", &self.admin_burst)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("client_rate", &self.client_rate)
            .field("client_burst", &self.client_burst)
            .field("client_refusal_rate", &self.client_refusal_rate)
            .field("client_refusal_burst", &self.client_refusal_burst)
            .field("audit_refusal_interval_ms", &self.audit_refusal_interval_ms)
            .field(
                "data_redis_url",
                &self.data_redis_url.as_deref().map(redact_url),
            )
            .field("data_redis_cluster", &self.data_redis_cluster)
            .field("data_redis_sentinel", &self.data_redis_sentinel)
            .field(
                "data_redis_sentinel_master",
                &self.data_redis_sentinel_master,
            )
            .field(
                "data_redis_sentinel_password",
                &redact_opt(&self.data_redis_sentinel_password),
            )
            .field("data_redis_sentinel_tls", &self.data_redis_sentinel_tls)
            .field("data_redis_tls_ca", &self.data_redis_tls_ca)
            .field("data_redis_tls_cert", &self.data_redis_tls_cert)
            .field("data_redis_tls_key", &self.data_redis_tls_key)
            .field("rollback_window_ms", &self.rollback_window_ms)
            .field("retired_key_delay_ms", &self.retired_key_delay_ms)
            .field("sweep_interval_ms", &self.sweep_interval_ms)
            .field("history_interval_ms", &self.history_interval_ms)
            .field("tombstone_retention_ms", &self.tombstone_retention_ms)
            .field("store_recovery", &self.store_recovery)
            .field("store_wait_replicas", &self.store_wait_replicas)
            .field("body_limit", &self.body_limit)
            .field("log_format", &self.log_format)
            .finish()
    }
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("store", &self.store)
            .field("acl", &self.acl)
            .field(
                "redis_urls",
                &self
                    .redis_urls
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("redis_cluster", &self.redis_cluster)
            .field("redis_sentinel", &self.redis_sentinel)
            .field("store_wait_replicas", &self.store_wait_replicas)
            .field("redis_tls", &self.redis_tls)
            .field("key_prefix", &self.key_prefix)
            .field("allow_anonymous", &self.allow_anonymous)
            .field("admin_rate", &self.admin_rate)
            .field("admin_burst", &self.admin_burst)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("client_rate", &self.client_rate)
            .field("client_burst", &self.client_burst)
            .field("client_refusal_rate", &self.client_refusal_rate)
            .field("client_refusal_burst", &self.client_refusal_burst)
            .field("audit_refusal_interval_ms", &self.audit_refusal_interval_ms)
            .field(
                "data_redis_urls",
                &self
                    .data_redis_urls
                    .as_ref()
                    .map(|us| us.iter().map(|u| redact_url(u)).collect::<Vec<_>>()),
            )
            .field("data_redis_cluster", &self.data_redis_cluster)
            .field("data_redis_sentinel", &self.data_redis_sentinel)
            .field("data_redis_tls", &self.data_redis_tls)
            .field("rollback_window_ms", &self.rollback_window_ms)
            .field("retired_key_delay_ms", &self.retired_key_delay_ms)
            .field("sweep_interval_ms", &self.sweep_interval_ms)
            .field("history_interval_ms", &self.history_interval_ms)
            .field("tombstone_retention_ms", &self.tombstone_retention_ms)
            .field("store_recovery", &self.store_recovery)
            .field("body_limit", &self.body_limit)
            .field("log_format", &self.log_format)
            .field("listener_tls", &self.listener_tls)
            .finish()
    }
}

/// A configuration error.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The `--config` file is not valid.
    #[error("config file {path} is invalid: {source}")]
    Parse {
        /// File.
        path: PathBuf,
        /// Cause.
        source: Box<toml::de::Error>,
    },
    /// A value is out of range or unsafe.
    #[error("{0}")]
    Invalid(String),
}

impl ServeArgs {
    /// Merges flags/env over the `--config` file over defaults, and checks the result.
    pub fn resolve(self) -> Result<ServeConfig, ConfigError> {
        let file = self.read_file()?;
        let cfg = self.merge(file)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The `--config` file's settings (all unset without one).
    fn read_file(&self) -> Result<ServeArgs, ConfigError> {
        Ok(match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                toml::from_str::<ServeArgs>(&text).map_err(|source| ConfigError::Parse {
                    path: path.clone(),
                    source: Box::new(source),
                })?
            }
            None => ServeArgs::default(),
        })
    }

    /// The sentinel settings of the metadata and the data Redis (taken from these settings
    /// over `file`'s), checked.
    fn sentinels(
        &mut self,
        file: &mut ServeArgs,
    ) -> Result<[Option<SentinelTarget>; 2], ConfigError> {
        Ok([
            sentinel_target(
                "redis-sentinel",
                self.redis_sentinel.take().or(file.redis_sentinel.take()),
                self.redis_sentinel_master
                    .take()
                    .or(file.redis_sentinel_master.take()),
                self.redis_sentinel_password
                    .take()
                    .or(file.redis_sentinel_password.take()),
                self.redis_sentinel_tls || file.redis_sentinel_tls,
            )?,
            sentinel_target(
                "data-redis-sentinel",
                self.data_redis_sentinel
                    .take()
                    .or(file.data_redis_sentinel.take()),
                self.data_redis_sentinel_master
                    .take()
                    .or(file.data_redis_sentinel_master.take()),
                self.data_redis_sentinel_password
                    .take()
                    .or(file.data_redis_sentinel_password.take()),
                self.data_redis_sentinel_tls || file.data_redis_sentinel_tls,
            )?,
        ])
    }

    /// The TLS files of the metadata and the data Redis (these settings over `file`'s),
    /// loaded: a file that cannot be read or used is an error here, at startup.
    fn tls(&mut self, file: &mut ServeArgs) -> Result<[Tls; 2], ConfigError> {
        let load = |flag: &str, files: TlsFiles| {
            files.load().map_err(|e| {
                ConfigError::Invalid(format!("--{flag}-ca / --{flag}-cert / --{flag}-key: {e}"))
            })
        };
        Ok([
            load(
                "redis-tls",
                TlsFiles {
                    ca: self.redis_tls_ca.take().or(file.redis_tls_ca.take()),
                    cert: self.redis_tls_cert.take().or(file.redis_tls_cert.take()),
                    key: self.redis_tls_key.take().or(file.redis_tls_key.take()),
                },
            )?,
            load(
                "data-redis-tls",
                TlsFiles {
                    ca: self
                        .data_redis_tls_ca
                        .take()
                        .or(file.data_redis_tls_ca.take()),
                    cert: (self.data_redis_tls_cert.take()).or(file.data_redis_tls_cert.take()),
                    key: self
                        .data_redis_tls_key
                        .take()
                        .or(file.data_redis_tls_key.take()),
                },
            )?,
        ])
    }

    /// These settings over `file`'s over the defaults (checking the sentinel settings).
    fn merge(mut self, mut file: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let [redis_sentinel, data_redis_sentinel] = self.sentinels(&mut file)?;
        let [redis_tls, data_redis_tls] = self.tls(&mut file)?;
        let data_redis_url = self.data_redis_url.or(file.data_redis_url).or_else(|| {
            // Behind sentinels the URL only carries credentials: none by default.
            data_redis_sentinel
                .as_ref()
                .map(|_| "redis://sentinel-master/".to_owned())
        });
        let rollback_window_ms = self
            .rollback_window_ms
            .or(file.rollback_window_ms)
            .unwrap_or(15 * 60 * 1000);
        Ok(ServeConfig {
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070))),
            store: self.store.or(file.store).unwrap_or_default(),
            acl: self.acl.or(file.acl),
            redis_urls: self
                .redis_url
                .or(file.redis_url)
                .map(|urls| split_urls(&urls))
                .unwrap_or_else(|| vec!["redis://127.0.0.1:6379".into()]),
            redis_cluster: self.redis_cluster || file.redis_cluster,
            redis_sentinel,
            redis_tls,
            key_prefix: self
                .key_prefix
                .or(file.key_prefix)
                .unwrap_or_else(|| "rsc".into()),
            allow_anonymous: self.allow_anonymous || file.allow_anonymous,
            admin_rate: self.admin_rate.or(file.admin_rate).unwrap_or(10),
            admin_burst: self.admin_burst.or(file.admin_burst).unwrap_or(20),
            trusted_proxies: self
                .trusted_proxies
                .or(file.trusted_proxies)
                .filter(|s| !s.trim().is_empty()),
            client_rate: self.client_rate.or(file.client_rate).unwrap_or(0),
            client_burst: self.client_burst.or(file.client_burst).unwrap_or_else(|| {
                self.client_rate
                    .or(file.client_rate)
                    .unwrap_or(0)
                    .saturating_mul(2)
            }),
            client_refusal_rate: self
                .client_refusal_rate
                .or(file.client_refusal_rate)
                .unwrap_or(20),
            client_refusal_burst: self
                .client_refusal_burst
                .or(file.client_refusal_burst)
                .unwrap_or(200),
            audit_refusal_interval_ms: self
                .audit_refusal_interval_ms
                .or(file.audit_refusal_interval_ms)
                .unwrap_or(10_000),
            data_redis_urls: data_redis_url.map(|urls| split_urls(&urls)),
            data_redis_cluster: self.data_redis_cluster || file.data_redis_cluster,
            data_redis_sentinel,
            data_redis_tls,
            rollback_window_ms,
            retired_key_delay_ms: self
                .retired_key_delay_ms
                .or(file.retired_key_delay_ms)
                .unwrap_or(rollback_window_ms),
            sweep_interval_ms: self
                .sweep_interval_ms
                .or(file.sweep_interval_ms)
                .unwrap_or(250),
            history_interval_ms: self
                .history_interval_ms
                .or(file.history_interval_ms)
                .unwrap_or(crate::metrics::DEFAULT_HISTORY_INTERVAL.as_millis() as u64),
            tombstone_retention_ms: self
                .tombstone_retention_ms
                .or(file.tombstone_retention_ms)
                .unwrap_or(crate::store::TOMBSTONE_RETENTION.as_millis() as u64),
            store_recovery: self
                .store_recovery
                .or(file.store_recovery)
                .unwrap_or_default(),
            store_wait_replicas: self
                .store_wait_replicas
                .or(file.store_wait_replicas)
                .unwrap_or(0),
            body_limit: self
                .body_limit
                .or(file.body_limit)
                .unwrap_or(crate::api::DEFAULT_BODY_LIMIT),
            wake_max_channels: self
                .wake_max_channels
                .or(file.wake_max_channels)
                .unwrap_or(20_000),
            wake_idle_timeout_ms: self
                .wake_idle_timeout_ms
                .or(file.wake_idle_timeout_ms)
                .unwrap_or(300_000),
            log_format: self.log_format.or(file.log_format).unwrap_or_default(),
            listener_tls: listener_tls(
                self.tls_cert.or(file.tls_cert),
                self.tls_key.or(file.tls_key),
                self.tls_client_ca.or(file.tls_client_ca),
            )?,
        })
    }
}

impl ServeConfig {
    /// Checks the merged settings: ranges, and combinations that cannot work.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.retired_key_delay_ms < self.rollback_window_ms {
            return Err(ConfigError::Invalid(format!(
                "retired-key-delay-ms is {}; it must not be shorter than the rollback window \
                 ({} ms): a rollback within the window needs the keys",
                self.retired_key_delay_ms, self.rollback_window_ms
            )));
        }
        if self.acl.is_none() && !self.listen.ip().is_loopback() && !self.allow_anonymous {
            return Err(ConfigError::Invalid(format!(
                "refusing to serve {} without an ACL: bind a loopback address, or pass \
                 --allow-anonymous to serve every client without authentication",
                self.listen
            )));
        }
        if !(10..=60_000).contains(&self.sweep_interval_ms) {
            return Err(ConfigError::Invalid(format!(
                "sweep-interval-ms is {}; it must be within 10..=60000",
                self.sweep_interval_ms
            )));
        }
        if !(100..=60_000).contains(&self.history_interval_ms) {
            return Err(ConfigError::Invalid(format!(
                "history-interval-ms is {}; it must be within 100..=60000",
                self.history_interval_ms
            )));
        }
        if !(100..=30 * 24 * 3_600_000).contains(&self.tombstone_retention_ms) {
            return Err(ConfigError::Invalid(format!(
                "tombstone-retention-ms is {}; it must be within 100..=2592000000 (30 days)",
                self.tombstone_retention_ms
            )));
        }
        if self.admin_rate == 0 || self.admin_burst == 0 {
            return Err(ConfigError::Invalid(
                "admin-rate and admin-burst must be at least 1".into(),
            ));
        }
        if let Some(list) = &self.trusted_proxies {
            crate::auth::client::TrustedProxies::parse(list)
                .map_err(|e| ConfigError::Invalid(format!("trusted-proxies: {e}")))?;
        }
        if self.client_rate > 0 && self.client_burst == 0 {
            return Err(ConfigError::Invalid(
                "client-burst must be at least 1 when client-rate is set".into(),
            ));
        }
        if self.client_refusal_rate > 0 && self.client_refusal_burst == 0 {
            return Err(ConfigError::Invalid(
                "client-refusal-burst must be at least 1 when client-refusal-rate is set".into(),
            ));
        }
        if !(100..=3_600_000).contains(&self.audit_refusal_interval_ms) {
            return Err(ConfigError::Invalid(format!(
                "audit-refusal-interval-ms is {}; it must be within 100..=3600000",
                self.audit_refusal_interval_ms
            )));
        }
        crate::store::validate_key_prefix(&self.key_prefix).map_err(ConfigError::Invalid)?;
        self.validate_redis()?;
        if !(1_000..=24 * 3_600_000).contains(&self.wake_idle_timeout_ms) {
            return Err(ConfigError::Invalid(format!(
                "wake-idle-timeout-ms is {}; it must be within 1000..=86400000",
                self.wake_idle_timeout_ms
            )));
        }
        if self.body_limit < 1024 {
            return Err(ConfigError::Invalid(
                "body-limit must be at least 1024".into(),
            ));
        }
        Ok(())
    }

    /// Checks the metadata and data Redis settings: URLs, cluster and sentinel together.
    fn validate_redis(&self) -> Result<(), ConfigError> {
        if self.redis_urls.is_empty() {
            return Err(ConfigError::Invalid("redis-url is empty".into()));
        }
        if self.redis_urls.len() > 1 && !self.redis_cluster {
            return Err(ConfigError::Invalid(
                "redis-url lists several servers: that is only valid with --redis-cluster".into(),
            ));
        }
        match &self.data_redis_urls {
            Some(urls) if urls.is_empty() => {
                return Err(ConfigError::Invalid("data-redis-url is empty".into()));
            }
            Some(urls) if urls.len() > 1 && !self.data_redis_cluster => {
                return Err(ConfigError::Invalid(
                    "data-redis-url lists several servers: that is only valid with \
                     --data-redis-cluster"
                        .into(),
                ));
            }
            None if self.data_redis_cluster => {
                return Err(ConfigError::Invalid(
                    "--data-redis-cluster needs --data-redis-url (the cluster's seed nodes)".into(),
                ));
            }
            _ => {}
        }
        if self.redis_sentinel.is_some() && self.redis_cluster {
            return Err(ConfigError::Invalid(
                "--redis-sentinel and --redis-cluster exclude each other (a cluster fails \
                 over by itself)"
                    .into(),
            ));
        }
        if self.data_redis_sentinel.is_some() && self.data_redis_cluster {
            return Err(ConfigError::Invalid(
                "--data-redis-sentinel and --data-redis-cluster exclude each other".into(),
            ));
        }
        Ok(())
    }
}

/// The sentinel settings of one Redis (`flag` names them in errors): none, or addresses and
/// a master name together.
fn sentinel_target(
    flag: &str,
    addrs: Option<String>,
    master: Option<String>,
    password: Option<String>,
    tls: bool,
) -> Result<Option<SentinelTarget>, ConfigError> {
    match (addrs, master) {
        (None, None) if password.is_none() && !tls => Ok(None),
        (Some(addrs), Some(master)) if !master.trim().is_empty() => Ok(Some(SentinelTarget {
            sentinels: rsc_redis::sentinel::parse_addrs(&addrs)
                .map_err(|e| ConfigError::Invalid(format!("--{flag}: {e}")))?,
            master_name: master.trim().to_owned(),
            username: None,
            password,
            tls,
        })),
        (Some(_), _) => Err(ConfigError::Invalid(format!(
            "--{flag} needs --{flag}-master (the name the sentinels monitor the master under)"
        ))),
        _ => Err(ConfigError::Invalid(format!(
            "--{flag}-master, --{flag}-password and --{flag}-tls need --{flag} (the sentinel \
             addresses)"
        ))),
    }
}

/// The listener's TLS files: a certificate and its key together, a client CA only with
/// them. (The files are read when the server starts, which names a file it cannot use.)
fn listener_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<crate::tls::ListenerTls>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(crate::tls::ListenerTls {
            cert,
            key,
            client_ca,
        })),
        (None, None) if client_ca.is_some() => Err(ConfigError::Invalid(
            "--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked \
             for in the TLS handshake"
                .into(),
        )),
        (None, None) => Ok(None),
        _ => Err(ConfigError::Invalid(
            "--tls-cert and --tls-key go together: give both, or neither for plain HTTP".into(),
        )),
    }
}

/// Comma-separated URLs, trimmed, empty ones dropped.
fn split_urls(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn listener_tls_needs_a_certificate_and_its_key() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(listener_tls(None, None, None).unwrap(), None);
        let t = listener_tls(p("c.pem"), p("k.pem"), p("ca.pem"))
            .unwrap()
            .unwrap();
        assert_eq!(t.client_ca, p("ca.pem"));
        for (c, k, ca, want) in [
            (p("c"), None, None, "go together"),
            (None, p("k"), None, "go together"),
            (None, None, p("ca"), "needs --tls-cert"),
        ] {
            let e = listener_tls(c, k, ca).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn security_settings_from_a_toml_file_and_defaults() {
        let mut f = tempfile_in_target();
        writeln!(
            f.1,
            "acl = \"/etc/rsc/acl.toml\"\nadmin-rate = 5\nadmin-burst = 7\n\
             data-redis-url = \"redis://127.0.0.1:6390\"\nlisten = \"0.0.0.0:7070\""
        )
        .unwrap();
        let cfg = ServeArgs {
            config: Some(f.0.clone()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            cfg.acl.as_deref(),
            Some(std::path::Path::new("/etc/rsc/acl.toml"))
        );
        assert_eq!((cfg.admin_rate, cfg.admin_burst), (5, 7));
        assert_eq!(
            cfg.data_redis_urls.as_deref(),
            Some(&["redis://127.0.0.1:6390".to_owned()][..])
        );
        assert!(!cfg.data_redis_cluster);
        assert!(
            !cfg.listen.ip().is_loopback(),
            "with an ACL any address may be bound"
        );
        let _ = std::fs::remove_file(&f.0);

        let d = ServeArgs::default().resolve().unwrap();
        assert_eq!((d.admin_rate, d.admin_burst, d.acl), (10, 20, None));
        assert_eq!(d.data_redis_urls, None);
        assert_eq!(d.retired_key_delay_ms, d.rollback_window_ms);
    }

    #[test]
    fn retired_key_delay_defaults_to_the_window_and_is_never_shorter() {
        let cfg = ServeArgs {
            rollback_window_ms: Some(5_000),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(cfg.retired_key_delay_ms, 5_000);
        let longer = ServeArgs {
            rollback_window_ms: Some(5_000),
            retired_key_delay_ms: Some(60_000),
            ..ServeArgs::default()
        };
        assert_eq!(longer.resolve().unwrap().retired_key_delay_ms, 60_000);
        let shorter = ServeArgs {
            rollback_window_ms: Some(5_000),
            retired_key_delay_ms: Some(1_000),
            ..ServeArgs::default()
        };
        assert!(matches!(shorter.resolve(), Err(ConfigError::Invalid(_))));
    }

    #[test]
    fn refuses_open_non_loopback_and_zero_rates() {
        let open = ServeArgs {
            listen: Some("0.0.0.0:7070".parse().unwrap()),
            ..ServeArgs::default()
        };
        assert!(
            open.clone()
                .resolve()
                .unwrap_err()
                .to_string()
                .contains("--allow-anonymous")
        );
        assert!(
            ServeArgs {
                allow_anonymous: true,
                ..open
            }
            .resolve()
            .is_ok()
        );
        let zero = ServeArgs {
            admin_rate: Some(0),
            ..ServeArgs::default()
        };
        assert!(zero.resolve().is_err());
    }

    #[test]
    fn sentinel_settings_need_addresses_and_a_master_name() {
        let cfg = ServeArgs {
            redis_sentinel: Some("127.0.0.1:26379, 127.0.0.1:26380".into()),
            redis_sentinel_master: Some("rsc".into()),
            data_redis_sentinel: Some("127.0.0.1:26381".into()),
            data_redis_sentinel_master: Some("data".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        let s = cfg.redis_sentinel.unwrap();
        assert_eq!((s.sentinels.len(), s.master_name.as_str()), (2, "rsc"));
        assert_eq!(cfg.data_redis_sentinel.unwrap().master_name, "data");
        assert!(
            cfg.data_redis_urls.is_some(),
            "a data Redis behind sentinels is enabled without a URL"
        );
        let no_master = ServeArgs {
            redis_sentinel: Some("127.0.0.1:26379".into()),
            ..ServeArgs::default()
        };
        assert!(
            no_master
                .resolve()
                .unwrap_err()
                .to_string()
                .contains("--redis-sentinel-master")
        );
        let bad = ServeArgs {
            redis_sentinel: Some("nohost".into()),
            redis_sentinel_master: Some("m".into()),
            ..ServeArgs::default()
        };
        assert!(bad.resolve().is_err());
        let both = ServeArgs {
            redis_sentinel: Some("127.0.0.1:26379".into()),
            redis_sentinel_master: Some("m".into()),
            redis_cluster: true,
            ..ServeArgs::default()
        };
        assert!(both.resolve().is_err());
    }

    #[test]
    fn tls_files_are_loaded_at_startup_and_named_in_errors() {
        let none = ServeArgs::default().resolve().unwrap();
        assert!(!none.redis_tls.is_set() && !none.data_redis_tls.is_set());
        let missing = ServeArgs {
            data_redis_tls_ca: Some("/nonexistent/ca.pem".into()),
            ..ServeArgs::default()
        };
        let e = missing.resolve().unwrap_err().to_string();
        assert!(
            e.contains("--data-redis-tls-ca") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let half = ServeArgs {
            redis_tls_cert: Some("/etc/rsc/client.pem".into()),
            ..ServeArgs::default()
        };
        let e = half.resolve().unwrap_err().to_string();
        assert!(e.contains("needs its private key"), "{e}");
        let tls_alone = ServeArgs {
            redis_sentinel_tls: true,
            ..ServeArgs::default()
        };
        let e = tls_alone.resolve().unwrap_err().to_string();
        assert!(
            e.contains("--redis-sentinel-tls need --redis-sentinel"),
            "{e}"
        );
        let behind = ServeArgs {
            redis_sentinel: Some("127.0.0.1:26379".into()),
            redis_sentinel_master: Some("m".into()),
            redis_sentinel_tls: true,
            ..ServeArgs::default()
        };
        assert!(behind.resolve().unwrap().redis_sentinel.unwrap().tls);
    }

    fn tempfile_in_target() -> (PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!(
            "rsc-config-test-{}-{:?}.toml",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::File::create(&path).unwrap();
        (path, f)
    }
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn debug_output_hides_redis_and_sentinel_passwords() {
        let args = ServeArgs {
            redis_url: Some("redis://app:pw-store@r:6379".into()),
            data_redis_url: Some("redis://:pw-data@d:6379".into()),
            redis_sentinel_password: Some("pw-sentinel".into()),
            data_redis_sentinel_password: Some("pw-data-sentinel".into()),
            ..ServeArgs::default()
        };
        let shown = format!("{args:?}");
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(shown.contains("redis://app:<redacted>@r:6379"), "{shown}");
    }
}
