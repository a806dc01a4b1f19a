//! Consumer lifecycle on real processes: departed members' Redis consumers are cleaned up,
//! static members survive a rolling restart without moving shards, and a second process
//! claiming a live static id is refused and exits non-zero.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods;

use crate::pods::{
    Consumer, Handled, SERIAL, Stack, eventually, finish_producer, handled, now_ms, spawn_producer,
    xlen,
};
use redis::streams::StreamInfoConsumersReply;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

const GROUP: &str = "g";
const STREAM: &str = "orders";
const RECORD: &str = "handled";
/// A sample pod of the group that records every handling.
const POD_ARGS: [&str; 6] = [
    "--group",
    GROUP,
    "--stream",
    STREAM,
    "--record-stream",
    RECORD,
];

/// The consumers (name, pending) of the group on every shard of the stream.
fn consumers(con: &mut redis::Connection, shards: u32) -> BTreeMap<u32, Vec<(String, usize)>> {
    (0..shards)
        .map(|s| {
            let key = rsc_protocol::routing::shard_key(STREAM, s);
            let info: StreamInfoConsumersReply = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(&key)
                .arg(GROUP)
                .query(con)
                .unwrap_or_default();
            let list = info
                .consumers
                .into_iter()
                .map(|c| (c.name, c.pending))
                .collect();
            (s, list)
        })
        .collect()
}

/// Every `(key, seq)` the producer wrote was handled at least once.
fn assert_none_lost(records: &[Handled], count: u64) {
    let seen: BTreeSet<u64> = records.iter().map(|r| r.seq).collect();
    let missing: Vec<u64> = (0..count).filter(|s| !seen.contains(s)).take(10).collect();
    assert!(
        missing.is_empty(),
        "entries never handled, e.g. {missing:?}"
    );
}

async fn wait_handled(stack: &Stack, count: u64) -> Vec<Handled> {
    let mut con = stack.redis();
    eventually("every entry handled", 90, || {
        let records = handled(&mut con, RECORD);
        let distinct: BTreeSet<u64> = records.iter().map(|r| r.seq).collect();
        (distinct.len() as u64 >= count).then_some(records)
    })
    .await
}

/// 50 pods join, read, and are killed with SIGKILL under new pod ids (as a Deployment's
/// pods are) while a producer writes: each shard's consumers end at its live owner, at
/// most one more being cleaned, and nothing is lost.
#[tokio::test]
async fn killed_pods_leave_no_consumers_behind_and_nothing_is_lost() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 8;
    const PODS: usize = 50;
    let stack = Stack::start_with_data_redis();
    stack.create_group(GROUP, STREAM, SHARDS, 1000, 200).await;
    let member_args = POD_ARGS;
    let _stable = Consumer::start(&stack, "127.0.0.20", &member_args);
    stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    let count = 3_000;
    let producer = spawn_producer(&stack, STREAM, count, 64, Some(100));
    let mut con = stack.redis();

    // Two churning pods at a time: start the next, wait until it has read a shard (its
    // consumer exists in Redis), then kill the previous one.
    let mut previous: Option<Consumer> = None;
    let started = now_ms();
    for i in 0..PODS {
        let ip = format!("127.0.1.{}", i + 1);
        let pod = Consumer::start(&stack, &ip, &member_args);
        let name = format!("{ip}-{GROUP}-0");
        eventually(&format!("pod {ip} reading a shard"), 30, || {
            consumers(&mut con, SHARDS)
                .values()
                .any(|cs| cs.iter().any(|(n, _)| *n == name))
                .then_some(())
        })
        .await;
        if let Some(mut p) = previous.take() {
            p.kill9();
        }
        previous = Some(pod);
    }
    if let Some(mut p) = previous.take() {
        p.kill9();
    }
    let churn_ms = now_ms() - started;
    finish_producer(producer, count);
    stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    let records = wait_handled(&stack, count).await;
    assert_none_lost(&records, count);

    let live = format!("127.0.0.20-{GROUP}-0");
    // The last takeovers ran: every shard is back with the stable pod, which cleaned up.
    let end = eventually("departed consumers cleaned up", 30, || {
        let c = consumers(&mut con, SHARDS);
        c.values().all(|cs| cs.len() <= 2).then_some(c)
    })
    .await;
    let ghosts: usize = end
        .values()
        .map(|cs| cs.iter().filter(|(n, _)| *n != live).count())
        .sum();
    let with_pending: Vec<_> = end
        .values()
        .flatten()
        .filter(|(n, p)| *n != live && *p > 0)
        .collect();
    eprintln!(
        "{PODS} pods killed and replaced in {churn_ms} ms: {ghosts} departed consumers left \
         over {SHARDS} shards (without cleanup: up to {} per shard); per shard: {end:?}",
        PODS + 1
    );
    assert!(
        with_pending.is_empty(),
        "every departed consumer's entries were claimed: {with_pending:?}"
    );
    for (shard, cs) in &end {
        assert!(
            cs.len() <= 2,
            "shard {shard}: {} consumers for 1 live member: {cs:?}",
            cs.len()
        );
    }
    // The group view shows what is left, per shard.
    let view = stack.group(GROUP).await;
    let stale: usize = view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stale_consumers"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(stale, ghosts, "{view:#}");
}

