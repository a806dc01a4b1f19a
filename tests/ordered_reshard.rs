//! Ordered resharding end to end (PROTOCOL §15): per-key order through scale-up, scale-down and
//! rollback with producers running, a pod killed mid-reshard and a deliberately stale
//! producer. A real redis-server, a real coordinator (memory store, data Redis configured),
//! three sample-consumer pods × concurrency 2 (`--handle-ms 2`), a sample-producer process at
//! 2,400 entries/s (more than the pods handle: a backlog builds) and an in-test producer whose
//! routing never refreshes by itself.
//!
//! The order check: in the record stream (one entry per handling, written before its
//! acknowledgement), the first handling of each `(key, seq)` must come in `seq` order per key.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods;

use crate::pods::{
    Consumer, Handled, SERIAL, Stack, eventually, finish_producer, handled, now_ms,
    order_violations, spawn_producer,
};
use rsc_client::ClientError;
use rsc_client::producer::{Producer, Record};
use rsc_protocol::routing::shard_for_key;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const GROUP: &str = "g";
const RECORD: &str = "handled";
const SESSION_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;
/// The sample producer: entries, keys, rate.
const COUNT: u64 = 24_000;
const KEYS: u64 = 64;
const RATE: u64 = 2_400;
/// The stale in-test producer's keys (`s0` … `s15`), apart from the sample producer's.
const STALE_KEYS: u64 = 16;

fn consumer(stack: &Stack, stream: &str, pod: &str) -> Consumer {
    Consumer::start(
        stack,
        pod,
        &[
            "--group",
            GROUP,
            "--stream",
            stream,
            "--concurrency",
            "2",
            "--handle-ms",
            "2",
            "--record-stream",
            RECORD,
        ],
    )
}

/// A reshard (or rollback, `to: None`) as the test saw it.
#[derive(Debug, Clone, Copy)]
struct Switch {
    from: u32,
    to: u32,
    /// When the request was sent (Unix ms): a write that completes between this and the
    /// answer may have landed on either layout (the markers move before the answer).
    before_ms: u64,
    /// When the answer came back (Unix ms): from then on no stale write lands anywhere.
    after_ms: u64,
}

impl Switch {
    /// True when a publish that ran from `start` to `end` (Unix ms) overlapped this switch's
    /// request: its writes may then have landed on either layout.
    fn raced(&self, start: u64, end: u64) -> bool {
        start <= self.after_ms && end >= self.before_ms
    }
}

async fn switch(stack: &Stack, stream: &str, from: u32, to: Option<u32>) -> Switch {
    let (path, body) = match to {
        Some(n) => (
            format!("/v1/streams/{stream}/reshard"),
            json!({"shard_count": n}),
        ),
        None => (format!("/v1/streams/{stream}/rollback"), json!({})),
    };
    let before_ms = now_ms();
    let (s, v) = stack.api.post(&path, body).await;
    assert!(s.is_success(), "{path}: {s} {v}");
    Switch {
        from,
        to: v["shard_count"].as_u64().expect("shard_count") as u32,
        before_ms,
        after_ms: now_ms(),
    }
}

fn id_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// The consumer pause of one switch: for each key that moved, the time from the switch's
/// answer until the first handling of one of its entries on its new shard; beside it, how
/// long the parents' backlog took to drain (from the answer until the last handling of an
/// entry written to a parent before the switch). Milliseconds: (median pause, max pause,
/// max parent drain, moved keys).
fn pause_figures(
    records: &[Handled],
    sw: &Switch,
    next_ms: u64,
    prefix: &str,
) -> (u64, u64, u64, usize) {
    let mut pauses = Vec::new();
    let mut drain = 0u64;
    let mut parents = HashSet::new();
    for k in 0..KEYS {
        let key = format!("{prefix}{k}");
        let (old, new) = (
            shard_for_key(key.as_bytes(), sw.from),
            shard_for_key(key.as_bytes(), sw.to),
        );
        if old == new {
            continue;
        }
        parents.insert(old);
        let first_new = records
            .iter()
            .filter(|r| {
                r.key == key
                    && r.shard == new
                    && id_ms(&r.entry_id) >= sw.after_ms.saturating_sub(2000)
                    && id_ms(&r.entry_id) < next_ms
            })
            .map(|r| r.started_ms)
            .min();
        if let Some(t) = first_new {
            pauses.push(t.saturating_sub(sw.after_ms));
        }
    }
    for r in records {
        if parents.contains(&r.shard) && id_ms(&r.entry_id) <= sw.after_ms {
            drain = drain.max(r.finished_ms.saturating_sub(sw.after_ms));
        }
    }
    pauses.sort_unstable();
    let median = pauses.get(pauses.len() / 2).copied().unwrap_or(0);
    (
        median,
        pauses.last().copied().unwrap_or(0),
        drain,
        pauses.len(),
    )
}

