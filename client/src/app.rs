//! The consumer application: runs every listener's members until shutdown.

use crate::config::ClientConfig;
use crate::consumer::heartbeats::Heartbeats;
use crate::consumer::member::MemberRuntime;
use crate::consumer::wake::WakeSignals;
use crate::consumer::{MemberShared, PauseState, WorkerMetrics};
use crate::error::{ClientError, ConfigError};
use crate::listener::Listener;
use crate::state::DataMap;
use rsc_api::CoordinatorClient;
use rsc_protocol::ClientInfo;
use rsc_protocol::names::validate_name;
use rsc_redis::LazyRedis;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Runs listeners: for each, `concurrency` members of its group, until SIGTERM / Ctrl-C (or
/// [`AppHandle::shutdown`]); then finishes in-flight messages, acknowledges them, and leaves
/// the groups so that the shards move on at once.
///
/// ```no_run
/// use rsc_client::prelude::*;
///
/// #[stream_listener(group = "billing", stream = "orders", concurrency = 4)]
/// async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> {
///     println!("{} from shard {}", msg.payload(), msg.shard());
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), ClientError> {
///     // RSC_COORDINATOR_URL, RSC_REDIS_URL, RSC_TOKEN, POD_IP / POD_NAME from the environment;
///     // every #[stream_listener] function of the program.
///     ConsumerApp::from_env()?.run().await
/// }
/// ```
pub struct ConsumerApp {
    config: ClientConfig,
    listeners: Vec<Listener>,
    handle: AppHandle,
    /// Where the ops endpoints listen ([`ConsumerAppBuilder::ops`]).
    #[cfg(feature = "ops")]
    ops: Option<std::net::SocketAddr>,
}

/// Controls a running [`ConsumerApp`] from elsewhere: pause, resume, shut down; tells
/// whether it is ready.
#[derive(Debug, Clone)]
pub struct AppHandle {
    shutdown: CancellationToken,
    paused: Arc<HashMap<String, Arc<PauseState>>>,
    readiness: Arc<crate::consumer::readiness::Readiness>,
}

impl AppHandle {
    /// Why the app is not ready to work its share of the stream (`None`: it is): it is
    /// shutting down (`"shutting down"`), its data Redis does not answer (the reason begins
    /// with `data Redis`), or a member has not joined its group (yet, or again after a
    /// self-fence, a rejoin or while the data Redis was away). What `/readyz` reports with
    /// the `ops` feature.
    pub fn not_ready(&self) -> Option<String> {
        if self.shutdown.is_cancelled() {
            return Some("shutting down".into());
        }
        self.readiness.not_ready()
    }

    /// Starts a graceful shutdown (as SIGTERM does).
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Stops handling new messages of a listener (by name), in this process only; its
    /// members keep their shards and keep heartbeating. Returns `false` for an unknown
    /// listener. To pause a group everywhere, durably, use the coordinator's group pause
    /// (`rsc-coordinator group pause G`).
    pub fn pause(&self, listener: &str) -> bool {
        self.set_paused(listener, true)
    }

    /// Resumes a listener paused with [`Self::pause`] (a group paused by an operator stays
    /// paused). Returns `false` for an unknown listener.
    pub fn resume(&self, listener: &str) -> bool {
        self.set_paused(listener, false)
    }

    /// Whether a listener is paused, by [`Self::pause`] or by an operator's pause of its
    /// group (`None` if unknown).
    pub fn is_paused(&self, listener: &str) -> Option<bool> {
        self.paused.get(listener).map(|s| s.is_paused())
    }

    /// Whether a listener's group is paused by an operator (as the last heartbeat answer
    /// said; `None` if the listener is unknown).
    pub fn is_group_paused(&self, listener: &str) -> Option<bool> {
        self.paused.get(listener).map(|s| s.by_group())
    }

    fn set_paused(&self, listener: &str, on: bool) -> bool {
        match self.paused.get(listener) {
            Some(s) => {
                s.set_by_app(on);
                info!(listener, paused = on, "listener pause state changed");
                true
            }
            None => false,
        }
    }
}

/// Builds a [`ConsumerApp`]: connection settings, listeners, and the state their handlers
/// share.
#[derive(Debug, Default)]
pub struct ConsumerAppBuilder {
    config: ClientConfig,
    listeners: Vec<Listener>,
    data: DataMap,
    /// A variable of the environment that could not be read ([`Self::build`] reports it).
    env_error: Option<ConfigError>,
    /// Where the ops endpoints listen ([`Self::ops`]).
    #[cfg(feature = "ops")]
    ops: Option<std::net::SocketAddr>,
    /// Where listener settings are overridden from (the environment and its file); `None`
    /// for a builder made from a configuration alone.
    overrides: Option<crate::overrides::Sources>,
}

impl ConsumerAppBuilder {
    /// Starts from the environment ([`ClientConfig::from_env`]).
    pub fn from_env() -> Self {
        let mut builder = Self::with_config(ClientConfig::from_env());
        builder.env_error = crate::config::env_error(|k| std::env::var(k).ok());
        builder.overrides = Some(crate::overrides::Sources::from_env());
        builder
    }

    /// Starts from a configuration. Listener settings are not overridden from the
    /// environment (unlike [`Self::from_env`]'s), only from a file given with
    /// [`Self::config_file`].
    pub fn with_config(config: ClientConfig) -> Self {
        ConsumerAppBuilder {
            config,
            listeners: Vec::new(),
            data: DataMap::default(),
            env_error: None,
            #[cfg(feature = "ops")]
            ops: None,
            overrides: None,
        }
    }

    crate::config::connection_setters!();

    /// Overrides listener settings from this TOML file (instead of the one `RSC_CONFIG_FILE`
    /// names): `[listeners.<name>]` sections, and with `RSC_PROFILE` its
    /// `[profiles.<profile>.listeners.<name>]` section; `RSC_LISTENER_<NAME>_<SETTING>`
    /// variables still take precedence. GUIDE "Configuration outside the code".
    pub fn config_file(mut self, path: impl Into<String>) -> Self {
        self.overrides.get_or_insert_with(Default::default).file = Some(path.into());
        self
    }

    /// Serves the ops endpoints on `addr` while the app runs (feature `ops`, see
    /// [`crate::ops`]): `/healthz`, `/readyz` (200 once every member joined and the data Redis
    /// answers; 503 with the reason otherwise, and from the start of a graceful shutdown) and
    /// `/metrics` (Prometheus text). Installs the metrics recorder now
    /// ([`crate::ops::install_metrics`]), so that every metric of the app is in it.
    #[cfg(feature = "ops")]
    pub fn ops(mut self, addr: std::net::SocketAddr) -> Self {
        if let Err(e) = crate::ops::install_metrics() {
            tracing::warn!(error = %e, "/metrics will answer 404");
        }
        self.ops = Some(addr);
        self
    }

    /// This process's identity in member ids (default: `POD_IP`, else `POD_NAME`, else
    /// `<HOSTNAME>-<process id>`; see [`ClientConfig::from_env`]).
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.config.instance_id = Some(id.into());
        self
    }

    /// Static membership under `id`, an identity that survives restarts (e.g. a
    /// StatefulSet's pod name; from the environment: `RSC_STATIC_MEMBERSHIP=true` with
    /// `POD_NAME`). See [`ClientConfig::static_membership`].
    pub fn static_instance_id(mut self, id: impl Into<String>) -> Self {
        self.config.instance_id = Some(id.into());
        self.config.static_membership = true;
        self
    }

    /// Bounds a graceful shutdown (default 25 s); see [`ClientConfig::shutdown_timeout`].
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_timeout = timeout;
        self
    }

    /// How long the data Redis may stay unreachable before the app's members give their
    /// shards back (default 15 s, or `RSC_DATA_REDIS_GRACE_MS`); see
    /// [`ClientConfig::data_redis_grace`].
    pub fn data_redis_grace(mut self, grace: Duration) -> Self {
        self.config.data_redis_grace = grace;
        self
    }

    /// Whether the app's members send their heartbeats together, in one
    /// `POST /v1/heartbeats` request per interval, when it runs more than one member
    /// (default: on, unless `RSC_HEARTBEAT_BATCHING=false`); see
    /// [`ClientConfig::heartbeat_batching`].
    pub fn heartbeat_batching(mut self, on: bool) -> Self {
        self.config.heartbeat_batching = on;
        self
    }

    /// Whether the app's shard workers share its data-Redis connection and wait on its
    /// doorbell (default: on, unless `RSC_SHARED_READER=false`); see
    /// [`ClientConfig::shared_reader`].
    pub fn shared_reader(mut self, on: bool) -> Self {
        self.config.shared_reader = on;
        self
    }

    /// Provides a value to every handler that takes a [`crate::Data<T>`] argument of its type
    /// (one value per type: a second call for the same type replaces the first). Call it once
    /// per type: a pool, a configuration, a client.
    pub fn data<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.data.insert(Arc::new(value));
        self
    }

    /// As [`Self::data`], for a value already behind an `Arc`.
    pub fn data_arc<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        self.data.insert(value);
        self
    }

    /// Whether the app opens a wake-up channel so that its members act on group changes at
    /// once rather than at their next heartbeat (default: on, unless
    /// `RSC_WAKE_CHANNEL=false`); see [`ClientConfig::wake_channel`].
    pub fn wake_channel(mut self, on: bool) -> Self {
        self.config.wake_channel = on;
        self
    }

    /// Adds a listener.
    pub fn listener(mut self, listener: Listener) -> Self {
        self.listeners.push(listener);
        self
    }

    /// Adds every function annotated with `#[stream_listener]` in the program.
    pub fn registered_listeners(mut self) -> Self {
        self.listeners.extend(crate::registry::registered());
        self
    }

    /// Checks the configuration and the listeners.
    pub fn build(self) -> Result<ConsumerApp, ClientError> {
        if let Some(e) = self.env_error {
            return Err(e.into());
        }
        let cfg = self.config;
        cfg.check_coordinator()?;
        let instance = cfg.instance_id.clone().ok_or(ConfigError::NoInstanceId {
            static_membership: cfg.static_membership,
        })?;
        cfg.check_data_redis()?;
        if self.listeners.is_empty() {
            return Err(ConfigError::NoListeners.into());
        }
        let mut paused = HashMap::new();
        let data = Arc::new(self.data);
        let mut listeners = self.listeners;
        if let Some(sources) = &self.overrides {
            let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
            let overrides = sources.resolve(&names)?;
            for l in &mut listeners {
                overrides.apply(l)?;
            }
        }
        for l in &mut listeners {
            if let Some(missing) = l.handler.requires().into_iter().find(|k| !data.contains(k)) {
                return Err(ConfigError::MissingData {
                    listener: l.name.clone(),
                    type_name: missing.name,
                }
                .into());
            }
            l.handler = l.handler.bind(data.clone(), l.codec);
            l.service = Some(crate::listener::stack(&l.handler, &l.layers));
            let check = |kind: &'static str, v: &str| {
                validate_name(kind, v).map_err(|e| ConfigError::InvalidName {
                    listener: l.name.clone(),
                    kind,
                    reason: e.to_string(),
                })
            };
            check("group", &l.group)?;
            check("stream", &l.stream)?;
            check(
                "member",
                &format!("{instance}-{}-{}", l.name, l.concurrency.max(1) - 1),
            )?;
            if l.concurrency == 0 {
                return Err(ConfigError::ZeroConcurrency(l.name.clone()).into());
            }
            if paused
                .insert(l.name.clone(), Arc::new(PauseState::new()))
                .is_some()
            {
                return Err(ConfigError::DuplicateListener(l.name.clone()).into());
            }
        }
        let readiness = crate::consumer::readiness::Readiness::new(
            listeners
                .iter()
                .flat_map(|l| (0..l.concurrency).map(|i| format!("{instance}-{}-{i}", l.name))),
        );
        Ok(ConsumerApp {
            config: cfg,
            listeners,
            handle: AppHandle {
                shutdown: CancellationToken::new(),
                paused: Arc::new(paused),
                readiness: Arc::new(readiness),
            },
            #[cfg(feature = "ops")]
            ops: self.ops,
        })
    }
}

