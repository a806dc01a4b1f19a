//! Sample pods as real processes, and reading what they recorded (for `listener.rs`).

use rsc_e2e::Api;
use rsc_testkit::{CoordinatorProcess, RedisServer, Signal, binary_path, signal, wait_for};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Heavy scenarios run one at a time: each one starts seven processes on a small machine.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A data Redis and a coordinator (memory store).
pub(crate) struct Stack {
    pub(crate) redis: RedisServer,
    pub(crate) coordinator: CoordinatorProcess,
    pub(crate) api: Api,
}

impl Stack {
    pub(crate) fn start() -> Self {
        let redis = RedisServer::start().expect("redis-server starts");
        let coordinator =
            CoordinatorProcess::start(&["--store", "memory", "--sweep-interval-ms", "20"])
                .expect("coordinator starts");
        let api = Api::new(coordinator.url());
        Stack {
            redis,
            coordinator,
            api,
        }
    }

    /// Like [`Stack::start`], with the coordinator reading the data Redis
    /// (`--data-redis-url`: lag, pending and stale consumers in the group view).
    #[allow(dead_code)]
    pub(crate) fn start_with_data_redis() -> Self {
        Self::start_with_data_redis_args(&[])
    }

    /// Like [`Stack::start_with_data_redis`], with more coordinator arguments.
    #[allow(dead_code)]
    pub(crate) fn start_with_data_redis_args(extra: &[&str]) -> Self {
        let redis = RedisServer::start().expect("redis-server starts");
        let url = redis.url();
        let mut args = vec![
            "--store",
            "memory",
            "--sweep-interval-ms",
            "20",
            "--data-redis-url",
            &url,
        ];
        args.extend_from_slice(extra);
        let coordinator = CoordinatorProcess::start(&args).expect("coordinator starts");
        let api = Api::new(coordinator.url());
        Stack {
            redis,
            coordinator,
            api,
        }
    }

    pub(crate) async fn create_group(
        &self,
        group: &str,
        stream: &str,
        shards: u32,
        session_ms: u64,
        heartbeat_ms: u64,
    ) {
        let (s, body) = self
            .api
            .post(
                "/v1/groups",
                json!({"group": group, "stream": stream, "shard_count": shards,
                    "session_timeout_ms": session_ms, "heartbeat_interval_ms": heartbeat_ms}),
            )
            .await;
        assert_eq!(s.as_u16(), 201, "{body}");
    }

    pub(crate) async fn group(&self, group: &str) -> Value {
        let (s, body) = self.api.get(&format!("/v1/groups/{group}")).await;
        assert_eq!(s.as_u16(), 200, "{body}");
        body
    }

    /// Waits until the group has `members` members, all stable, owning every shard.
    pub(crate) async fn wait_stable(&self, group: &str, members: usize, shards: usize) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let g = self.group(group).await;
            let ms = g["members"].as_array().cloned().unwrap_or_default();
            let owned: usize = ms
                .iter()
                .map(|m| m["owned_shards"].as_array().map_or(0, Vec::len))
                .sum();
            if ms.len() == members && ms.iter().all(|m| m["state"] == "stable") && owned == shards {
                return g;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "group never became stable: {g:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn redis(&self) -> redis::Connection {
        redis::Client::open(self.redis.url())
            .and_then(|c| c.get_connection())
            .expect("redis connection")
    }
}

/// The shards each member owns, from a group view.
pub(crate) fn owned_by(group_view: &Value) -> HashMap<String, Vec<u32>> {
    group_view["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let shards = m["owned_shards"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .map(|s| s as u32)
                .collect();
            (
                m["member_id"].as_str().unwrap_or_default().to_owned(),
                shards,
            )
        })
        .collect()
}

