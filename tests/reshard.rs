//! Resharding and rollback end to end under continuous production (PROTOCOL §6): a real
//! redis-server, a real coordinator (memory store, with the data Redis configured), two
//! sample-consumer pods × concurrency 2, a sample-producer process and two in-test producers
//! (one up to date, one whose routing is deliberately stale).
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{
    Consumer, SERIAL, Stack, eventually, finish_producer, handled, now_ms, spawn_producer,
};
use rsc_client::producer::{Producer, Record};
use rsc_e2e::{Api, code};
use rsc_protocol::routing::shard_for_key;
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const GROUP: &str = "g";
const RECORD: &str = "handled";
const SESSION_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;
/// The rollback window of [`reshard_and_rollback_under_continuous_production`]: short, so the
/// test can outlive it; long enough for what runs between a scale-down's completion and its
/// rollback (the scale-down can complete during the stale producer's four seconds; then the
/// retired keys are checked and the rollback asked, both within the window, on a busy
/// machine too).
const WINDOW_MS: u64 = 10_000;
/// The rollback window of the test that waits for retired keys to be deleted after it.
const SHORT_WINDOW_MS: u64 = 3000;
/// The producers' routing refresh interval (rsc-client's default).
const REFRESH_MS: u64 = 1000;
/// Slack on top of one refresh interval: the refresh request itself, batching, a busy
/// machine.
const SWITCH_SLACK_MS: u64 = 700;
/// Keys the producers use: `k0` … `k{KEYS-1}`.
const KEYS: u64 = 500;

/// A data Redis and a coordinator that knows it (lag, retired-key deletion).
fn stack(window_ms: u64) -> Stack {
    let redis = RedisServer::start().expect("redis-server starts");
    let window = window_ms.to_string();
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "memory",
        "--sweep-interval-ms",
        "20",
        "--data-redis-url",
        &redis.url(),
        "--rollback-window-ms",
        &window,
    ])
    .expect("coordinator starts");
    let api = Api::new(coordinator.url());
    Stack {
        redis,
        coordinator,
        api,
    }
}

fn consumers(stack: &Stack, stream: &str, pods: &[&str], concurrency: u32) -> Vec<Consumer> {
    let c = concurrency.to_string();
    pods.iter()
        .map(|ip| {
            Consumer::start(
                stack,
                ip,
                &[
                    "--group",
                    GROUP,
                    "--stream",
                    stream,
                    "--concurrency",
                    &c,
                    "--record-stream",
                    RECORD,
                ],
            )
        })
        .collect()
}

async fn stream_view(stack: &Stack, stream: &str) -> Value {
    let (s, body) = stack.api.get(&format!("/v1/streams/{stream}")).await;
    assert_eq!(s.as_u16(), 200, "{body}");
    body
}

/// One reshard as the test saw it: the layout before and after, and when it was asked.
#[derive(Debug, Clone, Copy)]
struct Switch {
    from: u32,
    to: u32,
    /// Just before the request was sent (Unix ms).
    before_ms: u64,
    /// When the answer came back (Unix ms).
    after_ms: u64,
}

async fn reshard(stack: &Stack, stream: &str, to: u32, from: u32) -> Switch {
    let before_ms = now_ms();
    let (s, body) = stack
        .api
        .post(
            &format!("/v1/streams/{stream}/reshard"),
            json!({"shard_count": to}),
        )
        .await;
    assert_eq!(s.as_u16(), 202, "{body}");
    assert_eq!(body["shard_count"], to);
    Switch {
        from,
        to,
        before_ms,
        after_ms: now_ms(),
    }
}

/// Every entry of a key: `(id, fields)`, in stream order.
fn entries(con: &mut redis::Connection, key: &str) -> Vec<(String, HashMap<String, String>)> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    reply
        .ids
        .into_iter()
        .map(|e| {
            let map = e
                .map
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        redis::from_redis_value_ref::<String>(v).unwrap_or_default(),
                    )
                })
                .collect();
            (e.id, map)
        })
        .collect()
}

fn id_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .expect("stream id")
}

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(con).expect("EXISTS")
}

/// `(pending, last-delivered id)` of the group on `key`.
fn group_state(con: &mut redis::Connection, key: &str) -> (usize, String) {
    let g = crate::pods::group_info(con, key, GROUP);
    (g.pending, g.last_delivered_id)
}

