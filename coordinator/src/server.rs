//! Assembles and runs the server: store, service, expiry sweep, HTTP listener.

use crate::api::{self, AppState};
use crate::audit::{Auditor, RevisionRecordingStore};
use crate::auth::client::{ClientLimiter, Rate, TrustedProxies};
use crate::auth::{AdminRateLimiter, LiveAcl, Security};
use crate::clock::{Clock, SystemClock};
use crate::config::{DATA_REDIS, HttpLimits, STORE_REDIS, ServeConfig, StoreKind};
use crate::metrics::{self, History, InstrumentedStore, LagProbe};
use crate::recovery::{CopyLayer, RecoveryCopy};
use crate::retired::{DELETE_TIMEOUT, RetiredKeyCleaner};
use crate::service::{Coordinator, ServiceConfig};
use crate::store::{
    DUE_BUCKETS, Layered, MemoryStore, MetadataStore, RedisStore, RedisStoreConfig, buckets_of,
};
use crate::tls::{self, ClientCertificate};
use crate::wake::{WakeHub, WakeLimits};
use rsc_protocol::redact::ExposeSecret;
use rsc_redis::{ConnSettings, LazyRedis, Reconnect, RedisSettings};
use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

mod admission;
mod timeouts;

use admission::{Admission, Ticket};
use timeouts::{Activity, Answered, Deadlines, Expiry, InFlight, ReadDeadline, Timeouts, Watched};

/// How long writing owner tokens to the data Redis may take before a heartbeat fails.
const FENCING_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a lag read from the data Redis may take before it is left out.
const LAG_TIMEOUT: Duration = Duration::from_millis(500);

/// Connection settings for a data-Redis user whose operations are bounded by `timeout`.
fn data_settings(timeout: Duration) -> ConnSettings {
    ConnSettings {
        connect_timeout: timeout,
        response_timeout: timeout,
        operation_timeout: timeout,
        reconnect: Reconnect::Quick,
    }
}

/// Builds the store the configuration names.
pub async fn build_store(cfg: &ServeConfig) -> anyhow::Result<Arc<dyn MetadataStore>> {
    Ok(match cfg.store {
        StoreKind::Memory => Arc::new(
            MemoryStore::new()
                .with_tombstone_retention(Duration::from_millis(cfg.tombstone_retention_ms))
                .with_revision_retention(cfg.revisions),
        ),
        StoreKind::Redis => {
            let store = RedisStore::open(RedisStoreConfig {
                redis: cfg.redis.clone(),
                key_prefix: cfg.key_prefix.clone(),
                tombstone_retention: Duration::from_millis(cfg.tombstone_retention_ms),
                wait_replicas: cfg.store_wait_replicas,
                revisions: cfg.revisions,
                ..RedisStoreConfig::default()
            })
            .await?;
            info!(?store, "using the Redis store");
            Arc::new(store)
        }
    })
}

/// The wake-up hub the configuration asks for: in process for the memory store, linked to
/// the other replicas through Redis pub/sub for the Redis store; `None` when turned off
/// (`--wake-max-channels 0`).
fn build_wakeups(cfg: &ServeConfig) -> anyhow::Result<Option<Arc<WakeHub>>> {
    if cfg.wake_max_channels == 0 {
        info!("wake-up channels are turned off: members learn of changes at their heartbeats");
        return Ok(None);
    }
    let limits = WakeLimits {
        max_channels: cfg.wake_max_channels,
        max_channels_per_principal: cfg.wake_max_channels_per_principal,
        idle_timeout: Duration::from_millis(cfg.wake_idle_timeout_ms),
        ..WakeLimits::default()
    };
    Ok(Some(match cfg.store {
        StoreKind::Memory => WakeHub::local(limits),
        StoreKind::Redis => WakeHub::with_redis(limits, wake_redis(cfg)?, &cfg.key_prefix),
    }))
}

/// The wake-up hub's connection to the store's Redis: the same server, cluster or
/// sentinel-named master, with the same TLS settings.
fn wake_redis(cfg: &ServeConfig) -> anyhow::Result<LazyRedis> {
    (cfg.redis.open(STORE_REDIS, &WakeHub::REDIS_SETTINGS))
        .map_err(|e| anyhow::anyhow!("wake-up publisher: {e}"))
}

