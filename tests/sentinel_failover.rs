//! Redis Sentinel failover with real processes: 1 master + 2 replicas + 3 sentinels on
//! loopback, a coordinator on the Redis store (and data Redis) through the sentinels, 3
//! `sample-consumer` pods, a `sample-producer` writing continuously; the master is killed
//! with SIGKILL mid-run. Measured and printed: how long until heartbeats succeed again, until
//! consumption resumes, entries the producer was told were published that are gone, and
//! duplicates — with asynchronous replication, then with the replicas cut off 300 ms before the
//! kill (replication lag: the master acknowledged entries no replica has) without and with the
//! producer waiting for a replica (`WAIT 1`), where no acknowledged entry may be lost. In every
//! run the group keeps its members: the store outage (longer than the session timeout here)
//! extends the sessions instead of expiring every member.
//!
//! Also scrapes a consumer pod's and the producer's `/metrics`, and checks that a connection to
//! a master demoted by a manual failover (alive, answering `READONLY`) is dropped for the new
//! master.

use rsc_e2e::Api;
use rsc_testkit::{
    CoordinatorProcess, SENTINEL_MASTER, SentinelDeployment, Signal, binary_path, free_port, signal,
};
use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const STREAM: &str = "orders";
const GROUP: &str = "billing";
const SHARDS: u32 = 6;
const PODS: usize = 3;
const CONCURRENCY: u32 = 2;
/// Shorter than the outage a failover causes: without the outage credit every member would
/// expire.
const SESSION_MS: u64 = 2_000;
const HEARTBEAT_MS: u64 = 400;
const RATE: u64 = 400;
const COUNT: u64 = 6_000;
const RECORD: &str = "handled";
/// Simulated replication lag at the moment of the kill.
const LAG: Duration = Duration::from_millis(300);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Kills the child when dropped.
struct Proc(Child);

/// The lines a pod wrote to stderr (echoed too with `RSC_TEST_ECHO`), kept for the failure
/// messages: a member expired after the failover is explained by its pod's heartbeats.
type PodLog = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

fn capture(tag: String, child: &mut Child, echo: bool) -> PodLog {
    let log = PodLog::default();
    if let Some(err) = child.stderr.take() {
        let log = log.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[{tag}] {line}");
                }
                log.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
    }
    log
}

/// The lines of the pods' logs that say how their heartbeats went.
fn heartbeat_lines(logs: &[(String, PodLog)]) -> String {
    let mut out = Vec::new();
    for (tag, log) in logs {
        let log = log.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(
            log.iter()
                .filter(|l| {
                    ["heartbeat", "WARN", "ERROR", "fenced", "rejoin"]
                        .iter()
                        .any(|n| l.contains(n))
                })
                .map(|l| format!("[{tag}] {l}")),
        );
    }
    out.join("\n")
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Debug)]
struct Figures {
    label: &'static str,
    promoted_ms: u64,
    store_outage_s: f64,
    heartbeats_back_ms: u64,
    consumption_back_ms: u64,
    acked: usize,
    acked_lost: usize,
    duplicates: usize,
    members_before: BTreeSet<String>,
    members_after: BTreeSet<String>,
    expired: f64,
    pod_metrics_ok: bool,
    producer_metrics_ok: bool,
    /// Doorbell rings pod 0 received from the last switch to the end: the producer rings on
    /// the new master, so none means the doorbell did not follow the switch (its workers
    /// were woken by the fallback poll only).
    rings_after_switch: f64,
    /// Pod 0's doorbell subscriber connected at the end (`rsc_client_doorbell_connected`).
    doorbell_connected: f64,
    /// Entries in the stream without a handling record (only within the failovers' window:
    /// the record, the application's own write, went to a master that died or was left
    /// before replicating it, while the acknowledgement reached the new one).
    unrecorded: usize,
    /// The coordinator's log lines about expiries, outages, rollbacks and master switches,
    /// for the message of a failed check.
    expiry_log: String,
    /// After a second failover: what the old (first promoted) master saw.
    second: Option<SecondFigures>,
}

/// How the first failover is caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// `kill -9` of the master.
    Kill,
    /// `SENTINEL FAILOVER` (the old master stays up, as a replica).
    Forced,
}

