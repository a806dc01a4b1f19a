//! Where the client finds the coordinator and Redis, and who it is: from the environment or
//! set by hand.

use crate::error::{ClientError, ConfigError};
use rsc_api::CoordinatorClient;
use rsc_protocol::redact::{SecretString, SecretUrl};
use rsc_redis::{LazyRedis, Names, RedisSettings, SettingsError};
use std::path::PathBuf;

/// Connection settings shared by consumers and producers.
///
/// Its `Debug` output hides the token and the passwords (PROTOCOL §12): they are held in
/// [`SecretString`] and [`SecretUrl`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Coordinator base URLs (`http://host:port`), tried in order on failure.
    pub coordinator_urls: Vec<String>,
    /// The data Redis: URL (default `redis://127.0.0.1:6379`; with cluster mode, seed nodes
    /// separated by commas), Redis Cluster, Redis Sentinel (the URL's user name, password and
    /// database number then apply to the master; after a failover, or when a connection
    /// answers `READONLY`, the client asks the sentinels again) and TLS files. Read from
    /// `RSC_REDIS_URL`, `RSC_REDIS_CLUSTER`, `RSC_REDIS_SENTINEL`, … ([`Self::from_env`]).
    pub redis: RedisSettings,
    /// Bearer token for the coordinator.
    pub token: Option<SecretString>,
    /// File holding the bearer token, read again whenever it changes (a Kubernetes
    /// projected service-account token); takes the place of [`Self::token`].
    pub token_file: Option<PathBuf>,
    /// For `https://` coordinator URLs: a CA certificate (PEM) trusted besides the system's
    /// roots, and a client certificate and key (PEM) for mutual TLS.
    pub coordinator_tls: rsc_api::ClientTls,
    /// This process's identity in member ids (`<instance>-<listener>-<index>`): the pod IP,
    /// else the pod name; with [`Self::static_membership`], the pod name first.
    pub instance_id: Option<String>,
    /// Static membership: the instance id is stable across restarts (e.g. a StatefulSet's
    /// pod name), so a graceful shutdown leaves with epoch -2 and the member's shards wait
    /// for it (unread) until it is back under the same id — no rebalance on a rolling
    /// restart — or until its session times out. A second live process with the same id is
    /// refused (`MEMBER_ID_IN_USE`).
    pub static_membership: bool,
    /// The host (pod) name, reported to operators.
    pub host: Option<String>,
    /// How long a graceful shutdown may take (finish in-flight handlers, acknowledge, leave)
    /// before the remaining members are stopped where they are; their shards then move after
    /// the session timeout, and unacknowledged entries are handled again. Keep it below the
    /// pod's termination grace period.
    pub shutdown_timeout: std::time::Duration,
    /// Whether a consumer app running more than one member sends their heartbeats together,
    /// batched on `POST /v1/heartbeats` (default on; falls back to the single-member route
    /// on a coordinator without it). Off: one request per member heartbeat.
    pub heartbeat_batching: bool,
    /// Whether a consumer app opens a wake-up channel (`POST /v1/wakeups`, one per process)
    /// so that its members heartbeat as soon as the coordinator changes what they must do,
    /// rather than at their next interval (default on; a coordinator without the route, or
    /// a dropped channel, leaves the members on their heartbeat interval).
    pub wake_channel: bool,
    /// Whether the shard workers of a consumer app share its connection to the data Redis
    /// and wait for new entries on the app's doorbell (default on): a process then holds two
    /// connections to a standalone Redis (or the sentinels' master), two per node of a Redis
    /// Cluster, however many shards it owns (with strict fencing two more, its guard
    /// connections), and an idle shard costs Redis no command. Off: each shard
    /// worker has its own connection and waits in a blocked `XREADGROUP`. ARCHITECTURE
    /// "Data plane".
    pub shared_reader: bool,
    /// How long a consumer app's data Redis may stay unreachable before its members give
    /// their shards back (they leave the group, so that members that can read take them at
    /// once) and join again when it answers (default 15 s: longer than a Sentinel failover
    /// with the RUNBOOK's settings, so a failover moves no shard). Members never join while
    /// the data Redis does not answer. GUIDE "When the data Redis is unreachable".
    pub data_redis_grace: std::time::Duration,
}

