//! Listener ergonomics (PROTOCOL §14, docs/GUIDE.md) against a real redis-server and a real coordinator, in
//! process: `Data<T>` state, errors from `anyhow`, batch listeners (sizes, linger, verdicts
//! per message, retries and dead letters per message), through the builder and the macro.
//!
//! Needs the coordinator binary: `cargo build --workspace --bins`.

use rsc_client::prelude::*;
use rsc_client::producer::Record;
use rsc_client::{ClientError, ConfigError, Data};
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Stack {
    redis: RedisServer,
    coordinator: CoordinatorProcess,
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
        }
    }

    async fn create_group(&self, group: &str, stream: &str, shards: u32) {
        let resp = {
            rsc_client::install_crypto_provider();
            reqwest::Client::new()
        }
        .post(format!("{}/v1/groups", self.coordinator.url()))
        .json(
            &json!({"group": group, "stream": stream, "shard_count": shards,
                "session_timeout_ms": 3000, "heartbeat_interval_ms": 100}),
        )
        .send()
        .await
        .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
    }

    fn producer(&self) -> Producer {
        Producer::builder()
            .coordinator(&self.coordinator.url())
            .redis_url(self.redis.url())
            .build()
            .unwrap()
    }

    fn app(&self) -> rsc_client::ConsumerAppBuilder {
        ConsumerApp::builder()
            .coordinator(&self.coordinator.url())
            .redis_url(self.redis.url())
            .instance_id("t")
    }

    fn redis_con(&self) -> redis::Connection {
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
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

fn xlen(con: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("XLEN").arg(key).query(con).unwrap_or(0)
}

fn pending(con: &mut redis::Connection, key: &str, group: &str) -> usize {
    let r: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .query(con)
        .unwrap();
    r.count()
}

#[derive(Default)]
struct Counter(AtomicUsize);

struct Config {
    fail_first: bool,
}

/// A handler with two pieces of state that returns `anyhow::Result`.
async fn counting(
    msg: Message<Value>,
    counter: Data<Counter>,
    cfg: Data<Config>,
) -> anyhow::Result<()> {
    if cfg.fail_first && msg.attempt() == 1 {
        anyhow::bail!("first attempt of {} fails", msg.id());
    }
    // `?` on an anyhow error inside a handler.
    let n: u64 = msg.payload()["n"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no n"))?;
    counter.0.fetch_add(n as usize, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn build_names_the_listener_and_the_missing_type() {
    let err = ConsumerApp::builder()
        .coordinator("http://127.0.0.1:1")
        .redis_url("redis://127.0.0.1:1")
        .instance_id("t")
        .data(Counter::default())
        .listener(Listener::new("g", "s", counting).name("counting"))
        .build()
        .err()
        .expect("a missing Data<Config> is refused at build()");
    match &err {
        ClientError::Config(ConfigError::MissingData {
            listener,
            type_name,
        }) => {
            assert_eq!(listener, "counting");
            assert!(type_name.ends_with("::Config"), "{type_name}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains(".data("), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_receive_state_and_anyhow_errors_are_retried() {
    let stack = Stack::start();
    stack.create_group("g", "s", 2).await;
    let counter = Arc::new(Counter::default());
    let app = stack
        .app()
        .data_arc(counter.clone())
        .data(Config { fail_first: true })
        .listener(
            Listener::new("g", "s", counting)
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(20))
                .block_timeout(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));
    let producer = stack.producer();
    for n in 1..=10u64 {
        producer
            .publish_record(
                "s",
                Record::json(&json!({"n": n})).unwrap().key(n.to_string()),
            )
            .await
            .unwrap();
    }
    // Every message failed once (anyhow::bail!), was retried, then counted.
    eventually("all ten counted", Duration::from_secs(15), || {
        (counter.0.load(Ordering::SeqCst) == 55).then_some(())
    })
    .await;
    let mut con = stack.redis_con();
    assert_eq!(xlen(&mut con, "s:dlq"), 0);
    handle.shutdown();
    join.await.unwrap().unwrap();
}

/// What the batch handler saw: the size of each call, and the payloads handled.
#[derive(Default)]
struct BatchLog {
    sizes: Mutex<Vec<usize>>,
    handled: Mutex<HashMap<u64, u32>>,
}

async fn batch_handler(batch: Batch<Value>, log: Data<BatchLog>) -> Result<(), BatchError> {
    log.sizes.lock().unwrap().push(batch.len());
    let mut failed = BatchError::new();
    for msg in &batch {
        let n = msg.payload()["n"].as_u64().unwrap_or_default();
        if n % 10 == 3 {
            failed = failed.message(msg, HandlerError::dead_letter(format!("{n} is poison")));
        } else if n % 10 == 5 && msg.attempt() == 1 {
            failed = failed.message(msg, HandlerError::retry("try again"));
        } else {
            *log.handled.lock().unwrap().entry(n).or_default() += 1;
        }
    }
    failed.into_result()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_listener_settles_each_message_and_respects_the_batch_size() {
    let stack = Stack::start();
    stack.create_group("g", "s", 1).await;
    // Published before the app starts: the first reads find a full backlog.
    let producer = stack.producer();
    for n in 0..200u64 {
        producer
            .publish_record("s", Record::json(&json!({"n": n})).unwrap())
            .await
            .unwrap();
    }
    let log = Arc::new(BatchLog::default());
    let app = stack
        .app()
        .data_arc(log.clone())
        .listener(
            Listener::batch("g", "s", batch_handler)
                .max_batch(32)
                .linger(Duration::from_millis(30))
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(20))
                .block_timeout(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));
    let mut con = stack.redis_con();
    // 20 poison messages dead-lettered one by one; the other 180 handled exactly once.
    eventually(
        "180 handled and 20 dead letters",
        Duration::from_secs(15),
        || {
            let handled = log.handled.lock().unwrap().len();
            (handled == 180 && xlen(&mut con, "s:dlq") == 20).then_some(())
        },
    )
    .await;
    eventually("nothing pending", Duration::from_secs(5), || {
        (pending(&mut con, "s:0", "g") == 0).then_some(())
    })
    .await;
    assert!(log.handled.lock().unwrap().values().all(|c| *c == 1));
    let sizes = log.sizes.lock().unwrap().clone();
    assert!(sizes.iter().all(|s| *s <= 32), "{sizes:?}");
    assert!(
        sizes.contains(&32),
        "a backlog gives full batches: {sizes:?}"
    );
    // The retried messages (n % 10 == 5) came back as a batch of their own.
    assert!(sizes.contains(&1), "{sizes:?}");
    // A dead letter says why.
    let dlq: Vec<(String, HashMap<String, String>)> = {
        let r: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg("s:dlq")
            .arg("-")
            .arg("+")
            .query(&mut con)
            .unwrap();
        r.ids
            .into_iter()
            .map(|e| {
                let m = e
                    .map
                    .iter()
                    .filter_map(|(k, v)| {
                        redis::from_redis_value_ref::<String>(v)
                            .ok()
                            .map(|v| (k.clone(), v))
                    })
                    .collect();
                (e.id, m)
            })
            .collect()
    };
    assert!(dlq[0].1["error"].contains("is poison"), "{:?}", dlq[0]);
    assert_eq!(dlq[0].1["attempts"], "1");

    // Linger: entries published one by one within the linger are handed over together.
    log.sizes.lock().unwrap().clear();
    for n in 1000..1010u64 {
        producer
            .publish_record("s", Record::json(&json!({"n": n})).unwrap())
            .await
            .unwrap();
    }
    eventually("the late ten", Duration::from_secs(10), || {
        (log.handled.lock().unwrap().len() == 189).then_some(())
    })
    .await;
    let sizes = log.sizes.lock().unwrap().clone();
    assert!(sizes.len() < 10, "lingering batches them: {sizes:?}");
    handle.shutdown();
    join.await.unwrap().unwrap();
}

#[stream_listener(group = "mg", stream = "ms", batch = 16, linger_ms = 5)]
async fn macro_batch(batch: Batch<Value>, counter: Data<Counter>) -> Result<(), HandlerError> {
    counter.0.fetch_add(batch.len(), Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_macro_declares_batch_listeners_with_state() {
    let stack = Stack::start();
    stack.create_group("mg", "ms", 2).await;
    let counter = Arc::new(Counter::default());
    let app = stack
        .app()
        .data_arc(counter.clone())
        .registered_listeners()
        .build()
        .unwrap();
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));
    let producer = stack.producer();
    for n in 0..50u64 {
        producer
            .publish_record(
                "ms",
                Record::json(&json!({"n": n})).unwrap().key(n.to_string()),
            )
            .await
            .unwrap();
    }
    eventually("fifty handled", Duration::from_secs(15), || {
        (counter.0.load(Ordering::SeqCst) == 50).then_some(())
    })
    .await;
    handle.shutdown();
    join.await.unwrap().unwrap();
}

/// A codec of the test's own: JSON, hex-encoded (any `Codec` works with any listener).
struct HexJson;

impl rsc_client::codec::Codec for HexJson {
    const CONTENT_TYPE: &'static str = "application/x-hex-json";

    fn encode<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, rsc_client::BoxError> {
        let json = serde_json::to_vec(value)?;
        Ok(json
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into_bytes())
    }

    fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, rsc_client::BoxError> {
        let text = std::str::from_utf8(bytes)?;
        let json = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<Vec<u8>, _>>()?;
        Ok(serde_json::from_slice(&json)?)
    }
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
    lines: Vec<String>,
}

/// A producer with codec `C` and a record encoded with it; a listener of `C` handles both,
/// a JSON listener of another group on the same stream dead-letters both with the reason,
/// and a `Raw` listener takes them as they are.
async fn codec_round_trip<C: rsc_client::codec::Codec>() {
    let stack = Stack::start();
    for g in ["typed", "json", "raw"] {
        stack.create_group(g, "s", 1).await;
    }
    let seen: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let raw_types: Arc<Mutex<Vec<String>>> = Arc::default();
    let (s1, s2) = (seen.clone(), raw_types.clone());
    let app = stack
        .app()
        .listener(
            Listener::new("typed", "s", move |msg: Message<Order>| {
                let seen = s1.clone();
                async move {
                    let ct = msg.content_type().to_owned();
                    seen.lock().unwrap().push((msg.payload().id, ct));
                    Ok::<(), HandlerError>(())
                }
            })
            .codec::<C>()
            .block_timeout(Duration::from_millis(200)),
        )
        .listener(
            Listener::new("json", "s", |_msg: Message<Order>| async {
                Ok::<(), HandlerError>(())
            })
            .block_timeout(Duration::from_millis(200)),
        )
        .listener(
            Listener::new("raw", "s", move |msg: Message<Raw>| {
                let types = s2.clone();
                async move {
                    types.lock().unwrap().push(msg.content_type().to_owned());
                    Ok::<(), HandlerError>(())
                }
            })
            .block_timeout(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));
    let producer = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .codec::<C>()
        .build()
        .unwrap();
    let order = |id| Order {
        id,
        lines: vec!["apple".into(), "pear".into()],
    };
    producer.publish("s", Some("k"), &order(1)).await.unwrap();
    producer
        .publish_record("s", Record::encode::<C, _>(&order(2)).unwrap().key("k"))
        .await
        .unwrap();
    let mut con = stack.redis_con();
    eventually(
        "both handled and both refused",
        Duration::from_secs(15),
        || (seen.lock().unwrap().len() == 2 && xlen(&mut con, "s:dlq") == 2).then_some(()),
    )
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (1, C::CONTENT_TYPE.to_owned()),
            (2, C::CONTENT_TYPE.to_owned())
        ]
    );
    let r: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("s:dlq")
        .arg("-")
        .arg("+")
        .query(&mut con)
        .unwrap();
    for e in &r.ids {
        let group: String = e.get("group").unwrap();
        let error: String = e.get("error").unwrap();
        let ct: String = e.get("content_type").unwrap();
        assert_eq!(group, "json");
        assert_eq!(ct, C::CONTENT_TYPE);
        assert!(
            error.contains("content type mismatch")
                && error.contains(C::CONTENT_TYPE)
                && error.contains("application/json"),
            "{error}"
        );
    }
    eventually("the raw listener saw both", Duration::from_secs(10), || {
        (raw_types.lock().unwrap().len() == 2).then_some(())
    })
    .await;
    assert!(
        raw_types
            .lock()
            .unwrap()
            .iter()
            .all(|t| t == C::CONTENT_TYPE)
    );
    handle.shutdown();
    join.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_of_ones_own_is_chosen_per_listener_and_producer() {
    codec_round_trip::<HexJson>().await;
}

#[cfg(feature = "msgpack")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msgpack_is_chosen_per_listener_and_producer() {
    codec_round_trip::<rsc_client::codec::MsgPack>().await;
}
