//! Replay (PROTOCOL §18, seek) end to end: a real coordinator reading a real data Redis
//! (standalone or a Redis Cluster), the client library consuming 8 shards, and an operator
//! who pauses the group, seeks and resumes it **with nothing published afterwards**: every
//! shard delivers again from its new position at once (the seek rings each shard's doorbell
//! and a resumed worker reads at once), and the group's view and history show the backlog the
//! seek created from the first sample.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{SERIAL, eventually, now_ms};
use reqwest::StatusCode;
use rsc_e2e::Api;
use rsc_testkit::{CoordinatorProcess, RedisCluster, RedisServer};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SHARDS: u32 = 8;
/// Entries written before the seek time `t`, and after it.
const BEFORE_T: u64 = 2_000;
const AFTER_T: u64 = 2_000;
/// How long re-delivering every entry may take after the resume (the fix does it in well
/// under a second; the reader before it never re-delivered without a new entry).
const REDELIVERY_DEADLINE_SECS: u64 = 15;

/// Deliveries seen by the listener: `(shard, entry id)` → times handled.
type Seen = Arc<Mutex<HashMap<(u32, String), u32>>>;

/// A coordinator on a data Redis (standalone or cluster) and the consumer app.
struct Replay {
    api: Api,
    coordinator: CoordinatorProcess,
    _redis: Option<RedisServer>,
    data_url: String,
    cluster: bool,
    stream: String,
    group: String,
    seen: Seen,
    handle: rsc_client::AppHandle,
    app: tokio::task::JoinHandle<Result<(), rsc_client::ClientError>>,
}