/// Serves until `shutdown` resolves, then drains in-flight requests and returns.
///
/// Logs `listening on ADDR` once the socket is bound (ADDR is the real address, so a
/// `:0` port shows the one the system picked).
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    metrics::prometheus();
    let acl = load_acl(&cfg)?;
    let tls = load_listener_tls(&cfg)?;
    check_data_redis(&cfg).await?;
    let lag = data_redis(&cfg, LAG_TIMEOUT)?.map(|r| Arc::new(LagProbe::new(r, LAG_TIMEOUT)));
    let history = History::new(Duration::from_millis(cfg.history_interval_ms));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // Store latency and errors around any store; audited writes' revisions around that.
    let store: Arc<dyn MetadataStore> = Arc::new(RevisionRecordingStore::new(Arc::new(
        InstrumentedStore::new(build_store(&cfg).await?),
    )));
    // The recovery copy in the data Redis is written after every committed change of a
    // document (PROTOCOL §2.3).
    let copy = recovery_copy(&cfg)?;
    let store = with_copy(store, copy.as_ref());
    let auditor = Auditor::new(store.clone(), clock.clone());
    let (security, clients) = build_security(&cfg, acl.clone(), &auditor)?;
    let wakes = build_wakeups(&cfg)?;
    let coordinator = build_coordinator(&cfg, store, clock, wakes.clone(), copy.clone())?;
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let mut tasks = spawn_background(&cfg, addr, &coordinator, &auditor, lag.clone())?;
    if let Some(copy) = copy {
        tasks.push(tokio::spawn(copy.run_retries(coordinator.store().clone())));
        tasks.push(tokio::spawn(
            coordinator
                .clone()
                .run_recovery_check(RECOVERY_CHECK_EVERY, RUN_ID_PROBE_EVERY),
        ));
    }
    // Refusals alike are merged per interval; the per-address buckets are pruned with it.
    tasks.push(tokio::spawn(auditor.clone().run_refusal_flush(
        Duration::from_millis(cfg.audit_refusal_interval_ms),
        move || clients.prune(),
    )));
    let acceptor = watch_files(tls, acl, &mut tasks);
    let app = api::router(
        AppState::new(api::Shared {
            coordinator,
            security,
            lag,
            history,
        }),
        cfg.body_limit,
    );
    let http = Http::new(app, fit_open_files(cfg.http));
    info!(
        store = ?cfg.store,
        tls = acceptor.is_some(),
        client_certificates = cfg.listener_tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        max_connections = http.limits.max_connections,
        "listening on {addr}"
    );
    // Open wake-up streams would hold a graceful shutdown up: they end first.
    let shutdown = async move {
        shutdown.await;
        if let Some(hub) = &wakes {
            hub.close_all();
        }
    };
    let result = serve_connections(listener, http, acceptor, shutdown).await;
    for task in tasks {
        task.abort();
    }
    info!("stopped");
    result.map_err(Into::into)
}

