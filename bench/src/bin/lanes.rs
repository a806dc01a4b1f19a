//! Key concurrency (GUIDE "Key concurrency"): a group's drain rate with `key_concurrency(n)`
//! beside `key_concurrency(1)`, measured in the same run on the same Redis:
//!
//! - **L1**: a 20 ms handler on 8 shards with 8 members (one process), a backlog over 10,000
//!   keys, drain rate for `n` = 1, 4, 16, 64. Goal: ≥ 0.7 × n × the one-per-shard bound
//!   (`8 × 1000 / 20` = 400/s) up to where the machine saturates; the listener's CPU per entry
//!   (the process' user + system time while draining) within 1.2× of `n` = 1.
//! - **L2**: a 0 ms handler, 4 shards, one member, a pre-filled stream (as P10): `n` = 16 costs
//!   ≤ 5% against `n` = 1.
//! - **L3**: L1's setup at `n` = 16 with one poison key (every attempt fails, 2 retries, then
//!   the dead letter): the other keys' drain rate against the same run without it. Goal ≥ 0.8.
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p rsc-bench --bin lanes [-- --quick] [--only l2]
//! ```

use clap::Parser;
use rsc_bench::{Row, Summary, emit, summarize};
use rsc_client::producer::{Producer, Record};
use rsc_client::{ConsumerApp, HandlerError, Listener, Message};
use rsc_testkit::{CoordinatorProcess, RedisServer};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Drain rate and CPU per entry with key concurrency, against key_concurrency(1)")]
struct Args {
    /// Smaller run (CI smoke run): n = 1 and 4, small backlogs.
    #[arg(long)]
    quick: bool,
    /// Key concurrencies of L1 (comma-separated).
    #[arg(long, value_delimiter = ',')]
    lanes: Option<Vec<usize>>,
    /// Seconds of backlog per run at the goal's rate (L1).
    #[arg(long)]
    secs: Option<f64>,
    /// Messages of the L2 runs.
    #[arg(long)]
    messages: Option<u64>,
    /// Run one section only: `l2` (the 0 ms handler comparison).
    #[arg(long)]
    only: Option<String>,
}

/// What a drain measured.
#[derive(Debug, Clone, Copy)]
struct Drained {
    /// Entries handled per second, from the first handling to the last.
    rate: f64,
    /// The process' CPU time per entry handled, µs.
    cpu_us: f64,
}

/// The process' user + system CPU time.
fn cpu_time() -> Duration {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(
        Duration::ZERO,
        |u| {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::new(tv.tv_sec() as u64, tv.tv_usec() as u32 * 1000)
            };
            t(u.user_time()) + t(u.system_time())
        },
    )
}

/// One drain's setup.
struct Setup<'a> {
    coordinator: &'a str,
    redis_url: &'a str,
    name: String,
    shards: u32,
    members: u32,
    lanes: usize,
    handle: Duration,
    entries: u64,
    keys: u64,
    /// Every attempt of this key's entries fails (dead-lettered after 2 retries).
    poison: Option<String>,
    /// Publish the backlog before the members start (else once they own every shard).
    prefill: bool,
}

async fn create_group(s: &Setup<'_>) -> anyhow::Result<()> {
    rsc_bench::create_group(
        s.coordinator,
        serde_json::json!({"group": s.name, "stream": s.name, "shard_count": s.shards,
            "session_timeout_ms": 6000, "heartbeat_interval_ms": 500}),
    )
    .await
}