impl ConsumerApp {
    /// Configuration from the environment and every `#[stream_listener]` of the program.
    pub fn from_env() -> Result<Self, ClientError> {
        ConsumerAppBuilder::from_env()
            .registered_listeners()
            .build()
    }

    /// A builder, starting from the environment.
    pub fn builder() -> ConsumerAppBuilder {
        ConsumerAppBuilder::from_env()
    }

    /// A handle to pause, resume or stop the app while it runs.
    pub fn handle(&self) -> AppHandle {
        self.handle.clone()
    }

    /// The member ids this app runs, `<instance>-<listener>-<index>`.
    pub fn member_ids(&self) -> Vec<String> {
        let instance = self.config.instance_id.as_deref().unwrap_or_default();
        self.listeners
            .iter()
            .flat_map(|l| (0..l.concurrency).map(move |i| format!("{instance}-{}-{i}", l.name)))
            .collect()
    }

    /// Runs until SIGTERM or Ctrl-C (or [`AppHandle::shutdown`]), then shuts down gracefully.
    pub async fn run(self) -> Result<(), ClientError> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `signal` completes (or [`AppHandle::shutdown`]), then shuts down gracefully.
    /// Returns the first fatal error of a member (e.g. a rejected token), after stopping the
    /// others.
    pub async fn run_until(
        self,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<(), ClientError> {
        crate::logging::install_default();
        let cfg = &self.config;
        let redis = cfg.data_redis()?;
        let coord = cfg.coordinator()?;
        // One wake-up channel and one data-Redis probe for every member of the app; they end
        // with the app.
        let wake_stop = CancellationToken::new();
        let _wake_stop = wake_stop.clone().drop_guard();
        let wake_signals = if cfg.wake_channel {
            crate::consumer::wake::spawn(coord.clone(), self.wake_members(), wake_stop.clone())
        } else {
            Default::default()
        };
        let health = crate::consumer::health::spawn(
            redis.clone(),
            cfg.data_redis_label(),
            cfg.data_redis_grace,
            wake_stop.clone(),
        );
        self.handle
            .readiness
            .watch_data(health.clone(), cfg.data_redis_label());
        #[cfg(feature = "ops")]
        let _ops = match self.ops {
            Some(addr) => Some(crate::ops::serve_app(addr, self.handle.clone()).await?),
            None => None,
        };
        let members = self.spawn_members(&redis, &coord, &wake_signals, &health);
        let first_error = self.supervise(members, signal).await;
        info!("consumer app stopped");
        first_error.map_or(Ok(()), Err)
    }

    /// Every member of the app, for the wake-up channel.
    fn wake_members(&self) -> Vec<rsc_protocol::WakeMember> {
        let instance = self.config.instance_id.clone().unwrap_or_default();
        self.listeners
            .iter()
            .flat_map(|l| {
                let instance = &instance;
                // Both ids passed the name rule when the app was built (the member id of
                // the highest index was checked: the others differ only in digits).
                (0..l.concurrency).filter_map(move |i| {
                    Some(rsc_protocol::WakeMember {
                        group: l.group.parse().ok()?,
                        member_id: format!("{instance}-{}-{i}", l.name).parse().ok()?,
                    })
                })
            })
            .collect()
    }

    /// Starts `concurrency` member runtimes per listener, sharing the data Redis, the
    /// coordinator client and the heartbeat path.
    fn spawn_members(
        &self,
        redis: &LazyRedis,
        coord: &CoordinatorClient,
        wake_signals: &WakeSignals,
        data_health: &tokio::sync::watch::Receiver<crate::consumer::health::DataRedis>,
    ) -> Members {
        let cfg = &self.config;
        let ack_conn = redis.clone();
        let doorbell = cfg
            .shared_reader
            .then(|| crate::consumer::doorbell::Doorbell::start(redis));
        let guards = Arc::new(crate::consumer::fence::GuardConns::new(redis.clone()));
        let member_count: u64 = self
            .listeners
            .iter()
            .map(|l| u64::from(l.concurrency))
            .sum();
        let heartbeats = Heartbeats::for_app(coord.clone(), cfg.heartbeat_batching, member_count);
        let instance = cfg.instance_id.clone().unwrap_or_default();
        let incarnation = Some(new_incarnation(cfg.static_membership));
        let shutdown = &self.handle.shutdown;
        let mut members = Members {
            tasks: JoinSet::new(),
            names: HashMap::new(),
        };
        for l in &self.listeners {
            let metrics = WorkerMetrics::new(&l.group, &l.stream);
            let pause = self.handle.paused[&l.name].clone();
            let paused = pause.subscribe();
            for i in 0..l.concurrency {
                let member_id = format!("{instance}-{}-{i}", l.name);
                let shared = Arc::new(MemberShared {
                    joined: self.handle.readiness.joined(&member_id),
                    group: l.group.clone(),
                    stream: l.stream.clone(),
                    member_id: member_id.clone(),
                    incarnation: incarnation.clone(),
                    static_member: cfg.static_membership,
                    listener: l.clone(),
                    redis: redis.clone(),
                    doorbell: doorbell.clone(),
                    guards: guards.clone(),
                    ack_conn: ack_conn.clone(),
                    paused: paused.clone(),
                    pause: pause.clone(),
                    metrics: metrics.clone(),
                    lease_until: std::sync::Mutex::new(None),
                    ordered: std::sync::atomic::AtomicBool::new(true),
                    data_health: data_health.clone(),
                    data_redis_grace: cfg.data_redis_grace,
                });
                let info = ClientInfo {
                    pod_ip: std::env::var("POD_IP")
                        .ok()
                        .or_else(|| Some(instance.clone())),
                    host: cfg.host.clone(),
                    version: Some(env!("CARGO_PKG_VERSION").into()),
                    concurrency: Some(l.concurrency),
                }
                // The coordinator refuses a longer field (PROTOCOL §4.3).
                .within_limits();
                let wake = wake_signals
                    .get(&(shared.group.clone(), member_id.clone()))
                    .cloned();
                let member =
                    MemberRuntime::new(shared, coord.clone(), heartbeats.clone(), info, wake);
                let task = members.tasks.spawn(member.run(shutdown.child_token()));
                members
                    .names
                    .insert(task.id(), (l.group.clone(), member_id));
            }
        }
        info!(members = members.tasks.len(), coordinator = %coord.current_url(),
            batched_heartbeats = heartbeats.is_batched(), "consumer app started");
        // `heartbeats` drops here: only the members hold the heartbeat path from now on, so
        // the batcher ends with them.
        members
    }

    /// Waits for the members: on `signal` (or a handle's shutdown, or a member's failure)
    /// shuts them all down, within the configured timeout. Returns the first failure.
    async fn supervise(
        &self,
        mut members: Members,
        signal: impl Future<Output = ()> + Send,
    ) -> Option<ClientError> {
        let cfg = &self.config;
        let shutdown = &self.handle.shutdown;
        let mut first_error = None;
        let mut signal = std::pin::pin!(signal);
        let shutdown_deadline = tokio::time::sleep(Duration::MAX);
        let mut shutdown_deadline = std::pin::pin!(shutdown_deadline);
        let mut deadline_armed = false;
        loop {
            if shutdown.is_cancelled() && !deadline_armed {
                deadline_armed = true;
                shutdown_deadline
                    .as_mut()
                    .reset(tokio::time::Instant::now() + cfg.shutdown_timeout);
            }
            tokio::select! {
                // Wakes the loop when a handle (not the signal) asked to stop: arms the deadline.
                _ = shutdown.cancelled(), if !deadline_armed => {}
                _ = &mut shutdown_deadline, if deadline_armed => {
                    error!(
                        remaining = members.tasks.len(),
                        timeout = ?cfg.shutdown_timeout,
                        "graceful shutdown timed out; stopping the remaining members where they are"
                    );
                    first_error.get_or_insert(ClientError::ShutdownTimedOut {
                        remaining: members.tasks.len(),
                        timeout: cfg.shutdown_timeout,
                    });
                    members.tasks.abort_all();
                    while members.tasks.join_next().await.is_some() {}
                    break;
                }
                _ = &mut signal, if !shutdown.is_cancelled() => {
                    info!("shutdown requested: finishing in-flight messages, then leaving");
                    shutdown.cancel();
                }
                done = members.tasks.join_next_with_id() => {
                    let Some(done) = done else { break };
                    if let Some(e) = members.failure(done) {
                        first_error.get_or_insert(e);
                        shutdown.cancel();
                    }
                }
            }
        }
        first_error
    }
}

/// The member tasks of a running app.
struct Members {
    tasks: JoinSet<Result<(), ClientError>>,
    /// Task id → (group, member id): names the member whose task panicked.
    names: HashMap<tokio::task::Id, (String, String)>,
}

impl Members {
    /// Why a member task that ended stopped the app (`None`: it ended well).
    fn failure(
        &mut self,
        done: Result<(tokio::task::Id, Result<(), ClientError>), tokio::task::JoinError>,
    ) -> Option<ClientError> {
        match done {
            Ok((_, Ok(()))) => None,
            Ok((_, Err(e))) => {
                error!(error = %e.chain(), "a member stopped; shutting the app down");
                Some(e)
            }
            Err(e) => {
                let (group, member) = self.names.remove(&e.id()).unwrap_or_default();
                let message = if e.is_panic() {
                    crate::handler::panic_text(e.into_panic().as_ref())
                } else {
                    e.to_string()
                };
                let e = ClientError::Panicked {
                    group,
                    member,
                    shard: None,
                    message,
                };
                error!(error = %e.chain(), "a member task panicked; shutting the app down");
                Some(e)
            }
        }
    }
}

/// A token unique to this run of the process (PROTOCOL §11): the process id and the start
/// time, in hex; a dynamic member's begins with [`rsc_protocol::DYNAMIC_INCARNATION_PREFIX`].
fn new_incarnation(static_membership: bool) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = if static_membership {
        ""
    } else {
        rsc_protocol::DYNAMIC_INCARNATION_PREFIX
    };
    format!("{prefix}{:x}-{nanos:x}", std::process::id())
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