/// The listener's TLS acceptor (with `tls`), and one task pushed on `tasks` that re-reads
/// every file watched while serving (the certificate, the client CA and CRL, the ACL) on one
/// poll and one SIGHUP handler.
fn watch_files(
    tls: Option<tls::LoadedTls>,
    acl: Option<Arc<LiveAcl>>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Option<TlsAcceptor> {
    let mut watched: Vec<Arc<dyn crate::watch::Reload>> = Vec::new();
    let acceptor = tls.map(|loaded| {
        watched.extend(loaded.reloaders());
        TlsAcceptor::from(Arc::new(loaded.config))
    });
    if let Some(acl) = acl {
        watched.push(acl);
    }
    if !watched.is_empty() {
        tasks.push(tokio::spawn(crate::watch::run(watched)));
    }
    acceptor
}

/// The access layer's settings (PROTOCOL §4, §7): the ACL, the admin rate, the audit, the
/// body limit, the per-address limits and the trusted proxies; and the per-address limiter,
/// to be pruned now and then.
fn build_security(
    cfg: &ServeConfig,
    acl: Option<Arc<LiveAcl>>,
    auditor: &Auditor,
) -> anyhow::Result<(Arc<Security>, Arc<ClientLimiter>)> {
    let nz = |n: u32| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
    let clients = Arc::new(ClientLimiter::new(
        Rate {
            per_s: cfg.client_rate,
            burst: cfg.client_burst,
        },
        Rate {
            per_s: cfg.client_refusal_rate,
            burst: cfg.client_refusal_burst,
        },
    ));
    let proxies = TrustedProxies::parse(cfg.trusted_proxies.as_deref().unwrap_or(""))
        .map_err(|e| anyhow::anyhow!("--trusted-proxies: {e}"))?;
    let security = Security::new(
        acl,
        AdminRateLimiter::new(nz(cfg.admin_rate), nz(cfg.admin_burst)),
        auditor.clone(),
        cfg.body_limit,
    )
    .with_clients(clients.clone(), proxies);
    Ok((Arc::new(security), clients))
}

/// The listener's TLS configuration and what to re-read while serving (the certificate,
/// and with mutual TLS the client CA and CRL files), when the configuration asks for HTTPS.
/// A file that cannot be used stops startup, named.
fn load_listener_tls(cfg: &ServeConfig) -> anyhow::Result<Option<tls::LoadedTls>> {
    let Some(files) = &cfg.listener_tls else {
        return Ok(None);
    };
    let loaded = tls::LoadedTls::load(files).map_err(|e| {
        anyhow::anyhow!("--tls-cert / --tls-key / --tls-client-ca / --tls-client-crl: {e}")
    })?;
    info!(
        cert = %files.cert.display(),
        client_ca = ?files.client_ca,
        client_crl = ?files.client_crl,
        "HTTPS: certificate loaded"
    );
    Ok(Some(loaded))
}

/// The ACL the configuration names, loaded and to be watched for changes; `None` (every
/// request anonymous) without one. A file that cannot be used stops startup, named.
fn load_acl(cfg: &ServeConfig) -> anyhow::Result<Option<Arc<LiveAcl>>> {
    Ok(match &cfg.acl {
        Some(path) => {
            let acl = LiveAcl::load(path)?;
            info!(file = %path.display(), entries = acl.current().len(), "ACL loaded");
            Some(Arc::new(acl))
        }
        None => {
            warn!("no ACL: every request is served as principal `anonymous` with every role");
            None
        }
    })
}

/// Checks that the data Redis (when configured by URL) is reachable and in the mode the
/// configuration says (cluster or not).
async fn check_data_redis(cfg: &ServeConfig) -> anyhow::Result<()> {
    let Some(data) = cfg.data_redis.as_ref().filter(|d| d.sentinel.is_none()) else {
        return Ok(());
    };
    let urls = data.urls();
    rsc_redis::check_mode(
        urls[0].expose_secret(),
        data.cluster,
        "--data-redis-cluster",
        &data_settings(FENCING_TIMEOUT),
        &data.tls(DATA_REDIS)?,
    )
    .await
    .map_err(|e| anyhow::anyhow!("data Redis (--data-redis-url): {e}"))?;
    info!(
        servers = urls.len(),
        cluster = data.cluster,
        tls = urls[0].expose_secret().starts_with("rediss://"),
        "using a data Redis"
    );
    Ok(())
}

/// A connection to the data Redis for one user whose operations are bounded by `timeout`
/// (one per user, so that a slow lag read never queues a token write); `None` without a
/// data Redis.
fn data_redis(cfg: &ServeConfig, timeout: Duration) -> anyhow::Result<Option<LazyRedis>> {
    let open = |d: &RedisSettings| d.open(DATA_REDIS, &data_settings(timeout));
    Ok(cfg.data_redis.as_ref().map(open).transpose()?)
}

/// The coordinator over `store`, with owner tokens and seals in the data Redis when there is
/// one, and wake-ups through `wakes`.
fn build_coordinator(
    cfg: &ServeConfig,
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    wakes: Option<Arc<WakeHub>>,
    copy: Option<Arc<RecoveryCopy>>,
) -> anyhow::Result<Coordinator> {
    let fencing = data_redis(cfg, FENCING_TIMEOUT)?
        .map(|r| Arc::new(crate::fencing::OwnerTokens::new(r, FENCING_TIMEOUT)));
    let mut coordinator = Coordinator::new(
        store,
        clock,
        ServiceConfig {
            rollback_window_ms: cfg.rollback_window_ms,
            cache_idle: Duration::from_millis(cfg.tombstone_retention_ms / 2),
            ..ServiceConfig::default()
        },
    );
    if let Some(f) = fencing {
        coordinator = coordinator.with_fencing(f);
    }
    if let Some(r) = data_redis(cfg, FENCING_TIMEOUT)? {
        coordinator =
            coordinator.with_sealer(Arc::new(crate::fencing::Sealer::new(r, FENCING_TIMEOUT)));
    }
    if let Some(hub) = wakes {
        coordinator = coordinator.with_wakeups(hub);
    }
    if let Some(copy) = copy {
        coordinator = coordinator.with_recovery(copy, cfg.store_recovery);
    }
    Ok(coordinator)
}

/// How often a coordinator compares the recovery copy's names with the store's (PROTOCOL
/// §2.3): a lost document nobody asks for is restored within this.
const RECOVERY_CHECK_EVERY: Duration = Duration::from_secs(5);

/// How often a coordinator reads the store servers' run ids (`INFO server`, one command per
/// primary): a change runs the recovery check at once (PROTOCOL §2.3).
const RUN_ID_PROBE_EVERY: Duration = Duration::from_secs(1);

/// The recovery copy in the data Redis (PROTOCOL §2.3); `None` without a data Redis, and
/// for the memory store (which keeps nothing across a restart by design, and whose
/// coordinators are independent: several may share one data Redis).
fn recovery_copy(cfg: &ServeConfig) -> anyhow::Result<Option<Arc<RecoveryCopy>>> {
    if cfg.store != StoreKind::Redis {
        return Ok(None);
    }
    Ok(data_redis(cfg, FENCING_TIMEOUT)?
        .map(|r| Arc::new(RecoveryCopy::new(r, &cfg.key_prefix, FENCING_TIMEOUT))))
}

/// `store`, writing the recovery copy `copy` after each committed change (when there is
/// one).
fn with_copy(
    store: Arc<dyn MetadataStore>,
    copy: Option<&Arc<RecoveryCopy>>,
) -> Arc<dyn MetadataStore> {
    match copy {
        Some(c) => Arc::new(Layered::with_layer(store, CopyLayer(c.clone()))),
        None => store,
    }
}

/// `rsc-coordinator store restore`: restores every stream and group document the store
/// `cfg` names lost from the recovery copy in its data Redis, whatever `--store-recovery`
/// says (PROTOCOL §2.3). Audited like a coordinator's own restore.
pub async fn restore_store(cfg: &ServeConfig) -> anyhow::Result<crate::service::Restored> {
    let Some(copy) = recovery_copy(cfg)? else {
        anyhow::bail!(
            "the recovery copy is kept for the Redis store in the data Redis: give --store redis, \
             the store's --redis-url and --data-redis-url"
        );
    };
    check_data_redis(cfg).await?;
    let store = with_copy(build_store(cfg).await?, Some(&copy));
    let coordinator = build_coordinator(cfg, store, Arc::new(SystemClock), None, Some(copy))?;
    Ok(coordinator.restore_missing(true).await?)
}

/// Starts the background tasks: the retired-key cleaner (with a data Redis), the expiry
/// sweep, the lag history (with a lag probe) and the metrics upkeep. Abort them to stop.
fn spawn_background(
    cfg: &ServeConfig,
    addr: std::net::SocketAddr,
    coordinator: &Coordinator,
    auditor: &Auditor,
    lag: Option<Arc<LagProbe>>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::new();
    if let Some(redis) = data_redis(cfg, DELETE_TIMEOUT)? {
        let cleaner = RetiredKeyCleaner {
            redis,
            delay_ms: cfg.retired_key_delay_ms,
            every: RetiredKeyCleaner::period_for(cfg.retired_key_delay_ms),
        };
        tasks.push(tokio::spawn(
            cleaner.run(coordinator.clone(), auditor.clone()),
        ));
    }
    // The sweep's division of the buckets, which the lag sampler follows too.
    let (buckets_tx, buckets) = tokio::sync::watch::channel((0..DUE_BUCKETS).collect());
    tasks.push(tokio::spawn(sweep_loop(
        coordinator.clone(),
        Duration::from_millis(cfg.sweep_interval_ms),
        format!("{addr}-{:08x}", rand::random::<u32>()),
        buckets_tx,
    )));
    if let Some(probe) = lag {
        let coordinator = coordinator.clone();
        let cfg_history_ms = cfg.history_interval_ms;
        let trimmer = data_redis(cfg, LAG_TIMEOUT)?.map(|r| {
            crate::retention::trimmer::announce();
            crate::retention::trimmer::Trimmer::new(
                r,
                coordinator.store().clone(),
                auditor.clone(),
                LAG_TIMEOUT,
            )
        });
        tasks.push(tokio::spawn(async move {
            let c = &coordinator;
            let list = move || async move { c.list_groups().await.ok() };
            let deps = metrics::history::SampleDeps {
                store: c.store().as_ref(),
                clock: c.clock(),
                probe: &probe,
                buckets,
                after: trimmer.as_ref().map(|t| t as &dyn metrics::AfterTick),
            };
            let history = History::new(Duration::from_millis(cfg_history_ms));
            history.run(list, deps).await
        }));
    }
    tasks.push(tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            metrics::prometheus().run_upkeep();
        }
    }));
    Ok(tasks)
}

