//! Strict fencing on the data path (PROTOCOL §5.6, docs/FENCING.md), with real processes: a data Redis, a
//! coordinator with `--data-redis-url` (so groups default to `fencing: strict`) and
//! `sample-consumer` pods. A member that was paused past its session (SIGSTOP), or cut off
//! from the coordinator, can neither read nor acknowledge once its shard moved on; its
//! in-flight entries are handled by the successor and nothing is lost.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods;

use crate::pods::{
    Consumer, SERIAL, Stack, eventually, eventually_async, finish_producer, handled, spawn_producer,
};
use rsc_e2e::Api;
use rsc_testkit::{CoordinatorProcess, RedisServer, Signal, signal};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

const GROUP: &str = "g";
const STREAM: &str = "orders";
const SHARD_KEY: &str = "orders:0";
const RECORD: &str = "handled";
const SESSION_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;

/// A data Redis and a coordinator that writes owner tokens to it; a one-shard group.
async fn stack() -> Stack {
    stack_with(1).await
}

/// The same with `shards` shards.
async fn stack_with(shards: u32) -> Stack {
    let redis = RedisServer::start().expect("redis-server starts");
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "memory",
        "--sweep-interval-ms",
        "20",
        "--data-redis-url",
        &redis.url(),
    ])
    .expect("coordinator starts");
    let api = Api::new(coordinator.url());
    let stack = Stack {
        redis,
        coordinator,
        api,
    };
    stack
        .create_group(GROUP, STREAM, shards, SESSION_MS, HEARTBEAT_MS)
        .await;
    let g = stack.group(GROUP).await;
    assert_eq!(g["fencing"], "strict", "default with a data Redis: {g}");
    stack
}

fn consumer_args(record: bool) -> Vec<&'static str> {
    let mut a = vec![
        "--group",
        GROUP,
        "--stream",
        STREAM,
        "--concurrency",
        "1",
        "--handle-ms",
        "50",
    ];
    if record {
        a.extend(["--record-stream", RECORD]);
    }
    a
}

