//! [`LazyRedis`]: one handle for a standalone Redis, a Redis Cluster or a master found
//! through Redis Sentinel, and [`Conn`], the routed connection it hands out.

use crate::sentinel::{SentinelConfig, SentinelConn, SentinelError, SentinelRedis, SentinelTarget};
use crate::tls::{Tls, is_tls};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionInfo, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value,
};
use rsc_protocol::redact::SecretUrl;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use tracing::warn;

/// Timeouts and reconnection policy of a [`LazyRedis`].
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time to wait for one reply (the redis-rs default, 500 ms, is raised or lowered here).
    pub response_timeout: Duration,
    /// On a cluster: upper bound of one command, redirections and retries included.
    pub operation_timeout: Duration,
    /// How hard a failed connection is tried again before a command fails.
    pub reconnect: Reconnect,
}

/// How hard a [`LazyRedis`] tries again after a connection error before the command in
/// flight returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// Fail fast: one reconnect attempt (20–100 ms) on a standalone server, two re-sends
    /// (10–100 ms apart) on a cluster. An outage answers at once and the caller's next
    /// command tries again: for servers that must answer their own callers in time (the
    /// coordinator).
    Quick,
    /// Ride out a short restart: redis-rs's reconnect schedule on a standalone server
    /// (exponential backoff, six attempts), three re-sends with its default waits on a
    /// cluster (the client's data path).
    Patient,
}

/// Why a [`LazyRedis`] could not be built (nothing is connected yet: only the settings are
/// wrong).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No URL at all.
    #[error("no Redis URL given")]
    NoUrl,
    /// Several URLs name cluster seed nodes; a standalone Redis has one.
    #[error("several Redis URLs are only accepted with Redis Cluster")]
    SeveralUrls,
    /// A URL or a cluster setting is malformed.
    #[error("invalid Redis URL or settings: {0}")]
    Invalid(#[source] RedisError),
    /// The sentinel settings are wrong.
    #[error("invalid Redis Sentinel settings: {0}")]
    Sentinel(#[from] SentinelError),
    /// A CA or client certificate is given, but no connection uses TLS.
    #[error(
        "TLS certificates are given but the Redis URL does not use TLS: write rediss://HOST:PORT \
         (behind Redis Sentinel: a rediss:// URL or the sentinel TLS option)"
    )]
    TlsNeedsRediss,
    /// Some cluster seed URLs use TLS (`rediss://`) and some do not.
    #[error("the Redis Cluster seed URLs mix rediss:// and redis://: use one scheme for all")]
    MixedTls,
}

/// One connection, standalone, cluster or sentinel-named master (all multiplex and are
/// cheap to clone).
#[derive(Clone)]
pub enum Conn {
    /// A standalone Redis (reconnects on demand).
    Single(ConnectionManager),
    /// A Redis Cluster (routes by slot, follows MOVED/ASK).
    Cluster(ClusterConnection),
    /// The master named by Redis Sentinel.
    Sentinel(SentinelConn),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
            Conn::Sentinel(_) => "Conn::Sentinel",
        })
    }
}

impl Conn {
    /// Whether this talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

pub(crate) enum Backend {
    Single(ConnectionManager),
    /// Connects on first use (a cluster connection needs a node that answers).
    Cluster {
        client: Box<ClusterClient>,
        conn: OnceCell<ClusterConnection>,
        /// For the clients of another kind made later ([`LazyRedis::cluster_pubsub`]).
        tls: Tls,
    },
    /// Looks the master up through the sentinels on first use and after a failover.
    Sentinel(SentinelRedis),
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// The server, or the cluster's seed nodes; behind sentinels, the master's credentials
    /// and database (its host is not used).
    pub(crate) seeds: Vec<ConnectionInfo>,
    pub(crate) settings: ConnSettings,
}

/// A lazily connected standalone Redis, Redis Cluster or sentinel-named master; cheap to
/// clone (one shared multiplexed connection).
///
/// [`LazyRedis::get`] hands out a routed [`Conn`]; the handle itself also implements
/// [`ConnectionLike`], connecting (or finding the current master) for each command.
/// [`LazyRedis::dedicated`] makes a [`NodeConn`](crate::NodeConn), a connection of its own
/// to one node.
#[derive(Clone)]
pub struct LazyRedis(pub(crate) Arc<Inner>);

impl std::fmt::Debug for LazyRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: do not print them.
        f.debug_struct("LazyRedis")
            .field("cluster", &self.is_cluster())
            .field("sentinel", &self.sentinel().is_some())
            .field("seeds", &self.0.seeds.len())
            .field("tls", &self.uses_tls())
            .finish_non_exhaustive()
    }
}