/// How long a client may take to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an HTTP/2 connection closed for idleness may take to end after its `GOAWAY`.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);
/// File descriptors kept out of `--max-connections` for everything that is not a client
/// connection: the listener, Redis connections, watched files, the log.
const FD_RESERVE: usize = 256;

/// `limits` with `--max-connections` fitted to the process's open-file limit
/// (`RLIMIT_NOFILE`): the soft limit is raised toward the hard one when the cap needs more,
/// and when even the hard one is too low the cap is lowered to it (with a warning), so that
/// a full house of client connections still leaves [`FD_RESERVE`] descriptors for Redis and
/// files instead of failing their `open` and `connect` calls.
fn fit_open_files(mut limits: HttpLimits) -> HttpLimits {
    #[cfg(unix)]
    {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
            return limits;
        };
        let want = (limits.max_connections + FD_RESERVE) as u64;
        let mut allowed = soft;
        if soft < want && hard > soft {
            let raised = want.min(hard);
            if setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok() {
                info!(
                    from = soft,
                    to = raised,
                    "raised the open-file limit (RLIMIT_NOFILE) for --max-connections"
                );
                allowed = raised;
            }
        }
        let room = usize::try_from(allowed)
            .unwrap_or(usize::MAX)
            .saturating_sub(FD_RESERVE)
            .max(1);
        if room < limits.max_connections {
            warn!(
                max_connections = limits.max_connections,
                open_file_limit = allowed,
                serving = room,
                "the open-file limit is too low for --max-connections: serving at most the \
                 limit minus {FD_RESERVE} connections (raise `ulimit -n` / LimitNOFILE)"
            );
            limits.max_connections = room;
            limits.max_connections_per_ip = limits.max_connections_per_ip.min(room);
        }
    }
    limits
}

