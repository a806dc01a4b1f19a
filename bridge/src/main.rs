//! `rsc-bridge`: Redis Stream Coordinator for an application in any language, as a sidecar
//! (docs/BRIDGE.md). It runs `rsc-client` listeners whose handler is an HTTP POST of each
//! entry to the application, as a CloudEvent; the application's answer acknowledges, retries,
//! defers or dead-letters it. It also publishes for the application
//! (`POST /v1/publish/{stream}`) through the routed, fenced, idempotent producer. Every
//! guarantee of the client holds: nothing here speaks the protocol itself.

mod cloudevents;
mod config;
mod deliver;
mod http;
mod outcome;

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser};
use config::Route;
use deliver::Target;
use rsc_client::producer::Producer;
use rsc_client::{Batch, ClientConfig, ConsumerAppBuilder, Listener, Message, Raw, SecretString};
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// Flags; each also a variable of the environment (flag > variable > file > default).
#[derive(Debug, Parser)]
#[command(
    name = "rsc-bridge",
    version,
    about = "Delivers stream entries to a local application as CloudEvents over HTTP, and publishes for it."
)]
struct Args {
    /// The TOML file of the listeners (`[listeners.<name>]`) and the bridge (`[bridge]`).
    #[arg(long = "config", env = "RSC_CONFIG_FILE")]
    config: Option<String>,
    /// The profile of the file whose `[profiles.<profile>.listeners.<name>]` sections apply.
    #[arg(long, env = "RSC_PROFILE")]
    profile: Option<String>,
    /// Listeners set by `RSC_LISTENER_<NAME>_<SETTING>` variables alone (comma-separated).
    #[arg(long, env = "RSC_BRIDGE_LISTENERS", value_delimiter = ',')]
    listeners: Vec<String>,
    /// Where the publish route and `/healthz`, `/readyz`, `/metrics` listen (file: `listen`).
    #[arg(long, env = "RSC_BRIDGE_LISTEN")]
    listen: Option<String>,
    /// The coordinator URL(s), comma-separated.
    #[arg(long, env = "RSC_COORDINATOR_URL")]
    coordinator: Option<String>,
    /// The data Redis URL.
    #[arg(long = "redis-url", env = "RSC_REDIS_URL")]
    redis_url: Option<String>,
    /// This process's identity in member ids (default: POD_IP, else POD_NAME, else host-pid).
    #[arg(long = "instance-id")]
    instance_id: Option<String>,
    /// A file holding the token between the application and the bridge (file:
    /// `app_token_file`); `RSC_BRIDGE_APP_TOKEN` gives it directly.
    #[arg(long = "app-token-file", env = "RSC_BRIDGE_APP_TOKEN_FILE")]
    app_token_file: Option<std::path::PathBuf>,
    /// How long a graceful shutdown may take (in-flight deliveries finish, then the members
    /// leave), in milliseconds.
    #[arg(
        long = "shutdown-timeout-ms",
        env = "RSC_SHUTDOWN_TIMEOUT_MS",
        default_value_t = 25_000
    )]
    shutdown_timeout_ms: u64,
    /// Check the configuration (listeners, connection settings, tokens), print the
    /// listeners, and exit without connecting.
    #[arg(long = "check-config")]
    check_config: bool,
}

/// The default listen address of the bridge's own routes.
const DEFAULT_LISTEN: &str = "127.0.0.1:3500";
/// The default largest publish body.
const DEFAULT_BODY_LIMIT: usize = 1 << 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rsc_client::ops::init_tracing()?;
    rsc_client::install_crypto_provider();
    let (argv, flags) = config::split_listener_flags(std::env::args_os())?;
    let cmd = Args::command().after_help(config::flags_help());
    let args = Args::from_arg_matches(&cmd.get_matches_from(argv))?;
    let file_text = match &args.config {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("configuration file {p}"))?)
        }
        None => None,
    };
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("RSC_LISTENER_"))
        .collect();
    let sources = config::Sources {
        file: args.config.as_deref().zip(file_text.as_deref()),
        profile: args.profile.as_deref().filter(|p| !p.trim().is_empty()),
        declared: args
            .listeners
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        env,
        flags,
    };
    let (routes, file) = config::load(&sources)?;
    let token = app_token(&args, &file)?;
    let mut cfg = ClientConfig::from_env();
    if let Some(c) = &args.coordinator {
        cfg.coordinator_urls = c
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
    }
    if let Some(r) = &args.redis_url {
        cfg.redis.url = Some(r.as_str().into());
    }
    if let Some(id) = &args.instance_id {
        cfg.instance_id = Some(id.clone());
    }
    cfg.shutdown_timeout = Duration::from_millis(args.shutdown_timeout_ms);
    let targets: Vec<Target> = routes
        .iter()
        .map(|r| Target::new(r, token.clone()))
        .collect::<Result<_, _>>()?;
    let mut builder = ConsumerAppBuilder::with_config(cfg.clone());
    for (route, target) in routes.iter().zip(&targets) {
        builder = builder.listener(listener(route, target.clone()));
    }
    let app = builder.build()?;
    if args.check_config {
        for r in &routes {
            println!(
                "listener {}: group {} stream {} -> {}",
                r.name, r.group, r.stream, r.deliver_to
            );
        }
        return Ok(());
    }
    let producer = producer(&cfg)?;
    let listen = args
        .listen
        .clone()
        .or(file.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let shared = http::Shared {
        producer,
        app: app.handle(),
        apps: Arc::new(
            targets
                .iter()
                .map(|t| (t.name().to_owned(), t.state()))
                .collect(),
        ),
        token,
        metrics: rsc_client::ops::install_metrics().ok(),
        body_limit: file.publish_body_limit.unwrap_or(DEFAULT_BODY_LIMIT),
    };
    run(app, shared, &listen, targets).await
}

