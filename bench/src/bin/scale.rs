//! Control-plane scale (rows S1–S3): what idle groups cost, what batching heartbeats buys, and
//! whether 100,000 members heartbeating every 3 s are sustained.
//!
//! - **S1 idle**: N idle groups (1 member each, heartbeat interval 20 min, so nobody heartbeats
//!   during the window) on 1 and on 3 coordinators sharing one `redis-server` (Redis store):
//!   Redis commands/s (`total_commands_processed` of `INFO stats`, less the `INFO` calls
//!   themselves) and each coordinator's CPU (`/proc/<pid>/stat`), against the same window
//!   with 0 groups.
//! - **S2 batched**: the same members, joined and converged, heartbeating at full speed from
//!   the same load generator (32 requests in flight), once as single
//!   `POST /v1/groups/{g}/heartbeat` and once as batches of one process's 32 members in
//!   `POST /v1/heartbeats`, alternating which goes first.
//! - **S3 100k members**: P simulated processes × 32 members over G groups, each process
//!   sending one batch every heartbeat interval (3 s), phases spread evenly; batch latency,
//!   achieved vs offered member-heartbeats/s, CPU, expired members; then the same on 3
//!   coordinators with a 3-node Redis Cluster store, and the saturation rate of both.
//!
//! ```text
//! cargo build --release --bins && target/release/scale            # full (S3: 100,000 members)
//! target/debug/scale --quick                                        # CI smoke run
//! target/release/scale --rows s1 --s1-groups 1000,5000,10000        # one row
//! ```
//! Figures only: no thresholds are asserted (the goals are printed beside them).

use anyhow::{Context, Result, bail};
use clap::Parser;
use rsc_bench::{Row, emit, num, summarize};
use rsc_protocol::{
    BatchedHeartbeat, HeartbeatBatchRequest, HeartbeatBatchResponse, HeartbeatRequest,
    HeartbeatResponse,
};
use rsc_testkit::{CoordinatorProcess, RedisCluster, RedisServer};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    about = "Control-plane scale: idle groups (S1), batched heartbeats (S2), 100k members (S3)"
)]
struct Args {
    /// Short run for CI (well under a minute on debug binaries).
    #[arg(long)]
    quick: bool,
    /// Which rows to run.
    #[arg(long, value_delimiter = ',', default_value = "s1,s2,s3")]
    rows: Vec<String>,
    /// S1: idle group counts [default: 1000,5000,10000; quick: 50,200].
    #[arg(long, value_delimiter = ',')]
    s1_groups: Option<Vec<usize>>,
    /// S1: measurement window per configuration, ms [default: 10000; quick: 1000].
    #[arg(long)]
    s1_window_ms: Option<u64>,
    /// S2: simulated processes of 32 members [default: 32; quick: 16].
    #[arg(long)]
    s2_processes: Option<usize>,
    /// S2: groups the members are spread over [default: 32; quick: 16].
    #[arg(long)]
    s2_groups: Option<usize>,
    /// S2: repetitions of each measurement [default: 5; quick: 2].
    #[arg(long)]
    s2_reps: Option<usize>,
    /// S2: length of one measurement, ms [default: 3000; quick: 500].
    #[arg(long)]
    s2_duration_ms: Option<u64>,
    /// S3: simulated processes of 32 members [default: 3125; quick: 20].
    #[arg(long)]
    s3_processes: Option<usize>,
    /// S3: groups [default: 10000; quick: 64].
    #[arg(long)]
    s3_groups: Option<usize>,
    /// S3: steady window, ms [default: 60000; quick: 3000].
    #[arg(long)]
    s3_window_ms: Option<u64>,
    /// S3: heartbeat interval of the groups (session timeout: 15 intervals).
    #[arg(long, default_value_t = 3000)]
    s3_interval_ms: u64,
    /// S3: coordinator counts to run (1: standalone redis-server; 3: 3-node Redis Cluster).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    s3_coordinators: Vec<usize>,
    /// Members per simulated process (the batch size).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Requests in flight (set-up, S2 and the saturation phase of S3).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Batches in flight while members join and converge (S2, S3): every batch carries a
    /// member of many groups, so each in-flight batch adds a concurrent join per group.
    #[arg(long, default_value_t = 8)]
    setup_concurrency: usize,
    /// Groups per stream (a stream's document lists its groups: keep it small).
    #[arg(long, default_value_t = 100)]
    groups_per_stream: usize,
    /// Passed to every coordinator as `--sweep-interval-ms` (unset: its default).
    #[arg(long)]
    sweep_interval_ms: Option<u64>,
}