/// What every connection is served with: the app, the protocol settings and the timeouts.
struct Http {
    app: axum::Router,
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
    timeouts: Timeouts,
    body_timeout: Duration,
    limits: HttpLimits,
}

impl Http {
    /// `app` served within `limits` (PROTOCOL §4.4).
    fn new(app: axum::Router, limits: HttpLimits) -> Arc<Self> {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        // The head's timeout is kept by `timeouts` (hyper's would also close idle
        // keep-alive connections after it).
        http1
            .header_read_timeout(None)
            .max_header_size(limits.max_header_bytes);
        let mut http2 =
            hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        http2
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            .max_pending_accept_reset_streams(limits.http2_max_pending_reset_streams)
            .max_local_error_reset_streams(limits.http2_max_local_error_reset_streams)
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
        Arc::new(Http {
            app,
            http1,
            http2,
            timeouts: Timeouts {
                header: limits.header_read_timeout,
                idle: limits.idle_timeout,
            },
            body_timeout: limits.body_read_timeout,
            limits,
        })
    }
}

/// One connection's share of the server, held by its task until it ends.
struct Conn {
    http: Arc<Http>,
    /// Changes (its sender is dropped) when shutdown begins.
    signal: tokio::sync::watch::Receiver<()>,
    /// Dropped when the task ends: the server returns once every one is gone.
    _close: tokio::sync::watch::Receiver<()>,
    /// The connection's place under the connection caps.
    _ticket: Ticket,
    /// The peer's address: every request carries it (`ConnectInfo`, PROTOCOL §7).
    peer: SocketAddr,
}

