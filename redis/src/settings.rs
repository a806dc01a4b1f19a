//! [`RedisSettings`]: the nine settings that say where a Redis is and how to reach it, as a
//! program reads them (flags, environment, a file), checked and turned into a [`LazyRedis`].
//!
//! The coordinator's metadata store and data Redis and the client's data Redis all use it;
//! each names the settings its own way in errors ([`Names`]: `--data-redis-url`,
//! `RSC_REDIS_URL`).

use crate::sentinel::{SentinelError, SentinelTarget, parse_addrs};
use crate::{ConnSettings, LazyRedis, OpenError, Tls, TlsError, TlsFiles};
use rsc_protocol::redact::{SecretString, SecretUrl};
use std::path::PathBuf;

/// Where a Redis is and how to reach it: one server, the seed nodes of a Redis Cluster, or a
/// master found through Redis Sentinel, with TLS files. Every setting is optional so that
/// layers (flag, environment, file, default) merge with [`Self::or`].
///
/// `Debug` never prints a password: the URL's is replaced by `<redacted>`, the sentinels'
/// shows only whether it is set (PROTOCOL §12); the TLS files are shown by path only.
#[derive(Clone, Default)]
pub struct RedisSettings {
    /// The server (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS); with
    /// [`Self::cluster`], one or more seed nodes separated by commas. Behind sentinels only
    /// its user name, password and database number are used.
    pub url: Option<SecretUrl>,
    /// The server is a Redis Cluster (slot routing, `MOVED`/`ASK`).
    pub cluster: bool,
    /// Find the master through these Redis Sentinels (`HOST:PORT`, separated by commas);
    /// needs [`Self::sentinel_master`]. After a failover the new master is found by itself.
    pub sentinel: Option<String>,
    /// The name the sentinels monitor the master under (`sentinel monitor NAME …`).
    pub sentinel_master: Option<String>,
    /// Password of the sentinels, if they require one.
    pub sentinel_password: Option<SecretString>,
    /// Connect to the sentinels over TLS, and to the master too.
    pub sentinel_tls: bool,
    /// CA certificate file (PEM) to verify the server against (default: the system's roots).
    /// `rediss://…/#insecure` skips the verification: for tests only.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate file (PEM) for mutual TLS; needs [`Self::tls_key`].
    pub tls_cert: Option<PathBuf>,
    /// Private key file (PEM) of [`Self::tls_cert`].
    pub tls_key: Option<PathBuf>,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let password = self
            .sentinel_password
            .as_ref()
            .map(|_| rsc_protocol::redact::REDACTED);
        f.debug_struct("RedisSettings")
            .field("url", &self.url)
            .field("cluster", &self.cluster)
            .field("sentinel", &self.sentinel)
            .field("sentinel_master", &self.sentinel_master)
            .field("sentinel_password", &password)
            .field("sentinel_tls", &self.sentinel_tls)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .finish()
    }
}

