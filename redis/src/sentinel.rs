//! A Redis connection that finds its master through Redis Sentinel.
//!
//! [`SentinelRedis`] asks the sentinels for the master of a named service (redis-rs's
//! [`redis::sentinel`] support: `SENTINEL MASTERS`, then `ROLE` on the candidate, so a node
//! that no longer considers itself master is never used), connects one multiplexed
//! connection to it and hands out cheap [`SentinelConn`] clones of it. A command that fails
//! in a way that says the master is gone or was demoted — a connection error, a timeout, or a
//! `READONLY` reply from a node that became a replica — drops that connection; the next
//! command asks the sentinels again. Nothing is retried here: the failed command returns its
//! error, and the caller's own retry (a heartbeat, a worker's next read) lands on the new
//! master once the sentinels have promoted one.
//!
//! Connections that need their own socket (blocking reads, `WATCH`) take the master's address
//! from [`SentinelRedis::master`] and report a failure with [`SentinelRedis::report`].
//!
//! Errors are not the only signal: the process-wide [`crate::watch`] tells every handle of a
//! master switch as soon as the sentinels announce it. The connection in use is then dropped,
//! commands on clones of it fail unsent ([`is_switched`]), [`SentinelRedis::is_live`] turns
//! false for connections made from it, and [`SentinelRedis::left`] wakes subscribers, which
//! resubscribe on the new master (PROTOCOL §19).

