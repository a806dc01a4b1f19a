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
use rsc_bench::{Row, emit, summarize};
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
    /// Repetitions of each figure, alternating which reader goes first (median, min, max are
    /// reported, the ratio of the medians, and each repetition's D3 p99 ratio).
    #[arg(long, default_value_t = 1)]
    reps: usize,
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

/// One consumer's run: `shards` shards read by the shared reader or by the per-shard reader,
/// on a stream of its own (`rep` tells the repetitions apart).
struct Run {
    shards: u32,
    shared: bool,
    rep: usize,
    idle: Duration,
    load: Option<(u64, Duration)>,
}

async fn measure(
    coordinator: &str,
    redis_url: &str,
    con: &mut redis::Connection,
    run: &Run,
) -> anyhow::Result<Measured> {
    let Run {
        shards,
        shared,
        rep,
        idle,
        load,
    } = *run;
    let mode = if shared { "shared" } else { "pershard" };
    let stream = format!("dp-{mode}-{shards}-{rep}");
    let group = format!("g-{mode}-{shards}-{rep}");
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
        .instance_id(format!("bench-{mode}-{rep}"))
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

/// A row of the shared reader's figure against the per-shard reader's, over the repetitions.
fn row(name: String, unit: &str, shared: &[f64], base: &[f64], goal: &str) -> Row {
    Row {
        name,
        unit: unit.into(),
        value: summarize(shared),
        baseline: Some(summarize(base)),
        goal: goal.into(),
    }
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
        let (mut base, mut shared) = (Vec::new(), Vec::new());
        for rep in 0..args.reps.max(1) {
            let run = |shared| Run {
                shards,
                shared,
                rep,
                idle,
                load,
            };
            // Each reader on a stream of its own; the baseline first in even repetitions.
            let (b, s) = if rep % 2 == 0 {
                let b = measure(&url, &redis.url(), &mut con, &run(false)).await?;
                (b, measure(&url, &redis.url(), &mut con, &run(true)).await?)
            } else {
                let s = measure(&url, &redis.url(), &mut con, &run(true)).await?;
                (measure(&url, &redis.url(), &mut con, &run(false)).await?, s)
            };
            base.push(b);
            shared.push(s);
        }
        let field = |v: &[Measured], f: fn(&Measured) -> Option<f64>| -> Vec<f64> {
            v.iter().filter_map(f).collect()
        };
        rows.push(row(
            format!("D1 connections to the data Redis, one member owning {shards} shards"),
            "connections",
            &field(&shared, |m| Some(m.connections)),
            &field(&base, |m| Some(m.connections)),
            "≤ 4 (baseline: a connection per shard)",
        ));
        rows.push(row(
            format!("D2 idle data-Redis commands/s, {shards} shards"),
            "cmd/s",
            &field(&shared, |m| Some(m.idle_rate)),
            &field(&base, |m| Some(m.idle_rate)),
            "≤ 20/s per process, flat (baseline: a blocked read per shard)",
        ));
        let p50 = |m: &Measured| m.latency.map(|l| l.0);
        let p99 = |m: &Measured| m.latency.map(|l| l.1);
        let (p99s, b99s) = (field(&shared, p99), field(&base, p99));
        if !p99s.is_empty() && p99s.len() == b99s.len() {
            rows.push(row(
                format!(
                    "D3 p50 publish → handle, {} entries/s over {shards} shards",
                    args.rate
                ),
                "ms",
                &field(&shared, p50),
                &field(&base, p50),
                "- (baseline: a blocked read per shard)",
            ));
            rows.push(row(
                format!(
                    "D3 p99 publish → handle, {} entries/s over {shards} shards",
                    args.rate
                ),
                "ms",
                &p99s,
                &b99s,
                "16 shards: no worse than the baseline",
            ));
            let ratios: Vec<f64> = p99s.iter().zip(&b99s).map(|(s, b)| s / b).collect();
            println!(
                "D3 p99 shared / per-shard reader per repetition, {shards} shards: {ratios:.2?}"
            );
            p99_shared.push((shards, summarize(&p99s).median));
        }
    }
    if let (Some(&(lo, p_lo)), Some(&(hi, p_hi))) = (p99_shared.first(), p99_shared.last())
        && hi > lo
    {
        rows.push(row(
            format!("D3 p99 publish → handle, {hi} shards vs {lo} shards (shared reader)"),
            "ms",
            &[p_hi],
            &[p_lo],
            "ratio ≤ 1.5",
        ));
    }
    emit(&rows)?;
    Ok(())
}
