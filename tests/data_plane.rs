//! The data plane's cost (ARCHITECTURE "Data plane"): a sample consumer pod owning 1,024
//! shards holds a handful of connections to the data Redis and sends it next to nothing
//! while idle, yet handles what producers write at once (ringing producers) or within the
//! doorbell's fallback poll (a plain `XADD`). The same pod with a connection per shard
//! (`RSC_SHARED_READER=false`) is measured in the same run as the baseline.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{
    Consumer, SERIAL, Stack, eventually, eventually_async, finish_producer, spawn_producer,
};
use std::time::Duration;

const GROUP: &str = "g";
const STREAM: &str = "wide";
const SHARDS: u32 = 1024;

/// Connections to the data Redis other than the caller's own.
fn connections(con: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(con)
        .expect("CLIENT LIST");
    list.lines().filter(|l| !l.trim().is_empty()).count() - 1
}

/// Commands the data Redis has run so far (`INFO commandstats`).
fn commands(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The data Redis' commands per second over `window`, less this function's own two `INFO`s.
async fn command_rate(con: &mut redis::Connection, window: Duration) -> f64 {
    let before = commands(con);
    // The window of a negative check: how much happens while nothing should.
    tokio::time::sleep(window).await;
    let after = commands(con);
    after.saturating_sub(before + 1) as f64 / window.as_secs_f64()
}

/// How many of the stream's shard keys exist (each worker creates its consumer group with
/// `MKSTREAM`).
fn shard_keys(con: &mut redis::Connection) -> usize {
    let mut pipe = redis::pipe();
    for i in 0..SHARDS {
        pipe.cmd("EXISTS")
            .arg(rsc_protocol::routing::shard_key(STREAM, i));
    }
    let found: Vec<u32> = pipe.query(con).expect("EXISTS");
    found.into_iter().filter(|&n| n == 1).count()
}

/// The pod with its group stable over every shard and every shard worker started. `strict`:
/// the coordinator knows the data Redis and the group fences strictly (guarded reads).
async fn pod_owning_every_shard(shared_reader: bool, strict: bool) -> (Stack, Consumer) {
    let stack = if strict {
        Stack::start_with_data_redis()
    } else {
        Stack::start()
    };
    stack.create_group(GROUP, STREAM, SHARDS, 6000, 500).await;
    let fencing = if strict { "strict" } else { "lease" };
    assert_eq!(stack.group(GROUP).await["fencing"], fencing);
    let flag = if shared_reader { "true" } else { "false" };
    let pod = Consumer::start_env(
        &stack,
        "127.0.0.21",
        &["--group", GROUP, "--stream", STREAM],
        &[("RSC_SHARED_READER", flag)],
    );
    stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    let mut con = stack.redis();
    eventually(
        "every shard worker to create its consumer group",
        60,
        || (shard_keys(&mut con) == SHARDS as usize).then_some(()),
    )
    .await;
    (stack, pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_owning_1024_shards_holds_a_handful_of_connections_and_idles_for_free() {
    let _serial = SERIAL.lock().await;

    // The baseline, in the same run: a connection and a blocked read per shard.
    let (baseline_conns, baseline_rate) = {
        let (stack, _pod) = pod_owning_every_shard(false, false).await;
        let mut con = stack.redis();
        let conns = eventually("a connection per shard", 60, || {
            let n = connections(&mut con);
            (n >= SHARDS as usize).then_some(n)
        })
        .await;
        (conns, command_rate(&mut con, Duration::from_secs(5)).await)
    };
    assert!(
        baseline_rate > 100.0,
        "the per-shard baseline re-sends a blocked read per shard every 2 s: {baseline_rate}/s"
    );

    let (stack, pod) = pod_owning_every_shard(true, false).await;
    let mut con = stack.redis();
    let conns = connections(&mut con);
    assert!(
        conns <= 4,
        "a pod owning {SHARDS} shards holds {conns} connections to the data Redis"
    );
    // Once every worker has taken its shard over and read it empty, nothing but the
    // doorbell's fallback poll (one command a second) is sent.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let idle = loop {
        let rate = command_rate(&mut con, Duration::from_secs(3)).await;
        if rate <= 20.0 {
            break rate;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod never went idle: {rate} commands/s"
        );
    };
    eprintln!(
        "D1/D2 at {SHARDS} shards: {conns} connections and {idle:.1} idle commands/s \
         (a connection per shard: {baseline_conns} connections, {baseline_rate:.0} commands/s)"
    );

    // Ringing producers are handled; so is a plain XADD (found by the fallback poll).
    let producer = spawn_producer(&stack, STREAM, 2_000, 500, Some(2_000));
    for i in 0..50u32 {
        let key = rsc_protocol::routing::shard_key(STREAM, (i * 37) % SHARDS);
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("payload")
            .arg(format!(r#"{{"seq":{i},"key":"plain-{i}"}}"#))
            .query(&mut con)
            .expect("XADD");
    }
    finish_producer(producer, 2_000);
    let handled = eventually_async("every entry handled", 60, || async {
        let n = pod
            .metric("rsc_client_messages_handled_total", &[("group", GROUP)])
            .await?;
        (n >= 2_050.0).then_some(n)
    })
    .await;
    assert_eq!(handled, 2_050.0, "handled more than once");
    assert!(
        connections(&mut con) <= 4,
        "the connections stay bounded under load"
    );
}

/// Strict fencing: every read of every shard is a `WATCH`ed transaction, yet the pod's
/// connections stay bounded (the app's guard connections, shared by its shards), and entries
/// are handled. The coordinator also connects to the data Redis here: the pod's connections
/// are what disappears when it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strictly_fenced_pod_owning_1024_shards_holds_a_handful_of_connections() {
    let _serial = SERIAL.lock().await;
    let (stack, mut pod) = pod_owning_every_shard(true, true).await;
    let producer = spawn_producer(&stack, STREAM, 2_000, 500, Some(2_000));
    finish_producer(producer, 2_000);
    eventually_async("every entry handled", 60, || async {
        let n = pod
            .metric("rsc_client_messages_handled_total", &[("group", GROUP)])
            .await?;
        (n >= 2_000.0).then_some(n)
    })
    .await;
    let mut con = stack.redis();
    let with_pod = connections(&mut con);
    pod.kill9();
    let without = eventually("the pod's connections to close", 30, || {
        let n = connections(&mut con);
        (n < with_pod).then_some(n)
    })
    .await;
    let pods = with_pod - without;
    eprintln!(
        "D1 strict at {SHARDS} shards: {pods} connections of the pod ({without} of the coordinator)"
    );
    assert!(
        pods <= 4,
        "a strictly fenced pod owning {SHARDS} shards holds {pods} connections to the data Redis"
    );
}
