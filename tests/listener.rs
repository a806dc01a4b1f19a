//! The listener framework end to end: real redis-server, a real coordinator, sample consumer
//! pods (3 processes × concurrency 2, pod IPs 127.0.0.11–13) and the sample producer.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{
    Consumer, Handled, SERIAL, Stack, eventually, finish_producer, handled, now_ms, owned_by,
    read_stream, spawn_producer, xlen,
};
use rsc_protocol::routing::shard_for_key;
use std::collections::{BTreeSet, HashMap, HashSet};

const GROUP: &str = "g";
const STREAM: &str = "orders";
const RECORD: &str = "handled";
const SHARDS: u32 = 16;
const SESSION_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;
const PODS: [&str; 3] = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];

/// The stack, the group, and three consumer pods × concurrency 2, stable.
async fn three_pods(extra: &[&str]) -> (Stack, Vec<Consumer>) {
    let stack = Stack::start();
    stack
        .create_group(GROUP, STREAM, SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    let mut args = pod_args();
    args.extend_from_slice(extra);
    let pods: Vec<Consumer> = PODS
        .iter()
        .map(|ip| Consumer::start(&stack, ip, &args))
        .collect();
    stack.wait_stable(GROUP, 6, SHARDS as usize).await;
    (stack, pods)
}

/// Waits until every seq in `0..count` was handled (or dead-lettered); returns the records.
async fn wait_all_handled(stack: &Stack, count: u64, with_dlq: bool) -> Vec<Handled> {
    let mut con = stack.redis();
    eventually("every seq handled", 90, || {
        if xlen(&mut con, RECORD)
            + if with_dlq {
                xlen(&mut con, "orders:dlq")
            } else {
                0
            }
            < count
        {
            return None;
        }
        let records = handled(&mut con, RECORD);
        let mut seen: HashSet<u64> = records.iter().map(|r| r.seq).collect();
        if with_dlq {
            for d in read_stream(&mut con, "orders:dlq") {
                seen.insert(d["seq"].parse().expect("seq field copied to the DLQ"));
            }
        }
        (seen.len() as u64 == count).then_some(records)
    })
    .await
}

fn duplicates(records: &[Handled]) -> Vec<u64> {
    let mut seen = HashSet::new();
    let mut dup: Vec<u64> = records
        .iter()
        .filter(|r| !seen.insert(r.seq))
        .map(|r| r.seq)
        .collect();
    dup.sort_unstable();
    dup
}

/// The sample pods' arguments every scenario here shares: the group, the stream, two members
/// per pod and the record stream.
fn pod_args() -> Vec<&'static str> {
    vec![
        "--group",
        GROUP,
        "--stream",
        STREAM,
        "--concurrency",
        "2",
        "--record-stream",
        RECORD,
    ]
}

#[tokio::test]
async fn every_message_is_handled_once_in_key_order() {
    let _serial = SERIAL.lock().await;
    let (stack, mut pods) = three_pods(&[]).await;
    let count = 20_000;
    finish_producer(spawn_producer(&stack, STREAM, count, 100, None), count);
    let records = wait_all_handled(&stack, count, false).await;

    assert_eq!(
        duplicates(&records),
        Vec::<u64>::new(),
        "no rebalance: nothing is handled twice"
    );
    assert_eq!(records.len() as u64, count);
    let entries: HashSet<(u32, &str)> = records
        .iter()
        .map(|r| (r.shard, r.entry_id.as_str()))
        .collect();
    assert_eq!(entries.len() as u64, count, "one record per shard entry");
    // Each message was read from the shard the PROTOCOL §3 hash routes its key to.
    for r in &records {
        assert_eq!(r.shard, shard_for_key(r.key.as_bytes(), SHARDS), "{r:?}");
        assert!(r.finished_ms >= r.started_ms);
    }
    // Per key, handling order is publishing order (no rebalance happened).
    let mut last: HashMap<&str, u64> = HashMap::new();
    for r in &records {
        if let Some(prev) = last.insert(&r.key, r.seq) {
            assert!(
                prev < r.seq,
                "key {} handled seq {} after {}",
                r.key,
                r.seq,
                prev
            );
        }
    }
    // All six members took part, each on the shards it owns.
    let members: BTreeSet<&str> = records.iter().map(|r| r.member.as_str()).collect();
    let expected: BTreeSet<String> = pods.iter().flat_map(|p| p.member_ids(GROUP, 2)).collect();
    assert_eq!(members, expected.iter().map(String::as_str).collect());
    let owners = owned_by(&stack.group(GROUP).await);
    for r in &records {
        assert!(
            owners[&r.member].contains(&r.shard),
            "{r:?} not owned by its member"
        );
    }
    for p in &mut pods {
        assert!(p.terminate().success());
    }
    let g = stack.group(GROUP).await;
    assert_eq!(
        g["members"].as_array().map(Vec::len),
        Some(0),
        "every pod left: {g}"
    );
}

