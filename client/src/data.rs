//! The data Redis: one server, a Redis Cluster, or a master found through Redis Sentinel.
//!
//! Two kinds of connection:
//!
//! - [`SharedConn`]: one multiplexed connection shared by every member and worker of an app,
//!   for commands that answer at once (manual acknowledgements, dead letters, drain checks, the
//!   producer's `XADD`s). On a cluster, the redis-rs cluster client routes each command by its
//!   key; a pipeline must stay within one slot.
//! - [`NodeConn`]: a shard worker's own connection, to the node that serves the shard's slot.
//!   A blocking read needs its own connection (a blocked command stalls whatever is queued
//!   behind it), and strict fencing's `WATCH` is connection state. It connects lazily, follows
//!   `MOVED` redirections (slot migrations, failovers), falls back to the seed nodes when its
//!   node is gone, and numbers its connections ([`NodeConn::generation`]) so that a caller
//!   knows when a `WATCH` was lost with a connection.
//!
//! Behind Redis Sentinel both kinds connect to the master the sentinels name; a connection
//! error or a `READONLY` answer (the node was demoted) drops the connection, and the next
//! command asks the sentinels again ([`rsc_redis::sentinel`]).

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use rsc_redis::sentinel::{SentinelConfig, SentinelRedis};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use tracing::{debug, info};

/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a non-blocking command may take on the shared connection.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the data Redis is: seed nodes, and whether it is a cluster.
#[derive(Clone)]
pub(crate) struct DataRedis(Arc<Inner>);

struct Inner {
    seeds: Vec<ConnectionInfo>,
    shared: SharedConn,
    sentinel: Option<SentinelRedis>,
}

/// Where the sentinels are (see [`crate::ClientConfig::redis_sentinel`]).
#[derive(Clone)]
pub(crate) struct Sentinel {
    pub(crate) addrs: Vec<(String, u16)>,
    pub(crate) master: String,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is not printed.
        f.debug_struct("Sentinel")
            .field("addrs", &self.addrs)
            .field("master", &self.master)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for DataRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Connection infos may hold a password: print the mode only.
        f.debug_struct("DataRedis")
            .field("cluster", &matches!(self.0.shared, SharedConn::Cluster(_)))
            .field("sentinel", &self.0.sentinel.is_some())
            .field("seeds", &self.0.seeds.len())
            .finish()
    }
}

impl DataRedis {
    /// Checks the URLs (several only with `cluster`) without connecting.
    pub(crate) fn check(urls: &[String], cluster: bool) -> Result<(), String> {
        Self::seeds(urls, cluster).map(drop)
    }

