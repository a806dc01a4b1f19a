//! Coordinated retention (PROTOCOL §18), each figure beside the same run without it, in the
//! same process on the same Redis:
//!
//! - **R-MEM**: bounded memory under steady load: a producer at `--rate` entries/s (1,000) for
//!   `--load-secs` (60), two groups consuming, `keep_acked_ms` 0 against a stream whose policy
//!   keeps acknowledged entries for 365 days (never trimmed in the run). The shard entries
//!   left and the data Redis' `used_memory` growth from a third of the load to the end. Goal: flat with retention
//!   (≤ 1 stream node, 100 entries, per shard), linear without.
//! - **R-IDLE**: the trimmer's Redis commands at `--idle-shards` (1,000) idle shards (a group
//!   with its Redis consumer group on every shard, nothing published), per shard and minute
//!   (`INFO commandstats` deltas over `--idle-secs`): the trimming's own (`XTRIM`,
//!   `XPENDING`, `XINFO STREAM`) and everything the coordinator sent (with the lag
//!   sampler's `XINFO GROUPS`). Goal: ≤ 1 per shard per minute.
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p rsc-bench --bin retention [-- --quick]
//! ```

use clap::Parser;
use rsc_bench::{Row, emit, summarize};
use rsc_client::producer::{Producer, Record};
use rsc_client::{ConsumerApp, HandlerError, Listener, Message, Raw};
use rsc_protocol::routing::shard_key;
use rsc_testkit::{CoordinatorProcess, RedisServer, command_calls};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Retention: bounded memory under load (R-MEM), trimming's cost at idle shards")]
struct Args {
    /// Smaller run (CI smoke run, about 15 s): 3 s of load, 200 idle shards, 2 s idle window.
    #[arg(long)]
    quick: bool,
    /// Entries per second of the R-MEM load.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Seconds of R-MEM load per run.
    #[arg(long)]
    load_secs: Option<u64>,
    /// Shards of the R-MEM stream.
    #[arg(long, default_value_t = 8)]
    shards: u32,
    /// Idle shards of R-IDLE.
    #[arg(long)]
    idle_shards: Option<u32>,
    /// Seconds of the R-IDLE window.
    #[arg(long)]
    idle_secs: Option<u64>,
}

/// Entries left in the shard keys of `stream`.
fn entries(con: &mut redis::Connection, stream: &str, shards: u32) -> anyhow::Result<u64> {
    let mut pipe = redis::pipe();
    for i in 0..shards {
        pipe.cmd("XLEN").arg(shard_key(stream, i));
    }
    let n: Vec<u64> = pipe.query(con)?;
    Ok(n.into_iter().sum())
}

/// The data Redis' `used_memory`, MiB.
fn used_mib(con: &mut redis::Connection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("memory").query(con)?;
    let bytes: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no used_memory"))?;
    Ok(bytes / 1_048_576.0)
}

/// What one R-MEM run saw at its end.
struct MemRun {
    entries: f64,
    growth_mib: f64,
}

/// One R-MEM run: two groups on `stream` (policy `keep_acked_ms`), `rate` entries/s for
/// `secs`, then until both groups caught up and two sampling ticks passed.
async fn mem_run(
    url: &str,
    redis_url: &str,
    con: &mut redis::Connection,
    stream: &str,
    keep_acked_ms: u64,
    a: &Args,
    secs: u64,
) -> anyhow::Result<MemRun> {
    for g in ["a", "b"] {
        rsc_bench::create_group(
            url,
            serde_json::json!({"group": format!("{stream}-{g}"), "stream": stream,
                "shard_count": a.shards, "retention": {"keep_acked_ms": keep_acked_ms}}),
        )
        .await?;
    }
    let mut app = ConsumerApp::builder()
        .coordinator(url)
        .redis_url(redis_url)
        .instance_id(format!("bench-{stream}"));
    for g in ["a", "b"] {
        let l = Listener::new(format!("{stream}-{g}"), stream, |_m: Message<Raw>| async {
            Ok::<(), HandlerError>(())
        });
        app = app.listener(l.batch_size(64));
    }
    let app = app.build()?;
    let handle = app.handle();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    let producer = Producer::builder()
        .coordinator(url)
        .redis_url(redis_url)
        .build()?;
    // Memory from a third of the load on: the start-up's allocations (consumer groups,
    // clients' buffers) are behind it.
    let mut mid_mib = None;
    let tick = Duration::from_millis(10);
    let per_tick = (a.rate / 100).max(1);
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        let records = (0..per_tick)
            .map(|i| Record::raw(vec![b'x'; 100]).key(format!("k{}", (sent + i) % 1000)));
        producer.publish_batch(stream, records).await?;
        sent += per_tick;
        if mid_mib.is_none() && started.elapsed() >= Duration::from_secs(secs) / 3 {
            mid_mib = Some(used_mib(con)?);
        }
        let due = tick * (sent / per_tick) as u32;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    // Caught up: both groups' lag 0; then two sampling ticks for the last trims.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut lag = 0;
        for g in ["a", "b"] {
            let v: serde_json::Value = reqwest::get(format!("{url}/v1/groups/{stream}-{g}"))
                .await?
                .json()
                .await?;
            lag += v["shards"]
                .as_array()
                .map(|s| s.iter().filter_map(|x| x["lag"].as_u64()).sum::<u64>())
                .unwrap_or(u64::MAX);
        }
        if lag == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let out = MemRun {
        entries: entries(con, stream, a.shards)? as f64,
        growth_mib: used_mib(con)? - mid_mib.unwrap_or(0.0),
    };
    println!(
        "R-MEM {stream}: {sent} published, {} entries left, used_memory +{:.2} MiB",
        out.entries, out.growth_mib
    );
    handle.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    Ok(out)
}

