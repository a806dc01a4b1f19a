//! `rsc-bridge` end to end: real redis-server, rsc-coordinator, rsc-bridge processes and
//! the sample applications of `examples/bridge/` (Node 20's `http` module, Java's
//! `com.sun.net.httpserver`) as real processes. Each application appends a JSON line per
//! entry it handled, before answering 2xx; the tests read those lines and the dead-letter
//! stream. Every scenario runs with each application (docs/BRIDGE.md): kill -9 of the
//! bridge, the application killed and restarted, a slow application, poison entries,
//! SIGTERM, binary and structured events and batches, publishing through the bridge, and
//! per-key order with `key_concurrency` > 1.

use crate::pods::{SERIAL, Stack};
use rsc_client::producer::{Producer, Record};
use rsc_testkit::{Signal, binary_path, free_port, signal, wait_for};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The group's session timeout in these tests: a killed bridge's shards move after it.
const SESSION_MS: u64 = 3000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A child process whose stdout and stderr lines are kept. Killed when dropped.
struct Proc {
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    tag: String,
}

impl Proc {
    fn spawn(tag: &str, mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{tag} starts: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let echo = std::env::var_os("RSC_TEST_ECHO").is_some();
        let out: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stdout.take().expect("piped")),
            Box::new(child.stderr.take().expect("piped")),
        ];
        for pipe in out {
            let sink = log.clone();
            let tag = tag.to_owned();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if echo {
                        eprintln!("[{tag}] {line}");
                    }
                    sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
        }
        Proc {
            child: Some(child),
            log,
            tag: tag.to_owned(),
        }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first logged line containing `text`, waited for.
    fn wait_line(&self, text: &str, timeout: Duration) -> String {
        wait_for(text, timeout, || {
            self.log().into_iter().find(|l| l.contains(text))
        })
        .unwrap_or_else(|e| panic!("{}: {e}; log:\n{}", self.tag, self.log().join("\n")))
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        signal(c.id(), Signal::SIGTERM).expect("SIGTERM");
        wait_for("the process to exit", timeout, || {
            c.try_wait().ok().flatten()
        })
        .unwrap_or_else(|e| panic!("{}: {e}; log:\n{}", self.tag, self.log().join("\n")))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The language of a sample application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    /// `examples/bridge/node/app.js`.
    Node,
    /// `examples/bridge/java/App.java`.
    Java,
}

impl Lang {
    /// The command that runs the application.
    fn command(self) -> Command {
        match self {
            Lang::Node => {
                let mut cmd = Command::new("node");
                cmd.arg(root().join("examples/bridge/node/app.js"));
                cmd
            }
            Lang::Java => {
                let mut cmd = Command::new("java");
                cmd.arg(root().join("examples/bridge/java/App.java"));
                cmd
            }
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Lang::Node => "node",
            Lang::Java => "java",
        }
    }
}

/// A sample application.
struct App {
    proc: Proc,
    port: u16,
}

impl App {
    /// The application of `lang` on `port` (127.0.0.1), recording to `record`.
    fn start(lang: Lang, port: u16, record: &Path, env: &[(&str, &str)]) -> Self {
        let mut cmd = lang.command();
        cmd.env("APP_PORT", port.to_string())
            .env("APP_RECORD", record)
            .envs(env.iter().copied());
        let proc = Proc::spawn(lang.tag(), cmd);
        // `java App.java` compiles the source first: slow on a loaded machine.
        proc.wait_line("listening on", Duration::from_secs(90));
        App { proc, port }
    }
}

/// An `rsc-bridge` process.
struct Bridge {
    proc: Proc,
    url: String,
}