use crate::watch::{Follower, NamedMaster, Watch, WatchConfig};
use redis::IntoConnectionInfo;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError,
    RedisFuture, RedisResult, ServerErrorKind, Value,
};
use rsc_protocol::redact::{ExposeSecret, SecretString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::{info, warn};

/// Where the sentinels are and how to reach the master they name. (`Debug` hides the
/// passwords: the sentinels' is a [`SecretString`], redis-rs hides the master's.)
#[derive(Clone, Debug)]
pub struct SentinelConfig {
    /// Sentinel addresses (host, port); at least one.
    pub sentinels: Vec<(String, u16)>,
    /// The monitored master's name (`sentinel monitor NAME …`).
    pub master_name: String,
    /// User name for the sentinels (`AUTH`), if they require one.
    pub sentinel_username: Option<String>,
    /// Password for the sentinels, if they require one.
    pub sentinel_password: Option<SecretString>,
    /// User name, password and database number for the master.
    pub master: redis::RedisConnectionInfo,
    /// Time to connect to a sentinel or the master.
    pub connect_timeout: Duration,
    /// Time to wait for one reply of the master.
    pub response_timeout: Duration,
    /// Connect to the sentinels over TLS (verified as [`Self::master_tls`] says, `Secure`
    /// when that is unset).
    pub sentinel_tls: bool,
    /// Connect to the master over TLS: `Secure` verifies its certificate, `Insecure` does
    /// not (tests only). `None`: plain TCP.
    pub master_tls: Option<redis::TlsMode>,
    /// CA and client certificate for the TLS connections (default: the system's roots, no
    /// client certificate).
    pub tls: crate::Tls,
}

/// A master found through Redis Sentinel, as configured: the sentinels, the master's name
/// and the credentials of the sentinels (the master's own come from the Redis URL given
/// beside it, see [`crate::LazyRedis::open_sentinel`]).
#[derive(Clone, Debug)]
pub struct SentinelTarget {
    /// Sentinel addresses.
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// User name for the sentinels.
    pub username: Option<String>,
    /// Password for the sentinels.
    pub password: Option<SecretString>,
    /// Connect to the sentinels over TLS, and to the master too.
    pub tls: bool,
}

/// Wrong sentinel settings (nothing is connected when these are found).
#[derive(Debug, thiserror::Error)]
pub enum SentinelError {
    /// No sentinel address.
    #[error("no sentinel address given")]
    NoSentinel,
    /// An address is not `HOST:PORT`.
    #[error("invalid sentinel address {0:?}: expected HOST:PORT")]
    BadAddress(String),
    /// No master name.
    #[error("the sentinel master name is empty")]
    NoMasterName,
    /// redis-rs refused the settings.
    #[error("invalid sentinel settings: {0}")]
    Invalid(#[source] RedisError),
    /// TLS certificates are given, but neither the sentinels nor the master use TLS.
    #[error("TLS certificates are given but neither the sentinels nor the master use TLS")]
    TlsUnused,
}

/// Parses `HOST:PORT[,HOST:PORT…]` (spaces around commas allowed, `[v6]:port` accepted).
pub fn parse_addrs(list: &str) -> Result<Vec<(String, u16)>, SentinelError> {
    let addrs = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            let (host, port) = a
                .rsplit_once(':')
                .ok_or_else(|| SentinelError::BadAddress(a.to_owned()))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = port
                .parse::<u16>()
                .map_err(|_| SentinelError::BadAddress(a.to_owned()))?;
            if host.is_empty() || port == 0 {
                return Err(SentinelError::BadAddress(a.to_owned()));
            }
            Ok((host.to_owned(), port))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if addrs.is_empty() {
        return Err(SentinelError::NoSentinel);
    }
    Ok(addrs)
}

/// The TLS settings of `config` on `builder`: the sentinels' and the master's.
fn with_tls(
    mut builder: SentinelClientBuilder,
    config: &SentinelConfig,
) -> Result<SentinelClientBuilder, SentinelError> {
    if config.sentinel_tls {
        builder = builder
            .set_client_to_sentinel_tls_mode(config.master_tls.unwrap_or(redis::TlsMode::Secure));
    }
    if let Some(mode) = config.master_tls {
        builder = builder.set_client_to_redis_tls_mode(mode);
    }
    if !config.sentinel_tls && config.master_tls.is_none() {
        return match config.tls.is_set() {
            true => Err(SentinelError::TlsUnused),
            false => Ok(builder),
        };
    }
    #[cfg(feature = "tls")]
    if let Some(certs) = config.tls.certs() {
        if config.sentinel_tls {
            builder = builder.set_client_to_sentinel_certificates(certs.clone());
        }
        if config.master_tls.is_some() {
            builder = builder.set_client_to_redis_certificates(certs);
        }
    }
    #[cfg(not(feature = "tls"))]
    return Err(SentinelError::Invalid(RedisError::from((
        ErrorKind::InvalidClientConfig,
        "TLS to Redis is not built in: enable the `tls` feature of rsc-redis",
    ))));
    #[cfg(feature = "tls")]
    Ok(builder)
}

/// Whether `e` says the connection's master is gone or no longer master: the connection is
/// dropped and the master looked up again.
pub fn is_failover_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly)
                | ErrorKind::Server(ServerErrorKind::MasterDown)
        )
}

fn is_failover_reply(v: &Value) -> bool {
    matches!(v, Value::ServerError(se)
        if matches!(se.kind(), Some(ServerErrorKind::ReadOnly) | Some(ServerErrorKind::MasterDown)))
}

struct Current {
    generation: u64,
    info: ConnectionInfo,
    conn: MultiplexedConnection,
}

struct Inner {
    config: SentinelConfig,
    /// Serialises look-ups (one at a time; the others then find the fresh connection).
    client: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<Current>>,
    generation: AtomicU64,
    lookups: AtomicU64,
    /// How many times the connection in use was abandoned (master lost, demoted or
    /// switched).
    left: AtomicU64,
    /// The generation of the connection in use, 0 while there is none: a connection made
    /// from another generation must not send anything any more.
    live: tokio::sync::watch::Sender<u64>,
    /// The first master found through redis-rs: its TLS settings and credentials, for the
    /// masters the watcher names later.
    template: Mutex<Option<ConnectionInfo>>,
    /// The process-wide watcher of this master's switches, started on first use.
    watch: OnceLock<Arc<Watch>>,
}