/// How many times a shard's handler changed member, from the record stream (in handling
/// order per shard).
fn hand_overs(records: &[Handled]) -> usize {
    let mut by_shard: HashMap<u32, Vec<&Handled>> = HashMap::new();
    for r in records {
        by_shard.entry(r.shard).or_default().push(r);
    }
    by_shard
        .values_mut()
        .map(|rs| {
            rs.sort_by_key(|r| (r.started_ms, r.entry_id.clone()));
            rs.windows(2).filter(|w| w[0].member != w[1].member).count()
        })
        .sum()
}

/// A rolling restart of three pods (SIGTERM, then the pod back under its identity), while a
/// producer writes. Returns the hand-overs between members seen in the record stream and,
/// per restart, how long the restarted pod's shards went unhandled.
async fn rolling_restart(static_ids: bool) -> (usize, Vec<u64>) {
    const SHARDS: u32 = 12;
    let stack = Stack::start();
    stack.create_group(GROUP, STREAM, SHARDS, 6000, 300).await;
    let pod_args = |i: usize, generation: usize| -> (String, Vec<String>) {
        let mut args: Vec<String> = [
            "--group",
            GROUP,
            "--stream",
            STREAM,
            "--record-stream",
            RECORD,
        ]
        .map(String::from)
        .to_vec();
        // A Deployment's replacement pod gets a new IP; a StatefulSet's keeps its name.
        let ip = format!("127.0.{}.{}", 2 + generation, 10 + i);
        if static_ids {
            args.extend(["--static-id".into(), format!("orders-{i}")]);
        }
        (ip, args)
    };
    let start = |i: usize, generation: usize| {
        let (ip, args) = pod_args(i, generation);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Consumer::start(&stack, &ip, &args)
    };
    let member_of = |i: usize, generation: usize| {
        if static_ids {
            format!("orders-{i}-{GROUP}-0")
        } else {
            format!("{}-{GROUP}-0", pod_args(i, generation).0)
        }
    };
    let mut pods: Vec<Consumer> = (0..3).map(|i| start(i, 0)).collect();
    stack.wait_stable(GROUP, 3, SHARDS as usize).await;
    let count = 4_000;
    let producer = spawn_producer(&stack, STREAM, count, 48, Some(400));
    let mut con = stack.redis();
    eventually("the producer under way", 30, || {
        (xlen(&mut con, RECORD) >= 200).then_some(())
    })
    .await;
    let mut restarts = Vec::new();
    for (i, pod) in pods.iter_mut().enumerate() {
        let t0 = now_ms();
        let status = pod.terminate();
        assert!(status.success(), "SIGTERM exits 0, got {status}");
        *pod = start(i, 1);
        let member = member_of(i, 1);
        // Back: the restarted pod handles entries again.
        eventually(&format!("{member} handling again"), 30, || {
            handled(&mut con, RECORD)
                .iter()
                .any(|r| r.member == member && r.started_ms >= t0)
                .then_some(())
        })
        .await;
        stack.wait_stable(GROUP, 3, SHARDS as usize).await;
        restarts.push(t0);
    }
    finish_producer(producer, count);
    let records = wait_handled(&stack, count).await;
    assert_none_lost(&records, count);
    // Unhandled time of each restarted pod's shards: from the SIGTERM to the first entry
    // handled on each of them afterwards, worst shard.
    let unread: Vec<u64> = restarts
        .iter()
        .enumerate()
        .map(|(i, t0)| {
            let before = member_of(i, 0);
            let shards: BTreeSet<u32> = records
                .iter()
                .filter(|r| r.member == before)
                .map(|r| r.shard)
                .collect();
            shards
                .iter()
                .filter_map(|s| {
                    records
                        .iter()
                        .filter(|r| r.shard == *s && r.started_ms >= *t0)
                        .map(|r| r.started_ms - t0)
                        .min()
                })
                .max()
                .unwrap_or(0)
        })
        .collect();
    (hand_overs(&records), unread)
}