/// Serves the routes and runs the listeners until SIGTERM / Ctrl-C; then the listeners
/// finish their deliveries in flight and leave, and the routes stop last.
async fn run(
    app: rsc_client::ConsumerApp,
    shared: http::Shared,
    listen: &str,
    targets: Vec<Target>,
) -> anyhow::Result<()> {
    let socket = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let local = socket.local_addr()?;
    info!(addr = %local, "listening on {local}");
    for t in &targets {
        info!(listener = t.name(), deliver_to = %t.deliver_to(), "delivering");
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let probes = tokio::spawn(probe_loop(targets, stop.clone()));
    let server_stop = stop.clone();
    let server = tokio::spawn(async move {
        axum::serve(socket, http::router(shared))
            .with_graceful_shutdown(async move { server_stop.cancelled().await })
            .await
    });
    let result = app.run().await;
    stop.cancel();
    let _ = probes.await;
    server.await??;
    info!("bridge stopped");
    Ok(result?)
}

/// Probes each application every second while the bridge runs (`/readyz`).
async fn probe_loop(targets: Vec<Target>, stop: tokio_util::sync::CancellationToken) {
    loop {
        for t in &targets {
            t.probe().await;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The listener of `route`: each entry (or batch) delivered by `target`.
fn listener(route: &Route, target: Target) -> Listener {
    let l = match route.max_batch {
        Some(n) => Listener::batch(
            route.group.clone(),
            route.stream.clone(),
            move |b: Batch<Raw>| {
                let t = target.clone();
                async move { t.deliver_batch(b).await }
            },
        )
        .max_batch(n)
        .linger(route.linger),
        None => Listener::new(
            route.group.clone(),
            route.stream.clone(),
            move |m: Message<Raw>| {
                let t = target.clone();
                async move { t.deliver(m).await }
            },
        ),
    };
    let l = l
        .name(route.name.clone())
        .concurrency(route.concurrency)
        .key_concurrency(route.key_concurrency)
        .max_retries(route.max_retries)
        .retry_backoff(route.retry_backoff.0, route.retry_backoff.1)
        .retry_stages(&route.retry_stages);
    match route.batch_size {
        Some(n) => l.batch_size(n),
        None => l,
    }
}

/// The producer of the publish route: the environment's settings, with the flags'
/// coordinator and data Redis.
fn producer(cfg: &ClientConfig) -> anyhow::Result<Producer> {
    let urls = cfg.coordinator_urls.join(",");
    let redis = cfg
        .redis
        .url
        .as_ref()
        .map(rsc_client::ExposeSecret::expose_secret);
    let builder = Producer::builder().coordinator(&urls);
    Ok(match redis {
        Some(url) => builder.redis_url(url),
        None => builder,
    }
    .build()?)
}

/// The token between the application and the bridge: `RSC_BRIDGE_APP_TOKEN`, else the file
/// the flag, the variable or the configuration file names.
fn app_token(args: &Args, file: &config::FileBridge) -> anyhow::Result<Option<SecretString>> {
    if let Some(t) = std::env::var("RSC_BRIDGE_APP_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(Some(SecretString::from(t.trim().to_owned())));
    }
    let Some(path) = args
        .app_token_file
        .clone()
        .or_else(|| file.app_token_file.clone())
    else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("app token file {}", path.display()))?;
    let t = text.trim();
    anyhow::ensure!(!t.is_empty(), "app token file {} is empty", path.display());
    Ok(Some(SecretString::from(t.to_owned())))
}