    fn seeds(urls: &[String], cluster: bool) -> Result<Vec<ConnectionInfo>, String> {
        if urls.is_empty() {
            return Err("no Redis URL".into());
        }
        if urls.len() > 1 && !cluster {
            return Err(format!(
                "{} Redis URLs given: several seed URLs are only accepted with Redis Cluster \
                 (RSC_REDIS_CLUSTER=true or .redis_cluster(true))",
                urls.len()
            ));
        }
        urls.iter()
            .map(|u| {
                u.as_str()
                    .into_connection_info()
                    .map_err(|e| format!("invalid Redis URL {u:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()
    }

    /// Checks the URLs (see [`Self::check`]); connects on first use. Needs a Tokio runtime.
    pub(crate) fn open(
        urls: &[String],
        cluster: bool,
        sentinel: Option<Sentinel>,
    ) -> Result<Self, String> {
        let seeds = Self::seeds(urls, cluster)?;
        if let Some(s) = sentinel {
            let redis = SentinelRedis::open(SentinelConfig {
                sentinels: s.addrs,
                master_name: s.master,
                sentinel_username: None,
                sentinel_password: s.password,
                master: seeds[0].redis_settings().clone(),
                connect_timeout: CONNECT_TIMEOUT,
                response_timeout: RESPONSE_TIMEOUT,
            })
            .map_err(|e| e.to_string())?;
            return Ok(DataRedis(Arc::new(Inner {
                seeds,
                shared: SharedConn::Sentinel(redis.clone()),
                sentinel: Some(redis),
            })));
        }
        let shared = if cluster {
            let client = ClusterClient::builder(seeds.clone())
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(3)
                .build()
                .map_err(|e| format!("invalid Redis Cluster configuration: {e}"))?;
            SharedConn::Cluster(Arc::new(LazyCluster {
                client,
                conn: OnceCell::new(),
            }))
        } else {
            let client = redis::Client::open(seeds[0].clone())
                .map_err(|e| format!("invalid Redis URL {:?}: {e}", urls[0]))?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_connection_timeout(Some(CONNECT_TIMEOUT));
            SharedConn::Single(
                ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| format!("invalid Redis URL {:?}: {e}", urls[0]))?,
            )
        };
        Ok(DataRedis(Arc::new(Inner {
            seeds,
            shared,
            sentinel: None,
        })))
    }

    /// Whether the data Redis is a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.0.shared, SharedConn::Cluster(_))
    }

    /// The shared connection (cheap to clone).
    pub(crate) fn shared(&self) -> SharedConn {
        self.0.shared.clone()
    }

    /// A dedicated connection (see [`NodeConn`]); `response_timeout` must exceed any `BLOCK`
    /// sent on it.
    pub(crate) fn dedicated(&self, response_timeout: Duration) -> NodeConn {
        NodeConn {
            redis: self.clone(),
            node: None,
            seed: 0,
            conn: None,
            generation: 0,
            master: 0,
            response_timeout,
        }
    }
}

/// The shared data-Redis connection: standalone (a reconnecting manager) or a cluster
/// (connected on first use, then routing by key).
#[derive(Clone)]
pub(crate) enum SharedConn {
    /// One Redis server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(Arc<LazyCluster>),
    /// The master Redis Sentinel names.
    Sentinel(SentinelRedis),
}

/// A cluster connection made on first use (a cluster connection needs a node that answers;
/// an app started while Redis is down keeps trying).
pub(crate) struct LazyCluster {
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
}

impl LazyCluster {
    async fn get(&self) -> RedisResult<ClusterConnection> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

impl std::fmt::Debug for SharedConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SharedConn::Single(_) => "SharedConn::Single",
            SharedConn::Cluster(_) => "SharedConn::Cluster",
            SharedConn::Sentinel(_) => "SharedConn::Sentinel",
        })
    }
}

impl ConnectionLike for SharedConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            SharedConn::Single(c) => c.req_packed_command(cmd),
            SharedConn::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_command(cmd).await
            }),
            SharedConn::Sentinel(s) => Box::pin(async move {
                let mut c = s.get().await?;
                c.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            SharedConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            SharedConn::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_commands(pipeline, offset, count).await
            }),
            SharedConn::Sentinel(s) => Box::pin(async move {
                let mut c = s.get().await?;
                c.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            SharedConn::Single(c) => c.get_db(),
            SharedConn::Cluster(_) => 0,
            SharedConn::Sentinel(s) => s.config().master.db(),
        }
    }
}

/// A worker's own connection to the node serving its shard (see the module docs).
pub(crate) struct NodeConn {
    redis: DataRedis,
    /// The node learned from a `MOVED` redirection; `None`: the current seed.
    node: Option<ConnectionInfo>,
    /// The seed tried when no node is known.
    seed: usize,
    conn: Option<MultiplexedConnection>,
    /// Incremented by every new connection.
    generation: u64,
    /// Behind sentinels: the master look-up the connection was made to.
    master: u64,
    response_timeout: Duration,
}

