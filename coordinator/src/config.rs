//! `rsc-coordinator serve` settings: flags, `RSC_*` environment variables and a TOML file.
//!
//! Precedence: command-line flag, then environment variable, then `--config` file, then the
//! default.

use crate::api::DEFAULT_BODY_LIMIT;
use clap::{Args, ValueEnum};
use rsc_protocol::redact::{SecretString, SecretUrl};
use rsc_redis::{Names, RedisSettings};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

pub use crate::store::STORE_REDIS;
/// How errors name the data Redis settings (`--data-redis-url`, …).
pub const DATA_REDIS: Names = Names::Flags("data-redis");

/// Declares the flags (`--PREFIX-url`, …), variables (`ENV_URL`, …) and TOML keys
/// (`PREFIX-url`, …) of one Redis's [`RedisSettings`]; the field names carry the prefix.
macro_rules! redis_args {
    ($(#[$doc:meta])* $name:ident, $env:literal, $url:ident, $cluster:ident, $sentinel:ident,
     $master:ident, $password:ident, $sentinel_tls:ident, $ca:ident, $cert:ident, $key:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, Args, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub struct $name {
            /// Redis URL (`rediss://` for TLS); with the cluster flag, one or more seed nodes
            /// separated by commas. Behind sentinels only its user name, password and
            /// database number are used.
            #[arg(long, env = concat!($env, "_URL"), hide_env_values = true)]
            pub $url: Option<SecretUrl>,
            /// Talk Redis Cluster protocol (slot routing, MOVED/ASK) to the URL's nodes.
            /// Required for a cluster: the coordinator refuses to start when this does not
            /// match what the server reports (`INFO cluster`).
            #[arg(long, env = concat!($env, "_CLUSTER"))]
            #[serde(default)]
            pub $cluster: bool,
            /// Find the master through these Redis Sentinels (`HOST:PORT`, separated by
            /// commas) instead of the URL's host; needs the sentinel master name. After a
            /// failover the coordinator finds the new master by itself.
            #[arg(long, env = concat!($env, "_SENTINEL"))]
            pub $sentinel: Option<String>,
            /// The master name the sentinels monitor (`sentinel monitor NAME …`).
            #[arg(long, env = concat!($env, "_SENTINEL_MASTER"))]
            pub $master: Option<String>,
            /// Password of the sentinels (`requirepass` in sentinel.conf), if any.
            #[arg(long, env = concat!($env, "_SENTINEL_PASSWORD"), hide_env_values = true)]
            pub $password: Option<SecretString>,
            /// Connect to the sentinels over TLS, and to the master too (verified as with
            /// `rediss://`: the TLS CA, else the system's roots).
            #[arg(long, env = concat!($env, "_SENTINEL_TLS"))]
            #[serde(default)]
            pub $sentinel_tls: bool,
            /// CA certificate file (PEM) to verify the server against when the URL is
            /// `rediss://` [default: the system's roots]. (`rediss://…/#insecure` skips the
            /// check: for tests only.)
            #[arg(long, env = concat!($env, "_TLS_CA"))]
            pub $ca: Option<PathBuf>,
            /// Client certificate file (PEM) for mutual TLS (`tls-auth-clients yes`); needs
            /// the TLS key.
            #[arg(long, env = concat!($env, "_TLS_CERT"))]
            pub $cert: Option<PathBuf>,
            /// Private key file (PEM) of the client certificate.
            #[arg(long, env = concat!($env, "_TLS_KEY"))]
            pub $key: Option<PathBuf>,
        }

        impl From<$name> for RedisSettings {
            fn from(a: $name) -> Self {
                RedisSettings {
                    url: a.$url,
                    cluster: a.$cluster,
                    sentinel: a.$sentinel,
                    sentinel_master: a.$master,
                    sentinel_password: a.$password,
                    sentinel_tls: a.$sentinel_tls,
                    tls_ca: a.$ca,
                    tls_cert: a.$cert,
                    tls_key: a.$key,
                }
            }
        }
    };
}

redis_args!(
    /// The metadata store's Redis for `--store redis` [default URL: redis://127.0.0.1:6379].
    StoreRedisArgs, "RSC_REDIS", redis_url, redis_cluster, redis_sentinel, redis_sentinel_master,
    redis_sentinel_password, redis_sentinel_tls, redis_tls_ca, redis_tls_cert, redis_tls_key
);
redis_args!(
    /// The data Redis.
    DataRedisArgs, "RSC_DATA_REDIS", data_redis_url, data_redis_cluster, data_redis_sentinel,
    data_redis_sentinel_master, data_redis_sentinel_password, data_redis_sentinel_tls,
    data_redis_tls_ca, data_redis_tls_cert, data_redis_tls_key
);

/// `serve` flags. Every flag is optional here so that a `--config` file can fill it.
/// (`Debug` hides passwords: the Redis URLs' and the sentinels', PROTOCOL §12.)
#[derive(Clone, Debug, Default, Args, Deserialize)]
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
    /// The metadata store's Redis (`--redis-*`, `RSC_REDIS_*`).
    #[command(flatten)]
    #[serde(flatten)]
    pub redis: StoreRedisArgs,
    /// Redis store: after each group document commit, wait (`WAIT N 250`) until this many
    /// replicas have it, and refuse the commit (503 STORE_UNAVAILABLE, counted in
    /// `rsc_store_commits_refused_total`) when fewer did: a master that lost its replicas to
    /// a newer master cannot acknowledge group changes (RUNBOOK "Redis Sentinel") [default:
    /// 0, no wait].
    #[arg(long, env = "RSC_STORE_WAIT_REPLICAS")]
    pub store_wait_replicas: Option<u32>,
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
    /// The data Redis (`--data-redis-*`, `RSC_DATA_REDIS_*`), where the shard streams live:
    /// owner tokens of strict fencing are written there, lag and pending entries per shard
    /// are read from it (`XINFO GROUPS`) and retired shard keys are deleted from it. Unset:
    /// nothing is queried.
    #[command(flatten)]
    #[serde(flatten)]
    pub data_redis: DataRedisArgs,
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
    /// How many records of each group's and stream's metadata history are kept (PROTOCOL
    /// §22), 1..=100000 [default: 1000].
    #[arg(long, env = "RSC_HISTORY_MAX_REVISIONS")]
    pub history_max_revisions: Option<usize>,
    /// How long records of the metadata history are kept (PROTOCOL §22): `30s`, `15m`, `1h`,
    /// `7d` or milliseconds, 1m..=365d [default: 7d].
    #[arg(long, env = "RSC_HISTORY_MAX_AGE")]
    pub history_max_age: Option<String>,
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
    /// Most wake-up channels one principal (ACL entry or JWT subject) holds open at once;
    /// one more is refused with 429 RATE_LIMITED. Not applied without an ACL (every request
    /// is then `anonymous`) [default: 1000].
    #[arg(long, env = "RSC_WAKE_MAX_CHANNELS_PER_PRINCIPAL")]
    pub wake_max_channels_per_principal: Option<usize>,
    /// A wake-up channel that carried no wake-up for this long is closed (the client reopens
    /// it), in ms [default: 300000].
    #[arg(long, env = "RSC_WAKE_IDLE_TIMEOUT_MS")]
    pub wake_idle_timeout_ms: Option<u64>,
    /// A request's head (request line and headers) must arrive within this many ms of its
    /// first byte, or the connection is closed (`rsc_http_header_timeouts_total`; PROTOCOL
    /// §4.4) [default: 10000].
    #[arg(long, env = "RSC_HEADER_READ_TIMEOUT_MS")]
    pub header_read_timeout_ms: Option<u64>,
    /// A request's body must arrive within this many ms of its head, or the request is
    /// refused (`rsc_http_body_timeouts_total`) [default: 30000].
    #[arg(long, env = "RSC_BODY_READ_TIMEOUT_MS")]
    pub body_read_timeout_ms: Option<u64>,
    /// A connection with no request in flight for this long is closed
    /// (`rsc_http_idle_closed_total`); a request being answered, such as an open wake-up
    /// channel, keeps its connection [default: 120000].
    #[arg(long, env = "RSC_IDLE_TIMEOUT_MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Most open client connections: one more is answered `429 RATE_LIMITED` (plain HTTP)
    /// or closed (HTTPS) at once (`rsc_http_connections_refused_total`) [default:
    /// --wake-max-channels + 4096].
    #[arg(long, env = "RSC_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most open connections from one client address (IPv6: one /64) [default: 3/4 of
    /// --max-connections].
    #[arg(long, env = "RSC_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<usize>,
    /// Most bytes of a request head: HTTP/1 request line and headers (`431` beyond),
    /// HTTP/2 header list [default: 16384].
    #[arg(long, env = "RSC_MAX_HEADER_BYTES")]
    pub max_header_bytes: Option<usize>,
    /// HTTP/2: most concurrent streams (requests) per connection [default: 200].
    #[arg(long, env = "RSC_HTTP2_MAX_CONCURRENT_STREAMS")]
    pub http2_max_concurrent_streams: Option<u32>,
    /// HTTP/2: most streams a client may reset before the server has accepted them (the
    /// "rapid reset" flood) before the connection is ended with `GOAWAY ENHANCE_YOUR_CALM`
    /// [default: 20].
    #[arg(long, env = "RSC_HTTP2_MAX_PENDING_RESET_STREAMS")]
    pub http2_max_pending_reset_streams: Option<usize>,
    /// HTTP/2: most streams the server may reset for a client's protocol errors before the
    /// connection is ended with `GOAWAY ENHANCE_YOUR_CALM` [default: 1024].
    #[arg(long, env = "RSC_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS")]
    pub http2_max_local_error_reset_streams: Option<usize>,
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
    /// connection: mutual TLS. ACL entries may then name a certificate by its subject
    /// (`cert_subject`), a SAN URI (`cert_san_uri`) or a SAN DNS name (`cert_san_dns`,
    /// PROTOCOL §8). Re-read when it changes and on SIGHUP (PROTOCOL §20). Needs
    /// `--tls-cert`.
    #[arg(long, env = "RSC_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Certificate revocation lists (PEM) of the `--tls-client-ca` CAs: a revoked client
    /// certificate is refused in the handshake; so is one whose issuer has no CRL in the
    /// file. Re-read when it changes and on SIGHUP (PROTOCOL §20). Needs `--tls-client-ca`
    /// [default: none, no revocation check].
    #[arg(long, env = "RSC_TLS_CLIENT_CRL")]
    pub tls_client_crl: Option<PathBuf>,
}