/// The default of [`ClientConfig::data_redis_grace`].
pub(crate) const DEFAULT_DATA_REDIS_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            coordinator_urls: Vec::new(),
            redis: RedisSettings {
                url: Some("redis://127.0.0.1:6379".into()),
                ..RedisSettings::default()
            },
            token: None,
            token_file: None,
            coordinator_tls: rsc_api::ClientTls::default(),
            instance_id: None,
            static_membership: false,
            host: None,
            shutdown_timeout: std::time::Duration::from_secs(25),
            heartbeat_batching: true,
            wake_channel: true,
            shared_reader: true,
            data_redis_grace: DEFAULT_DATA_REDIS_GRACE,
        }
    }
}

impl ClientConfig {
    /// Reads `RSC_COORDINATOR_URL` (comma-separated URLs), `RSC_REDIS_URL` (comma-separated
    /// seed nodes with `RSC_REDIS_CLUSTER=true`), `RSC_REDIS_SENTINEL`,
    /// `RSC_REDIS_SENTINEL_MASTER`, `RSC_REDIS_SENTINEL_PASSWORD`, `RSC_REDIS_SENTINEL_TLS`,
    /// `RSC_REDIS_TLS_CA`, `RSC_REDIS_TLS_CERT`, `RSC_REDIS_TLS_KEY`, `RSC_TOKEN`,
    /// `RSC_TOKEN_FILE`, `RSC_COORDINATOR_CA`, `RSC_COORDINATOR_CERT`, `RSC_COORDINATOR_KEY`,
    /// `RSC_HEARTBEAT_BATCHING` (`false` turns batching off), `RSC_WAKE_CHANNEL` (`false` turns
    /// the wake-up channel off), `RSC_SHARED_READER` (`false`: a connection per shard),
    /// `RSC_DATA_REDIS_GRACE_MS` ([`Self::data_redis_grace`]), and the instance id of member
    /// ids: `POD_IP`, else `POD_NAME`, else `<HOSTNAME>-<process id>` (so that two local
    /// processes never share member ids); with `RSC_STATIC_MEMBERSHIP=true` (static
    /// membership) `POD_NAME`, else `HOSTNAME`, which survive a restart.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut cfg = ClientConfig::default();
        if let Some(urls) = get("RSC_COORDINATOR_URL") {
            cfg.coordinator_urls = split_urls(&urls);
        }
        let yes = |k: &str| {
            get(k).is_some_and(|v| {
                matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes")
            })
        };
        cfg.redis = RedisSettings {
            url: get("RSC_REDIS_URL").map(SecretUrl::new),
            cluster: yes("RSC_REDIS_CLUSTER"),
            sentinel: get("RSC_REDIS_SENTINEL"),
            sentinel_master: get("RSC_REDIS_SENTINEL_MASTER"),
            sentinel_password: get("RSC_REDIS_SENTINEL_PASSWORD").map(SecretString::from),
            sentinel_tls: yes("RSC_REDIS_SENTINEL_TLS"),
            tls_ca: get("RSC_REDIS_TLS_CA").map(PathBuf::from),
            tls_cert: get("RSC_REDIS_TLS_CERT").map(PathBuf::from),
            tls_key: get("RSC_REDIS_TLS_KEY").map(PathBuf::from),
        }
        .or(cfg.redis);
        if let Some(v) = get("RSC_HEARTBEAT_BATCHING") {
            cfg.heartbeat_batching = !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "false" | "no" | "off"
            );
        }
        if let Some(v) = get("RSC_WAKE_CHANNEL") {
            cfg.wake_channel = !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "false" | "no" | "off"
            );
        }
        if let Some(v) = get("RSC_SHARED_READER") {
            cfg.shared_reader = !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "false" | "no" | "off"
            );
        }
        if let Some(ms) = get(GRACE_ENV).and_then(|v| v.trim().parse().ok()) {
            cfg.data_redis_grace = std::time::Duration::from_millis(ms);
        }
        cfg.token = get("RSC_TOKEN").map(SecretString::from);
        cfg.token_file = get("RSC_TOKEN_FILE").map(PathBuf::from);
        cfg.coordinator_tls = rsc_api::ClientTls {
            ca: get("RSC_COORDINATOR_CA").map(PathBuf::from),
            cert: get("RSC_COORDINATOR_CERT").map(PathBuf::from),
            key: get("RSC_COORDINATOR_KEY").map(PathBuf::from),
        };
        cfg.host = get("POD_NAME").or_else(|| get("HOSTNAME"));
        cfg.static_membership = yes("RSC_STATIC_MEMBERSHIP");
        cfg.instance_id = if cfg.static_membership {
            // A static id must survive the restart: the pod name does, the pod IP does not.
            cfg.host.clone()
        } else {
            // Local runs share the host name: the process id tells two processes apart (a
            // pod's own IP or name already does).
            get("POD_IP").or_else(|| get("POD_NAME")).or_else(|| {
                let host = get("HOSTNAME").unwrap_or_else(|| "localhost".to_owned());
                Some(format!("{host}-{}", std::process::id()))
            })
        };
        cfg
    }

    pub(crate) fn check_coordinator(&self) -> Result<(), ClientError> {
        if self.coordinator_urls.is_empty() {
            return Err(ConfigError::NoCoordinator.into());
        }
        Ok(())
    }

    /// The HTTP client of the configured coordinators (a URL that is not `http`/`https` is
    /// [`crate::CoordinatorError::InvalidUrl`]; a TLS or token file that cannot be used,
    /// `CoordinatorError::Setup`).
    pub(crate) fn coordinator(&self) -> Result<CoordinatorClient, ClientError> {
        self.check_coordinator()?;
        Ok(
            CoordinatorClient::builder(self.coordinator_urls.iter().cloned())
                .token(self.token.clone())
                .token_file(self.token_file.clone())
                .tls(self.coordinator_tls.clone())
                .build()?,
        )
    }
}