/// Parses `urls` (one, or with `cluster` several seed nodes) without connecting, and gives
/// `rediss://` ones `tls`'s certificates.
fn seeds(urls: &[String], cluster: bool, tls: &Tls) -> Result<Vec<ConnectionInfo>, OpenError> {
    if urls.is_empty() {
        return Err(OpenError::NoUrl);
    }
    if !cluster && urls.len() > 1 {
        return Err(OpenError::SeveralUrls);
    }
    let infos = urls
        .iter()
        .map(|u| {
            u.as_str()
                .into_connection_info()
                .map_err(OpenError::Invalid)
        })
        .collect::<Result<Vec<_>, _>>()?;
    match infos.iter().filter(|i| is_tls(i)).count() {
        0 if tls.is_set() => Err(OpenError::TlsNeedsRediss),
        0 => Ok(infos),
        n if n < infos.len() => Err(OpenError::MixedTls),
        _ => {
            crate::tls::ensure_provider();
            infos
                .into_iter()
                .map(|i| tls.apply(i).map_err(OpenError::Invalid))
                .collect()
        }
    }
}

/// A Redis Cluster client for `seeds` (TLS as the seeds say, with `tls`'s certificates).
fn cluster_client(
    seeds: &[ConnectionInfo],
    settings: &ConnSettings,
    tls: &Tls,
) -> Result<ClusterClient, OpenError> {
    cluster_builder(seeds, settings, tls)
        .build()
        .map_err(OpenError::Invalid)
}

