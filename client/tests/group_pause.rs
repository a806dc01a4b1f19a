//! The durable group pause (PROTOCOL §14) against real redis-server and real
//! coordinator processes (Redis metadata store): `rsc-coordinator group pause` stops every
//! member of every app within about one heartbeat while they keep their shards and their
//! sessions; the pause survives a rebalance (a member restarts and another joins) and a
//! coordinator restart; `group resume` lets the backlog through; the group view and the
//! `/metrics` gauge show it.
//!
//! Needs the coordinator binary: `cargo build --workspace --bins`.

use rsc_client::prelude::*;
use rsc_client::producer::Record;
use rsc_testkit::{CoordinatorProcess, RedisServer, binary_path};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

/// `rsc-coordinator group <action> g --coordinator URL --output json`: the group view.
fn cli(url: &str, action: &str) -> Value {
    let out = std::process::Command::new(binary_path("rsc-coordinator").unwrap())
        .args([
            "group",
            action,
            "g",
            "--coordinator",
            url,
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn group_view(url: &str) -> Value {
    {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    }
    .get(format!("{url}/v1/groups/g"))
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap()
}

struct App {
    handle: rsc_client::AppHandle,
    join: tokio::task::JoinHandle<Result<(), ClientError>>,
}

fn start_app(coordinator: &str, redis: &str, instance: &str, handled: &Arc<AtomicUsize>) -> App {
    let handled = handled.clone();
    let listener = Listener::new("g", "s", move |_msg: Message<Value>| {
        let handled = handled.clone();
        async move {
            handled.fetch_add(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        }
    })
    .block_timeout(Duration::from_millis(200));
    let app = ConsumerApp::builder()
        .coordinator(coordinator)
        .redis_url(redis)
        .instance_id(instance)
        .listener(listener)
        .build()
        .unwrap();
    let handle = app.handle();
    App {
        handle,
        join: tokio::spawn(app.run_until(std::future::pending())),
    }
}

async fn publish(producer: &Producer, from: u64, n: u64) {
    for i in from..from + n {
        producer
            .publish_record(
                "s",
                Record::json(&json!({"i": i})).unwrap().key(i.to_string()),
            )
            .await
            .unwrap();
    }
}

/// Owners of the group's shards, as the view says (current owners).
fn owners(view: &Value) -> Vec<Option<String>> {
    view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["current_owner"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pause_holds_every_member_through_rebalances_and_restarts() {
    let data = RedisServer::start().expect("redis-server");
    let meta = RedisServer::start().expect("redis-server");
    let args = [
        "--sweep-interval-ms",
        "20",
        "--store",
        "redis",
        "--redis-url",
        &meta.url(),
    ];
    let mut coordinator = CoordinatorProcess::start(&args).expect("coordinator");
    let url = coordinator.url();
    let resp = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    }
    .post(format!("{url}/v1/groups"))
    .json(&json!({"group": "g", "stream": "s", "shard_count": 4,
            "session_timeout_ms": 3000, "heartbeat_interval_ms": 100}))
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let producer = Producer::builder()
        .coordinator(&url)
        .redis_url(data.url())
        .build()
        .unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    // Two "pods".
    let a = start_app(&url, &data.url(), "pod-a", &handled);
    let b = start_app(&url, &data.url(), "pod-b", &handled);
    publish(&producer, 0, 20).await;
    eventually("the first 20", Duration::from_secs(15), || {
        (handled.load(Ordering::SeqCst) == 20).then_some(())
    })
    .await;
    let epoch_before = group_view(&url).await["group_epoch"].clone();

    // Pause from the CLI: the view says so at once.
    let view = cli(&url, "pause");
    assert_eq!(view["paused"], true, "{view}");
    assert!(view["paused_since_ms"].as_u64().is_some(), "{view}");
    let paused_at = Instant::now();
    eventually("both apps see the pause", Duration::from_secs(5), || {
        (a.handle.is_group_paused("g") == Some(true) && b.handle.is_group_paused("g") == Some(true))
            .then_some(())
    })
    .await;
    let took = paused_at.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "members learn it within about one heartbeat (100 ms): {took:?}"
    );
    publish(&producer, 20, 20).await;
    // Ten heartbeat intervals, and more than a blocking read: nothing is handled.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(handled.load(Ordering::SeqCst), 20);
    // Members keep their shards and their sessions; pausing is no rebalance.
    let view = group_view(&url).await;
    assert_eq!(view["group_epoch"], epoch_before, "{view}");
    assert!(owners(&view).iter().all(Option::is_some), "{view}");
    assert_eq!(view["members"].as_array().unwrap().len(), 2, "{view}");
    let metrics = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    }
    .get(format!("{url}/metrics"))
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        metrics.contains("rsc_group_paused{group=\"g\"} 1"),
        "{metrics}"
    );

    // Audited.
    let audit: Value = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    }
    .get(format!("{url}/v1/audit"))
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let pause = audit["entries"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["action"] == "group.pause"))
        .unwrap_or_else(|| panic!("no group.pause in the audit log: {audit}"));
    assert_eq!(pause["result"]["status"], 200, "{pause}");
    assert_eq!(pause["target"]["group"], "g", "{pause}");

    // A member restarts and a third app joins: rebalances, still paused.
    b.handle.shutdown();
    b.join.await.unwrap().unwrap();
    let b = start_app(&url, &data.url(), "pod-b2", &handled);
    let c = start_app(&url, &data.url(), "pod-c", &handled);
    eventually(
        "the new members see the pause",
        Duration::from_secs(10),
        || {
            (c.handle.is_group_paused("g") == Some(true)
                && b.handle.is_group_paused("g") == Some(true))
            .then_some(())
        },
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = group_view(&url).await;
        if view["state"] == "stable" && view["members"].as_array().unwrap().len() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no stable group of three: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The coordinator restarts (same port, same store): still paused.
    let addr = coordinator.addr().to_string();
    coordinator.terminate(Duration::from_secs(5)).unwrap();
    let coordinator = CoordinatorProcess::start_listening(&addr, &args).expect("coordinator");
    assert_eq!(coordinator.url(), url);
    assert_eq!(group_view(&url).await["paused"], true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(handled.load(Ordering::SeqCst), 20);
    for app in [&a, &b, &c] {
        assert_eq!(app.handle.is_group_paused("g"), Some(true));
    }

    // Resume: the backlog goes through.
    let view = cli(&url, "resume");
    assert_eq!(view["paused"], false, "{view}");
    eventually("the 20 held back", Duration::from_secs(15), || {
        (handled.load(Ordering::SeqCst) == 40).then_some(())
    })
    .await;
    for app in [a, b, c] {
        app.handle.shutdown();
        app.join.await.unwrap().unwrap();
    }
}