fn parse_id(id: &str) -> (u64, u64) {
    let (a, b) = id.split_once('-').expect("stream id");
    (a.parse().expect("ms"), b.parse().expect("seq"))
}

/// A producer task publishing a few keyed records every 20 ms until stopped, tagging each
/// with `producer=<tag>`. Returns how many it published.
fn spawn_loop_producer(
    producer: Producer,
    stream: &'static str,
    tag: &'static str,
    stop: Arc<AtomicBool>,
    published: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let batch: Vec<Record> = (n..n + 4)
                .map(|i| {
                    Record::raw(format!("{{\"seq\":{i},\"key\":\"k{}\"}}", i % KEYS))
                        .key(format!("k{}", i % KEYS))
                        .field("seq", i.to_string())
                        .field("producer", tag)
                })
                .collect();
            producer
                .publish_batch(stream, batch)
                .await
                .expect("publish");
            n += 4;
            published.store(n, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        n
    })
}

/// Waits until the in-test producer's routing has certainly followed `switch` (one refresh
/// interval and the slack after it), then until it wrote every key once more: the entries of
/// one whole cycle through the keys carry the new layout.
async fn cover_every_key(switch: &Switch, published: &AtomicU64) {
    let refreshed_ms = switch.after_ms + REFRESH_MS + SWITCH_SLACK_MS;
    eventually("the producer's routing refreshed", 30, || {
        (now_ms() > refreshed_ms).then_some(())
    })
    .await;
    // (+4: the batch in flight when the count was read may have been routed before.)
    let since = published.load(Ordering::Relaxed) + 4;
    eventually("every key written again on the new layout", 60, || {
        (published.load(Ordering::Relaxed) >= since + KEYS).then_some(())
    })
    .await;
}

fn stale_record(key: &str) -> Record {
    Record::json(&json!({"seq": 0, "key": key}))
        .expect("json")
        .key(key)
        .field("producer", "stale")
}