/// The builder of [`cluster_client`].
pub(crate) fn cluster_builder(
    seeds: &[ConnectionInfo],
    settings: &ConnSettings,
    tls: &Tls,
) -> redis::cluster::ClusterClientBuilder {
    let mut builder = ClusterClient::builder(seeds.to_vec())
        .connection_timeout(settings.connect_timeout)
        .response_timeout(settings.response_timeout)
        .overall_response_timeout(Some(settings.operation_timeout));
    builder = match settings.reconnect {
        Reconnect::Quick => builder.retries(2).min_retry_wait(10).max_retry_wait(100),
        Reconnect::Patient => builder.retries(3),
    };
    #[cfg(feature = "tls")]
    if let Some(certs) = tls.certs() {
        // The nodes the cluster names get the seeds' TLS mode and these certificates.
        let mode = match seeds[0].addr() {
            redis::ConnectionAddr::TcpTls { insecure: true, .. } => redis::TlsMode::Insecure,
            _ => redis::TlsMode::Secure,
        };
        builder = builder.tls(mode).certs(certs);
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    builder
}

impl LazyRedis {
    /// Checks `urls` as [`Self::open`] would, without connecting or needing a runtime.
    pub fn check(urls: &[String], cluster: bool, tls: &Tls) -> Result<(), OpenError> {
        seeds(urls, cluster, tls).map(drop)
    }

    /// A handle for `urls`: one server, or with `cluster` one or more seed nodes. A
    /// `rediss://` URL connects over TLS, verifying the server against `tls`'s CA (else the
    /// system's roots) and presenting its client certificate if it has one. Connects on
    /// first use; fails only on wrong settings. Needs a Tokio runtime.
    pub fn open(
        urls: &[String],
        cluster: bool,
        settings: &ConnSettings,
        tls: &Tls,
    ) -> Result<Self, OpenError> {
        let seeds = seeds(urls, cluster, tls)?;
        let backend = if cluster {
            Backend::Cluster {
                client: Box::new(cluster_client(&seeds, settings, tls)?),
                conn: OnceCell::new(),
                tls: tls.clone(),
            }
        } else {
            let client = redis::Client::open(seeds[0].clone()).map_err(OpenError::Invalid)?;
            let mut config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(Some(settings.response_timeout));
            if settings.reconnect == Reconnect::Quick {
                // One quick reconnect attempt per failed command: an outage answers at once,
                // and the next command tries again (the manager reconnects on demand).
                config = config
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(20))
                    .set_max_delay(Duration::from_millis(100));
            }
            Backend::Single(
                ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(OpenError::Invalid)?,
            )
        };
        Ok(LazyRedis(Arc::new(Inner {
            backend,
            seeds,
            settings: *settings,
        })))
    }

    /// A handle for the master that `target`'s sentinels name; `master_url`'s user name,
    /// password and database number are used on the master (its host is not). The master
    /// is reached over TLS when `master_url` is `rediss://` (`#insecure`: unverified) or
    /// `target.tls` is set, the sentinels when `target.tls` is set; both with `tls`'s
    /// certificates. Connects on first use; fails only on wrong settings.
    pub fn open_sentinel(
        target: &SentinelTarget,
        master_url: &str,
        settings: &ConnSettings,
        tls: &Tls,
    ) -> Result<Self, OpenError> {
        let master = master_url
            .into_connection_info()
            .map_err(OpenError::Invalid)?;
        let master_tls = match master.addr() {
            redis::ConnectionAddr::TcpTls { insecure: true, .. } => Some(redis::TlsMode::Insecure),
            redis::ConnectionAddr::TcpTls { .. } => Some(redis::TlsMode::Secure),
            _ if target.tls => Some(redis::TlsMode::Secure),
            _ => None,
        };
        if master_tls.is_none() && tls.is_set() {
            return Err(OpenError::TlsNeedsRediss);
        }
        if master_tls.is_some() {
            crate::tls::ensure_provider();
        }
        let redis = SentinelRedis::open(SentinelConfig {
            sentinel_tls: target.tls,
            master_tls,
            tls: tls.clone(),
            sentinels: target.sentinels.clone(),
            master_name: target.master_name.clone(),
            sentinel_username: target.username.clone(),
            sentinel_password: target.password.clone(),
            master: master.redis_settings().clone(),
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
        })?;
        Ok(LazyRedis(Arc::new(Inner {
            backend: Backend::Sentinel(redis),
            seeds: vec![master],
            settings: *settings,
        })))
    }

    /// Whether this talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.0.backend, Backend::Cluster { .. })
    }

    /// The server, or the cluster's seed nodes, as configured (TLS settings included), for a
    /// caller that opens a connection of another kind to them (pub/sub). Behind sentinels:
    /// only the master's credentials and database (its host is not used).
    pub fn seeds(&self) -> &[ConnectionInfo] {
        &self.0.seeds
    }

    /// Whether the connections use TLS (`rediss://` URLs; behind sentinels: to the master).
    pub fn uses_tls(&self) -> bool {
        match self.sentinel() {
            Some(s) => s.config().master_tls.is_some(),
            None => self.0.seeds.iter().any(is_tls),
        }
    }

    /// Behind Redis Sentinel: the master look-up.
    pub fn sentinel(&self) -> Option<&SentinelRedis> {
        match &self.0.backend {
            Backend::Sentinel(s) => Some(s),
            _ => None,
        }
    }

    /// A connection. On a cluster the first call connects (and a failed attempt is retried
    /// by the next call); behind sentinels the master is looked up when unknown. Bound it
    /// with a timeout.
    pub async fn get(&self) -> Result<Conn, RedisError> {
        match &self.0.backend {
            Backend::Single(m) => Ok(Conn::Single(m.clone())),
            Backend::Cluster { client, conn, .. } => conn
                .get_or_try_init(|| client.get_async_connection())
                .await
                .map(|c| Conn::Cluster(c.clone())),
            // Boxed: the look-up future is large and would nest into every caller.
            Backend::Sentinel(s) => Box::pin(s.get()).await.map(Conn::Sentinel),
        }
    }
}