/// A StatefulSet-style rolling restart of static pods moves no shard between members; the
/// same restart of dynamic pods (today's behaviour) is printed beside it as the baseline.
#[tokio::test]
async fn rolling_restart_of_static_pods_moves_no_shards() {
    let _serial = SERIAL.lock().await;
    let (dynamic_moves, dynamic_unread) = rolling_restart(false).await;
    let (static_moves, static_unread) = rolling_restart(true).await;
    eprintln!(
        "rolling restart of 3 pods, 12 shards: hand-overs between members static {static_moves} \
         vs dynamic {dynamic_moves}; worst unread time per restart (ms) static \
         {static_unread:?} vs dynamic {dynamic_unread:?}"
    );
    assert_eq!(static_moves, 0, "a static rolling restart moves no shard");
    assert!(
        dynamic_moves > 0,
        "the dynamic baseline moves shards (else the test measures nothing)"
    );
}

/// A second live process claiming a static id is refused, reads nothing, and exits non-zero;
/// after the holder crashes, a process with the id joins once the holder's session ran out.
#[tokio::test]
async fn a_duplicate_static_id_is_refused_and_exits_non_zero() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 4;
    let stack = Stack::start();
    stack.create_group(GROUP, STREAM, SHARDS, 1500, 200).await;
    let args = ["--group", GROUP, "--stream", STREAM, "--static-id", "dup"];
    let member = format!("dup-{GROUP}-0");
    let mut holder = Consumer::start(&stack, "127.0.0.31", &args);
    let view = stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    let epoch = view["members"][0]["member_epoch"].clone();

    let mut duplicate = Consumer::start(&stack, "127.0.0.32", &args);
    eventually("the duplicate refused", 20, || {
        duplicate
            .log()
            .iter()
            .any(|l| l.contains("MEMBER_ID_IN_USE"))
            .then_some(())
    })
    .await;
    let status = duplicate.wait_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "a process refused its static id must exit non-zero, got {status}"
    );
    // The holder kept its member, epoch and every shard throughout.
    let view = stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    assert_eq!(view["members"][0]["member_id"], member.as_str());
    assert_eq!(view["members"][0]["member_epoch"], epoch);
    assert!(view["members"][0]["is_static"].as_bool().unwrap_or(false));

    // The holder crashes; its replacement is refused until the old session ran out, then
    // joins on its own.
    holder.kill9();
    let crashed = now_ms();
    let replacement = Consumer::start(&stack, "127.0.0.33", &args);
    eventually("the replacement joined", 30, || {
        replacement
            .log()
            .iter()
            .any(|l| l.contains("joined the group"))
            .then_some(())
    })
    .await;
    let waited = now_ms() - crashed;
    let refused = replacement
        .log()
        .iter()
        .any(|l| l.contains("MEMBER_ID_IN_USE"));
    eprintln!(
        "replacement of a crashed static pod joined {waited} ms after the crash (refused while \
         the old session ran: {refused})"
    );
    let view = stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    assert_eq!(view["members"][0]["member_id"], member.as_str());
}

