//! The listener's data path against real Redis and a real coordinator:
//!
//! - a read whose reply is lost in flight (Redis delivered the entries to the member, the
//!   member never saw them): the worker reads its own pending entries again instead of
//!   leaving them pending until the next takeover — with lease and with strict fencing;
//! - a 3-node Redis Cluster as the data Redis: producer, listener (workers on the node of
//!   their shard's slot, following `MOVED`), dead letters.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use rsc_client::producer::{Producer, Record};
use rsc_client::{AppHandle, ConsumerApp, HandlerError, Listener, Message, Raw};
use rsc_e2e::{Api, Proxy};
use rsc_testkit::{CoordinatorProcess, RedisCluster, RedisServer};
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Entry ids handled so far, and how many handlings in all.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    handlings: u64,
}

/// Holds the handler of a message whose payload starts with `gate` until opened.
struct Gate {
    entered: tokio::sync::Notify,
    open: tokio::sync::Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            entered: tokio::sync::Notify::new(),
            open: tokio::sync::Semaphore::new(0),
        }
    }
}

/// A consumer app of one member on `group`, recording what it handles; payloads starting
/// with `poison` fail (and are dead-lettered after one retry).
fn start_app(
    coordinator: &str,
    redis_url: &str,
    cluster: bool,
    group: &str,
    stream: &str,
    seen: Arc<Mutex<Seen>>,
    gate: Arc<Gate>,
) -> (AppHandle, JoinHandle<Result<(), rsc_client::ClientError>>) {
    let listener = Listener::new(group, stream, move |msg: Message<Raw>| {
        let (seen, gate) = (seen.clone(), gate.clone());
        async move {
            if msg.payload().0.starts_with(b"poison") {
                return Err(HandlerError::retry("poisoned"));
            }
            if msg.payload().0.starts_with(b"gate") {
                gate.entered.notify_one();
                let _ = gate.open.acquire().await.map(|p| p.forget());
            }
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            s.ids.insert(format!("{}/{}", msg.shard(), msg.id()));
            s.handlings += 1;
            Ok::<(), HandlerError>(())
        }
    })
    .batch_size(16)
    .max_retries(1)
    .retry_backoff(Duration::from_millis(10), Duration::from_millis(20));
    let app = ConsumerApp::builder()
        .coordinator(coordinator)
        .redis_url(redis_url)
        .redis_cluster(cluster)
        .instance_id("127.0.0.61")
        .listener(listener)
        .build()
        .expect("app");
    let handle = app.handle();
    (handle, tokio::spawn(app.run_until(std::future::pending())))
}

/// `RSC_TEST_LOG=debug` shows the client's logs.
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSC_TEST_LOG")
                .unwrap_or_else(|_| "off".into()),
        )
        .with_test_writer()
        .try_init();
}

async fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn handled(seen: &Mutex<Seen>) -> usize {
    seen.lock().unwrap_or_else(|e| e.into_inner()).ids.len()
}

async fn create_group(api: &Api, group: &str, stream: &str, shards: u32, fencing: &str) {
    let (status, body) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": stream, "shard_count": shards,
                "session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "fencing": fencing}),
        )
        .await;
    assert_eq!(status.as_u16(), 201, "{body}");
}

/// Entries of `key` pending for `consumer` in `group`.
async fn pending_for(
    con: &mut redis::aio::MultiplexedConnection,
    key: &str,
    group: &str,
    consumer: &str,
) -> usize {
    let r: redis::RedisResult<redis::streams::StreamPendingCountReply> = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(1000)
        .arg(consumer)
        .query_async(con)
        .await;
    r.map_or(0, |r| r.ids.len())
}