#[tokio::test]
async fn killed_pod_resumes_elsewhere_after_the_session_timeout() {
    let _serial = SERIAL.lock().await;
    let (stack, mut pods) = three_pods(&[]).await;
    let count = 20_000;
    let producer = spawn_producer(&stack, STREAM, count, 100, Some(4000));
    let mut con = stack.redis();
    eventually("a fifth handled", 60, || {
        (xlen(&mut con, RECORD) >= 4000).then_some(())
    })
    .await;

    let victim = pods[0].member_ids(GROUP, 2);
    let before = owned_by(&stack.group(GROUP).await);
    let victim_shards: BTreeSet<u32> = victim.iter().flat_map(|m| before[m].clone()).collect();
    assert!(!victim_shards.is_empty());
    pods[0].kill9();
    let killed_ms = now_ms();

    finish_producer(producer, count);
    let records = wait_all_handled(&stack, count, false).await;

    // The dead pod's shards were picked up by others, and not before the coordinator could
    // expire it (its last heartbeat was at most one interval before the kill).
    for shard in &victim_shards {
        let first = records
            .iter()
            .filter(|r| {
                r.shard == *shard && !victim.contains(&r.member) && r.started_ms >= killed_ms
            })
            .map(|r| r.started_ms)
            .min()
            .unwrap_or_else(|| panic!("shard {shard} never resumed"));
        let waited = first - killed_ms;
        eprintln!("shard {shard} resumed {waited} ms after the kill");
        assert!(
            waited + HEARTBEAT_MS + 200 >= SESSION_MS,
            "shard {shard} resumed {waited} ms after the kill: before the session timeout"
        );
    }
    let g = stack.group(GROUP).await;
    let members: Vec<&str> = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["member_id"].as_str())
        .collect();
    assert_eq!(members.len(), 4, "{g}");
    assert!(members.iter().all(|m| !victim.iter().any(|v| v == m)));
}

#[tokio::test]
async fn terminated_pod_hands_over_within_a_heartbeat_without_duplicates() {
    let _serial = SERIAL.lock().await;
    let (stack, mut pods) = three_pods(&[]).await;
    let count = 20_000;
    let producer = spawn_producer(&stack, STREAM, count, 100, Some(4000));
    let mut con = stack.redis();
    eventually("a fifth handled", 60, || {
        (xlen(&mut con, RECORD) >= 4000).then_some(())
    })
    .await;

    let leaving = pods[0].member_ids(GROUP, 2);
    let before = owned_by(&stack.group(GROUP).await);
    let shards: BTreeSet<u32> = leaving.iter().flat_map(|m| before[m].clone()).collect();
    let status = pods[0].terminate();
    let exited_ms = now_ms();
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    assert!(pods[0].log().iter().any(|l| l.contains("left the group")));

    finish_producer(producer, count);
    let records = wait_all_handled(&stack, count, false).await;
    assert_eq!(
        duplicates(&records),
        Vec::<u64>::new(),
        "a graceful hand-over duplicates nothing"
    );

    // Hand-over time per shard: from the last message the leaving pod finished on it to the
    // first one another member started (the producer keeps every shard busy meanwhile).
    for shard in &shards {
        let last_own = records
            .iter()
            .filter(|r| r.shard == *shard && leaving.contains(&r.member))
            .map(|r| r.finished_ms)
            .max()
            .unwrap_or_else(|| panic!("the leaving pod never handled shard {shard}"));
        let first_other = records
            .iter()
            .filter(|r| {
                r.shard == *shard && !leaving.contains(&r.member) && r.started_ms >= last_own
            })
            .map(|r| r.started_ms)
            .min()
            .unwrap_or_else(|| panic!("shard {shard} never resumed"));
        let gap = first_other - last_own;
        eprintln!(
            "shard {shard} handed over in {gap} ms (pod exited {} ms after its last message)",
            exited_ms.saturating_sub(last_own)
        );
        // About one heartbeat interval; far below the session timeout an expiry would take.
        assert!(
            gap < SESSION_MS / 2,
            "shard {shard} resumed {gap} ms after the graceful pod's last message"
        );
    }
}