impl ConnectionLike for LazyRedis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.get().await?.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.get().await?;
            conn.req_packed_commands(pipeline, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        match &self.0.backend {
            Backend::Single(c) => c.get_db(),
            Backend::Cluster { .. } => 0,
            Backend::Sentinel(s) => s.config().master.db(),
        }
    }
}

/// The server at a URL is, or is not, a Redis Cluster node, against the configuration
/// ([`check_mode`]).
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    /// A cluster node, configured as standalone.
    #[error("{url} is a Redis Cluster node: start the coordinator with {flag}")]
    IsCluster {
        /// The server's URL (printed with its password hidden).
        url: SecretUrl,
        /// The option that selects cluster mode.
        flag: String,
    },
    /// A standalone server, configured as a cluster.
    #[error("{url} is not a Redis Cluster node: drop {flag}")]
    NotCluster {
        /// The server's URL (printed with its password hidden).
        url: SecretUrl,
        /// The option that selects cluster mode.
        flag: String,
    },
    /// The TLS handshake failed: the server's certificate was not trusted, or the server
    /// refused the client's (or its absence). A setting to fix, not an outage to wait out.
    #[error(
        "TLS to Redis at {addr} failed: {reason} (check the TLS CA and client certificate \
         settings, and that the URL's host is named in the server's certificate)"
    )]
    Tls {
        /// The server's address (`HOST:PORT`).
        addr: String,
        /// rustls's reason.
        reason: String,
    },
}

