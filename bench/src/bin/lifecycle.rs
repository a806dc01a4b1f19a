//! P5: group lifecycle times with real processes, in heartbeat intervals. Every member is a
//! separate process (this binary re-executed as `lifecycle member …`, a `ConsumerApp` with one
//! no-op listener) heartbeating a real coordinator with the Redis store:
//!
//! - join: a third member process starts → the group is stable with 3 members owning every
//!   shard (goal ≤ 2 intervals);
//! - kill -9 of a member → the survivors own every shard (goal ≤ session timeout + 1 interval);
//! - graceful leave (SIGTERM: the member drains, acknowledges and leaves) → the survivor owns
//!   every shard (goal ≤ 1 interval);
//! - reshard: a group of 10 members on 100 shards, `POST reshard {shard_count: 1000}` → stable
//!   with all 1,000 shards owned (Kafka's KIP-848 figure: 5 s).
//!
//! P5' (sub-heartbeat convergence through the wake-up channel, `POST /v1/wakeups`): 12 shards,
//! heartbeat 2 s (`--prime-heartbeat-ms`), on 1 and on 3 coordinators sharing the Redis store
//! (pod i talks to coordinator i mod n, so the coordinator that decides a join or a leave is
//! never the one holding the other pods' channels): a third pod joins → stable, and a pod
//! leaves gracefully → stable, in heartbeat intervals. Baseline: the same with the pods'
//! wake-up channel turned off (members learn at their heartbeats, as before), same run. Each
//! change starts at a pseudo-random phase of the heartbeat interval.
//!
//! "Stable" is read from `GET /v1/groups/{group}`: state `stable`, the expected members, each
//! owning exactly what it is assigned, all shards owned, no reshard running.
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p rsc-bench --bin lifecycle [-- --quick]
//! ```

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use nix::sys::signal::Signal;
use rsc_bench::{Row, emit, summarize};
use rsc_client::{ConsumerApp, HandlerError, Listener, Message, Raw};
use rsc_testkit::{CoordinatorProcess, RedisServer, signal};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Group lifecycle times with real member processes, in heartbeat intervals")]
struct Args {
    #[command(subcommand)]
    member: Option<MemberCmd>,
    /// One repetition (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Repetitions (median, min, max are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Heartbeat interval of the groups, ms.
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    /// Session timeout of the groups, ms.
    #[arg(long, default_value_t = 3000)]
    session_ms: u64,
    /// Heartbeat interval of the P5' groups, ms.
    #[arg(long, default_value_t = 2000)]
    prime_heartbeat_ms: u64,
    /// Only the P5' rows.
    #[arg(long)]
    only_prime: bool,
    /// Skip the P5' rows.
    #[arg(long)]
    skip_prime: bool,
}

#[derive(Debug, Subcommand)]
enum MemberCmd {
    /// Runs one member process (used by the benchmark itself).
    Member {
        #[arg(long)]
        coordinator: String,
        #[arg(long)]
        redis: String,
        #[arg(long)]
        group: String,
        #[arg(long)]
        stream: String,
        #[arg(long)]
        instance: String,
        /// Without the wake-up channel.
        #[arg(long)]
        no_wake: bool,
    },
}

/// Member processes, killed when dropped.
#[derive(Default)]
struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Bench {
    http: reqwest::Client,
    base: String,
    redis_url: String,
    heartbeat_ms: u64,
    session_ms: u64,
}

impl Bench {
    fn spawn(
        &self,
        members: &mut Members,
        group: &str,
        stream: &str,
        instance: &str,
    ) -> Result<()> {
        self.spawn_on(&self.base, true, members, group, stream, instance)
    }

    fn spawn_on(
        &self,
        coordinator: &str,
        wake: bool,
        members: &mut Members,
        group: &str,
        stream: &str,
        instance: &str,
    ) -> Result<()> {
        let child = Command::new(std::env::current_exe()?)
            .args([
                "member",
                "--coordinator",
                coordinator,
                "--redis",
                &self.redis_url,
            ])
            .args(["--group", group, "--stream", stream, "--instance", instance])
            .args(if wake { &[][..] } else { &["--no-wake"][..] })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("spawn member process")?;
        members.0.push(child);
        Ok(())
    }

    async fn create(&self, group: &str, stream: &str, shards: u32) -> Result<()> {
        self.create_with(group, stream, shards, self.heartbeat_ms, self.session_ms)
            .await
    }

    async fn create_with(
        &self,
        group: &str,
        stream: &str,
        shards: u32,
        heartbeat_ms: u64,
        session_ms: u64,
    ) -> Result<()> {
        let r = self
            .http
            .post(format!("{}/v1/groups", self.base))
            .json(&json!({
                "group": group, "stream": stream, "shard_count": shards,
                "heartbeat_interval_ms": heartbeat_ms,
                "session_timeout_ms": session_ms,
            }))
            .send()
            .await?;
        if r.status().as_u16() != 201 {
            bail!("create group {group}: {}", r.text().await?);
        }
        Ok(())
    }