/// Serves `http` on `listener` until `shutdown` resolves, then lets the open connections
/// finish (each is told to close after its request in flight) and returns. Plain HTTP is
/// HTTP/1.1; with `tls` each connection is HTTPS, HTTP/2 or HTTP/1.1 as ALPN chose. A
/// connection over a cap is refused at once (PROTOCOL §4.4).
///
/// This is `axum::serve` with graceful shutdown, on hyper's HTTP/1 connection directly: an
/// idle or streaming connection (a keep-alive heartbeat client, a wake-up channel) costs
/// about 11 KiB instead of about 19 KiB through hyper-util's auto (HTTP/1 + HTTP/2)
/// connection, and the router is shared by all connections rather than rebuilt per
/// connection (`Router::with_state(())`, which cost another ~25 KiB each) — 10,000 wake-up
/// channels thus fit in well under 200 MB.
async fn serve_connections(
    listener: TcpListener,
    http: Arc<Http>,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let admission = Admission::new(
        http.limits.max_connections,
        http.limits.max_connections_per_ip,
    );
    // Dropped when shutdown begins: connections see it and close gracefully.
    let (signal_tx, _) = tokio::sync::watch::channel(());
    // Each connection holds a receiver; the server returns once all are gone.
    let (close_tx, close_rx) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let ticket = match admission.admit(peer.ip()) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                if tls.is_none() {
                    refuse(&stream, refusal);
                }
                continue;
            }
        };
        let conn = Conn {
            http: http.clone(),
            signal: signal_tx.subscribe(),
            _close: close_rx.clone(),
            _ticket: ticket,
            peer,
        };
        // Two kinds of task, not one with a branch: a task's future is as large as its
        // largest state, and a plain connection (a wake-up channel lives for minutes) would
        // carry room for a TLS session and an HTTP/2 connection (about 5.5 KiB).
        match &tls {
            None => tokio::spawn(plain_connection(stream, conn)),
            Some(acceptor) => tokio::spawn(tls_connection(acceptor.clone(), stream, conn)),
        };
    }
    drop(signal_tx);
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
    Ok(())
}

/// Answers a plain connection refused by a cap (`429 RATE_LIMITED`, `Connection: close`)
/// without waiting for anything: what the client has sent already is read first (so that
/// the close is a FIN, not a reset that could destroy the answer), the answer goes into the
/// empty socket buffer, and the caller drops the connection.
fn refuse(stream: &TcpStream, refusal: admission::Refusal) {
    let mut sent = [0u8; 2048];
    for _ in 0..4 {
        match stream.try_read(&mut sent) {
            Ok(n) if n == sent.len() => continue,
            _ => break,
        }
    }
    let _ = stream.try_write(refusal.response());
}

/// The task of one plain connection: HTTP/1.1.
async fn plain_connection(stream: TcpStream, conn: Conn) {
    serve_http1(stream, None, conn).await;
}

/// The task of one TLS connection: the handshake, then HTTP/2 or HTTP/1.1 as ALPN chose.
async fn tls_connection(acceptor: TlsAcceptor, stream: TcpStream, conn: Conn) {
    if let Some((stream, h2, peer)) = handshake(&acceptor, stream).await {
        if h2 {
            serve_http2(stream, peer, conn).await;
        } else {
            serve_http1(stream, peer, conn).await;
        }
    }
}

/// The TLS handshake of one connection: the stream, whether ALPN chose HTTP/2, and the
/// client certificate it presented. `None` (counted, logged at debug) when it fails: a
/// client without the certificate `--tls-client-ca` asks for is refused here, by a TLS
/// alert (PROTOCOL §20).
async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
) -> Option<(
    tokio_rustls::server::TlsStream<TcpStream>,
    bool,
    Option<Arc<ClientCertificate>>,
)> {
    let failed = |reason: &str| {
        ::metrics::counter!("rsc_tls_handshake_errors_total").increment(1);
        tracing::debug!(reason, "TLS handshake failed");
    };
    let stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            failed(&e.to_string());
            return None;
        }
        Err(_) => {
            failed("timed out");
            return None;
        }
    };
    let conn = stream.get_ref().1;
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let peer = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| ClientCertificate::from_der(c.as_ref()))
        .map(Arc::new);
    Some((stream, h2, peer))
}

/// The service of one connection: `http`'s app, with the connection's peer address `addr`
/// (`ConnectInfo`, PROTOCOL §7) and client certificate (when it presented one) in every
/// request's extensions, for authentication (PROTOCOL §8);
/// each request counted in flight on `activity` until its response body is done with, and
/// its body due within the body read timeout.
fn connection_service(
    http: &Http,
    addr: SocketAddr,
    peer: Option<Arc<ClientCertificate>>,
    activity: &Arc<Activity>,
) -> impl hyper::service::Service<
    axum::http::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>>
             + Send
             + 'static,
