//! BR1: `rsc-bridge` against the Rust listener it is built on (P3), in the same run, on the
//! same Redis (docs/BRIDGE.md):
//!
//! - **throughput**: a pre-filled stream of S shards consumed to its end by a `ConsumerApp`
//!   with a no-op `Listener` (the baseline), and by an `rsc-bridge` process delivering each
//!   entry (binary-mode CloudEvent over loopback HTTP) to a no-op application (an in-process
//!   HTTP server answering 204), each with a group of its own; msgs/s from start (join
//!   included) to the last entry handled. The bridge in three shapes (set by its
//!   per-listener flags): `key_concurrency` 1 (as the listener: one delivery per shard at a
//!   time, the hop's latency in full on every entry), `key_concurrency` 16 (deliveries of
//!   different keys of a shard overlap), and a batch listener (`max_batch` 64: one request
//!   per batch of structured events). The same listener is the baseline of all three.
//! - **added latency**: entries published at a steady rate on another stream that both a
//!   listener and a bridge (of each shape, one after the other) consume, each its own
//!   group: the time from the entry's `XADD` (its id's milliseconds) to the handler (the
//!   application) seeing it, p50 and p99 of each; the hop adds the difference.
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

/// The no-op application: answers 204 to every POST, counting what it saw (each event of
/// a batch, `application/cloudevents-batch+json`, by its `id`).
async fn serve_app(sink: Arc<Sink>) -> anyhow::Result<u16> {
    let app = axum::Router::new().fallback(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
                if header("content-type") == Some("application/cloudevents-batch+json") {
                    let events: Vec<serde_json::Value> =
                        serde_json::from_slice(&body).unwrap_or_default();
                    for e in &events {
                        sink.saw(e["id"].as_str().unwrap_or(""));
                    }
                } else {
                    sink.saw(header("ce-id").unwrap_or(""));
                }
                axum::http::StatusCode::NO_CONTENT
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// A shape of the bridge's listener: its name in the rows, and its per-listener flags.
struct Shape {
    name: &'static str,
    flags: &'static [&'static str],
}

/// The shapes measured, each against the same listener.
const SHAPES: &[Shape] = &[
    Shape {
        name: "key_concurrency 1",
        flags: &[],
    },
    Shape {
        name: "key_concurrency 16",
        flags: &["--listener-l-key-concurrency", "16"],
    },
    Shape {
        name: "batch, max_batch 64",
        flags: &["--listener-l-max-batch", "64"],
    },
];

/// An `rsc-bridge` process of listener `l` (group `group`) on `stream`, delivering to `port`,
/// in `shape`.
fn spawn_bridge(
    coord: &str,
    redis: &str,
    (group, stream): (&str, &str),
    port: u16,
    shape: &Shape,
) -> anyhow::Result<Child> {
    Command::new(binary_path("rsc-bridge")?)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--instance-id",
            &format!("bench-{group}"),
        ])
        .args(shape.flags)
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

/// One repetition: the listener's msgs/s, then the bridge's in each shape (starting with
/// the `rep`-th, so that none always runs first), on one pre-filled stream.
async fn throughput(env: &Env, rep: usize, n: u64, shards: u32) -> anyhow::Result<Vec<f64>> {
    let stream = format!("t{rep}");
    let base = format!("base{rep}");
    group(&env.coord, &base, &stream, shards).await?;
    for i in 0..SHAPES.len() {
        group(&env.coord, &format!("br{rep}-{i}"), &stream, shards).await?;
    }
    prefill(&env.producer, &stream, n).await?;
    env.sink.reset(n);
    let app = listener_app(&env.coord, &env.redis, &base, &stream, env.sink.clone())?;
    let handle = app.handle();
    let started = Instant::now();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    let listener = n as f64 / until_done(&env.sink, n, started).await?.as_secs_f64();
    handle.shutdown();
    run.await??;
    let mut out = vec![listener; SHAPES.len() + 1];
    for k in 0..SHAPES.len() {
        let i = (rep + k) % SHAPES.len();
        env.sink.reset(n);
        let started = Instant::now();
        let bridged = format!("br{rep}-{i}");
        let at = (bridged.as_str(), stream.as_str());
        let mut child = spawn_bridge(&env.coord, &env.redis, at, env.app_port, &SHAPES[i])?;
        out[i + 1] = n as f64 / until_done(&env.sink, n, started).await?.as_secs_f64();
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(out)
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

/// The latency run of `shape`: both paths consume one paced stream; (listener, bridge)
/// latencies, sorted.
async fn latency(
    env: &Env,
    (shards, rate, seconds): (u32, u64, u64),
    shape: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let stream = &format!("lat{shape}");
    let (base, bridged) = (format!("lat-base{shape}"), format!("lat-br{shape}"));
    group(&env.coord, &base, stream, shards).await?;
    group(&env.coord, &bridged, stream, shards).await?;
    let base_sink = Arc::new(Sink::default());
    base_sink.reset(u64::MAX);
    env.sink.reset(u64::MAX);
    let app = listener_app(&env.coord, &env.redis, &base, stream, base_sink.clone())?;
    let handle = app.handle();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    let at = (bridged.as_str(), stream.as_str());
    let mut child = spawn_bridge(&env.coord, &env.redis, at, env.app_port, &SHAPES[shape])?;
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
    // by_shape[0]: the listener; by_shape[i + 1]: the bridge in SHAPES[i].
    let mut by_shape: Vec<Vec<f64>> = vec![Vec::new(); SHAPES.len() + 1];
    for rep in 0..args.reps.max(1) {
        let rates = throughput(&env, rep, n, args.shards).await?;
        let shown: Vec<String> = (SHAPES.iter())
            .zip(&rates[1..])
            .map(|(s, r)| format!("bridge ({}) {r:.0}", s.name))
            .collect();
        eprintln!(
            "rep {rep}: listener {:.0} msgs/s, {}",
            rates[0],
            shown.join(", ")
        );
        for (all, r) in by_shape.iter_mut().zip(rates) {
            all.push(r);
        }
    }
    let mut rows = Vec::new();
    let row = |name: String, unit: &str, v: Vec<f64>, b: Vec<f64>| Row {
        name,
        unit: unit.into(),
        value: summarize(&v),
        baseline: Some(summarize(&b)),
        goal: "reported".into(),
    };
    for (i, shape) in SHAPES.iter().enumerate() {
        rows.push(row(
            format!(
                "BR1 bridge ({}) consume (no-op app) vs listener (P3 shape)",
                shape.name
            ),
            "msgs/s",
            by_shape[i + 1].clone(),
            by_shape[0].clone(),
        ));
    }
    for (i, shape) in SHAPES.iter().enumerate() {
        let (lb, lr) = latency(&env, (args.shards, args.rate, seconds), i).await?;
        for (q, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(row(
                format!(
                    "BR1 bridge ({}) end-to-end latency {q} vs listener",
                    shape.name
                ),
                "ms",
                vec![percentile(&lr, p)],
                vec![percentile(&lb, p)],
            ));
        }
        println!(
            "{}: added by the hop: p50 {:.1} ms, p99 {:.1} ms ({} and {} samples)",
            shape.name,
            percentile(&lr, 0.5) - percentile(&lb, 0.5),
            percentile(&lr, 0.99) - percentile(&lb, 0.99),
            lr.len(),
            lb.len()
        );
    }
    emit(&rows)?;
    Ok(())
}
