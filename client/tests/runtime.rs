//! The member runtime and the producer against a real redis-server and a real coordinator,
//! in process: self-fencing and resuming, rejoin after removal, coordinator failover, Redis
//! restart (NOGROUP), handler control (manual ack, dead letters, retry-after, panics,
//! undecodable payloads), pause/resume, takeover of pending entries, resharding.
//!
//! Needs the coordinator binary: `cargo build --workspace --bins`.

use rsc_client::producer::{Producer, Record};
use rsc_client::{AckMode, ConsumerApp, HandlerError, Listener, Message, Raw};
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Stack {
    redis: RedisServer,
    coordinator: CoordinatorProcess,
    http: reqwest::Client,
}

impl Stack {
    fn start() -> Self {
        Stack {
            redis: RedisServer::start().expect("redis-server"),
            coordinator: CoordinatorProcess::start(&[
                "--store",
                "memory",
                "--sweep-interval-ms",
                "20",
            ])
            .expect("coordinator (cargo build --workspace --bins)"),
            http: {
                rsc_client::install_crypto_provider();
                reqwest::Client::new()
            },
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.coordinator.url()));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("coordinator reachable");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The successful heartbeats the coordinator answered so far (its `/metrics`).
    async fn heartbeats_ok(&self) -> f64 {
        let url = format!("{}/metrics", self.coordinator.url());
        let text = self.http.get(url).send().await.expect("metrics");
        let text = text.text().await.expect("metrics body");
        rsc_testkit::metric_sum(&text, "rsc_heartbeats_total", &[("result", "ok")])
    }

    /// The members of group `g` in the coordinator's view.
    async fn member_count(&self) -> usize {
        let (_, v) = self.call(reqwest::Method::GET, "/v1/groups/g", None).await;
        v["members"].as_array().map_or(0, Vec::len)
    }

    async fn create_group(&self, stream: &str, shards: u32, session_ms: u64, heartbeat_ms: u64) {
        let (s, b) = self
            .call(
                reqwest::Method::POST,
                "/v1/groups",
                Some(
                    json!({"group": "g", "stream": stream, "shard_count": shards,
                    "session_timeout_ms": session_ms, "heartbeat_interval_ms": heartbeat_ms}),
                ),
            )
            .await;
        assert_eq!(s, 201, "{b}");
    }

    fn producer(&self) -> Producer {
        Producer::builder()
            .coordinator(&self.coordinator.url())
            .redis_url(self.redis.url())
            .refresh_every(Duration::from_millis(100))
            .build()
            .unwrap()
    }