/// Fully resolved serve settings.
/// (`Debug` hides the Redis URLs' and the sentinels' passwords.)
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Store kind.
    pub store: StoreKind,
    /// ACL file.
    pub acl: Option<PathBuf>,
    /// The metadata store's Redis (checked; the URL defaults to `redis://127.0.0.1:6379`).
    pub redis: RedisSettings,
    /// Replicas that must acknowledge a group document commit (0: none).
    pub store_wait_replicas: u32,
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
    /// The data Redis (checked); `None` without one.
    pub data_redis: Option<RedisSettings>,
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
    /// Retention of the metadata history.
    pub revisions: crate::store::RevisionRetention,
    /// Restore documents the store lost from the recovery copy by itself, or not.
    pub store_recovery: crate::recovery::RecoveryMode,
    /// Body limit.
    pub body_limit: usize,
    /// Most open wake-up channels (0: the route is off).
    pub wake_max_channels: usize,
    /// Most open wake-up channels per principal (with an ACL).
    pub wake_max_channels_per_principal: usize,
    /// Idle timeout of a wake-up channel.
    pub wake_idle_timeout_ms: u64,
    /// Connection limits and timeouts of the HTTP server.
    pub http: HttpLimits,
    /// Log format.
    pub log_format: LogFormat,
    /// HTTPS on the listener (certificate, key, client CA); `None`: plain HTTP.
    pub listener_tls: Option<crate::tls::ListenerTls>,
}