impl Bridge {
    /// A bridge of listener `billing` (group `billing`, stream `orders`) delivering to
    /// `app_port`, with more `RSC_*` variables and more arguments (the per-listener flags).
    fn start(
        stack: &Stack,
        instance: &str,
        app_port: u16,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let mut cmd = Command::new(binary_path("rsc-bridge").expect("built"));
        cmd.args(["--listen", "127.0.0.1:0", "--instance-id", instance])
            .args(args)
            .env("RSC_COORDINATOR_URL", stack.coordinator.url())
            .env("RSC_REDIS_URL", stack.redis.url())
            .env("RSC_BRIDGE_LISTENERS", "billing")
            .env("RSC_LISTENER_BILLING_STREAM", "orders")
            .env(
                "RSC_LISTENER_BILLING_DELIVER_TO",
                format!("http://127.0.0.1:{app_port}/events"),
            )
            .env("RSC_LISTENER_BILLING_RETRY_BACKOFF_MS", "50")
            .env("RSC_LISTENER_BILLING_RETRY_BACKOFF_MAX_MS", "200")
            .env("RSC_PUBLISH_DELIVERY_TIMEOUT_MS", "1000")
            .env(
                "RSC_LOG",
                std::env::var("RSC_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied());
        let proc = Proc::spawn(instance, cmd);
        let line = proc.wait_line("listening on ", Duration::from_secs(30));
        let addr = line
            .rsplit("listening on ")
            .next()
            .expect("an address")
            .trim()
            .to_owned();
        let addr = addr
            .split_whitespace()
            .next()
            .expect("an address")
            .to_owned();
        Bridge {
            proc,
            url: format!("http://{addr}"),
        }
    }

    async fn ready(&self) -> Option<(bool, Value)> {
        let r = rsc_e2e::http()
            .get(format!("{}/readyz", self.url))
            .send()
            .await
            .ok()?;
        let ok = r.status().is_success();
        Some((ok, r.json().await.ok()?))
    }

    async fn wait_ready(&self, want: bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((ok, body)) = self.ready().await
                && ok == want
            {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "readyz never became {want}; log:\n{}",
                self.proc.log().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The lines an application recorded.
fn recorded(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the applications recorded every seq of `want` (at least once).
async fn wait_recorded(file: &Path, want: &BTreeSet<u64>, what: &str) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let lines = recorded(file);
        let seen: BTreeSet<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
        if want.is_subset(&seen) {
            return lines;
        }
        let missing: Vec<_> = want.difference(&seen).take(10).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never recorded {missing:?}…"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes seqs `range` on `orders` (key `k{seq % keys}`), with `extra` in each payload.
async fn publish(producer: &Producer, range: std::ops::Range<u64>, keys: u64, extra: Value) {
    let records: Vec<Record> = range
        .map(|seq| {
            let mut p = json!({"seq": seq});
            if let (Some(o), Some(e)) = (p.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            Record::json(&p)
                .expect("json")
                .key(format!("k{}", seq % keys))
        })
        .collect();
    producer
        .publish_batch("orders", records)
        .await
        .expect("published");
}

fn producer(stack: &Stack) -> Producer {
    rsc_client::install_crypto_provider();
    Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .build()
        .expect("producer")
}

fn dlq_len(stack: &Stack) -> u64 {
    let mut c = stack.redis();
    redis::cmd("XLEN")
        .arg("orders:dlq")
        .query(&mut c)
        .expect("XLEN")
}

/// The modes (`binary`, `structured`, `batch`) of the lines whose seq is in `seqs`.
fn modes(lines: &[Value], seqs: std::ops::Range<u64>) -> BTreeSet<String> {
    lines
        .iter()
        .filter(|l| l["seq"].as_u64().is_some_and(|s| seqs.contains(&s)))
        .map(|l| l["mode"].as_str().unwrap_or("none").to_owned())
        .collect()
}

/// Asserts that each key's seqs were handled in order.
fn assert_key_order(lines: &[Value]) {
    for (key, seqs) in per_key_order(lines) {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of order: {seqs:?}"
        );
    }
}

/// Each key's seqs in the order the application finished them (first handling of each).
fn per_key_order(lines: &[Value]) -> BTreeMap<String, Vec<u64>> {
    let mut seen = BTreeSet::new();
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut lines: Vec<&Value> = lines.iter().collect();
    lines.sort_by_key(|l| l["finished_ms"].as_u64());
    for l in lines {
        let (Some(k), Some(s)) = (l["key"].as_str(), l["seq"].as_u64()) else {
            continue;
        };
        if seen.insert(s) {
            out.entry(k.to_owned()).or_default().push(s);
        }
    }
    out
}

/// Two tests of `scenario`, one with each sample application.
macro_rules! with_each_app {
    ($scenario:ident: $node:ident, $java:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $node() {
            $scenario(Lang::Node).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $java() {
            $scenario(Lang::Java).await;
        }
    };
}

with_each_app!(consumes_in_key_order_dead_letters_poison_and_publishes:
    node_app_consumes_in_key_order_dead_letters_poison_and_publishes_through_the_bridge,
    java_app_consumes_in_key_order_dead_letters_poison_and_publishes_through_the_bridge);

async fn consumes_in_key_order_dead_letters_poison_and_publishes(lang: Lang) {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack
        .create_group("billing", "orders", 4, SESSION_MS, 500)
        .await;
    stack
        .create_group("shipping", "out", 2, SESSION_MS, 500)
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("app.jsonl");
    let token = "app-s3cret";
    let port = free_port().expect("port");
    let bridge = Bridge::start(
        &stack,
        "bridge-a",
        port,
        &[
            ("RSC_LISTENER_BILLING_KEY_CONCURRENCY", "4"),
            ("RSC_BRIDGE_APP_TOKEN", token),
        ],
        &[],
    );
    let app = App::start(
        lang,
        port,
        &record,
        &[("APP_TOKEN", token), ("BRIDGE_URL", &bridge.url)],
    );
    stack.wait_stable("billing", 1, 4).await;
    bridge.wait_ready(true).await;

    let producer = producer(&stack);
    publish(&producer, 0..200, 8, json!({"forward_to": "out"})).await;
    publish(&producer, 1000..1003, 8, json!({"poison": true})).await;
    let want: BTreeSet<u64> = (0..200).collect();
    let lines = wait_recorded(&record, &want, lang.tag()).await;
    assert_key_order(&lines);
    assert_eq!(modes(&lines, 0..200), BTreeSet::from(["binary".to_owned()]));
    assert!(
        lines
            .iter()
            .all(|l| l["seq"].as_u64().is_some_and(|s| s < 1000)),
        "poison was never handled"
    );
    wait_for("3 dead letters", Duration::from_secs(20), || {
        (dlq_len(&stack) == 3).then_some(())
    })
    .expect("poison dead-lettered");
    // Every handled entry was forwarded through the bridge's publish route, once.
    let mut c = stack.redis();
    let out: u64 = (0..2)
        .map(|s| {
            redis::cmd("XLEN")
                .arg(format!("out:{s}"))
                .query::<u64>(&mut c)
                .expect("XLEN")
        })
        .sum();
    assert!(out >= 200, "forwarded {out}");
    check_publish_route(&bridge, token).await;
    drop(app);
}

/// The publish route: the token, PROTOCOL's error shape, entry ids; the metrics count the
/// outcomes; the token is never logged.
async fn check_publish_route(bridge: &Bridge, token: &str) {
    let http = rsc_e2e::http();
    let url = format!("{}/v1/publish/out", bridge.url);
    let r = http
        .post(&url)
        .json(&json!({"payload": 1}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 401);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    let r = http
        .post(&url)
        .bearer_auth(token)
        .json(&json!({"records": [{"key": "x", "payload": {"a": 1}}, {"payload_base64": "/wA="}]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["entries"].as_array().map(Vec::len), Some(2), "{body}");
    let r = http
        .post(&url)
        .bearer_auth(token)
        .body("{not json")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "INVALID_REQUEST");
    let r = http
        .post(format!("{}/v1/publish/nowhere", bridge.url))
        .bearer_auth(token)
        .json(&json!({"payload": 1}))
        .send()
        .await
        .expect("answer");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "STREAM_NOT_FOUND", "{body}");
    let text = metrics(bridge).await;
    assert!(
        rsc_testkit::metric_sum(
            &text,
            "rsc_bridge_deliveries_total",
            &[("outcome", "acked")]
        ) >= 200.0,
        "{text}"
    );
    assert!(
        rsc_testkit::metric_sum(
            &text,
            "rsc_bridge_deliveries_total",
            &[("outcome", "dead_lettered")]
        ) >= 3.0
    );
    assert!(
        !bridge.proc.log().join("\n").contains(token),
        "the token is never logged"
    );
}

async fn metrics(bridge: &Bridge) -> String {
    rsc_e2e::http()
        .get(format!("{}/metrics", bridge.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

with_each_app!(app_down_holds_entries_back_and_a_slow_one_loses_nothing:
    node_app_down_holds_entries_back_and_a_slow_one_loses_nothing,
    java_app_down_holds_entries_back_and_a_slow_one_loses_nothing);

async fn app_down_holds_entries_back_and_a_slow_one_loses_nothing(lang: Lang) {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack
        .create_group("billing", "orders", 2, SESSION_MS, 500)
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("app.jsonl");
    let port = free_port().expect("port");
    // Per-listener settings as flags (docs/BRIDGE.md "Configuration").
    let bridge = Bridge::start(
        &stack,
        "bridge-j",
        port,
        &[("RSC_LISTENER_BILLING_KEY_CONCURRENCY", "1")],
        &[
            "--listener-billing-max-retries",
            "1",
            "--listener-billing-key-concurrency=4",
        ],
    );
    let mut app = App::start(lang, port, &record, &[("APP_HANDLE_MS", "20")]);
    stack.wait_stable("billing", 1, 2).await;
    bridge.wait_ready(true).await;
    let producer = producer(&stack);
    publish(&producer, 0..40, 4, json!({})).await;
    wait_recorded(&record, &(0..40).collect(), lang.tag()).await;

    // The application goes away: the bridge holds the entries (readyz says why), dead-letters
    // nothing, however long it stays away (far beyond max_retries of a failing delivery).
    app.proc.kill9();
    let body = bridge.wait_ready(false).await;
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("unreachable")),
        "{body}"
    );
    publish(&producer, 40..80, 4, json!({})).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the window of a negative check
    assert_eq!(
        dlq_len(&stack),
        0,
        "nothing dead-lettered while the application is down"
    );
    let handled = recorded(&record)
        .iter()
        .filter(|l| l["seq"].as_u64().is_some_and(|s| s >= 40))
        .count();
    assert_eq!(handled, 0, "nothing handled while the application is down");
    let text = metrics(&bridge).await;
    assert!(
        rsc_testkit::metric_sum(
            &text,
            "rsc_bridge_deliveries_total",
            &[("outcome", "deferred")]
        ) >= 2.0,
        "the bridge tried, and deferred: {text}"
    );
    assert_eq!(
        rsc_testkit::metric_sum(&text, "rsc_bridge_app_up", &[]),
        0.0
    );

    // Back (slow now): every entry arrives, none dead-lettered, each key in order through
    // four lanes per shard (the flag's, over the variable's 1).
    let _app = App::start(lang, app.port, &record, &[("APP_HANDLE_MS", "100")]);
    bridge.wait_ready(true).await;
    let started = tokio::time::Instant::now();
    let lines = wait_recorded(&record, &(0..80).collect(), "after restart").await;
    assert_eq!(dlq_len(&stack), 0);
    assert_key_order(&lines);
    // 40 entries of 100 ms on 2 shards take 2 s one at a time; the lanes overlap them.
    let overlapped = lines.iter().any(|a| {
        lines.iter().any(|b| {
            a["shard"] == b["shard"]
                && a["seq"] != b["seq"]
                && a["started_ms"].as_u64() < b["finished_ms"].as_u64()
                && b["started_ms"].as_u64() < a["finished_ms"].as_u64()
        })
    });
    assert!(
        overlapped,
        "two entries of one shard in flight at once ({:?})",
        started.elapsed()
    );
}

with_each_app!(a_killed_bridge_is_taken_over_and_sigterm_hands_over_without_loss:
    node_app_behind_a_killed_bridge_and_a_sigterm_hand_over_loses_nothing,
    java_app_behind_a_killed_bridge_and_a_sigterm_hand_over_loses_nothing);

async fn a_killed_bridge_is_taken_over_and_sigterm_hands_over_without_loss(lang: Lang) {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack
        .create_group("billing", "orders", 4, SESSION_MS, 300)
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("app.jsonl");
    let port = free_port().expect("port");
    let _app = App::start(lang, port, &record, &[("APP_HANDLE_MS", "5")]);
    let lanes = [("RSC_LISTENER_BILLING_KEY_CONCURRENCY", "2")];
    let mut a = Bridge::start(&stack, "bridge-a", port, &lanes, &[]);
    let mut b = Bridge::start(&stack, "bridge-b", port, &lanes, &[]);
    stack.wait_stable("billing", 2, 4).await;
    let producer = producer(&stack);
    publish(&producer, 0..100, 8, json!({})).await;
    wait_recorded(&record, &(0..100).collect(), "before the kill").await;

    // kill -9: the other bridge takes the shards after the session timeout; nothing is lost.
    publish(&producer, 100..200, 8, json!({})).await;
    a.proc.kill9();
    wait_recorded(&record, &(0..200).collect(), "after kill -9").await;
    stack.wait_stable("billing", 1, 4).await;

    // SIGTERM: in-flight deliveries finish, the member leaves, the new bridge takes over.
    // This one delivers in structured mode (a flag over the variable's binary).
    let c = Bridge::start(
        &stack,
        "bridge-c",
        port,
        &[lanes[0], ("RSC_LISTENER_BILLING_MODE", "binary")],
        &["--listener-billing-mode", "structured"],
    );
    stack.wait_stable("billing", 2, 4).await;
    publish(&producer, 200..300, 8, json!({})).await;
    let status = b.proc.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    stack.wait_stable("billing", 1, 4).await;
    publish(&producer, 300..400, 8, json!({})).await;
    let lines = wait_recorded(&record, &(0..400).collect(), "after SIGTERM").await;
    assert_eq!(modes(&lines, 0..200), BTreeSet::from(["binary".to_owned()]));
    assert_eq!(
        modes(&lines, 300..400),
        BTreeSet::from(["structured".to_owned()]),
        "the last bridge's events are structured"
    );
    // A graceful hand-over delivers nothing twice: in-flight deliveries finished and were
    // acknowledged before the member left; what it had read but not started went to the next
    // owner once.
    let mut times: BTreeMap<u64, usize> = BTreeMap::new();
    for s in lines
        .iter()
        .filter_map(|l| l["seq"].as_u64())
        .filter(|s| *s >= 200)
    {
        *times.entry(s).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "delivered twice across SIGTERM: {twice:?}"
    );
    assert_eq!(dlq_len(&stack), 0);
    assert_key_order(&lines);
    drop(c);
}

with_each_app!(a_batch_listener_gets_arrays_and_fails_entries_one_by_one:
    node_app_on_a_unix_socket_gets_batches_and_fails_entries_one_by_one,
    java_app_gets_batches_and_fails_entries_one_by_one);

/// A batch listener (flags `max_batch`, `linger_ms`): Node's application on a Unix socket,
/// Java's (whose `HttpServer` listens on TCP only) on loopback.
async fn a_batch_listener_gets_arrays_and_fails_entries_one_by_one(lang: Lang) {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack
        .create_group("billing", "orders", 2, SESSION_MS, 500)
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("app.jsonl");
    let socket = dir.path().join("app.sock");
    let (_app, deliver_to, port) = match lang {
        Lang::Node => {
            let mut cmd = lang.command();
            cmd.env("APP_SOCKET", &socket).env("APP_RECORD", &record);
            let app = Proc::spawn("node-unix", cmd);
            app.wait_line("listening on", Duration::from_secs(30));
            (app, format!("unix:{}", socket.display()), 0)
        }
        Lang::Java => {
            let port = free_port().expect("port");
            let app = App::start(lang, port, &record, &[]);
            (app.proc, format!("http://127.0.0.1:{port}/batch"), port)
        }
    };
    let mut env = vec![("RSC_LISTENER_BILLING_DELIVER_TO", deliver_to.as_str())];
    if lang == Lang::Node {
        env.push(("RSC_LISTENER_BILLING_DELIVER_PATH", "/batch"));
    }
    let bridge = Bridge::start(
        &stack,
        "bridge-u",
        port,
        &env,
        &[
            "--listener-billing-max-batch=10",
            "--listener-billing-linger-ms",
            "20",
        ],
    );
    stack.wait_stable("billing", 1, 2).await;
    bridge.wait_ready(true).await;
    let producer = producer(&stack);
    publish(&producer, 0..60, 6, json!({})).await;
    publish(&producer, 1000..1002, 6, json!({"poison": true})).await;
    let lines = wait_recorded(&record, &(0..60).collect(), "batches").await;
    assert_eq!(modes(&lines, 0..60), BTreeSet::from(["batch".to_owned()]));
    wait_for("2 dead letters", Duration::from_secs(20), || {
        (dlq_len(&stack) == 2).then_some(())
    })
    .expect("poison dead-lettered");
    tokio::time::sleep(Duration::from_millis(500)).await; // the window of a negative check
    assert_eq!(dlq_len(&stack), 2, "only the poison entries");
    let text = metrics(&bridge).await;
    let requests = rsc_testkit::metric_sum(
        &text,
        "rsc_bridge_deliveries_total",
        &[("outcome", "acked")],
    );
    assert!(
        requests < 60.0,
        "entries travel in batches: {requests} requests for 62 entries"
    );
}
