//! P5' steady-state cost of wake-up channels (`POST /v1/wakeups`): one coordinator with the
//! Redis store holding N open channels (default 10,000, one member each, as N single-member
//! processes would), against the same coordinator with none, same run:
//!
//! - coordinator `VmRSS` with the channels open (goal < 200 MB; the first repetition is on a
//!   fresh coordinator, later ones on memory the previous channels freed);
//! - p99 latency of steady heartbeats (64 stable members, 32 in flight), channels open vs
//!   none (goal: unchanged, ratio ≤ 1.1 within the noise);
//! - Redis commands per steady heartbeat (`total_commands_processed` delta / heartbeats),
//!   channels open vs none (goal: not more: a steady heartbeat publishes nothing).
//!
//! The channels are held by a child process (this binary again, `--hold URL`), as they would
//! be by other processes: held in the load generator itself, 10,000 idle connections made
//! its own heartbeats about a fifth dearer in CPU (user time), and on two cores that CPU
//! came out of the coordinator's share and showed in the p99 (docs/benchmarks/HISTORY.md,
//! "Heartbeat hot path, third pass"; `--channels-in-process` measures it that way).
//!
//! ```text
//! cargo build --release --bins && target/release/wake [--quick] [--channels N]
//! ```

use anyhow::{Context, Result, bail};
use clap::Parser;
use rsc_bench::{Row, emit, rss_mib, summarize};
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Steady-state cost of wake-up channels: RSS, heartbeat p99, Redis commands")]
struct Args {
    /// Small and short (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Open channels.
    #[arg(long, default_value_t = 10_000)]
    channels: usize,
    /// Repetitions of each phase (median, min, max).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Length of one load phase, ms.
    #[arg(long, default_value_t = 3000)]
    phase_ms: u64,
    /// Steady members heartbeating.
    #[arg(long, default_value_t = 64)]
    members: usize,
    /// Heartbeats in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Hold the channels in this process, beside the load generator (the first way this
    /// was measured), instead of in a child process.
    #[arg(long)]
    channels_in_process: bool,
    /// Child mode: open `--channels` channels on the coordinator at this URL, print
    /// `ready`, and hold them until standard input closes.
    #[arg(long, hide = true)]
    hold: Option<String>,
}

const GROUP: &str = "wake-bench";

fn commands(redis: &RedisServer) -> Result<u64> {
    let info = redis.command("INFO stats")?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .context("total_commands_processed")
}

/// Members joined and settled: (member, epoch, owned).
async fn settle_members(
    http: &reqwest::Client,
    base: &str,
    n: usize,
) -> Result<Vec<(String, i64, Vec<u64>)>> {
    let mut members: Vec<(String, i64, Vec<u64>)> =
        (0..n).map(|i| (format!("m{i}"), 0, vec![])).collect();
    for _ in 0..20 {
        let mut changed = false;
        for m in &mut members {
            let v: Value = http
                .post(format!("{base}/v1/groups/{GROUP}/heartbeat"))
                .json(&json!({"protocol_version": 1, "member_id": m.0, "member_epoch": m.1, "owned_shards": m.2}))
                .send()
                .await?
                .json()
                .await?;
            let epoch = v["member_epoch"].as_i64().context("epoch")?;
            let owned: Vec<u64> = v["assignment"]
                .as_array()
                .context("assignment")?
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            if epoch != m.1 || owned != m.2 {
                changed = true;
            }
            m.1 = epoch;
            m.2 = owned;
        }
        if !changed {
            return Ok(members);
        }
    }
    bail!("members did not settle")
}