/// A setting: the flag's (or environment's) value, else the file's, else the default.
fn pick<T>(flag: Option<T>, file: Option<T>, default: T) -> T {
    flag.or(file).unwrap_or(default)
}

/// The access layer's settings, resolved ([`ServeArgs::access`]).
struct AccessSettings {
    trusted_proxies: Option<String>,
    client_rate: u32,
    client_burst: u32,
    client_refusal_rate: u32,
    client_refusal_burst: u32,
    audit_refusal_interval_ms: u64,
}

/// The wake-up channel settings, resolved ([`ServeArgs::wake`]).
struct WakeSettings {
    max_channels: usize,
    max_channels_per_principal: usize,
    idle_timeout_ms: u64,
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
    #[error("config file {path} is invalid: {reason}")]
    Parse {
        /// File.
        path: PathBuf,
        /// Where and what (`toml_error`: the line itself is not quoted).
        reason: String,
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
                toml::from_str::<ServeArgs>(&text).map_err(|e| ConfigError::Parse {
                    path: path.clone(),
                    reason: toml_error(&text, &e),
                })?
            }
            None => ServeArgs::default(),
        })
    }

    /// The wake-up channel settings (PROTOCOL §13), these over `file`'s over the defaults.
    fn wake(&self, file: &ServeArgs) -> WakeSettings {
        WakeSettings {
            max_channels: self
                .wake_max_channels
                .or(file.wake_max_channels)
                .unwrap_or(20_000),
            max_channels_per_principal: self
                .wake_max_channels_per_principal
                .or(file.wake_max_channels_per_principal)
                .unwrap_or(crate::wake::DEFAULT_MAX_CHANNELS_PER_PRINCIPAL),
            idle_timeout_ms: self
                .wake_idle_timeout_ms
                .or(file.wake_idle_timeout_ms)
                .unwrap_or(300_000),
        }
    }

    /// The per-address limits, trusted proxies and refusal interval (PROTOCOL §7), taken from
    /// these settings over `file`'s over the defaults.
    fn access(&mut self, file: &mut ServeArgs) -> AccessSettings {
        let client_rate = self.client_rate.or(file.client_rate).unwrap_or(0);
        AccessSettings {
            trusted_proxies: (self.trusted_proxies.take())
                .or(file.trusted_proxies.take())
                .filter(|s| !s.trim().is_empty()),
            client_rate,
            client_burst: (self.client_burst.or(file.client_burst))
                .unwrap_or(client_rate.saturating_mul(2)),
            client_refusal_rate: (self.client_refusal_rate.or(file.client_refusal_rate))
                .unwrap_or(20),
            client_refusal_burst: (self.client_refusal_burst.or(file.client_refusal_burst))
                .unwrap_or(200),
            audit_refusal_interval_ms: (self.audit_refusal_interval_ms)
                .or(file.audit_refusal_interval_ms)
                .unwrap_or(10_000),
        }
    }

    /// These settings over `file`'s over the defaults (checking the sentinel settings).
    /// The metadata history's retention (PROTOCOL §22): flags over the file over defaults.
    fn revision_retention(
        &mut self,
        file: &mut ServeArgs,
    ) -> Result<crate::store::RevisionRetention, ConfigError> {
        let defaults = crate::store::RevisionRetention::default();
        let age = self.history_max_age.take().or(file.history_max_age.take());
        Ok(crate::store::RevisionRetention {
            max_revisions: pick(
                self.history_max_revisions,
                file.history_max_revisions,
                defaults.max_revisions,
            ),
            max_age_ms: match age {
                Some(text) => crate::cli::parse_ms(&text)
                    .map_err(|e| ConfigError::Invalid(format!("history-max-age: {e}")))?,
                None => defaults.max_age_ms,
            },
        })
    }

    fn merge(mut self, mut file: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let wake = self.wake(&file);
        let revisions = self.revision_retention(&mut file)?;
        let access = self.access(&mut file);
        // The connection caps' defaults follow the wake-up channel limit (`wake` has it too).
        let (_, http) = HttpLimits::merge(&self, &file);
        let mut redis = RedisSettings::from(self.redis).or(file.redis.into());
        redis.url = redis.url.or_else(|| Some("redis://127.0.0.1:6379".into()));
        let data_redis = RedisSettings::from(self.data_redis).or(file.data_redis.into());
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
            redis,
            key_prefix: self
                .key_prefix
                .or(file.key_prefix)
                .unwrap_or_else(|| "rsc".into()),
            allow_anonymous: self.allow_anonymous || file.allow_anonymous,
            admin_rate: self.admin_rate.or(file.admin_rate).unwrap_or(10),
            admin_burst: self.admin_burst.or(file.admin_burst).unwrap_or(20),
            trusted_proxies: access.trusted_proxies,
            client_rate: access.client_rate,
            client_burst: access.client_burst,
            client_refusal_rate: access.client_refusal_rate,
            client_refusal_burst: access.client_refusal_burst,
            audit_refusal_interval_ms: access.audit_refusal_interval_ms,
            // Any data Redis setting enables it (`validate` refuses one alone that names none).
            data_redis: (!data_redis.is_empty()).then_some(data_redis),
            rollback_window_ms,
            retired_key_delay_ms: (self.retired_key_delay_ms.or(file.retired_key_delay_ms))
                .unwrap_or(rollback_window_ms),
            sweep_interval_ms: pick(self.sweep_interval_ms, file.sweep_interval_ms, 250),
            history_interval_ms: self
                .history_interval_ms
                .or(file.history_interval_ms)
                .unwrap_or(crate::metrics::DEFAULT_HISTORY_INTERVAL.as_millis() as u64),
            tombstone_retention_ms: self
                .tombstone_retention_ms
                .or(file.tombstone_retention_ms)
                .unwrap_or(crate::store::TOMBSTONE_RETENTION.as_millis() as u64),
            revisions,
            store_recovery: pick(self.store_recovery, file.store_recovery, Default::default()),
            store_wait_replicas: pick(self.store_wait_replicas, file.store_wait_replicas, 0),
            body_limit: pick(self.body_limit, file.body_limit, DEFAULT_BODY_LIMIT),
            wake_max_channels: wake.max_channels,
            wake_max_channels_per_principal: wake.max_channels_per_principal,
            wake_idle_timeout_ms: wake.idle_timeout_ms,
            http,
            log_format: self.log_format.or(file.log_format).unwrap_or_default(),
            listener_tls: listener_tls(
                self.tls_cert.or(file.tls_cert),
                self.tls_key.or(file.tls_key),
                self.tls_client_ca.or(file.tls_client_ca),
                self.tls_client_crl.or(file.tls_client_crl),
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
        validate_retention(self.tombstone_retention_ms, &self.revisions)?;
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
        if self.wake_max_channels_per_principal == 0 {
            return Err(ConfigError::Invalid(
                "wake-max-channels-per-principal must be at least 1 (--wake-max-channels 0 \
                 turns the wake-up channels off)"
                    .into(),
            ));
        }
        if self.body_limit < 1024 {
            return Err(ConfigError::Invalid(
                "body-limit must be at least 1024".into(),
            ));
        }
        self.http.validate()
    }

    /// Checks the metadata and data Redis settings (URLs, cluster and sentinel together,
    /// TLS files loaded: a file that cannot be used is an error here, at startup).
    fn validate_redis(&self) -> Result<(), ConfigError> {
        let data = self.data_redis.as_ref().map(|d| d.check(DATA_REDIS));
        (self.redis.check(STORE_REDIS).and(data.unwrap_or(Ok(()))))
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }
}