/// The sample consumer a pod at `pod_ip` runs. `RSC_TEST_POD_LANG` chooses: `rust` (the
/// default: the `sample-consumer` binary), `python` (`examples/python/sample_consumer.py`
/// under `RSC_TEST_PYTHON`, an interpreter with the `rsc` package installed, default
/// `python3`), or `mixed` (pods whose address ends in an odd number run Python, the others
/// Rust: one group of both). Both take the same flags and write the same record stream
/// (PROTOCOL §8).
fn pod_command(pod_ip: &str) -> Command {
    let lang = std::env::var("RSC_TEST_POD_LANG").unwrap_or_default();
    let odd = pod_ip
        .rsplit('.')
        .next()
        .and_then(|o| o.parse::<u32>().ok())
        .is_some_and(|o| o % 2 == 1);
    let python = match lang.as_str() {
        "python" => true,
        "mixed" => odd,
        "" | "rust" => false,
        other => panic!("RSC_TEST_POD_LANG={other:?}: expected rust, python or mixed"),
    };
    if !python {
        return Command::new(binary_path("sample-consumer").expect("built"));
    }
    let interpreter = std::env::var("RSC_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/python/sample_consumer.py");
    let mut cmd = Command::new(interpreter);
    cmd.arg(script);
    cmd
}

/// A `sample-consumer` process. Killed when dropped.
pub(crate) struct Consumer {
    child: Option<Child>,
    pub(crate) pod_ip: String,
    log: Arc<Mutex<Vec<String>>>,
    /// Where the pod serves `/healthz`, `/readyz` and `/metrics` (`http://IP:PORT`).
    health: String,
}

impl Consumer {
    pub(crate) fn start(stack: &Stack, pod_ip: &str, extra: &[&str]) -> Self {
        Self::start_via(stack, &stack.coordinator.url(), pod_ip, extra)
    }

    /// Like [`Consumer::start`], with environment variables set for the pod.
    #[allow(dead_code)]
    pub(crate) fn start_env(
        stack: &Stack,
        pod_ip: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_full(stack, &stack.coordinator.url(), pod_ip, extra, env)
    }

    /// Like [`Consumer::start`], reading the data Redis at `redis_url` (e.g. a proxy, or an
    /// address where nothing listens).
    #[allow(dead_code)]
    pub(crate) fn start_with_redis(
        stack: &Stack,
        redis_url: &str,
        pod_ip: &str,
        extra: &[&str],
    ) -> Self {
        let redis = ["--redis-url", redis_url];
        let args: Vec<&str> = redis.iter().chain(extra).copied().collect();
        Self::start_full(stack, &stack.coordinator.url(), pod_ip, &args, &[])
    }

    /// Like [`Consumer::start`], talking to the coordinator at `coordinator` (e.g. a proxy).
    pub(crate) fn start_via(
        stack: &Stack,
        coordinator: &str,
        pod_ip: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_full(stack, coordinator, pod_ip, extra, &[])
    }

