//! Expiry at scale, against real coordinator processes on one real Redis: deadlines are found
//! through the deadline index, the index's buckets are divided among the live coordinators,
//! a killed coordinator's due deadlines are taken over, each member is expired exactly once,
//! and deleted groups leave nothing behind.

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use rsc_e2e::{Api, Backend, Stack};
use serde_json::json;
use std::time::{Duration, Instant};

const SESSION_MS: u64 = 1_500;

/// Waits (bounded) until `check` holds.
async fn until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn create_group(api: &Api, group: &str, stream: &str) {
    let (status, body) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": stream, "shard_count": 2,
                   "session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

async fn members(api: &Api, group: &str) -> usize {
    let (status, body) = api.get(&format!("/v1/groups/{group}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["members"].as_array().map_or(0, Vec::len)
}

/// Three coordinators divide the 16 buckets, and every silent member is expired by exactly
/// one of them (the sum of their expiry counters is the number of members).
#[tokio::test]
async fn three_coordinators_expire_each_member_exactly_once() {
    let unlimited = ["--admin-rate", "10000", "--admin-burst", "10000"];
    let stack = Stack::start(Backend::Redis, &unlimited);
    let b = stack.another_coordinator(&unlimited);
    let c = stack.another_coordinator(&unlimited);
    let apis = [stack.api.clone(), Api::new(b.url()), Api::new(c.url())];
    for api in &apis {
        until(
            "three live coordinators",
            Duration::from_secs(10),
            || async { api.metric("rsc_coordinators_live", &[]).await == 3.0 },
        )
        .await;
    }
    until("the buckets divided", Duration::from_secs(10), || async {
        let mut sum = 0.0;
        for api in &apis {
            sum += api.metric("rsc_sweep_buckets", &[]).await;
        }
        sum == 16.0
    })
    .await;
    const GROUPS: usize = 24;
    for i in 0..GROUPS {
        create_group(&stack.api, &format!("g{i}"), &format!("s{}", i % 4)).await;
        // Each member joins through another coordinator, then falls silent.
        let (status, body) = apis[i % 3].heartbeat(&format!("g{i}"), "m", 0, &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    until("every member expired", Duration::from_secs(20), || async {
        for i in 0..GROUPS {
            if members(&stack.api, &format!("g{i}")).await != 0 {
                return false;
            }
        }
        true
    })
    .await;
    let mut expired = 0.0;
    for api in &apis {
        expired += api
            .metric(
                "rsc_members_expired_total",
                &[("reason", "session_timeout")],
            )
            .await;
    }
    assert_eq!(expired, GROUPS as f64, "each member expired exactly once");
}

/// A coordinator that owns due deadlines is killed: another one takes its buckets over and
/// expires those members in time (session + registration lapse + one refresh, with slack).
#[tokio::test]
async fn a_killed_coordinator_s_deadlines_are_taken_over() {
    let unlimited = ["--admin-rate", "10000", "--admin-burst", "10000"];
    let stack = Stack::start(Backend::Redis, &unlimited);
    let mut doomed = stack.another_coordinator(&unlimited);
    let doomed_api = Api::new(doomed.url());
    for api in [&stack.api, &doomed_api] {
        until("two live coordinators", Duration::from_secs(10), || async {
            api.metric("rsc_coordinators_live", &[]).await == 2.0
        })
        .await;
    }
    assert_eq!(doomed_api.metric("rsc_sweep_buckets", &[]).await, 8.0);
    const GROUPS: usize = 16;
    for i in 0..GROUPS {
        create_group(&stack.api, &format!("k{i}"), "s").await;
        let (status, body) = doomed_api.heartbeat(&format!("k{i}"), "m", 0, &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let last_heartbeat = Instant::now();
    // Nothing is due yet: the doomed coordinator dies owning half of the deadlines.
    doomed.kill();
    let survivor = stack.api.clone();
    until(
        "every member expired by the survivor",
        Duration::from_secs(20),
        || async {
            for i in 0..GROUPS {
                if members(&survivor, &format!("k{i}")).await != 0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let took = last_heartbeat.elapsed();
    // Session, plus the doomed registration lapsing (3 s), one registry refresh (1 s) and
    // slack for a loaded machine.
    assert!(
        took < Duration::from_millis(SESSION_MS) + Duration::from_secs(8),
        "expired after {took:?}"
    );
    assert_eq!(
        survivor
            .metric(
                "rsc_members_expired_total",
                &[("reason", "session_timeout")]
            )
            .await,
        GROUPS as f64
    );
    until(
        "the survivor sweeps every bucket",
        Duration::from_secs(10),
        || async { survivor.metric("rsc_sweep_buckets", &[]).await == 16.0 },
    )
    .await;
}

/// 1,000 create / join / delete cycles leave the Redis key count where it started: group
/// documents, liveness, deadline-index entries, locks and (after their retention) tombstones
/// all go.
#[tokio::test]
async fn create_delete_cycles_leave_no_keys_behind() {
    let stack = Stack::start(
        Backend::Redis,
        &[
            "--tombstone-retention-ms",
            "300",
            "--admin-rate",
            "100000",
            "--admin-burst",
            "100000",
        ],
    );
    let redis = stack.redis.as_ref().expect("redis backend");
    // Every key but locks (transient by design: released at once, and they expire).
    let keys = || -> Vec<String> {
        let reply = redis.command("KEYS *").expect("KEYS");
        let mut keys: Vec<String> = reply
            .split("\r\n")
            .filter(|l| !l.is_empty() && !l.starts_with(['*', '$']) && !l.contains(":lock:"))
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys
    };
    // The stream, one group with a live member, the audit log: the steady state.
    let (status, body) = stack
        .api
        .post(
            "/v1/groups",
            json!({"group": "base", "stream": "s", "shard_count": 2,
                   "session_timeout_ms": 600_000}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = stack.api.heartbeat("base", "m", 0, &[]).await;
    assert_eq!(status, StatusCode::OK);
    // One cycle first, so that every key a cycle creates for good (the audit log) exists.
    cycle(&stack.api, "warmup").await;
    until(
        "the warm-up's keys gone",
        Duration::from_secs(10),
        || async { redis.command("KEYS *warmup*").unwrap().starts_with("*0") },
    )
    .await;
    let start = keys();
    const CYCLES: usize = 1_000;
    let api = &stack.api;
    futures::stream::iter(0..CYCLES)
        .map(|i| async move { cycle(api, &format!("c{i}")).await })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while keys() != start {
        assert!(
            Instant::now() < deadline,
            "keys {:?}, not {start:?}",
            keys()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (status, body) = stack.api.get("/v1/groups").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["groups"].as_array().map(Vec::len),
        Some(1),
        "only `base` is left"
    );
}

/// Create a group, join a member (liveness and a deadline-index entry), delete by force.
/// Eight cycles run at once on one stream, so on a busy machine a request can wait longer
/// than the stream lock's 3 s and be refused with 503 `STORE_UNAVAILABLE`, which PROTOCOL
/// §4.2 makes retryable: retried as a client would, within a deadline.
async fn cycle(api: &Api, group: &str) {
    let create = json!({"group": group, "stream": "s", "shard_count": 2,
                        "session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500});
    let (status, body) = retry_unavailable(|| api.post("/v1/groups", create.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = api.heartbeat(group, "m", 0, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let path = format!("/v1/groups/{group}?force=true");
    let (status, body) = retry_unavailable(|| api.call(Method::DELETE, &path, None)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
}

/// Repeats `call` while it answers 503 (for at most 30 s).
async fn retry_unavailable<F, Fut>(call: F) -> (StatusCode, serde_json::Value)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (StatusCode, serde_json::Value)>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = call().await;
        if status != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
