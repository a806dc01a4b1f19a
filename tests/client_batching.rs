//! Batched heartbeats end to end: a consumer app with concurrency 8 against a real
//! coordinator process and a real redis-server joins and converges, and its steady heartbeats
//! reach the coordinator through `POST /v1/heartbeats`, several members per request — not
//! through the single-member route.
//!
//! Build the coordinator first: `cargo build -p rsc-coordinator --bin rsc-coordinator`.

use rsc_client::{ConsumerApp, HandlerError, Listener, Message, Raw};
use rsc_e2e::metric_sum;
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const BATCH_ROUTE: &str = "/v1/heartbeats";
const SINGLE_ROUTE: &str = "/v1/groups/{group}/heartbeat";
const MEMBERS: usize = 8;
const SHARDS: usize = 16;

/// What the coordinator counted so far.
#[derive(Debug, Clone, Copy)]
struct Counts {
    batch_requests: f64,
    single_requests: f64,
    /// Heartbeats carried by batch requests (the coordinator's batch-size histogram).
    batched_heartbeats: f64,
}

async fn counts(http: &reqwest::Client, base: &str) -> Counts {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("coordinator reachable")
        .text()
        .await
        .unwrap();
    let requests = |route| {
        metric_sum(
            &text,
            "rsc_http_requests_total",
            &[("route", route), ("method", "POST")],
        )
    };
    Counts {
        batch_requests: requests(BATCH_ROUTE),
        single_requests: requests(SINGLE_ROUTE),
        batched_heartbeats: metric_sum(&text, "rsc_heartbeat_batch_size_sum", &[]),
    }
}

async fn group_view(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/v1/groups/g"))
        .send()
        .await
        .expect("coordinator reachable")
        .json()
        .await
        .unwrap()
}

fn stable(view: &Value) -> bool {
    let members = view["members"].as_array().cloned().unwrap_or_default();
    let shards = view["shards"].as_array().cloned().unwrap_or_default();
    members.len() == MEMBERS
        && members.iter().all(|m| m["state"] == "stable")
        && shards.len() == SHARDS
        && shards
            .iter()
            .all(|s| !s["current_owner"].is_null() && s["current_owner"] == s["target_owner"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_heartbeats_of_a_concurrent_app_ride_the_batch_route() {
    let redis = RedisServer::start().expect("redis-server");
    let coordinator =
        CoordinatorProcess::start(&["--store", "memory", "--sweep-interval-ms", "20"])
            .expect("coordinator (cargo build -p rsc-coordinator --bin rsc-coordinator)");
    let base = coordinator.url();
    let http = rsc_e2e::http();
    let created = http
        .post(format!("{base}/v1/groups"))
        .json(
            &json!({"group": "g", "stream": "orders", "shard_count": SHARDS,
            "session_timeout_ms": 3000, "heartbeat_interval_ms": 200}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);

    let listener = Listener::new("g", "orders", |_msg: Message<Raw>| async {
        Ok::<(), HandlerError>(())
    })
    .concurrency(MEMBERS as u32)
    .block_timeout(Duration::from_millis(200));
    let app = ConsumerApp::builder()
        .coordinator(&base)
        .redis_url(redis.url())
        .instance_id("batch")
        .listener(listener)
        .build()
        .unwrap();
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));

    // Joins and converges: 8 stable members owning the 16 shards.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = group_view(&http, &base).await;
        if stable(&view) {
            break;
        }
        assert!(Instant::now() < deadline, "never converged: {view:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Steady state: every heartbeat through the batch route, several members per request.
    let start = counts(&http, &base).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let end = loop {
        let now = counts(&http, &base).await;
        if now.batch_requests - start.batch_requests >= 20.0 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "too few batch requests in steady state: {start:?} -> {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        stable(&group_view(&http, &base).await),
        "the group left steady state"
    );
    let requests = end.batch_requests - start.batch_requests;
    let heartbeats = end.batched_heartbeats - start.batched_heartbeats;
    let per_request = heartbeats / requests;
    eprintln!(
        "steady state: {requests} batch requests carrying {heartbeats} heartbeats \
         ({per_request:.2} per request); single-route requests: {}",
        end.single_requests - start.single_requests
    );
    assert_eq!(
        end.single_requests, start.single_requests,
        "steady heartbeats went through the single route"
    );
    assert!(
        per_request >= 6.0,
        "{per_request:.2} heartbeats per batch request (8 aligned members)"
    );

    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(20), join)
        .await
        .expect("graceful shutdown")
        .unwrap()
        .unwrap();
    // The leaves are single requests (8 members leave once each).
    let after = counts(&http, &base).await;
    assert!(after.single_requests - end.single_requests <= MEMBERS as f64);
    let view = group_view(&http, &base).await;
    assert_eq!(
        view["members"].as_array().map(Vec::len),
        Some(0),
        "{view:#}"
    );
}