/// The HTTP server's connection limits and timeouts (PROTOCOL §4.4), resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Time from a request's first byte to the end of its head.
    pub header_read_timeout: Duration,
    /// Time from a request's head to the end of its body.
    pub body_read_timeout: Duration,
    /// Time a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
    /// Most open connections from one client address (IPv6: one /64).
    pub max_connections_per_ip: usize,
    /// Most bytes of a request head (HTTP/1) or header list (HTTP/2).
    pub max_header_bytes: usize,
    /// HTTP/2: most concurrent streams per connection.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: most streams reset by the client before they were accepted.
    pub http2_max_pending_reset_streams: usize,
    /// HTTP/2: most streams reset by the server for the client's protocol errors.
    pub http2_max_local_error_reset_streams: usize,
}

impl HttpLimits {
    /// Connections kept beyond the wake-up channel limit by default: heartbeat clients,
    /// operators, scrapers.
    pub const CONNECTION_MARGIN: usize = 4096;

    /// The defaults for a coordinator that holds at most `wake_max_channels` wake-up
    /// channels (each one a connection).
    pub fn defaults(wake_max_channels: usize) -> Self {
        let max_connections = wake_max_channels.saturating_add(Self::CONNECTION_MARGIN);
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections,
            max_connections_per_ip: max_connections / 4 * 3,
            max_header_bytes: 16 * 1024,
            http2_max_concurrent_streams: 200,
            http2_max_pending_reset_streams: 20,
            http2_max_local_error_reset_streams: 1024,
        }
    }

    /// The wake-up channel limit, and the limits (whose default connection cap follows
    /// it): `args` over `file` over the defaults.
    fn merge(args: &ServeArgs, file: &ServeArgs) -> (usize, Self) {
        let wake_max_channels = (args.wake_max_channels)
            .or(file.wake_max_channels)
            .unwrap_or(20_000);
        let d = Self::defaults(wake_max_channels);
        let ms =
            |a: Option<u64>, f: Option<u64>, d: Duration| a.or(f).map_or(d, Duration::from_millis);
        let max_connections = args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(d.max_connections);
        let limits = HttpLimits {
            header_read_timeout: ms(
                args.header_read_timeout_ms,
                file.header_read_timeout_ms,
                d.header_read_timeout,
            ),
            body_read_timeout: ms(
                args.body_read_timeout_ms,
                file.body_read_timeout_ms,
                d.body_read_timeout,
            ),
            idle_timeout: ms(args.idle_timeout_ms, file.idle_timeout_ms, d.idle_timeout),
            max_connections,
            max_connections_per_ip: (args.max_connections_per_ip)
                .or(file.max_connections_per_ip)
                .unwrap_or((max_connections / 4 * 3).max(1)),
            max_header_bytes: (args.max_header_bytes)
                .or(file.max_header_bytes)
                .unwrap_or(d.max_header_bytes),
            http2_max_concurrent_streams: (args.http2_max_concurrent_streams)
                .or(file.http2_max_concurrent_streams)
                .unwrap_or(d.http2_max_concurrent_streams),
            http2_max_pending_reset_streams: (args.http2_max_pending_reset_streams)
                .or(file.http2_max_pending_reset_streams)
                .unwrap_or(d.http2_max_pending_reset_streams),
            http2_max_local_error_reset_streams: (args.http2_max_local_error_reset_streams)
                .or(file.http2_max_local_error_reset_streams)
                .unwrap_or(d.http2_max_local_error_reset_streams),
        };
        (wake_max_channels, limits)
    }

    /// Checks the ranges, and that the per-address cap is within the global one.
    fn validate(&self) -> Result<(), ConfigError> {
        let ms = |name: &str, d: Duration, max: u64| {
            let v = d.as_millis() as u64;
            if (100..=max).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::Invalid(format!(
                    "{name} is {v}; it must be within 100..={max}"
                )))
            }
        };
        ms("header-read-timeout-ms", self.header_read_timeout, 600_000)?;
        ms("body-read-timeout-ms", self.body_read_timeout, 600_000)?;
        ms("idle-timeout-ms", self.idle_timeout, 24 * 3_600_000)?;
        let within = |name: &str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::Invalid(format!(
                    "{name} is {v}; it must be within {lo}..={hi}"
                )))
            }
        };
        within("max-connections", self.max_connections, 1, 10_000_000)?;
        within(
            "max-connections-per-ip",
            self.max_connections_per_ip,
            1,
            self.max_connections,
        )
        .map_err(|e| ConfigError::Invalid(format!("{e} (max-connections)")))?;
        within("max-header-bytes", self.max_header_bytes, 1024, 256 * 1024)?;
        within(
            "http2-max-concurrent-streams",
            self.http2_max_concurrent_streams as usize,
            1,
            10_000,
        )?;
        within(
            "http2-max-pending-reset-streams",
            self.http2_max_pending_reset_streams,
            1,
            10_000,
        )?;
        within(
            "http2-max-local-error-reset-streams",
            self.http2_max_local_error_reset_streams,
            1,
            100_000,
        )
    }
}