/// 4 → 8 → 3 → rollback (to 8) with the sample producer running, a stale producer writing
/// throughout, and a pod killed in the middle of the scale-down's drain: nothing lost, no
/// per-key order violation; the stale producer's writes are refused and land, in order, on
/// the shard of the current layout.
#[tokio::test]
async fn per_key_order_through_reshards_and_rollback_with_producers_running() {
    let violations = scenario("ordered", "key", "strict").await;
    assert_eq!(
        violations.0, 0,
        "order violations, e.g. {:#?}",
        violations.1
    );
}

/// The same scenario with `ordering: "none"` (the behaviour without ordered resharding, PROTOCOL §15): nothing lost,
/// but moved keys are read in parallel with their old shard's backlog, and the checker sees
/// it (this is also the baseline figure of docs/RESHARDING.md).
#[tokio::test]
async fn without_ordering_the_checker_sees_violations() {
    let violations = scenario("unordered", "none", "strict").await;
    assert!(violations.0 > 0, "the order checker must catch reordering");
}

/// The ordered scenario under lease fencing: the workers read with plain `XREADGROUP`s (not
/// the guarded transaction), which carry the seals too (PROTOCOL §15).
#[tokio::test]
async fn per_key_order_through_reshards_under_lease_fencing() {
    let violations = scenario("ordered-lease", "key", "lease").await;
    assert_eq!(
        violations.0, 0,
        "order violations, e.g. {:#?}",
        violations.1
    );
}

