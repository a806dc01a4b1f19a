//! The lag sampler (ARCHITECTURE "How lag is sampled", PROTOCOL §12): two coordinators on the
//! Redis store answer the same `GET /v1/groups/{group}/history`, and while nothing moves
//! their sampling costs the data Redis at most one command per shard per minute (counted
//! with `INFO commandstats` on a data Redis of its own).

use reqwest::StatusCode;
use rsc_e2e::Api;
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How often the coordinators sample in these tests.
const INTERVAL_MS: u64 = 250;

fn redis(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("redis")
}

/// Two coordinators on the Redis store `meta`, sampling the data Redis `data`.
fn two_coordinators(meta: &RedisServer, data: &RedisServer) -> [CoordinatorProcess; 2] {
    let prefix = rsc_e2e::unique_key_prefix();
    let interval = INTERVAL_MS.to_string();
    let (meta_url, data_url) = (meta.url(), data.url());
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &meta_url,
        "--key-prefix",
        &prefix,
        "--data-redis-url",
        &data_url,
        "--history-interval-ms",
        &interval,
    ];
    [
        CoordinatorProcess::start(&args).expect("coordinator a"),
        CoordinatorProcess::start(&args).expect("coordinator b"),
    ]
}

/// Creates `group` on `stream` of `shards` shards, and its Redis consumer group on every
/// shard key (empty streams: nothing to deliver). Returns the keys.
async fn create_group(
    api: &Api,
    con: &mut redis::Connection,
    group: &str,
    stream: &str,
    shards: u32,
) -> Vec<String> {
    let (s, b) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": stream, "shard_count": shards}),
        )
        .await;
    assert!(s == StatusCode::CREATED || s == StatusCode::OK, "{s} {b}");
    let (_, routing) = api.get(&format!("/v1/streams/{stream}/routing")).await;
    let keys: Vec<String> = serde_json::from_value(routing["shard_keys"].clone()).expect("keys");
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("XGROUP")
            .arg(&["CREATE", key.as_str(), group, "0", "MKSTREAM"][..])
            .ignore();
    }
    let () = pipe.query(con).expect("XGROUP CREATE");
    keys
}

async fn history(api: &Api, group: &str) -> Vec<Value> {
    let (s, h) = api.get(&format!("/v1/groups/{group}/history")).await;
    assert_eq!(s, StatusCode::OK, "{h}");
    h["samples"].as_array().cloned().unwrap_or_default()
}

