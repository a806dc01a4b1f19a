//! A lost metadata store (PROTOCOL §2.3): the store Redis is emptied (`FLUSHALL`, what a
//! restart without persistence or a failover to an empty replica does) while pods consume
//! and a producer publishes. The coordinator restores the stream and the group from the
//! recovery copy in the data Redis by itself: members rejoin at higher epochs, producers
//! keep routing with the same shard count, nothing is lost, per-key order holds. With
//! `--store-recovery manual` it does not restore by itself; `rsc-coordinator store restore`
//! does. The same on a Redis Cluster store (every node flushed); a restart noticed by the
//! store's run id; the projections (revisions, lag history) after a loss (PROTOCOL §22).
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{
    Consumer, SERIAL, Stack, eventually, eventually_async, finish_producer, handled,
    order_violations, spawn_producer,
};
use rsc_e2e::{Api, code};
use rsc_testkit::{CoordinatorProcess, RedisCluster, RedisServer, binary_path};
use serde_json::Value;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const GROUP: &str = "g";
const STREAM: &str = "lost";
const RECORD: &str = "handled";
const SESSION_MS: u64 = 3_000;
const HEARTBEAT_MS: u64 = 300;

/// The metadata store a scenario loses: a standalone Redis, or a 3-node Redis Cluster of its
/// own (a flush of a shared cluster would empty other tests' stores).
enum Store {
    Standalone(RedisServer),
    Cluster(RedisCluster),
}

impl Store {
    fn standalone() -> Self {
        Store::Standalone(RedisServer::start().expect("store redis-server starts"))
    }

    fn cluster() -> Self {
        Store::Cluster(RedisCluster::start().expect("store redis cluster starts"))
    }

    /// The `serve` (and `store restore`) flags that select this store.
    fn args(&self) -> Vec<String> {
        let mut args = vec!["--store".to_owned(), "redis".to_owned()];
        match self {
            Store::Standalone(r) => args.extend(["--redis-url".to_owned(), r.url()]),
            Store::Cluster(c) => args.extend([
                "--redis-cluster".to_owned(),
                "--redis-url".to_owned(),
                c.url(),
            ]),
        }
        args
    }

    /// `FLUSHALL` on every node (a cluster's primaries each hold their slots' keys).
    fn flush(&self) {
        let nodes = match self {
            Store::Standalone(r) => std::slice::from_ref(r),
            Store::Cluster(c) => c.nodes(),
        };
        for n in nodes {
            n.command("FLUSHALL").expect("FLUSHALL");
        }
    }
}

/// A data Redis, and a coordinator on it and on `store` (Redis store).
fn stack(store: &Store, extra: &[&str]) -> Stack {
    let redis = RedisServer::start().expect("data redis-server starts");
    let (store_args, data_url) = (store.args(), redis.url());
    let mut args: Vec<&str> = store_args.iter().map(String::as_str).collect();
    args.extend(["--data-redis-url", &data_url, "--sweep-interval-ms", "20"]);
    args.extend_from_slice(extra);
    let coordinator = CoordinatorProcess::start(&args).expect("coordinator starts");
    let api = Api::new(coordinator.url());
    Stack {
        redis,
        coordinator,
        api,
    }
}

fn consumer(stack: &Stack, pod: &str) -> Consumer {
    Consumer::start(
        stack,
        pod,
        &[
            "--group",
            GROUP,
            "--stream",
            STREAM,
            "--concurrency",
            "2",
            "--handle-ms",
            "1",
            "--record-stream",
            RECORD,
        ],
    )
}