/// Runs the scenario with the group's `ordering` and `fencing`; returns the order violations
/// (count, examples). Asserts nothing is lost and that the stale producer's writes land on
/// the current layout.
async fn scenario(stream: &'static str, ordering: &str, fencing: &str) -> (usize, Vec<String>) {
    #[allow(non_snake_case)]
    let STREAM = stream;
    let _serial = SERIAL.lock().await;
    let stack = Stack::start_with_data_redis();
    stack
        .create_group(GROUP, STREAM, 4, SESSION_MS, HEARTBEAT_MS)
        .await;
    let (s, g) = stack
        .api
        .call(
            reqwest::Method::PATCH,
            &format!("/v1/groups/{GROUP}"),
            Some(json!({"ordering": ordering, "fencing": fencing})),
        )
        .await;
    assert!(s.is_success(), "{g}");
    assert_eq!(g["ordering"], ordering, "{g}");
    assert_eq!(g["fencing"], fencing, "{g}");
    let mut pods: Vec<Consumer> = ["127.0.0.41", "127.0.0.42", "127.0.0.43"]
        .iter()
        .map(|p| consumer(&stack, STREAM, p))
        .collect();
    stack.wait_stable(GROUP, 6, 4).await;
    let mut con = stack.redis();

    // The stale producer: its routing refreshes only when a write is refused. It writes the
    // producer fields, as the sample producer here does, for the duplicate check below.
    let stale = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .refresh_every(Duration::from_secs(3600))
        .producer_fields(true)
        .build()
        .expect("producer");
    assert_eq!(
        stale
            .refresh_routing(STREAM)
            .await
            .expect("routing")
            .shard_count,
        4
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stale_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            // (key, seq, shard written to, when the publish started, when it returned)
            let mut written: Vec<(String, u64, u32, u64, u64)> = Vec::new();
            let mut seq = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<Record> = (seq..seq + 8)
                    .map(|i| {
                        let key = format!("s{}", i % STALE_KEYS);
                        Record::json(&json!({"seq": i, "key": key}))
                            .expect("json")
                            .key(key)
                            .field("seq", i.to_string())
                    })
                    .collect();
                let start = now_ms();
                let at = stale
                    .publish_batch(STREAM, batch)
                    .await
                    .expect("stale publish");
                let ms = now_ms();
                for (j, p) in at.into_iter().enumerate() {
                    let i = seq + j as u64;
                    written.push((format!("s{}", i % STALE_KEYS), i, p.shard, start, ms));
                }
                seq += 8;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            written
        })
    };

    let producer = spawn_producer(&stack, STREAM, COUNT, KEYS, Some(RATE));
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let up = switch(&stack, STREAM, 4, Some(8)).await;
    stack.wait_stable(GROUP, 6, 8).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let down = switch(&stack, STREAM, 8, Some(3)).await;
    let v = stack.api.get(&format!("/v1/streams/{STREAM}")).await.1;
    assert_eq!(v["resharding"]["state"], "draining", "{v}");
    // The group view shows which parents the moved keys wait for.
    let g = stack.group(GROUP).await;
    assert_eq!(g["ordering"], ordering, "{g}");
    // The stream shows the seals of the switch, the group which parents its moved keys wait
    // for and how far each is from its seal.
    let seals = v["resharding"]["seals"].as_object().map_or(0, |m| m.len());
    assert_eq!(seals, 8, "every shard of the old layout is sealed: {v}");
    if ordering == "key" {
        let waiting = g["waiting_on_parents"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !waiting.is_empty(),
            "the backlog of the draining shards is waited for: {g}"
        );
        assert!(
            waiting.iter().all(|p| p["parent"].as_u64().unwrap() >= 3),
            "{g}"
        );
    }
    // A pod dies in the middle of the drain (its held and pending entries go to others).
    tokio::time::sleep(Duration::from_millis(700)).await;
    pods[2].kill9();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let back = switch(&stack, STREAM, 3, None).await;
    assert_eq!(back.to, 8);
    finish_producer(producer, COUNT);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stale_written = stale_task.await.expect("stale producer");
    let stale_total = stale_written.len() as u64;

    // Everything is handled (the killed pod's shards move after its session).
    let expected = COUNT + stale_total;
    let records = eventually("every entry handled", 180, || {
        let rs = handled(&mut con, RECORD);
        let distinct: HashSet<(String, u64)> = rs.iter().map(|r| (r.key.clone(), r.seq)).collect();
        (distinct.len() as u64 >= expected).then_some(rs)
    })
    .await;
    let distinct: HashSet<(String, u64)> = records.iter().map(|r| (r.key.clone(), r.seq)).collect();
    let lost = expected - distinct.len() as u64;
    let (violations, examples) = order_violations(&records);
    eprintln!(
        "ordered reshard: {} entries ({} stale-producer), {} handlings, lost {lost}, order violations {violations}",
        expected,
        stale_total,
        records.len()
    );
    assert_eq!(lost, 0);
    // Idempotent producers (the default): no record written twice, whatever was retried.
    let (dups, unmarked) = crate::pods::producer_duplicates(&mut con, STREAM, 8);
    assert_eq!(
        (dups, unmarked),
        (0, 0),
        "producer duplicates, unmarked entries"
    );
    if ordering == "key" {
        let g = stack.group(GROUP).await;
        assert!(
            g["waiting_on_parents"]
                .as_array()
                .is_none_or(|a| a.is_empty()),
            "{g}"
        );
    }

    // The stale producer's writes after each answer went to the shard of the layout then
    // current, although its own routing was only refreshed by refusals.
    for (key, seq, shard, start, ms) in &stale_written {
        let count = if *ms > back.after_ms {
            8
        } else if *ms > down.after_ms {
            3
        } else if *ms > up.after_ms {
            8
        } else {
            continue;
        };
        if ![up, down, back].iter().any(|sw| sw.raced(*start, *ms)) {
            assert_eq!(
                *shard,
                shard_for_key(key.as_bytes(), count),
                "{key} seq {seq} at {ms}"
            );
        }
    }
    let moved_stale = (0..STALE_KEYS)
        .filter(|k| {
            let key = format!("s{k}");
            shard_for_key(key.as_bytes(), 4) != shard_for_key(key.as_bytes(), 8)
        })
        .count();
    assert!(moved_stale > 0, "some stale-producer keys move at 4 -> 8");

    // Pause figures (the bench table takes them from here).
    for (name, sw, next) in [
        ("4->8", up, down.after_ms),
        ("8->3", down, back.after_ms),
        ("rollback 3->8", back, u64::MAX),
    ] {
        let (median, max, drain, moved) = pause_figures(&records, &sw, next, "k");
        eprintln!(
            "PAUSE ({ordering}) {name}: moved keys {moved}, pause median {median} ms, max {max} ms; parents' backlog drained after {drain} ms"
        );
    }
    drop(pods);
    (violations, examples)
}

