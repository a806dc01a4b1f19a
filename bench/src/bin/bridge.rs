//! BR1: `rsc-bridge` against the Rust listener it is built on (P3), in the same run, on the
//! same Redis (docs/BRIDGE.md):
//!
//! - **throughput**: a pre-filled stream of S shards consumed to its end by a `ConsumerApp`
//!   with a no-op `Listener` (the baseline), and by an `rsc-bridge` process delivering each
//!   entry (binary-mode CloudEvent over loopback HTTP) to a no-op application (an in-process
//!   HTTP server answering 204), each with a group of its own; msgs/s from start (join
//!   included) to the last entry handled. `key_concurrency` 1 for both: one delivery per
//!   shard at a time, the hop's latency in full on every entry.
//! - **added latency**: entries published at a steady rate on another stream that both a
//!   listener and a bridge consume (each its own group): the time from the entry's `XADD`
//!   (its id's milliseconds) to the handler (the application) seeing it, p50 and p99 of each;
//!   the hop adds the difference.
//!
//! ```text
//! cargo build --release -p rsc-bridge -p rsc-coordinator -p rsc-bench --bin rsc-bridge \
//!   --bin rsc-coordinator --bin bridge && target/release/bridge [--quick]
//! ```

use anyhow::Context;
use clap::Parser;
use rsc_bench::{Row, emit, summarize};
use rsc_client::producer::{Producer, Record};
use rsc_client::{ConsumerApp, HandlerError, Listener, Message, Raw};
use rsc_testkit::{CoordinatorProcess, RedisServer, binary_path};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

#[derive(Debug, Parser)]
#[command(about = "rsc-bridge against the Rust listener: throughput and added latency")]
struct Args {
    /// Fewer messages (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Repetitions of the throughput figure.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Messages per repetition (default 20000, or 2000 with --quick).
    #[arg(long)]
    messages: Option<u64>,
    /// Shards of the streams.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Messages per second of the latency run.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Seconds of the latency run (default 10, or 3 with --quick).
    #[arg(long)]
    seconds: Option<u64>,
}

/// What a handler (the listener's, or the application's) counts.
#[derive(Default)]
struct Sink {
    handled: AtomicU64,
    target: AtomicU64,
    done: Notify,
    /// Milliseconds from the entry's XADD to the handler, when recording.
    latencies: Mutex<Vec<f64>>,
}

impl Sink {
    fn saw(&self, id: &str) {
        if let Some(ms) = id.split('-').next().and_then(|m| m.parse::<u64>().ok()) {
            self.latencies
                .lock()
                .expect("lock")
                .push(now_ms().saturating_sub(ms) as f64);
        }
        let n = self.handled.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.target.load(Ordering::Relaxed) {
            self.done.notify_one();
        }
    }

