//! The data plane's cost and latency (ARCHITECTURE "Data plane"), each beside the same
//! consumer with a connection and a blocked read per shard (`shared_reader(false)`),
//! measured in the same run on the same Redis:
//!
//! - **D1**: the consumer process' connections to the data Redis (`CLIENT LIST`) with one
//!   member owning 16 / 256 / 1,024 shards.
//! - **D2**: the data Redis' commands per second while nothing is published (`INFO
//!   commandstats`), the same shards. Goal: flat, ≤ 20/s per process.
//! - **D3**: p50 / p99 of publish → handle (the handler's start less the time taken just before
//!   `Producer::publish`) at 2,000 entries/s over 16 and 1,024 shards. Goal: 1,024 shards within
//!   1.5× of 16, and 16 no worse than the per-shard reader.
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p rsc-bench --bin dataplane [-- --quick]
//! ```

use clap::Parser;
use rsc_bench::{Row, Summary, emit, summarize};
use rsc_client::producer::Producer;
use rsc_client::{ConsumerApp, HandlerError, Listener, Message};
use rsc_protocol::routing::shard_key;
use rsc_testkit::{CoordinatorProcess, RedisServer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Parser)]
#[command(about = "Data-plane connections, idle commands and latency, shared vs per-shard reader")]
struct Args {
    /// Smaller run (CI smoke run): 16 and 256 shards, shorter windows.
    #[arg(long)]
    quick: bool,
    /// Shard counts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    shards: Option<Vec<u32>>,
    /// Entries per second of the latency run.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Seconds of the latency run.
    #[arg(long)]
    load_secs: Option<u64>,
    /// Seconds of the idle window.
    #[arg(long)]
    idle_secs: Option<u64>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Stamp {
    /// Microseconds since the Unix epoch, just before the publish.
    sent_us: u64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What one consumer measured.
struct Measured {
    connections: f64,
    idle_rate: f64,
    /// p50 and p99 publish → handle, ms (only where the latency was run).
    latency: Option<(f64, f64)>,
}

fn connections(con: &mut redis::Connection) -> anyhow::Result<f64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con)?;
    Ok(rsc_testkit::client_count(&list) as f64 - 1.0)
}