impl Args {
    fn pick<T: Copy>(&self, set: Option<T>, full: T, quick: T) -> T {
        set.unwrap_or(if self.quick { quick } else { full })
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring: CPU of processes, Redis commands.

fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User + system CPU seconds of process `pid` so far (`/proc/<pid>/stat`).
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').context("/proc stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    Ok(ticks as f64 / clk_tck())
}

/// From `INFO stats commandstats` of one server: `total_commands_processed` (which counts the
/// commands scripts run inside Redis too), and the script calls clients made (`EVALSHA`,
/// `EVAL`, `FCALL`). The `INFO` call itself is counted by the next one.
fn commands_processed(conn: &Mutex<redis::Connection>) -> Result<(u64, u64)> {
    let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .arg("commandstats")
        .query(&mut *conn)?;
    let total = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .context("total_commands_processed")?;
    let mut scripts = 0;
    for l in info.lines() {
        for cmd in ["evalsha", "eval", "fcall"] {
            if let Some(rest) = l.strip_prefix(&format!("cmdstat_{cmd}:calls=")) {
                scripts += rest
                    .split(',')
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Ok((total, scripts))
}

/// Commands clients send to `redis` (not those scripts run inside Redis) while `work` runs,
/// counted with `MONITOR` on a raw connection (as P1 does).
async fn client_commands<F: std::future::Future<Output = Result<u64>>>(
    redis: &RedisServer,
    work: F,
) -> Result<(u64, u64)> {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", redis.port()))?;
    conn.write_all(b"MONITOR\r\n")?;
    let reader = conn.try_clone()?;
    let lines = std::thread::spawn(move || {
        let mut n = 0u64;
        for line in BufReader::new(reader)
            .lines()
            .map_while(std::result::Result::ok)
        {
            // `+<time> [<db> <client>] "<COMMAND>" ...`; a script's own calls show `[0 lua]`.
            if let Some((client, _)) = line.split_once("] ")
                && !client.ends_with(" lua")
            {
                n += 1;
            }
        }
        n
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let done = work.await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.shutdown(std::net::Shutdown::Both)?;
    let n = lines
        .join()
        .map_err(|_| anyhow::anyhow!("monitor reader panicked"))?;
    Ok((done, n))
}

/// Sends each prepared request once, in order, 8 in flight; returns the member heartbeats
/// answered.
async fn send_each(http: &reqwest::Client, requests: Arc<Vec<Prepared>>) -> Result<u64> {
    let done = Arc::new(AtomicU64::new(0));
    let (h, d, r) = (http.clone(), done.clone(), requests.clone());
    for_each_concurrent(requests.len(), 8, Duration::from_secs(120), move |i| {
        let (h, d, r) = (h.clone(), d.clone(), r.clone());
        async move {
            let p = &r[i];
            let resp = h
                .post(&p.url)
                .header("content-type", "application/json")
                .body(reqwest::Body::from(p.body.to_vec()))
                .send()
                .await?;
            if !resp.status().is_success() {
                bail!("{}: {}", p.url, resp.status());
            }
            let _ = resp.bytes().await?;
            d.fetch_add(p.items, Ordering::Relaxed);
            Ok(())
        }
    })
    .await?;
    Ok(done.load(Ordering::Relaxed))
}

/// What is watched during a window.
struct Probe {
    coordinators: Vec<u32>,
    /// redis-server pids, and one connection to each (opened once: a connection's set-up
    /// commands would be counted).
    redis: Vec<(u32, Mutex<redis::Connection>)>,
}

#[derive(Debug, Clone)]
struct Snap {
    at: Instant,
    coordinators: Vec<f64>,
    redis_cpu: f64,
    commands: u64,
    scripts: u64,
    me: f64,
}

/// Usage over a window.
#[derive(Debug, Clone)]
struct Usage {
    secs: f64,
    /// % of one core, per coordinator.
    coordinator_pct: Vec<f64>,
    /// % of one core, every redis-server together.
    redis_pct: f64,
    /// % of one core, this process (the load generator).
    me_pct: f64,
    /// Commands Redis processed (less the probe's own `INFO` calls).
    commands: u64,
    /// Script calls clients made.
    scripts: u64,
}

impl Usage {
    fn commands_per_s(&self) -> f64 {
        self.commands as f64 / self.secs
    }
    fn max_coordinator_pct(&self) -> f64 {
        self.coordinator_pct.iter().copied().fold(0.0, f64::max)
    }
    fn sum_coordinator_pct(&self) -> f64 {
        self.coordinator_pct.iter().sum()
    }
}

impl Probe {
    fn new(coordinators: &[&CoordinatorProcess], redis: &[&RedisServer]) -> Result<Self> {
        Ok(Probe {
            coordinators: coordinators.iter().map(|c| pid(c)).collect::<Result<_>>()?,
            redis: redis
                .iter()
                .map(|r| {
                    let conn = redis::Client::open(r.url())?.get_connection()?;
                    Ok((r.pid().context("redis pid")?, Mutex::new(conn)))
                })
                .collect::<Result<_>>()?,
        })
    }

    fn snap(&self) -> Result<Snap> {
        let (mut commands, mut scripts) = (0, 0);
        let mut redis_cpu = 0.0;
        for (pid, conn) in &self.redis {
            let (c, s) = commands_processed(conn)?;
            commands += c;
            scripts += s;
            redis_cpu += cpu_seconds(*pid)?;
        }
        Ok(Snap {
            at: Instant::now(),
            coordinators: self
                .coordinators
                .iter()
                .map(|&p| cpu_seconds(p))
                .collect::<Result<_>>()?,
            redis_cpu,
            commands,
            scripts,
            me: cpu_seconds(std::process::id())?,
        })
    }

    fn usage(&self, a: &Snap, b: &Snap) -> Usage {
        let secs = (b.at - a.at).as_secs_f64();
        let pct = |x: f64, y: f64| 100.0 * (y - x) / secs;
        Usage {
            secs,
            coordinator_pct: a
                .coordinators
                .iter()
                .zip(&b.coordinators)
                .map(|(x, y)| pct(*x, *y))
                .collect(),
            redis_pct: pct(a.redis_cpu, b.redis_cpu),
            me_pct: pct(a.me, b.me),
            commands: (b.commands - a.commands).saturating_sub(self.redis.len() as u64),
            scripts: b.scripts - a.scripts,
        }
    }

    /// Samples every `step` for `window`: one [`Usage`] per step, and one over the whole window.
    async fn watch(&self, window: Duration, step: Duration) -> Result<(Vec<Usage>, Usage)> {
        let first = self.snap()?;
        let mut last = first.clone();
        let mut steps = Vec::new();
        let n = (window.as_secs_f64() / step.as_secs_f64()).round().max(1.0) as u32;
        for i in 1..=n {
            tokio::time::sleep_until((first.at + step * i).into()).await;
            let s = self.snap()?;
            steps.push(self.usage(&last, &s));
            last = s;
        }
        let whole = self.usage(&first, &last);
        Ok((steps, whole))
    }
}

// ---------------------------------------------------------------------------------------------
// Processes and set-up.

fn coordinator_args(args: &Args, redis_url: &str, cluster: bool) -> Vec<String> {
    let mut v: Vec<String> = [
        "--store",
        "redis",
        "--redis-url",
        redis_url,
        "--key-prefix",
        "bench",
        "--admin-rate",
        "1000000",
        "--admin-burst",
        "1000000",
    ]
    .map(String::from)
    .to_vec();
    if cluster {
        v.push("--redis-cluster".into());
    }
    if let Some(ms) = args.sweep_interval_ms {
        v.extend(["--sweep-interval-ms".into(), ms.to_string()]);
    }
    v
}

fn start_coordinator(args: &[String]) -> Result<CoordinatorProcess> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    CoordinatorProcess::start(&a)
        .context("rsc-coordinator (build it first: cargo build --release --bins)")
}

fn pid(c: &CoordinatorProcess) -> Result<u32> {
    c.pid().context("coordinator pid")
}

/// Runs `f(0..n)` with at most `concurrency` calls in flight; fails on the first error or
/// after `deadline`.
async fn for_each_concurrent<F, Fut>(
    n: usize,
    concurrency: usize,
    deadline: Duration,
    f: F,
) -> Result<()>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + deadline;
    let mut tasks = Vec::new();
    for _ in 0..concurrency.min(n).max(1) {
        let (f, next) = (f.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok(());
                }
                if Instant::now() > until {
                    bail!("timed out after {deadline:?} at {i} of {n}");
                }
                f(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<(u16, Value)> {
    let r = http.post(url).json(body).send().await?;
    let status = r.status().as_u16();
    let v = r.json().await.unwrap_or(Value::Null);
    Ok((status, v))
}

/// `POST /v1/groups`, retried while the stream's lock is busy or the store conflicts.
async fn create_group(http: &reqwest::Client, base: &str, body: &Value) -> Result<()> {
    let url = format!("{base}/v1/groups");
    for attempt in 0..50 {
        let (s, v) = post(http, &url, body).await?;
        match s {
            201 => return Ok(()),
            409 if attempt > 0 && v["error"]["code"] == "GROUP_ALREADY_EXISTS" => return Ok(()),
            400 | 401 | 403 | 404 => bail!("create group {body}: {s} {v}"),
            _ => tokio::time::sleep(Duration::from_millis(10 + 10 * attempt)).await,
        }
    }
    bail!("create group {body}: still refused after 50 attempts")
}

/// Creates `groups` (name, stream) with the given shard count and timeouts, spread over
/// `bases`, 32 in flight.
async fn create_groups(
    http: &reqwest::Client,
    bases: &[String],
    groups: Vec<(String, String)>,
    shards: u32,
    session_ms: u64,
    interval_ms: u64,
    concurrency: usize,
) -> Result<()> {
    let groups = Arc::new(groups);
    let bases = Arc::new(bases.to_vec());
    let http = http.clone();
    let n = groups.len();
    for_each_concurrent(n, concurrency, Duration::from_secs(900), move |i| {
        let (groups, bases, http) = (groups.clone(), bases.clone(), http.clone());
        async move {
            let (g, s) = &groups[i];
            let body = json!({"group": g, "stream": s, "shard_count": shards,
                "session_timeout_ms": session_ms, "heartbeat_interval_ms": interval_ms,
                "rebalance_timeout_ms": session_ms, "fencing": "lease"});
            create_group(&http, &bases[i % bases.len()], &body).await
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Simulated members.

/// One simulated member: what it sends in its next heartbeat.
#[derive(Debug, Clone)]
struct Sim {
    group: String,
    id: String,
    epoch: i64,
    owned: Vec<u32>,
}

impl Sim {
    fn request(&self) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: 1,
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            owned_shards: Some(self.owned.clone()),
            drained_shards: Vec::new(),
            client: None,
            incarnation: None,
        }
    }

    /// Takes an answer: the member owns what it is assigned at once. True when it changed
    /// anything the member sends next.
    fn apply(&mut self, r: &HeartbeatResponse) -> bool {
        let changed = r.member_epoch != self.epoch || r.assignment != self.owned;
        self.epoch = r.member_epoch;
        self.owned = r.assignment.clone();
        changed
    }
}

/// P processes × `batch` members over G groups: member j of process p is in group
/// `(p × batch + j) mod G`, so a process's members are in `batch` different groups (when
/// G ≥ batch) and a group's members in different processes.
struct Fleet {
    sims: Vec<Mutex<Sim>>,
    /// Member indices of each process.
    processes: Vec<Vec<usize>>,
    groups: Vec<(String, String)>,
    shards: u32,
}

impl Fleet {
    fn new(tag: &str, processes: usize, batch: usize, groups: usize, per_stream: usize) -> Self {
        let groups_v: Vec<(String, String)> = (0..groups)
            .map(|g| (format!("{tag}-g{g}"), format!("{tag}-s{}", g / per_stream)))
            .collect();
        let mut sims = Vec::new();
        let mut procs = Vec::new();
        for p in 0..processes {
            let mut mine = Vec::new();
            for j in 0..batch {
                let k = p * batch + j;
                mine.push(sims.len());
                sims.push(Mutex::new(Sim {
                    group: groups_v[k % groups].0.clone(),
                    id: format!("{tag}-p{p}-m{j}"),
                    epoch: 0,
                    owned: Vec::new(),
                }));
            }
            procs.push(mine);
        }
        // As many shards as a group has members: each member owns about one.
        let shards = (processes * batch).div_ceil(groups).clamp(1, 4096) as u32;
        Fleet {
            sims,
            processes: procs,
            groups: groups_v,
            shards,
        }
    }

    fn sim(&self, i: usize) -> Sim {
        self.sims[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn batch_request(&self, p: usize) -> HeartbeatBatchRequest {
        HeartbeatBatchRequest {
            heartbeats: self.processes[p]
                .iter()
                .map(|&i| {
                    let s = self.sim(i);
                    BatchedHeartbeat {
                        group: s.group.clone(),
                        heartbeat: s.request(),
                    }
                })
                .collect(),
        }
    }

    /// Applies a batch answer of process `p`; returns (changed, item errors by code).
    fn apply_batch(&self, p: usize, r: &HeartbeatBatchResponse) -> (bool, Vec<String>) {
        let mut changed = false;
        let mut errors = Vec::new();
        for (&i, item) in self.processes[p].iter().zip(&r.results) {
            match (&item.response, item.status) {
                (Some(resp), 200) => {
                    changed |= self.sims[i]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .apply(resp);
                }
                _ => {
                    let code = item
                        .error
                        .as_ref()
                        .map(|e| e.code.as_str().to_owned())
                        .unwrap_or_else(|| format!("status {}", item.status));
                    if is_lost(&code) {
                        // As a client does: join again.
                        let mut sim = self.sims[i].lock().unwrap_or_else(|p| p.into_inner());
                        sim.epoch = 0;
                        sim.owned.clear();
                    }
                    errors.push(code);
                }
            }
        }
        if r.results.len() != self.processes[p].len() {
            errors.push("result count".into());
        }
        (changed, errors)
    }
}

/// Sends process `p`'s batch; returns the answer, or `None` when the route does not exist.
async fn send_batch(
    http: &reqwest::Client,
    base: &str,
    fleet: &Fleet,
    p: usize,
) -> Result<Option<HeartbeatBatchResponse>> {
    let r = http
        .post(format!("{base}/v1/heartbeats"))
        .json(&fleet.batch_request(p))
        .send()
        .await?;
    match r.status().as_u16() {
        200 => Ok(Some(r.json().await?)),
        404 | 405 => Ok(None),
        s => bail!("POST /v1/heartbeats: {s} {}", r.text().await?),
    }
}

/// The member is no longer in the group (expired, or fenced): it must join again.
fn is_lost(code: &str) -> bool {
    code == "UNKNOWN_MEMBER_ID" || code == "FENCED_MEMBER_EPOCH"
}

/// Heartbeats every process's batch (process p to `bases[p mod len]`) until one whole round
/// changes nothing; `None` when the batch route does not exist.
async fn converge_batched(
    http: &reqwest::Client,
    bases: &[String],
    fleet: &Arc<Fleet>,
    concurrency: usize,
    deadline: Duration,
) -> Result<Option<usize>> {
    let until = Instant::now() + deadline;
    // Item errors while joining (e.g. STORE_UNAVAILABLE under lock contention): retried in
    // the next round, and reported.
    let errors = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    for round in 1..=50 {
        let changed = Arc::new(AtomicBool::new(false));
        let missing = Arc::new(AtomicBool::new(false));
        let bases = Arc::new(bases.to_vec());
        let (f, c, m, h, e) = (
            fleet.clone(),
            changed.clone(),
            missing.clone(),
            http.clone(),
            errors.clone(),
        );
        let left = until.saturating_duration_since(Instant::now());
        for_each_concurrent(fleet.processes.len(), concurrency, left, move |p| {
            let (f, c, m, h, e, bases) = (
                f.clone(),
                c.clone(),
                m.clone(),
                h.clone(),
                e.clone(),
                bases.clone(),
            );
            async move {
                match send_batch(&h, &bases[p % bases.len()], &f, p).await? {
                    None => m.store(true, Ordering::Relaxed),
                    Some(r) => {
                        let (changed, errors) = f.apply_batch(p, &r);
                        if changed || !errors.is_empty() {
                            c.store(true, Ordering::Relaxed);
                        }
                        if !errors.is_empty() {
                            let mut seen = e.lock().unwrap_or_else(|p| p.into_inner());
                            for code in errors {
                                *seen.entry(code).or_insert(0u64) += 1;
                            }
                        }
                    }
                }
                Ok(())
            }
        })
        .await?;
        if missing.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if !changed.load(Ordering::Relaxed) {
            let errors = errors.lock().unwrap_or_else(|p| p.into_inner());
            if !errors.is_empty() {
                println!("  item errors while joining (retried): {errors:?}");
            }
            return Ok(Some(round));
        }
    }
    bail!(
        "members did not converge in 50 rounds; item errors: {:?}",
        errors.lock().unwrap_or_else(|p| p.into_inner())
    )
}

/// Is `POST /v1/heartbeats` served? An empty batch is refused (400) by a coordinator that
/// has the route, and not found (404) by one that has not.
async fn batch_route_available(http: &reqwest::Client, base: &str) -> Result<bool> {
    let r = http
        .post(format!("{base}/v1/heartbeats"))
        .json(&json!({"heartbeats": []}))
        .send()
        .await?;
    Ok(!matches!(r.status().as_u16(), 404 | 405))
}

const NO_BATCH_ROUTE: &str = "batch route not available (POST /v1/heartbeats answered 404)";

// ---------------------------------------------------------------------------------------------
// Closed-loop load.

/// A prepared request: URL, JSON body, member heartbeats it carries.
#[derive(Clone)]
struct Prepared {
    url: String,
    /// Serialized once, for the run: the load generator neither encodes nor copies a body
    /// while it measures.
    body: &'static [u8],
    items: u64,
    batch: bool,
}

struct LoadResult {
    /// Member heartbeats answered 200, per second.
    items_per_s: f64,
    /// Member heartbeats answered 200.
    items: u64,
    /// Items answered with an error, or requests that failed.
    errors: u64,
}

/// The statuses of a `POST /v1/heartbeats` answer (PROTOCOL's batch body; every other field
/// of an item is skipped unread).
#[derive(serde::Deserialize)]
struct BatchStatuses {
    results: Vec<ItemStatus>,
}

/// One item's status in [`BatchStatuses`].
#[derive(serde::Deserialize)]
struct ItemStatus {
    status: u16,
}

/// `concurrency` loops sending `requests` round robin for `duration`.
async fn closed_loop(
    http: &reqwest::Client,
    concurrency: usize,
    duration: Duration,
    requests: Arc<Vec<Prepared>>,
) -> Result<LoadResult> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (http, stop, done, errors, requests) = (
            http.clone(),
            stop.clone(),
            done.clone(),
            errors.clone(),
            requests.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            // Bounded: the stop flag ends it; the count is a backstop.
            while !stop.load(Ordering::Relaxed) && n < 100_000_000 {
                let r = &requests[(w + n * concurrency) % requests.len()];
                n += 1;
                let sent = http
                    .post(&r.url)
                    .header("content-type", "application/json")
                    .body(r.body)
                    .send()
                    .await;
                let Ok(resp) = sent else {
                    errors.fetch_add(r.items, Ordering::Relaxed);
                    continue;
                };
                if !resp.status().is_success() {
                    errors.fetch_add(r.items, Ordering::Relaxed);
                    continue;
                }
                if r.batch {
                    // Each item's status, read without building its answer: the load
                    // generator shares the cores with the coordinator, and the single
                    // requests' loop reads nothing but the status either.
                    match resp.json::<BatchStatuses>().await {
                        Ok(b) => {
                            let ok = b.results.iter().filter(|x| x.status == 200).count() as u64;
                            done.fetch_add(ok, Ordering::Relaxed);
                            errors.fetch_add(r.items - ok, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(r.items, Ordering::Relaxed);
                        }
                    }
                } else {
                    let _ = resp.bytes().await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    let items = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    Ok(LoadResult {
        items_per_s: items as f64 / elapsed.as_secs_f64(),
        items,
        errors: errors.load(Ordering::Relaxed),
    })
}

fn prepared_singles(fleet: &Fleet, base: &str) -> Vec<Prepared> {
    // Round robin over processes, then members: consecutive sends hit different groups.
    let mut v = Vec::new();
    for j in 0..fleet.processes.first().map_or(0, Vec::len) {
        for p in &fleet.processes {
            let s = fleet.sim(p[j]);
            v.push(Prepared {
                url: format!("{base}/v1/groups/{}/heartbeat", s.group),
                body: serde_json::to_vec(&s.request()).expect("json").leak(),
                items: 1,
                batch: false,
            });
        }
    }
    v
}

fn prepared_batches(fleet: &Fleet, bases: &[String]) -> Vec<Prepared> {
    (0..fleet.processes.len())
        .map(|p| Prepared {
            url: format!("{}/v1/heartbeats", bases[p % bases.len()]),
            body: serde_json::to_vec(&fleet.batch_request(p))
                .expect("json")
                .leak(),
            items: fleet.processes[p].len() as u64,
            batch: true,
        })
        .collect()
}

fn http_client(concurrency: usize) -> Result<reqwest::Client> {
    rsc_client::install_crypto_provider();
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency.max(32))
        .timeout(Duration::from_secs(30))
        .build()?)
}

fn row(name: String, unit: &str, samples: &[f64], baseline: Option<&[f64]>, goal: &str) -> Row {
    Row {
        name,
        unit: unit.into(),
        value: summarize(samples),
        baseline: baseline.map(summarize),
        goal: goal.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// S1: idle groups.

async fn s1(args: &Args) -> Result<Vec<Row>> {
    let levels = args.s1_groups.clone().unwrap_or_else(|| {
        if args.quick {
            vec![50, 200]
        } else {
            vec![1000, 5000, 10000]
        }
    });
    let window = Duration::from_millis(args.pick(args.s1_window_ms, 10_000, 1_000));
    let step = if args.quick {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    };
    let settle = Duration::from_millis(if args.quick { 300 } else { 2000 });
    let max_n = levels.iter().copied().max().unwrap_or(0);
    let streams = max_n.div_ceil(args.groups_per_stream).max(1);
    let redis = RedisServer::start().context("redis-server")?;
    let cargs = coordinator_args(args, &redis.url(), false);
    let first = start_coordinator(&cargs)?;
    let base = first.url();
    let http = http_client(args.concurrency)?;
    println!(
        "S1: idle groups (1 member, heartbeat interval 20 min), streams of 1 shard, up to {} \
         groups per stream; window {window:?} sampled every {step:?}, after {settle:?}",
        max_n.div_ceil(streams)
    );
    let mut rows = Vec::new();
    let mut created = 0usize;
    let mut baseline: [Option<(Vec<f64>, Vec<f64>)>; 2] = [None, None];
    for n in std::iter::once(0).chain(levels.iter().copied()) {
        if n > created {
            let t = Instant::now();
            // Group i on stream i mod streams: groups created together lock different streams.
            let groups: Vec<(String, String)> = (created..n)
                .map(|i| (format!("idle-{i}"), format!("idle-s{}", i % streams)))
                .collect();
            create_groups(
                &http,
                std::slice::from_ref(&base),
                groups.clone(),
                1,
                3_600_000,
                1_200_000,
                args.concurrency,
            )
            .await?;
            let created_in = t.elapsed();
            let groups = Arc::new(groups);
            let (h, b) = (http.clone(), base.clone());
            for_each_concurrent(
                groups.len(),
                args.concurrency,
                Duration::from_secs(600),
                move |i| {
                    let (h, b, groups) = (h.clone(), b.clone(), groups.clone());
                    async move {
                        let g = &groups[i].0;
                        let (s, v) = post(
                            &h,
                            &format!("{b}/v1/groups/{g}/heartbeat"),
                            &json!({"protocol_version": 1, "member_id": format!("{g}-m"),
                                "member_epoch": 0, "owned_shards": []}),
                        )
                        .await?;
                        if s != 200 {
                            bail!("join {g}: {s} {v}");
                        }
                        Ok(())
                    }
                },
            )
            .await?;
            println!(
                "  set-up to {n} groups: {} created in {:.1} s, joined in {:.1} s",
                n - created,
                created_in.as_secs_f64(),
                (t.elapsed() - created_in).as_secs_f64()
            );
            created = n;
        }
        for (k, count) in [1usize, 3].into_iter().enumerate() {
            let mut extra = Vec::new();
            for _ in 1..count {
                extra.push(start_coordinator(&cargs)?);
            }
            let mut running = vec![&first];
            running.extend(extra.iter());
            let probe = Probe::new(&running, &[&redis])?;
            tokio::time::sleep(settle).await;
            let (steps, whole) = probe.watch(window, step).await?;
            let cmds: Vec<f64> = steps.iter().map(Usage::commands_per_s).collect();
            let cpu: Vec<f64> = steps.iter().map(Usage::max_coordinator_pct).collect();
            println!(
                "  {n:>6} groups, {count} coordinator(s): {} Redis cmds/s, coordinator CPU {:?} % \
                 of a core, redis-server {} %",
                num(whole.commands_per_s()),
                whole
                    .coordinator_pct
                    .iter()
                    .map(|c| (c * 10.0).round() / 10.0)
                    .collect::<Vec<_>>(),
                num(whole.redis_pct)
            );
            if n == 0 {
                baseline[k] = Some((cmds.clone(), cpu.clone()));
            }
            let (bc, bu) = match &baseline[k] {
                Some((c, u)) => (Some(c.clone()), Some(u.clone())),
                None => (None, None),
            };
            let vs = if n == 0 { "" } else { " vs 0 groups" };
            rows.push(row(
                format!("S1 idle: Redis commands/s, {n} groups, {count} coordinator(s){vs}"),
                "cmds/s",
                &cmds,
                if n == 0 { None } else { bc.as_deref() },
                "<= 200 in total, flat in N",
            ));
            rows.push(row(
                format!(
                    "S1 idle: CPU of the busiest coordinator, {n} groups, {count} coordinator(s){}",
                    match (n, bu.as_deref()) {
                        (1.., Some(b)) => format!(" (0 groups: {} %)", num(summarize(b).median)),
                        _ => String::new(),
                    }
                ),
                "% core",
                &cpu,
                None,
                "<= 2 % per coordinator, flat in N",
            ));
            drop(extra);
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------------
// S2: batched vs single heartbeats.

async fn s2(args: &Args) -> Result<Vec<Row>> {
    let reps = args.pick(args.s2_reps, 5, 2);
    let processes = args.pick(args.s2_processes, 32, 16);
    let groups = args.pick(args.s2_groups, 32, 16);
    let duration = Duration::from_millis(args.pick(args.s2_duration_ms, 3000, 500));
    let redis = RedisServer::start().context("redis-server")?;
    let coordinator = start_coordinator(&coordinator_args(args, &redis.url(), false))?;
    let base = coordinator.url();
    let http = http_client(args.concurrency)?;
    let fleet = Arc::new(Fleet::new(
        "s2",
        processes,
        args.batch,
        groups,
        args.groups_per_stream,
    ));
    let members = fleet.sims.len();
    if !batch_route_available(&http, &base).await? {
        println!("S2: {NO_BATCH_ROUTE}");
        return Ok(Vec::new());
    }
    let t = Instant::now();
    create_groups(
        &http,
        std::slice::from_ref(&base),
        fleet.groups.clone(),
        fleet.shards,
        45_000,
        3_000,
        args.concurrency,
    )
    .await?;
    let rounds = converge_batched(
        &http,
        std::slice::from_ref(&base),
        &fleet,
        args.setup_concurrency,
        Duration::from_secs(300),
    )
    .await?
    .context("the batch route disappeared")?;
    println!(
        "S2: {} processes x {} members = {members} members over {} groups ({} shards each; a \
         process has one member in each of {} groups); set-up {:.1} s, converged in {rounds} \
         rounds",
        processes,
        args.batch,
        groups,
        fleet.shards,
        args.batch.min(groups),
        t.elapsed().as_secs_f64()
    );
    let singles = Arc::new(prepared_singles(&fleet, &base));
    let batches = Arc::new(prepared_batches(&fleet, std::slice::from_ref(&base)));
    let probe = Probe::new(&[&coordinator], &[&redis])?;
    let (_, idle) = probe
        .watch(Duration::from_secs(1), Duration::from_secs(1))
        .await?;
    // Warm-up of both.
    closed_loop(&http, args.concurrency, duration / 2, singles.clone()).await?;
    closed_loop(&http, args.concurrency, duration / 2, batches.clone()).await?;
    let (mut single_rates, mut batch_rates) = (Vec::new(), Vec::new());
    let (mut single_cpm, mut batch_cpm) = (Vec::new(), Vec::new());
    let (mut single_cpu, mut batch_cpu) = (Vec::new(), Vec::new());
    let (mut single_me, mut batch_me) = (Vec::new(), Vec::new());
    let (mut single_spm, mut batch_spm) = (Vec::new(), Vec::new());
    let mut errors = 0;
    for r in 0..reps {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for batched in order {
            let reqs = if batched { &batches } else { &singles };
            let a = probe.snap()?;
            let res = closed_loop(&http, args.concurrency, duration, reqs.clone()).await?;
            let b = probe.snap()?;
            let u = probe.usage(&a, &b);
            errors += res.errors;
            let cpm = u.commands as f64 / res.items.max(1) as f64;
            let (rates, cpms, cpus, mes, spms) = if batched {
                (
                    &mut batch_rates,
                    &mut batch_cpm,
                    &mut batch_cpu,
                    &mut batch_me,
                    &mut batch_spm,
                )
            } else {
                (
                    &mut single_rates,
                    &mut single_cpm,
                    &mut single_cpu,
                    &mut single_me,
                    &mut single_spm,
                )
            };
            rates.push(res.items_per_s);
            cpms.push(cpm);
            cpus.push(u.sum_coordinator_pct());
            mes.push(u.me_pct);
            spms.push(u.scripts as f64 / res.items.max(1) as f64);
        }
    }
    // Round trips: the client commands while every member heartbeats twice, each way.
    let twice = |v: &Arc<Vec<Prepared>>| Arc::new(v.iter().chain(v.iter()).cloned().collect());
    let (n1, c1) = client_commands(&redis, send_each(&http, twice(&singles))).await?;
    let (n2, c2) = client_commands(&redis, send_each(&http, twice(&batches))).await?;
    let (single_rt, batch_rt) = (c1 as f64 / n1 as f64, c2 as f64 / n2 as f64);
    println!(
        "S2: CPU % of a core (median): coordinator single {} / batched {}, load generator \
         single {} / batched {}; script calls per member-heartbeat single {} / batched {}; \
         Redis commands/s with no load (expiry sweep): {}; item errors: {errors}",
        num(summarize(&single_cpu).median),
        num(summarize(&batch_cpu).median),
        num(summarize(&single_me).median),
        num(summarize(&batch_me).median),
        num(summarize(&single_spm).median),
        num(summarize(&batch_spm).median),
        num(idle.commands_per_s())
    );
    let label = format!(
        "{members} members, {groups} groups, {} in flight",
        args.concurrency
    );
    Ok(vec![
        row(
            format!(
                "S2 batched heartbeats (batches of {}) vs single, member-heartbeats/s ({label})",
                args.batch
            ),
            "hb/s",
            &batch_rates,
            Some(&single_rates),
            "ratio >= 5",
        ),
        row(
            format!("S2 Redis commands per member-heartbeat, batched ({label})"),
            "cmds",
            &batch_cpm,
            None,
            "- (commands scripts run inside Redis included; the goal is on round trips, below)",
        ),
        row(
            format!("S2 Redis commands per member-heartbeat, single ({label})"),
            "cmds",
            &single_cpm,
            None,
            "-",
        ),
        row(
            format!(
                "S2 client commands (round trips, MONITOR) per member-heartbeat, batched vs single ({label})"
            ),
            "cmds",
            &[batch_rt],
            Some(&[single_rt]),
            "<= 0.1 batched (commands scripts run inside Redis excluded)",
        ),
    ])
}

// ---------------------------------------------------------------------------------------------
// S3: 100k members, steady.

struct S3Result {
    label: String,
    long_label: String,
    offered: f64,
    achieved: f64,
    p50_ms: f64,
    p99_ms: f64,
    usage: Usage,
    lost: u64,
    other_errors: u64,
    max_rate: f64,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

async fn s3_run(args: &Args, coordinators: usize) -> Result<Option<S3Result>> {
    let processes = args.pick(args.s3_processes, 3125, 20);
    let groups = args.pick(args.s3_groups, 10_000, 64);
    let window = Duration::from_millis(args.pick(args.s3_window_ms, 60_000, 3_000));
    let interval = Duration::from_millis(args.s3_interval_ms);
    let saturate = Duration::from_millis(if args.quick { 1000 } else { 5000 });
    let t = Instant::now();
    let (single, cluster) = if coordinators == 1 {
        (Some(RedisServer::start().context("redis-server")?), None)
    } else {
        (None, Some(RedisCluster::start().context("redis cluster")?))
    };
    let (redis_url, redis_nodes): (String, Vec<&RedisServer>) = match (&single, &cluster) {
        (Some(r), _) => (r.url(), vec![r]),
        (_, Some(c)) => (c.url(), c.nodes().iter().collect()),
        _ => unreachable!(),
    };
    let cargs = coordinator_args(args, &redis_url, cluster.is_some());
    let mut coords = Vec::new();
    for _ in 0..coordinators {
        coords.push(start_coordinator(&cargs)?);
    }
    let bases: Vec<String> = coords.iter().map(CoordinatorProcess::url).collect();
    // Up to 1,024 batches in flight in the steady phase: keep their connections.
    let http = http_client(256)?;
    let fleet = Arc::new(Fleet::new(
        "s3",
        processes,
        args.batch,
        groups,
        args.groups_per_stream,
    ));
    let members = fleet.sims.len();
    let store = if cluster.is_some() {
        "3-node Redis Cluster"
    } else {
        "1 redis-server"
    };
    let long_label = format!(
        "{processes} processes x {} = {members} members, {groups} groups, interval {} ms, \
         {coordinators} coordinator(s), {store}",
        args.batch, args.s3_interval_ms,
    );
    let label = format!("{members} members, {coordinators} coord., {store}");
    if !batch_route_available(&http, &bases[0]).await? {
        println!("S3: {NO_BATCH_ROUTE}");
        return Ok(None);
    }
    println!("S3: {long_label}: setting up");
    create_groups(
        &http,
        &bases,
        fleet.groups.clone(),
        fleet.shards,
        15 * args.s3_interval_ms,
        args.s3_interval_ms,
        args.concurrency,
    )
    .await?;
    let created = t.elapsed();
    let setup_limit = Duration::from_secs(if args.quick { 60 } else { 900 });
    let Some(rounds) =
        converge_batched(&http, &bases, &fleet, args.setup_concurrency, setup_limit).await?
    else {
        println!("S3: {NO_BATCH_ROUTE}");
        return Ok(None);
    };
    println!(
        "S3: set-up {:.1} s (groups created in {:.1} s; joined and converged in {rounds} rounds \
         of batches)",
        t.elapsed().as_secs_f64(),
        created.as_secs_f64()
    );

    // Steady phase: each process sends its batch once per interval, phases spread evenly.
    let probe = Probe::new(&coords.iter().collect::<Vec<_>>(), &redis_nodes)?;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let end = start + window;
    let in_flight = Arc::new(tokio::sync::Semaphore::new(1024));
    let mut tasks = Vec::new();
    for p in 0..processes {
        let (fleet, http, in_flight) = (fleet.clone(), http.clone(), in_flight.clone());
        let base = bases[p % bases.len()].clone();
        let phase = interval.mul_f64(p as f64 / processes as f64);
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut ok, mut lost, mut other) = (Vec::new(), 0u64, 0u64, 0u64);
            let mut scheduled = 0u64;
            let mut codes = std::collections::BTreeMap::<String, u64>::new();
            // Offered: one batch per interval from the process's phase on.
            for k in 0..=(window.as_millis() / interval.as_millis().max(1)) as u32 {
                if start + phase + interval * k < end {
                    scheduled += fleet.processes[p].len() as u64;
                }
            }
            // Sent as rsc-client's member loop does: the next heartbeat one interval after the
            // last was sent, or at once when its answer came later than that; never two at a
            // time. Only answers received within the window count as achieved.
            let mut due = start + phase;
            for _ in 0..=(window.as_millis() / interval.as_millis().max(1)) {
                if due >= end {
                    break;
                }
                tokio::time::sleep_until(due).await;
                let sent = tokio::time::Instant::now();
                let Ok(_permit) = in_flight.acquire().await else {
                    break;
                };
                match send_batch(&http, &base, &fleet, p).await {
                    Ok(Some(r)) => {
                        lat.push(sent.elapsed().as_secs_f64() * 1000.0);
                        let (_, errors) = fleet.apply_batch(p, &r);
                        if tokio::time::Instant::now() <= end {
                            ok += (r.results.len() - errors.len().min(r.results.len())) as u64;
                        }
                        for e in errors {
                            if is_lost(&e) {
                                lost += 1;
                            } else {
                                other += 1;
                            }
                            *codes.entry(e).or_default() += 1;
                        }
                    }
                    Ok(None) => other += fleet.processes[p].len() as u64,
                    Err(e) => {
                        other += fleet.processes[p].len() as u64;
                        let kind = if e.to_string().contains("POST /v1/heartbeats") {
                            e.to_string().chars().take(40).collect()
                        } else {
                            "request failed".to_owned()
                        };
                        *codes.entry(kind).or_default() += fleet.processes[p].len() as u64;
                    }
                }
                due = (sent + interval).max(tokio::time::Instant::now());
            }
            (lat, ok, lost, other, scheduled, codes)
        }));
    }
    tokio::time::sleep_until(start).await;
    let a = probe.snap()?;
    tokio::time::sleep_until(end).await;
    let b = probe.snap()?;
    let (mut lat, mut ok, mut lost, mut other) = (Vec::new(), 0u64, 0u64, 0u64);
    let mut scheduled = 0u64;
    let mut codes = std::collections::BTreeMap::<String, u64>::new();
    for t in tasks {
        let (l, o, x, y, z, c) = t.await?;
        lat.extend(l);
        ok += o;
        lost += x;
        other += y;
        scheduled += z;
        for (k, v) in c {
            *codes.entry(k).or_default() += v;
        }
    }
    if !codes.is_empty() {
        println!("S3: item errors in the window, by code: {codes:?}");
    }
    lat.sort_by(f64::total_cmp);
    let usage = probe.usage(&a, &b);
    // Offered: the heartbeats of the nominal schedule within the window (members / interval
    // when the window is a whole number of intervals); achieved: those answered 200 within the
    // window.
    let offered = scheduled as f64 / window.as_secs_f64();
    let achieved = ok as f64 / window.as_secs_f64();

    // Saturation: the same batches back to back, `concurrency` in flight.
    let batches = Arc::new(prepared_batches(&fleet, &bases));
    let max = closed_loop(&http, args.concurrency, saturate, batches).await?;
    let result = S3Result {
        label,
        long_label,
        offered,
        achieved,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        usage,
        lost,
        other_errors: other + max.errors,
        max_rate: max.items_per_s,
    };
    println!(
        "S3 {}: batch latency p50 {} ms, p99 {} ms (per member {} / {} ms); achieved {} of \
         {} member-heartbeats/s offered; CPU % of a core: coordinators {:?}, redis-server(s) {}, \
         load generator {}; expired/fenced items {}, other errors {}; saturation ({} in flight, \
         {saturate:?}): {} member-heartbeats/s",
        result.long_label,
        num(result.p50_ms),
        num(result.p99_ms),
        num(result.p50_ms / args.batch as f64),
        num(result.p99_ms / args.batch as f64),
        num(achieved),
        num(offered),
        result
            .usage
            .coordinator_pct
            .iter()
            .map(|c| (c * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        num(result.usage.redis_pct),
        num(result.usage.me_pct),
        lost,
        result.other_errors,
        args.concurrency,
        num(result.max_rate)
    );
    Ok(Some(result))
}

async fn s3(args: &Args) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut one: Option<S3Result> = None;
    for &k in &args.s3_coordinators {
        let Some(r) = s3_run(args, k).await? else {
            return Ok(rows);
        };
        let interval_goal = format!("< {} ms (interval/10)", args.s3_interval_ms / 10);
        rows.push(row(
            format!("S3 p99 batch latency ({})", r.label),
            "ms",
            &[r.p99_ms],
            None,
            &interval_goal,
        ));
        rows.push(row(
            format!("S3 p50 batch latency ({})", r.label),
            "ms",
            &[r.p50_ms],
            None,
            "-",
        ));
        rows.push(row(
            format!("S3 achieved vs offered member-heartbeats/s ({})", r.label),
            "hb/s",
            &[r.achieved],
            Some(&[r.offered]),
            "ratio 1.00 (sustained)",
        ));
        rows.push(row(
            format!("S3 CPU of the busiest coordinator ({})", r.label),
            "% core",
            &[r.usage.max_coordinator_pct()],
            None,
            "< 100 %",
        ));
        rows.push(row(
            format!("S3 redis-server CPU, all nodes ({})", r.label),
            "% core",
            &[r.usage.redis_pct],
            None,
            "-",
        ));
        rows.push(row(
            format!(
                "S3 members expired or fenced during the window ({})",
                r.label
            ),
            "items",
            &[r.lost as f64],
            None,
            "0",
        ));
        if let Some(o) = &one {
            rows.push(row(
                format!(
                    "S3 capacity: saturation member-heartbeats/s, {} vs {} coordinator(s)",
                    r.label,
                    o.usage.coordinator_pct.len()
                ),
                "hb/s",
                &[r.max_rate],
                Some(&[o.max_rate]),
                "- (same 2-core machine for all processes)",
            ));
        } else {
            rows.push(row(
                format!("S3 saturation member-heartbeats/s ({})", r.label),
                "hb/s",
                &[r.max_rate],
                Some(&[r.offered]),
                "-",
            ));
            one = Some(r);
        }
    }
    Ok(rows)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    for r in &args.rows {
        let rows = match r.as_str() {
            "s1" => s1(&args).await?,
            "s2" => s2(&args).await?,
            "s3" => s3(&args).await?,
            other => bail!("unknown row {other} (s1, s2, s3)"),
        };
        if !rows.is_empty() {
            emit(&rows)?;
        }
    }
    Ok(())
}