/// How a program spells the settings of a [`RedisSettings`], so that an error names the
/// one to fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// Command-line flags: `Flags("data-redis")` names `--data-redis-url`,
    /// `--data-redis-sentinel-master`, …
    Flags(&'static str),
    /// Environment variables: `Env("RSC_REDIS")` names `RSC_REDIS_URL`,
    /// `RSC_REDIS_SENTINEL_MASTER`, …
    Env(&'static str),
}

impl Names {
    /// The name of one setting, given in kebab case after the prefix (`sentinel-master`).
    pub fn of(self, setting: &str) -> String {
        match self {
            Names::Flags(prefix) => format!("--{prefix}-{setting}"),
            Names::Env(prefix) => format!("{prefix}_{}", setting.replace('-', "_")).to_uppercase(),
        }
    }
}

/// [`RedisSettings`] that cannot work, each naming the settings to fix (as [`Names`] spells
/// them).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// No URL, or only blanks between commas (the URL setting).
    #[error("{0} is empty")]
    NoUrl(String),
    /// Several URLs without cluster mode (the URL and cluster settings).
    #[error("{0} lists several servers: that is only accepted with Redis Cluster ({1})")]
    SeveralUrls(String, String),
    /// Cluster mode without a URL (the cluster and URL settings).
    #[error("{0} needs {1} (the cluster's seed nodes)")]
    ClusterWithoutUrl(String, String),
    /// Sentinels and cluster mode together (the sentinel and cluster settings).
    #[error("{0} and {1} exclude each other (a cluster fails over by itself)")]
    ClusterAndSentinel(String, String),
    /// Sentinel addresses without the master's name (the sentinel and master settings).
    #[error("{0} needs {1} (the name the sentinels monitor the master under)")]
    NoMasterName(String, String),
    /// A master name, sentinel password or sentinel TLS without sentinel addresses (those
    /// three settings, then the sentinel setting).
    #[error("{0} need {1} (the sentinel addresses)")]
    NoSentinel(String, String),
    /// A sentinel address is not `HOST:PORT` (the sentinel setting, what is wrong).
    #[error("{0}: {1}")]
    Sentinel(String, #[source] SentinelError),
    /// The TLS files cannot be used: unreadable, not PEM, a key without its certificate…
    /// (the three file settings, what is wrong).
    #[error("{0}: {1}")]
    Tls(String, #[source] TlsError),
    /// The URL or the combination is refused by the connection (the URL setting, what is
    /// wrong).
    #[error("{0}: {1}")]
    Open(String, #[source] OpenError),
}

impl RedisSettings {
    /// These settings, each unset one taken from `fallback` (a lower layer: a flag over the
    /// environment over a file over the defaults). Cluster and TLS flags are on when either
    /// layer turns them on.
    pub fn or(self, fallback: RedisSettings) -> RedisSettings {
        RedisSettings {
            url: self.url.or(fallback.url),
            cluster: self.cluster || fallback.cluster,
            sentinel: self.sentinel.or(fallback.sentinel),
            sentinel_master: self.sentinel_master.or(fallback.sentinel_master),
            sentinel_password: self.sentinel_password.or(fallback.sentinel_password),
            sentinel_tls: self.sentinel_tls || fallback.sentinel_tls,
            tls_ca: self.tls_ca.or(fallback.tls_ca),
            tls_cert: self.tls_cert.or(fallback.tls_cert),
            tls_key: self.tls_key.or(fallback.tls_key),
        }
    }

    /// These settings without the sentinel password and TLS flag when no sentinels are
    /// named: for settings read from an environment that several programs share (a pod's
    /// `RSC_*` variables), where those are unused rather than a mistake.
    pub fn ignoring_unused_sentinel_options(mut self) -> Self {
        if self.sentinel.is_none() {
            (self.sentinel_password, self.sentinel_tls) = (None, false);
        }
        self
    }

    /// Whether nothing is set at all (no Redis is configured).
    pub fn is_empty(&self) -> bool {
        let files = [&self.tls_ca, &self.tls_cert, &self.tls_key];
        (self.url.is_none() && self.sentinel.is_none() && self.sentinel_master.is_none())
            && !(self.cluster || self.sentinel_tls || self.sentinel_password.is_some())
            && files.iter().all(|f| f.is_none())
    }

    /// The URLs (seed nodes of a cluster), split at commas; behind sentinels without a URL,
    /// one that carries no credentials.
    pub fn urls(&self) -> Vec<SecretUrl> {
        match (&self.url, &self.sentinel) {
            (Some(url), _) => url.split(),
            (None, Some(_)) => vec![SecretUrl::new("redis://sentinel-master/")],
            (None, None) => Vec::new(),
        }
    }

    /// The server for logs and errors: its URL(s) with any password hidden, or behind
    /// sentinels the master's name and the sentinels.
    pub fn label(&self) -> String {
        match (&self.sentinel, &self.sentinel_master) {
            (Some(sentinels), Some(master)) => {
                format!("master {master} of the sentinels {sentinels}")
            }
            _ => self
                .url
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
        }
    }

    /// The sentinels, when the master is found through them (checked: addresses and a
    /// master name together, no other sentinel setting without them, not with cluster
    /// mode).
    pub fn sentinel_target(&self, names: Names) -> Result<Option<SentinelTarget>, SettingsError> {
        let (sentinel, master) = (names.of("sentinel"), names.of("sentinel-master"));
        let Some(addrs) = &self.sentinel else {
            if self.sentinel_master.is_some()
                || self.sentinel_password.is_some()
                || self.sentinel_tls
            {
                let (p, t) = (names.of("sentinel-password"), names.of("sentinel-tls"));
                let options = format!("{master}, {p} and {t}");
                return Err(SettingsError::NoSentinel(options, sentinel));
            }
            return Ok(None);
        };
        let Some(name) = self
            .sentinel_master
            .as_deref()
            .filter(|m| !m.trim().is_empty())
        else {
            return Err(SettingsError::NoMasterName(sentinel, master));
        };
        if self.cluster {
            return Err(SettingsError::ClusterAndSentinel(
                sentinel,
                names.of("cluster"),
            ));
        }
        Ok(Some(SentinelTarget {
            sentinels: parse_addrs(addrs).map_err(|e| SettingsError::Sentinel(sentinel, e))?,
            master_name: name.trim().to_owned(),
            username: None,
            password: self.sentinel_password.clone(),
            tls: self.sentinel_tls,
        }))
    }

    /// The TLS files, loaded (read and checked).
    pub fn tls(&self, names: Names) -> Result<Tls, SettingsError> {
        let files = TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        };
        let named = ["tls-ca", "tls-cert", "tls-key"].map(|s| names.of(s));
        files
            .load()
            .map_err(|e| SettingsError::Tls(named.join(" / "), e))
    }

    /// Checks everything that can be checked without connecting (or a runtime): the URLs,
    /// the combinations, the sentinel addresses, the TLS files.
    pub fn check(&self, names: Names) -> Result<(), SettingsError> {
        let sentinel = self.sentinel_target(names)?;
        let tls = self.tls(names)?;
        let urls = self.checked_urls(names)?;
        // Behind sentinels the URL only carries the master's credentials.
        let tls = if sentinel.is_some() {
            Tls::default()
        } else {
            tls
        };
        LazyRedis::check(&urls, self.cluster, &tls).map_err(|e| open_error(names, e))
    }

    /// A handle (connected on first use) with these settings and `conn`'s timeouts, checked
    /// as [`Self::check`] does. Needs a Tokio runtime.
    pub fn open(&self, names: Names, conn: &ConnSettings) -> Result<LazyRedis, SettingsError> {
        let sentinel = self.sentinel_target(names)?;
        let tls = self.tls(names)?;
        let urls = self.checked_urls(names)?;
        match sentinel {
            Some(target) => LazyRedis::check(&urls, self.cluster, &Tls::default())
                .and_then(|()| LazyRedis::open_sentinel(&target, &urls[0], conn, &tls)),
            None => LazyRedis::open(&urls, self.cluster, conn, &tls),
        }
        .map_err(|e| open_error(names, e))
    }

    /// The URLs to connect with: at least one, several only in cluster mode.
    fn checked_urls(&self, names: Names) -> Result<Vec<String>, SettingsError> {
        let urls = SecretUrl::expose_all(&self.urls());
        if self.url.is_none() && self.cluster {
            return Err(SettingsError::ClusterWithoutUrl(
                names.of("cluster"),
                names.of("url"),
            ));
        }
        if urls.is_empty() {
            return Err(SettingsError::NoUrl(names.of("url")));
        }
        if urls.len() > 1 && !self.cluster {
            return Err(SettingsError::SeveralUrls(
                names.of("url"),
                names.of("cluster"),
            ));
        }
        Ok(urls)
    }
}

/// An [`OpenError`] naming the URL setting.
fn open_error(names: Names, source: OpenError) -> SettingsError {
    SettingsError::Open(names.of("url"), source)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: Names = Names::Flags("data-redis");
    const ENV: Names = Names::Env("RSC_REDIS");

    fn sentinel() -> RedisSettings {
        RedisSettings {
            sentinel: Some("s1:26379, s2:26379".into()),
            sentinel_master: Some(" rsc ".into()),
            ..RedisSettings::default()
        }
    }

    #[test]
    fn debug_never_prints_a_password() {
        let s = RedisSettings {
            url: Some("redis://app:pw-url@r1:6379, redis://:pw-url@r2:6379".into()),
            sentinel_password: Some("pw-sentinel".into()),
            tls_key: Some("/etc/rsc/key.pem".into()),
            ..sentinel()
        };
        let shown = format!("{s:?}{s:#?}");
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(shown.contains("redis://app:<redacted>@r1:6379"), "{shown}");
        assert!(
            shown.contains("sentinel_password: Some(\"<redacted>\")"),
            "{shown}"
        );
        assert!(shown.contains("/etc/rsc/key.pem"), "{shown}");
    }

    #[test]
    fn names_follow_the_program() {
        assert_eq!(FLAGS.of("sentinel-master"), "--data-redis-sentinel-master");
        assert_eq!(ENV.of("tls-ca"), "RSC_REDIS_TLS_CA");
    }

    #[test]
    fn a_layer_fills_what_the_one_above_leaves_unset() {
        let flag = RedisSettings {
            url: Some("redis://flag:1".into()),
            ..RedisSettings::default()
        };
        let merged = flag.or(RedisSettings {
            url: Some("redis://file:1".into()),
            cluster: true,
            ..sentinel()
        });
        assert_eq!(merged.url, Some("redis://flag:1".into()));
        assert!(merged.cluster);
        assert_eq!(merged.sentinel_master.as_deref(), Some(" rsc "));
    }

    #[test]
    fn combinations_that_cannot_work_are_refused_by_name() {
        let t = sentinel().sentinel_target(ENV).unwrap().expect("a target");
        assert_eq!((t.sentinels.len(), t.master_name.as_str()), (2, "rsc"));
        assert_eq!(sentinel().urls(), ["redis://sentinel-master/"]);
        assert!(sentinel().check(FLAGS).is_ok());
        let err = |s: RedisSettings| s.check(FLAGS).unwrap_err().to_string();
        let both = err(RedisSettings {
            cluster: true,
            url: Some("redis://a:1".into()),
            ..sentinel()
        });
        assert!(
            both.contains("--data-redis-sentinel and --data-redis-cluster"),
            "{both}"
        );
        let no_master = err(RedisSettings {
            sentinel_master: None,
            ..sentinel()
        });
        assert!(
            no_master.contains("needs --data-redis-sentinel-master"),
            "{no_master}"
        );
        let tls_alone = err(RedisSettings {
            sentinel_tls: true,
            ..RedisSettings::default()
        });
        assert!(
            tls_alone.contains("--data-redis-sentinel-tls need"),
            "{tls_alone}"
        );
        let bad = err(RedisSettings {
            sentinel: Some("no-port".into()),
            ..sentinel()
        });
        assert!(bad.starts_with("--data-redis-sentinel: "), "{bad}");
        let key = err(RedisSettings {
            url: Some("redis://a:1".into()),
            tls_key: Some("/etc/rsc/key.pem".into()),
            ..RedisSettings::default()
        });
        assert!(key.contains("--data-redis-tls-key") && key.contains("needs its certificate"));
        let several = err(RedisSettings {
            url: Some("redis://a:1, redis://b:2".into()),
            ..RedisSettings::default()
        });
        assert!(several.contains("only accepted with Redis Cluster (--data-redis-cluster)"));
        let empty = err(RedisSettings {
            url: Some(" , ".into()),
            ..RedisSettings::default()
        });
        assert_eq!(empty, "--data-redis-url is empty");
        let cluster = err(RedisSettings {
            cluster: true,
            ..RedisSettings::default()
        });
        assert!(
            cluster.contains("--data-redis-cluster needs --data-redis-url"),
            "{cluster}"
        );
    }
}