/// The variable of [`ClientConfig::data_redis_grace`], in milliseconds.
const GRACE_ENV: &str = "RSC_DATA_REDIS_GRACE_MS";

/// A variable of the environment `get` reads that [`ClientConfig::from_env`] cannot use
/// (it keeps the default for it): reported by the builders rather than ignored.
pub(crate) fn env_error(get: impl Fn(&str) -> Option<String>) -> Option<ConfigError> {
    let value = get(GRACE_ENV).filter(|v| !v.trim().is_empty())?;
    match value.trim().parse::<u64>() {
        Ok(_) => None,
        Err(_) => Some(ConfigError::InvalidEnv {
            name: GRACE_ENV,
            value,
            expected: "a number of milliseconds",
        }),
    }
}

/// How the client's errors name the data Redis settings.
const NAMES: Names = Names::Env("RSC_REDIS");

impl ClientConfig {
    /// The data Redis settings to check and connect with (the `RSC_*` variables are shared by
    /// every program of a pod).
    fn redis_settings(&self) -> RedisSettings {
        self.redis.clone().ignoring_unused_sentinel_options()
    }

    /// Checks the data Redis settings without connecting.
    pub(crate) fn check_data_redis(&self) -> Result<(), ClientError> {
        let r = self.redis_settings().check(NAMES);
        r.map_err(|e| config_error(e).into())
    }

    /// The data Redis for logs and errors: its URL(s) with any password hidden, or behind
    /// Redis Sentinel the master's name and the sentinels.
    pub(crate) fn data_redis_label(&self) -> String {
        self.redis.label()
    }

    /// The data Redis these settings name (checked; connected on first use). Needs a Tokio
    /// runtime.
    pub(crate) fn data_redis(&self) -> Result<LazyRedis, ClientError> {
        self.data_redis_with(&crate::data::SETTINGS)
    }

    /// [`Self::data_redis`] with these connection settings.
    pub(crate) fn data_redis_with(
        &self,
        settings: &rsc_redis::ConnSettings,
    ) -> Result<LazyRedis, ClientError> {
        let r = self.redis_settings().open(NAMES, settings);
        r.map_err(|e| config_error(e).into())
    }
}

/// The client's configuration error for data Redis settings that cannot work.
fn config_error(e: SettingsError) -> ConfigError {
    match e {
        SettingsError::Tls { .. } => ConfigError::Tls(e.to_string()),
        SettingsError::Sentinel { .. }
        | SettingsError::NoSentinel { .. }
        | SettingsError::NoMasterName { .. }
        | SettingsError::ClusterAndSentinel { .. } => ConfigError::Sentinel(e.to_string()),
        e => ConfigError::DataRedis(e.to_string()),
    }
}