/// Steady heartbeats for `phase`, `concurrency` in flight: (p99 latency ms, heartbeats).
async fn steady_load(
    http: &reqwest::Client,
    base: &str,
    members: &Arc<Vec<(String, i64, Vec<u64>)>>,
    concurrency: usize,
    phase: Duration,
) -> Result<(f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (http, stop, members, url) = (
            http.clone(),
            stop.clone(),
            members.clone(),
            format!("{base}/v1/groups/{GROUP}/heartbeat"),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let m = &members[i % members.len()];
                i += concurrency;
                let t = Instant::now();
                let r = http
                    .post(&url)
                    .json(&json!({"protocol_version": 1, "member_id": m.0, "member_epoch": m.1, "owned_shards": m.2}))
                    .send()
                    .await?;
                if !r.status().is_success() {
                    bail!("heartbeat {}: {}", r.status(), r.text().await?);
                }
                let _ = r.bytes().await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort_by(|a, b| a.total_cmp(b));
    let p99 = all[(all.len() * 99 / 100).min(all.len() - 1)];
    Ok((p99, all.len() as u64))
}

/// Opens `n` channels (one member each); returns their reader tasks once every one is ready.
async fn open_channels(base: &str, n: usize) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let mut handles = Vec::with_capacity(n);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<Result<()>>();
    let sem = Arc::new(tokio::sync::Semaphore::new(256));
    for i in 0..n {
        let (http, ready_tx, sem, url) = (
            http.clone(),
            ready_tx.clone(),
            sem.clone(),
            format!("{base}/v1/wakeups"),
        );
        handles.push(tokio::spawn(async move {
            let permit = sem.acquire_owned().await;
            let opened = http
                .post(&url)
                .json(&json!({"members": [{"group": GROUP, "member_id": format!("ch{i}")}]}))
                .send()
                .await;
            let mut resp = match opened {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    let _ = ready_tx.send(Err(anyhow::anyhow!("open: {}", r.status())));
                    return;
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            // The `ready` event.
            let first = resp.chunk().await;
            drop(permit);
            let _ = ready_tx.send(match first {
                Ok(Some(_)) => Ok(()),
                other => Err(anyhow::anyhow!("no ready event: {other:?}")),
            });
            // Hold the channel open, reading keep-alives, until aborted.
            while let Ok(Some(_)) = resp.chunk().await {}
        }));
    }
    drop(ready_tx);
    for _ in 0..n {
        ready_rx.recv().await.context("channel task ended")??;
    }
    Ok(handles)
}

/// Channels held open, by this process or by a child process.
enum Held {
    InProcess(Vec<tokio::task::JoinHandle<()>>),
    Child(std::process::Child),
}

impl Held {
    async fn open(base: &str, n: usize, in_process: bool) -> Result<Self> {
        if in_process {
            return Ok(Held::InProcess(open_channels(base, n).await?));
        }
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["--hold", base, "--channels", &n.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("the channel holder process")?;
        let stdout = child.stdout.take().context("holder stdout")?;
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        })
        .await??;
        if line.trim() != "ready" {
            let _ = child.kill();
            bail!("the channel holder failed: {line:?}");
        }
        Ok(Held::Child(child))
    }

    /// Closes every channel.
    fn close(self) {
        match self {
            Held::InProcess(tasks) => tasks.iter().for_each(|t| t.abort()),
            Held::Child(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Child mode: opens the channels, says `ready`, holds them until standard input closes.
async fn hold(base: &str, n: usize) -> Result<()> {
    let channels = open_channels(base, n).await?;
    println!("ready");
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    })
    .await?;
    drop(channels);
    Ok(())
}

/// Waits until the coordinator's `rsc_wake_channels_open` is 0.
async fn open_gauge_zero(http: &reqwest::Client, base: &str, limit: Duration) -> Result<()> {
    let t = Instant::now();
    loop {
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let open = text
            .lines()
            .find_map(|l| l.strip_prefix("rsc_wake_channels_open "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if open == 0.0 {
            return Ok(());
        }
        if t.elapsed() > limit {
            bail!("{open} wake-up channels still open after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if let Some(base) = &args.hold {
        rsc_client::install_crypto_provider();
        return hold(base, args.channels).await;
    }
    if args.quick {
        args.channels = args.channels.min(500);
        args.reps = 1;
        args.phase_ms = 500;
    }
    let redis = RedisServer::start().context("redis-server")?;
    let url = redis.url();
    let max = (args.channels + 100).to_string();
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--key-prefix",
        "bench",
        "--wake-max-channels",
        &max,
    ])
    .context("rsc-coordinator (build it first: cargo build --release --bins)")?;
    let base = coordinator.url();
    let pid = coordinator.pid().context("coordinator pid")?;
    // reqwest is built with rustls but no built-in provider (rsc_api::install_crypto_provider).
    rsc_client::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let r = http
        .post(format!("{base}/v1/groups"))
        .json(&json!({"group": GROUP, "stream": GROUP, "shard_count": 64,
            "heartbeat_interval_ms": 60_000, "session_timeout_ms": 600_000}))
        .send()
        .await?;
    if r.status().as_u16() != 201 {
        bail!("create group: {}", r.text().await?);
    }
    let members = Arc::new(settle_members(&http, &base, args.members).await?);
    let phase = Duration::from_millis(args.phase_ms);
    // Warm-up.
    steady_load(&http, &base, &members, args.concurrency, phase / 2).await?;
    let rss_before = rss_mib(pid)?;
    let (mut p99_none, mut p99_open, mut cmd_none, mut cmd_open, mut rss_open) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut open_secs = vec![];
    let mut rates = vec![];
    for rep in 0..args.reps {
        let c0 = commands(&redis)?;
        let (p99, n) = steady_load(&http, &base, &members, args.concurrency, phase).await?;
        let c1 = commands(&redis)?;
        let rate_none = n as f64 / phase.as_secs_f64();
        p99_none.push(p99);
        cmd_none.push((c1 - c0 - 1) as f64 / n as f64);

        let t = Instant::now();
        let channels = Held::open(&base, args.channels, args.channels_in_process).await?;
        open_secs.push(t.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_open.push(rss_mib(pid)?);
        let c0 = commands(&redis)?;
        let (p99, n) = steady_load(&http, &base, &members, args.concurrency, phase).await?;
        let c1 = commands(&redis)?;
        p99_open.push(p99);
        cmd_open.push((c1 - c0 - 1) as f64 / n as f64);
        rates.push((rate_none, n as f64 / phase.as_secs_f64()));
        channels.close();
        // The coordinator notices a closed channel when its next keep-alive (every 15 s)
        // fails to write: wait until all are gone before the next repetition.
        open_gauge_zero(&http, &base, Duration::from_secs(40)).await?;
        eprintln!(
            "rep {rep}: p99 {:.2} ms none / {:.2} ms with {} channels; heartbeats/s {:.0} / {:.0}; cmds/hb {:.3} / {:.3}; RSS {:.1} MiB (before {:.1}); opened in {:.1} s",
            p99_none[rep],
            p99_open[rep],
            args.channels,
            rates[rep].0,
            rates[rep].1,
            cmd_none[rep],
            cmd_open[rep],
            rss_open[rep],
            rss_before,
            open_secs[rep]
        );
    }
    let n = args.channels;
    emit(&[
        Row {
            name: format!("P5' coordinator RSS with {n} open wake-up channels (redis store)"),
            unit: "MiB".into(),
            value: summarize(&rss_open),
            baseline: None,
            goal: "< 200 MB".into(),
        },
        Row {
            name: format!(
                "P5' p99 steady heartbeat latency, {n} channels open vs none ({} members, {} in flight)",
                args.members, args.concurrency
            ),
            unit: "ms".into(),
            value: summarize(&p99_open),
            baseline: Some(summarize(&p99_none)),
            goal: "unchanged (ratio ~1)".into(),
        },
        Row {
            name: format!("P5' Redis commands per steady heartbeat, {n} channels open vs none"),
            unit: "cmds".into(),
            value: summarize(&cmd_open),
            baseline: Some(summarize(&cmd_none)),
            goal: "not more (ratio <= 1)".into(),
        },
    ])?;
    Ok(())
}
