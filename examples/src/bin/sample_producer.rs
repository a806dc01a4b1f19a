//! `sample-producer`: publishes `--count` keyed messages (PROTOCOL §8).
//!
//! ```text
//! sample-producer --coordinator URL --redis-url URL --stream S --count N --keys K
//!   [--rate R] [--token T] [--redis-sentinel HOST:PORT,… --redis-sentinel-master NAME]
//!   [--wait-replicas N [--wait-timeout-ms MS]] [--batch N] [--health-listen ADDR]
//! ```
//! Entry fields: `payload` (JSON `{"seq": …, "key": …}`), `key` (`k{seq % K}`), `seq`
//! (0..N-1). Prints `published N` at the end. With `--acked-log FILE`, appends
//! `FIRST_SEQ END_SEQ UNIX_MS` for every batch the moment Redis confirmed it (what the
//! producer was told is published). With `--health-listen`, serves `/healthz`, `/readyz`
//! and `/metrics` (the client's metrics in the Prometheus format) for the pod's probes and
//! scraping; it then keeps serving after the last message until SIGTERM.

use anyhow::Context;
use clap::Parser;
use rsc_client::producer::{Producer, Record};
use rsc_client::{ExposeSecret, SecretString, SecretUrl};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// (`Debug` hides the token and the Redis URL's password, PROTOCOL §12.)
#[derive(Debug, Parser)]
#[command(
    name = "sample-producer",
    version,
    about = "Publishes keyed sample messages"
)]
struct Args {
    /// Coordinator URL(s), comma-separated for failover.
    #[arg(long, env = "RSC_COORDINATOR_URL")]
    coordinator: String,
    /// The data Redis (with `--redis-cluster`, seed nodes, comma-separated).
    #[arg(long, env = "RSC_REDIS_URL", hide_env_values = true)]
    redis_url: SecretUrl,
    /// The data Redis is a Redis Cluster.
    #[arg(long)]
    redis_cluster: bool,
    /// Find the data Redis master through these sentinels (`HOST:PORT`, comma-separated).
    #[arg(long, env = "RSC_REDIS_SENTINEL", requires = "redis_sentinel_master")]
    redis_sentinel: Option<String>,
    /// The master name the sentinels monitor.
    #[arg(long, env = "RSC_REDIS_SENTINEL_MASTER")]
    redis_sentinel_master: Option<String>,
    /// Durability: each batch waits until this many replicas have it (`WAIT`); a batch not
    /// confirmed in time is sent again (recognised as written, not duplicated).
    #[arg(long, env = "RSC_PUBLISH_WAIT_REPLICAS")]
    wait_replicas: Option<u32>,
    /// How long a batch waits for its replicas, in ms.
    #[arg(long, env = "RSC_PUBLISH_WAIT_TIMEOUT_MS", default_value_t = 1000)]
    wait_timeout_ms: u64,
    /// Messages per batch (one pipeline).
    #[arg(long, default_value_t = 500)]
    batch: u64,
    /// Append `FIRST END UNIX_MS` per confirmed batch to this file.
    #[arg(long)]
    acked_log: Option<std::path::PathBuf>,
    /// Serve `/healthz`, `/readyz` and `/metrics` on this address, e.g. `0.0.0.0:8080`.
    #[arg(long, env = "RSC_HEALTH_LISTEN")]
    health_listen: Option<std::net::SocketAddr>,
    /// The stream.
    #[arg(long)]
    stream: String,
    /// How many messages.
    #[arg(long)]
    count: u64,
    /// How many distinct keys (`k0` … `k{K-1}`).
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// Messages per second (as fast as possible when absent).
    #[arg(long)]
    rate: Option<f64>,
    /// Bearer token for the coordinator.
    #[arg(long, env = "RSC_TOKEN", hide_env_values = true)]
    token: Option<SecretString>,
}

/// How long a batch is retried while Redis is unreachable before the producer gives up.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// Publishes one batch; the producer retries while Redis is unreachable (a restart, an
/// outage) for up to [`RETRY_FOR`] without duplicates (PROTOCOL §21). An error after that, or
/// before anything was sent (no routing), is retried here as a new publish until the deadline:
/// at-least-once for those.
async fn publish_retrying(
    producer: &Producer,
    stream: &str,
    batch: Vec<Record>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        match producer.publish_batch(stream, batch.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e.chain(), "publish failed; retrying the batch");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn record(seq: u64, keys: u64) -> anyhow::Result<Record> {
    let key = format!("k{}", seq % keys.max(1));
    Ok(Record::json(&serde_json::json!({"seq": seq, "key": key}))?
        .key(key)
        .field("seq", seq.to_string()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rsc_client::ops::init_tracing()?;
    let args = Args::parse();
    // The recorder first, so that every metric of the producer is in it.
    let _ = rsc_client::ops::install_metrics()?;
    let producer = producer(&args)?;
    let health = match args.health_listen {
        Some(addr) => Some(serve_health(&producer, addr).await?),
        None => None,
    };
    let mut acked = match &args.acked_log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--acked-log {}", path.display()))?,
        ),
        None => None,
    };
    let started = Instant::now();
    let mut next = 0u64;
    while next < args.count {
        // With a rate: publish what is due by now, in batches of at most BATCH.
        let due = match args.rate {
            Some(r) if r > 0.0 => {
                ((started.elapsed().as_secs_f64() * r) as u64 + 1).min(args.count)
            }
            _ => args.count,
        };
        if due <= next {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let end = due.min(next + args.batch.max(1));
        let batch = (next..end)
            .map(|seq| record(seq, args.keys))
            .collect::<anyhow::Result<Vec<_>>>()?;
        publish_retrying(&producer, &args.stream, batch).await?;
        if let Some(f) = acked.as_mut() {
            use std::io::Write;
            writeln!(f, "{next} {end} {}", rsc_examples::unix_ms())?;
        }
        next = end;
    }
    println!("published {}", args.count);
    if let Some(server) = health {
        // Keep serving metrics and probes until the pod is stopped.
        server.await??;
    }
    Ok(())
}

/// The producer the arguments describe.
fn producer(args: &Args) -> anyhow::Result<Producer> {
    let mut builder = Producer::builder()
        .coordinator(&args.coordinator)
        .redis_url(args.redis_url.expose_secret())
        .redis_cluster(args.redis_cluster)
        // The producer itself sends a batch again after a lost reply, an outage or a `WAIT`
        // not confirmed, without writing it twice (idempotence, PROTOCOL §21).
        .retry_budget(RETRY_FOR);
    if let Some(t) = &args.token {
        builder = builder.token(t.expose_secret());
    }
    if let (Some(addrs), Some(master)) = (&args.redis_sentinel, &args.redis_sentinel_master) {
        builder = builder.redis_sentinel(addrs, master);
    }
    if let Some(n) = args.wait_replicas {
        builder = builder.wait_for_replicas(n, Duration::from_millis(args.wait_timeout_ms));
    }
    Ok(builder.build()?)
}

/// Serves the ops endpoints (`rsc_client::ops`) on `addr` until the pod is stopped: ready
/// while the data Redis answers and a coordinator is ready ([`Producer::not_ready`]).
async fn serve_health(
    producer: &Producer,
    addr: SocketAddr,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--health-listen {addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "health and metrics endpoints listening");
    let producer = producer.clone();
    let ops = rsc_client::ops::Ops::new().readiness(move || {
        let producer = producer.clone();
        async move { producer.not_ready().await }
    });
    Ok(tokio::spawn(
        ops.serve(listener, rsc_client::shutdown_signal()),
    ))
}