> + Clone
+ Send
+ 'static {
    use tower::ServiceExt;
    let body_timeout = http.body_timeout;
    let activity = activity.clone();
    let service = http
        .app
        .clone()
        .map_request(move |req: axum::http::Request<hyper::body::Incoming>| {
            let mut req =
                req.map(|body| axum::body::Body::new(ReadDeadline::new(body, body_timeout)));
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(addr));
            if let Some(peer) = &peer {
                req.extensions_mut().insert(peer.clone());
            }
            req
        })
        .map_future(move |answer| {
            let in_flight = InFlight::start(&activity);
            async move {
                answer
                    .await
                    .map(|r| r.map(|body| Answered::body(body, in_flight)))
            }
        });
    hyper_util::service::TowerToHyperService::new(service)
}

/// Serves one HTTP/1.1 connection until it closes, a timeout closes it, or gracefully
/// after shutdown begins.
async fn serve_http1<I>(io: I, peer: Option<Arc<ClientCertificate>>, mut conn: Conn)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let service = connection_service(&conn.http, conn.peer, peer, &activity);
    let io = hyper_util::rt::TokioIo::new(Watched::new(io, activity.clone()));
    let connection = std::pin::pin!(conn.http.http1.serve_connection(io, service));
    let deadlines = Deadlines::new(activity, conn.http.timeouts);
    until_closed(connection, &mut conn.signal, deadlines).await;
}

/// Serves one HTTP/2 connection (TLS, ALPN `h2`) until it closes, a timeout closes it, or
/// gracefully after shutdown begins.
async fn serve_http2<I>(io: I, peer: Option<Arc<ClientCertificate>>, mut conn: Conn)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let service = connection_service(&conn.http, conn.peer, peer, &activity);
    let io = hyper_util::rt::TokioIo::new(io);
    let connection = std::pin::pin!(conn.http.http2.serve_connection(io, service));
    let deadlines = Deadlines::new(activity, conn.http.timeouts);
    until_closed(connection, &mut conn.signal, deadlines).await;
}

/// Drives `conn` until it closes or one of its `deadlines` passes (PROTOCOL §4.4): a request
/// head that did not arrive in time closes it at once, idleness closes it gracefully (for
/// HTTP/2 a `GOAWAY`, for at most [`IDLE_CLOSE_GRACE`]). Once `signal` changes, shuts it down
/// gracefully (the request in flight is answered, then the connection closes); the
/// deadlines still apply meanwhile.
///
/// `conn` comes pinned by the caller: moved into this future it would be stored twice (as
/// the argument, and pinned), and a connection's task is most of its memory.
async fn until_closed<C>(
    mut conn: std::pin::Pin<&mut C>,
    signal: &mut tokio::sync::watch::Receiver<()>,
    deadlines: Deadlines,
) where
    C: hyper_util::server::graceful::GracefulConnection<Error = hyper::Error>,
{
    use std::task::Poll;
    let mut timer = std::pin::pin!(deadlines.timer());
    let mut shutdown = std::pin::pin!(signal.changed());
    let mut stopping = false;
    let ended = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            return Poll::Ready(Ok(r));
        }
        if !stopping && shutdown.as_mut().poll(cx).is_ready() {
            stopping = true;
            conn.as_mut().graceful_shutdown();
            if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                return Poll::Ready(Ok(r));
            }
        }
        // After the connection's poll, which is what moves its activity.
        deadlines.poll_expired(timer.as_mut(), cx).map(Err)
    })
    .await;
    match ended {
        Ok(r) => connection_ended(r),
        Err(Expiry::Header) => {
            ::metrics::counter!("rsc_http_header_timeouts_total").increment(1);
            tracing::debug!("a request head did not arrive in time: connection closed");
        }
        Err(Expiry::Idle) => {
            ::metrics::counter!("rsc_http_idle_closed_total").increment(1);
            tracing::debug!("connection idle: closed");
            conn.as_mut().graceful_shutdown();
            timer
                .as_mut()
                .reset(tokio::time::Instant::now() + IDLE_CLOSE_GRACE);
            let closed = std::future::poll_fn(|cx| match conn.as_mut().poll(cx) {
                Poll::Ready(r) => Poll::Ready(Some(r)),
                Poll::Pending => timer.as_mut().poll(cx).map(|()| None),
            });
            if let Some(r) = closed.await {
                connection_ended(r);
            }
        }
    }
}