/// The host and port of `info`.
fn host_port(info: &ConnectionInfo) -> Option<(&str, u16)> {
    match info.addr() {
        ConnectionAddr::Tcp(h, p) => Some((h.as_str(), *p)),
        ConnectionAddr::TcpTls { host, port, .. } => Some((host.as_str(), *port)),
        _ => None,
    }
}

impl Follower for Inner {
    fn follow(&self, to: &NamedMaster) {
        let mut g = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let stale = g
            .as_ref()
            .is_some_and(|c| host_port(&c.info) != Some((to.host.as_str(), to.port)));
        if stale {
            info!(master = %self.config.master_name, host = %to.host, port = to.port,
                "leaving the old Redis master: its connections send nothing more");
            *g = None;
            self.live.send_replace(0);
            self.left.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The sentinels' connection descriptions (TLS and credentials included).
fn sentinel_infos(config: &SentinelConfig) -> Vec<ConnectionInfo> {
    let mut redis = redis::RedisConnectionInfo::default();
    if let Some(u) = &config.sentinel_username {
        redis = redis.set_username(u);
    }
    if let Some(p) = &config.sentinel_password {
        redis = redis.set_password(p.expose_secret());
    }
    config
        .sentinels
        .iter()
        .filter_map(|(h, p)| {
            let addr = match config.sentinel_tls {
                true => ConnectionAddr::TcpTls {
                    host: h.clone(),
                    port: *p,
                    insecure: config.master_tls == Some(redis::TlsMode::Insecure),
                    tls_params: None,
                },
                false => ConnectionAddr::Tcp(h.clone(), *p),
            };
            let info = addr
                .into_connection_info()
                .ok()?
                .set_redis_settings(redis.clone());
            Some(config.tls.apply(info.clone()).unwrap_or(info))
        })
        .collect()
}

/// The error a connection to an old master returns instead of sending (an I/O kind: the
/// callers' failover handling applies; [`is_switched`] tells it).
pub fn switched_error() -> RedisError {
    RedisError::from((ErrorKind::Io, SWITCHED))
}

/// Whether `e` is the refusal of a connection to a master the sentinels no longer name
/// (nothing was sent).
pub fn is_switched(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Io && e.to_string().contains(SWITCHED)
}

const SWITCHED: &str = "the sentinels named a new Redis master: not sent to the old one";

/// redis-rs's look-up error, said as an operator needs it: "not found" there means that no
/// sentinel named a reachable master right now (the master is down, or being failed over),
/// not that the name is unknown.
fn explain_lookup(e: RedisError, master_name: &str) -> RedisError {
    if e.kind() != ErrorKind::MasterNameNotFoundBySentinel {
        return e;
    }
    RedisError::from((
        ErrorKind::Io,
        "no reachable master",
        format!(
            "the sentinels name no reachable master for {master_name:?} right now (the master \
             is down or being failed over; checked again on next use)"
        ),
    ))
}

/// A master found through the sentinels; connects on first use, cheap to clone.
#[derive(Clone)]
pub struct SentinelRedis(Arc<Inner>);

impl std::fmt::Debug for SentinelRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelRedis")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

impl SentinelRedis {
    /// A handle for `config`; fails only on wrong settings (nothing is connected yet).
    pub fn open(config: SentinelConfig) -> Result<Self, SentinelError> {
        if config.sentinels.is_empty() {
            return Err(SentinelError::NoSentinel);
        }
        if config.master_name.trim().is_empty() {
            return Err(SentinelError::NoMasterName);
        }
        let mut builder = SentinelClientBuilder::new(
            config
                .sentinels
                .iter()
                .map(|(h, p)| match config.sentinel_tls {
                    true => ConnectionAddr::TcpTls {
                        host: h.clone(),
                        port: *p,
                        insecure: false,
                        tls_params: None,
                    },
                    false => ConnectionAddr::Tcp(h.clone(), *p),
                }),
            config.master_name.clone(),
            SentinelServerType::Master,
        )
        .map_err(SentinelError::Invalid)?
        .set_client_to_redis_db(config.master.db());
        builder = with_tls(builder, &config)?;
        if let Some(u) = config.master.username() {
            builder = builder.set_client_to_redis_username(u);
        }
        if let Some(p) = config.master.password() {
            builder = builder.set_client_to_redis_password(p);
        }
        if let Some(u) = &config.sentinel_username {
            builder = builder.set_client_to_sentinel_username(u);
        }
        if let Some(p) = &config.sentinel_password {
            builder = builder.set_client_to_sentinel_password(p.expose_secret());
        }
        let client = builder.build().map_err(SentinelError::Invalid)?;
        Ok(SentinelRedis(Arc::new(Inner {
            config,
            client: tokio::sync::Mutex::new(client),
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            left: AtomicU64::new(0),
            live: tokio::sync::watch::Sender::new(0),
            template: Mutex::new(None),
            watch: OnceLock::new(),
        })))
    }

    /// The configuration.
    pub fn config(&self) -> &SentinelConfig {
        &self.0.config
    }

    /// How many times the master was looked up through the sentinels (1 after the first
    /// connection, one more after each failover seen).
    pub fn lookups(&self) -> u64 {
        self.0.lookups.load(Ordering::Relaxed)
    }

    fn cached(&self) -> Option<(u64, ConnectionInfo, MultiplexedConnection)> {
        let g = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(|c| (c.generation, c.info.clone(), c.conn.clone()))
    }

    /// The current master connection, looked up through the sentinels when there is none.
    pub async fn get(&self) -> RedisResult<SentinelConn> {
        let (generation, _, conn) = self.resolve().await?;
        Ok(SentinelConn {
            owner: self.clone(),
            generation,
            conn,
        })
    }

    /// The current master's address and connection number, looked up when unknown; for a
    /// caller that opens its own connection to it (report its failures with
    /// [`Self::report`]).
    pub async fn master(&self) -> RedisResult<(u64, ConnectionInfo)> {
        let (generation, info, _) = self.resolve().await?;
        Ok((generation, info))
    }

    /// Reports that a command on connection `generation` failed with `e`: when `e` says the
    /// master is gone or demoted, the next use looks the master up again.
    pub fn report(&self, generation: u64, e: &RedisError) {
        if is_failover_error(e) {
            self.forget(generation, e);
        }
    }

    fn forget(&self, generation: u64, why: &dyn std::fmt::Display) {
        let mut g = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|c| c.generation == generation) {
            warn!(
                master = %self.0.config.master_name,
                error = %why,
                "Redis master lost or demoted: asking the sentinels again on next use"
            );
            *g = None;
            self.0.live.send_replace(0);
            self.0.left.fetch_add(1, Ordering::Relaxed);
            if let Some(w) = self.0.watch.get() {
                w.poke();
            }
        }
    }

    /// How many times the connection in use was abandoned so far (its master lost, demoted
    /// or switched). A caller that sends through the handle (a new connection each time)
    /// and must know when what it wrote may have been lost compares it between commands.
    pub fn masters_left(&self) -> u64 {
        self.0.left.load(Ordering::Relaxed)
    }

    /// Whether connection `generation` is still the one in use: `false` once the master was
    /// lost, demoted or switched (a connection made from it must then send nothing more).
    pub fn is_live(&self, generation: u64) -> bool {
        *self.0.live.borrow() == generation
    }

    /// Resolves when connection `generation` is no longer the one in use (for a
    /// subscriber connection made from [`Self::master`], which then reconnects).
    pub async fn left(&self, generation: u64) {
        let mut rx = self.0.live.subscribe();
        let _ = rx.wait_for(|g| *g != generation).await;
    }

    /// The master the process-wide watcher last heard the sentinels name (see
    /// [`crate::watch`]); `None` before the first answer.
    pub fn named(&self) -> Option<NamedMaster> {
        self.0.watch.get().and_then(|w| w.current())
    }

    /// The process-wide watcher of this master, started on first use.
    fn watch(&self) -> &Arc<Watch> {
        self.0.watch.get_or_init(|| {
            let cfg = &self.0.config;
            let w = Watch::shared(&WatchConfig {
                sentinels: sentinel_infos(cfg),
                master_name: cfg.master_name.clone(),
                timeout: cfg.connect_timeout,
            });
            let me: Arc<dyn Follower> = self.0.clone();
            w.follow(Arc::downgrade(&me));
            w
        })
    }

    /// Where the master is: the watcher's address once known (with the first look-up's TLS
    /// settings and credentials), else redis-rs's look-up (`SENTINEL MASTERS`, then `ROLE`).
    async fn locate(&self, client: &mut SentinelClient) -> RedisResult<ConnectionInfo> {
        let template = self
            .0
            .template
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let found = match template {
            Some(t) => t,
            None => {
                let found = client
                    .async_get_client()
                    .await
                    .map_err(|e| explain_lookup(e, &self.0.config.master_name))?;
                let info = found.get_connection_info().clone();
                *self.0.template.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.clone());
                return Ok(match self.watch().current() {
                    Some(m) => crate::tls::same_tls_at(&info, m.host, m.port),
                    None => info,
                });
            }
        };
        match self.watch().current() {
            Some(m) => Ok(crate::tls::same_tls_at(&found, m.host, m.port)),
            None => {
                let info = client
                    .async_get_client()
                    .await
                    .map_err(|e| explain_lookup(e, &self.0.config.master_name))?;
                Ok(info.get_connection_info().clone())
            }
        }
    }

    /// Connects to `info` and checks that it calls itself master.
    async fn connect(&self, info: &ConnectionInfo) -> RedisResult<MultiplexedConnection> {
        let cfg = &self.0.config;
        let mut conn = redis::Client::open(info.clone())?
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(cfg.connect_timeout))
                    .set_response_timeout(Some(cfg.response_timeout)),
            )
            .await?;
        let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
        if is_master_role(&role) {
            return Ok(conn);
        }
        self.watch().poke();
        Err(RedisError::from((
            ErrorKind::Io,
            "not a master",
            format!(
                "{} is not (or no longer) a master: the sentinels are asked again",
                info.addr()
            ),
        )))
    }

    async fn resolve(&self) -> RedisResult<(u64, ConnectionInfo, MultiplexedConnection)> {
        // Started here: the watcher needs the runtime, which `open` may run without.
        self.watch();
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let mut client = self.0.client.lock().await;
        // Another task may have looked it up while this one waited.
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let cfg = &self.0.config;
        // Bounded: each sentinel and the candidate master get a connect timeout.
        let bound = cfg.connect_timeout * (cfg.sentinels.len() as u32 + 2);
        let lookup = async {
            let info = self.locate(&mut client).await?;
            let conn = self.connect(&info).await?;
            Ok::<_, RedisError>((info, conn))
        };
        let (info, conn) = match tokio::time::timeout(bound, lookup).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(RedisError::from((
                    ErrorKind::Io,
                    "timed out asking the sentinels for the master",
                )));
            }
        };
        let mut current = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        // The watcher may have moved on while this connected (a master that was frozen and
        // answers again): checked under the lock its switches take, so that a switch either
        // finds this connection and drops it or is seen here.
        if let (Some(named), Some(at)) = (self.watch().current(), host_port(&info))
            && !named.is_at(at.0, at.1)
        {
            return Err(switched_error());
        }
        self.0.lookups.fetch_add(1, Ordering::Relaxed);
        let generation = self.0.generation.fetch_add(1, Ordering::Relaxed) + 1;
        info!(master = %cfg.master_name, addr = %info.addr(), generation, "Redis master found through the sentinels");
        *current = Some(Current {
            generation,
            info: info.clone(),
            conn: conn.clone(),
        });
        self.0.live.send_replace(generation);
        Ok((generation, info, conn))
    }
}