/// A producer that cannot reach the coordinator after a reshard gets an error after its retry
/// budget instead of writing to a sealed shard; nothing of the refused batch is written.
#[tokio::test]
async fn a_producer_without_a_coordinator_is_refused_not_misrouted() {
    const STREAM: &str = "cutoff";
    let _serial = SERIAL.lock().await;
    let stack = Stack::start_with_data_redis();
    stack
        .create_group(GROUP, STREAM, 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    // The coordinator is reached through a proxy that the test cuts.
    let proxy = rsc_e2e::Proxy::start(
        stack
            .coordinator
            .url()
            .trim_start_matches("http://")
            .to_owned(),
    )
    .await
    .expect("proxy");
    let producer = Producer::builder()
        .coordinator(&format!("http://{}", proxy.addr()))
        .redis_url(stack.redis.url())
        .refresh_every(Duration::from_secs(3600))
        .stale_retry_budget(Duration::from_millis(1500))
        .build()
        .expect("producer");
    let at = producer
        .publish_batch(STREAM, [Record::raw("a").key("k1")])
        .await
        .expect("publish");
    assert_eq!(at.len(), 1);
    let s = switch(&stack, STREAM, 2, Some(5)).await;
    assert_eq!(s.to, 5);
    proxy.cut();
    let mut con = stack.redis();
    let lens = |con: &mut redis::Connection| -> Vec<u64> {
        (0..5)
            .map(|i| pods::xlen(con, &rsc_protocol::routing::shard_key(STREAM, i)))
            .collect()
    };
    let before = lens(&mut con);
    let r = producer
        .publish_batch(
            STREAM,
            (0..10).map(|i| Record::raw("b").key(format!("k{i}"))),
        )
        .await;
    match r {
        Err(ClientError::StaleRouting {
            routing_epoch,
            shard_epoch,
            ..
        }) => {
            assert_eq!((routing_epoch, shard_epoch), (1, 2));
        }
        other => panic!("expected StaleRouting, got {other:?}"),
    }
    assert_eq!(lens(&mut con), before, "nothing written");
    // The refusals touched the markers (that aborts the stale transactions) but left each
    // one as the coordinator wrote it: same epoch, no expiry.
    for i in 0..5 {
        let marker = rsc_protocol::routing::epoch_key(&rsc_protocol::routing::shard_key(STREAM, i));
        let (value, ttl): (Option<u64>, i64) = redis::pipe()
            .get(&marker)
            .ttl(&marker)
            .query(&mut con)
            .expect("marker");
        assert_eq!((value, ttl), (Some(2), -1), "marker of shard {i}");
    }
    // Reachable again: the same batch lands on the 5-shard layout.
    proxy.restore();
    let at = producer
        .publish_batch(
            STREAM,
            (0..10).map(|i| Record::raw("b").key(format!("k{i}"))),
        )
        .await
        .expect("publish after the coordinator is back");
    for (i, p) in at.iter().enumerate() {
        assert_eq!(p.shard, shard_for_key(format!("k{i}").as_bytes(), 5));
    }
}

/// A coordinator restart in the middle of a scale-down's drain (Redis store): the seals are
/// in the stream document and in the data Redis, the workers release moved keys from the
/// data Redis alone, producers keep writing with their cached routing. Nothing lost, no
/// per-key order violation.
#[tokio::test]
async fn per_key_order_through_a_coordinator_restart_mid_reshard() {
    const STREAM: &str = "restarted";
    let _serial = SERIAL.lock().await;
    let redis = rsc_testkit::RedisServer::start().expect("redis-server starts");
    let url = redis.url();
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--key-prefix",
        "ord",
        "--sweep-interval-ms",
        "20",
        "--data-redis-url",
        &url,
    ];
    let coordinator = rsc_testkit::CoordinatorProcess::start(&args).expect("coordinator starts");
    let addr = coordinator.addr().to_string();
    let api = rsc_e2e::Api::new(coordinator.url());
    let mut stack = Stack {
        redis,
        coordinator,
        api,
    };
    stack
        .create_group(GROUP, STREAM, 4, SESSION_MS, HEARTBEAT_MS)
        .await;
    let pods: Vec<Consumer> = ["127.0.0.51", "127.0.0.52"]
        .iter()
        .map(|p| consumer(&stack, STREAM, p))
        .collect();
    stack.wait_stable(GROUP, 4, 4).await;
    let mut con = stack.redis();
    const N: u64 = 8_000;
    let producer = spawn_producer(&stack, STREAM, N, 32, Some(1_500));
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let down = switch(&stack, STREAM, 4, Some(2)).await;
    assert_eq!(down.to, 2);
    // Killed right after the answer, back 1.5 s later on the same address and store.
    stack.coordinator.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stack.coordinator = rsc_testkit::CoordinatorProcess::start_listening(&addr, &args)
        .expect("coordinator restarts");
    let v = stack.api.get(&format!("/v1/streams/{STREAM}")).await.1;
    assert_eq!(
        v["last_reshard"]["seals"]
            .as_object()
            .map_or(0, |m| m.len()),
        4,
        "the seals survive the restart: {v}"
    );
    finish_producer(producer, N);
    let records = eventually("every entry handled", 120, || {
        let rs = handled(&mut con, RECORD);
        let distinct: HashSet<(String, u64)> = rs.iter().map(|r| (r.key.clone(), r.seq)).collect();
        (distinct.len() as u64 >= N).then_some(rs)
    })
    .await;
    let (violations, examples) = order_violations(&records);
    eprintln!(
        "coordinator restart mid-reshard: {} handlings, order violations {violations}",
        records.len()
    );
    assert_eq!(violations, 0, "{examples:#?}");
    drop(pods);
}