fn commands(con: &mut redis::Connection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con)?;
    Ok(info
        .lines()
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

fn shard_keys(con: &mut redis::Connection, stream: &str, shards: u32) -> anyhow::Result<u32> {
    let mut pipe = redis::pipe();
    for i in 0..shards {
        pipe.cmd("EXISTS").arg(shard_key(stream, i));
    }
    let found: Vec<u32> = pipe.query(con)?;
    Ok(found.into_iter().sum())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    coordinator: &str,
    redis_url: &str,
    con: &mut redis::Connection,
    shards: u32,
    shared: bool,
    idle: Duration,
    load: Option<(u64, Duration)>,
) -> anyhow::Result<Measured> {
    let mode = if shared { "shared" } else { "pershard" };
    let stream = format!("dp-{mode}-{shards}");
    let group = format!("g-{mode}-{shards}");
    rsc_bench::create_group(
        coordinator,
        serde_json::json!({"group": group, "stream": stream, "shard_count": shards}),
    )
    .await?;
    let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
    let s = samples.clone();
    let listener = Listener::new(&group, &stream, move |msg: Message<Stamp>| {
        let s = s.clone();
        async move {
            let ms = now_us().saturating_sub(msg.payload().sent_us) as f64 / 1000.0;
            s.lock().unwrap_or_else(|p| p.into_inner()).push(ms);
            Ok::<(), HandlerError>(())
        }
    });
    let app = ConsumerApp::builder()
        .coordinator(coordinator)
        .redis_url(redis_url)
        .instance_id(format!("bench-{mode}"))
        .shared_reader(shared)
        .listener(listener)
        .build()?;
    let handle = app.handle();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    // Every shard worker has created its consumer group (MKSTREAM), then gone quiet.
    let deadline = Instant::now() + Duration::from_secs(120);
    while shard_keys(con, &stream, shards)? < shards {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the shard workers never all started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let connections = connections(con)?;
    let before = commands(con)?;
    tokio::time::sleep(idle).await;
    let idle_rate = commands(con)?.saturating_sub(before + 1) as f64 / idle.as_secs_f64();
    let latency = match load {
        None => None,
        Some((rate, secs)) => {
            let producer = Producer::builder()
                .coordinator(coordinator)
                .redis_url(redis_url)
                .build()?;
            let total = rate * secs.as_secs();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut sent = 0u64;
            let started = Instant::now();
            while sent < total {
                tick.tick().await;
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                while sent < due.min(total) {
                    let key = format!("k{}", sent % 4096);
                    producer
                        .publish(&stream, Some(&key), &Stamp { sent_us: now_us() })
                        .await?;
                    sent += 1;
                }
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            while samples.lock().unwrap_or_else(|p| p.into_inner()).len() < total as usize {
                anyhow::ensure!(Instant::now() < deadline, "not every entry was handled");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut v = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
            v.sort_by(|a, b| a.total_cmp(b));
            Some((percentile(&v, 0.5), percentile(&v, 0.99)))
        }
    };
    handle.shutdown();
    run.await??;
    Ok(Measured {
        connections,
        idle_rate,
        latency,
    })
}

fn one(x: f64) -> Summary {
    summarize(&[x])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shard_counts = args.shards.clone().unwrap_or_else(|| {
        if args.quick {
            vec![16, 256]
        } else {
            vec![16, 256, 1024]
        }
    });
    let idle = Duration::from_secs(args.idle_secs.unwrap_or(if args.quick { 2 } else { 5 }));
    let load_secs = Duration::from_secs(args.load_secs.unwrap_or(if args.quick { 2 } else { 8 }));
    let latency_at = |shards: u32| shards == 16 || shards == 1024 || args.quick;
    let redis = RedisServer::start()?;
    let coordinator = CoordinatorProcess::start(&["--store", "memory"])?;
    let url = coordinator.url();
    let mut con = redis::Client::open(redis.url())?.get_connection()?;
    let mut rows = Vec::new();
    let mut p99_shared = Vec::new();
    for &shards in &shard_counts {
        let load = latency_at(shards).then_some((args.rate, load_secs));
        // The baseline first, then the shared reader, each on a stream of its own.
        let base = measure(&url, &redis.url(), &mut con, shards, false, idle, load).await?;
        let shared = measure(&url, &redis.url(), &mut con, shards, true, idle, load).await?;
        rows.push(Row {
            name: format!("D1 connections to the data Redis, one member owning {shards} shards"),
            unit: "connections".into(),
            value: one(shared.connections),
            baseline: Some(one(base.connections)),
            goal: "≤ 4 (baseline: a connection per shard)".into(),
        });
        rows.push(Row {
            name: format!("D2 idle data-Redis commands/s, {shards} shards"),
            unit: "cmd/s".into(),
            value: one(shared.idle_rate),
            baseline: Some(one(base.idle_rate)),
            goal: "≤ 20/s per process, flat (baseline: a blocked read per shard)".into(),
        });
        if let (Some((p50, p99)), Some((b50, b99))) = (shared.latency, base.latency) {
            rows.push(Row {
                name: format!(
                    "D3 p50 publish → handle, {} entries/s over {shards} shards",
                    args.rate
                ),
                unit: "ms".into(),
                value: one(p50),
                baseline: Some(one(b50)),
                goal: "- (baseline: a blocked read per shard)".into(),
            });
            rows.push(Row {
                name: format!(
                    "D3 p99 publish → handle, {} entries/s over {shards} shards",
                    args.rate
                ),
                unit: "ms".into(),
                value: one(p99),
                baseline: Some(one(b99)),
                goal: "16 shards: no worse than the baseline".into(),
            });
            p99_shared.push((shards, p99));
        }
    }
    if let (Some(&(lo, p_lo)), Some(&(hi, p_hi))) = (p99_shared.first(), p99_shared.last())
        && hi > lo
    {
        rows.push(Row {
            name: format!("D3 p99 publish → handle, {hi} shards vs {lo} shards (shared reader)"),
            unit: "ms".into(),
            value: one(p_hi),
            baseline: Some(one(p_lo)),
            goal: "ratio ≤ 1.5".into(),
        });
    }
    emit(&rows)?;
    Ok(())
}