    /// Waits until `group` is stable with `members` members owning `shards` shards; returns
    /// the time from `since`.
    async fn stable(
        &self,
        group: &str,
        members: usize,
        shards: usize,
        since: Instant,
        limit: Duration,
    ) -> Result<Duration> {
        let url = format!("{}/v1/groups/{group}", self.base);
        loop {
            let v: Value = self.http.get(&url).send().await?.json().await?;
            let ms = v["members"].as_array().cloned().unwrap_or_default();
            let owned: usize = ms
                .iter()
                .map(|m| m["owned_shards"].as_array().map_or(0, Vec::len))
                .sum();
            let reshard_done = v["resharding"].is_null() || v["resharding"]["state"] == "complete";
            if v["state"] == "stable"
                && ms.len() == members
                && owned == shards
                && reshard_done
                && ms.iter().all(|m| m["owned_shards"] == m["assigned_shards"])
            {
                return Ok(since.elapsed());
            }
            if since.elapsed() > limit {
                bail!(
                    "{group} not stable with {members} members, {shards} shards after {limit:?}: {v}"
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn intervals(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0 / self.heartbeat_ms as f64
    }
}

async fn run_member(
    coordinator: String,
    redis: String,
    group: String,
    stream: String,
    instance: String,
    wake: bool,
) -> Result<()> {
    let listener = Listener::new(&group, &stream, |msg: Message<Raw>| async move {
        std::hint::black_box(msg.payload());
        Ok::<(), HandlerError>(())
    });
    let app = ConsumerApp::builder()
        .coordinator(&coordinator)
        .redis_url(redis)
        .instance_id(instance)
        .shutdown_timeout(Duration::from_secs(5))
        .wake_channel(wake)
        .listener(listener)
        .build()?;
    app.run().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(MemberCmd::Member {
        coordinator,
        redis,
        group,
        stream,
        instance,
        no_wake,
    }) = args.member
    {
        return run_member(coordinator, redis, group, stream, instance, !no_wake).await;
    }
    let reps = if args.quick { 1 } else { args.reps.max(1) };
    let redis = RedisServer::start().context("redis-server")?;
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-url",
        &redis.url(),
        "--key-prefix",
        "bench",
    ])
    .context("rsc-coordinator (build it first: cargo build --release --bins)")?;
    let b = Bench {
        http: {
            rsc_client::install_crypto_provider();
            reqwest::Client::new()
        },
        base: coordinator.url(),
        redis_url: redis.url(),
        heartbeat_ms: args.heartbeat_ms,
        session_ms: args.session_ms,
    };
    let settle = Duration::from_secs(30);
    let (mut join, mut kill, mut leave, mut reshard) = (vec![], vec![], vec![], vec![]);
    let p5_reps = if args.only_prime { 0 } else { reps };
    for rep in 0..p5_reps {
        let (g, s) = (format!("life-{rep}"), format!("life-{rep}"));
        b.create(&g, &s, 8).await?;
        let mut members = Members::default();
        b.spawn(&mut members, &g, &s, "a")?;
        b.spawn(&mut members, &g, &s, "b")?;
        b.stable(&g, 2, 8, Instant::now(), settle).await?;

        let t = Instant::now();
        b.spawn(&mut members, &g, &s, "c")?;
        join.push(b.intervals(b.stable(&g, 3, 8, t, settle).await?));

        let t = Instant::now();
        members.0[0].kill()?; // SIGKILL
        kill.push(b.intervals(b.stable(&g, 2, 8, t, settle).await?));

        let t = Instant::now();
        signal(members.0[1].id(), Signal::SIGTERM)?;
        leave.push(b.intervals(b.stable(&g, 1, 8, t, settle).await?));
        drop(members);

        let (g, s) = (format!("reshard-{rep}"), format!("reshard-{rep}"));
        b.create(&g, &s, 100).await?;
        let mut members = Members::default();
        for i in 0..10 {
            b.spawn(&mut members, &g, &s, &format!("r{i}"))?;
        }
        b.stable(&g, 10, 100, Instant::now(), settle).await?;
        let t = Instant::now();
        let r = b
            .http
            .post(format!("{}/v1/streams/{s}/reshard", b.base))
            .json(&json!({"shard_count": 1000}))
            .send()
            .await?;
        if r.status().as_u16() != 202 {
            bail!("reshard: {}", r.text().await?);
        }
        reshard.push(b.stable(&g, 10, 1000, t, settle).await?.as_secs_f64() * 1000.0);
        drop(members);
        eprintln!(
            "rep {rep}: join {:.2}, kill -9 {:.2}, leave {:.2} intervals; reshard {:.0} ms",
            join[rep], kill[rep], leave[rep], reshard[rep]
        );
    }
    let mut rows = Vec::new();
    if !args.skip_prime {
        let extra: Vec<CoordinatorProcess> = (0..2)
            .map(|_| {
                CoordinatorProcess::start(&[
                    "--store",
                    "redis",
                    "--redis-url",
                    &redis.url(),
                    "--key-prefix",
                    "bench",
                ])
            })
            .collect::<std::io::Result<_>>()
            .context("more coordinators")?;
        let all: Vec<String> = std::iter::once(b.base.clone())
            .chain(extra.iter().map(CoordinatorProcess::url))
            .collect();
        let hb = args.prime_heartbeat_ms;
        for n in [1usize, 3] {
            let urls = &all[..n];
            let mut got = [vec![], vec![], vec![], vec![]]; // join on, leave on, join off, leave off
            for rep in 0..reps {
                for (i, wake) in [true, false].into_iter().enumerate() {
                    let (j, l) =
                        prime_rep(&b, urls, wake, hb, &format!("p5p-{n}-{wake}-{rep}")).await?;
                    got[2 * i].push(j);
                    got[2 * i + 1].push(l);
                    eprintln!(
                        "P5' rep {rep}, {n} coordinator(s), wake {wake}: join {j:.2}, leave {l:.2} intervals"
                    );
                }
            }
            let place = if n == 1 {
                "1 coordinator".to_owned()
            } else {
                format!("{n} coordinators, pods spread")
            };
            rows.push(Row {
                name: format!("P5' join -> settled, wake-up channel vs none ({place}, 12 shards, interval {hb} ms)"),
                unit: "intervals".into(),
                value: summarize(&got[0]),
                baseline: Some(summarize(&got[2])),
                goal: "<= 0.3 interval".into(),
            });
            rows.push(Row {
                name: format!("P5' graceful leave -> settled, wake-up channel vs none ({place})"),
                unit: "intervals".into(),
                value: summarize(&got[1]),
                baseline: Some(summarize(&got[3])),
                goal: "<= 0.3 interval".into(),
            });
        }
    }
    if args.only_prime {
        emit(&rows)?;
        return Ok(());
    }
    let hb = args.heartbeat_ms;
    let budget_kill = args.session_ms as f64 / hb as f64 + 1.0;
    rows.splice(
        0..0,
        [
            Row {
                name: format!(
                    "P5 join -> group stable (3rd member process, 8 shards, interval {hb} ms)"
                ),
                unit: "intervals".into(),
                value: summarize(&join),
                baseline: None,
                goal: "<= 2 intervals".into(),
            },
            Row {
                name: format!(
                    "P5 kill -9 -> shards resumed (session {} ms)",
                    args.session_ms
                ),
                unit: "intervals".into(),
                value: summarize(&kill),
                baseline: None,
                goal: format!("<= {budget_kill:.0} intervals (session timeout + 1)"),
            },
            Row {
                name: "P5 graceful leave (SIGTERM) -> shards resumed".into(),
                unit: "intervals".into(),
                value: summarize(&leave),
                baseline: None,
                goal: "<= 1 interval".into(),
            },
            Row {
                name: format!(
                    "P5 reshard 100 -> 1000 shards, 10 members -> stable (interval {hb} ms)"
                ),
                unit: "ms".into(),
                value: summarize(&reshard),
                baseline: None,
                goal: "<= 5000 ms (KIP-848)".into(),
            },
        ],
    );
    emit(&rows)?;
    Ok(())
}

/// A pseudo-random delay within `interval_ms` (so a change lands at any phase of the pods'
/// heartbeats).
fn random_phase(interval_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    Duration::from_millis(nanos % interval_ms.max(1))
}

/// One P5' repetition: two pods stable, a third joins, then the second leaves (SIGTERM).
/// Returns (join, leave) in intervals.
async fn prime_rep(b: &Bench, urls: &[String], wake: bool, hb: u64, g: &str) -> Result<(f64, f64)> {
    let settle = Duration::from_secs(30);
    b.create_with(g, g, 12, hb, hb * 5).await?;
    let mut members = Members::default();
    b.spawn_on(&urls[0], wake, &mut members, g, g, "a")?;
    b.spawn_on(&urls[1 % urls.len()], wake, &mut members, g, g, "b")?;
    b.stable(g, 2, 12, Instant::now(), settle).await?;
    tokio::time::sleep(random_phase(hb)).await;
    let t = Instant::now();
    b.spawn_on(&urls[2 % urls.len()], wake, &mut members, g, g, "c")?;
    let join = b.stable(g, 3, 12, t, settle).await?;
    tokio::time::sleep(random_phase(hb)).await;
    let t = Instant::now();
    signal(members.0[1].id(), Signal::SIGTERM)?;
    let leave = b.stable(g, 2, 12, t, settle).await?;
    let iv = |d: Duration| d.as_secs_f64() * 1000.0 / hb as f64;
    Ok((iv(join), iv(leave)))
}