/// Two processes with the same member ids (the same `POD_IP`, a newcomer's first mistake when
/// running two instances on one machine): the second names another process run at join, is
/// refused (`MEMBER_ID_IN_USE`) once the first run's session would have ended, and exits
/// non-zero; the first keeps its members, epochs and shards, and handles every entry once.
#[tokio::test]
async fn a_duplicated_dynamic_process_exits_non_zero_and_costs_the_holder_nothing() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 8;
    let stack = Stack::start();
    stack.create_group(GROUP, STREAM, SHARDS, 1500, 200).await;
    let args = [
        "--group",
        GROUP,
        "--stream",
        STREAM,
        "--concurrency",
        "2",
        "--record-stream",
        RECORD,
    ];
    let holder = Consumer::start(&stack, "127.0.0.34", &args);
    let view = stack.wait_stable(GROUP, 2, SHARDS as usize).await;
    let epochs = |view: &serde_json::Value| -> BTreeMap<String, i64> {
        view["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| {
                let id = m["member_id"].as_str().expect("id").to_owned();
                (id, m["member_epoch"].as_i64().expect("epoch"))
            })
            .collect()
    };
    let before = epochs(&view);
    let count = 5_000;
    let producer = spawn_producer(&stack, STREAM, count, 32, Some(1_000));

    let t0 = now_ms();
    let mut duplicate = Consumer::start(&stack, "127.0.0.34", &args);
    let status = duplicate.wait_exit(Duration::from_secs(30));
    let exited_after_ms = now_ms() - t0;
    assert!(
        !status.success(),
        "a process whose member ids another live process uses must exit non-zero, got {status}"
    );
    let log = duplicate.log();
    assert!(
        log.iter().any(|l| l.contains("MEMBER_ID_IN_USE"))
            && log
                .iter()
                .any(|l| l.contains("give each process its own instance id")),
        "the duplicate says why and how to fix it"
    );
    finish_producer(producer, count);
    let records = wait_handled(&stack, count).await;
    let view = stack.wait_stable(GROUP, 2, SHARDS as usize).await;
    let after = epochs(&view);
    let bumps: i64 = after
        .iter()
        .map(|(id, e)| e - before.get(id).copied().unwrap_or(*e))
        .sum();
    let twice = (records.len() as u64).saturating_sub(count);
    eprintln!(
        "duplicate exited after {exited_after_ms} ms ({} log lines); holder epoch bumps: \
         {bumps}; entries handled twice: {twice} of {count}",
        log.len()
    );
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        bumps <= 20,
        "the holder's members were fenced {bumps} times"
    );
    assert!(twice * 100 <= count, "{twice} of {count} handled twice");
    drop(holder);
}

/// The members (id → owned shards) of the group, as the coordinator shows them.
async fn owners(stack: &Stack) -> BTreeMap<String, Vec<u32>> {
    pods::owned_by(&stack.group(GROUP).await)
        .into_iter()
        .collect()
}

