//! One Redis connection handle for a standalone Redis or a Redis Cluster, shared by the
//! metadata store ([`crate::store::RedisStore`]) and the data-Redis users (owner tokens,
//! the lag probe, the retired-key cleaner).
//!
//! [`LazyRedis`] connects on first use (a coordinator started while Redis is down serves
//! and connects when it is up) and is cheap to clone; [`LazyRedis::get`] hands out a
//! [`Conn`], which implements [`ConnectionLike`] over either kind of connection. On a
//! cluster, every command is routed to the node that owns its key's slot (MOVED/ASK
//! handled), multi-key `DEL`/`UNLINK` are split per slot, and a pipeline must stay within
//! one slot: callers that touch several slots send one command per key instead. Behind
//! Redis Sentinel ([`LazyRedis::open_sentinel`]) the master is looked up through the
//! sentinels, and a connection to a master that died or was demoted (`READONLY`) is dropped
//! and the new master looked up on next use.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};
use rsc_redis::sentinel::{SentinelConfig, SentinelConn, SentinelRedis};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use tracing::warn;

/// Timeouts of a [`LazyRedis`].
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time to wait for one reply (the redis-rs default, 500 ms, is raised or lowered here).
    pub response_timeout: Duration,
    /// On a cluster: upper bound of one command, redirections and retries included.
    pub operation_timeout: Duration,
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
    Sentinel(#[from] rsc_redis::sentinel::SentinelError),
}

/// A master found through Redis Sentinel: the sentinels, the master's name and the
/// credentials of the sentinels (the master's own come from the Redis URL).
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// Sentinel addresses.
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// User name for the sentinels.
    pub username: Option<String>,
    /// Password for the sentinels.
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .finish_non_exhaustive()
    }
}

/// One connection handle, standalone or cluster (both multiplex and are cheap to clone).
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

/// A lazily connected standalone Redis or Redis Cluster; cheap to clone (one shared
/// multiplexed connection).
#[derive(Clone)]
pub struct LazyRedis(Arc<Backend>);

impl std::fmt::Debug for LazyRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: do not print them.
        f.debug_struct("LazyRedis")
            .field("cluster", &self.is_cluster())
            .finish_non_exhaustive()
    }
}

impl LazyRedis {
    /// A handle for `urls`: one server, or with `cluster` one or more seed nodes. Connects
    /// on first use; fails only on wrong settings.
    pub fn open(
        urls: &[String],
        cluster: bool,
        settings: &ConnSettings,
    ) -> Result<Self, OpenError> {
        if urls.is_empty() {
            return Err(OpenError::NoUrl);
        }
        if !cluster && urls.len() > 1 {
            return Err(OpenError::SeveralUrls);
        }
        let backend = if cluster {
            let client = ClusterClient::builder(urls.iter().map(String::as_str))
                .connection_timeout(settings.connect_timeout)
                .response_timeout(settings.response_timeout)
                .overall_response_timeout(Some(settings.operation_timeout))
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()
                .map_err(OpenError::Invalid)?;
            Backend::Cluster {
                client: Box::new(client),
                conn: OnceCell::new(),
            }
        } else {
            let client = redis::Client::open(urls[0].as_str()).map_err(OpenError::Invalid)?;
            // One quick reconnect attempt per failed command: an outage answers at once,
            // and the next command tries again (the manager reconnects on demand).
            let cm = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(Some(settings.response_timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(Duration::from_millis(100));
            Backend::Single(
                ConnectionManager::new_lazy_with_config(client, cm).map_err(OpenError::Invalid)?,
            )
        };
        Ok(LazyRedis(Arc::new(backend)))
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
            .map_err(OpenError::Invalid)?
            .redis_settings()
            .clone();
        let redis = SentinelRedis::open(SentinelConfig {
            sentinels: target.sentinels.clone(),
            master_name: target.master_name.clone(),
            sentinel_username: target.username.clone(),
            sentinel_password: target.password.clone(),
            master,
            connect_timeout: settings.connect_timeout,
            response_timeout: settings.response_timeout,
        })?;
        Ok(LazyRedis(Arc::new(Backend::Sentinel(redis))))
    }

    /// Whether this talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(*self.0, Backend::Cluster { .. })
    }

    /// A connection. On a cluster the first call connects (and a failed attempt is retried
    /// by the next call); bound it with a timeout.
    pub async fn get(&self) -> Result<Conn, RedisError> {
        match &*self.0 {
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

/// Checks that the server at `url` is a cluster node exactly when `cluster` is set, over a
/// one-off standalone connection (which works on both kinds of server). A mismatch is an
/// error that names `flag`, the option that selects cluster mode; a server that does not
/// answer within `settings` is logged and accepted (the handle connects when it is up).
pub async fn check_mode(
    url: &str,
    cluster: bool,
    flag: &str,
    settings: &ConnSettings,
) -> Result<(), String> {
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
    match tokio::time::timeout(settings.operation_timeout, ask).await {
        Ok(Ok(info)) => {
            let enabled = info.lines().any(|l| l.trim() == "cluster_enabled:1");
            match (enabled, cluster) {
                (true, false) => Err(format!(
                    "{url} is a Redis Cluster node: start the coordinator with {flag}"
                )),
                (false, true) => Err(format!("{url} is not a Redis Cluster node: drop {flag}")),
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