/// A pod joining under load: two pods share the group while a producer writes, a third pod
/// joins half-way. The joiner gets shards only once their holders gave them up (revoke
/// before assign, PROTOCOL §5.2): nothing lost, nothing handled twice, per-key order kept,
/// and no shard ever handled by two members at once.
#[tokio::test]
async fn a_pod_joining_under_load_takes_shards_without_overlap_or_duplicates() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack
        .create_group(GROUP, STREAM, SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    let args = pod_args();
    let mut pods: Vec<Consumer> = PODS[..2]
        .iter()
        .map(|ip| Consumer::start(&stack, ip, &args))
        .collect();
    stack.wait_stable(GROUP, 4, SHARDS as usize).await;
    let count = 12_000;
    let producer = spawn_producer(&stack, STREAM, count, 100, Some(2000));
    let mut con = stack.redis();
    eventually("a quarter handled", 60, || {
        (xlen(&mut con, RECORD) >= count / 4).then_some(())
    })
    .await;

    let joined_ms = now_ms();
    pods.push(Consumer::start(&stack, PODS[2], &args));
    let g = stack.wait_stable(GROUP, 6, SHARDS as usize).await;
    let converged_ms = now_ms();
    let joiner = pods[2].member_ids(GROUP, 2);
    let taken: BTreeSet<u32> = joiner
        .iter()
        .flat_map(|m| owned_by(&g)[m].clone())
        .collect();
    assert!(!taken.is_empty(), "the joiner owns nothing: {g:#}");
    let backlog = count.saturating_sub(xlen(&mut con, RECORD));
    eprintln!(
        "the joiner owns shards {taken:?} {} ms after it started, {backlog} entries still to handle",
        converged_ms - joined_ms
    );
    assert!(
        backlog > 0,
        "the producer was done before the join: not under load"
    );

    finish_producer(producer, count);
    let records = wait_all_handled(&stack, count, false).await;
    assert_eq!(
        duplicates(&records),
        Vec::<u64>::new(),
        "a join moves shards by revocation first: nothing is handled twice"
    );
    assert_eq!(records.len() as u64, count);
    // The joiner handled entries of the shards it took, and none before it started.
    let by_joiner: Vec<&Handled> = records
        .iter()
        .filter(|r| joiner.contains(&r.member))
        .collect();
    assert!(!by_joiner.is_empty(), "the joiner handled nothing");
    assert!(by_joiner.iter().all(|r| r.started_ms >= joined_ms));
    // Per shard, in handling order: a handling by another member than the one before starts
    // only after that one finished (one member at a time on a shard), and per key the
    // publishing order holds.
    let mut by_shard: HashMap<u32, Vec<&Handled>> = HashMap::new();
    for r in &records {
        by_shard.entry(r.shard).or_default().push(r);
    }
    let mut moved = 0;
    for (shard, rs) in &mut by_shard {
        rs.sort_by_key(|r| (r.started_ms, r.finished_ms));
        for w in rs.windows(2) {
            if w[0].member != w[1].member {
                moved += 1;
                let before_end = rs
                    .iter()
                    .filter(|r| r.member == w[0].member && r.started_ms <= w[1].started_ms)
                    .map(|r| r.finished_ms)
                    .max()
                    .unwrap_or(0);
                assert!(
                    before_end <= w[1].started_ms,
                    "shard {shard}: {} started {:?} at {} ms before {} finished at {before_end}",
                    w[1].member,
                    w[1].entry_id,
                    w[1].started_ms,
                    w[0].member
                );
            }
        }
    }
    assert!(moved > 0, "no shard changed member");
    let mut last: HashMap<&str, u64> = HashMap::new();
    for r in records.iter() {
        if let Some(prev) = last.insert(&r.key, r.seq) {
            assert!(
                prev < r.seq,
                "key {} handled seq {} after {prev}",
                r.key,
                r.seq
            );
        }
    }
    for p in &mut pods {
        assert!(p.terminate().success());
    }
}