/// A pod started with a data Redis where nothing listens never joins: the healthy pod keeps
/// every shard, everything published meanwhile is handled, and the bad pod says which URL
/// (password hidden) does not answer and is not ready.
#[tokio::test]
async fn a_pod_whose_data_redis_does_not_answer_never_joins() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 8;
    let stack = Stack::start();
    stack.create_group(GROUP, STREAM, SHARDS, 1500, 200).await;
    let args = POD_ARGS;
    let healthy = Consumer::start(&stack, "127.0.0.36", &args);
    stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    let count = 3_000;
    let producer = spawn_producer(&stack, STREAM, count, 32, Some(1_000));
    let bad =
        Consumer::start_with_redis(&stack, "redis://:s3cret@127.0.0.1:1", "127.0.0.37", &args);
    eventually("the bad pod names its data Redis", 20, || {
        bad.log()
            .iter()
            .any(|l| l.contains("the data Redis does not answer"))
            .then_some(())
    })
    .await;
    let log = bad.log().join("\n");
    assert!(log.contains("redis://<redacted>@127.0.0.1:1"), "{log}");
    assert!(!log.contains("s3cret"), "the password stays out of the log");
    assert_eq!(bad.ready().await, Some(false), "the bad pod is not ready");
    // A producer with the same URL fails its publish, naming the URL.
    let unreachable = rsc_client::producer::Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url("redis://:s3cret@127.0.0.1:1")
        // Idempotent publishes are sent again for the retry budget (PROTOCOL §21): short here.
        .retry_budget(Duration::from_millis(300))
        .build()
        .expect("producer");
    let t = std::time::Instant::now();
    let err = unreachable
        .publish(STREAM, Some("k"), &1)
        .await
        .expect_err("nothing listens on port 1");
    let publish_failed_ms = t.elapsed().as_millis();
    assert!(
        matches!(err, rsc_client::ClientError::DataRedisUnreachable { .. }),
        "{err:?}"
    );
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    let text = format!(
        "{err}: {}",
        cause.expect("the connection's error is its source")
    );
    assert!(
        text.contains("redis://<redacted>@127.0.0.1:1") && !text.contains("s3cret"),
        "{text}"
    );
    eprintln!("publish to an unreachable data Redis failed after {publish_failed_ms} ms: {text}");
    // Negative window: several heartbeat intervals and a session timeout, polled.
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        let owned = owners(&stack).await;
        assert_eq!(
            owned.len(),
            1,
            "only the healthy pod is a member: {owned:?}"
        );
        assert_eq!(
            owned.values().flatten().count(),
            SHARDS as usize,
            "{owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    finish_producer(producer, count);
    let records = wait_handled(&stack, count).await;
    assert_none_lost(&records, count);
    assert_eq!(healthy.ready().await, Some(true));
    eprintln!(
        "healthy pod kept {SHARDS}/{SHARDS} shards; {} of {count} entries handled",
        records.iter().map(|r| r.seq).collect::<BTreeSet<_>>().len()
    );
}

/// A pod whose path to the data Redis is cut gives its shards back after the grace (the
/// healthy pod then owns them all and handles everything), and joins again once the path
/// is restored.
#[tokio::test]
async fn a_pod_that_loses_its_data_redis_gives_its_shards_back_and_returns() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 8;
    const GRACE_MS: u64 = 2_000;
    let stack = Stack::start();
    stack.create_group(GROUP, STREAM, SHARDS, 1500, 200).await;
    let proxy = rsc_e2e::Proxy::start(format!("127.0.0.1:{}", stack.redis.port()))
        .await
        .expect("proxy");
    let args = POD_ARGS;
    let healthy = Consumer::start(&stack, "127.0.0.38", &args);
    let grace = GRACE_MS.to_string();
    let mut cut_args = args.to_vec();
    cut_args.extend(["--data-redis-grace-ms", &grace]);
    let via_proxy = format!("redis://{}", proxy.addr());
    let cut = Consumer::start_with_redis(&stack, &via_proxy, "127.0.0.39", &cut_args);
    stack.wait_stable(GROUP, 2, SHARDS as usize).await;
    let healthy_member = healthy.member_ids(GROUP, 1).remove(0);
    let count = 5_000;
    let producer = spawn_producer(&stack, STREAM, count, 32, Some(1_000));
    tokio::time::sleep(Duration::from_millis(500)).await; // both pods handle for a moment
    let t0 = now_ms();
    proxy.cut();
    let moved_ms = eventually_owned_by(&stack, &healthy_member, SHARDS, 30).await - t0;
    finish_producer(producer, count);
    let records = wait_handled(&stack, count).await;
    assert_none_lost(&records, count);
    assert_eq!(
        cut.ready().await,
        Some(false),
        "not ready without its data Redis"
    );
    assert_eq!(
        cut.metric("rsc_client_stepped_aside_total", &[]).await,
        Some(1.0)
    );
    let t1 = now_ms();
    proxy.restore();
    stack.wait_stable(GROUP, 2, SHARDS as usize).await;
    let returned_ms = now_ms() - t1;
    let owned = owners(&stack).await;
    assert!(
        owned.iter().all(|(_, shards)| !shards.is_empty()),
        "the returned pod works shards again: {owned:?}"
    );
    let log = cut.log().join("\n");
    assert!(log.contains("giving the shards back"), "{log}");
    assert!(log.contains("joining the group again"), "{log}");
    let twice = (records.len() as u64).saturating_sub(count);
    eprintln!(
        "cut → healthy pod owns {SHARDS}/{SHARDS}: {moved_ms} ms (grace {GRACE_MS} ms); \
         restored → both pods stable again: {returned_ms} ms; handled twice: {twice} of {count}"
    );
}