/// Waits until every shard of the group is owned by a stable member.
async fn wait_stable(s: &Setup<'_>) -> anyhow::Result<()> {
    let http = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let g: serde_json::Value = http
            .get(format!("{}/v1/groups/{}", s.coordinator, s.name))
            .send()
            .await?
            .json()
            .await?;
        let members = g["members"].as_array().cloned().unwrap_or_default();
        let owned: usize = members
            .iter()
            .map(|m| m["owned_shards"].as_array().map_or(0, Vec::len))
            .sum();
        if members.len() == s.members as usize
            && members.iter().all(|m| m["state"] == "stable")
            && owned == s.shards as usize
        {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the group never became stable");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Handlings counted, with the first start and the last end (µs since `origin`).
#[derive(Default)]
struct Tally {
    handled: AtomicU64,
    first_us: AtomicU64,
    last_us: AtomicU64,
}

fn listener(s: &Setup<'_>, tally: Arc<Tally>, origin: Instant) -> Listener {
    let handle = s.handle;
    let poison = s.poison.clone();
    Listener::new(&s.name, &s.name, move |msg: Message<rsc_client::Raw>| {
        let tally = tally.clone();
        let poisoned = poison.is_some() && msg.key() == poison.as_deref();
        async move {
            let start = origin.elapsed().as_micros() as u64 + 1;
            let _ = tally
                .first_us
                .compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
            if !handle.is_zero() {
                tokio::time::sleep(handle).await;
            }
            if poisoned {
                return Err(HandlerError::retry("poison"));
            }
            tally
                .last_us
                .fetch_max(origin.elapsed().as_micros() as u64, Ordering::Relaxed);
            tally.handled.fetch_add(1, Ordering::Relaxed);
            Ok::<(), HandlerError>(())
        }
    })
    .concurrency(s.members)
    .key_concurrency(s.lanes)
    .max_retries(2)
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
}

/// Publishes the backlog: `entries` over `keys` keys, in batches of 500.
async fn fill(s: &Setup<'_>) -> anyhow::Result<()> {
    let producer = Producer::builder()
        .coordinator(s.coordinator)
        .redis_url(s.redis_url)
        .build()?;
    let mut seq = 0u64;
    while seq < s.entries {
        let n = 500.min(s.entries - seq);
        let batch: Vec<Record> = (seq..seq + n)
            .map(|i| Record::raw(b"x".to_vec()).key(format!("k{}", i % s.keys)))
            .collect();
        producer.publish_batch(&s.name, batch).await?;
        seq += n;
    }
    Ok(())
}

/// Starts the members, waits until they own every shard, publishes the backlog and waits
/// until every entry (but the poison key's) was handled.
async fn drain(s: Setup<'_>) -> anyhow::Result<Drained> {
    create_group(&s).await?;
    if s.prefill {
        fill(&s).await?;
    }
    let origin = Instant::now();
    let tally = Arc::new(Tally::default());
    let app = ConsumerApp::builder()
        .coordinator(s.coordinator)
        .redis_url(s.redis_url)
        .instance_id(format!("bench-{}", s.name))
        .listener(listener(&s, tally.clone(), origin))
        .build()?;
    let handle = app.handle();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    wait_stable(&s).await?;
    if !s.prefill {
        fill(&s).await?;
    }
    let (cpu0, handled0) = (cpu_time(), tally.handled.load(Ordering::Relaxed));
    // The poison key is `k7`: entries 7, 7 + keys, 7 + 2 × keys, …
    let poisoned = s
        .poison
        .as_ref()
        .map_or(0, |_| (s.entries + s.keys - 1).saturating_sub(7) / s.keys);
    let expect = s.entries - poisoned;
    let deadline = Instant::now() + Duration::from_secs(300);
    while tally.handled.load(Ordering::Relaxed) < expect {
        anyhow::ensure!(Instant::now() < deadline, "not every entry was handled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (cpu1, handled1) = (cpu_time(), tally.handled.load(Ordering::Relaxed));
    handle.shutdown();
    run.await??;
    let span_us = tally
        .last_us
        .load(Ordering::Relaxed)
        .saturating_sub(tally.first_us.load(Ordering::Relaxed))
        .max(1);
    Ok(Drained {
        rate: expect as f64 / (span_us as f64 / 1e6),
        cpu_us: (cpu1 - cpu0).as_secs_f64() * 1e6 / (handled1 - handled0).max(1) as f64,
    })
}

fn one(x: f64) -> Summary {
    summarize(&[x])
}

/// L1 at each `n`, and L3 at 16 lanes.
async fn l1_l3(args: &Args, coordinator: &str, redis_url: &str) -> anyhow::Result<Vec<Row>> {
    let lanes = args.lanes.clone().unwrap_or_else(|| {
        if args.quick {
            vec![1, 4]
        } else {
            vec![1, 4, 16, 64]
        }
    });
    let secs = args.secs.unwrap_or(if args.quick { 1.0 } else { 3.0 });
    let bound = 8.0 * 1000.0 / 20.0;
    let setup = |n: usize, entries: u64, poison: Option<String>, tag: &str| Setup {
        coordinator,
        redis_url,
        name: format!("lanes-{tag}{n}"),
        shards: 8,
        members: 8,
        lanes: n,
        handle: Duration::from_millis(20),
        entries,
        keys: 10_000,
        poison,
        prefill: false,
    };
    let mut rows = Vec::new();
    let mut base: Option<Drained> = None;
    for &n in &lanes {
        // Enough backlog for `secs` at the goal's rate (the rate n × the bound).
        let entries = ((n as f64 * bound * secs) as u64).max(400);
        let d = drain(setup(n, entries, None, "")).await?;
        println!(
            "L1 n={n}: {:.0} entries/s, {:.0} µs CPU/entry",
            d.rate, d.cpu_us
        );
        let b = *base.get_or_insert(d);
        rows.push(Row {
            name: format!(
                "L1 drain rate, 20 ms handler, 8 shards × 8 members, key_concurrency {n} ({entries} entries)"
            ),
            unit: "entries/s".into(),
            value: one(d.rate),
            baseline: Some(one(b.rate)),
            goal: format!("ratio ≥ {:.1} (0.7 × n, until the machine saturates)", 0.7 * n as f64),
        });
        rows.push(Row {
            name: format!("L1 listener CPU per entry, key_concurrency {n}"),
            unit: "µs".into(),
            value: one(d.cpu_us),
            baseline: Some(one(b.cpu_us)),
            goal: "ratio ≤ 1.2".into(),
        });
    }
    let n = if args.quick { 4 } else { 16 };
    let entries = ((n as f64 * bound * secs) as u64).max(400);
    // 100 keys: one poison key holds 1% of the entries.
    let mut clean = setup(n, entries, None, "clean");
    clean.keys = 100;
    let mut dirty = setup(n, entries, Some("k7".into()), "poison");
    dirty.keys = 100;
    let c = drain(clean).await?;
    let p = drain(dirty).await?;
    rows.push(Row {
        name: format!(
            "L3 other keys' drain rate with one poison key (of 100), key_concurrency {n}"
        ),
        unit: "entries/s".into(),
        value: one(p.rate),
        baseline: Some(one(c.rate)),
        goal: "ratio ≥ 0.8 (baseline: the same backlog without the poison key)".into(),
    });
    Ok(rows)
}

/// L2: a 0 ms handler on a pre-filled 4-shard stream, `n` = 16 against `n` = 1, alternating
/// which goes first, after one unmeasured drain of each (the process' first drains also pay
/// its warm-up: connections, allocator growth); the drain rate and the process' CPU per entry.
async fn l2(args: &Args, coordinator: &str, redis_url: &str) -> anyhow::Result<Vec<Row>> {
    let messages = args
        .messages
        .unwrap_or(if args.quick { 5_000 } else { 50_000 });
    let reps = if args.quick { 1 } else { 5 };
    let run = |n: usize, rep: String, entries: u64| {
        drain(Setup {
            coordinator,
            redis_url,
            name: format!("lanes-zero-{n}-{rep}"),
            shards: 4,
            members: 1,
            lanes: n,
            handle: Duration::ZERO,
            entries,
            keys: 4096,
            poison: None,
            prefill: true,
        })
    };
    for n in [1, 16] {
        run(n, "warm-up".into(), messages / 5).await?;
    }
    let (mut rate, mut cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for rep in 0..reps {
        for &n in if rep % 2 == 0 { &[1, 16] } else { &[16, 1] } {
            let d = run(n, rep.to_string(), messages).await?;
            println!(
                "L2 n={n}: {:.0} msgs/s, {:.2} µs CPU/entry",
                d.rate, d.cpu_us
            );
            let i = usize::from(n != 1);
            rate[i].push(d.rate);
            cpu[i].push(d.cpu_us);
        }
    }
    Ok(vec![
        Row {
            name: format!(
                "L2 drain rate, 0 ms handler, 4 shards, key_concurrency 16 vs 1 ({messages} msgs)"
            ),
            unit: "msgs/s".into(),
            value: summarize(&rate[1]),
            baseline: Some(summarize(&rate[0])),
            goal: "ratio ≥ 0.95".into(),
        },
        Row {
            name: "L2 CPU per entry of the listener process, key_concurrency 16 vs 1".into(),
            unit: "µs".into(),
            value: summarize(&cpu[1]),
            baseline: Some(summarize(&cpu[0])),
            goal: "- (user + system time while draining, same runs)".into(),
        },
    ])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let redis = RedisServer::start()?;
    let coordinator = CoordinatorProcess::start(&["--store", "memory"])?;
    let url = coordinator.url();
    let mut rows = match args.only.as_deref() {
        None => l1_l3(&args, &url, &redis.url()).await?,
        Some("l2") => Vec::new(),
        Some(other) => anyhow::bail!("--only {other}: the section that runs alone is `l2`"),
    };
    rows.extend(l2(&args, &url, &redis.url()).await?);
    emit(&rows)?;
    Ok(())
}
