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
    plain_xadds(&mut con);
    finish_producer(producer, 2_000);
    assert_eq!(
        handled(&pod, 2_050.0).await,
        2_050.0,
        "handled more than once"
    );
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
    handled(&pod, 2_000.0).await;
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

/// Per node of a cluster: (connections, sharded subscriptions) of clients other than the
/// caller's own (`CLIENT LIST`'s `ssub=`).
fn node_clients(nodes: &mut [redis::Connection]) -> Vec<(usize, u64)> {
    nodes
        .iter_mut()
        .map(|con| {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query(con)
                .expect("CLIENT LIST");
            let lines: Vec<&str> = list.lines().filter(|l| !l.trim().is_empty()).collect();
            let ssub = lines
                .iter()
                .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("ssub=")))
                .filter_map(|n| n.parse::<u64>().ok())
                .sum();
            (lines.len() - 1, ssub)
        })
        .collect()
}

/// Commands a node has run so far (`INFO commandstats`), without the `XREAD`s. While the
/// pod idles only the doorbell's poll script reads with `XREAD`, one call per waiting shard
/// inside one `EVAL` per node (Redis counts a script's calls as commands): they are counted
/// apart, as work inside Redis rather than commands sent.
fn commands_and_xreads(con: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    let mut out = (0, 0);
    for line in info.lines() {
        let Some(calls) = line
            .split_once("calls=")
            .and_then(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
        else {
            continue;
        };
        if line.starts_with("cmdstat_xread:") {
            out.1 += calls;
        } else {
            out.0 += calls;
        }
    }
    out
}

/// The cluster's commands sent per second over `window` (every node), less the two `INFO`s
/// sent to each node, and the `XREAD`s run per second ([`commands_and_xreads`]).
async fn cluster_command_rate(nodes: &mut [redis::Connection], window: Duration) -> (f64, f64) {
    let sum = |nodes: &mut [redis::Connection]| {
        nodes
            .iter_mut()
            .map(commands_and_xreads)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    let before = sum(nodes);
    // The window of a negative check: how much happens while nothing should.
    tokio::time::sleep(window).await;
    let after = sum(nodes);
    let secs = window.as_secs_f64();
    (
        after.0.saturating_sub(before.0 + nodes.len() as u64) as f64 / secs,
        after.1.saturating_sub(before.1) as f64 / secs,
    )
}

/// A sample consumer pod on the Redis Cluster `cluster`, owning every shard of the group.
async fn cluster_pod(
    stack: &Stack,
    cluster: &rsc_testkit::RedisCluster,
    shared_reader: bool,
) -> Consumer {
    let flag = if shared_reader { "true" } else { "false" };
    let seeds = cluster.url();
    let pod = Consumer::start_env(
        stack,
        "127.0.0.22",
        &[
            "--group",
            GROUP,
            "--stream",
            STREAM,
            "--redis-url",
            &seeds,
            "--redis-cluster",
        ],
        &[("RSC_SHARED_READER", flag)],
    );
    stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .and_then(|c| c.get_connection())
        .expect("cluster connection");
    eventually(
        "every shard worker to create its consumer group",
        60,
        || {
            let found = (0..SHARDS)
                .filter(|&i| {
                    redis::cmd("EXISTS")
                        .arg(rsc_protocol::routing::shard_key(STREAM, i))
                        .query::<u32>(&mut con)
                        .is_ok_and(|n| n == 1)
                })
                .count();
            (found == SHARDS as usize).then_some(())
        },
    )
    .await;
    pod
}

/// On a Redis Cluster (3 masters) the pod's workers share the app's cluster connection and
/// wait on the sharded doorbell (PROTOCOL §16): each shard's channel is `SSUBSCRIBE`d on the
/// node that serves it, the pod holds a bounded number of connections per node and sends
/// about one poll command per node a second while idle; a ringing producer's entries and
/// plain `XADD`s (found by the per-node poll) are handled once each. The per-shard reader is
/// measured on a cluster of its own in the same run as the baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_a_pod_owning_1024_shards_holds_a_few_connections_per_node() {
    let _serial = SERIAL.lock().await;
    let (baseline_conns, baseline_rate) = {
        let cluster = rsc_testkit::RedisCluster::start().expect("cluster");
        let stack = Stack::start();
        stack.create_group(GROUP, STREAM, SHARDS, 6000, 500).await;
        let _pod = cluster_pod(&stack, &cluster, false).await;
        let mut nodes = node_connections(&cluster);
        let conns = eventually("a connection per shard", 60, || {
            let n: usize = node_clients(&mut nodes).iter().map(|c| c.0).sum();
            (n >= SHARDS as usize).then_some(n)
        })
        .await;
        let (sent, _) = cluster_command_rate(&mut nodes, Duration::from_secs(5)).await;
        (conns, sent)
    };

    let cluster = rsc_testkit::RedisCluster::start().expect("cluster");
    let stack = Stack::start();
    stack.create_group(GROUP, STREAM, SHARDS, 6000, 500).await;
    let pod = cluster_pod(&stack, &cluster, true).await;
    let mut nodes = node_connections(&cluster);
    // Every shard's doorbell subscribed, each on its own node.
    let clients = eventually("every doorbell channel subscribed", 30, || {
        let c = node_clients(&mut nodes);
        (c.iter().map(|c| c.1).sum::<u64>() == u64::from(SHARDS)).then_some(c)
    })
    .await;
    assert!(
        clients.iter().all(|&(conns, ssub)| conns <= 4 && ssub > 0),
        "connections and sharded subscriptions per node: {clients:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (idle, xreads) = loop {
        let (rate, xreads) = cluster_command_rate(&mut nodes, Duration::from_secs(3)).await;
        if rate <= 20.0 {
            break (rate, xreads);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod never went idle on the cluster: {rate} commands/s"
        );
    };
    assert!(
        baseline_rate > 100.0,
        "the per-shard baseline re-sends a blocked read per shard every 2 s: {baseline_rate}/s"
    );
    eprintln!(
        "D1/D2 on a 3-node cluster at {SHARDS} shards: (connections, ssub) per node {clients:?}, \
         {idle:.1} idle commands/s sent ({xreads:.0} XREADs/s inside the poll scripts; a \
         connection per shard: {baseline_conns} connections, {baseline_rate:.0} commands/s)"
    );

    // A ringing producer (SPUBLISH in the shard's slot), then plain XADDs.
    produce_on_cluster(&stack, &cluster, STREAM, 2_000, 500);
    assert_eq!(
        handled(&pod, 2_000.0).await,
        2_000.0,
        "handled more than once"
    );
    let rings = pod
        .metric("rsc_client_doorbell_rings_total", &[])
        .await
        .expect("metrics");
    assert!(rings > 0.0, "no ring reached the pod");
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .and_then(|c| c.get_connection())
        .expect("cluster connection");
    plain_xadds(&mut con);
    assert_eq!(
        handled(&pod, 2_050.0).await,
        2_050.0,
        "handled more than once"
    );
    let clients = node_clients(&mut nodes);
    assert!(
        clients.iter().all(|&(conns, _)| conns <= 4),
        "the connections stay bounded under load: {clients:?}"
    );
}

/// Writes 50 entries to shards spread over the stream with plain `XADD`s (no ring: the
/// doorbell's fallback poll finds them).
fn plain_xadds(con: &mut impl redis::ConnectionLike) {
    for i in 0..50u32 {
        let key = rsc_protocol::routing::shard_key(STREAM, (i * 37) % SHARDS);
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("payload")
            .arg(format!(r#"{{"seq":{i},"key":"plain-{i}"}}"#))
            .query(con)
            .expect("XADD");
    }
}

/// Runs a sample producer (ringing, 2,000 entries/s at most) of `count` entries over `keys`
/// keys to `stream` on `cluster`, to its end.
fn produce_on_cluster(
    stack: &Stack,
    cluster: &rsc_testkit::RedisCluster,
    stream: &str,
    count: u64,
    keys: u64,
) {
    let child =
        std::process::Command::new(rsc_testkit::binary_path("sample-producer").expect("built"))
            .args(["--coordinator", &stack.coordinator.url()])
            .args(["--redis-url", &cluster.url(), "--redis-cluster"])
            .args(["--stream", stream, "--count", &count.to_string()])
            .args(["--keys", &keys.to_string(), "--rate", "2000"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("sample-producer starts");
    finish_producer(child, count);
}

/// Waits until `pod` handled at least `n` entries of the group; how many it handled.
async fn handled(pod: &Consumer, n: f64) -> f64 {
    eventually_async("every entry handled", 60, || async {
        let got = pod
            .metric("rsc_client_messages_handled_total", &[("group", GROUP)])
            .await?;
        (got >= n).then_some(got)
    })
    .await
}

/// A connection to each node of `cluster`.
fn node_connections(cluster: &rsc_testkit::RedisCluster) -> Vec<redis::Connection> {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            redis::Client::open(n.url())
                .and_then(|c| c.get_connection())
                .expect("node connection")
        })
        .collect()
}

/// Strict fencing on a Redis Cluster: every read is a `WATCH`ed transaction on one of the
/// app's guard connections of the shard's node (2 per node), so the pod's connections per
/// node stay bounded too, and entries are handled once each. The coordinator reads the
/// cluster as data Redis (it writes the owner tokens): the pod's connections are what
/// disappears when it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_a_strictly_fenced_pod_holds_a_few_connections_per_node() {
    let _serial = SERIAL.lock().await;
    let cluster = rsc_testkit::RedisCluster::start().expect("cluster");
    let coordinator =
        rsc_testkit::CoordinatorProcess::start_on_cluster(&cluster, &["--sweep-interval-ms", "20"])
            .expect("coordinator starts");
    let api = rsc_e2e::Api::new(coordinator.url());
    let stack = Stack {
        redis: rsc_testkit::RedisServer::start().expect("redis-server starts"),
        coordinator,
        api,
    };
    stack.create_group(GROUP, STREAM, SHARDS, 6000, 500).await;
    assert_eq!(stack.group(GROUP).await["fencing"], "strict");
    let mut pod = cluster_pod(&stack, &cluster, true).await;
    produce_on_cluster(&stack, &cluster, STREAM, 2_000, 500);
    assert_eq!(
        handled(&pod, 2_000.0).await,
        2_000.0,
        "handled more than once"
    );
    let mut nodes = node_connections(&cluster);
    let with_pod = node_clients(&mut nodes);
    pod.kill9();
    let without = eventually("the pod's connections to close", 30, || {
        let c = node_clients(&mut nodes);
        c.iter()
            .zip(&with_pod)
            .all(|(now, before)| now.0 < before.0)
            .then_some(c)
    })
    .await;
    let pods: Vec<usize> = with_pod
        .iter()
        .zip(&without)
        .map(|(w, o)| w.0 - o.0)
        .collect();
    eprintln!(
        "D1 strict on a 3-node cluster at {SHARDS} shards: {pods:?} connections of the pod per \
         node ({without:?} of the coordinator)"
    );
    assert!(
        pods.iter().all(|&n| n <= 4),
        "a strictly fenced pod owning {SHARDS} shards holds {pods:?} connections per node"
    );
}

/// Moves hash slot `slot` (and its keys) from the node at `from` to the node at `to` of a
/// test cluster, as `redis-cli --cluster reshard` does: `IMPORTING`/`MIGRATING`, `MIGRATE` of
/// its keys, then the new owner announced to every node.
fn move_slot(nodes: &mut [redis::Connection], slot: u16, from: usize, to: usize, to_port: u16) {
    let id = |con: &mut redis::Connection| -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(con)
            .expect("CLUSTER MYID")
    };
    let (from_id, to_id) = (id(&mut nodes[from]), id(&mut nodes[to]));
    let setslot = |con: &mut redis::Connection, how: &str, node: &str| {
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(node)
            .query(con)
            .expect("CLUSTER SETSLOT");
    };
    setslot(&mut nodes[to], "IMPORTING", &from_id);
    setslot(&mut nodes[from], "MIGRATING", &to_id);
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut nodes[from])
        .expect("CLUSTER GETKEYSINSLOT");
    if !keys.is_empty() {
        let () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to_port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut nodes[from])
            .expect("MIGRATE");
    }
    for con in nodes.iter_mut() {
        setslot(con, "NODE", &to_id);
    }
}