impl Replay {
    /// Starts a coordinator on a fresh Redis (or the shared cluster), creates the group with
    /// `fencing`, and runs a consumer app of 2 members for it.
    async fn start(cluster: bool, fencing: &str, shared_reader: bool) -> Replay {
        let (redis, data_url) = if cluster {
            let c = RedisCluster::shared().expect("cluster");
            (None, c.urls().join(","))
        } else {
            let r = RedisServer::start().expect("redis-server starts");
            let url = r.url();
            (Some(r), url)
        };
        let mut args = vec![
            "--store",
            "memory",
            "--sweep-interval-ms",
            "20",
            "--history-interval-ms",
            "200",
            "--data-redis-url",
            &data_url,
        ];
        if cluster {
            args.push("--data-redis-cluster");
        }
        let coordinator = CoordinatorProcess::start(&args).expect("coordinator starts");
        let api = Api::new(coordinator.url());
        let prefix = rsc_e2e::unique_key_prefix();
        let (stream, group) = (format!("{prefix}-rp"), format!("{prefix}-g"));
        let (s, body) = api
            .post(
                "/v1/groups",
                json!({"group": group, "stream": stream, "shard_count": SHARDS,
                    "session_timeout_ms": 6000, "heartbeat_interval_ms": 300,
                    "fencing": fencing}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        let seen: Seen = Arc::default();
        let record = seen.clone();
        let listener = rsc_client::Listener::new(
            &group,
            &stream,
            move |m: rsc_client::Message<rsc_client::Raw>| {
                let record = record.clone();
                async move {
                    *record
                        .lock()
                        .unwrap()
                        .entry((m.shard(), m.id().to_owned()))
                        .or_default() += 1;
                    Ok::<(), rsc_client::HandlerError>(())
                }
            },
        )
        .name("replay")
        .concurrency(2)
        .batch_size(100);
        let app = rsc_client::ConsumerApp::builder()
            .coordinator(&coordinator.url())
            .redis_url(&data_url)
            .redis_cluster(cluster)
            .shared_reader(shared_reader)
            .instance_id("127.0.0.61")
            .listener(listener)
            .build()
            .expect("app");
        let handle = app.handle();
        let app = tokio::spawn(app.run_until(std::future::pending()));
        let r = Replay {
            api,
            coordinator,
            _redis: redis,
            data_url,
            cluster,
            stream,
            group,
            seen,
            handle,
            app,
        };
        r.wait_owned().await;
        r
    }

    /// Waits until the members own every shard.
    async fn wait_owned(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let g = self.view().await;
            let owned: usize = g["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| m["owned_shards"].as_array().map_or(0, Vec::len))
                .sum();
            if owned == SHARDS as usize {
                return;
            }
            assert!(Instant::now() < deadline, "shards never owned: {g:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn view(&self) -> Value {
        let (s, v) = self.api.get(&format!("/v1/groups/{}", self.group)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    /// Publishes `n` entries (keys spread them over every shard).
    async fn publish(&self, n: u64, tag: &str) {
        let producer = rsc_client::producer::Producer::builder()
            .coordinator(&self.coordinator.url())
            .redis_url(&self.data_url)
            .redis_cluster(self.cluster)
            .build()
            .expect("producer");
        for chunk in 0..n.div_ceil(200) {
            let records = (chunk * 200..((chunk + 1) * 200).min(n)).map(|i| {
                rsc_client::producer::Record::raw(format!("{tag}{i}")).key(format!("{tag}-k{i}"))
            });
            producer
                .publish_batch(&self.stream, records)
                .await
                .expect("publish");
        }
    }

    /// Entries handled at least `times` times.
    fn handled(&self, times: u32) -> usize {
        self.seen
            .lock()
            .unwrap()
            .values()
            .filter(|&&n| n >= times)
            .count()
    }

    /// Waits until `count` entries were handled at least `times` times; the time it took.
    async fn wait_handled(&self, count: usize, times: u32, secs: u64) -> Duration {
        let t0 = Instant::now();
        eventually(
            &format!("{count} entries handled {times} times"),
            secs,
            || (self.handled(times) >= count).then_some(()),
        )
        .await;
        t0.elapsed()
    }

    /// Waits until every shard reports lag 0 and nothing pending (everything acknowledged).
    async fn wait_caught_up(&self) {
        eventually_view(self, "every shard caught up", |g| {
            shards(g).iter().all(|s| s["lag"] == 0 && s["pending"] == 0)
        })
        .await;
    }

    /// Pauses the group and waits until its members know (so that none reads meanwhile).
    async fn pause(&self) {
        self.post("pause", json!({})).await;
        eventually("the members know of the pause", 10, || {
            (self.handle.is_group_paused("replay") == Some(true)).then_some(())
        })
        .await;
    }

    async fn post(&self, what: &str, body: Value) -> Value {
        let (s, v) = self
            .api
            .post(&format!("/v1/groups/{}/{what}", self.group), body)
            .await;
        assert_eq!(s, StatusCode::OK, "{what}: {v}");
        v
    }

    async fn seek(&self, to: Value, dry_run: bool) -> Value {
        self.post("seek", json!({"to": to, "dry_run": dry_run}))
            .await
    }

    /// A sample of the group's history taken after `after_ms` (one interval later, so that
    /// its tick read the group after the seek was recorded).
    async fn sample_after(&self, after_ms: u64) -> Value {
        let path = format!("/v1/groups/{}/history", self.group);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, h) = self.api.get(&path).await;
            let samples = h["samples"].as_array().cloned().unwrap_or_default();
            if let Some(s) = samples
                .into_iter()
                .find(|s| s["t_ms"].as_u64().is_some_and(|t| t > after_ms + 200))
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no history sample after the seek: {h}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        self.app.abort();
    }
}

fn shards(g: &Value) -> Vec<Value> {
    g["shards"].as_array().cloned().unwrap_or_default()
}

/// The group's lag summed over its shards (every shard must report it).
fn lag(g: &Value) -> u64 {
    shards(g)
        .iter()
        .map(|s| s["lag"].as_u64().unwrap_or_else(|| panic!("no lag: {s}")))
        .sum()
}

async fn eventually_view(r: &Replay, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let g = r.view().await;
        if ok(&g) {
            return g;
        }
        assert!(Instant::now() < deadline, "{what}: never so: {g:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The whole scenario (see the module docs): 4,000 entries on 8 shards handled; paused, the
/// group is moved to the earliest entry, to the latest, then to a time, and resumed each time
/// with nothing published. Returns how long each full re-delivery took after the seek's
/// request was sent.
async fn scenario(r: &Replay) -> Vec<Duration> {
    let mut took = Vec::new();
    r.publish(BEFORE_T, "a").await;
    r.wait_handled(BEFORE_T as usize, 1, 60).await;
    // The time t: every entry written from now on has an id at or after it.
    let t = now_ms() + 1;
    eventually("a later millisecond", 5, || (now_ms() > t).then_some(())).await;
    r.publish(AFTER_T, "b").await;
    let all = (BEFORE_T + AFTER_T) as usize;
    r.wait_handled(all, 1, 60).await;
    // Every shard's position is shown, past t (views are up to a second old: wait for it).
    eventually_view(r, "every shard caught up past t", |g| {
        shards(g).iter().all(|s| {
            s["lag"] == 0
                && s["pending"] == 0
                && s["last_delivered_id"].as_str().is_some()
                && s["last_delivered_ms"].as_u64() >= Some(t)
        })
    })
    .await;

    // A seek of a running group is refused, naming the command that pauses it.
    let (s, body) = r
        .api
        .post(
            &format!("/v1/groups/{}/seek", r.group),
            json!({"to": "earliest"}),
        )
        .await;
    assert_eq!(
        (s, rsc_e2e::code(&body)),
        (StatusCode::CONFLICT, "GROUP_NOT_EMPTY"),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("rsc-coordinator group pause {}", r.group)),
        "{message}"
    );

    // 1. Earliest. A dry run first: the plan, and nothing moved.
    r.pause().await;
    let plan = r.seek(json!("earliest"), true).await;
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["redelivered"], all as u64, "{plan:#}");
    assert_eq!(plan["lag_after"], all as u64);
    assert_eq!(plan["plan"].as_array().map(Vec::len), Some(SHARDS as usize));
    assert_eq!(lag(&r.view().await), 0, "a dry run moves nothing");
    let t0 = Instant::now();
    let done = r.seek(json!("earliest"), false).await;
    let seek_ms = now_ms();
    assert_eq!(done["redelivered"], all as u64, "{done:#}");
    assert_eq!(
        lag(&r.view().await),
        all as u64,
        "the view shows the backlog right after the seek"
    );
    let sample = r.sample_after(seek_ms).await;
    assert_eq!(
        sample["lag"], all as u64,
        "the first history sample shows the backlog: {sample}"
    );
    let g = r.view().await;
    assert_eq!(g["last_seek"]["to"], "earliest", "{g:#}");
    r.post("resume", json!({})).await;
    r.wait_handled(all, 2, REDELIVERY_DEADLINE_SECS).await;
    took.push(t0.elapsed());
    r.wait_caught_up().await;

    // 2. Latest: nothing is delivered again; the seek skips nothing either (all caught up).
    r.pause().await;
    let done = r.seek(json!("latest"), false).await;
    assert_eq!(
        (done["redelivered"].as_u64(), done["lag_after"].as_u64()),
        (Some(0), Some(0)),
        "{done:#}"
    );
    // Moved back to the earliest and on to the latest while paused: the second seek skips
    // what the first one had made undelivered.
    r.seek(json!("earliest"), false).await;
    let done = r.seek(json!("latest"), false).await;
    assert_eq!(done["skipped"], all as u64, "{done:#}");
    assert_eq!(lag(&r.view().await), 0);
    r.post("resume", json!({})).await;
    let before = r.handled(3);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.handled(3), before, "nothing delivered a third time");
    assert_eq!(r.handled(2), all, "nothing delivered again after latest");

    // 3. A time: exactly the entries written from t on are delivered again.
    r.pause().await;
    let t0 = Instant::now();
    let done = r.seek(json!({"time_ms": t}), false).await;
    let seek_ms = now_ms();
    assert_eq!(done["redelivered"], AFTER_T, "{done:#}");
    assert_eq!(
        lag(&r.view().await),
        AFTER_T,
        "Redis' lag stays exact after a seek into the stream (ENTRIESREAD)"
    );
    let sample = r.sample_after(seek_ms).await;
    assert_eq!(sample["lag"], AFTER_T, "{sample}");
    r.post("resume", json!({})).await;
    r.wait_handled(AFTER_T as usize, 3, REDELIVERY_DEADLINE_SECS)
        .await;
    took.push(t0.elapsed());
    let seen = r.seen.lock().unwrap().clone();
    let id_ms = |id: &str| -> u64 { id.split('-').next().unwrap().parse().unwrap() };
    for ((shard, id), n) in &seen {
        let expect = if id_ms(id) >= t { 3 } else { 2 };
        assert_eq!(*n, expect, "shard {shard} entry {id}");
    }
    r.wait_caught_up().await;
    took
}

/// Lease fencing, the shared reader (the default): doorbell and fallback poll.
#[tokio::test]
async fn a_seek_on_idle_shards_delivers_again_at_once() {
    let _serial = SERIAL.lock().await;
    let r = Replay::start(false, "lease", true).await;
    let took = scenario(&r).await;
    eprintln!("re-delivered after the seek in {took:?}");
}

/// Strict fencing: reads go through the guarded transaction (owner tokens).
#[tokio::test]
async fn a_seek_on_idle_shards_delivers_again_at_once_with_strict_fencing() {
    let _serial = SERIAL.lock().await;
    let r = Replay::start(false, "strict", true).await;
    let took = scenario(&r).await;
    eprintln!("re-delivered after the seek in {took:?} (strict)");
}

/// The per-shard reader (a blocked read per shard, `shared_reader(false)`) under strict
/// fencing: it waits for new entries with `XREAD BLOCK`, which a seek does not wake.
#[tokio::test]
async fn a_seek_on_idle_shards_delivers_again_at_once_with_per_shard_readers() {
    let _serial = SERIAL.lock().await;
    let r = Replay::start(false, "strict", false).await;
    let took = scenario(&r).await;
    eprintln!("re-delivered after the seek in {took:?} (per-shard readers)");
}

/// A Redis Cluster data Redis: the seek moves each shard on its node and rings its doorbell
/// with `SPUBLISH` (sharded pub/sub).
#[tokio::test]
async fn a_seek_on_idle_shards_delivers_again_at_once_on_a_redis_cluster() {
    let _serial = SERIAL.lock().await;
    let r = Replay::start(true, "strict", true).await;
    let took = scenario(&r).await;
    eprintln!("re-delivered after the seek in {took:?} (cluster)");
}