#[tokio::test]
async fn failing_handler_retries_then_dead_letters() {
    let _serial = SERIAL.lock().await;
    let (stack, mut pods) = three_pods(&[
        "--fail-rate",
        "0.1",
        "--max-retries",
        "1",
        "--retry-backoff-ms",
        "10",
    ])
    .await;
    let count = 5_000;
    finish_producer(spawn_producer(&stack, STREAM, count, 100, None), count);
    let records = wait_all_handled(&stack, count, true).await;

    let mut con = stack.redis();
    let dlq = read_stream(&mut con, "orders:dlq");
    // 1% of messages fail twice in a row: about 50 here; never zero in practice.
    assert!(!dlq.is_empty(), "some messages fail every attempt");
    let handled: HashSet<u64> = records.iter().map(|r| r.seq).collect();
    for d in &dlq {
        let seq: u64 = d["seq"].parse().unwrap();
        assert!(
            !handled.contains(&seq),
            "seq {seq} both handled and dead-lettered"
        );
        assert!(d["error"].contains("injected failure"), "{d:?}");
        assert_eq!(d["attempts"], "2", "one try and one retry: {d:?}");
        let shard = shard_for_key(d["key"].as_bytes(), SHARDS);
        assert_eq!(d["origin"], format!("{STREAM}:{shard}"));
        assert!(!d["origin_id"].is_empty() && !d["payload"].is_empty());
    }
    assert_eq!(
        records.len() + dlq.len(),
        count as usize,
        "nothing handled twice, nothing dropped"
    );
    // Every entry gets acknowledged (the last batch's XACK may still be on its way).
    eventually("nothing pending on any shard", 10, || {
        (0..SHARDS)
            .all(|shard| {
                let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
                    .arg(format!("{STREAM}:{shard}"))
                    .arg(GROUP)
                    .query(&mut con)
                    .unwrap();
                pending.count() == 0
            })
            .then_some(())
    })
    .await;
    for p in &mut pods {
        assert!(p.terminate().success());
    }
}

#[tokio::test]
async fn handler_slower_than_the_session_timeout_keeps_its_membership() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    // Session 1 s, each handling 1.5 s.
    stack.create_group(GROUP, STREAM, 4, 1000, 100).await;
    let mut args = pod_args();
    args.extend(["--handle-ms", "1500"]);
    let mut pod = Consumer::start(&stack, "127.0.0.11", &args);
    stack.wait_stable(GROUP, 2, 4).await;
    let ids = pod.member_ids(GROUP, 2);
    let count = 8;
    finish_producer(spawn_producer(&stack, STREAM, count, count, None), count);

    let mut con = stack.redis();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // Throughout, both members stay in the group (never expired, never rejoined).
        let g = stack.group(GROUP).await;
        let members: BTreeSet<String> = g["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["member_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(members, ids.iter().cloned().collect(), "{g}");
        if xlen(&mut con, RECORD) >= count {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slow messages never finished"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let records = handled(&mut con, RECORD);
    assert_eq!(records.len() as u64, count);
    assert_eq!(duplicates(&records), Vec::<u64>::new());
    assert!(records.iter().all(|r| r.finished_ms - r.started_ms >= 1500));
    let log = pod.log().join("\n");
    assert!(
        !log.contains("rejoining") && !log.contains("self-fence"),
        "{log}"
    );
    assert!(pod.terminate().success());
}