/// Checks that the server at `url` is a cluster node exactly when `cluster` is set, over a
/// one-off standalone connection (which works on both kinds of server). A mismatch is an
/// error that names `flag`, the option that selects cluster mode; a server that does not
/// answer within `settings` is logged and accepted (the handle connects when it is up).
pub async fn check_mode(
    url: &str,
    cluster: bool,
    flag: &str,
    settings: &ConnSettings,
    tls: &Tls,
) -> Result<(), ModeError> {
    let info = seeds(&[url.to_owned()], false, tls).map(|mut s| s.remove(0));
    let addr = info
        .as_ref()
        .map(|i| i.addr().to_string())
        .unwrap_or_default();
    let ask = async {
        let info = info.map_err(|e| match e {
            OpenError::Invalid(e) => e,
            e => RedisError::from((ErrorKind::InvalidClientConfig, "settings", e.to_string())),
        })?;
        let client = redis::Client::open(info)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(settings.connect_timeout))
                    .set_response_timeout(Some(settings.response_timeout)),
            )
            .await?;
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut conn)
            .await
    };
    let (url, flag) = (SecretUrl::from(url), flag.to_owned());
    match tokio::time::timeout(settings.operation_timeout, ask).await {
        Ok(Ok(info)) => {
            let enabled = info.lines().any(|l| l.trim() == "cluster_enabled:1");
            match (enabled, cluster) {
                (true, false) => Err(ModeError::IsCluster { url, flag }),
                (false, true) => Err(ModeError::NotCluster { url, flag }),
                _ => Ok(()),
            }
        }
        Ok(Err(e)) => match crate::tls::tls_failure(&e) {
            Some(reason) => Err(ModeError::Tls { addr, reason }),
            None => {
                warn!(%addr, error = %e, "Redis does not answer yet; the coordinator will connect when it does");
                Ok(())
            }
        },
        Err(_) => {
            warn!(%addr, "Redis does not answer yet; the coordinator will connect when it does");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ConnSettings {
        ConnSettings {
            connect_timeout: Duration::from_millis(100),
            response_timeout: Duration::from_millis(100),
            operation_timeout: Duration::from_millis(100),
            reconnect: Reconnect::Quick,
        }
    }

    #[test]
    fn urls_are_checked_without_connecting() {
        let one = vec!["redis://127.0.0.1:1".to_owned()];
        let two = vec![one[0].clone(), "redis://127.0.0.1:2".to_owned()];
        let no = Tls::default();
        assert!(LazyRedis::check(&one, false, &no).is_ok());
        assert!(LazyRedis::check(&two, true, &no).is_ok());
        assert!(matches!(
            LazyRedis::check(&two, false, &no),
            Err(OpenError::SeveralUrls)
        ));
        assert!(matches!(
            LazyRedis::check(&[], true, &no),
            Err(OpenError::NoUrl)
        ));
        let bad = LazyRedis::check(&["nonsense://".to_owned()], false, &no).unwrap_err();
        assert!(matches!(bad, OpenError::Invalid(_)));
        assert!(bad.to_string().contains("Redis URL"), "{bad}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_settings_need_rediss_urls() {
        let tls = crate::tls::tests_ca();
        let plain = vec!["redis://127.0.0.1:1".to_owned()];
        let secure = vec!["rediss://127.0.0.1:1".to_owned()];
        let e = LazyRedis::check(&plain, false, &tls).unwrap_err();
        assert!(matches!(e, OpenError::TlsNeedsRediss), "{e}");
        assert!(LazyRedis::check(&secure, false, &tls).is_ok());
        assert!(LazyRedis::check(&secure, false, &Tls::default()).is_ok());
        let insecure = vec!["rediss://127.0.0.1:1/#insecure".to_owned()];
        assert!(LazyRedis::check(&insecure, false, &Tls::default()).is_ok());
        let mixed = vec![plain[0].clone(), secure[0].clone()];
        let e = LazyRedis::check(&mixed, true, &Tls::default()).unwrap_err();
        assert!(matches!(e, OpenError::MixedTls), "{e}");
        let seeds = seeds(&secure, false, &tls).unwrap();
        assert!(matches!(
            seeds[0].addr(),
            redis::ConnectionAddr::TcpTls {
                tls_params: Some(_),
                ..
            }
        ));
    }

    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn tls_handles_are_made_for_a_server_a_cluster_and_sentinels() {
        let tls = crate::tls::tests_ca();
        let secure = vec!["rediss://:pw@127.0.0.1:1".to_owned()];
        let one = LazyRedis::open(&secure, false, &settings(), &tls).unwrap();
        let shown = format!("{one:?}");
        assert!(
            !shown.contains("pw") && shown.contains("tls: true"),
            "{shown}"
        );
        assert!(LazyRedis::open(&secure, true, &settings(), &tls).is_ok());
        let target = SentinelTarget {
            sentinels: vec![("127.0.0.1".into(), 1)],
            master_name: "m".into(),
            username: None,
            password: None,
            tls: true,
        };
        let plain_master = "redis://sentinel-master/";
        assert!(LazyRedis::open_sentinel(&target, plain_master, &settings(), &tls).is_ok());
        let no_tls = SentinelTarget {
            tls: false,
            ..target
        };
        let e = LazyRedis::open_sentinel(&no_tls, plain_master, &settings(), &tls).unwrap_err();
        assert!(matches!(e, OpenError::TlsNeedsRediss), "{e}");
        let tls_master = "rediss://sentinel-master/";
        assert!(LazyRedis::open_sentinel(&no_tls, tls_master, &settings(), &tls).is_ok());
    }

    #[tokio::test]
    async fn a_handle_is_made_without_a_server_and_fails_its_first_command() {
        let url = vec!["redis://127.0.0.1:1".to_owned()];
        let mut redis = LazyRedis::open(&url, false, &settings(), &Tls::default()).unwrap();
        assert!(!redis.is_cluster());
        assert!(!format!("{redis:?}").contains("127.0.0.1"));
        let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut redis).await;
        assert!(r.is_err());
        let cluster = LazyRedis::open(&url, true, &settings(), &Tls::default()).unwrap();
        assert!(cluster.is_cluster());
        assert!(cluster.get().await.is_err());
    }
}