/// 8 → 16 → (rollback refused after the window) → 4 → rollback to 16, with production
/// running throughout.
#[tokio::test]
async fn reshard_and_rollback_under_continuous_production() {
    const STREAM: &str = "orders";
    let _serial = SERIAL.lock().await;
    let stack = stack(WINDOW_MS);
    stack
        .create_group(GROUP, STREAM, 8, SESSION_MS, HEARTBEAT_MS)
        .await;
    let _pods = consumers(&stack, STREAM, &["127.0.0.21", "127.0.0.22"], 2);
    stack.wait_stable(GROUP, 4, 8).await;
    let mut con = stack.redis();

    let url = stack.coordinator.url();
    let redis_url = stack.redis.url();
    let fresh = Producer::builder()
        .coordinator(&url)
        .redis_url(&redis_url)
        .build()
        .expect("producer");
    // A producer whose routing is not refreshed by itself (an hour): it will keep the 16-shard
    // layout after the scale-down until it is told to refresh.
    let stale = Producer::builder()
        .coordinator(&url)
        .redis_url(&redis_url)
        .refresh_every(Duration::from_secs(3600))
        .build()
        .expect("producer");
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let fresh_task = spawn_loop_producer(fresh, STREAM, "fresh", stop.clone(), published.clone());
    let sample = spawn_producer(&stack, STREAM, 3000, KEYS, Some(200));
    let mut switches = Vec::new();
    // Until both producers covered every key in the first layout (each cycles through the
    // KEYS keys): the in-test one wrote KEYS entries, and the shards hold KEYS more.
    eventually("both producers covered every key", 60, || {
        let fresh = published.load(Ordering::Relaxed);
        let total: u64 = (0..8)
            .map(|s| {
                redis::cmd("XLEN")
                    .arg(format!("{STREAM}:{s}"))
                    .query::<u64>(&mut con)
            })
            .sum::<redis::RedisResult<u64>>()
            .expect("XLEN");
        // (+4: a batch of the in-test producer may be written but not counted yet.)
        (fresh >= KEYS && total >= fresh + 4 + KEYS).then_some(())
    })
    .await;

    // 8 → 16: a scale-up completes at once; every member group sees 16 assignable shards.
    switches.push(reshard(&stack, STREAM, 16, 8).await);
    let v = stream_view(&stack, STREAM).await;
    assert_eq!(v["last_reshard"]["state"], "complete", "{v}");
    assert!(v["resharding"].is_null(), "{v}");
    stack.wait_stable(GROUP, 4, 16).await;

    // The rollback window closes WINDOW_MS after completion: then a rollback is refused.
    let until = v["rollback_until_ms"]
        .as_u64()
        .expect("rollback allowed for now");
    while now_ms() <= until + 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, body) = stack
        .api
        .post(&format!("/v1/streams/{STREAM}/rollback"), json!({}))
        .await;
    assert_eq!(s.as_u16(), 409, "{body}");
    assert_eq!(code(&body), "ROLLBACK_WINDOW_EXPIRED", "{body}");
    // The key movement measured below compares the keys handled on each layout: every key is
    // written on the 16-shard one before the next switch (a busy machine slows the producers,
    // so this waits on the count, not on time).
    cover_every_key(&switches[0], &published).await;

    // The stale producer learns the 16-shard layout now, before the scale-down.
    let r = stale.refresh_routing(STREAM).await.expect("routing");
    assert_eq!(r.shard_count, 16);
    let stale_epoch = r.routing_epoch;

    // 16 → 4: shards 4..15 drain.
    switches.push(reshard(&stack, STREAM, 4, 16).await);
    let v = stream_view(&stack, STREAM).await;
    let running = &v["resharding"];
    assert_eq!(running["state"], "draining", "{v}");
    let draining = running["draining"].as_array().expect("draining shards");
    assert_eq!(draining.len(), 12, "{v}");
    for d in draining {
        assert_eq!(
            d["waiting_groups"],
            json!([GROUP]),
            "progress per group: {v}"
        );
    }
    let g = stack.group(GROUP).await;
    let states: BTreeMap<u64, String> = g["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| {
            (
                s["shard"].as_u64().unwrap(),
                s["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(states.len(), 16, "draining shards are still assigned: {g}");
    assert!((4..16).all(|s| states[&s] == "draining"), "{g}");

    // Meanwhile the stale producer writes for four seconds with its 16-shard routing: the
    // draining shards are sealed (ordered resharding, PROTOCOL §15), so its writes are refused
    // and land, after a routing refresh, on the shards of the 4-shard layout.
    let stale_keys: Vec<String> = (0..KEYS)
        .map(|i| format!("k{i}"))
        .filter(|k| shard_for_key(k.as_bytes(), 16) >= 4)
        .collect();
    let mut stale_written = 0u64;
    let stale_until = now_ms() + 4000;
    let mut i = 0usize;
    while now_ms() < stale_until {
        let batch: Vec<Record> = (0..6)
            .map(|j| {
                let k = &stale_keys[(i + j) % stale_keys.len()];
                stale_record(k)
            })
            .collect();
        let at = stale.publish_batch(STREAM, batch).await.expect("publish");
        assert!(
            at.iter().all(|p| p.shard < 4),
            "a stale routing wrote to a sealed draining shard: {at:?}"
        );
        stale_written += at.len() as u64;
        i += 6;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its routing was refreshed by the refusals: the new layout, only shards 0..3.
    let r = stale.refresh_routing(STREAM).await.expect("routing");
    assert_eq!(r.shard_count, 4);
    assert!(r.routing_epoch > stale_epoch);
    let at = stale
        .publish_batch(STREAM, stale_keys.iter().take(50).map(|k| stale_record(k)))
        .await
        .expect("publish");
    assert!(at.iter().all(|p| p.shard < 4), "{at:?}");
    stale_written += at.len() as u64;

    // The scale-down completes once every draining shard is drained. At that moment no
    // retired shard holds an entry that was not handled.
    let completed = stream_until(&stack, STREAM, "the scale-down to complete", 45, |v| {
        v["resharding"].is_null()
    })
    .await;
    let records = handled(&mut con, RECORD);
    let seen: HashSet<(u32, String)> = records
        .iter()
        .map(|r| (r.shard, r.entry_id.clone()))
        .collect();
    let mut retired_entries = 0;
    for s in 4..16u32 {
        let key = format!("{STREAM}:{s}");
        let list = entries(&mut con, &key);
        let (pending, delivered) = group_state(&mut con, &key);
        assert_eq!(pending, 0, "{key} retired with pending entries");
        if let Some((last, _)) = list.last() {
            assert!(
                parse_id(&delivered) >= parse_id(last),
                "{key} retired with undelivered entries ({delivered} < {last})"
            );
        }
        for (id, _) in &list {
            assert!(
                seen.contains(&(s, id.clone())),
                "{key} {id} retired unhandled"
            );
        }
        retired_entries += list.len();
    }
    assert!(retired_entries > 0);
    let mut retired: Vec<u64> = completed["retired_shards"]
        .as_array()
        .expect("retired_shards")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    retired.sort_unstable();
    assert_eq!(retired, (4..16).collect::<Vec<_>>(), "{completed}");

    // Rollback within the window: back to 16, through the same machinery.
    let before_ms = now_ms();
    let (s, body) = stack
        .api
        .post(&format!("/v1/streams/{STREAM}/rollback"), json!({}))
        .await;
    assert_eq!(s.as_u16(), 202, "{body}");
    assert_eq!(body["shard_count"], 16, "{body}");
    assert_eq!(body["last_reshard"]["rollback"], true, "{body}");
    assert_eq!(body["retired_shards"], json!([]), "active again: {body}");
    switches.push(Switch {
        from: 4,
        to: 16,
        before_ms,
        after_ms: now_ms(),
    });
    stack.wait_stable(GROUP, 4, 16).await;
    // A rollback is not rolled back.
    let (s, body) = stack
        .api
        .post(&format!("/v1/streams/{STREAM}/rollback"), json!({}))
        .await;
    assert_eq!(
        (s.as_u16(), code(&body)),
        (409, "NOTHING_TO_ROLLBACK"),
        "{body}"
    );

    // Long enough after the switch for the in-test producer to cover every key again once
    // its routing was refreshed (the check below allows the old layout until then).
    cover_every_key(switches.last().expect("switches"), &published).await;
    stop.store(true, Ordering::Relaxed);
    let fresh_written = fresh_task.await.expect("producer task");
    finish_producer(sample, 3000);

    // Every entry of every shard is handled, none is lost.
    let total = fresh_written + 3000 + stale_written;
    let all: Vec<(u32, String, HashMap<String, String>)> = (0..16u32)
        .flat_map(|s| {
            entries(&mut con, &format!("{STREAM}:{s}"))
                .into_iter()
                .map(move |(id, m)| (s, id, m))
        })
        .collect();
    assert_eq!(
        all.len() as u64,
        total,
        "every published entry is in its shard"
    );
    let count = |tag: &str| {
        all.iter()
            .filter(|e| e.2.get("producer").map(String::as_str) == Some(tag))
            .count() as u64
    };
    assert_eq!(count("fresh"), fresh_written);
    assert_eq!(count("stale"), stale_written);
    eventually("every entry to be handled", 30, || {
        let seen: HashSet<(u32, String)> = handled(&mut con, RECORD)
            .into_iter()
            .map(|r| (r.shard, r.entry_id))
            .collect();
        all.iter()
            .all(|(s, id, _)| seen.contains(&(*s, id.clone())))
            .then_some(())
    })
    .await;

    // Up-to-date producers (the sample producer and the in-test one) switched layout within
    // one refresh interval of each reshard, and never wrote to a shard outside the layout
    // after that.
    for (shard, id, m) in &all {
        if m.get("producer").map(String::as_str) == Some("stale") {
            continue;
        }
        let key = &m["key"];
        let t = id_ms(id);
        let mut expected = vec![shard_for_key(key.as_bytes(), 8)];
        for sw in &switches {
            if t >= sw.before_ms {
                let new = shard_for_key(key.as_bytes(), sw.to);
                expected = if t > sw.after_ms + REFRESH_MS + SWITCH_SLACK_MS {
                    vec![new]
                } else {
                    vec![shard_for_key(key.as_bytes(), sw.from), new]
                };
            }
        }
        assert!(
            expected.contains(shard),
            "{key} written at {t} to shard {shard}, expected one of {expected:?} (switches {switches:?})"
        );
    }

    // Retired keys of the rolled-back scale-down are active again: never deleted, even long
    // after the window.
    tokio::time::sleep(Duration::from_millis(WINDOW_MS + 1000)).await;
    for s in 0..16 {
        assert!(
            exists(&mut con, &format!("{STREAM}:{s}")),
            "{STREAM}:{s} was deleted"
        );
    }

    // Key movement per step, measured over the keys used, on the shards that handled them.
    let mut phases: Vec<HashMap<String, u32>> = vec![HashMap::new(); 4];
    for r in handled(&mut con, RECORD) {
        let Some(e) = all.iter().find(|e| e.0 == r.shard && e.1 == r.entry_id) else {
            continue;
        };
        if e.2.get("producer").map(String::as_str) == Some("stale") {
            continue;
        }
        let t = id_ms(&r.entry_id);
        let settled = |sw: &Switch| t > sw.after_ms + REFRESH_MS + SWITCH_SLACK_MS;
        let phase = if t < switches[0].before_ms {
            0
        } else if settled(&switches[0]) && t < switches[1].before_ms {
            1
        } else if settled(&switches[1]) && t < switches[2].before_ms {
            2
        } else if settled(&switches[2]) {
            3
        } else {
            continue;
        };
        let prev = phases[phase].insert(r.key.clone(), r.shard);
        assert!(
            prev.is_none_or(|p| p == r.shard),
            "{} on two shards in one phase",
            r.key
        );
    }
    eprintln!("| step | keys compared | moved | measured | jump theory | modulo hashing |");
    eprintln!("|---|---|---|---|---|---|");
    for (i, sw) in switches.iter().enumerate() {
        let (a, b) = (&phases[i], &phases[i + 1]);
        let common: Vec<&String> = a.keys().filter(|k| b.contains_key(*k)).collect();
        let moved = common.iter().filter(|k| a[**k] != b[**k]).count();
        // Jump hashing moves keys only to new shards (scale-up) or only off removed ones
        // (scale-down).
        for k in &common {
            if a[*k] != b[*k] {
                let (old, new) = (a[*k], b[*k]);
                if sw.to > sw.from {
                    assert!(new >= sw.from, "{k} moved {old} -> {new} on {sw:?}");
                } else {
                    assert!(old >= sw.to, "{k} moved {old} -> {new} on {sw:?}");
                }
            }
        }
        let theory = 1.0 - f64::from(sw.from.min(sw.to)) / f64::from(sw.from.max(sw.to));
        let modulo = common
            .iter()
            .filter(|k| {
                let h = rsc_protocol::routing::key_hash(k.as_bytes());
                h % u64::from(sw.from) != h % u64::from(sw.to)
            })
            .count();
        let measured = moved as f64 / common.len().max(1) as f64;
        eprintln!(
            "| {} → {} | {} | {} | {:.3} | {:.3} | {:.3} |",
            sw.from,
            sw.to,
            common.len(),
            moved,
            measured,
            theory,
            modulo as f64 / common.len().max(1) as f64
        );
        assert!(
            // Under load the producers slow down; half of the keys still measure the fraction
            // within the tolerance below (standard error ≈ 0.03 at 250 keys).
            common.len() as u64 >= KEYS / 2,
            "phase {i} saw too few keys: {}",
            common.len()
        );
        assert!(
            (measured - theory).abs() < 0.08,
            "{sw:?}: {measured} vs {theory}"
        );
    }
}

/// A scale-down's retired keys stay for the rollback window, then the coordinator deletes
/// them (audited, counted); afterwards a rollback is refused.
#[tokio::test]
async fn retired_keys_are_deleted_after_the_window() {
    const STREAM: &str = "aux";
    let _serial = SERIAL.lock().await;
    let stack = stack(SHORT_WINDOW_MS);
    stack
        .create_group(GROUP, STREAM, 4, SESSION_MS, HEARTBEAT_MS)
        .await;
    let _pods = consumers(&stack, STREAM, &["127.0.0.31"], 1);
    stack.wait_stable(GROUP, 1, 4).await;
    finish_producer(spawn_producer(&stack, STREAM, 200, 50, None), 200);
    let mut con = stack.redis();
    eventually("the backlog to be handled", 30, || {
        (handled(&mut con, RECORD).len() >= 200).then_some(())
    })
    .await;

    reshard(&stack, STREAM, 2, 4).await;
    let done = stream_until(&stack, STREAM, "the scale-down to complete", 30, |v| {
        v["resharding"].is_null()
    })
    .await;
    assert_eq!(done["retired_shards"], json!([2, 3]), "{done}");
    let until = done["rollback_until_ms"].as_u64().expect("window open");
    // Kept within the window: a rollback would need them.
    assert!(exists(&mut con, "aux:2") && exists(&mut con, "aux:3"));
    // Retry streams a listener with retry stages leaves on a shard (empty once it drained,
    // PROTOCOL §2.2): a retired shard's go with its key, an active shard's stay.
    let retry = |shard: &str, stage: u32| format!("{{{shard}}}:retry:{GROUP}:{stage}");
    for key in [retry("aux:2", 1), retry("aux:3", 16), retry("aux:0", 1)] {
        let id: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("f")
            .arg("v")
            .query(&mut con)
            .expect("XADD");
        let _: i64 = redis::cmd("XDEL")
            .arg(&key)
            .arg(id)
            .query(&mut con)
            .expect("XDEL");
        assert!(exists(&mut con, &key), "an empty stream stays: {key}");
    }
    assert!(
        now_ms() < until,
        "the test was too slow to look within the window"
    );

    eventually("the retired keys to be deleted", 15, || {
        (!exists(&mut con, "aux:2") && !exists(&mut con, "aux:3")).then_some(())
    })
    .await;
    assert!(now_ms() >= until, "deleted before the window closed");
    assert!(exists(&mut con, "aux:0") && exists(&mut con, "aux:1"));
    assert!(!exists(&mut con, &retry("aux:2", 1)) && !exists(&mut con, &retry("aux:3", 16)));
    assert!(
        exists(&mut con, &retry("aux:0", 1)),
        "an active shard's retry stream stays"
    );
    let v = stream_until(&stack, STREAM, "the stream to forget them", 5, |v| {
        v["retired_shards"] == json!([])
    })
    .await;
    assert_eq!(v["shard_count"], 2);

    let (s, body) = stack
        .api
        .post(&format!("/v1/streams/{STREAM}/rollback"), json!({}))
        .await;
    assert_eq!(
        (s.as_u16(), code(&body)),
        (409, "ROLLBACK_WINDOW_EXPIRED"),
        "{body}"
    );

    let (s, audit) = stack.api.get("/v1/audit?stream=aux&limit=50").await;
    assert_eq!(s.as_u16(), 200, "{audit}");
    let entry = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["action"] == "stream.delete_retired_keys")
        .unwrap_or_else(|| panic!("no audit entry: {audit:#}"))
        .clone();
    assert_eq!(entry["principal"], "rsc-coordinator");
    assert_eq!(entry["request"]["body"]["keys"], json!(["aux:2", "aux:3"]));
    let (s, metrics) = stack.api.get("/metrics").await;
    assert_eq!(s.as_u16(), 200);
    let text = metrics.as_str().unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| l.starts_with("rsc_retired_keys_deleted_total{stream=\"aux\"} 2")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("rsc_stream_retired_keys_kept{stream=\"aux\"} 0")),
        "{text}"
    );
}