/// The setters of the coordinator and data-Redis connection settings, the same on every
/// builder that holds a `config: ClientConfig` (the consumer app's and the producer's).
macro_rules! connection_setters {
    () => {
        /// The coordinator URL(s): one, or several separated by commas (failover).
        pub fn coordinator(mut self, urls: &str) -> Self {
            self.config.coordinator_urls = $crate::config::split_urls(urls);
            self
        }

        /// The data Redis URL (with [`Self::redis_cluster`], seed nodes, comma-separated).
        pub fn redis_url(mut self, url: impl Into<String>) -> Self {
            self.config.redis.url = Some(rsc_protocol::redact::SecretUrl::new(url));
            self
        }

        /// Whether the data Redis is a Redis Cluster (default: `RSC_REDIS_CLUSTER`, else no).
        pub fn redis_cluster(mut self, cluster: bool) -> Self {
            self.config.redis.cluster = cluster;
            self
        }

        /// Finds the data Redis master through Redis Sentinel: `sentinels` is `HOST:PORT`,
        /// comma-separated, `master` the monitored name (default: `RSC_REDIS_SENTINEL`,
        /// `RSC_REDIS_SENTINEL_MASTER`); see [`rsc_redis::RedisSettings::sentinel`].
        pub fn redis_sentinel(
            mut self,
            sentinels: impl Into<String>,
            master: impl Into<String>,
        ) -> Self {
            self.config.redis.sentinel = Some(sentinels.into());
            self.config.redis.sentinel_master = Some(master.into());
            self
        }

        /// Verifies the data Redis (a `rediss://` URL) against this CA certificate file (PEM)
        /// rather than the system's roots (default: `RSC_REDIS_TLS_CA`); see
        /// [`rsc_redis::RedisSettings::tls_ca`].
        pub fn redis_tls_ca(mut self, ca: impl Into<std::path::PathBuf>) -> Self {
            self.config.redis.tls_ca = Some(ca.into());
            self
        }

        /// Presents this client certificate and key (PEM files) to the data Redis, for mutual
        /// TLS (default: `RSC_REDIS_TLS_CERT`, `RSC_REDIS_TLS_KEY`).
        pub fn redis_tls_client_cert(
            mut self,
            cert: impl Into<std::path::PathBuf>,
            key: impl Into<std::path::PathBuf>,
        ) -> Self {
            self.config.redis.tls_cert = Some(cert.into());
            self.config.redis.tls_key = Some(key.into());
            self
        }

        /// Connects to the sentinels (and the master they name) over TLS (default:
        /// `RSC_REDIS_SENTINEL_TLS`); see [`rsc_redis::RedisSettings::sentinel_tls`].
        pub fn redis_sentinel_tls(mut self, tls: bool) -> Self {
            self.config.redis.sentinel_tls = tls;
            self
        }

        /// The bearer token for the coordinator.
        pub fn token(mut self, token: impl Into<String>) -> Self {
            self.config.token = Some(rsc_protocol::redact::SecretString::from(token.into()));
            self
        }

        /// A file holding the bearer token, read again whenever it changes (default:
        /// `RSC_TOKEN_FILE`); see [`ClientConfig::token_file`].
        pub fn token_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
            self.config.token_file = Some(path.into());
            self
        }

        /// The CA and client certificate for an `https://` coordinator (default:
        /// `RSC_COORDINATOR_CA`, `RSC_COORDINATOR_CERT`, `RSC_COORDINATOR_KEY`); see
        /// [`ClientConfig::coordinator_tls`].
        pub fn coordinator_tls(mut self, tls: rsc_api::ClientTls) -> Self {
            self.config.coordinator_tls = tls;
            self
        }
    };
}
pub(crate) use connection_setters;