/// The sharded doorbell follows a slot migration: a shard whose slot moves to another node
/// is read there, its channel is subscribed again on the new node (the old one drops it,
/// `SUNSUBSCRIBE`), and what a ringing producer writes afterwards is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_the_doorbell_follows_a_slot_migration() {
    let _serial = SERIAL.lock().await;
    let cluster = rsc_testkit::RedisCluster::start().expect("cluster");
    let stack = Stack::start();
    let stream = "moving";
    let shards = 8;
    stack.create_group(GROUP, stream, shards, 6000, 500).await;
    let seeds = cluster.url();
    let pod = Consumer::start(
        &stack,
        "127.0.0.23",
        &[
            "--group",
            GROUP,
            "--stream",
            stream,
            "--redis-url",
            &seeds,
            "--redis-cluster",
        ],
    );
    stack.wait_stable(GROUP, 1, shards as usize).await;
    let mut nodes = node_connections(&cluster);
    eventually("every doorbell channel subscribed", 30, || {
        let c = node_clients(&mut nodes);
        (c.iter().map(|c| c.1).sum::<u64>() == u64::from(shards)).then_some(())
    })
    .await;
    produce_on_cluster(&stack, &cluster, stream, 200, 100);
    assert_eq!(handled(&pod, 200.0).await, 200.0);

    // Move shard 0's slot to the next node.
    let key = rsc_protocol::routing::shard_key(stream, 0);
    let slot = rsc_redis::cluster::key_slot(key.as_bytes());
    let channel = rsc_protocol::routing::ring_channel(&key);
    let serves = |con: &mut redis::Connection| -> bool {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .query(con)
            .expect("PUBSUB SHARDCHANNELS");
        channels.contains(&channel)
    };
    let from = (0..nodes.len())
        .find(|&i| serves(&mut nodes[i]))
        .expect("the channel is subscribed on some node");
    let to = (from + 1) % nodes.len();
    let to_port = cluster.nodes()[to].port();
    move_slot(&mut nodes, slot, from, to, to_port);
    eventually("the channel subscribed on the slot's new node", 30, || {
        (serves(&mut nodes[to]) && !serves(&mut nodes[from])).then_some(())
    })
    .await;
    produce_on_cluster(&stack, &cluster, stream, 200, 100);
    assert_eq!(handled(&pod, 400.0).await, 400.0, "handled more than once");
}
