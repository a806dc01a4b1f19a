//! Key concurrency end to end (GUIDE "Key concurrency"): sample-consumer pods with
//! `--key-concurrency 8` handle up to 8 entries of a shard at once, never two of one key.
//! A real redis-server, a real coordinator (memory store), sample-producer processes.
//!
//! The order check (as in `ordered_reshard`): in the record stream (one entry per handling,
//! written when the handler finishes, before the acknowledgement) the first handling of each
//! `(key, seq)` comes after the first handling of every lower seq of that key.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods;

use crate::pods::{
    Consumer, Handled, SERIAL, Stack, eventually, finish_producer, handled, order_violations,
    owned_by, spawn_producer, xlen,
};
use serde_json::json;
use std::collections::{HashMap, HashSet};

const GROUP: &str = "g";
const RECORD: &str = "handled";

fn lanes_pod(stack: &Stack, stream: &str, pod: &str, extra: &[&str]) -> Consumer {
    let mut args = vec![
        "--group",
        GROUP,
        "--stream",
        stream,
        "--concurrency",
        "2",
        "--key-concurrency",
        "8",
        "--handle-ms",
        "5",
        "--record-stream",
        RECORD,
    ];
    args.extend_from_slice(extra);
    Consumer::start(stack, pod, &args)
}

/// The most handlings of one shard that overlapped in time, and whether two of one key ever
/// did (first handlings only; `started_ms`/`finished_ms` are the pod's clock, ms).
fn overlaps(records: &[Handled]) -> (usize, usize) {
    let mut seen = HashSet::new();
    let firsts: Vec<&Handled> = records
        .iter()
        .filter(|r| seen.insert((r.key.clone(), r.seq)))
        .collect();
    let mut by_shard: HashMap<u32, Vec<&Handled>> = HashMap::new();
    for r in &firsts {
        by_shard.entry(r.shard).or_default().push(r);
    }
    let mut most = 0;
    for rs in by_shard.values() {
        // Strictly inside another handling's span: at least 1 ms apart on either side.
        for r in rs {
            let at = rs
                .iter()
                .filter(|o| o.started_ms < r.started_ms + 1 && o.finished_ms > r.started_ms + 1)
                .count();
            most = most.max(at);
        }
    }
    let mut same_key = 0;
    let mut by_key: HashMap<&str, Vec<&Handled>> = HashMap::new();
    for r in &firsts {
        by_key.entry(r.key.as_str()).or_default().push(r);
    }
    for rs in by_key.values() {
        for w in rs.windows(2) {
            // Record order per key is finish order: the next may not start before the
            // previous finished.
            if w[1].started_ms < w[0].finished_ms {
                same_key += 1;
            }
        }
    }
    (most, same_key)
}

/// Waits until the record stream holds `n` handlings.
async fn wait_records(stack: &Stack, n: u64) {
    let mut con = stack.redis();
    eventually(&format!("{n} handlings"), 60, || {
        (xlen(&mut con, RECORD) >= n).then_some(())
    })
    .await;
}

/// Waits until every `(key, seq)` of `count` is in the record stream; returns the records.
async fn all_handled(stack: &Stack, count: u64, secs: u64) -> Vec<Handled> {
    let mut con = stack.redis();
    eventually("every entry handled", secs, || {
        let rs = handled(&mut con, RECORD);
        let distinct: HashSet<(String, u64)> = rs.iter().map(|r| (r.key.clone(), r.seq)).collect();
        (distinct.len() as u64 >= count).then_some(rs)
    })
    .await
}