/// The listener's TLS files: a certificate and its key together, a client CA only with
/// them, a client CRL only with a client CA. (The files are read when the server starts,
/// which names a file it cannot use.)
fn listener_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    client_crl: Option<PathBuf>,
) -> Result<Option<crate::tls::ListenerTls>, ConfigError> {
    if client_crl.is_some() && client_ca.is_none() {
        return Err(ConfigError::Invalid(
            "--tls-client-crl needs --tls-client-ca: the CRL revokes client certificates of \
             those CAs"
                .into(),
        ));
    }
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(crate::tls::ListenerTls {
            cert,
            key,
            client_ca,
            client_crl,
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

/// A TOML file's parse error for a message: where (line and column) and what, without the
/// line itself, which `toml`'s own message quotes and which may hold a password or a token
/// (PROTOCOL §12). An unknown key is found by name: serde reports it after reading the whole
/// table (the Redis settings are flattened into it), without its place.
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let unknown = (e.message().strip_prefix("unknown field `"))
        .and_then(|m| m.split('`').next())
        .and_then(|key| {
            let line = text.lines().position(|l| {
                l.trim_start()
                    .strip_prefix(key)
                    .is_some_and(|r| r.trim_start().starts_with('='))
            })?;
            let column = text.lines().nth(line)?.find(key)?;
            let start = text.lines().take(line).map(|l| l.len() + 1).sum::<usize>() + column;
            Some(start..start)
        });
    match unknown.or(e.span()) {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {}", e.message().trim_end())
        }
        None => e.message().trim_end().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn listener_tls_needs_a_certificate_and_its_key() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(listener_tls(None, None, None, None).unwrap(), None);
        let t = listener_tls(p("c.pem"), p("k.pem"), p("ca.pem"), p("crl.pem"))
            .unwrap()
            .unwrap();
        assert_eq!(t.client_ca, p("ca.pem"));
        assert_eq!(t.client_crl, p("crl.pem"));
        for (c, k, ca, crl, want) in [
            (p("c"), None, None, None, "go together"),
            (None, p("k"), None, None, "go together"),
            (None, None, p("ca"), None, "needs --tls-cert"),
            (p("c"), p("k"), None, p("crl"), "needs --tls-client-ca"),
        ] {
            let e = listener_tls(c, k, ca, crl).unwrap_err().to_string();
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
        let data = cfg.data_redis.unwrap();
        assert_eq!(data.urls(), ["redis://127.0.0.1:6390"]);
        assert!(!data.cluster);
        assert!(
            !cfg.listen.ip().is_loopback(),
            "with an ACL any address may be bound"
        );
        let _ = std::fs::remove_file(&f.0);

        let d = ServeArgs::default().resolve().unwrap();
        assert_eq!((d.admin_rate, d.admin_burst, d.acl), (10, 20, None));
        assert!(d.data_redis.is_none());
        assert_eq!(d.retired_key_delay_ms, d.rollback_window_ms);
    }

    #[test]
    fn client_limits_and_trusted_proxies_from_a_toml_file_flag_and_default() {
        let mut f = tempfile_in_target();
        writeln!(
            f.1,
            "client-refusal-rate = 7\nclient-rate = 50\ntrusted-proxies = \"10.0.0.0/8\""
        )
        .unwrap();
        let from_file = ServeArgs {
            config: Some(f.0.clone()),
            ..ServeArgs::default()
        };
        let c = from_file.clone().resolve().unwrap();
        assert_eq!(
            (c.client_refusal_rate, c.client_rate, c.client_burst),
            (7, 50, 100),
            "the burst defaults to twice the rate"
        );
        assert_eq!(c.trusted_proxies.as_deref(), Some("10.0.0.0/8"));
        let flag = ServeArgs {
            client_refusal_rate: Some(9),
            trusted_proxies: Some("127.0.0.1, ::1".into()),
            ..from_file
        };
        let c = flag.resolve().unwrap();
        assert_eq!(c.client_refusal_rate, 9);
        assert_eq!(c.trusted_proxies.as_deref(), Some("127.0.0.1, ::1"));
        let _ = std::fs::remove_file(&f.0);
        let d = ServeArgs::default().resolve().unwrap();
        assert_eq!(
            (
                d.client_rate,
                d.client_refusal_rate,
                d.client_refusal_burst,
                d.audit_refusal_interval_ms,
                d.trusted_proxies
            ),
            (0, 20, 200, 10_000, None)
        );
        for bad in [
            ServeArgs {
                trusted_proxies: Some("10.0.0.0/8,not-an-address".into()),
                ..ServeArgs::default()
            },
            ServeArgs {
                audit_refusal_interval_ms: Some(10),
                ..ServeArgs::default()
            },
            ServeArgs {
                client_refusal_rate: Some(5),
                client_refusal_burst: Some(0),
                ..ServeArgs::default()
            },
        ] {
            assert!(bad.resolve().is_err());
        }
    }

    #[test]
    fn wake_channels_per_principal_from_a_toml_file_flag_and_default() {
        let mut f = tempfile_in_target();
        writeln!(f.1, "wake-max-channels-per-principal = 7").unwrap();
        let from_file = ServeArgs {
            config: Some(f.0.clone()),
            ..ServeArgs::default()
        };
        assert_eq!(
            from_file
                .clone()
                .resolve()
                .unwrap()
                .wake_max_channels_per_principal,
            7
        );
        let flag = ServeArgs {
            wake_max_channels_per_principal: Some(9),
            ..from_file
        };
        assert_eq!(flag.resolve().unwrap().wake_max_channels_per_principal, 9);
        let _ = std::fs::remove_file(&f.0);
        let d = ServeArgs::default().resolve().unwrap();
        assert_eq!(d.wake_max_channels_per_principal, 1000);
        let zero = ServeArgs {
            wake_max_channels_per_principal: Some(0),
            ..ServeArgs::default()
        };
        let e = zero.resolve().unwrap_err().to_string();
        assert!(
            e.contains("wake-max-channels-per-principal must be at least 1"),
            "{e}"
        );
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
            redis: StoreRedisArgs {
                redis_sentinel: Some("127.0.0.1:26379, 127.0.0.1:26380".into()),
                redis_sentinel_master: Some("rsc".into()),
                ..Default::default()
            },
            data_redis: DataRedisArgs {
                data_redis_sentinel: Some("127.0.0.1:26381".into()),
                data_redis_sentinel_master: Some("data".into()),
                ..Default::default()
            },
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        let s = cfg.redis.sentinel_target(STORE_REDIS).unwrap().unwrap();
        assert_eq!((s.sentinels.len(), s.master_name.as_str()), (2, "rsc"));
        let data = cfg
            .data_redis
            .expect("a data Redis behind sentinels is enabled without a URL");
        assert_eq!(
            data.sentinel_target(DATA_REDIS)
                .unwrap()
                .unwrap()
                .master_name,
            "data"
        );
        let no_master = ServeArgs {
            redis: StoreRedisArgs {
                redis_sentinel: Some("127.0.0.1:26379".into()),
                ..Default::default()
            },
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
            redis: StoreRedisArgs {
                redis_sentinel: Some("nohost".into()),
                redis_sentinel_master: Some("m".into()),
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        assert!(bad.resolve().is_err());
        let both = ServeArgs {
            redis: StoreRedisArgs {
                redis_sentinel: Some("127.0.0.1:26379".into()),
                redis_sentinel_master: Some("m".into()),
                redis_cluster: true,
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        assert!(both.resolve().is_err());
    }

    #[test]
    fn tls_files_are_loaded_at_startup_and_named_in_errors() {
        let none = ServeArgs::default().resolve().unwrap();
        assert!(!none.redis.tls(STORE_REDIS).unwrap().is_set() && none.data_redis.is_none());
        let missing = ServeArgs {
            data_redis: DataRedisArgs {
                data_redis_tls_ca: Some("/nonexistent/ca.pem".into()),
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        let e = missing.resolve().unwrap_err().to_string();
        assert!(
            e.contains("--data-redis-tls-ca") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let half = ServeArgs {
            redis: StoreRedisArgs {
                redis_tls_cert: Some("/etc/rsc/client.pem".into()),
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        let e = half.resolve().unwrap_err().to_string();
        assert!(e.contains("needs its private key"), "{e}");
        let tls_alone = ServeArgs {
            redis: StoreRedisArgs {
                redis_sentinel_tls: true,
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        let e = tls_alone.resolve().unwrap_err().to_string();
        assert!(
            e.contains("--redis-sentinel-tls need --redis-sentinel"),
            "{e}"
        );
        let behind = ServeArgs {
            redis: StoreRedisArgs {
                redis_sentinel: Some("127.0.0.1:26379".into()),
                redis_sentinel_master: Some("m".into()),
                redis_sentinel_tls: true,
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        let target = behind.resolve().unwrap().redis.sentinel_target(STORE_REDIS);
        assert!(target.unwrap().unwrap().tls);
    }

    #[test]
    fn connection_limits_follow_the_wake_channel_limit_and_are_checked() {
        let d = ServeArgs::default().resolve().unwrap().http;
        assert_eq!(d, HttpLimits::defaults(20_000));
        assert_eq!(
            (d.max_connections, d.max_connections_per_ip),
            (24_096, 18_072)
        );
        assert_eq!(
            (d.header_read_timeout, d.idle_timeout),
            (Duration::from_secs(10), Duration::from_secs(120))
        );
        let few = ServeArgs {
            wake_max_channels: Some(100),
            ..ServeArgs::default()
        };
        let few = few.resolve().unwrap().http;
        assert_eq!(
            (few.max_connections, few.max_connections_per_ip),
            (4_196, 3_147)
        );

        let mut f = tempfile_in_target();
        writeln!(
            f.1,
            "header-read-timeout-ms = 500\nbody-read-timeout-ms = 900\nidle-timeout-ms = 2000\n\
             max-connections = 64\nmax-connections-per-ip = 8\nmax-header-bytes = 4096\n\
             http2-max-concurrent-streams = 16\nhttp2-max-pending-reset-streams = 5\n\
             http2-max-local-error-reset-streams = 50"
        )
        .unwrap();
        let from_file = ServeArgs {
            config: Some(f.0.clone()),
            max_connections: Some(32),
            ..ServeArgs::default()
        };
        let h = from_file.resolve().unwrap().http;
        let _ = std::fs::remove_file(&f.0);
        assert_eq!(
            h,
            HttpLimits {
                header_read_timeout: Duration::from_millis(500),
                body_read_timeout: Duration::from_millis(900),
                idle_timeout: Duration::from_millis(2000),
                max_connections: 32,
                max_connections_per_ip: 8,
                max_header_bytes: 4096,
                http2_max_concurrent_streams: 16,
                http2_max_pending_reset_streams: 5,
                http2_max_local_error_reset_streams: 50,
            },
            "the flag over the file"
        );

        for (args, want) in [
            (
                ServeArgs {
                    max_connections: Some(10),
                    max_connections_per_ip: Some(11),
                    ..ServeArgs::default()
                },
                "max-connections-per-ip is 11",
            ),
            (
                ServeArgs {
                    max_connections: Some(0),
                    ..ServeArgs::default()
                },
                "max-connections is 0",
            ),
            (
                ServeArgs {
                    header_read_timeout_ms: Some(0),
                    ..ServeArgs::default()
                },
                "header-read-timeout-ms is 0",
            ),
            (
                ServeArgs {
                    max_header_bytes: Some(100),
                    ..ServeArgs::default()
                },
                "max-header-bytes is 100",
            ),
            (
                ServeArgs {
                    http2_max_pending_reset_streams: Some(0),
                    ..ServeArgs::default()
                },
                "http2-max-pending-reset-streams is 0",
            ),
        ] {
            let e = args.resolve().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
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
            redis: StoreRedisArgs {
                redis_url: Some("redis://app:pw-store@r:6379".into()),
                redis_sentinel_password: Some("pw-sentinel".into()),
                ..Default::default()
            },
            data_redis: DataRedisArgs {
                data_redis_url: Some("redis://:pw-data@d:6379".into()),
                data_redis_sentinel_password: Some("pw-data-sentinel".into()),
                ..Default::default()
            },
            ..ServeArgs::default()
        };
        let shown = format!("{args:?}");
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(shown.contains("redis://app:<redacted>@r:6379"), "{shown}");
        let cfg = ServeArgs {
            redis: StoreRedisArgs {
                redis_sentinel: Some("127.0.0.1:26379".into()),
                redis_sentinel_master: Some("m".into()),
                ..Default::default()
            },
            data_redis: DataRedisArgs {
                data_redis_url: Some("redis://:pw-data@d1:1, redis://:pw-data@d2:2".into()),
                data_redis_cluster: true,
                data_redis_sentinel_password: None,
                ..Default::default()
            },
            ..args
        }
        .resolve()
        .unwrap();
        let shown = format!("{cfg:?}{cfg:#?}");
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(shown.contains("redis://<redacted>@d2:2"), "{shown}");
    }

    #[test]
    fn a_config_file_error_names_the_line_without_quoting_it() {
        let text = "listen = \"127.0.0.1:7070\"\nredis-sentinel-pasword = \"pw-typo\"\n";
        let e = toml::from_str::<ServeArgs>(text).unwrap_err();
        let reason = toml_error(text, &e);
        assert!(
            reason.starts_with("line 2, column 1: unknown field"),
            "{reason}"
        );
        assert!(!reason.contains("pw-typo"), "{reason}");
    }
}

/// The retention bounds of deleted groups' tombstones and of the metadata history
/// (PROTOCOL §22).
fn validate_retention(
    tombstone_ms: u64,
    r: &crate::store::RevisionRetention,
) -> Result<(), ConfigError> {
    if !(100..=30 * 24 * 3_600_000).contains(&tombstone_ms) {
        return Err(ConfigError::Invalid(format!(
            "tombstone-retention-ms is {tombstone_ms}; it must be within 100..=2592000000 (30 days)"
        )));
    }
    if !(1..=100_000).contains(&r.max_revisions) {
        return Err(ConfigError::Invalid(format!(
            "history-max-revisions is {}; it must be within 1..=100000",
            r.max_revisions
        )));
    }
    if !(60_000..=365 * 86_400_000).contains(&r.max_age_ms) {
        return Err(ConfigError::Invalid(format!(
            "history-max-age is {} ms; it must be within 1m..=365d",
            r.max_age_ms
        )));
    }
    Ok(())
}