impl NodeConn {
    /// The number of the current connection (0 before the first). A `WATCH` made on
    /// connection `n` holds only while this is still `n`.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    fn target(&self) -> ConnectionInfo {
        match &self.node {
            Some(n) => n.clone(),
            None => self.redis.0.seeds[self.seed % self.redis.0.seeds.len()].clone(),
        }
    }

    async fn connection(&mut self) -> RedisResult<&mut MultiplexedConnection> {
        if self.conn.is_none() {
            let target = match &self.redis.0.sentinel {
                Some(s) => {
                    let (master, info) = s.master().await?;
                    self.master = master;
                    info
                }
                None => self.target(),
            };
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(self.response_timeout));
            let made = async {
                redis::Client::open(target)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            };
            match made.await {
                Ok(c) => {
                    self.generation += 1;
                    self.conn = Some(c);
                }
                Err(e) => {
                    if let Some(s) = &self.redis.0.sentinel {
                        s.report(self.master, &e);
                    }
                    // The node may be gone (failover): start again from the next seed, which
                    // redirects to the slot's new owner.
                    self.node = None;
                    self.seed = self.seed.wrapping_add(1);
                    return Err(e);
                }
            }
        }
        self.conn
            .as_mut()
            .ok_or_else(|| RedisError::from((ErrorKind::Client, "not connected")))
    }

    /// After an error: follow a `MOVED`; drop the connection on anything that is not a
    /// server's error reply (its state, e.g. a `WATCH`, and any reply in flight are unknown).
    fn after_error(&mut self, e: &RedisError) {
        if let Some(s) = &self.redis.0.sentinel {
            s.report(self.master, e);
            if rsc_redis::sentinel::is_failover_error(e) {
                self.conn = None;
                return;
            }
        }
        if let Some((addr, slot)) = moved(e) {
            self.redirect(addr, slot);
        } else if !matches!(e.kind(), ErrorKind::Server(_)) {
            self.conn = None;
        }
    }

    fn redirect(&mut self, addr: &str, slot: u16) {
        let Some((host, port)) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        else {
            self.conn = None;
            return;
        };
        info!(
            node = addr,
            slot, "the shard's slot is served by another node: following"
        );
        let seed = self.redis.0.seeds[0].clone();
        self.node = Some(seed.set_addr(ConnectionAddr::Tcp(host, port)));
        self.conn = None;
    }

    /// Sends `pipeline` on connection `generation` only, never on a newer one (a
    /// transaction guarded by a `WATCH` made there); `None` when that connection is gone.
    /// Replies come back as they are, errors included as [`Value::ServerError`]; a `MOVED`
    /// among them is followed for next time.
    pub(crate) async fn pipeline_on(
        &mut self,
        generation: u64,
        pipeline: &Pipeline,
    ) -> RedisResult<Option<Vec<Value>>> {
        let conn = match self.conn.as_mut() {
            Some(c) if self.generation == generation => c,
            _ => return Ok(None),
        };
        let n = pipeline.len();
        let r = conn.req_packed_commands(pipeline, 0, n).await;
        self.after_pipeline(&r);
        r.map(Some)
    }

    /// Follows a `MOVED` among a pipeline's replies, or handles its error.
    fn after_pipeline(&mut self, r: &RedisResult<Vec<Value>>) {
        match r {
            Ok(values) => {
                let redirect = values.iter().find_map(|v| match v {
                    Value::ServerError(se)
                        if matches!(
                            se.kind(),
                            Some(ServerErrorKind::Moved) | Some(ServerErrorKind::ReadOnly)
                        ) =>
                    {
                        Some(RedisError::from(se.clone()))
                    }
                    _ => None,
                });
                if let Some(e) = redirect {
                    self.after_error(&e);
                }
            }
            Err(e) => self.after_error(e),
        }
    }
}

fn moved(e: &RedisError) -> Option<(&str, u16)> {
    (e.kind() == ErrorKind::Server(ServerErrorKind::Moved))
        .then(|| e.redirect_node())
        .flatten()
}

impl ConnectionLike for NodeConn {
    /// Sends one command; a `MOVED` answer is followed and the command sent again (a
    /// redirected command was not executed).
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut attempt = 0;
            loop {
                attempt += 1;
                // A server's error reply comes back as a value (redis-rs turns it into an
                // error later): a MOVED is one too.
                let r = match self.connection().await?.req_packed_command(cmd).await {
                    Ok(Value::ServerError(se))
                        if matches!(
                            se.kind(),
                            Some(ServerErrorKind::Moved) | Some(ServerErrorKind::ReadOnly)
                        ) =>
                    {
                        Err(RedisError::from(se))
                    }
                    r => r,
                };
                match r {
                    Ok(v) => return Ok(v),
                    Err(e) => {
                        self.after_error(&e);
                        if moved(&e).is_none() || attempt >= 3 {
                            return Err(e);
                        }
                        debug!(attempt, "resending after a MOVED redirection");
                    }
                }
            }
        })
    }

    /// Sends a pipeline (once: some of its commands may have run).
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let r = self
                .connection()
                .await?
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after_pipeline(&r);
            r
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