    fn start_full(
        stack: &Stack,
        coordinator: &str,
        pod_ip: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        // Every pod serves its probes and metrics on its own address (tests read its
        // counters instead of its log), unless the test chose the address itself.
        let health = match extra.iter().position(|a| *a == "--health-listen") {
            Some(i) => extra[i + 1].to_owned(),
            None => {
                let port = std::net::TcpListener::bind((pod_ip, 0))
                    .and_then(|l| l.local_addr())
                    .expect("a free port on the pod's address")
                    .port();
                format!("{pod_ip}:{port}")
            }
        };
        let redis_url = stack.redis.url();
        let redis = (!extra.contains(&"--redis-url")).then_some(["--redis-url", &redis_url]);
        let mut child = pod_command(pod_ip)
            .args(["--coordinator", coordinator])
            .args(redis.into_iter().flatten())
            .args(["--pod-ip", pod_ip])
            .args(extra)
            .args(
                (!extra.contains(&"--health-listen"))
                    .then(|| ["--health-listen".to_owned(), health.clone()])
                    .into_iter()
                    .flatten(),
            )
            .env(
                "RSC_LOG",
                std::env::var("RSC_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sample-consumer starts");
        let stderr = child.stderr.take().expect("piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let tag = pod_ip.to_owned();
        let echo = std::env::var_os("RSC_TEST_ECHO").is_some();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[{tag}] {line}");
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Consumer {
            child: Some(child),
            pod_ip: pod_ip.to_owned(),
            log,
            health: format!("http://{health}"),
        }
    }

    /// The sum of the samples of the pod's client metric `metric` whose labels include all
    /// of `labels`, from its `/metrics` (0 when the counter was never incremented); `None`
    /// while the pod does not answer.
    #[allow(dead_code)]
    pub(crate) async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let r = rsc_e2e::http()
            .get(format!("{}/metrics", self.health))
            .send()
            .await
            .ok()?;
        let text = r.error_for_status().ok()?.text().await.ok()?;
        Some(rsc_e2e::metric_sum(&text, metric, labels))
    }

    /// Where the pod serves `/healthz`, `/readyz` and `/metrics` (`http://IP:PORT`).
    #[allow(dead_code)]
    pub(crate) fn health_url(&self) -> &str {
        &self.health
    }

    /// Whether the pod's `/readyz` answers 200 (`None` while it does not answer at all).
    #[allow(dead_code)]
    pub(crate) async fn ready(&self) -> Option<bool> {
        let r = rsc_e2e::http()
            .get(format!("{}/readyz", self.health))
            .send()
            .await
            .ok()?;
        Some(r.status().is_success())
    }

    /// Member ids of this pod: `<pod_ip>-<group>-<index>`.
    pub(crate) fn member_ids(&self, group: &str, concurrency: u32) -> Vec<String> {
        (0..concurrency)
            .map(|i| format!("{}-{group}-{i}", self.pod_ip))
            .collect()
    }

    pub(crate) fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The process id (for SIGSTOP / SIGCONT; used by `fencing.rs`).
    #[allow(dead_code)]
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, and wait.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit on its own (panics past `timeout`).
    #[allow(dead_code)]
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        match wait_for("the consumer to exit", timeout, || {
            c.try_wait().ok().flatten()
        }) {
            Ok(status) => status,
            Err(e) => {
                let _ = c.kill();
                panic!("{e}; log:\n{}", self.log().join("\n"));
            }
        }
    }

    /// SIGTERM, and wait for the exit.
    pub(crate) fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        signal(c.id(), Signal::SIGTERM).expect("signal");
        let r = wait_for("the consumer to exit", Duration::from_secs(30), || {
            c.try_wait().ok().flatten()
        });
        match r {
            Ok(status) => status,
            Err(e) => {
                let _ = c.kill();
                panic!("{e}; log:\n{}", self.log().join("\n"));
            }
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Starts `sample-producer` (waits for nothing).
pub(crate) fn spawn_producer(
    stack: &Stack,
    stream: &str,
    count: u64,
    keys: u64,
    rate: Option<u64>,
) -> Child {
    let mut cmd = Command::new(binary_path("sample-producer").expect("built"));
    cmd.args([
        "--coordinator",
        &stack.coordinator.url(),
        "--redis-url",
        &stack.redis.url(),
    ])
    .args([
        "--stream",
        stream,
        "--count",
        &count.to_string(),
        "--keys",
        &keys.to_string(),
    ]);
    if let Some(r) = rate {
        cmd.args(["--rate", &r.to_string()]);
    }
    // The entry fields, so that the checkers find duplicates by them (PROTOCOL §21).
    cmd.env("RSC_PUBLISH_PRODUCER_FIELDS", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("sample-producer starts")
}

/// Waits for a producer and checks its `published N` line.
pub(crate) fn finish_producer(child: Child, count: u64) {
    let out = child.wait_with_output().expect("producer runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "producer failed: {stdout}");
    assert_eq!(stdout.trim(), format!("published {count}"));
}

/// One entry of the record stream.
#[derive(Debug, Clone)]
pub(crate) struct Handled {
    pub(crate) entry_id: String,
    pub(crate) shard: u32,
    pub(crate) member: String,
    pub(crate) key: String,
    pub(crate) seq: u64,
    pub(crate) started_ms: u64,
    pub(crate) finished_ms: u64,
}

/// Every entry of a stream, as field maps, in stream order.
pub(crate) fn read_stream(con: &mut redis::Connection, key: &str) -> Vec<HashMap<String, String>> {
    let mut out = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(5000)
            .query(con)
            .expect("XRANGE");
        let n = reply.ids.len();
        for id in reply.ids {
            start = format!("({}", id.id);
            let map = id
                .map
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        redis::from_redis_value_ref::<String>(v).unwrap_or_default(),
                    )
                })
                .collect();
            out.push(map);
        }
        if n < 5000 {
            return out;
        }
    }
}