async fn max_epoch(stack: &Stack) -> u64 {
    let g = stack.group(GROUP).await;
    g["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["member_epoch"].as_u64())
        .max()
        .unwrap_or(0)
}

/// The store is emptied under load: the group and the stream are back by themselves within
/// two session timeouts, with their shard count and settings, members at higher epochs;
/// every entry is handled, per-key order holds; the restore is audited and counted.
#[tokio::test]
async fn a_flushed_store_is_restored_under_load() {
    flushed_under_load(Store::standalone()).await;
}

/// The same on a Redis Cluster store, every node flushed.
#[tokio::test]
async fn a_flushed_cluster_store_is_restored_under_load() {
    flushed_under_load(Store::cluster()).await;
}

async fn flushed_under_load(store: Store) {
    let _serial = SERIAL.lock().await;
    let stack = stack(&store, &[]);
    stack
        .create_group(GROUP, STREAM, 4, SESSION_MS, HEARTBEAT_MS)
        .await;
    let pods: Vec<Consumer> = ["127.0.0.61", "127.0.0.62"]
        .iter()
        .map(|p| consumer(&stack, p))
        .collect();
    stack.wait_stable(GROUP, 4, 4).await;
    let before = stack.group(GROUP).await;
    assert_eq!(before["fencing"], "strict", "{before}");
    let epoch_before = max_epoch(&stack).await;
    // Steady heartbeats write no copy: over ten heartbeat intervals the count stays.
    let writes = || {
        stack
            .api
            .metric("rsc_store_recovery_copy_writes_total", &[])
    };
    let steady = writes().await;
    assert!(
        steady >= 2.0,
        "the stream and the group were copied: {steady}"
    );
    tokio::time::sleep(Duration::from_millis(10 * HEARTBEAT_MS)).await;
    assert_eq!(writes().await, steady, "steady heartbeats wrote copies");
    let mut con = stack.redis();
    const N: u64 = 6_000;
    let producer = spawn_producer(&stack, STREAM, N, 32, Some(1_500));
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    store.flush();
    let flushed = Instant::now();
    // Serving again: the group, its four members stable owning every shard.
    let after = stack.wait_stable(GROUP, 4, 4).await;
    let took = flushed.elapsed();
    eprintln!("store flushed: serving again after {took:?}");
    assert!(
        took <= Duration::from_millis(2 * SESSION_MS),
        "back within two session timeouts: {took:?}"
    );
    for field in [
        "stream",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "fencing",
        "ordering",
    ] {
        assert_eq!(after[field], before[field], "{field}: {after}");
    }
    let epoch_after = max_epoch(&stack).await;
    assert!(
        epoch_after > epoch_before + 1_000,
        "members rejoined above every epoch held before: {epoch_before} -> {epoch_after}"
    );
    let (s, routing) = stack
        .api
        .get(&format!("/v1/streams/{STREAM}/routing"))
        .await;
    assert_eq!(s.as_u16(), 200, "{routing}");
    assert_eq!(routing["shard_count"], 4, "{routing}");

    finish_producer(producer, N);
    let records = eventually("every entry handled", 120, || {
        let rs = handled(&mut con, RECORD);
        let distinct: HashSet<(String, u64)> = rs.iter().map(|r| (r.key.clone(), r.seq)).collect();
        (distinct.len() as u64 >= N).then_some(rs)
    })
    .await;
    let distinct: HashSet<(String, u64)> = records.iter().map(|r| (r.key.clone(), r.seq)).collect();
    let (violations, examples) = order_violations(&records);
    eprintln!(
        "store loss under load: {N} entries, {} handlings, lost {}, order violations {violations}",
        records.len(),
        N - distinct.len() as u64
    );
    assert_eq!(distinct.len() as u64, N, "nothing lost");
    assert_eq!(violations, 0, "{examples:#?}");

    // Audited as the coordinator's own action, counted, logged.
    let (_, audit) = stack.api.get("/v1/audit?log=mutations").await;
    let restores: Vec<&Value> = audit["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["action"] == "store.restore")
        .collect();
    assert!(
        restores
            .iter()
            .any(|e| e["principal"] == "rsc-coordinator" && e["target"]["group"] == GROUP),
        "{audit}"
    );
    assert!(
        restores.iter().any(|e| e["target"]["stream"] == STREAM),
        "{audit}"
    );
    let n = stack
        .api
        .metric("rsc_store_recoveries_total", &[("kind", "group")])
        .await;
    assert!(n >= 1.0, "rsc_store_recoveries_total{{kind=group}} = {n}");
    assert!(stack.coordinator.logged("restored from the recovery copy"));
    drop(pods);
}

/// `--store-recovery manual`: the coordinator refuses to restore (the group stays missing,
/// the refusal is counted, the pod is not ready and handles nothing);
/// `rsc-coordinator store restore` restores it with its settings, and the pod is back.
#[tokio::test]
async fn manual_recovery_waits_for_store_restore() {
    let _serial = SERIAL.lock().await;
    let store = Store::standalone();
    let stack = stack(&store, &["--store-recovery", "manual"]);
    stack
        .create_group(GROUP, STREAM, 3, SESSION_MS, HEARTBEAT_MS)
        .await;
    let pod = consumer(&stack, "127.0.0.63");
    stack.wait_stable(GROUP, 2, 3).await;
    eventually_async("the pod is ready", 30, || async {
        (pod.ready().await == Some(true)).then_some(())
    })
    .await;

    store.flush();
    // Past a heartbeat, a routing request and a periodic check (5 s): still missing.
    let (s, body) = stack
        .api
        .get(&format!("/v1/streams/{STREAM}/routing"))
        .await;
    assert_eq!(
        (s.as_u16(), code(&body)),
        (404, "STREAM_NOT_FOUND"),
        "{body}"
    );
    eventually_async("the pod reports not ready", 30, || async {
        (pod.ready().await == Some(false)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(6_000)).await;
    let (s, body) = stack.api.get(&format!("/v1/groups/{GROUP}")).await;
    assert_eq!(
        (s.as_u16(), code(&body)),
        (404, "GROUP_NOT_FOUND"),
        "{body}"
    );
    let refused = stack
        .api
        .metric("rsc_store_recoveries_refused_total", &[])
        .await;
    assert!(refused >= 1.0, "refusals counted: {refused}");
    assert!(
        stack
            .coordinator
            .logged("--store-recovery manual: not restored")
    );
    assert_eq!(
        pod.ready().await,
        Some(false),
        "not ready while the group is gone"
    );

    let out = std::process::Command::new(binary_path("rsc-coordinator").expect("built"))
        .args(["store", "restore"])
        .args(store.args())
        .args(["--data-redis-url", &stack.redis.url()])
        .output()
        .expect("store restore runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("restored stream lost"), "{stdout}");
    assert!(stdout.contains("restored group g"), "{stdout}");
    let g = stack.wait_stable(GROUP, 2, 3).await;
    assert_eq!(g["session_timeout_ms"], SESSION_MS, "{g}");
    eventually_async("the pod is ready again", 30, || async {
        (pod.ready().await == Some(true)).then_some(())
    })
    .await;
    let (_, routing) = stack
        .api
        .get(&format!("/v1/streams/{STREAM}/routing"))
        .await;
    assert_eq!(routing["shard_count"], 3, "{routing}");
}

/// Without a recovery copy (no data Redis for the coordinator), a lost stream stays lost: a
/// producer's routing refresh finds it gone, drops the cached routing, and the next publish
/// fails with a clear error once its delivery timeout has passed — not at once, not never.
#[tokio::test]
async fn a_publish_to_a_lost_stream_fails_after_the_delivery_timeout() {
    use rsc_client::ClientError;
    use rsc_client::producer::{Producer, Record};
    let store = RedisServer::start().expect("store redis-server starts");
    let data = RedisServer::start().expect("data redis-server starts");
    let store_url = store.url();
    let coordinator = CoordinatorProcess::start(&["--store", "redis", "--redis-url", &store_url])
        .expect("coordinator starts");
    let api = Api::new(coordinator.url());
    let (s, body) = api
        .post(
            "/v1/groups",
            serde_json::json!({"group": GROUP, "stream": STREAM, "shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    const TIMEOUT: Duration = Duration::from_secs(2);
    let producer = Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(data.url())
        .refresh_every(Duration::from_millis(100))
        .delivery_timeout(TIMEOUT)
        .build()
        .expect("producer");
    producer
        .publish_record(STREAM, Record::raw("before").key("k"))
        .await
        .expect("published while the stream exists");

    store.command("FLUSHALL").expect("FLUSHALL");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (err, took) = loop {
        let started = Instant::now();
        match producer
            .publish_record(STREAM, Record::raw("after").key("k"))
            .await
        {
            Ok(_) => {
                // Still the cached routing, until a refresh finds the stream gone.
                assert!(Instant::now() < deadline, "publishes never failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => break (e, started.elapsed()),
        }
    };
    let text = err.chain();
    eprintln!("publish to a lost stream failed after {took:?}: {text}");
    assert!(
        matches!(&err, ClientError::DeliveryTimeout { stream, .. } if stream == STREAM),
        "{text}"
    );
    assert!(
        text.contains("STREAM_NOT_FOUND") || text.contains("does not exist"),
        "{text}"
    );
    assert!(
        took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(3),
        "failed after its delivery timeout: {took:?}"
    );
}

/// A deleted group is never restored (its copy goes before its document), while a group
/// that was not deleted is; a data Redis that lost the copy gets it back from the store, and
/// a stream copy behind its document is written again.
#[tokio::test]
async fn a_deleted_group_stays_deleted_and_a_lost_copy_is_written_again() {
    let store = Store::standalone();
    let stack = stack(&store, &[]);
    for g in ["kept", "deleted"] {
        let (s, body) = stack
            .api
            .post(
                "/v1/groups",
                serde_json::json!({"group": g, "stream": STREAM, "shard_count": 2}),
            )
            .await;
        assert_eq!(s.as_u16(), 201, "{body}");
    }
    let (s, body) = stack
        .api
        .call(reqwest::Method::DELETE, "/v1/groups/deleted", None)
        .await;
    assert!(s.is_success(), "{s} {body}");

    // The data Redis loses the copy: the check writes it again from the store.
    stack
        .redis
        .command("DEL rsc:recovery:groups rsc:recovery:streams")
        .expect("DEL");
    let mut con = stack.redis();

    eventually("the copy written again", 15, || {
        let groups: Vec<String> = redis::cmd("HKEYS")
            .arg("rsc:recovery:groups")
            .query(&mut con)
            .ok()?;
        let streams: u64 = redis::cmd("HLEN")
            .arg("rsc:recovery:streams")
            .query(&mut con)
            .ok()?;
        (groups == ["kept"] && streams == 1).then_some(())
    })
    .await;

    // A copy behind its document (as if a coordinator stopped between the commit and the
    // copy): written again from the store.
    let copy: String = redis::cmd("HGET")
        .arg("rsc:recovery:streams")
        .arg(STREAM)
        .query(&mut con)
        .expect("HGET");
    let mut stale: Value = serde_json::from_str(&copy).expect("a stream copy is JSON");
    stale["revision"] = 0.into();
    stale["doc"]["shard_count"] = 7.into();
    let () = redis::cmd("HSET")
        .arg("rsc:recovery:streams")
        .arg(STREAM)
        .arg(stale.to_string())
        .query(&mut con)
        .expect("HSET");
    eventually("the stale stream copy written again", 15, || {
        let copy: String = redis::cmd("HGET")
            .arg("rsc:recovery:streams")
            .arg(STREAM)
            .query(&mut con)
            .ok()?;
        let v: Value = serde_json::from_str(&copy).ok()?;
        (v["doc"]["shard_count"] == 2 && v["revision"] != 0).then_some(())
    })
    .await;

    store.flush();
    let (s, body) = stack.api.get("/v1/groups/kept").await;
    assert_eq!(s.as_u16(), 200, "restored on the first request: {body}");
    // Past a periodic check (5 s): the deleted group is still gone.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let (s, body) = stack.api.get("/v1/groups/deleted").await;
    assert_eq!(
        (s.as_u16(), code(&body)),
        (404, "GROUP_NOT_FOUND"),
        "{body}"
    );
    let (_, list) = stack.api.get("/v1/groups").await;
    assert!(!list.to_string().contains("\"deleted\""), "{list}");
}

/// The store's run id (PROTOCOL §2.3): a store Redis restarted with its data (AOF) is
/// noticed, logged and counted as intact, nothing restored; restarted empty, the documents
/// are restored by the check its new run id starts (no request asks for them). Then the
/// projections after a `FLUSHALL` (PROTOCOL §22 "Projections"): the group's revisions start
/// again with the restore, and `/history` answers fresh samples within a few sampling
/// intervals.
#[tokio::test]
async fn a_restarted_store_is_noticed_by_its_run_id_and_projections_come_back() {
    use rsc_testkit::RedisOptions;
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start_with(RedisOptions {
        aof: true,
        ..RedisOptions::default()
    })
    .expect("store redis-server starts");
    let stack = {
        let url = server.url();
        let data = RedisServer::start().expect("data redis-server starts");
        let data_url = data.url();
        let coordinator = CoordinatorProcess::start(&[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--data-redis-url",
            &data_url,
            "--sweep-interval-ms",
            "20",
            "--history-interval-ms",
            "200",
        ])
        .expect("coordinator starts");
        let api = Api::new(coordinator.url());
        Stack {
            redis: data,
            coordinator,
            api,
        }
    };
    stack
        .create_group(GROUP, STREAM, 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    let changes = |outcome: &'static str| {
        let api = stack.api.clone();
        async move {
            api.metric("rsc_store_run_id_changes_total", &[("outcome", outcome)])
                .await
        }
    };
    // The first reading only remembers the run id: wait for it (a reading is timed).
    eventually_async("the run id read", 20, || async {
        let n = stack
            .api
            .metric(
                "rsc_store_operation_duration_seconds_count",
                &[("operation", "run_ids")],
            )
            .await;
        (n >= 1.0).then_some(())
    })
    .await;
    let revision = stack.group(GROUP).await["revision"].clone();

    server.restart().expect("store restarts with its AOF");
    eventually_async("the restart noticed", 20, || async {
        (changes("intact").await >= 1.0).then_some(())
    })
    .await;
    assert!(stack.coordinator.logged("run id changed"));
    assert_eq!(
        stack.group(GROUP).await["revision"],
        revision,
        "nothing restored"
    );
    assert_eq!(changes("restored").await, 0.0);

    server.kill();
    for f in ["appendonlydir", "dump.rdb"] {
        let p = server.dir().join(f);
        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
    }
    server.restart().expect("store restarts empty");
    eventually_async(
        "the loss noticed by the run id and restored",
        20,
        || async { (changes("restored").await >= 1.0).then_some(()) },
    )
    .await;
    assert!(stack.coordinator.logged("restored from the recovery copy"));
    let recovered = stack
        .api
        .metric("rsc_store_recoveries_total", &[("kind", "group")])
        .await;
    assert!(recovered >= 1.0, "{recovered}");

    // Projections: a pod consumes, the history fills; FLUSHALL; both come back.
    let _pod = consumer(&stack, "127.0.0.64");
    stack.wait_stable(GROUP, 2, 2).await;
    let samples = |h: &Value| h["samples"].as_array().cloned().unwrap_or_default();
    let history = format!("/v1/groups/{GROUP}/history");
    eventually_async("lag samples", 30, || async {
        let (_, h) = stack.api.get(&history).await;
        (samples(&h).len() >= 3).then_some(())
    })
    .await;
    server.command("FLUSHALL").expect("FLUSHALL");
    let flushed_ms = crate::pods::now_ms();
    let flushed = Instant::now();
    stack.wait_stable(GROUP, 2, 2).await;
    let fresh = eventually_async("fresh lag samples after the loss", 30, || async {
        let (s, h) = stack.api.get(&history).await;
        let new: Vec<Value> = samples(&h)
            .into_iter()
            .filter(|x| x["t_ms"].as_u64().is_some_and(|t| t > flushed_ms))
            .collect();
        (s.as_u16() == 200 && new.len() >= 2).then_some(new)
    })
    .await;
    let took = flushed.elapsed();
    eprintln!(
        "history answers {} fresh samples {took:?} after the flush",
        fresh.len()
    );
    assert!(
        took <= Duration::from_millis(2 * SESSION_MS) + Duration::from_secs(2),
        "samples back within a few intervals of the restore: {took:?}"
    );
    let (_, revs) = stack
        .api
        .get(&format!("/v1/groups/{GROUP}/revisions?limit=1000"))
        .await;
    let recs = revs["revisions"].as_array().cloned().unwrap_or_default();
    let oldest = recs.last().expect("revisions after the restore");
    assert_eq!(
        (oldest["c"].as_str(), oldest["p"].as_str()),
        (Some("restore"), Some("rsc-coordinator")),
        "the timeline starts again with the restore: {revs}"
    );
}