fn members(g: &Value) -> Vec<String> {
    g["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["member_id"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until `member` is the group's only member, stable, owning the shard.
async fn wait_sole_owner(stack: &Stack, member: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let g = stack.group(GROUP).await;
        if members(&g) == [member]
            && g["members"][0]["state"] == "stable"
            && g["members"][0]["owned_shards"] == json!([0])
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{member} never became the sole owner: {g:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `(pending, lag)` of the group on the shard (`XINFO GROUPS`).
fn group_numbers(con: &mut redis::Connection) -> (u64, Option<u64>) {
    pods::group_on_shard(con, SHARD_KEY, GROUP)
}

/// Entries pending for one consumer (`XINFO CONSUMERS`), 0 when it is unknown.
fn consumer_pending(con: &mut redis::Connection, member: &str) -> u64 {
    let info: redis::streams::StreamInfoConsumersReply = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(SHARD_KEY)
        .arg(GROUP)
        .query(con)
        .expect("XINFO CONSUMERS");
    info.consumers
        .iter()
        .find(|c| c.name == member)
        .map_or(0, |c| c.pending as u64)
}

/// Every seq in `0..count` recorded, and nothing pending in the group.
async fn wait_all_done(stack: &Stack, count: u64) -> Vec<pods::Handled> {
    let mut con = stack.redis();
    eventually("every seq handled and acknowledged", 60, || {
        let h = handled(&mut con, RECORD);
        let seqs: BTreeSet<u64> = h.iter().map(|r| r.seq).collect();
        let (pending, lag) = group_numbers(&mut con);
        (seqs.len() as u64 == count && pending == 0 && lag == Some(0)).then_some(h)
    })
    .await
}

#[tokio::test]
async fn a_member_paused_past_its_session_can_neither_read_nor_ack() {
    let _serial = SERIAL.lock().await;
    let stack = stack().await;
    let producer = spawn_producer(&stack, STREAM, 60, 7, None);
    finish_producer(producer, 60);
    let mut con = stack.redis();

    let a = Consumer::start(&stack, "127.0.0.31", &consumer_args(true));
    let a_id = a.member_ids(GROUP, 1).remove(0);
    eventually("A handles a few entries", 30, || {
        (handled(&mut con, RECORD).len() >= 5).then_some(())
    })
    .await;
    signal(a.pid(), Signal::SIGSTOP).expect("SIGSTOP");
    let stopped_ms = pods::now_ms();

    // A expires; B takes the shard over (and A's pending entries with it).
    let mut b = Consumer::start(&stack, "127.0.0.32", &consumer_args(true));
    let b_id = b.member_ids(GROUP, 1).remove(0);
    wait_sole_owner(&stack, &b_id).await;
    wait_all_done(&stack, 60).await;

    // B is frozen for less than its session (it keeps the shard); new entries wait unread.
    signal(b.pid(), Signal::SIGSTOP).expect("SIGSTOP B");
    let producer = spawn_producer(&stack, STREAM, 30, 7, None);
    finish_producer(producer, 30);
    // A wakes up with a handler in flight: its acknowledgement and any read are refused.
    let woken_ms = pods::now_ms();
    signal(a.pid(), Signal::SIGCONT).expect("SIGCONT");
    let labels = [("group", GROUP)];
    eventually_async("A's data-path refusal", 10, || async {
        let n = a
            .metric("rsc_client_fencing_refusals_total", &labels)
            .await?;
        (n > 0.0).then_some(())
    })
    .await;
    let (pending, lag) = group_numbers(&mut con);
    assert_eq!(
        (pending, lag),
        (0, Some(30)),
        "the woken member read nothing: the 30 new entries are neither pending nor delivered"
    );
    assert_eq!(consumer_pending(&mut con, &a_id), 0);
    signal(b.pid(), Signal::SIGCONT).expect("SIGCONT B");

    // Nothing lost: the second batch is handled too (seqs restart at 0: 60 + 30 records
    // cover seqs 0..60 once more; count distinct entry ids instead).
    let records = eventually("all 90 entries handled and acknowledged", 60, || {
        let h = handled(&mut con, RECORD);
        let ids: BTreeSet<&str> = h.iter().map(|r| r.entry_id.as_str()).collect();
        let (pending, lag) = group_numbers(&mut con);
        (ids.len() == 90 && pending == 0 && lag == Some(0)).then_some(h)
    })
    .await;
    assert_eq!(consumer_pending(&mut con, &a_id), 0);
    for r in records.iter().filter(|r| r.member == a_id) {
        // (SIGSTOP takes effect a moment after `kill` returns: compare with the wake-up.)
        assert!(
            r.started_ms < woken_ms,
            "the fenced member started handling {} at {} after it was woken at {woken_ms} \
             (paused at {stopped_ms})",
            r.entry_id,
            r.started_ms
        );
        if r.finished_ms > stopped_ms {
            // In flight when A was paused: the successor handled it as well.
            assert!(
                records
                    .iter()
                    .any(|o| o.entry_id == r.entry_id && o.member == b_id),
                "in-flight entry {} not handled by the successor",
                r.entry_id
            );
        }
    }
    b.terminate();
}

#[tokio::test]
async fn a_member_cut_off_from_the_coordinator_stops_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let stack = stack().await;
    let producer = spawn_producer(&stack, STREAM, 80, 7, None);
    finish_producer(producer, 80);
    let mut con = stack.redis();
    let proxy = rsc_e2e::Proxy::start(stack.coordinator.addr().to_string())
        .await
        .expect("proxy");
    let proxy_url = format!("http://{}", proxy.addr());
    // A talks to the coordinator through the proxy only.
    let a = Consumer::start_via(&stack, &proxy_url, "127.0.0.41", &consumer_args(true));
    let a_id = a.member_ids(GROUP, 1).remove(0);
    eventually("A handles a few entries", 30, || {
        (handled(&mut con, RECORD).len() >= 5).then_some(())
    })
    .await;
    proxy.cut();
    let cut_ms = pods::now_ms();
    let b = Consumer::start(&stack, "127.0.0.42", &consumer_args(true));
    let b_id = b.member_ids(GROUP, 1).remove(0);
    wait_sole_owner(&stack, &b_id).await;
    let granted_ms = pods::now_ms();
    let records = wait_all_done(&stack, 80).await;
    assert_eq!(consumer_pending(&mut con, &a_id), 0);
    let b_first = records
        .iter()
        .filter(|r| r.member == b_id)
        .map(|r| r.started_ms)
        .min()
        .expect("B handled entries");
    for r in records.iter().filter(|r| r.member == a_id) {
        assert!(
            r.started_ms < b_first.min(granted_ms),
            "cut-off member started {} at {} after the shard moved (cut at {cut_ms}, B from {b_first})",
            r.entry_id,
            r.started_ms
        );
    }
    assert!(
        a.metric("rsc_client_self_fenced_total", &[("group", GROUP)])
            .await
            .expect("A's metrics")
            >= 1.0,
        "A stopped on its lease"
    );
}

#[tokio::test]
async fn fencing_mode_is_validated_and_defaults_to_lease_without_a_data_redis() {
    let stack = rsc_e2e::Stack::start(rsc_e2e::Backend::Memory, &[]);
    let (s, body) = stack
        .api
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s", "shard_count": 1, "fencing": "bogus"}),
        )
        .await;
    assert_eq!((s.as_u16(), rsc_e2e::code(&body)), (400, "INVALID_REQUEST"));
    let (s, body) = stack
        .api
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s", "shard_count": 1, "fencing": "strict"}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), rsc_e2e::code(&body)),
        (400, "INVALID_REQUEST"),
        "strict needs --data-redis-url: {body}"
    );
    let (s, body) = stack
        .api
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s", "shard_count": 1}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    assert_eq!(body["fencing"], "lease");
    let (s, hb) = stack.api.heartbeat("g1", "m1", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    assert!(hb.get("owner_tokens").is_none(), "lease: no tokens: {hb}");
}

/// Heartbeats the coordinator answered on the steady path so far (its store metrics).
async fn steady_touches(stack: &Stack) -> u64 {
    let metrics = rsc_e2e::http()
        .get(format!("{}/metrics", stack.coordinator.url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"rsc_store_operation_duration_seconds_count{operation="touch_steady"} "#,
            )
        })
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Member `m1` joins: its answer and the owner token it was given for shard 0.
async fn join_m1(stack: &Stack) -> (Value, String) {
    let (s, hb) = stack.api.heartbeat(GROUP, "m1", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    let token = hb["owner_tokens"]["0"]
        .as_str()
        .expect("a token")
        .to_owned();
    (hb, token)
}

#[tokio::test]
async fn owner_tokens_are_written_before_the_answer_and_repaired_once_lost() {
    let stack = stack().await;
    let mut con = stack.redis();
    let owner_key = rsc_protocol::routing::owner_key(SHARD_KEY, GROUP);
    let (hb, token) = join_m1(&stack).await;
    let stored: Option<String> = redis::cmd("GET").arg(&owner_key).query(&mut con).unwrap();
    assert_eq!(
        stored.as_deref(),
        Some(token.as_str()),
        "written before the answer"
    );
    // The member starts the shard and says so: from then on its heartbeats change nothing.
    let epoch = hb["member_epoch"].as_i64().unwrap();
    let (s, hb) = stack.api.heartbeat(GROUP, "m1", epoch, &[0]).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    let steady_before = steady_touches(&stack).await;
    // Lost (e.g. a data Redis restarted without persistence): repaired by the member's first
    // heartbeat after the coordinator heard of it (Redis's invalidation of the tracked key,
    // PROTOCOL §5.6: on its way, not yet handled, when the DEL returns).
    let _: () = redis::cmd("DEL").arg(&owner_key).query(&mut con).unwrap();
    let mut sent = 0u64;
    eventually_async("the lost token repaired by a heartbeat", 10, || {
        sent += 1;
        let (api, owner_key, token) = (&stack.api, &owner_key, &token);
        let mut con = stack.redis();
        async move {
            let (s, hb) = api.heartbeat(GROUP, "m1", epoch, &[0]).await;
            assert_eq!(s.as_u16(), 200, "{hb}");
            assert_eq!(
                hb["owner_tokens"]["0"],
                token.as_str(),
                "same grant, same token"
            );
            let stored: Option<String> = redis::cmd("GET").arg(owner_key).query(&mut con).unwrap();
            (stored.as_deref() == Some(token.as_str())).then_some(())
        }
    })
    .await;
    // Those heartbeats changed nothing: they were answered on the steady path (one
    // conditional liveness touch, no group lock), which re-asserts tokens too.
    assert_eq!(
        steady_touches(&stack).await,
        steady_before + sent,
        "answered on the steady path"
    );
    assert!(
        stack
            .api
            .metric("rsc_fencing_token_invalidations_total", &[])
            .await
            >= 1.0,
        "the invalidation is counted"
    );
    // A later grant's token is never replaced by an earlier one.
    let later = format!("{}:{}:other", u64::MAX / 4, 1);
    let _: () = redis::cmd("SET")
        .arg(&owner_key)
        .arg(&later)
        .query(&mut con)
        .unwrap();
    let (s, _) = stack.api.heartbeat(GROUP, "m1", epoch, &[0]).await;
    assert_eq!(s.as_u16(), 200);
    let stored: Option<String> = redis::cmd("GET").arg(&owner_key).query(&mut con).unwrap();
    assert_eq!(stored.as_deref(), Some(later.as_str()));
    // Switched to lease: no tokens any more.
    let (s, view) = stack
        .api
        .call(
            reqwest::Method::PATCH,
            &format!("/v1/groups/{GROUP}"),
            Some(json!({"fencing": "lease"})),
        )
        .await;
    assert_eq!(s.as_u16(), 200, "{view}");
    assert_eq!(view["fencing"], "lease");
    let epoch = view["members"][0]["member_epoch"].as_i64().unwrap();
    let (s, hb) = stack.api.heartbeat(GROUP, "m1", epoch, &[0]).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    assert!(hb.get("owner_tokens").is_none(), "{hb}");
}

/// Steady touches the coordinator made for batches (`POST /v1/heartbeats`) so far.
async fn steady_batch_touches(stack: &Stack) -> f64 {
    stack
        .api
        .metric(
            "rsc_store_operation_duration_seconds_count",
            &[("operation", "touch_steady_batch")],
        )
        .await
}

#[tokio::test]
async fn a_batch_of_steady_heartbeats_re_asserts_the_owner_tokens() {
    let stack = stack().await;
    let mut con = stack.redis();
    let owner_key = rsc_protocol::routing::owner_key(SHARD_KEY, GROUP);
    let (hb, token) = join_m1(&stack).await;
    let epoch = hb["member_epoch"].as_i64().unwrap();
    let (s, hb) = stack.api.heartbeat(GROUP, "m1", epoch, &[0]).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    let batches_before = steady_batch_touches(&stack).await;
    // The token is lost; the next batch, both of whose items are steady (PROTOCOL §6: each
    // answered as the single route would), repairs it before answering.
    // (Once the coordinator heard of the loss: PROTOCOL §5.6.)
    let _: () = redis::cmd("DEL").arg(&owner_key).query(&mut con).unwrap();
    let item = json!({"group": GROUP, "heartbeat": {"protocol_version": 1, "member_id": "m1",
        "member_epoch": epoch, "owned_shards": [0]}});
    let mut sent = 0.0;
    eventually_async("the lost token repaired by a batch", 10, || {
        sent += 1.0;
        let (api, owner_key, token, item) = (&stack.api, &owner_key, &token, &item);
        let mut con = stack.redis();
        async move {
            let (s, v) = api
                .call(
                    reqwest::Method::POST,
                    "/v1/heartbeats",
                    Some(json!({"heartbeats": [item, item]})),
                )
                .await;
            assert_eq!(s.as_u16(), 200, "{v}");
            let results = v["results"].as_array().expect("results");
            assert_eq!(results.len(), 2, "{v}");
            for r in results {
                assert_eq!(r["status"], 200, "{v}");
                assert_eq!(r["response"]["member_epoch"], epoch, "{v}");
                assert_eq!(
                    r["response"]["owner_tokens"]["0"],
                    token.as_str(),
                    "same grant, same token: {v}"
                );
            }
            let stored: Option<String> = redis::cmd("GET").arg(owner_key).query(&mut con).unwrap();
            (stored.as_deref() == Some(token.as_str())).then_some(())
        }
    })
    .await;
    assert_eq!(
        steady_batch_touches(&stack).await,
        batches_before + sent,
        "both items of each batch answered on the steady path, with one touch call"
    );
}

#[tokio::test]
async fn strict_groups_rebalance_without_refusals_or_losses() {
    let _serial = SERIAL.lock().await;
    let stack = stack_with(4).await;
    let producer = spawn_producer(&stack, STREAM, 200, 50, None);
    finish_producer(producer, 200);
    let a = Consumer::start(&stack, "127.0.0.51", &consumer_args(true));
    stack.wait_stable(GROUP, 1, 4).await;
    // B joins: A revokes two shards (finishing and acknowledging with its tokens), B takes
    // them over with new tokens.
    let b = Consumer::start(&stack, "127.0.0.52", &consumer_args(true));
    stack.wait_stable(GROUP, 2, 4).await;
    let mut con = stack.redis();
    eventually("all 200 entries handled and acknowledged", 60, || {
        let h = handled(&mut con, RECORD);
        // Entry ids are per shard key: two shards may hold the same id.
        let ids: BTreeSet<(u32, &str)> = h.iter().map(|r| (r.shard, r.entry_id.as_str())).collect();
        let done = (0..4).all(|s| {
            let info: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(format!("{STREAM}:{s}"))
                .query(&mut con)
                .expect("XINFO GROUPS");
            info.groups
                .iter()
                .any(|g| g.name == GROUP && g.pending == 0 && g.lag == Some(0))
        });
        (ids.len() == 200 && done).then_some(())
    })
    .await;
    for pod in [&a, &b] {
        let refusals = pod
            .metric("rsc_client_fencing_refusals_total", &[])
            .await
            .expect("the pod's metrics");
        assert_eq!(
            refusals,
            0.0,
            "a rightful owner was refused: {:#?}",
            pod.log()
        );
    }
}

/// A data Redis that is a Redis Cluster (`--data-redis-cluster`, seed URLs separated by
/// commas): the owner keys of one assignment live in different slots, on different nodes.
/// Every token is written before the answer, a lost one is repaired by the next heartbeat,
/// and lag is read from the shard keys on their nodes.
#[tokio::test]
async fn owner_tokens_on_a_redis_cluster_data_redis() {
    const SHARDS: u32 = 6;
    let cluster = rsc_testkit::RedisCluster::shared().expect("cluster starts");
    let coordinator =
        CoordinatorProcess::start_on_cluster(cluster, &[]).expect("coordinator starts");
    let api = Api::new(coordinator.url());
    let (group, stream) = ("gc", format!("cl{}", std::process::id()));
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": stream, "shard_count": SHARDS, "fencing": "strict"}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    let owner_key =
        |shard: u32| rsc_protocol::routing::owner_key(&format!("{stream}:{shard}"), group);
    let get = |con: &mut redis::cluster::ClusterConnection, key: &str| -> Option<String> {
        redis::cmd("GET").arg(key).query(con).unwrap()
    };

    let (s, hb) = api.heartbeat(group, "m1", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    let tokens = hb["owner_tokens"].as_object().expect("tokens").clone();
    assert_eq!(tokens.len(), SHARDS as usize, "{hb}");
    for shard in 0..SHARDS {
        let token = tokens[&shard.to_string()].as_str().expect("a token");
        assert_eq!(
            get(&mut con, &owner_key(shard)).as_deref(),
            Some(token),
            "shard {shard} written before the answer"
        );
    }
    // The keys really are spread over the cluster's nodes.
    let nodes: BTreeSet<u16> = (0..SHARDS)
        .map(|shard| {
            cluster
                .nodes()
                .iter()
                .find(|n| {
                    let mut c = redis::Client::open(n.url())
                        .unwrap()
                        .get_connection()
                        .unwrap();
                    redis::cmd("EXISTS")
                        .arg(owner_key(shard))
                        .query::<i64>(&mut c)
                        .is_ok_and(|e| e == 1)
                })
                .expect("a node holds the key")
                .port()
        })
        .collect();
    assert!(nodes.len() > 1, "owner keys on several nodes: {nodes:?}");

    // Lost tokens (a node restarted without persistence): repaired by the next heartbeat.
    for shard in [0, SHARDS - 1] {
        let () = redis::cmd("DEL")
            .arg(owner_key(shard))
            .query::<i64>(&mut con)
            .map(|_| ())
            .unwrap();
    }
    let epoch = hb["member_epoch"].as_i64().unwrap();
    let owned: Vec<u32> = (0..SHARDS).collect();
    let (s, hb) = api.heartbeat(group, "m1", epoch, &owned).await;
    assert_eq!(s.as_u16(), 200, "{hb}");
    for shard in 0..SHARDS {
        assert_eq!(
            get(&mut con, &owner_key(shard)).as_deref(),
            tokens[&shard.to_string()].as_str(),
            "shard {shard} repaired (same grant, same token)"
        );
    }

    // Lag per shard, read from each shard key's node.
    for shard in [1, 4] {
        let key = format!("{stream}:{shard}");
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query::<String>(&mut con)
            .map(|_| ())
            .unwrap();
        for i in 0..=shard {
            let _: String = redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg("n")
                .arg(i)
                .query(&mut con)
                .unwrap();
        }
    }
    let (s, view) = api.get(&format!("/v1/groups/{group}")).await;
    assert_eq!(s.as_u16(), 200, "{view}");
    let lag = |shard: u32| {
        view["shards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["shard"] == shard)
            .map(|s| s["lag"].clone())
    };
    assert_eq!(lag(1), Some(json!(2)), "{view}");
    assert_eq!(lag(4), Some(json!(5)), "{view}");
    assert_eq!(lag(0), Some(Value::Null), "no stream, no lag: {view}");
}

#[test]
fn a_cluster_data_redis_needs_the_flag() {
    let cluster = rsc_testkit::RedisCluster::shared().expect("cluster starts");
    // Several seed URLs without --data-redis-cluster: a configuration error.
    let Err(err) = CoordinatorProcess::start(&["--data-redis-url", &cluster.url()]) else {
        panic!("the coordinator started without --data-redis-cluster")
    };
    assert!(err.to_string().contains("--data-redis-cluster"), "{err}");
    // One URL of a cluster node without the flag: refused once the node answers.
    let Err(err) = CoordinatorProcess::start(&["--data-redis-url", &cluster.urls()[0]]) else {
        panic!("the coordinator started without --data-redis-cluster")
    };
    assert!(err.to_string().contains("--data-redis-cluster"), "{err}");
}