/// Whether a `ROLE` reply says master.
fn is_master_role(v: &Value) -> bool {
    match v {
        Value::Array(items) => {
            matches!(items.first(), Some(Value::BulkString(b)) if b == b"master")
        }
        _ => false,
    }
}

/// One use of the master connection of a [`SentinelRedis`] (a multiplexed connection: clones
/// share one socket). A failure that says the master is gone or demoted makes the next
/// [`SentinelRedis::get`] look the master up again.
#[derive(Clone)]
pub struct SentinelConn {
    owner: SentinelRedis,
    generation: u64,
    conn: MultiplexedConnection,
}

impl SentinelConn {
    fn check(&self, r: &RedisResult<Value>) {
        match r {
            Err(e) => self.owner.report(self.generation, e),
            Ok(v) if is_failover_reply(v) => self.owner.forget(self.generation, &"READONLY reply"),
            Ok(_) => {}
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if !self.owner.is_live(self.generation) {
                return Err(switched_error());
            }
            let r = self.conn.req_packed_command(cmd).await;
            self.check(&r);
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if !self.owner.is_live(self.generation) {
                return Err(switched_error());
            }
            let r = self.conn.req_packed_commands(pipeline, offset, count).await;
            match &r {
                Err(e) => self.owner.report(self.generation, e),
                Ok(values) if values.iter().any(is_failover_reply) => {
                    self.owner.forget(self.generation, &"READONLY reply")
                }
                Ok(_) => {}
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.owner.0.config.master.db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_addrs("a:1, b:26379 ,").unwrap(),
            vec![("a".to_owned(), 1), ("b".to_owned(), 26379)]
        );
        assert_eq!(parse_addrs("[::1]:5").unwrap(), vec![("::1".to_owned(), 5)]);
        assert!(matches!(parse_addrs(" , "), Err(SentinelError::NoSentinel)));
        assert!(matches!(
            parse_addrs("a"),
            Err(SentinelError::BadAddress(_))
        ));
        assert!(matches!(
            parse_addrs("a:x"),
            Err(SentinelError::BadAddress(_))
        ));
        assert!(matches!(
            parse_addrs(":1"),
            Err(SentinelError::BadAddress(_))
        ));
    }

    #[test]
    fn readonly_and_connection_errors_trigger_a_new_lookup() {
        let ro = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(is_failover_error(&ro));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(is_failover_error(&io));
        let wrong = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE",
        ));
        assert!(!is_failover_error(&wrong));
    }

    #[test]
    fn settings_are_checked_without_connecting() {
        let cfg = SentinelConfig {
            sentinels: vec![("127.0.0.1".into(), 1)],
            master_name: "m".into(),
            sentinel_username: None,
            sentinel_password: Some("secret".into()),
            master: redis::RedisConnectionInfo::default(),
            connect_timeout: Duration::from_millis(100),
            response_timeout: Duration::from_millis(100),
            sentinel_tls: false,
            master_tls: None,
            tls: crate::Tls::default(),
        };
        let r = SentinelRedis::open(cfg.clone()).unwrap();
        assert!(!format!("{r:?}").contains("secret"));
        assert!(matches!(
            SentinelRedis::open(SentinelConfig {
                master_name: " ".into(),
                ..cfg.clone()
            }),
            Err(SentinelError::NoMasterName)
        ));
        assert!(matches!(
            SentinelRedis::open(SentinelConfig {
                sentinels: vec![],
                ..cfg
            }),
            Err(SentinelError::NoSentinel)
        ));
    }
}