/// Polls the stream view every 100 ms until `cond` holds, or panics after `secs`.
async fn stream_until(
    stack: &Stack,
    stream: &str,
    what: &str,
    secs: u64,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let v = stream_view(stack, stream).await;
        if cond(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What jump hashing buys on N → N+1, over the keys the reshard test uses: about 1/(N+1) of
/// the keys move, all of them to the new shard, where modulo hashing would move N/(N+1).
#[test]
fn jump_hashing_moves_one_key_in_n_plus_1() {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    eprintln!("| step | jump: moved | 1/(N+1) | modulo: moved | N/(N+1) |");
    eprintln!("|---|---|---|---|---|");
    for n in [4u32, 8, 16] {
        let mut jump = 0;
        let mut modulo = 0;
        for k in &keys {
            let (a, b) = (
                shard_for_key(k.as_bytes(), n),
                shard_for_key(k.as_bytes(), n + 1),
            );
            if a != b {
                assert_eq!(
                    b, n,
                    "{k} moved {a} -> {b}: jump hashing only moves keys to the new shard"
                );
                jump += 1;
            }
            let h = rsc_protocol::routing::key_hash(k.as_bytes());
            if h % u64::from(n) != h % u64::from(n + 1) {
                modulo += 1;
            }
        }
        let total = keys.len() as f64;
        let (jump, modulo) = (f64::from(jump) / total, f64::from(modulo) / total);
        eprintln!(
            "| {n} → {} | {jump:.3} | {:.3} | {modulo:.3} | {:.3} |",
            n + 1,
            1.0 / f64::from(n + 1),
            f64::from(n) / f64::from(n + 1)
        );
        assert!((jump - 1.0 / f64::from(n + 1)).abs() < 0.05, "{n}: {jump}");
        assert!(modulo > 0.7, "{n}: {modulo}");
    }
}

/// The same deletion when the data Redis is a Redis Cluster (`--data-redis-cluster`): the
/// retired keys sit in different slots, on different nodes. The member is driven by plain
/// heartbeats (it reports the draining shards drained).
#[tokio::test]
async fn retired_keys_are_deleted_from_a_redis_cluster() {
    let cluster = rsc_testkit::RedisCluster::shared().expect("cluster starts");
    let coordinator =
        CoordinatorProcess::start_on_cluster(cluster, &["--rollback-window-ms", "1000"])
            .expect("coordinator starts");
    let api = Api::new(coordinator.url());
    let stream = format!("rc{}", std::process::id());
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": stream, "shard_count": 4}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    let key = |shard: u32| format!("{stream}:{shard}");
    for shard in 0..4 {
        let _: String = redis::cmd("XADD")
            .arg(key(shard))
            .arg("*")
            .arg("n")
            .arg(shard)
            .query(&mut con)
            .unwrap();
    }
    let exists = |con: &mut redis::cluster::ClusterConnection, k: &str| -> bool {
        redis::cmd("EXISTS").arg(k).query::<i64>(con).unwrap() == 1
    };

    let heartbeat = |epoch: i64, owned: Vec<u32>, drained: Vec<u32>| {
        let api = &api;
        async move {
            let (s, hb) = api
                .post(
                    &format!("/v1/groups/{GROUP}/heartbeat"),
                    json!({"protocol_version": 1, "member_id": "m1", "member_epoch": epoch,
                        "owned_shards": owned, "drained_shards": drained}),
                )
                .await;
            assert_eq!(s.as_u16(), 200, "{hb}");
            let assignment: Vec<u32> = hb["assignment"]
                .as_array()
                .expect("assignment")
                .iter()
                .filter_map(|v| v.as_u64().map(|v| v as u32))
                .collect();
            (hb["member_epoch"].as_i64().expect("epoch"), assignment)
        }
    };
    let (mut epoch, mut owned) = heartbeat(0, vec![], vec![]).await;
    assert_eq!(owned.len(), 4);
    let (s, body) = api
        .post(
            &format!("/v1/streams/{stream}/reshard"),
            json!({"shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 202, "{body}");

    // Drain: report shards 2 and 3 drained until the scale-down completes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let drained: Vec<u32> = owned.iter().copied().filter(|&s| s >= 2).collect();
        (epoch, owned) = heartbeat(epoch, owned.clone(), drained).await;
        let (s, v) = api.get(&format!("/v1/streams/{stream}")).await;
        assert_eq!(s.as_u16(), 200, "{v}");
        if v["resharding"].is_null() && v["retired_shards"] == json!([2, 3]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "scale-down did not complete: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exists(&mut con, &key(2)) && exists(&mut con, &key(3)));

    // Deleted after the window, from whichever node holds each key.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while exists(&mut con, &key(2)) || exists(&mut con, &key(3)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "retired keys not deleted: {:?}",
            coordinator.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exists(&mut con, &key(0)) && exists(&mut con, &key(1)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, v) = api.get(&format!("/v1/streams/{stream}")).await;
        if v["retired_shards"] == json!([]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retired shards not forgotten: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        api.metric("rsc_retired_keys_deleted_total", &[]).await >= 2.0,
        "the deletions are counted"
    );
    assert_eq!(
        api.metric("rsc_retired_key_delete_errors_total", &[]).await,
        0.0,
        "no failed pass: {:?}",
        coordinator.log()
    );
}