/// Waits until `member` alone owns all `shards`; returns when it first did (ms).
async fn eventually_owned_by(stack: &Stack, member: &str, shards: u32, secs: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let owned = owners(stack).await;
        if owned.len() == 1
            && owned
                .get(member)
                .is_some_and(|s| s.len() == shards as usize)
        {
            return now_ms();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{member} did not get all {shards} shards within {secs} s: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The shards whose `rsc_client_shard_lag` series a pod's `/metrics` shows for `group`.
async fn lag_series(pod: &Consumer, group: &str) -> Option<BTreeSet<u32>> {
    let text = reqwest::get(format!("{}/metrics", pod.health_url()))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let wanted = format!("group=\"{group}\"");
    Some(
        text.lines()
            .filter(|l| l.starts_with("rsc_client_shard_lag{") && l.contains(&wanted))
            .filter_map(|l| l.split("shard=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect(),
    )
}

/// The ops endpoints of the client (`--health-listen` serves them): `/healthz` is alive,
/// `/readyz` is ready once the member joined, and once a second pod took half of the
/// shards, the first pod's `/metrics` keeps the lag series of the shards it still owns only.
#[tokio::test]
async fn ops_endpoints_serve_probes_and_drop_the_lag_series_of_shards_given_up() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 4;
    let t0 = std::time::Instant::now();
    let stack = Stack::start();
    stack
        .create_group("ops", "ops-events", SHARDS, 1500, 200)
        .await;
    let args = ["--group", "ops", "--stream", "ops-events"];
    let first = Consumer::start(&stack, "127.0.0.41", &args);
    eventually_ready(&first).await;
    let healthz = reqwest::get(format!("{}/healthz", first.health_url()))
        .await
        .expect("healthz answers");
    assert_eq!(healthz.status().as_u16(), 200);
    let all: BTreeSet<u32> = (0..SHARDS).collect();
    pods::eventually_async("the first pod's lag series of every shard", 10, || async {
        (lag_series(&first, "ops").await? == all).then_some(())
    })
    .await;
    let second = Consumer::start(&stack, "127.0.0.42", &args);
    let view = stack.wait_stable("ops", 2, SHARDS as usize).await;
    eventually_ready(&second).await;
    let kept: BTreeSet<u32> = pods::owned_by(&view)
        .remove("127.0.0.41-ops-0")
        .expect("the first pod is a member")
        .into_iter()
        .collect();
    assert!(!kept.is_empty() && kept.len() < SHARDS as usize, "{kept:?}");
    let series = pods::eventually_async("the given-up shards' series gone", 10, || async {
        let s = lag_series(&first, "ops").await?;
        (s == kept).then_some(s)
    })
    .await;
    eprintln!(
        "first pod: {} lag series before the second joined, {} after (owns {kept:?}); {} ms",
        SHARDS,
        series.len(),
        t0.elapsed().as_millis()
    );
}

/// Waits until a pod's `/readyz` answers 200.
async fn eventually_ready(pod: &Consumer) {
    pods::eventually_async("the pod is ready", 10, || async {
        pod.ready().await.filter(|r| *r).map(|_| ())
    })
    .await;
}

/// Listener settings outside the code: the file (`RSC_CONFIG_FILE`) moves the listener to
/// another group with 3 members, the environment (`RSC_LISTENER_<NAME>_CONCURRENCY`) wins
/// over the file with 2; a value of the wrong kind stops the process at start, naming the
/// variable.
#[tokio::test]
async fn listener_settings_from_the_environment_and_a_file_override_the_code() {
    let _serial = SERIAL.lock().await;
    let t0 = std::time::Instant::now();
    let stack = Stack::start();
    stack
        .create_group("cfg-file", "cfg-events", 4, 1500, 200)
        .await;
    let file =
        std::env::temp_dir().join(format!("rsc-cfg-{}-{}.toml", std::process::id(), now_ms()));
    std::fs::write(
        &file,
        "[listeners.cfg-code]\ngroup = \"cfg-file\"\nstream = \"cfg-events\"\nconcurrency = 3\n",
    )
    .expect("write the configuration file");
    let path = file.to_string_lossy().into_owned();
    // The code (the pod's flags) says group cfg-code, one member; no such group exists.
    let args = [
        "--group",
        "cfg-code",
        "--stream",
        "elsewhere",
        "--concurrency",
        "1",
    ];
    let pod = Consumer::start_env(
        &stack,
        "127.0.0.43",
        &args,
        &[
            ("RSC_CONFIG_FILE", path.as_str()),
            ("RSC_LISTENER_CFG_CODE_CONCURRENCY", "2"),
        ],
    );
    let view = stack.wait_stable("cfg-file", 2, 4).await;
    let members: BTreeSet<String> = pods::owned_by(&view).into_keys().collect();
    assert_eq!(
        members,
        BTreeSet::from([
            "127.0.0.43-cfg-code-0".to_owned(),
            "127.0.0.43-cfg-code-1".to_owned()
        ]),
        "2 members (the variable over the file's 3 and the code's 1), named by the listener"
    );
    drop(pod);

    let mut bad = Consumer::start_env(
        &stack,
        "127.0.0.44",
        &args,
        &[("RSC_LISTENER_CFG_CODE_CONCURRENCY", "two")],
    );
    let status = bad.wait_exit(Duration::from_secs(10));
    assert!(!status.success(), "{status:?}");
    let log = bad.log().join("\n");
    assert!(
        log.contains("RSC_LISTENER_CFG_CODE_CONCURRENCY=\"two\": expected a whole number"),
        "{log}"
    );
    let _ = std::fs::remove_file(&file);
    eprintln!(
        "config override and bad value checked in {} ms",
        t0.elapsed().as_millis()
    );
}

/// A pod whose app sets up no logging (no `RUST_LOG`, no `RSC_LOG`, no subscriber of its
/// own) still tells what it does: the client's default subscriber writes its assignment to
/// stderr at `info` (GUIDE "Logs").
#[tokio::test]
async fn a_pod_logs_its_assignment_by_default() {
    let _serial = SERIAL.lock().await;
    const SHARDS: u32 = 2;
    let stack = Stack::start_with_data_redis();
    stack.create_group(GROUP, STREAM, SHARDS, 1000, 200).await;
    let unset = [("RSC_LOG", ""), ("RUST_LOG", "")];
    let pod = Consumer::start_env(&stack, "127.0.0.21", &POD_ARGS, &unset);
    stack.wait_stable(GROUP, 1, SHARDS as usize).await;
    eventually("the assignment line on the pod's stderr", 10, || {
        let log = pod.log();
        log.iter()
            .find(|l| l.contains("INFO") && l.contains("starting shards"))
            .cloned()
    })
    .await;
}