/// A second failover right after the first promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Second {
    /// `SENTINEL FAILOVER` as soon as a sentinel accepts it.
    Forced,
    /// The promoted master is frozen (SIGSTOP) until the sentinels promote another, then
    /// thawed: it answers as master, with its clients' old connections, until the sentinels
    /// convert it (the spurious second failover of a busy host).
    Stale,
}

/// What a second failover left on the first promoted master.
#[derive(Debug, Clone, Copy)]
struct SecondFigures {
    /// From the first promotion to the second (sentinels' view).
    switch_after_ms: u64,
    /// From the second promotion until no client connection (other than sentinels,
    /// replication and this test's) was open on the old master.
    last_client_left_ms: u64,
    /// Entries the old master accepted more than 1 s after the switch (read while it still
    /// answered as master; `None`: it was demoted before it could be read).
    written_after: Option<usize>,
}

fn redis_on(port: u16) -> redis::Connection {
    try_redis_on(port).expect("redis connection")
}

/// [`redis_on`], giving the error back.
fn try_redis_on(port: u16) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
}

/// Every value of `field` in a stream (XRANGE, paged).
fn stream_field(con: &mut redis::Connection, key: &str, field: &str) -> Vec<String> {
    try_stream_field(con, key, field).expect("XRANGE")
}

/// [`stream_field`], giving the connection's error back.
fn try_stream_field(
    con: &mut redis::Connection,
    key: &str,
    field: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut out = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(5000)
            .query(con)?;
        let n = reply.ids.len();
        for id in reply.ids {
            start = format!("({}", id.id);
            if let Some(v) = id.map.get(field) {
                out.push(redis::from_redis_value_ref::<String>(v).unwrap_or_default());
            }
        }
        if n < 5000 {
            return Ok(out);
        }
    }
}

/// Entries of a stream: seq → the time in their id (Unix ms).
fn seq_times(con: &mut redis::Connection, key: &str) -> Vec<(u64, u64)> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    reply
        .ids
        .into_iter()
        .filter_map(|e| {
            let seq = redis::from_redis_value_ref::<String>(e.map.get("seq")?).ok()?;
            let ms = e.id.split('-').next()?.parse().ok()?;
            Some((seq.parse().ok()?, ms))
        })
        .collect()
}

/// Handled entries: (seq, finished_ms).
fn handled(con: &mut redis::Connection) -> Vec<(u64, u64)> {
    try_handled(con).expect("XRANGE")
}

/// [`handled`], giving the connection's error back.
fn try_handled(con: &mut redis::Connection) -> redis::RedisResult<Vec<(u64, u64)>> {
    let seqs = try_stream_field(con, RECORD, "seq")?;
    let done = try_stream_field(con, RECORD, "finished_ms")?;
    Ok(seqs
        .iter()
        .zip(&done)
        .filter_map(|(s, f)| Some((s.parse().ok()?, f.parse().ok()?)))
        .collect())
}

/// Each shard key's Redis consumer groups (`XINFO GROUPS`) and the group's pending entries
/// per consumer (`XPENDING` summary), for the message of a failed check.
fn pending_report(con: &mut redis::Connection, keys: &[String]) -> String {
    keys.iter()
        .map(|k| {
            let groups: redis::Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(k)
                .query(con)
                .unwrap_or(redis::Value::Nil);
            let pending: redis::Value = redis::cmd("XPENDING")
                .arg(k)
                .arg(GROUP)
                .query(con)
                .unwrap_or(redis::Value::Nil);
            format!("\n{k}: groups {groups:?}; pending {pending:?}")
        })
        .collect()
}

async fn members(api: &Api) -> Option<BTreeSet<String>> {
    let (s, g) = api
        .try_call(reqwest::Method::GET, &format!("/v1/groups/{GROUP}"), None)
        .await
        .ok()?;
    if !s.is_success() {
        return None;
    }
    Some(
        g["members"]
            .as_array()?
            .iter()
            .filter_map(|m| m["member_id"].as_str().map(str::to_owned))
            .collect(),
    )
}

async fn scrape(port: u16, needle: &str) -> bool {
    pod_metrics(port).await.is_some_and(|t| t.contains(needle))
}

/// The Prometheus text of the process whose `/metrics` listens on `port` (`None` while it
/// does not answer).
async fn pod_metrics(port: u16) -> Option<String> {
    match rsc_e2e::http()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r.text().await.ok(),
        _ => None,
    }
}