/// R-IDLE: the coordinator's commands per shard and minute at `shards` idle shards:
/// (trimming's own, all).
async fn idle_run(
    url: &str,
    con: &mut redis::Connection,
    shards: u32,
    secs: u64,
) -> anyhow::Result<(f64, f64)> {
    let stream = "idle";
    rsc_bench::create_group(
        url,
        serde_json::json!({"group": "idle-g", "stream": stream, "shard_count": shards,
            "retention": {"keep_acked_ms": 0}}),
    )
    .await?;
    let mut pipe = redis::pipe();
    for i in 0..shards {
        pipe.cmd("XGROUP")
            .arg("CREATE")
            .arg(shard_key(stream, i))
            .arg("idle-g")
            .arg("$")
            .arg("MKSTREAM")
            .ignore();
    }
    pipe.query::<()>(con)?;
    // The first passes decide on every key; from then on nothing moves.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls =
        |con: &mut redis::Connection| -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
            let info: String = redis::cmd("INFO").arg("commandstats").query(con)?;
            Ok(command_calls(&info))
        };
    let before = calls(con)?;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let after = calls(con)?;
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    let trim: u64 = ["xtrim", "xpending", "xinfo|stream"]
        .iter()
        .map(|n| delta(n))
        .sum();
    // All but this run's own INFO calls.
    let all: u64 = after
        .keys()
        .filter(|n| n.as_str() != "info")
        .map(|n| delta(n))
        .sum();
    let per = |n: u64| n as f64 / f64::from(shards) / (secs as f64 / 60.0);
    println!(
        "R-IDLE {shards} shards, {secs} s: trimming {trim} commands, all {all} ({:?})",
        after
            .keys()
            .filter(|n| delta(n) > 0)
            .map(|n| (n.as_str(), delta(n)))
            .collect::<Vec<_>>()
    );
    Ok((per(trim), per(all)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let load_secs = a.load_secs.unwrap_or(if a.quick { 3 } else { 60 });
    let idle_shards = a.idle_shards.unwrap_or(if a.quick { 200 } else { 1000 });
    let idle_secs = a.idle_secs.unwrap_or(if a.quick { 2 } else { 60 });
    let redis = RedisServer::start()?;
    let coordinator = CoordinatorProcess::start(&[
        "--data-redis-url",
        &redis.url(),
        "--history-interval-ms",
        "1000",
    ])?;
    let url = coordinator.url();
    let mut con = redis::Client::open(redis.url())?.get_connection()?;
    let on = mem_run(&url, &redis.url(), &mut con, "rmem-on", 0, &a, load_secs).await?;
    let year = 365 * 86_400_000;
    let off = mem_run(
        &url,
        &redis.url(),
        &mut con,
        "rmem-off",
        year,
        &a,
        load_secs,
    )
    .await?;
    let (trim, all) = idle_run(&url, &mut con, idle_shards, idle_secs).await?;
    let one = |x: f64| summarize(&[x]);
    let rows = vec![
        Row {
            name: format!(
                "R-MEM shard entries left ({}/s, {load_secs} s, 2 groups; keep_acked 0 vs no trim)",
                a.rate
            ),
            unit: "entries".into(),
            value: one(on.entries),
            baseline: Some(one(off.entries)),
            goal: format!("≤ {} (100 per shard)", 100 * a.shards),
        },
        Row {
            name:
                "R-MEM used_memory growth over the last 2/3 of the load (keep_acked 0 vs no trim)"
                    .into(),
            unit: "MiB".into(),
            value: one(on.growth_mib),
            baseline: Some(one(off.growth_mib)),
            goal: "flat vs linear".into(),
        },
        Row {
            name: format!(
                "R-IDLE trimming commands per shard per minute ({idle_shards} idle shards)"
            ),
            unit: "cmd".into(),
            value: one(trim),
            baseline: None,
            goal: "≤ 1".into(),
        },
        Row {
            name: format!(
                "R-IDLE all coordinator commands per shard per minute ({idle_shards} idle shards)"
            ),
            unit: "cmd".into(),
            value: one(all),
            baseline: None,
            goal: "≤ 1 (the lag sampler's re-read included)".into(),
        },
    ];
    emit(&rows)?;
    Ok(())
}