/// On a Redis Cluster as data Redis: the coordinator seals every shard in its own slot, a
/// stale producer's writes are refused and land on the new layout, and the group view reads
/// the parents' progress from the cluster.
#[tokio::test]
async fn fenced_publish_and_seals_on_a_redis_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = rsc_testkit::RedisCluster::shared().expect("redis cluster starts");
    let coordinator = rsc_testkit::CoordinatorProcess::start_on_cluster(cluster, &[])
        .expect("coordinator starts");
    let api = rsc_e2e::Api::new(coordinator.url());
    let stream = format!("oc{}", std::process::id());
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": stream, "shard_count": 4}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let producer = |refresh: Duration| {
        Producer::builder()
            .coordinator(&coordinator.url())
            .redis_url(cluster.urls().join(","))
            .redis_cluster(true)
            .refresh_every(refresh)
            .build()
            .expect("producer")
    };
    let stale = producer(Duration::from_secs(3600));
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let at = stale
        .publish_batch(
            &stream,
            keys.iter().map(|k| Record::raw("before").key(k.clone())),
        )
        .await
        .expect("publish");
    assert!(
        at.iter()
            .zip(&keys)
            .all(|(p, k)| p.shard == shard_for_key(k.as_bytes(), 4))
    );
    let (s, body) = api
        .post(
            &format!("/v1/streams/{stream}/reshard"),
            json!({"shard_count": 7}),
        )
        .await;
    assert_eq!(s.as_u16(), 202, "{body}");
    let seals = body["last_reshard"]["seals"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(seals.len(), 7, "{body}");
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    for shard in 0..7u32 {
        let key = rsc_protocol::routing::shard_key(&stream, shard);
        let marker: u64 = redis::cmd("GET")
            .arg(rsc_protocol::routing::epoch_key(&key))
            .query(&mut con)
            .unwrap();
        assert_eq!(marker, 2, "{key}");
    }
    // The stale producer (routing of 4 shards) is refused and writes to the 7-shard layout.
    let at = stale
        .publish_batch(
            &stream,
            keys.iter().map(|k| Record::raw("after").key(k.clone())),
        )
        .await
        .expect("publish");
    for (p, k) in at.iter().zip(&keys) {
        assert_eq!(p.shard, shard_for_key(k.as_bytes(), 7), "{k}");
    }
    // Nothing consumed yet: every parent with entries before its seal is waited for.
    let (s, g) = api.get(&format!("/v1/groups/{GROUP}")).await;
    assert_eq!(s.as_u16(), 200, "{g}");
    let waiting = g["waiting_on_parents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!waiting.is_empty(), "{g}");
    assert!(
        waiting.iter().all(|p| p["parent"].as_u64().unwrap() < 4),
        "{g}"
    );
}

/// On a Redis Cluster (one transaction per shard) a batch refused on one shard while its other
/// shard took its records is written in full, once each, after the routing changes: the
/// refused records, placed anew onto the shard the batch wrote to, are not taken for records
/// it wrote there (they get new sequences, PROTOCOL §21).
#[tokio::test]
async fn a_batch_refused_on_one_cluster_shard_is_written_in_full_after_the_reshard() {
    let _serial = SERIAL.lock().await;
    let cluster = rsc_testkit::RedisCluster::shared().expect("redis cluster starts");
    let coordinator = rsc_testkit::CoordinatorProcess::start_on_cluster(cluster, &[])
        .expect("coordinator starts");
    let api = rsc_e2e::Api::new(coordinator.url());
    let stream = format!("op{}", std::process::id());
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "gp", "stream": stream, "shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let producer = Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(cluster.urls().join(","))
        .redis_cluster(true)
        .build()
        .expect("producer");
    assert_eq!(
        producer
            .refresh_routing(&stream)
            .await
            .expect("routing")
            .routing_epoch,
        1
    );
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    let xlen = |con: &mut redis::cluster::ClusterConnection, key: &str| -> u64 {
        redis::cmd("XLEN").arg(key).query(con).expect("XLEN")
    };
    // Shard 1 fenced and sealed at the next epoch ahead of the others (as a switch does it,
    // shard by shard).
    let shard1 = rsc_protocol::routing::shard_key(&stream, 1);
    let _: () = redis::cmd("SET")
        .arg(rsc_protocol::routing::epoch_key(&shard1))
        .arg(2)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(rsc_protocol::routing::seals_key(&shard1))
        .arg(2)
        .arg("0-0/2")
        .query(&mut con)
        .unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let on1 = keys
        .iter()
        .filter(|k| shard_for_key(k.as_bytes(), 2) == 1)
        .count();
    assert!(on1 > 0 && on1 < keys.len());
    let records: Vec<Record> = keys
        .iter()
        .map(|k| Record::raw("x").key(k.clone()))
        .collect();
    let publish = {
        let (producer, stream) = (producer.clone(), stream.clone());
        tokio::spawn(async move { producer.publish_batch(&stream, records).await })
    };
    let shard0 = rsc_protocol::routing::shard_key(&stream, 0);
    let written = keys.len() - on1;
    eventually("shard 0 took its records", 10, || {
        (xlen(&mut con, &shard0) == written as u64).then_some(())
    })
    .await;
    let (s, body) = api
        .post(
            &format!("/v1/streams/{stream}/reshard"),
            json!({"shard_count": 1}),
        )
        .await;
    assert_eq!(s.as_u16(), 202, "{body}");
    let at = (publish.await.expect("task")).expect("publish");
    assert_eq!(at.len(), keys.len());
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&shard0)
        .arg("-")
        .arg("+")
        .query(&mut con)
        .unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (_, fields) in &entries {
        *seen.entry(fields["key"].clone()).or_default() += 1;
    }
    assert_eq!(xlen(&mut con, &shard1), 0);
    for k in &keys {
        assert_eq!(seen.get(k), Some(&1), "{k}: {seen:?}");
    }
}

/// A producer whose Redis user may not run scripts (`EVAL` denied by an ACL) cannot fence its
/// writes: it refuses to publish and writes nothing, rather than write unchecked.
#[tokio::test]
async fn a_producer_that_cannot_run_the_check_writes_nothing() {
    const STREAM: &str = "noeval";
    let _serial = SERIAL.lock().await;
    let stack = Stack::start_with_data_redis();
    stack
        .create_group(GROUP, STREAM, 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    let mut con = stack.redis();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha",
        ])
        .query(&mut con)
        .expect("ACL SETUSER");
    let producer = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(format!(
            "redis://noeval:pw@127.0.0.1:{}",
            stack.redis.port()
        ))
        .build()
        .expect("producer");
    let r = producer
        .publish_batch(
            STREAM,
            (0..10).map(|i| Record::raw("x").key(format!("k{i}"))),
        )
        .await;
    let err = r.expect_err("no fence, no write");
    assert!(err.to_string().to_lowercase().contains("noperm"), "{err}");
    for i in 0..2 {
        let key = rsc_protocol::routing::shard_key(STREAM, i);
        assert_eq!(pods::xlen(&mut con, &key), 0, "{key}");
    }
}