/// Through a rebalance (a second pod joins), a pod killed with -9 (a third takes over its
/// shards' pending entries) and a reshard with `ordering: key`, with the producer running:
/// nothing lost, 0 per-key order violations, several entries of a shard in flight at once
/// and never two of one key. `strict`: the group fences strictly (guarded reads and
/// acknowledgements), else by lease.
async fn scenario(strict: bool) {
    let _serial = SERIAL.lock().await;
    let stream = if strict { "lanes-strict" } else { "lanes" };
    // The coordinator knows the data Redis either way: it seals the shards at the reshard
    // (without it there is no order through reshards, PROTOCOL §15).
    let stack = Stack::start_with_data_redis();
    let fencing = if strict { "strict" } else { "lease" };
    let (s, g) = stack
        .api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": stream, "shard_count": 4,
                "session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
                "fencing": fencing, "ordering": "key"}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{g}");
    let g = stack.group(GROUP).await;
    assert_eq!(
        (g["fencing"].as_str(), g["ordering"].as_str()),
        (Some(fencing), Some("key"))
    );

    let mut first = lanes_pod(&stack, stream, "127.0.0.41", &[]);
    stack.wait_stable(GROUP, 2, 4).await;
    const COUNT: u64 = 8_000;
    let producer = spawn_producer(&stack, stream, COUNT, 200, Some(1_600));
    wait_records(&stack, 500).await;
    let _second = lanes_pod(&stack, stream, "127.0.0.42", &[]);
    wait_records(&stack, 2_000).await;
    first.kill9();
    let _third = lanes_pod(&stack, stream, "127.0.0.43", &[]);
    wait_records(&stack, 3_500).await;
    let (s, v) = stack
        .api
        .post(
            &format!("/v1/streams/{stream}/reshard"),
            json!({"shard_count": 6}),
        )
        .await;
    assert!(s.is_success(), "reshard: {s} {v}");
    finish_producer(producer, COUNT);

    let records = all_handled(&stack, COUNT, 180).await;
    let (violations, examples) = order_violations(&records);
    let (most, same_key) = overlaps(&records);
    eprintln!(
        "key lanes ({fencing}): {} handlings of {COUNT} entries, order violations {violations}, \
         at most {most} of one shard at once, {same_key} of one key overlapping",
        records.len()
    );
    assert_eq!(
        violations, 0,
        "per-key order violations, e.g. {examples:#?}"
    );
    assert_eq!(same_key, 0, "two entries of one key were handled at once");
    assert!(
        most >= 2,
        "entries of one shard never overlapped: no lanes?"
    );
    // Redelivery after the kill is the only source of a second handling.
    let extra = records.len() as u64 - COUNT;
    assert!(extra < COUNT / 4, "{extra} handlings beyond the first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_lanes_keep_per_key_order_through_rebalance_kill_and_reshard() {
    scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_lanes_keep_per_key_order_under_strict_fencing() {
    scenario(true).await;
}

/// One poison key (every attempt fails) parks only its own lane: the other keys' entries are
/// all handled while the poison key is still working through its retries, and the poison
/// entries end up dead-lettered, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_key_parks_only_itself() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    let stream = "poison";
    stack.create_group(GROUP, stream, 4, 3000, 300).await;
    // A backlog first: 2,000 entries over 100 keys (k7 is the poison key: 20 entries).
    const COUNT: u64 = 2_000;
    finish_producer(spawn_producer(&stack, stream, COUNT, 100, None), COUNT);
    let _pod = lanes_pod(
        &stack,
        stream,
        "127.0.0.44",
        &[
            "--poison-key",
            "k7",
            "--max-retries",
            "2",
            "--retry-backoff-ms",
            "200",
        ],
    );
    let mut con = stack.redis();
    // Each poison entry takes ≥ 0.1 + 0.2 s of backoff (jitter: the upper half of 200 ms,
    // then of 400 ms) before its dead letter, one after another: ≥ 6 s for the key's 20.
    let dlq = rsc_protocol::routing::dlq_key(stream);
    let poison_left = eventually("every other key handled", 60, || {
        let rs = handled(&mut con, RECORD);
        let distinct: HashSet<u64> = rs.iter().map(|r| r.seq).collect();
        (distinct.len() as u64 >= COUNT - 20).then(|| 20 - xlen(&mut con, &dlq))
    })
    .await;
    assert!(
        poison_left > 0,
        "the other keys finished only after the poison key was done: it blocked them"
    );
    let dead = eventually("the poison entries dead-lettered", 60, || {
        let d = pods::read_stream(&mut con, &dlq);
        (d.len() >= 20).then_some(d)
    })
    .await;
    let seqs: Vec<u64> = dead
        .iter()
        .map(|m| m["seq"].parse().expect("seq"))
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "the poison key's entries were dead-lettered out of order: {seqs:?}"
    );
    assert!(
        seqs.iter().all(|s| s % 100 == 7),
        "only the poison key: {seqs:?}"
    );
    let records = handled(&mut con, RECORD);
    assert!(records.iter().all(|r| r.key != "k7"));
    eprintln!(
        "poison key: {} other entries handled with {poison_left} of its 20 entries still retrying",
        COUNT - 20
    );
}