/// The record stream, parsed.
pub(crate) fn handled(con: &mut redis::Connection, key: &str) -> Vec<Handled> {
    read_stream(con, key)
        .into_iter()
        .map(|m| {
            let num = |f: &str| {
                m.get(f)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("field {f} in {m:?}"))
            };
            Handled {
                entry_id: m["entry_id"].clone(),
                shard: num("shard") as u32,
                member: m["member"].clone(),
                key: m["key"].clone(),
                seq: num("seq"),
                started_ms: num("started_ms"),
                finished_ms: num("finished_ms"),
            }
        })
        .collect()
}

/// Per-key order violations: first handlings of `(key, seq)` in record-stream order whose
/// seq is below a seq of the same key handled before. Returns (violations, examples).
#[allow(dead_code)]
pub(crate) fn order_violations(records: &[Handled]) -> (usize, Vec<String>) {
    let mut seen: HashSet<(String, u64)> = HashSet::new();
    let mut top: HashMap<String, u64> = HashMap::new();
    let mut violations = 0;
    let mut examples = Vec::new();
    for r in records {
        if !seen.insert((r.key.clone(), r.seq)) {
            continue;
        }
        let t = top.entry(r.key.clone()).or_insert(r.seq);
        if r.seq < *t {
            violations += 1;
            if examples.len() < 10 {
                examples.push(format!(
                    "{} seq {} (shard {}, {}) after seq {}",
                    r.key, r.seq, r.shard, r.entry_id, t
                ));
            }
        } else {
            *t = r.seq;
        }
    }
    (violations, examples)
}

pub(crate) fn xlen(con: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("XLEN").arg(key).query(con).expect("XLEN")
}

/// `(pending, lag)` of consumer group `group` on the shard key `key` (`XINFO GROUPS`; lag is
/// `None` when Redis cannot tell).
pub(crate) fn group_on_shard(
    con: &mut impl redis::ConnectionLike,
    key: &str,
    group: &str,
) -> (u64, Option<u64>) {
    let g = group_info(con, key, group);
    (g.pending as u64, g.lag.map(|l| l as u64))
}

/// Consumer group `group` on the stream key `key`, as `XINFO GROUPS` describes it.
pub(crate) fn group_info(
    con: &mut impl redis::ConnectionLike,
    key: &str,
    group: &str,
) -> redis::streams::StreamInfoGroup {
    let info: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query(con)
        .expect("XINFO GROUPS");
    info.groups
        .into_iter()
        .find(|g| g.name == group)
        .unwrap_or_else(|| panic!("no group {group} on {key}"))
}

/// Waits until `cond` holds, polling every 100 ms, or panics after `secs`.
/// Like [`eventually`], with an asynchronous condition (e.g. a pod's metric).
#[allow(dead_code)]
pub(crate) async fn eventually_async<T, F, Fut>(what: &str, secs: u64, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn eventually<T>(what: &str, secs: u64, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Entries of the stream's shards `0..shards` that repeat another's `(producer_id,
/// producer_seq)` (a record an idempotent producer wrote twice, PROTOCOL §21), and entries
/// without that pair.
pub(crate) fn producer_duplicates(
    con: &mut redis::Connection,
    stream: &str,
    shards: u32,
) -> (usize, usize) {
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let (mut dups, mut unmarked) = (0, 0);
    for s in 0..shards {
        for e in read_stream(con, &rsc_protocol::routing::shard_key(stream, s)) {
            match (e.get("producer_id"), e.get("producer_seq")) {
                (Some(p), Some(q)) => dups += usize::from(!seen.insert((p.clone(), q.clone()))),
                _ => unmarked += 1,
            }
        }
    }
    (dups, unmarked)
}