/// The sum of `metric`'s samples on the pod whose `/metrics` listens on `port` (0 while it
/// does not answer).
async fn pod_metric(port: u16, metric: &str) -> f64 {
    rsc_e2e::metric_sum(&pod_metrics(port).await.unwrap_or_default(), metric, &[])
}

/// Heartbeats one probe member every 100 ms until `stop`; returns the times of the
/// successful ones.
async fn probe(api: Api, stop: tokio::sync::watch::Receiver<bool>) -> Vec<u64> {
    let mut ok = Vec::new();
    let mut epoch = 0i64;
    let mut owned: Vec<u32> = Vec::new();
    while !*stop.borrow() {
        let body = json!({"protocol_version": 1, "member_id": "probe-0",
            "member_epoch": epoch, "owned_shards": owned});
        match api
            .try_call(
                reqwest::Method::POST,
                "/v1/groups/probe/heartbeat",
                Some(body),
            )
            .await
        {
            Ok((s, r)) if s.is_success() => {
                ok.push(now_ms());
                epoch = r["member_epoch"].as_i64().unwrap_or(epoch);
                owned = r["assignment"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_u64().map(|v| v as u32))
                    .collect();
            }
            Ok((s, _)) if s.is_client_error() => {
                // Forgotten (expired): rejoin like a client would.
                epoch = 0;
                owned.clear();
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ok
}

/// One run: the master is killed mid-run; with `replica_lag`, the replicas are frozen
/// (SIGSTOP) and their replication links cut that long before the kill, and thawed right after
/// it — replication that lags by that much, as across a slow network — so that the master
/// acknowledges writes no replica has.
async fn scenario(
    label: &'static str,
    wait_replicas: Option<u32>,
    replica_lag: Option<Duration>,
    failovers: (First, Option<Second>),
) -> Figures {
    let deployment = SentinelDeployment::start(2, 3).expect("sentinel deployment starts");
    let sentinels = deployment.sentinel_addrs();
    let first_master = deployment.master_port().expect("a master");
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        SENTINEL_MASTER,
        "--data-redis-sentinel",
        &sentinels,
        "--data-redis-sentinel-master",
        SENTINEL_MASTER,
        "--sweep-interval-ms",
        "100",
    ])
    .expect("coordinator starts");
    let api = Api::new(coordinator.url());
    let (s, b) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": STREAM, "shard_count": SHARDS,
                "session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": HEARTBEAT_MS}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{b}");
    let (s, b) = api
        .post(
            "/v1/groups",
            json!({"group": "probe", "stream": "probe-stream", "shard_count": 1,
                "session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": HEARTBEAT_MS}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{b}");

    let echo = std::env::var_os("RSC_TEST_ECHO").is_some();
    let stderr = || {
        if echo {
            Stdio::inherit()
        } else {
            Stdio::null()
        }
    };
    let mut pod_logs: Vec<(String, PodLog)> = Vec::new();
    let metrics_port = free_port().expect("port");
    let pods: Vec<Proc> = (0..PODS)
        .map(|i| {
            let mut cmd = Command::new(binary_path("sample-consumer").expect("built"));
            cmd.args(["--coordinator", &coordinator.url()])
                .args(["--redis-url", "redis://127.0.0.1:1"])
                .args(["--redis-sentinel", &sentinels])
                .args(["--redis-sentinel-master", SENTINEL_MASTER])
                .args(["--group", GROUP, "--stream", STREAM])
                .args(["--concurrency", &CONCURRENCY.to_string()])
                .args(["--pod-ip", &format!("10.0.0.{}", i + 1)])
                .args(["--record-stream", RECORD]);
            if i == 0 {
                cmd.args(["--health-listen", &format!("127.0.0.1:{metrics_port}")]);
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .env("RUST_LOG", "info")
                .spawn()
                .expect("sample-consumer starts");
            let tag = format!("pod 10.0.0.{}", i + 1);
            pod_logs.push((tag.clone(), capture(tag, &mut child, echo)));
            Proc(child)
        })
        .collect();
    // Stable: every member owns its shards.
    let deadline = Instant::now() + Duration::from_secs(30);
    let members_before = loop {
        let (_, g) = api.get(&format!("/v1/groups/{GROUP}")).await;
        let ms = g["members"].as_array().cloned().unwrap_or_default();
        let owned: usize = ms
            .iter()
            .map(|m| m["owned_shards"].as_array().map_or(0, Vec::len))
            .sum();
        if ms.len() == PODS * CONCURRENCY as usize && owned == SHARDS as usize {
            break ms
                .iter()
                .filter_map(|m| m["member_id"].as_str().map(str::to_owned))
                .collect::<BTreeSet<_>>();
        }
        assert!(Instant::now() < deadline, "group never stable: {g:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let acked_log = tempfile::NamedTempFile::new().expect("temp file");
    let producer_port = free_port().expect("port");
    let mut producer = Command::new(binary_path("sample-producer").expect("built"));
    producer
        .args(["--coordinator", &coordinator.url()])
        .args(["--redis-url", "redis://127.0.0.1:1"])
        .args(["--redis-sentinel", &sentinels])
        .args(["--redis-sentinel-master", SENTINEL_MASTER])
        .args(["--stream", STREAM, "--count", &COUNT.to_string()])
        .args(["--keys", "50", "--rate", &RATE.to_string(), "--batch", "20"])
        .args(["--acked-log", &acked_log.path().display().to_string()])
        .args(["--health-listen", &format!("127.0.0.1:{producer_port}")]);
    if let Some(n) = wait_replicas {
        producer.args([
            "--wait-replicas",
            &n.to_string(),
            "--wait-timeout-ms",
            "500",
        ]);
    }
    let producer = Proc(
        producer
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr())
            .spawn()
            .expect("sample-producer starts"),
    );
    let (stop_probe, stopped) = tokio::sync::watch::channel(false);
    let prober = tokio::spawn(probe(api.clone(), stopped));

    // Let it run, then kill the master.
    {
        let mut con = redis_on(first_master);
        let deadline = Instant::now() + Duration::from_secs(30);
        while handled(&mut con).len() < 1_000 {
            assert!(Instant::now() < deadline, "consumption never started");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut deployment = deployment;
    let replicas: Vec<u32> = deployment.servers[1..]
        .iter()
        .filter_map(|r| r.pid())
        .collect();
    if let Some(lag) = replica_lag {
        // Frozen replicas still receive into their sockets' buffers: cut their links too, so
        // that what the master acknowledges from now on reaches no replica.
        for &pid in &replicas {
            signal(pid, Signal::SIGSTOP).expect("SIGSTOP");
        }
        let killed = deployment.servers[0]
            .command("CLIENT KILL TYPE replica")
            .expect("CLIENT KILL");
        assert!(killed.starts_with(':'), "{killed}");
        tokio::time::sleep(lag).await;
    }
    let (_, routing) = api.get(&format!("/v1/streams/{STREAM}/routing")).await;
    let mut keys: Vec<String> = routing["shard_keys"]
        .as_array()
        .expect("shard keys")
        .iter()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    let killed_ms = now_ms();
    match failovers.0 {
        First::Kill => deployment.servers[0].kill(),
        First::Forced => sentinel_failover(&sentinels).await,
    }
    if replica_lag.is_some() {
        for &pid in &replicas {
            signal(pid, Signal::SIGCONT).expect("SIGCONT");
        }
    }

    // The sentinels promote a replica.
    let first_promoted = promoted_after(&deployment, first_master).await;
    let promoted_ms = now_ms() - killed_ms;
    keys.push(RECORD.to_owned());
    let (new_master, second) = match failovers.1 {
        None => (first_promoted, None),
        Some(how) => {
            let (m, f) = second_failover(&deployment, &sentinels, first_promoted, how, &keys).await;
            (m, Some(f))
        }
    };
    keys.pop();
    let last_switch_ms = now_ms();
    let rings_at_switch = pod_metric(metrics_port, "rsc_client_doorbell_rings_total").await;

    // Producer finishes; every entry that is in the stream gets handled.
    let deadline = Instant::now() + Duration::from_secs(90);
    let acked: BTreeSet<u64> = loop {
        let text = std::fs::read_to_string(acked_log.path()).unwrap_or_default();
        let acked: BTreeSet<u64> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split(' ').map(|v| v.parse::<u64>().ok());
                Some((it.next()??, it.next()??))
            })
            .flat_map(|(a, b)| a..b)
            .collect();
        if acked.len() as u64 == COUNT {
            break acked;
        }
        assert!(
            Instant::now() < deadline,
            "the producer did not finish: {} of {COUNT} acknowledged",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut con = redis_on(new_master);
    let in_stream: BTreeSet<u64> = keys
        .iter()
        .flat_map(|k| stream_field(&mut con, k, "seq"))
        .filter_map(|s| s.parse().ok())
        .collect();
    // A handling recorded on a master that died, or that was left, before replicating the
    // record is lost with it (the record is the application's own unreplicated write),
    // while the entry's acknowledgement, sent after the switch, reached the new master:
    // such entries, produced from the replicas' lag before the kill to a second after the
    // last switch, are counted, not required.
    let lag_ms = replica_lag.map_or(0, |l| l.as_millis() as u64);
    let mut window = (
        killed_ms.saturating_sub(1_000 + lag_ms),
        last_switch_ms + 1_000,
    );
    let times: HashMap<u64, u64> = keys.iter().flat_map(|k| seq_times(&mut con, k)).collect();
    // Entries outside the window must all be handled within a minute; those inside are
    // waited for 20 s.
    let settle = Instant::now() + Duration::from_secs(20);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut new_master = new_master;
    let (records, unrecorded) = loop {
        let records = match try_handled(&mut con) {
            Ok(records) => records,
            Err(e) => {
                // The sentinels closed this connection: on a loaded machine they can fail
                // over once more (a master that missed `down-after-milliseconds`), and a
                // demoted master's clients are killed. Follow the master they name; a switch
                // widens the window of entries whose record may be lost with it.
                let now = deployment.master_port().unwrap_or(new_master);
                eprintln!("{label}: reading the records failed ({e}); the master is {now}");
                if now != new_master {
                    window.1 = now_ms() + 1_000;
                    new_master = now;
                }
                assert!(
                    Instant::now() < deadline,
                    "the records could not be read: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(reopened) = try_redis_on(new_master) {
                    con = reopened;
                }
                continue;
            }
        };
        let seen: BTreeSet<u64> = records.iter().map(|r| r.0).collect();
        let missing: Vec<u64> = in_stream.difference(&seen).copied().collect();
        let outside = missing
            .iter()
            .filter(|s| times.get(s).is_none_or(|t| *t < window.0 || *t > window.1))
            .count();
        if missing.is_empty() || (outside == 0 && Instant::now() >= settle) {
            break (records, missing.len());
        }
        assert!(
            Instant::now() < deadline,
            "entries in the stream were never handled: {} of {} ({outside} outside the failovers); \
             the shards' groups and pending entries: {}",
            missing.len(),
            in_stream.len(),
            pending_report(&mut con, &keys)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop_probe.send(true).expect("probe runs");
    let beats = prober.await.expect("probe");
    let heartbeats_back_ms = beats
        .iter()
        .find(|&&t| t > killed_ms + 50)
        .map_or(u64::MAX, |t| t - killed_ms);
    let consumption_back_ms = records
        .iter()
        .map(|r| r.1)
        .filter(|&t| t > killed_ms)
        .min()
        .map_or(u64::MAX, |t| t - killed_ms);
    let mut per_seq: HashMap<u64, usize> = HashMap::new();
    for r in &records {
        *per_seq.entry(r.0).or_default() += 1;
    }
    let duplicates = per_seq.values().map(|n| n - 1).sum();
    let members_after = members(&api).await.unwrap_or_default();
    // The owner keys' tracking (strict fencing, PROTOCOL §5.6) followed the switch: its
    // connection is on the master the sentinels name now.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let master = deployment.master_port().unwrap_or(new_master);
        let list: String = try_redis_on(master)
            .and_then(|mut c| redis::cmd("CLIENT").arg("LIST").query(&mut c))
            .unwrap_or_default();
        if list.contains("name=rsc-coordinator-owner-tracking ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: no owner-key tracking connection on the master ({master}): {list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pod_metrics_ok = scrape(metrics_port, "rsc_client_").await;
    let rings_after_switch =
        pod_metric(metrics_port, "rsc_client_doorbell_rings_total").await - rings_at_switch;
    let doorbell_connected = pod_metric(metrics_port, "rsc_client_doorbell_connected").await;
    let producer_metrics_ok = scrape(producer_port, "rsc_client_published_total").await;
    let store_outage_s = api.metric("rsc_store_last_outage_seconds", &[]).await;
    let expired = api.metric("rsc_members_expired_total", &[]).await;
    let expiry_log = coordinator
        .log()
        .into_iter()
        .filter(|l| {
            [
                "expired",
                "outage",
                "went back",
                "reachable again",
                "new Redis master",
            ]
            .iter()
            .any(|n| l.contains(n))
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n--- the pods' heartbeats ---\n"
        + &heartbeat_lines(&pod_logs);
    drop(producer);
    drop(pods);
    Figures {
        label,
        promoted_ms,
        store_outage_s,
        heartbeats_back_ms,
        consumption_back_ms,
        acked: acked.len(),
        acked_lost: acked.difference(&in_stream).count(),
        duplicates,
        members_before,
        members_after,
        expired,
        pod_metrics_ok,
        producer_metrics_ok,
        rings_after_switch,
        doorbell_connected,
        unrecorded,
        expiry_log,
        second,
    }
}

/// `SENTINEL FAILOVER` on the first sentinel, retried while it refuses (a failover still in
/// progress, no replica ready yet).
async fn sentinel_failover(sentinels: &str) {
    let port: u16 = sentinels
        .split(',')
        .next()
        .and_then(|a| a.rsplit(':').next()?.parse().ok())
        .expect("a sentinel port");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r: redis::RedisResult<()> = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SENTINEL_MASTER)
            .query(&mut redis_on(port));
        match r {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "SENTINEL FAILOVER refused: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The master the sentinels name once it is not `old`.
async fn promoted_after(deployment: &SentinelDeployment, old: u16) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(p) = deployment.master_port().filter(|&p| p != old) {
            return p;
        }
        assert!(Instant::now() < deadline, "no replica was promoted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fails over a second time right after `promoted` was promoted; returns the final master
/// and what the old one saw.
async fn second_failover(
    deployment: &SentinelDeployment,
    sentinels: &str,
    promoted: u16,
    how: Second,
    keys: &[String],
) -> (u16, SecondFigures) {
    let started = now_ms();
    let pid = deployment
        .servers
        .iter()
        .find(|s| s.port() == promoted)
        .and_then(|s| s.pid())
        .expect("the promoted server");
    match how {
        Second::Forced => sentinel_failover(sentinels).await,
        Second::Stale => signal(pid, Signal::SIGSTOP).expect("SIGSTOP"),
    }
    let last = promoted_after(deployment, promoted).await;
    let switched = now_ms();
    if how == Second::Stale {
        signal(pid, Signal::SIGCONT).expect("SIGCONT");
    }
    let (last_client_left_ms, written_after) = old_master_after(promoted, switched, keys).await;
    (
        last,
        SecondFigures {
            switch_after_ms: switched - started,
            last_client_left_ms,
            written_after,
        },
    )
}

/// Watches the old master `port` after the switch at `switched` (Unix ms): how long until no
/// client connection is left on it, and how many entries of `keys` it accepted more than 1 s
/// after the switch (read while it still says master, in one transaction with `ROLE`).
async fn old_master_after(port: u16, switched: u64, keys: &[String]) -> (u64, Option<usize>) {
    let mut con = redis_on(port);
    let me: u64 = redis::cmd("CLIENT")
        .arg("ID")
        .query(&mut con)
        .expect("CLIENT ID");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = u64::MAX;
    while left == u64::MAX && Instant::now() < deadline {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut con)
            .expect("CLIENT LIST");
        let clients = list
            .lines()
            .filter(|l| {
                let f = |k: &str| l.split(' ').find_map(|kv| kv.strip_prefix(k)).unwrap_or("");
                f("id=") != me.to_string()
                    && !f("name=").starts_with("sentinel-")
                    && !f("flags=").contains(['S', 'M'])
                    && f("cmd=") != "replconf"
            })
            .count();
        if clients == 0 {
            left = now_ms().saturating_sub(switched);
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Entries written more than 1 s after the switch: read at 1.5 s, if it is master still.
    let at = switched + 1_500;
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("ROLE");
    for k in keys {
        pipe.cmd("XRANGE")
            .arg(k)
            .arg(format!("{}-0", switched + 1_000))
            .arg("+");
    }
    let reply: Vec<redis::Value> = pipe.query(&mut con).expect("MULTI ROLE XRANGE");
    let master = matches!(reply.first(), Some(redis::Value::Array(r))
        if matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master"));
    let written = reply[1..]
        .iter()
        .map(|v| match v {
            redis::Value::Array(entries) => entries.len(),
            _ => 0,
        })
        .sum();
    (left, master.then_some(written))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn master_killed_under_load_with_and_without_wait() {
    let once = (First::Kill, None);
    let runs = [
        scenario("async replication", None, None, once).await,
        scenario("async, replicas 300 ms behind", None, Some(LAG), once).await,
        scenario("WAIT 1, replicas 300 ms behind", Some(1), Some(LAG), once).await,
    ];
    println!(
        "\n| run | promoted (ms) | store outage seen (s) | heartbeats back (ms) | consumption back (ms) | acked | acked lost | duplicates | members kept | members expired | pod 0's rings after the switch |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for f in &runs {
        println!(
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} | {}/{} | {} | {} |",
            f.label,
            f.promoted_ms,
            f.store_outage_s,
            f.heartbeats_back_ms,
            f.consumption_back_ms,
            f.acked,
            f.acked_lost,
            f.duplicates,
            f.members_after.intersection(&f.members_before).count(),
            f.members_before.len(),
            f.expired as u64,
            f.rings_after_switch
        );
    }
    for f in &runs {
        assert_eq!(
            f.members_after, f.members_before,
            "{}: the group lost or replaced members across the failover",
            f.label
        );
        assert_eq!(
            f.expired, 0.0,
            "{}: the store outage expired members (they could not heartbeat):\n{}",
            f.label, f.expiry_log
        );
        assert!(
            f.heartbeats_back_ms < 30_000,
            "{}: heartbeats never came back",
            f.label
        );
        assert!(
            f.consumption_back_ms < 30_000,
            "{}: consumption never resumed",
            f.label
        );
        assert!(
            f.pod_metrics_ok,
            "{}: a pod's /metrics was not scrapeable",
            f.label
        );
        assert!(
            f.producer_metrics_ok,
            "{}: the producer's /metrics was not scrapeable",
            f.label
        );
        // The master died: the doorbell's subscriber found the new one through the
        // sentinels (PROTOCOL §16), so the producer's rings reach the pods again.
        assert!(
            f.rings_after_switch > 0.0 && f.doorbell_connected == 1.0,
            "{}: pod 0's doorbell did not follow the new master ({} rings after the switch, \
             connected {})",
            f.label,
            f.rings_after_switch,
            f.doorbell_connected
        );
        assert!(
            f.store_outage_s > 0.0,
            "{}: the coordinator did not see the store outage",
            f.label
        );
    }
    assert!(
        runs[1].acked_lost > 0,
        "replicas 300 ms behind must lose acknowledged entries without WAIT (else this run \
         proves nothing about the WAIT option)"
    );
    assert_eq!(
        runs[2].acked_lost, 0,
        "with WAIT 1 no acknowledged entry may be lost"
    );
}

/// A second failover right after the first, under load with pods and a producer waiting for
/// a replica (`WAIT 1`): forced with `SENTINEL FAILOVER`, and with the first promoted master
/// frozen until another is promoted, then answering as master again (what a busy host's
/// spurious second failover does). Every client leaves the old master within about a second
/// of the switch (the sentinels' `+switch-master`, PROTOCOL §19), it accepts no entry after
/// it, no acknowledged entry is lost and no member expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_failover_in_a_row_loses_nothing_and_expires_no_one() {
    let runs = [
        scenario(
            "kill -9, then SENTINEL FAILOVER",
            Some(1),
            None,
            (First::Kill, Some(Second::Forced)),
        )
        .await,
        scenario(
            "SENTINEL FAILOVER, then the promoted master frozen and thawed",
            Some(1),
            None,
            (First::Forced, Some(Second::Stale)),
        )
        .await,
    ];
    println!(
        "\n| run (WAIT 1) | 1st promotion (ms) | 2nd after (ms) | last client off the old master (ms after switch) | entries on the old master > 1 s after | acked | acked lost | duplicates | handling records lost | members kept | expired |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for f in &runs {
        let s = f.second.expect("a second failover");
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} |",
            f.label,
            f.promoted_ms,
            s.switch_after_ms,
            s.last_client_left_ms,
            s.written_after
                .map_or("demoted before read".to_owned(), |n| n.to_string()),
            f.acked,
            f.acked_lost,
            f.duplicates,
            f.unrecorded,
            f.members_after.intersection(&f.members_before).count(),
            f.members_before.len(),
            f.expired as u64
        );
    }
    for f in &runs {
        let s = f.second.expect("a second failover");
        assert_eq!(f.acked_lost, 0, "{}: acknowledged entries lost", f.label);
        assert_eq!(
            f.expired, 0.0,
            "{}: members expired:\n{}",
            f.label, f.expiry_log
        );
        assert_eq!(
            f.members_after, f.members_before,
            "{}: members replaced",
            f.label
        );
        assert!(
            s.last_client_left_ms <= 2_000,
            "{}: a client stayed on the old master {} ms after the switch",
            f.label,
            s.last_client_left_ms
        );
        assert!(
            s.written_after.unwrap_or(0) == 0,
            "{}: the old master accepted {:?} entries after the switch",
            f.label,
            s.written_after
        );
        assert!(
            f.consumption_back_ms < 30_000,
            "{}: consumption never resumed",
            f.label
        );
    }
}

/// `SENTINEL FAILOVER` demotes a live master: the connection made to it answers `READONLY`
/// (or is closed by the server), is dropped, and the next command goes to the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_is_left_for_the_new_one() {
    let deployment = SentinelDeployment::start(1, 3).expect("sentinel deployment starts");
    let first = deployment.master_port().expect("a master");
    let redis = rsc_redis::sentinel::SentinelRedis::open(rsc_redis::sentinel::SentinelConfig {
        sentinels: rsc_redis::sentinel::parse_addrs(&deployment.sentinel_addrs()).expect("addrs"),
        master_name: SENTINEL_MASTER.into(),
        sentinel_username: None,
        sentinel_password: None,
        master: redis::RedisConnectionInfo::default(),
        connect_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(2),
        sentinel_tls: false,
        master_tls: None,
        tls: rsc_redis::Tls::default(),
    })
    .expect("settings");
    let set = |conn: &mut rsc_redis::sentinel::SentinelConn, v: u32| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("SET")
                .arg("k")
                .arg(v)
                .query_async::<()>(&mut conn)
                .await
        }
    };
    let mut conn = redis.get().await.expect("connected");
    set(&mut conn, 1).await.expect("written to the master");
    assert_eq!(redis.lookups(), 1);
    // What a shard worker's own connection is made from.
    let (generation, info) = redis.master().await.expect("the master's address");

    // A manual failover: the old master stays up, as a replica.
    let sentinel_port: u16 = deployment
        .sentinel_addrs()
        .split(',')
        .next()
        .and_then(|a| a.rsplit(':').next()?.parse().ok())
        .expect("a sentinel port");
    let mut s = redis_on(sentinel_port);
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SENTINEL_MASTER)
        .query(&mut s)
        .expect("SENTINEL FAILOVER");
    let deadline = Instant::now() + Duration::from_secs(30);
    let promoted = loop {
        if let Some(p) = deployment.master_port().filter(|&p| p != first) {
            break p;
        }
        assert!(Instant::now() < deadline, "no failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The old master turns replica: wait until it says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The switch to replica closes the server's connections: a reply cut off by it is
        // asked again.
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query(&mut redis_on(first));
        if info.as_deref().is_ok_and(|i| i.contains("role:slave")) {
            break;
        }
        assert!(Instant::now() < deadline, "the old master was not demoted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A connection made from the stale address now reaches a replica: `READONLY`. Reported,
    // it makes the next look-up ask the sentinels.
    let mut stale = redis::Client::open(info)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("the old master is alive");
    let e = redis::cmd("SET")
        .arg("k")
        .arg(9)
        .query_async::<()>(&mut stale)
        .await
        .expect_err("a replica refuses writes");
    assert_eq!(
        e.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
        "{e}"
    );
    assert!(rsc_redis::sentinel::is_failover_error(&e));
    redis.report(generation, &e);
    let (_, now) = redis.master().await.expect("looked up again");
    assert_eq!(
        now.addr().to_string(),
        format!("127.0.0.1:{promoted}"),
        "the sentinels' new master"
    );
    // The watcher may have moved the handle before the report did: 2 look-ups or 3.
    assert!(redis.lookups() >= 2);

    // The connection the client held was closed by the demotion: it fails once, then writes
    // land on the new master.
    let old = set(&mut conn, 2).await;
    let err = old.expect_err("a write on the demoted master must fail");
    eprintln!("write on the demoted master: {err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = redis.get().await.expect("re-resolved");
        if set(&mut c, 3).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "never wrote to the new master");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(redis.lookups() >= 2, "the master was looked up again");
    let v: u32 = redis::cmd("GET")
        .arg("k")
        .query(&mut redis_on(promoted))
        .expect("GET");
    assert_eq!(v, 3, "the write went to the promoted master");
}