/// A handler that never ends does not get its member removed (PROTOCOL §5.3, "Revocation
/// deadline"): pod A's handlings of keys `k1…` hang; when pod B joins, A revokes two of its
/// four shards, and at the group's rebalance timeout (3 s) less the margin it drops the stuck
/// calls instead of outliving the timeout. The coordinator never removes A, the stuck entries
/// of the revoked shards stay pending (A acknowledges none of them) and B, taking them over,
/// handles them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_handler_is_dropped_at_the_revocation_deadline() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    let stream = "stuck";
    let (s, g) = stack
        .api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": stream, "shard_count": 4,
                "session_timeout_ms": 10_000, "heartbeat_interval_ms": 300,
                "rebalance_timeout_ms": 3_000}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{g}");
    const COUNT: u64 = 400;
    let hangs = |key: &str| key.starts_with("k1");
    let stuck_shards: HashSet<u32> = (0..100)
        .map(|k| format!("k{k}"))
        .filter(|k| hangs(k))
        .map(|k| rsc_protocol::routing::shard_for_key(k.as_bytes(), 4))
        .collect();
    assert_eq!(stuck_shards.len(), 4, "a stuck key on every shard");
    let pod = |ip: &str, extra: &[&str]| {
        let mut args = vec![
            "--group",
            GROUP,
            "--stream",
            stream,
            "--key-concurrency",
            "16",
            "--record-stream",
            RECORD,
        ];
        args.extend_from_slice(extra);
        Consumer::start(&stack, ip, &args)
    };
    let a = pod("127.0.0.45", &["--hang-key-prefix", "k1"]);
    stack.wait_stable(GROUP, 1, 4).await;
    finish_producer(spawn_producer(&stack, stream, COUNT, 100, None), COUNT);
    let stuck = (0..COUNT)
        .filter(|s| hangs(&format!("k{}", s % 100)))
        .count() as u64;
    let mut con = stack.redis();
    eventually(
        "every entry of a key that does not hang handled",
        30,
        || (handled(&mut con, RECORD).len() as u64 == COUNT - stuck).then_some(()),
    )
    .await;

    let b = pod("127.0.0.46", &[]);
    let view = stack.wait_stable(GROUP, 2, 4).await;
    let b_member = b.member_ids(GROUP, 1).remove(0);
    let b_shards: HashSet<u32> = owned_by(&view)[&b_member].iter().copied().collect();
    assert_eq!(b_shards.len(), 2, "{view:#}");
    // What hung on the shards B took over was left pending by A and is handled by B.
    let stuck_there = (0..COUNT)
        .map(|s| format!("k{}", s % 100))
        .filter(|k| {
            hangs(k) && b_shards.contains(&rsc_protocol::routing::shard_for_key(k.as_bytes(), 4))
        })
        .count();
    let by_b = eventually("B handled the entries stuck on its shards", 30, || {
        let n = handled(&mut con, RECORD)
            .iter()
            .filter(|r| hangs(&r.key) && r.member == b_member)
            .count();
        (n >= stuck_there).then_some(n)
    })
    .await;
    let log = a.log().join("\n");
    assert!(
        log.contains("revocation deadline"),
        "A never cut its revocation short:\n{log}"
    );
    assert!(
        !log.contains("no longer knows this member"),
        "the coordinator removed A for outliving the rebalance timeout:\n{log}"
    );
    eprintln!(
        "stuck handler: {stuck_there} stuck entries on B's shards {b_shards:?} handled by B ({by_b}); \
         A cut its revocation short and kept its membership"
    );
}