/// Splits `a,b , c` into URLs.
pub(crate) fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsc_protocol::redact::ExposeSecret;
    use std::collections::HashMap;

    #[test]
    fn debug_hides_the_token_and_redis_passwords() {
        let cfg = ClientConfig {
            token: Some("s3cret-token".into()),
            redis: RedisSettings {
                url: Some("redis://app:pa55@r1:6379,redis://:pa55@r2:6379,redis://r3:6379".into()),
                sentinel_password: Some("pa55".into()),
                ..RedisSettings::default()
            },
            ..ClientConfig::default()
        };
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("s3cret-token") && !shown.contains("pa55"),
            "{shown}"
        );
        assert!(shown.contains("redis://app:<redacted>@r1:6379"), "{shown}");
        assert!(shown.contains("redis://<redacted>@r2:6379"), "{shown}");
        assert!(shown.contains("redis://r3:6379"), "{shown}");
    }

    #[test]
    fn static_membership_takes_the_pod_name_over_the_pod_ip() {
        let env: HashMap<&str, &str> = [
            ("RSC_STATIC_MEMBERSHIP", "true"),
            ("POD_NAME", "orders-2"),
            ("POD_IP", "10.0.0.9"),
        ]
        .into();
        let cfg = ClientConfig::from_lookup(|k| env.get(k).map(|v| v.to_string()));
        assert!(cfg.static_membership);
        assert_eq!(cfg.instance_id.as_deref(), Some("orders-2"));
        let cfg = ClientConfig::from_lookup(|k| (k == "POD_IP").then(|| "10.0.0.9".into()));
        assert!(!cfg.static_membership);
        assert_eq!(cfg.instance_id.as_deref(), Some("10.0.0.9"));
    }

    #[test]
    fn the_data_redis_grace_comes_from_the_environment_and_a_bad_one_is_refused() {
        assert_eq!(
            ClientConfig::default().data_redis_grace,
            DEFAULT_DATA_REDIS_GRACE
        );
        let env = |v: &'static str| move |k: &str| (k == GRACE_ENV).then(|| v.to_owned());
        assert_eq!(
            ClientConfig::from_lookup(env("2500")).data_redis_grace,
            std::time::Duration::from_millis(2500)
        );
        assert_eq!(env_error(env(" 2500 ")), None);
        assert_eq!(env_error(|_| None), None);
        let err = env_error(env("15s")).expect("refused").to_string();
        assert!(err.contains(GRACE_ENV) && err.contains("\"15s\""), "{err}");
    }

    #[test]
    fn a_local_run_gets_an_instance_id_of_its_own() {
        let cfg = ClientConfig::from_lookup(|k| (k == "HOSTNAME").then(|| "laptop".into()));
        let own = format!("laptop-{}", std::process::id());
        assert_eq!(cfg.instance_id.as_deref(), Some(own.as_str()));
        assert_eq!(cfg.host.as_deref(), Some("laptop"));
        let cfg = ClientConfig::from_lookup(|_| None);
        assert!(cfg.instance_id.is_some_and(|i| i.starts_with("localhost-")));
        // Static membership needs a name that survives the restart: no default.
        let cfg = ClientConfig::from_lookup(|k| (k == "RSC_STATIC_MEMBERSHIP").then(|| "1".into()));
        assert_eq!(cfg.instance_id, None);
    }

    #[test]
    fn reads_the_environment() {
        let env: HashMap<&str, &str> = [
            ("RSC_COORDINATOR_URL", "http://a:1, http://b:2,"),
            ("RSC_REDIS_URL", "redis://r:7"),
            ("RSC_TOKEN", "t"),
            ("RSC_TOKEN_FILE", "/var/run/secrets/tokens/rsc"),
            ("RSC_COORDINATOR_CA", "/etc/rsc/ca.pem"),
            ("RSC_REDIS_CLUSTER", "true"),
            ("POD_NAME", "pod-1"),
        ]
        .into();
        let cfg = ClientConfig::from_lookup(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(cfg.coordinator_urls, ["http://a:1", "http://b:2"]);
        assert_eq!(cfg.redis.url, Some("redis://r:7".into()));
        assert_eq!(
            cfg.token.as_ref().map(ExposeSecret::expose_secret),
            Some("t")
        );
        assert_eq!(
            cfg.token_file.as_deref(),
            Some(std::path::Path::new("/var/run/secrets/tokens/rsc"))
        );
        assert_eq!(
            cfg.coordinator_tls.ca.as_deref(),
            Some(std::path::Path::new("/etc/rsc/ca.pem"))
        );
        assert_eq!(cfg.coordinator_tls.cert, None);
        assert!(cfg.redis.cluster);
        assert_eq!(cfg.instance_id.as_deref(), Some("pod-1"));
        assert!(cfg.heartbeat_batching);
        let off =
            ClientConfig::from_lookup(|k| (k == "RSC_HEARTBEAT_BATCHING").then(|| "false".into()));
        assert!(!off.heartbeat_batching);
        assert!(off.wake_channel);
        let off = ClientConfig::from_lookup(|k| (k == "RSC_WAKE_CHANNEL").then(|| "off".into()));
        assert!(!off.wake_channel);
        assert!(off.shared_reader);
        let off = ClientConfig::from_lookup(|k| (k == "RSC_SHARED_READER").then(|| "no".into()));
        assert!(!off.shared_reader);
        let cfg = ClientConfig::from_lookup(|k| (k == "POD_IP").then(|| "10.0.0.9".into()));
        assert_eq!(cfg.instance_id.as_deref(), Some("10.0.0.9"));
        assert!(cfg.check_coordinator().is_err());
        assert!(!cfg.redis.cluster);
    }

    #[test]
    fn several_redis_urls_only_for_a_cluster() {
        let mut cfg = ClientConfig::default();
        cfg.redis.url = Some("redis://a:1, redis://b:2".into());
        let err = cfg.check_data_redis().unwrap_err().to_string();
        assert!(err.contains("only accepted with Redis Cluster"), "{err}");
        cfg.redis.cluster = true;
        assert!(cfg.check_data_redis().is_ok());
        cfg.redis.url = Some("not a url".into());
        assert!(cfg.check_data_redis().is_err());
        cfg.redis.url = Some(" , ".into());
        assert!(cfg.check_data_redis().is_err());
    }

    #[test]
    fn tls_settings_from_the_environment_are_loaded_when_checked() {
        let env = [
            ("RSC_REDIS_URL", "rediss://r:6380"),
            ("RSC_REDIS_TLS_CA", "/nonexistent/ca.pem"),
            ("RSC_REDIS_SENTINEL_TLS", "true"),
        ];
        let cfg = ClientConfig::from_lookup(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        });
        assert_eq!(
            cfg.redis.tls_ca.as_deref(),
            Some(std::path::Path::new("/nonexistent/ca.pem"))
        );
        assert!(cfg.redis.sentinel_tls);
        let err = cfg.check_data_redis().unwrap_err().to_string();
        assert!(
            err.contains("RSC_REDIS_TLS_CA") && err.contains("/nonexistent/ca.pem"),
            "{err}"
        );
        let mut half = ClientConfig::default();
        half.redis.tls_key = Some("/etc/rsc/key.pem".into());
        let err = half.check_data_redis().unwrap_err().to_string();
        assert!(err.contains("needs its certificate"), "{err}");
        let plain = ClientConfig::default();
        assert!(plain.check_data_redis().is_ok());
    }

    #[test]
    fn sentinel_settings_from_the_environment_are_checked() {
        let env = [
            ("RSC_REDIS_SENTINEL", "s1:26379, s2:26379"),
            ("RSC_REDIS_SENTINEL_MASTER", "rsc"),
            ("RSC_REDIS_SENTINEL_PASSWORD", "pw"),
        ];
        let cfg = ClientConfig::from_lookup(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        });
        let s = (cfg.redis.sentinel_target(NAMES).unwrap()).expect("sentinel settings");
        assert_eq!(s.sentinels.len(), 2);
        assert_eq!(
            (
                s.master_name.as_str(),
                s.password.as_ref().map(ExposeSecret::expose_secret)
            ),
            ("rsc", Some("pw"))
        );
        assert!(cfg.check_data_redis().is_ok());

        let mut no_master = cfg.clone();
        no_master.redis.sentinel_master = None;
        let err = no_master.check_data_redis().unwrap_err().to_string();
        assert!(err.contains("RSC_REDIS_SENTINEL_MASTER"), "{err}");
        let mut with_cluster = cfg.clone();
        with_cluster.redis.cluster = true;
        assert!(with_cluster.check_data_redis().is_err());
        let mut bad = cfg;
        bad.redis.sentinel = Some("no-port".into());
        assert!(bad.check_data_redis().is_err());
    }
}