    fn redis_con(&self) -> redis::Connection {
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

/// What a test handler saw: (payload text, attempt, delivery count, when).
type Seen = Arc<Mutex<Vec<(String, u32, u64, Instant)>>>;

fn seen_ops(seen: &Seen) -> Vec<String> {
    seen.lock().unwrap().iter().map(|s| s.0.clone()).collect()
}

async fn eventually<T>(what: &str, within: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `app` in the background; returns its handle and the join handle of `run_until`.
fn spawn_app(
    app: ConsumerApp,
) -> (
    rsc_client::AppHandle,
    tokio::task::JoinHandle<Result<(), rsc_client::ClientError>>,
) {
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));
    (handle, join)
}

/// A TCP proxy in front of the coordinator that can be cut off (connections refused and
/// existing ones closed) to simulate an outage.
struct Proxy {
    url: String,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (cut, rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut rx = rx.clone();
                if *rx.borrow() {
                    continue; // dropped: the client sees the connection close
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Proxy { url, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

fn recording_listener(stream: &str, seen: &Seen) -> Listener {
    let seen = seen.clone();
    Listener::new("g", stream, move |msg: Message<Raw>| {
        let seen = seen.clone();
        async move {
            let text = String::from_utf8_lossy(&msg.payload().0).into_owned();
            seen.lock()
                .unwrap()
                .push((text, msg.attempt(), msg.delivery_count(), Instant::now()));
            Ok::<(), HandlerError>(())
        }
    })
    .block_timeout(Duration::from_millis(200))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_fences_when_the_coordinator_is_unreachable_and_rejoins_after() {
    let stack = Stack::start();
    stack.create_group("s", 2, 1500, 100).await;
    let proxy = Proxy::start(stack.coordinator.addr()).await;
    let seen: Seen = Arc::default();
    let app = ConsumerApp::builder()
        .coordinator(&proxy.url)
        .redis_url(stack.redis.url())
        .instance_id("t")
        .listener(recording_listener("s", &seen))
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    let producer = stack.producer();
    producer
        .publish_record("s", Record::raw("m0").key("a"))
        .await
        .unwrap();
    eventually("m0 handled", Duration::from_secs(10), || {
        seen_ops(&seen).contains(&"m0".into()).then_some(())
    })
    .await;

    // A short outage (well within the 1.2 s lease): owned shards keep being worked.
    proxy.set_cut(true);
    let cut_at = Instant::now();
    producer
        .publish_record("s", Record::raw("m1").key("a"))
        .await
        .unwrap();
    eventually(
        "m1 handled during the outage",
        Duration::from_secs(2),
        || seen_ops(&seen).contains(&"m1".into()).then_some(()),
    )
    .await;
    assert!(
        cut_at.elapsed() < Duration::from_millis(1100),
        "m1 handled only after {:?}",
        cut_at.elapsed()
    );
    let heard = stack.heartbeats_ok().await;
    proxy.set_cut(false);
    // Back in touch: a heartbeat went through the restored proxy (the lease restarts).
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.heartbeats_ok().await <= heard {
        assert!(Instant::now() < deadline, "no heartbeat after the outage");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A long outage: past the lease the member stops handling (self-fence) ...
    proxy.set_cut(true);
    // The coordinator expires it after its 1.5 s session; its 1.2 s lease ran out before.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stack.member_count().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the cut-off member was never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    producer
        .publish_record("s", Record::raw("m2").key("a"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !seen_ops(&seen).contains(&"m2".into()),
        "a fenced member handled m2"
    );
    // ... and once the coordinator is back (it expired the member meanwhile) it rejoins with
    // epoch 0 and resumes.
    proxy.set_cut(false);
    eventually(
        "m2 handled after the rejoin",
        Duration::from_secs(10),
        || seen_ops(&seen).contains(&"m2".into()).then_some(()),
    )
    .await;
    handle.shutdown();
    join.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_over_to_the_next_coordinator_and_rejoins_after_removal() {
    let stack = Stack::start();
    stack.create_group("s", 2, 2000, 100).await;
    let dead = format!("http://127.0.0.1:{}", rsc_testkit::free_port().unwrap());
    let seen: Seen = Arc::default();
    let assigned = Arc::new(Mutex::new(Vec::new()));
    let revoked = Arc::new(Mutex::new(Vec::new()));
    let (a, r) = (assigned.clone(), revoked.clone());
    let listener = recording_listener("s", &seen)
        .on_assigned(move |e| a.lock().unwrap().extend(e.shards.clone()))
        .on_revoked(move |e| r.lock().unwrap().extend(e.shards.clone()));
    let app = ConsumerApp::builder()
        .coordinator(&format!("{dead},{}", stack.coordinator.url()))
        .redis_url(stack.redis.url())
        .instance_id("t")
        .listener(listener)
        .build()
        .unwrap();
    assert_eq!(app.member_ids(), ["t-g-0"]);
    let (handle, join) = spawn_app(app);
    let producer = stack.producer();
    producer
        .publish_record("s", Record::raw("m0"))
        .await
        .unwrap();
    eventually("m0 handled", Duration::from_secs(10), || {
        seen_ops(&seen).contains(&"m0".into()).then_some(())
    })
    .await;
    assert_eq!(*assigned.lock().unwrap(), [0, 1]);

    // An operator removes the member: its next heartbeat is refused, it stops its shards and
    // rejoins owning nothing, then gets them again.
    let (s, _) = stack
        .call(reqwest::Method::DELETE, "/v1/groups/g/members/t-g-0", None)
        .await;
    assert_eq!(s, 204);
    eventually("shards released", Duration::from_secs(5), || {
        (revoked.lock().unwrap().len() == 2).then_some(())
    })
    .await;
    eventually("shards given again", Duration::from_secs(5), || {
        (assigned.lock().unwrap().len() == 4).then_some(())
    })
    .await;
    producer
        .publish_record("s", Record::raw("m1"))
        .await
        .unwrap();
    eventually("m1 handled", Duration::from_secs(10), || {
        seen_ops(&seen).contains(&"m1".into()).then_some(())
    })
    .await;
    handle.shutdown();
    join.await.unwrap().unwrap();
    let (_, g) = stack.call(reqwest::Method::GET, "/v1/groups/g", None).await;
    assert_eq!(g["members"], json!([]), "left on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreates_the_consumer_group_after_a_redis_restart() {
    let mut stack = Stack::start();
    stack.create_group("s", 1, 3000, 100).await;
    let seen: Seen = Arc::default();
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("t")
        .listener(recording_listener("s", &seen))
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    let producer = stack.producer();
    producer
        .publish_record("s", Record::raw("before"))
        .await
        .unwrap();
    eventually("handled", Duration::from_secs(10), || {
        seen_ops(&seen).contains(&"before".into()).then_some(())
    })
    .await;

    // Without persistence the stream and its consumer group are gone: NOGROUP.
    stack.redis.restart().unwrap();
    let published = eventually("publish after the restart", Duration::from_secs(10), || {
        futures_lite_block(producer.publish_record("s", Record::raw("after")))
    })
    .await;
    assert_eq!(published.shard, 0);
    eventually("handled after the restart", Duration::from_secs(15), || {
        seen_ops(&seen).contains(&"after".into()).then_some(())
    })
    .await;
    handle.shutdown();
    join.await.unwrap().unwrap();
}

/// Polls a future once per call from a synchronous condition (publishing may fail while Redis
/// restarts; the next poll tries again).
fn futures_lite_block<F: std::future::Future<Output = Result<T, E>>, T, E>(f: F) -> Option<T> {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f)).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_controls_acks_dead_letters_retries_and_pauses() {
    let stack = Stack::start();
    stack.create_group("s", 1, 3000, 100).await;
    let mut con = stack.redis_con();
    let producer = stack.producer();
    // An entry a previous owner read and never acknowledged: taken over with XAUTOCLAIM.
    producer
        .publish_record("s", Record::json(&json!({"op": "ack", "n": 0})).unwrap())
        .await
        .unwrap();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("s:0")
        .arg("g")
        .arg("0")
        .query(&mut con)
        .unwrap();
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("ghost")
        .arg("STREAMS")
        .arg("s:0")
        .arg(">")
        .query::<redis::Value>(&mut con)
        .map(|_| Value::Null)
        .unwrap();

    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let listener = Listener::new("g", "s", move |msg: Message<Value>| {
        let seen = s2.clone();
        async move {
            let op = msg.payload()["op"].as_str().unwrap_or_default().to_owned();
            seen.lock().unwrap().push((
                op.clone(),
                msg.attempt(),
                msg.delivery_count(),
                Instant::now(),
            ));
            match op.as_str() {
                "ack" => msg.ack().await?,
                "noack" => {}
                "dead" => return Err(HandlerError::dead_letter("poison")),
                "later" if msg.attempt() == 1 => {
                    return Err(HandlerError::retry_after(
                        Duration::from_millis(300),
                        "busy",
                    ));
                }
                "later" => msg.ack().await?,
                "panic" => panic!("boom"),
                _ => {}
            }
            Ok(())
        }
    })
    .ack_mode(AckMode::Manual)
    .max_retries(1)
    .retry_backoff(Duration::from_millis(10), Duration::from_millis(20))
    .block_timeout(Duration::from_millis(200));
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("t")
        .listener(listener)
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    for op in ["noack", "dead", "later", "panic"] {
        producer
            .publish_record("s", Record::json(&json!({"op": op})).unwrap())
            .await
            .unwrap();
    }
    producer
        .publish_record("s", Record::raw("not json"))
        .await
        .unwrap();
    eventually("every op handled", Duration::from_secs(10), || {
        (seen.lock().unwrap().len() >= 7).then_some(())
    })
    .await;
    let log = seen.lock().unwrap().clone();
    let ops: Vec<(&str, u32)> = log.iter().map(|(o, a, _, _)| (o.as_str(), *a)).collect();
    assert_eq!(
        ops,
        [
            ("ack", 1),
            ("noack", 1),
            ("dead", 1),
            ("later", 1),
            ("later", 2),
            ("panic", 1),
            ("panic", 2)
        ]
    );
    assert_eq!(log[0].2, 2, "the taken-over entry was delivered twice");
    assert!(
        log[4].3 - log[3].3 >= Duration::from_millis(300),
        "retry-after was honoured"
    );

    let dlq = eventually("three dead letters", Duration::from_secs(5), || {
        let r: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg("s:dlq")
            .arg("-")
            .arg("+")
            .query(&mut con)
            .unwrap();
        (r.ids.len() == 3).then_some(r.ids)
    })
    .await;
    let field = |i: usize, f: &str| dlq[i].get::<String>(f).unwrap_or_default();
    assert_eq!(
        (field(0, "error"), field(0, "attempts")),
        ("poison".into(), "1".into())
    );
    assert!(field(1, "error").contains("handler panicked: boom"));
    assert_eq!(field(1, "attempts"), "2");
    assert!(field(2, "error").contains("does not decode"));
    assert_eq!(field(2, "origin"), "s:0");
    // Manual mode: only the entry the handler never acknowledged is still pending.
    // (Dead letters are acknowledged by the runtime, possibly with its next read.)
    eventually("one entry left pending", Duration::from_secs(5), || {
        let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
            .arg("s:0")
            .arg("g")
            .query(&mut con)
            .unwrap();
        (pending.count() == 1).then_some(())
    })
    .await;

    // Paused: nothing new is handled; resumed: it is.
    assert!(handle.pause("g"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    producer
        .publish_record("s", Record::json(&json!({"op": "ack", "n": 1})).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(seen.lock().unwrap().len(), 7, "handled while paused");
    assert!(handle.resume("g"));
    eventually("handled after resume", Duration::from_secs(5), || {
        (seen.lock().unwrap().len() == 8).then_some(())
    })
    .await;
    handle.shutdown();
    join.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_members_follow_a_reshard_and_report_drained_shards() {
    let stack = Stack::start();
    stack.create_group("s", 2, 3000, 100).await;
    let seen: Seen = Arc::default();
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("t")
        .listener(recording_listener("s", &seen))
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    let producer = stack.producer();
    assert_eq!(producer.routing("s").await.unwrap().shard_count, 2);

    let (s, b) = stack
        .call(
            reqwest::Method::POST,
            "/v1/streams/s/reshard",
            Some(json!({"shard_count": 4})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    // The cached routing is refreshed in the background (every 100 ms here).
    let deadline = Instant::now() + Duration::from_secs(5);
    while producer.routing("s").await.unwrap().shard_count != 4 {
        assert!(Instant::now() < deadline, "routing never refreshed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut by_shard: HashMap<u32, usize> = HashMap::new();
    let records: Vec<Record> = (0..64)
        .map(|i| Record::raw(format!("r{i}")).key(format!("key-{i}")))
        .collect();
    for (i, p) in producer
        .publish_batch("s", records)
        .await
        .unwrap()
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            p.shard,
            rsc_protocol::routing::shard_for_key(format!("key-{i}").as_bytes(), 4)
        );
        *by_shard.entry(p.shard).or_default() += 1;
    }
    assert_eq!(by_shard.len(), 4, "all four shards used: {by_shard:?}");
    eventually(
        "all 64 handled, on the new shards too",
        Duration::from_secs(10),
        || (seen.lock().unwrap().len() == 64).then_some(()),
    )
    .await;

    // Scale back down: shards 2 and 3 drain; the member finds them empty and reports them,
    // and the reshard completes.
    let (s, b) = stack
        .call(
            reqwest::Method::POST,
            "/v1/streams/s/reshard",
            Some(json!({"shard_count": 2})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = stack
            .call(reqwest::Method::GET, "/v1/streams/s", None)
            .await;
        if v["resharding"].is_null()
            && v["last_reshard"]["state"] == "complete"
            && v["shard_count"] == 2
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "scale-down never completed: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.shutdown();
    join.await.unwrap().unwrap();
}

/// A draining shard is reported drained only after the drain grace; entries a producer with
/// stale routing writes to it meanwhile are handled before it retires. An idle producer
/// still switches layout within one refresh interval (its routing refreshes in the
/// background, not only when it publishes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_waits_for_the_grace_and_stale_writes_and_idle_producers_switch() {
    let stack = Stack::start();
    stack.create_group("s", 4, 3000, 100).await;
    let seen: Seen = Arc::default();
    let grace = Duration::from_millis(1500);
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("t")
        .listener(recording_listener("s", &seen).drain_grace(grace))
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    let idle = stack.producer();
    let stale = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .refresh_every(Duration::from_secs(3600))
        .build()
        .unwrap();
    assert_eq!(idle.routing("s").await.unwrap().shard_count, 4);
    assert_eq!(stale.routing("s").await.unwrap().shard_count, 4);
    let keys: Vec<String> = (0..200)
        .map(|i| format!("key-{i}"))
        .filter(|k| rsc_protocol::routing::shard_for_key(k.as_bytes(), 4) >= 2)
        .take(20)
        .collect();
    assert_eq!(keys.len(), 20);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = stack.call(reqwest::Method::GET, "/v1/groups/g", None).await;
        if v["members"][0]["owned_shards"].as_array().map(Vec::len) == Some(4) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the member never owned 4 shards: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    let (s, b) = stack
        .call(
            reqwest::Method::POST,
            "/v1/streams/s/reshard",
            Some(json!({"shard_count": 2})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    // The idle producer has not published since; its first publish after one refresh
    // interval (100 ms here) already uses the new layout.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let at = idle
        .publish_record("s", Record::raw("idle").key(keys[0].clone()))
        .await
        .unwrap();
    assert_eq!(
        at.shard,
        rsc_protocol::routing::shard_for_key(keys[0].as_bytes(), 2)
    );
    // The stale producer writes to the draining shards.
    let records: Vec<Record> = keys
        .iter()
        .map(|k| Record::raw(format!("stale-{k}")).key(k.clone()))
        .collect();
    let at = stale.publish_batch("s", records).await.unwrap();
    assert!(at.iter().all(|p| p.shard >= 2), "{at:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, v) = stack
            .call(reqwest::Method::GET, "/v1/streams/s", None)
            .await;
        if v["resharding"].is_null() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "scale-down never completed: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() >= grace,
        "retired after {:?}, within the drain grace",
        started.elapsed()
    );
    let handled = seen_ops(&seen);
    for k in &keys {
        assert!(
            handled.contains(&format!("stale-{k}")),
            "retired before the stale write of {k} was handled: {handled:?}"
        );
    }
    handle.shutdown();
    join.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_finishes_in_flight_messages_before_the_shard_moves() {
    let stack = Stack::start();
    stack.create_group("s", 2, 3000, 100).await;
    // (instance, message, shard, started, finished)
    type Log = Arc<Mutex<Vec<(String, String, u32, Instant, Instant)>>>;
    let log: Log = Arc::default();
    let app_for = |instance: &str| {
        let (log, me) = (log.clone(), instance.to_owned());
        let listener = Listener::new("g", "s", move |msg: Message<Raw>| {
            let (log, me) = (log.clone(), me.clone());
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(400)).await;
                let text = String::from_utf8_lossy(&msg.payload().0).into_owned();
                log.lock()
                    .unwrap()
                    .push((me, text, msg.shard(), started, Instant::now()));
                Ok::<(), HandlerError>(())
            }
        });
        ConsumerApp::builder()
            .coordinator(&stack.coordinator.url())
            .redis_url(stack.redis.url())
            .instance_id(instance)
            .listener(listener)
            .build()
            .unwrap()
    };
    let (a, a_join) = spawn_app(app_for("a"));
    let producer = stack.producer();
    // Four slow messages per shard, keys chosen by shard.
    let keys: Vec<String> = (0..).map(|i| format!("k{i}")).take(200).collect();
    for shard in 0..2u32 {
        let key = keys
            .iter()
            .find(|k| rsc_protocol::routing::shard_for_key(k.as_bytes(), 2) == shard)
            .unwrap();
        for i in 0..4 {
            producer
                .publish_record("s", Record::raw(format!("{shard}-{i}")).key(key.clone()))
                .await
                .unwrap();
        }
    }
    eventually("a busy on both shards", Duration::from_secs(10), || {
        (log.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    // B joins: one shard is revoked from A while A is in the middle of a message on it.
    let (b, b_join) = spawn_app(app_for("b"));
    eventually("all 8 handled", Duration::from_secs(20), || {
        (log.lock().unwrap().len() >= 8).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = log.lock().unwrap().clone();
    let mut names: Vec<&str> = log.iter().map(|l| l.1.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["0-0", "0-1", "0-2", "0-3", "1-0", "1-1", "1-2", "1-3"],
        "each handled once"
    );
    let moved: Vec<u32> = log.iter().filter(|l| l.0 == "b").map(|l| l.2).collect();
    assert!(!moved.is_empty(), "b got a shard");
    let shard = moved[0];
    let a_last_end = log
        .iter()
        .filter(|l| l.0 == "a" && l.2 == shard)
        .map(|l| l.4)
        .max()
        .unwrap();
    let b_first_start = log
        .iter()
        .filter(|l| l.0 == "b" && l.2 == shard)
        .map(|l| l.3)
        .min()
        .unwrap();
    assert!(
        b_first_start >= a_last_end,
        "b started on shard {shard} before a finished its message"
    );
    // Per shard, messages were handled in publishing order across the hand-over.
    for s in 0..2u32 {
        let order: Vec<&str> = log
            .iter()
            .filter(|l| l.2 == s)
            .map(|l| l.1.as_str())
            .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "shard {s}");
    }
    a.shutdown();
    b.shutdown();
    a_join.await.unwrap().unwrap();
    b_join.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_is_bounded_when_redis_is_gone() {
    let mut stack = Stack::start();
    stack.create_group("s", 2, 3000, 100).await;
    let seen: Seen = Arc::default();
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("a")
        .shutdown_timeout(Duration::from_millis(1500))
        .listener(recording_listener("s", &seen))
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    stack
        .producer()
        .publish_record("s", Record::raw("one").key("k"))
        .await
        .unwrap();
    eventually("the message handled", Duration::from_secs(10), || {
        (!seen.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    // The data Redis disappears, then the pod is asked to stop: finishing and acknowledging
    // cannot complete, but the shutdown must still end within its timeout.
    stack.redis.kill();
    let asked = Instant::now();
    handle.shutdown();
    let result = tokio::time::timeout(Duration::from_secs(20), join)
        .await
        .expect("run_until returns");
    let took = asked.elapsed();
    assert!(result.is_ok(), "the app task ends cleanly");
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_callback_makes_run_fail_naming_the_member() {
    let stack = Stack::start();
    stack.create_group("s", 2, 3000, 100).await;
    let seen: Seen = Arc::default();
    let listener = recording_listener("s", &seen).on_assigned(|r| {
        panic!("on_assigned bug on shards {:?}", r.shards);
    });
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("a")
        .listener(listener)
        .build()
        .unwrap();
    let (_handle, join) = spawn_app(app);
    let result = tokio::time::timeout(Duration::from_secs(20), join)
        .await
        .expect("run_until returns")
        .expect("the app task itself does not panic");
    match result {
        Err(rsc_client::ClientError::Panicked {
            member, message, ..
        }) => {
            assert_eq!(member, "a-g-0");
            assert!(message.contains("on_assigned bug"), "{message}");
        }
        other => panic!("expected a Panicked error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_past_its_deadline_is_an_error() {
    let stack = Stack::start();
    stack.create_group("s", 1, 3000, 100).await;
    let (started_tx, started_rx) = watch::channel(false);
    let listener = Listener::new("g", "s", move |_msg: Message<Raw>| {
        let started = started_tx.clone();
        async move {
            started.send_replace(true);
            // A handler that never finishes.
            std::future::pending::<()>().await;
            Ok::<(), HandlerError>(())
        }
    })
    .block_timeout(Duration::from_millis(200));
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("a")
        .shutdown_timeout(Duration::from_millis(500))
        .listener(listener)
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    stack
        .producer()
        .publish_record("s", Record::raw("stuck").key("k"))
        .await
        .unwrap();
    eventually("the handler running", Duration::from_secs(10), || {
        started_rx.borrow().then_some(())
    })
    .await;
    handle.shutdown();
    let result = tokio::time::timeout(Duration::from_secs(20), join)
        .await
        .expect("run_until returns")
        .expect("the app task itself does not panic");
    match result {
        Err(rsc_client::ClientError::ShutdownTimedOut { remaining, .. }) => {
            assert_eq!(remaining, 1)
        }
        other => panic!("expected ShutdownTimedOut, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_keep_the_entry_field_order() {
    let stack = Stack::start();
    stack.create_group("s", 1, 3000, 100).await;
    let mut con = stack.redis_con();
    // An entry written by another producer, fields in its own order, payload not JSON.
    let _: String = redis::cmd("XADD")
        .arg("s:0")
        .arg("*")
        .arg(
            &[
                "zeta", "1", "payload", "not json", "alpha", "2", "key", "k", "mid", "3",
            ][..],
        )
        .query(&mut con)
        .unwrap();
    #[derive(Debug, serde::Deserialize)]
    struct Order {
        #[allow(dead_code)]
        id: u64,
    }
    let listener = Listener::new("g", "s", |_msg: Message<Order>| async {
        Ok::<(), HandlerError>(())
    })
    .block_timeout(Duration::from_millis(200));
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("a")
        .listener(listener)
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    let fields = eventually("the dead letter", Duration::from_secs(10), || {
        let raw: redis::Value = redis::cmd("XRANGE")
            .arg("s:dlq")
            .arg("-")
            .arg("+")
            .query(&mut con)
            .ok()?;
        flat_field_names(raw)
    })
    .await;
    // The undecodable payload was dead-lettered at once (one attempt), fields in order.
    assert_eq!(
        &fields[..5],
        ["zeta", "payload", "alpha", "key", "mid"],
        "{fields:?}"
    );
    assert!(fields.contains(&"error".to_owned()));
    handle.shutdown();
    join.await.unwrap().unwrap();
}

/// The field names of the first entry of an `XRANGE` reply, in order.
fn flat_field_names(raw: redis::Value) -> Option<Vec<String>> {
    let redis::Value::Array(entries) = raw else {
        return None;
    };
    let redis::Value::Array(entry) = entries.into_iter().next()? else {
        return None;
    };
    let redis::Value::Array(flat) = entry.into_iter().nth(1)? else {
        return None;
    };
    Some(
        flat.into_iter()
            .step_by(2)
            .map(|v| redis::from_redis_value::<String>(v).unwrap_or_default())
            .collect(),
    )
}

/// A listener's layers see every attempt against a real Redis and coordinator: a timeout
/// layer fails a slow first attempt (then retried), a counting layer of the app's own sees
/// each attempt with its shard and number, and every entry ends handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_wrap_every_attempt_of_the_handler() {
    use rsc_client::layer::{Attempt, HandlerService};
    let stack = Stack::start();
    stack.create_group("layered", 2, 3000, 200).await;
    let attempts: Arc<Mutex<Vec<(String, u32, u32)>>> = Arc::default();
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let counted = attempts.clone();
    let listener = Listener::new("g", "layered", move |msg: Message<Raw>| {
        let record = record.clone();
        async move {
            if msg.attempt() == 1 && msg.payload().0.starts_with(b"slow") {
                // Longer than the timeout layer allows.
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            let text = String::from_utf8_lossy(&msg.payload().0).into_owned();
            record.lock().unwrap().push((
                text,
                msg.attempt(),
                msg.delivery_count(),
                Instant::now(),
            ));
            Ok::<(), HandlerError>(())
        }
    })
    .retry_backoff(Duration::from_millis(20), Duration::from_millis(50))
    .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(
        300,
    )))
    .layer(tower::layer::layer_fn(move |inner: HandlerService| {
        let counted = counted.clone();
        tower::service_fn(move |a: Attempt| {
            let (inner, counted) = (inner.clone(), counted.clone());
            async move {
                let id = a.ids().next().unwrap_or_default().to_owned();
                counted.lock().unwrap().push((id, a.shard(), a.attempt()));
                tower::ServiceExt::oneshot(inner, a).await
            }
        })
    }));
    let app = ConsumerApp::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .instance_id("layers")
        .listener(listener)
        .build()
        .unwrap();
    let (handle, join) = spawn_app(app);
    let producer = stack.producer();
    for i in 0..10 {
        let body = if i == 3 {
            "slow".to_owned()
        } else {
            format!("m{i}")
        };
        producer
            .publish_record(
                "layered",
                rsc_client::producer::Record::raw(body.into_bytes()).key(format!("k{i}")),
            )
            .await
            .unwrap();
    }
    let handled = eventually("every entry handled", Duration::from_secs(30), || {
        let s = seen_ops(&seen);
        (s.len() >= 10).then_some(s)
    })
    .await;
    let mut sorted = handled.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 10, "handled once each: {handled:?}");
    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(
        attempts.len(),
        11,
        "10 first attempts and one retry: {attempts:?}"
    );
    assert_eq!(
        attempts.iter().filter(|(_, _, n)| *n == 2).count(),
        1,
        "the slow entry's first attempt timed out and was retried: {attempts:?}"
    );
    assert!(attempts.iter().all(|(_, shard, _)| *shard < 2));
    handle.shutdown();
    join.await.unwrap().unwrap();
}
