//! Several publishes of one idempotent producer in flight (PROTOCOL §21 "Several publishes in
//! flight"): concurrent `publish_batch` calls share one producer id, their transactions are
//! pipelined on one connection, and each write to a shard runs only where the lane's write
//! before it ended. A real redis-server and coordinator; between the producer and Redis the
//! reply-dropping proxy of the idempotence tests. After a reset, a reply held past the
//! response timeout, or a window kept full, the checker finds every record once, and on each
//! shard the records of each key in the order of the calls.

use crate::idempotence::{
    CUT, Check, Entry, Proxy, TIMEOUT, assert_ids_match, batch, check, entries, stack_with,
};
use crate::pods::{SERIAL, Stack};
use rsc_client::producer::{Producer, Published};
use std::collections::HashMap;

/// The records per publish.
const BATCH: u64 = 40;

fn producer(stack: &Stack, redis_url: String, max_in_flight: usize) -> Producer {
    Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(redis_url)
        .max_in_flight(max_in_flight)
        .build()
        .expect("producer")
}

/// Publishes `calls` batches of [`BATCH`] records from record `first` on, all at once (the
/// calls are made in order: batch `j` holds records `first + j·BATCH ..`); each call's result.
async fn publish_at_once(
    p: &Producer,
    stream: &str,
    first: u64,
    calls: u64,
) -> Vec<Result<Vec<Published>, rsc_client::ClientError>> {
    let publishes = (0..calls).map(|j| {
        let from = first + j * BATCH;
        p.publish_batch(stream, batch(from..from + BATCH))
    });
    futures::future::join_all(publishes).await
}

/// On each shard, the records of each key (`k<i % 37>`, [`batch`]) in increasing number:
/// the keys whose order is broken, with the numbers found.
fn out_of_order(all: &[Entry]) -> Vec<(String, Vec<u64>)> {
    let mut by_key: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, _, f) in all {
        let (Some(k), Some(n)) = (f.get("key"), f.get("n").and_then(|v| v.parse().ok())) else {
            continue;
        };
        by_key.entry(k.clone()).or_default().push(n);
    }
    let mut broken: Vec<(String, Vec<u64>)> = (by_key.into_iter())
        .filter(|(_, ns)| ns.windows(2).any(|w| w[0] >= w[1]))
        .collect();
    broken.sort();
    broken
}

/// Every record of `0..n` once, none unmarked but by the default (no entry fields), and each
/// key in call order.
fn assert_clean(stack: &Stack, stream: &str, shards: u32, n: u64) {
    let found = check(stack, stream, shards, n);
    let clean = Check {
        duplicates: 0,
        lost: 0,
        twice: 0,
        unmarked: n as usize,
    };
    assert_eq!(found, clean, "each record once");
    let all = entries(stack, stream, shards);
    assert_eq!(out_of_order(&all), Vec::new(), "per-key order");
}

/// The results of `publish_at_once` from record `first` on: all succeeded, with the ids of
/// the entries in the stream.
fn assert_published(
    stack: &Stack,
    stream: &str,
    shards: u32,
    first: u64,
    results: Vec<Result<Vec<Published>, rsc_client::ClientError>>,
) {
    for (j, r) in results.into_iter().enumerate() {
        let at = r.unwrap_or_else(|e| panic!("publish {j}: {e}"));
        assert_ids_match(stack, stream, shards, first + j as u64 * BATCH, &at);
    }
}

/// Five publishes in flight when the connection is reset (the first reply read is dropped,
/// the others with the connection): all are sent again, in call order, and none is written
/// twice or lost; each returns its entries' ids.
#[tokio::test]
async fn a_reset_with_five_publishes_in_flight_neither_duplicates_nor_loses_nor_reorders() {
    const STREAM: &str = "inflight-reset";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 3).await;
    let proxy = Proxy::start(stack.redis.port()).await;
    let p = producer(&stack, proxy.url(), 5);
    let warm = publish_at_once(&p, STREAM, 0, 5).await;
    assert_published(&stack, STREAM, 3, 0, warm);
    proxy.arm(CUT);
    let results = publish_at_once(&p, STREAM, 5 * BATCH, 5).await;
    assert_eq!(
        proxy.dropped(),
        1,
        "a reply was dropped, the connection reset"
    );
    assert_published(&stack, STREAM, 3, 5 * BATCH, results);
    let after = publish_at_once(&p, STREAM, 10 * BATCH, 5).await;
    assert_published(&stack, STREAM, 3, 10 * BATCH, after);
    assert_clean(&stack, STREAM, 3, 15 * BATCH);
}

/// Five publishes in flight when a reply is held past the response timeout (then dropped):
/// they fail over to a new connection while the first one's writes may still run on the
/// old; every record once, in call order per key.
#[tokio::test]
async fn a_reply_delayed_past_the_timeout_with_five_in_flight_is_not_written_twice() {
    const STREAM: &str = "inflight-timeout";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 3).await;
    let proxy = Proxy::start(stack.redis.port()).await;
    let p = producer(&stack, proxy.url(), 5);
    let warm = publish_at_once(&p, STREAM, 0, 2).await;
    assert_published(&stack, STREAM, 3, 0, warm);
    proxy.arm(TIMEOUT);
    let results = publish_at_once(&p, STREAM, 2 * BATCH, 5).await;
    assert!(proxy.dropped() >= 1, "the held reply was dropped");
    assert_published(&stack, STREAM, 3, 2 * BATCH, results);
    assert_clean(&stack, STREAM, 3, 7 * BATCH);
}

/// More concurrent calls than the window (12 against 2 in flight), twice, the second time
/// with a reset: the calls wait for room in call order, and the checker finds each record
/// once in call order per key.
#[tokio::test]
async fn calls_beyond_the_window_wait_their_turn_and_keep_key_order() {
    const STREAM: &str = "inflight-window";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let proxy = Proxy::start(stack.redis.port()).await;
    let p = producer(&stack, proxy.url(), 2);
    let results = publish_at_once(&p, STREAM, 0, 12).await;
    assert_published(&stack, STREAM, 2, 0, results);
    proxy.arm(CUT);
    let results = publish_at_once(&p, STREAM, 12 * BATCH, 12).await;
    assert_eq!(proxy.dropped(), 1);
    assert_published(&stack, STREAM, 2, 12 * BATCH, results);
    assert_clean(&stack, STREAM, 2, 24 * BATCH);
}