async fn lost_reply_is_read_again(fencing: &str) {
    logs();
    let redis = RedisServer::start().expect("redis");
    let coordinator =
        CoordinatorProcess::start(&["--store", "memory", "--data-redis-url", &redis.url()])
            .expect("coordinator");
    let api = Api::new(coordinator.url());
    let (group, stream) = (format!("lost-{fencing}"), format!("lost-{fencing}"));
    create_group(&api, &group, &stream, 1, fencing).await;
    // The member reaches Redis through a proxy that can throw replies away.
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()))
        .await
        .expect("proxy");
    let (seen, gate) = (
        Arc::new(Mutex::new(Seen::default())),
        Arc::new(Gate::default()),
    );
    let (handle, run) = start_app(
        &coordinator.url(),
        &format!("redis://{}", proxy.addr()),
        false,
        &group,
        &stream,
        seen.clone(),
        gate.clone(),
    );
    let client = redis::Client::open(redis.url()).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let key = rsc_protocol::routing::shard_key(&stream, 0);
    let xadd = |payloads: Vec<String>| {
        let mut pipe = redis::pipe();
        for p in payloads {
            pipe.cmd("XADD").arg(&key).arg("*").arg("payload").arg(p);
        }
        pipe
    };
    // A first entry: the worker refreshes its lag gauge after it, and not again for 5 s,
    // so that the next command after the gated entry is the read.
    let _: Vec<String> = xadd(vec!["warm".into()])
        .query_async(&mut con)
        .await
        .expect("xadd");
    wait_until("the first entry handled", 30, || handled(&seen) == 1).await;
    // The member is busy with one entry while more arrive and replies start to vanish.
    let _: Vec<String> = xadd(vec!["gate".into()])
        .query_async(&mut con)
        .await
        .expect("xadd");
    tokio::time::timeout(Duration::from_secs(30), gate.entered.notified())
        .await
        .expect("the gated entry reached the handler");
    proxy.swallow_replies(true);
    let lost: Vec<String> = (0..20).map(|i| format!("lost-{i}")).collect();
    let _: Vec<String> = xadd(lost).query_async(&mut con).await.expect("xadd");
    gate.open.add_permits(1);
    // Its next read is executed by Redis (entries now pending for it) but the reply never
    // arrives.
    let member = format!("127.0.0.61-{group}-0");
    let deadline = Instant::now() + Duration::from_secs(20);
    while pending_for(&mut con, &key, &group, &member).await < 2 {
        if Instant::now() >= deadline {
            let info: redis::Value = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(&key)
                .arg(&group)
                .query_async(&mut con)
                .await
                .expect("xinfo");
            panic!("the member never read again: {info:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(handled(&seen), 2, "no reply reached the member");
    // The member notices (its connection drops) and reads what the lost reply held.
    proxy.swallow_replies(false);
    proxy.drop_connections();
    wait_until("the entries of the lost reply handled", 30, || {
        handled(&seen) == 22
    })
    .await;
    eventually_nothing_pending(&mut con, &key, &group, &member).await;
    let handlings = seen.lock().unwrap_or_else(|e| e.into_inner()).handlings;
    assert_eq!(handlings, 22, "each entry handled once");
    handle.shutdown();
    run.await.expect("join").expect("app");
}

async fn eventually_nothing_pending(
    con: &mut redis::aio::MultiplexedConnection,
    key: &str,
    group: &str,
    member: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pending_for(con, key, group, member).await > 0 {
        assert!(
            Instant::now() < deadline,
            "entries stay pending for {member}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_read_reply_is_read_again_with_lease_fencing() {
    lost_reply_is_read_again("lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_read_reply_is_read_again_with_strict_fencing() {
    lost_reply_is_read_again("strict").await;
}

async fn cluster_end_to_end(fencing: &str) {
    logs();
    let cluster = RedisCluster::shared().expect("cluster");
    let seeds = cluster.urls().join(",");
    let mut args = vec!["--store", "memory"];
    if fencing == "strict" {
        args.extend(["--data-redis-url", &seeds, "--data-redis-cluster"]);
    }
    let coordinator = CoordinatorProcess::start(&args).expect("coordinator");
    let api = Api::new(coordinator.url());
    let prefix = rsc_e2e::unique_key_prefix();
    let (group, stream) = (format!("{prefix}-g"), format!("{prefix}-s"));
    let shards = 8;
    create_group(&api, &group, &stream, shards, fencing).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (handle, run) = start_app(
        &coordinator.url(),
        &seeds,
        true,
        &group,
        &stream,
        seen.clone(),
        Arc::default(),
    );
    let producer = Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(&seeds)
        .redis_cluster(true)
        .build()
        .expect("producer");
    let n = 2000;
    let mut published = Vec::new();
    for chunk in 0..(n / 100) {
        let records =
            (0..100).map(|i| Record::raw(format!("m{}", chunk * 100 + i)).key(format!("k{i}")));
        published.extend(
            producer
                .publish_batch(&stream, records)
                .await
                .expect("publish"),
        );
    }
    let poison = producer
        .publish_record(&stream, Record::raw("poison").key("p"))
        .await
        .expect("publish");
    let shards_used: HashSet<u32> = published.iter().map(|p| p.shard).collect();
    assert_eq!(
        shards_used.len(),
        shards as usize,
        "keys spread over every shard"
    );
    wait_until("every message handled on the cluster", 60, || {
        handled(&seen) == n
    })
    .await;
    let ids: HashSet<String> = published
        .iter()
        .map(|p| format!("{}/{}", p.shard, p.id))
        .collect();
    assert_eq!(
        seen.lock().unwrap_or_else(|e| e.into_inner()).ids,
        ids,
        "exactly the published entries"
    );
    let handlings = seen.lock().unwrap_or_else(|e| e.into_inner()).handlings;
    assert_eq!(handlings, n as u64, "each entry handled once");
    // The poisoned message went to the dead-letter stream (another slot than its shard).
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let mut con = client.get_async_connection().await.expect("cluster");
    let dlq = rsc_protocol::routing::dlq_key(&stream);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let len: usize = redis::cmd("XLEN")
            .arg(&dlq)
            .query_async(&mut con)
            .await
            .expect("xlen");
        if len == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "nothing dead-lettered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&dlq)
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .expect("xrange");
    let origin_id: String = entries.ids[0].get("origin_id").expect("origin_id");
    assert_eq!(origin_id, poison.id);
    if fencing == "strict" {
        strict_refusal_and_repair_on_the_cluster(&api, &mut con, &group, &stream, shards, &seen, n)
            .await;
    }
    handle.shutdown();
    run.await.expect("join").expect("app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_listener_on_a_redis_cluster_with_lease_fencing() {
    cluster_end_to_end("lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_listener_on_a_redis_cluster_with_strict_fencing() {
    cluster_end_to_end("strict").await;
}

/// With strict fencing on the cluster: every shard's owner token sits on the cluster; a later
/// grant's token on one shard makes Redis refuse the member there (new entries are not
/// read); once that token is gone, the coordinator repairs the member's token within a
/// heartbeat and the entries are handled.
async fn strict_refusal_and_repair_on_the_cluster(
    api: &Api,
    con: &mut redis::cluster_async::ClusterConnection,
    group: &str,
    stream: &str,
    shards: u32,
    seen: &Mutex<Seen>,
    handled_before: usize,
) {
    use rsc_protocol::routing::{owner_key, shard_key};
    for shard in 0..shards {
        let token: Option<String> = redis::cmd("GET")
            .arg(owner_key(&shard_key(stream, shard), group))
            .query_async(con)
            .await
            .expect("get");
        assert!(token.is_some(), "no owner token for shard {shard}");
    }
    let victim: u32 = 3;
    let key = shard_key(stream, victim);
    let owner = owner_key(&key, group);
    let _: () = redis::cmd("SET")
        .arg(&owner)
        .arg("99999999999999:1:another-member")
        .query_async(con)
        .await
        .expect("set");
    let mut pipe = redis::pipe();
    for i in 0..10 {
        pipe.cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("payload")
            .arg(format!("fenced-{i}"));
    }
    let _: Vec<String> = pipe.query_async(con).await.expect("xadd");
    // The member finds out from Redis and reports the shard as not owned.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, g) = api.get(&format!("/v1/groups/{group}")).await;
        let owned: Vec<u64> = g["members"][0]["owned_shards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_u64())
            .collect();
        if !owned.is_empty() && !owned.contains(&u64::from(victim)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the member kept shard {victim}: {g}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&key)
        .query_async(con)
        .await
        .expect("xinfo");
    let g = info.groups.iter().find(|g| g.name == group).expect("group");
    assert_eq!(g.pending, 0, "a refused member read nothing");
    assert_eq!(g.lag, Some(10), "the 10 new entries are unread");
    assert_eq!(handled(seen), handled_before);
    // The later grant's token goes away: the coordinator writes the member's token again.
    let _: () = redis::cmd("DEL")
        .arg(&owner)
        .query_async(con)
        .await
        .expect("del");
    wait_until("the fenced entries handled after the repair", 30, || {
        handled(seen) == handled_before + 10
    })
    .await;
}
