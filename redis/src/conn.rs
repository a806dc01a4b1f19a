//! [`LazyRedis`]: one handle for a standalone Redis, a Redis Cluster or a master found
//! through Redis Sentinel, and [`Conn`], the routed connection it hands out.

use crate::sentinel::{SentinelConfig, SentinelConn, SentinelError, SentinelRedis, SentinelTarget};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};
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

enum Backend {
    Single(ConnectionManager),
    /// Connects on first use (a cluster connection needs a node that answers).
    Cluster {
        client: Box<ClusterClient>,
        conn: OnceCell<ClusterConnection>,
    },
    /// Looks the master up through the sentinels on first use and after a failover.
    Sentinel(SentinelRedis),
}

pub(crate) struct Inner {
    backend: Backend,
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
            .finish_non_exhaustive()
    }
}

/// Parses `urls` (one, or with `cluster` several seed nodes) without connecting.
fn seeds(urls: &[String], cluster: bool) -> Result<Vec<ConnectionInfo>, OpenError> {
    if urls.is_empty() {
        return Err(OpenError::NoUrl);
    }
    if !cluster && urls.len() > 1 {
        return Err(OpenError::SeveralUrls);
    }
    urls.iter()
        .map(|u| {
            u.as_str()
                .into_connection_info()
                .map_err(OpenError::Invalid)
        })
        .collect()
}

impl LazyRedis {
    /// Checks `urls` as [`Self::open`] would, without connecting or needing a runtime.
    pub fn check(urls: &[String], cluster: bool) -> Result<(), OpenError> {
        seeds(urls, cluster).map(drop)
    }

    /// A handle for `urls`: one server, or with `cluster` one or more seed nodes. Connects
    /// on first use; fails only on wrong settings. Needs a Tokio runtime.
    pub fn open(
        urls: &[String],
        cluster: bool,
        settings: &ConnSettings,
    ) -> Result<Self, OpenError> {
        let seeds = seeds(urls, cluster)?;
        let backend = if cluster {
            let mut builder = ClusterClient::builder(seeds.clone())
                .connection_timeout(settings.connect_timeout)
                .response_timeout(settings.response_timeout)
                .overall_response_timeout(Some(settings.operation_timeout));
            builder = match settings.reconnect {
                Reconnect::Quick => builder.retries(2).min_retry_wait(10).max_retry_wait(100),
                Reconnect::Patient => builder.retries(3),
            };
            Backend::Cluster {
                client: Box::new(builder.build().map_err(OpenError::Invalid)?),
                conn: OnceCell::new(),
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
    /// password and database number are used on the master (its host is not). Connects on
    /// first use; fails only on wrong settings.
    pub fn open_sentinel(
        target: &SentinelTarget,
        master_url: &str,
        settings: &ConnSettings,
    ) -> Result<Self, OpenError> {
        let master = master_url
            .into_connection_info()
            .map_err(OpenError::Invalid)?;
        let redis = SentinelRedis::open(SentinelConfig {
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
            Backend::Cluster { client, conn } => conn
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
        /// The server's URL.
        url: String,
        /// The option that selects cluster mode.
        flag: String,
    },
    /// A standalone server, configured as a cluster.
    #[error("{url} is not a Redis Cluster node: drop {flag}")]
    NotCluster {
        /// The server's URL.
        url: String,
        /// The option that selects cluster mode.
        flag: String,
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
) -> Result<(), ModeError> {
    let ask = async {
        let client = redis::Client::open(url)?;
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
    let (url, flag) = (url.to_owned(), flag.to_owned());
    match tokio::time::timeout(settings.operation_timeout, ask).await {
        Ok(Ok(info)) => {
            let enabled = info.lines().any(|l| l.trim() == "cluster_enabled:1");
            match (enabled, cluster) {
                (true, false) => Err(ModeError::IsCluster { url, flag }),
                (false, true) => Err(ModeError::NotCluster { url, flag }),
                _ => Ok(()),
            }
        }
        Ok(Err(e)) => {
            warn!(%url, error = %e, "Redis does not answer yet; the coordinator will connect when it does");
            Ok(())
        }
        Err(_) => {
            warn!(%url, "Redis does not answer yet; the coordinator will connect when it does");
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
        assert!(LazyRedis::check(&one, false).is_ok());
        assert!(LazyRedis::check(&two, true).is_ok());
        assert!(matches!(
            LazyRedis::check(&two, false),
            Err(OpenError::SeveralUrls)
        ));
        assert!(matches!(LazyRedis::check(&[], true), Err(OpenError::NoUrl)));
        let bad = LazyRedis::check(&["nonsense://".to_owned()], false).unwrap_err();
        assert!(matches!(bad, OpenError::Invalid(_)));
        assert!(bad.to_string().contains("Redis URL"), "{bad}");
    }

    #[tokio::test]
    async fn a_handle_is_made_without_a_server_and_fails_its_first_command() {
        let url = vec!["redis://127.0.0.1:1".to_owned()];
        let mut redis = LazyRedis::open(&url, false, &settings()).unwrap();
        assert!(!redis.is_cluster());
        assert!(!format!("{redis:?}").contains("127.0.0.1"));
        let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut redis).await;
        assert!(r.is_err());
        let cluster = LazyRedis::open(&url, true, &settings()).unwrap();
        assert!(cluster.is_cluster());
        assert!(cluster.get().await.is_err());
    }
}