/// A connection that ended with an error (the client went away mid-request, a request that
/// does not parse) is logged at debug level: the client's doing, and the client saw it. An
/// HTTP/2 connection ended for a reset flood (`GOAWAY ENHANCE_YOUR_CALM`, over
/// `--http2-max-pending-reset-streams` or `--http2-max-local-error-reset-streams`) is counted
/// in `rsc_http2_flood_goaways_total`.
fn connection_ended(ended: Result<(), hyper::Error>) {
    if let Err(e) = ended {
        let h2 = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<h2::Error>());
        if h2.is_some_and(|h2| h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM)) {
            ::metrics::counter!("rsc_http2_flood_goaways_total").increment(1);
        }
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// How often a coordinator renews its registration and learns who else is live.
const REGISTRY_REFRESH: Duration = Duration::from_secs(1);
/// A registration not renewed for this long has lapsed: the coordinator's deadline-index
/// buckets pass to the others.
const REGISTRY_TTL: Duration = Duration::from_secs(3);

/// Every `every`: sweeps the due groups of this coordinator's deadline-index buckets. Every
/// [`REGISTRY_REFRESH`] it renews its registration; the live coordinators, sorted by id,
/// divide the buckets by rank, so each due group is visited by one of them (and claimed
/// atomically, should two briefly disagree on who is live). Each new division is sent on
/// `share` (the lag sampler divides the streams by it, ARCHITECTURE "How lag is sampled").
async fn sweep_loop(
    coordinator: Coordinator,
    every: Duration,
    id: String,
    share: tokio::sync::watch::Sender<Vec<u32>>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Until the first registration: every bucket (claims keep that safe).
    let mut buckets: Vec<u32> = (0..DUE_BUCKETS).collect();
    let mut registered: Option<std::time::Instant> = None;
    info!(coordinator = %id, "expiry sweep started");
    loop {
        tick.tick().await;
        if registered.is_none_or(|t| t.elapsed() >= REGISTRY_REFRESH) {
            let ttl = REGISTRY_TTL.as_millis() as u64;
            match coordinator
                .store()
                .register_coordinator(&id, coordinator.now_ms(), ttl)
                .await
            {
                Ok(live) => {
                    registered = Some(std::time::Instant::now());
                    let rank = live.iter().position(|c| *c == id).unwrap_or(0);
                    let mine = buckets_of(rank, live.len());
                    ::metrics::gauge!("rsc_coordinators_live").set(live.len() as f64);
                    ::metrics::gauge!("rsc_sweep_buckets").set(mine.len() as f64);
                    if mine != buckets {
                        info!(coordinators = live.len(), rank, buckets = ?mine, "deadline-index buckets divided");
                        share.send_replace(mine.clone());
                        buckets = mine;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "could not renew this coordinator's registration; keeping its buckets")
                }
            }
        }
        match coordinator.sweep(&buckets).await {
            Ok(0) => {}
            Ok(n) => info!(removed = n, "expiry sweep removed members"),
            Err(e) => warn!(error = %e, "expiry sweep failed; retrying next tick"),
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C. The SIGTERM handler is installed when this is called (not
/// when the future is first polled): a SIGTERM that arrives right after `listening on` is
/// logged, before the server polls the future, still starts a graceful shutdown instead of
/// killing the process. Call it within a Tokio runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let term = async move {
            match term {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => info!("Ctrl-C received; shutting down"),
            _ = term => info!("SIGTERM received; shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain connection's task holds no room for a TLS session or an HTTP/2 connection:
    /// an idle wake-up channel is one such task, and 10,000 of them must fit in well under
    /// 200 MB (docs/BENCHMARKS.md, P5').
    #[tokio::test]
    async fn a_plain_connection_carries_no_tls_or_http2_state() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connect = || async { TcpStream::connect(addr).await.expect("connect") };
        let (signal_tx, signal) = tokio::sync::watch::channel(());
        let (_close_tx, close) = tokio::sync::watch::channel(());
        let http = Http::new(axum::Router::new(), HttpLimits::defaults(20_000));
        let admission = Admission::new(10, 10);
        let conn = || Conn {
            http: http.clone(),
            signal: signal.clone(),
            _close: close.clone(),
            _ticket: admission.admit(addr.ip()).expect("admitted"),
            peer: addr,
        };
        let plain = plain_connection(connect().await, conn());
        let acceptor = TlsAcceptor::from(Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(rustls::server::ResolvesServerCertUsingSni::new())),
        ));
        let tls = tls_connection(acceptor, connect().await, conn());
        let (plain, tls) = (std::mem::size_of_val(&plain), std::mem::size_of_val(&tls));
        assert!(
            plain < 2048 && plain * 2 < tls,
            "plain {plain} B, TLS {tls} B"
        );
        drop(signal_tx);
    }
}