/// Both coordinators answer the same series, taken by whichever of them samples the group
/// (one sample per interval, not one per coordinator), and it goes on when that one dies.
#[tokio::test]
async fn two_coordinators_answer_the_same_history() {
    let meta = RedisServer::start().expect("redis");
    let data = RedisServer::start().expect("redis");
    let [mut a, b] = two_coordinators(&meta, &data);
    let (api_a, api_b) = (Api::new(a.url()), Api::new(b.url()));
    let mut con = redis(&data);
    let keys = create_group(&api_a, &mut con, "billing", "orders", 4).await;
    for key in &keys {
        for n in 0..50 {
            let _: String = redis::cmd("XADD")
                .arg(key)
                .arg("*")
                .arg("n")
                .arg(n)
                .query(&mut con)
                .expect("XADD");
        }
    }
    // Both see the backlog, and at some instant both answer exactly the same samples.
    let deadline = Instant::now() + Duration::from_secs(20);
    let same = loop {
        let (ha, hb) = (
            history(&api_a, "billing").await,
            history(&api_b, "billing").await,
        );
        if ha.len() >= 5 && ha.iter().any(|s| s["lag"] == 200) && ha == hb {
            break ha;
        }
        assert!(
            Instant::now() < deadline,
            "the coordinators' histories differ:\na: {ha:?}\nb: {hb:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let times: Vec<u64> = same.iter().filter_map(|s| s["t_ms"].as_u64()).collect();
    for w in times.windows(2) {
        assert!(
            w[1] >= w[0] + INTERVAL_MS / 2,
            "one sample per interval between both coordinators: {times:?}"
        );
    }
    // The sampler dies: the other takes its streams over (registration lapses in 3 s).
    a.kill();
    let killed = times.last().copied().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = history(&api_b, "billing").await;
        let newest = h.last().and_then(|s| s["t_ms"].as_u64()).unwrap_or(0);
        if newest > killed + 5_000 {
            assert!(h.len() > same.len(), "the old samples are kept");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no sample after a coordinator died"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `cmdstat_<name>` → calls, from `INFO commandstats`.
fn command_calls(con: &mut redis::Connection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    rsc_testkit::command_calls(&info)
}

/// While nothing moves, the two coordinators' sampling of two groups on one stream of
/// `RSC_LAG_SHARDS` (default 256) shards costs the data Redis at most one command per shard
/// per minute, scaled to the window (plus one interval's worth: reads happen at ticks). The
/// sampler before this design sent one `XINFO GROUPS` per shard, per group, per interval, on
/// every coordinator.
#[tokio::test]
async fn idle_sampling_costs_at_most_one_command_per_shard_per_minute() {
    let shards: u32 = std::env::var("RSC_LAG_SHARDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let meta = RedisServer::start().expect("redis");
    let data = RedisServer::start().expect("redis");
    let [a, b] = two_coordinators(&meta, &data);
    let api = Api::new(a.url());
    let mut con = redis(&data);
    create_group(&api, &mut con, "g1", "orders", shards).await;
    create_group(&api, &mut con, "g2", "orders", shards).await;
    // Until both coordinators divided the streams and read every key twice (then idle).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let window = Duration::from_secs(12);
    let before = command_calls(&mut con);
    tokio::time::sleep(window).await;
    let after = command_calls(&mut con);
    let delta: BTreeMap<&str, u64> = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, n)| (name.as_str(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    // The recovery copy's check (PROTOCOL §2.3) reads its two hashes every 5 s on each
    // coordinator, whatever the shard count: not sampling, bounded apart.
    let recovery: u64 = ["hkeys", "hgetall"]
        .iter()
        .filter_map(|c| delta.get(c))
        .sum();
    let checks = 2 * (window.as_secs() / 5 + 1);
    assert!(
        recovery <= 2 * checks,
        "{recovery} recovery-copy reads in {window:?} by 2 coordinators: {delta:?}"
    );
    let total: u64 = delta.values().sum::<u64>() - recovery;
    let w = window.as_millis() as f64;
    let goal = f64::from(shards) * w / 60_000.0;
    let bound = f64::from(shards) * (w + INTERVAL_MS as f64) / 60_000.0 + 2.0;
    let old = 2.0 * 2.0 * f64::from(shards) * w / INTERVAL_MS as f64;
    eprintln!(
        "{shards} shards, 2 groups, 2 coordinators, {window:?} idle: {total} data-Redis \
         commands {delta:?}; goal {goal:.1} (1 per shard per minute), bound with one tick \
         {bound:.1}; the per-group sampler at every tick: {old:.0}"
    );
    assert!(
        (total as f64) <= bound,
        "{total} commands in {window:?} over {shards} idle shards: {delta:?}"
    );
    // The history still has a sample per interval, served by both.
    let ha = history(&Api::new(a.url()), "g1").await;
    let hb = history(&Api::new(b.url()), "g1").await;
    assert!(ha.len() >= 20, "{}", ha.len());
    assert_eq!(ha[0], hb[0]);
    assert_eq!(ha.last().map(|s| s["lag"].clone()), Some(json!(0)));
}

/// Views asked often — a dashboard, an autoscaler, scrapes — cost the data Redis at most one
/// read per shard key (and group, and position) per second, however often they are asked
/// (PROTOCOL §12, "lag in views"): 75 group views, autoscaling signals and scrapes of two
/// groups on 16 shards with a backlog. Without the one-second reuse, each of them read every
/// key again: about 3,000 commands.
#[tokio::test]
async fn views_asked_often_read_each_key_at_most_once_a_second() {
    const SHARDS: u32 = 16;
    let data = RedisServer::start().expect("redis");
    let data_url = data.url();
    let coordinator = CoordinatorProcess::start(&[
        "--data-redis-url",
        &data_url,
        "--history-interval-ms",
        "60000",
    ])
    .expect("coordinator");
    let api = Api::new(coordinator.url());
    let mut con = redis(&data);
    let keys = create_group(&api, &mut con, "g1", "orders", SHARDS).await;
    create_group(&api, &mut con, "g2", "orders", SHARDS).await;
    for key in &keys {
        for _ in 0..5 {
            let _: String = redis::cmd("XADD")
                .arg(&[key.as_str(), "*", "v", "1"][..])
                .query(&mut con)
                .expect("XADD");
        }
    }
    let (_, view) = api.get("/v1/groups/g1").await;
    assert_eq!(view["shards"][0]["lag"], json!(5), "{view:#}");
    let before = command_calls(&mut con);
    let started = Instant::now();
    for i in 0..15 {
        for group in ["g1", "g2"] {
            let (s, v) = api.get(&format!("/v1/groups/{group}")).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            assert_eq!(v["shards"][(i % SHARDS) as usize]["lag"], json!(5), "{v:#}");
            let (s, v) = api.get(&format!("/v1/groups/{group}/scaling")).await;
            assert_eq!(s, StatusCode::OK, "{v}");
        }
        let scrape = rsc_e2e::http()
            .get(format!("{}/metrics", coordinator.url()))
            .send()
            .await
            .expect("scrape");
        assert!(scrape.status().is_success());
    }
    let elapsed = started.elapsed();
    let after = command_calls(&mut con);
    let reads: u64 = ["xinfo|groups", "xinfo|consumers", "xrange"]
        .iter()
        .map(|c| {
            let name = c.to_string();
            after.get(&name).copied().unwrap_or(0) - before.get(&name).copied().unwrap_or(0)
        })
        .sum();
    // Per started second: XINFO GROUPS per key (both groups share it), XINFO CONSUMERS and
    // XRANGE per key and group; plus the sampler's one read per key in the minute.
    let seconds = elapsed.as_secs() + 1;
    let bound = seconds * u64::from(SHARDS) * (1 + 2 + 2) + u64::from(SHARDS);
    eprintln!("75 requests in {elapsed:?}: {reads} data-Redis reads (bound {bound})");
    assert!(
        reads <= bound,
        "{reads} reads for 75 requests in {elapsed:?} (bound {bound}): {:?}",
        after
    );
}