    fn reset(&self, target: u64) {
        self.handled.store(0, Ordering::Relaxed);
        self.target.store(target, Ordering::Relaxed);
        self.latencies.lock().expect("lock").clear();
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The no-op application: answers 204 to every POST, counting what it saw.
async fn serve_app(sink: Arc<Sink>) -> anyhow::Result<u16> {
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let sink = sink.clone();
        async move {
            let id = headers
                .get("ce-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            sink.saw(id);
            axum::http::StatusCode::NO_CONTENT
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// An `rsc-bridge` process of listener `l` (group `group`) on `stream`, delivering to `port`.
fn spawn_bridge(
    coord: &str,
    redis: &str,
    group: &str,
    stream: &str,
    port: u16,
) -> anyhow::Result<Child> {
    Command::new(binary_path("rsc-bridge")?)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--instance-id",
            &format!("bench-{group}"),
        ])
        .env("RSC_COORDINATOR_URL", coord)
        .env("RSC_REDIS_URL", redis)
        .env("RSC_BRIDGE_LISTENERS", "l")
        .env("RSC_LISTENER_L_GROUP", group)
        .env("RSC_LISTENER_L_STREAM", stream)
        .env(
            "RSC_LISTENER_L_DELIVER_TO",
            format!("http://127.0.0.1:{port}/"),
        )
        .env("RSC_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("rsc-bridge starts")
}

/// A consumer app of `group` on `stream` with a no-op listener feeding `sink`.
fn listener_app(
    coord: &str,
    redis: &str,
    group: &str,
    stream: &str,
    sink: Arc<Sink>,
) -> anyhow::Result<ConsumerApp> {
    let listener = Listener::new(group, stream, move |m: Message<Raw>| {
        let sink = sink.clone();
        async move {
            sink.saw(m.id());
            Ok::<(), HandlerError>(())
        }
    });
    Ok(ConsumerApp::builder()
        .coordinator(coord)
        .redis_url(redis)
        .instance_id(format!("bench-{group}"))
        .listener(listener)
        .build()?)
}

async fn prefill(producer: &Producer, stream: &str, n: u64) -> anyhow::Result<()> {
    let mut seq = 0;
    while seq < n {
        let end = (seq + 1000).min(n);
        let records: Vec<Record> = (seq..end)
            .map(|i| Record::raw(b"{}".to_vec()).key(format!("k{i}")))
            .collect();
        producer.publish_batch(stream, records).await?;
        seq = end;
    }
    Ok(())
}

async fn group(coord: &str, group: &str, stream: &str, shards: u32) -> anyhow::Result<()> {
    rsc_bench::create_group(
        coord,
        serde_json::json!({"group": group, "stream": stream, "shard_count": shards}),
    )
    .await
}

/// Waits until `sink` saw `n` entries (bounded); the time since `started`.
async fn until_done(sink: &Sink, n: u64, started: Instant) -> anyhow::Result<Duration> {
    let wait = async {
        while sink.handled.load(Ordering::Relaxed) < n {
            tokio::select! {
                _ = sink.done.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(600), wait)
        .await
        .context("never consumed")?;
    Ok(started.elapsed())
}

/// One repetition: the listener's msgs/s, then the bridge's, on one pre-filled stream.
async fn throughput(env: &Env, rep: usize, n: u64, shards: u32) -> anyhow::Result<(f64, f64)> {
    let stream = format!("t{rep}");
    let (base, bridged) = (format!("base{rep}"), format!("br{rep}"));
    group(&env.coord, &base, &stream, shards).await?;
    group(&env.coord, &bridged, &stream, shards).await?;
    prefill(&env.producer, &stream, n).await?;
    env.sink.reset(n);
    let app = listener_app(&env.coord, &env.redis, &base, &stream, env.sink.clone())?;
    let handle = app.handle();
    let started = Instant::now();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    let listener = n as f64 / until_done(&env.sink, n, started).await?.as_secs_f64();
    handle.shutdown();
    run.await??;
    env.sink.reset(n);
    let started = Instant::now();
    let mut child = spawn_bridge(&env.coord, &env.redis, &bridged, &stream, env.app_port)?;
    let bridge = n as f64 / until_done(&env.sink, n, started).await?.as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    Ok((listener, bridge))
}

struct Env {
    coord: String,
    redis: String,
    producer: Producer,
    sink: Arc<Sink>,
    app_port: u16,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The latency run: both paths consume one paced stream; (listener, bridge) latencies, sorted.
async fn latency(
    env: &Env,
    shards: u32,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let stream = "lat";
    group(&env.coord, "lat-base", stream, shards).await?;
    group(&env.coord, "lat-br", stream, shards).await?;
    let base_sink = Arc::new(Sink::default());
    base_sink.reset(u64::MAX);
    env.sink.reset(u64::MAX);
    let app = listener_app(
        &env.coord,
        &env.redis,
        "lat-base",
        stream,
        base_sink.clone(),
    )?;
    let handle = app.handle();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    let mut child = spawn_bridge(&env.coord, &env.redis, "lat-br", stream, env.app_port)?;
    // Both joined and reading: a first entry reaches each.
    env.producer
        .publish_record(stream, Record::raw(b"{}".to_vec()))
        .await?;
    let warm = Instant::now();
    while (base_sink.handled.load(Ordering::Relaxed) == 0
        || env.sink.handled.load(Ordering::Relaxed) == 0)
        && warm.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    base_sink.reset(u64::MAX);
    env.sink.reset(u64::MAX);
    let total = rate * seconds;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    for i in 0..total {
        tick.tick().await;
        env.producer
            .publish_record(stream, Record::raw(b"{}".to_vec()).key(format!("k{i}")))
            .await?;
    }
    let settle = Instant::now();
    while (base_sink.handled.load(Ordering::Relaxed) < total
        || env.sink.handled.load(Ordering::Relaxed) < total)
        && settle.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.shutdown();
    run.await??;
    let _ = child.kill();
    let _ = child.wait();
    let sorted = |s: &Sink| {
        let mut v = s.latencies.lock().expect("lock").clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    };
    Ok((sorted(&base_sink), sorted(&env.sink)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rsc_client::install_crypto_provider();
    let n = args
        .messages
        .unwrap_or(if args.quick { 2000 } else { 20_000 });
    let seconds = args.seconds.unwrap_or(if args.quick { 3 } else { 10 });
    let redis = RedisServer::start()?;
    let coordinator = CoordinatorProcess::start(&["--store", "memory"])?;
    let sink = Arc::new(Sink::default());
    let env = Env {
        coord: coordinator.url(),
        redis: redis.url(),
        producer: Producer::builder()
            .coordinator(&coordinator.url())
            .redis_url(redis.url())
            .build()?,
        app_port: serve_app(sink.clone()).await?,
        sink,
    };
    let (mut base, mut bridged) = (Vec::new(), Vec::new());
    for rep in 0..args.reps.max(1) {
        let (l, b) = throughput(&env, rep, n, args.shards).await?;
        eprintln!("rep {rep}: listener {l:.0} msgs/s, bridge {b:.0} msgs/s");
        base.push(l);
        bridged.push(b);
    }
    let (lb, lr) = latency(&env, args.shards, args.rate, seconds).await?;
    let row = |name: &str, unit: &str, v: Vec<f64>, b: Option<Vec<f64>>, goal: &str| Row {
        name: name.into(),
        unit: unit.into(),
        value: summarize(&v),
        baseline: b.map(|b| summarize(&b)),
        goal: goal.into(),
    };
    let (p50, p99) = (
        percentile(&lr, 0.5) - percentile(&lb, 0.5),
        percentile(&lr, 0.99) - percentile(&lb, 0.99),
    );
    emit(&[
        row(
            "BR1 bridge consume (no-op app) vs listener (P3 shape)",
            "msgs/s",
            bridged,
            Some(base),
            "reported",
        ),
        row(
            "BR1 bridge end-to-end latency p50 vs listener",
            "ms",
            vec![percentile(&lr, 0.5)],
            Some(vec![percentile(&lb, 0.5)]),
            "reported",
        ),
        row(
            "BR1 bridge end-to-end latency p99 vs listener",
            "ms",
            vec![percentile(&lr, 0.99)],
            Some(vec![percentile(&lb, 0.99)]),
            "reported",
        ),
    ])?;
    println!(
        "added by the hop: p50 {p50:.1} ms, p99 {p99:.1} ms ({} and {} samples)",
        lr.len(),
        lb.len()
    );
    Ok(())
}
