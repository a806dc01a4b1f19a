//! The idempotent producer (PROTOCOL §21): a publish whose first attempt landed and whose
//! reply was lost is sent again and not written twice. A real redis-server and coordinator;
//! between the producer and Redis a TCP proxy of the test that forwards requests and, when
//! armed, drops the reply of the next request (at once, after holding it past the response
//! timeout, or once the test releases it). The checker reads every shard: records lost or
//! written twice by their number, and duplicates by `(producer_id, producer_seq)` where a
//! producer writes those fields (`producer_fields(true)`; by default entries carry none, the
//! duplicate check lives in the producer record alone). Also: a
//! check that fails at run time writes nothing (standalone and Redis Cluster), and a master
//! killed behind Redis Sentinel neither duplicates nor loses a confirmed record; writes a
//! publish had reported published and that are gone (a failover without `WAIT`, simulated)
//! are reported by the producer's next write to the shard.

use crate::pods::{self, SERIAL, Stack, eventually};
use rsc_client::producer::{LostWrites, Producer, Published, Record};
use rsc_protocol::routing::{shard_for_key, shard_key};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const SESSION_MS: u64 = 6_000;
const HEARTBEAT_MS: u64 = 500;

/// Forward every reply.
pub(crate) const PASS: u8 = 0;
/// Drop the next reply and close that connection.
pub(crate) const CUT: u8 = 1;
/// Hold the next reply for [`HOLD`] (past the producer's 5 s response timeout), then drop it
/// and close the connection.
pub(crate) const TIMEOUT: u8 = 2;
/// Hold the next reply until [`Proxy::release`], then drop it and close the connection.
pub(crate) const UNTIL_RELEASED: u8 = 3;

const HOLD: Duration = Duration::from_millis(5_500);

/// A loopback TCP proxy to a Redis port that can lose one reply.
pub(crate) struct Proxy {
    port: u16,
    mode: Arc<AtomicU8>,
    /// Replies dropped so far.
    dropped: Arc<AtomicU64>,
    /// Notified when a reply is being held ([`UNTIL_RELEASED`]).
    holding: Arc<Notify>,
    release: Arc<Notify>,
}

impl Proxy {
    pub(crate) async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let proxy = Proxy {
            port,
            mode: Arc::new(AtomicU8::new(PASS)),
            dropped: Arc::default(),
            holding: Arc::default(),
            release: Arc::default(),
        };
        let (mode, dropped) = (proxy.mode.clone(), proxy.dropped.clone());
        let (holding, release) = (proxy.holding.clone(), proxy.release.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let state = (
                    mode.clone(),
                    dropped.clone(),
                    holding.clone(),
                    release.clone(),
                );
                tokio::spawn(pump(client, server, state));
            }
        });
        proxy
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub(crate) fn arm(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    fn release(&self) {
        self.release.notify_one();
    }
}

type PumpState = (Arc<AtomicU8>, Arc<AtomicU64>, Arc<Notify>, Arc<Notify>);

/// Requests go through untouched; a reply is forwarded unless the proxy is armed, in which
/// case it is dropped (after its hold) and both sockets closed.
async fn pump(client: TcpStream, server: TcpStream, state: PumpState) {
    let (mode, dropped, holding, release) = state;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match mode.swap(PASS, Ordering::SeqCst) {
            PASS => {
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            armed => {
                if armed == TIMEOUT {
                    tokio::time::sleep(HOLD).await;
                } else if armed == UNTIL_RELEASED {
                    holding.notify_one();
                    release.notified().await;
                }
                dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
        }
    }
    up.abort();
}

/// One entry: (shard, entry id, fields).
pub(crate) type Entry = (u32, String, HashMap<String, String>);

/// Every entry of the stream's `shards` shards.
pub(crate) fn entries(stack: &Stack, stream: &str, shards: u32) -> Vec<Entry> {
    entries_on(&mut stack.redis(), stream, shards)
}

/// Every entry of the stream's `shards` shards, read on `con`.
fn entries_on(con: &mut redis::Connection, stream: &str, shards: u32) -> Vec<Entry> {
    let mut out = Vec::new();
    for s in 0..shards {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(shard_key(stream, s))
            .arg("-")
            .arg("+")
            .query(con)
            .expect("XRANGE");
        for e in reply.ids {
            let map = (e.map.iter())
                .map(|(k, v)| {
                    let v = redis::from_redis_value_ref::<String>(v).unwrap_or_default();
                    (k.clone(), v)
                })
                .collect();
            out.push((s, e.id, map));
        }
    }
    out
}

/// What the checker found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Check {
    /// Entries whose `(producer_id, producer_seq)` another entry has too.
    pub(crate) duplicates: usize,
    /// Record numbers `0..n` not found.
    pub(crate) lost: usize,
    /// Record numbers found more than once.
    pub(crate) twice: usize,
    /// Entries without `producer_id` / `producer_seq`.
    pub(crate) unmarked: usize,
}

pub(crate) fn check(stack: &Stack, stream: &str, shards: u32, n: u64) -> Check {
    let all = entries(stack, stream, shards);
    let mut pairs: HashMap<(String, String), usize> = HashMap::new();
    let mut numbers: HashMap<u64, usize> = HashMap::new();
    let mut unmarked = 0;
    for (_, _, f) in &all {
        match (f.get("producer_id"), f.get("producer_seq")) {
            (Some(p), Some(s)) => *pairs.entry((p.clone(), s.clone())).or_default() += 1,
            _ => unmarked += 1,
        }
        if let Some(i) = f.get("n").and_then(|v| v.parse().ok()) {
            *numbers.entry(i).or_default() += 1;
        }
    }
    Check {
        duplicates: pairs.values().map(|&c| c - 1).sum(),
        lost: (0..n).filter(|i| !numbers.contains_key(i)).count(),
        twice: numbers.values().filter(|&&c| c > 1).count(),
        unmarked,
    }
}

pub(crate) fn batch(range: std::ops::Range<u64>) -> Vec<Record> {
    range
        .map(|i| {
            Record::raw(format!("m{i}"))
                .key(format!("k{}", i % 37))
                .field("n", i.to_string())
        })
        .collect()
}

/// The entry ids the publish returned are those of the entries in the stream (also for
/// records found written by an earlier attempt).
pub(crate) fn assert_ids_match(
    stack: &Stack,
    stream: &str,
    shards: u32,
    first: u64,
    at: &[Published],
) {
    let all = entries(stack, stream, shards);
    let by_n: HashMap<u64, (u32, String)> = (all.into_iter())
        .filter_map(|(s, id, f)| Some((f.get("n")?.parse().ok()?, (s, id))))
        .collect();
    for (k, p) in at.iter().enumerate() {
        let n = first + k as u64;
        assert_eq!(by_n.get(&n), Some(&(p.shard, p.id.clone())), "record {n}");
    }
}

pub(crate) async fn stack_with(stream: &str, shards: u32) -> Stack {
    let stack = Stack::start_with_data_redis();
    stack
        .create_group(
            &format!("g-{stream}"),
            stream,
            shards,
            SESSION_MS,
            HEARTBEAT_MS,
        )
        .await;
    stack
}

fn producer(stack: &Stack, redis_url: String, idempotent: bool) -> Producer {
    Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(redis_url)
        .idempotent(idempotent)
        .build()
        .expect("producer")
}

/// The reply of a landed publish is lost and the connection reset: the producer sends the
/// same records again, they are recognised, the caller gets success with the entries' real
/// ids, and nothing is written twice. Without idempotence the same loss fails the publish,
/// and the caller's retry writes the batch twice (the checker sees it).
#[tokio::test]
async fn a_lost_reply_after_a_reset_is_not_written_twice() {
    const STREAM: &str = "idem-reset";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 3).await;
    let proxy = Proxy::start(stack.redis.port()).await;
    let p = producer(&stack, proxy.url(), true);
    p.publish_batch(STREAM, batch(0..10))
        .await
        .expect("warm-up");
    proxy.arm(CUT);
    let at = (p.publish_batch(STREAM, batch(10..110)).await).expect("retried publish succeeds");
    assert_eq!(proxy.dropped(), 1, "the first attempt's reply was dropped");
    p.publish_batch(STREAM, batch(110..150))
        .await
        .expect("after");
    let found = check(&stack, STREAM, 3, 150);
    let clean = Check {
        duplicates: 0,
        lost: 0,
        twice: 0,
        unmarked: 150,
    };
    assert_eq!(
        found, clean,
        "the default writes no producer fields in the entries"
    );
    assert_ids_match(&stack, STREAM, 3, 10, &at);

    // The same loss with the entry fields asked for (consumer-side deduplication).
    let fields = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(proxy.url())
        .producer_fields(true)
        .build()
        .expect("producer");
    fields
        .publish_batch(STREAM, batch(150..160))
        .await
        .expect("warm-up");
    proxy.arm(CUT);
    let at = (fields.publish_batch(STREAM, batch(160..200)).await).expect("retried publish");
    assert_eq!(proxy.dropped(), 2, "the first attempt's reply was dropped");
    let found = check(&stack, STREAM, 3, 200);
    let clean = Check {
        duplicates: 0,
        lost: 0,
        twice: 0,
        unmarked: 150,
    };
    assert_eq!(
        found, clean,
        "every entry of this producer carries the fields"
    );
    assert_ids_match(&stack, STREAM, 3, 160, &at);

    // The control: the same loss without idempotence.
    let plain = producer(&stack, proxy.url(), false);
    // Connected first (a PING), so that the dropped reply is the publish's.
    assert_eq!(
        plain.not_ready().await.filter(|e| e.contains("data Redis")),
        None
    );
    proxy.arm(CUT);
    let first = plain.publish_batch(STREAM, batch(200..250)).await;
    assert!(
        first.is_err(),
        "a lost reply fails an at-least-once publish"
    );
    plain
        .publish_batch(STREAM, batch(200..250))
        .await
        .expect("retry");
    let found = check(&stack, STREAM, 3, 250);
    assert_eq!((found.duplicates, found.lost), (0, 0));
    assert_eq!((found.twice, found.unmarked), (50, 250), "{found:?}");
}

/// The reply is held past the response timeout, then lost: the publish fails over to a new
/// connection and still writes each record once.
#[tokio::test]
async fn a_reply_lost_after_the_response_timeout_is_not_written_twice() {
    const STREAM: &str = "idem-timeout";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let proxy = Proxy::start(stack.redis.port()).await;
    let p = producer(&stack, proxy.url(), true);
    p.publish_batch(STREAM, batch(0..10))
        .await
        .expect("warm-up");
    proxy.arm(TIMEOUT);
    let at = (p.publish_batch(STREAM, batch(10..60)).await).expect("retried publish succeeds");
    assert!(
        proxy.dropped() >= 1,
        "the first attempt's reply was dropped"
    );
    let found = check(&stack, STREAM, 2, 60);
    assert_eq!(
        (found.duplicates, found.lost, found.twice),
        (0, 0, 0),
        "{found:?}"
    );
    assert_ids_match(&stack, STREAM, 2, 10, &at);
}

/// The first attempt lands, its reply is held while the stream is resharded (the epoch
/// markers move), then lost: the retry under the old routing is refused by the markers, but
/// the records are resolved against the shards they were sent to first — found written
/// there — and not rerouted to the new layout (no second copy on another shard).
#[tokio::test]
async fn an_epoch_refusal_after_an_ambiguous_attempt_is_resolved_on_the_old_shard() {
    const STREAM: &str = "idem-epoch";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let proxy = Proxy::start(stack.redis.port()).await;
    let p = producer(&stack, proxy.url(), true);
    // A first reshard so every shard carries an epoch marker (PROTOCOL §15).
    let (s, v) = (stack.api)
        .post(
            &format!("/v1/streams/{STREAM}/reshard"),
            json!({"shard_count": 3}),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");
    p.refresh_routing(STREAM).await.expect("routing");
    p.publish_batch(STREAM, batch(0..10))
        .await
        .expect("warm-up");
    proxy.arm(UNTIL_RELEASED);
    let publish = {
        let p = p.clone();
        tokio::spawn(async move { p.publish_batch(STREAM, batch(10..90)).await })
    };
    tokio::time::timeout(Duration::from_secs(5), proxy.holding.notified())
        .await
        .expect("the first attempt's reply is held");
    let (s, v) = (stack.api)
        .post(
            &format!("/v1/streams/{STREAM}/reshard"),
            json!({"shard_count": 5}),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");
    proxy.release();
    let at = publish
        .await
        .expect("task")
        .expect("publish resolved as written");
    assert_eq!(proxy.dropped(), 1);
    for (k, p) in at.iter().enumerate() {
        let key = format!("k{}", (10 + k as u64) % 37);
        assert_eq!(
            p.shard,
            shard_for_key(key.as_bytes(), 3),
            "{key}: on its first shard"
        );
    }
    let found = check(&stack, STREAM, 5, 90);
    assert_eq!(
        (found.duplicates, found.lost, found.twice),
        (0, 0, 0),
        "{found:?}"
    );
    assert_ids_match(&stack, STREAM, 5, 10, &at);
    // And the next publish goes to the new layout.
    let next = p.publish_batch(STREAM, batch(90..100)).await.expect("next");
    for (k, p) in next.iter().enumerate() {
        let key = format!("k{}", (90 + k as u64) % 37);
        assert_eq!(p.shard, shard_for_key(key.as_bytes(), 5), "{key}");
    }
}

/// `WAIT` not confirmed: the producer sends the records again (recognised as written) and
/// waits again until a replica confirms; each record is written once.
#[tokio::test]
async fn a_wait_not_confirmed_is_retried_without_writing_twice() {
    const STREAM: &str = "idem-wait";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let replica = rsc_testkit::RedisServer::start().expect("replica");
    let p = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .wait_for_replicas(1, Duration::from_millis(100))
        .build()
        .expect("producer");
    let publish = {
        let p = p.clone();
        tokio::spawn(async move { p.publish_batch(STREAM, batch(0..40)).await })
    };
    // Written, not confirmed (no replica yet): still publishing.
    let mut con = stack.redis();
    eventually("the first attempt landed", 5, || {
        let n = pods::xlen(&mut con, &shard_key(STREAM, 0))
            + pods::xlen(&mut con, &shard_key(STREAM, 1));
        (n == 40).then_some(())
    })
    .await;
    assert!(!publish.is_finished(), "not confirmed yet");
    let mut rcon = redis::Client::open(replica.url())
        .and_then(|c| c.get_connection())
        .expect("replica connection");
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(stack.redis.port())
        .query(&mut rcon)
        .expect("REPLICAOF");
    let at = tokio::time::timeout(Duration::from_secs(10), publish)
        .await
        .expect("confirmed within the retry budget")
        .expect("task")
        .expect("publish");
    let found = check(&stack, STREAM, 2, 40);
    assert_eq!(
        (found.duplicates, found.lost, found.twice, found.unmarked),
        (0, 0, 0, 40),
        "{found:?}"
    );
    assert_ids_match(&stack, STREAM, 2, 0, &at);
}

/// 1,000 short-lived producers leave a bounded number of producer records, and none once
/// their idle time passed; a default producer's record expires after a day.
#[tokio::test]
async fn short_lived_producers_leave_no_state_behind() {
    const STREAM: &str = "idem-ttl";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let records = |con: &mut redis::Connection| -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("{{{STREAM}:*}}:producer:*"))
            .query(con)
            .expect("KEYS")
    };
    let url = stack.coordinator.url();
    let redis_url = stack.redis.url();
    let tasks = (0..1_000u64).map(|i| {
        let (url, redis_url) = (url.clone(), redis_url.clone());
        async move {
            let p = Producer::builder()
                .coordinator(&url)
                .redis_url(redis_url)
                .idempotence_ttl(Duration::from_secs(2))
                .build()
                .expect("producer");
            p.publish_batch(STREAM, batch(i..i + 1)).await.map(|_| ())
        }
    });
    use futures::StreamExt;
    let results: Vec<_> = futures::stream::iter(tasks)
        .buffer_unordered(50)
        .collect()
        .await;
    let done = results.into_iter().map(|r| r.expect("publish")).count();
    assert_eq!(done, 1_000);
    let mut con = stack.redis();
    let left = records(&mut con);
    assert!(
        left.len() <= 1_000,
        "one record per producer and shard written: {}",
        left.len()
    );
    for key in left.iter().take(20) {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).expect("PTTL");
        // -2: expired since the listing (the first of 1,000 publishes can be 2 s old on a
        // loaded machine); any record still there expires within the 2 s idle time.
        assert!(ttl == -2 || (0..=2_000).contains(&ttl), "{key}: {ttl}");
    }
    eventually("every producer record expired", 10, || {
        records(&mut con).is_empty().then_some(())
    })
    .await;
    // The default idle time: a day.
    let p = producer(&stack, stack.redis.url(), true);
    p.publish_batch(STREAM, batch(0..1)).await.expect("publish");
    let left = records(&mut con);
    assert_eq!(left.len(), 1);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&left[0])
        .query(&mut con)
        .expect("PTTL");
    assert!(ttl > 23 * 3600 * 1000 && ttl <= 24 * 3600 * 1000, "{ttl}");
}

/// A Redis user without script permission (`-@scripting`) gets a clear error and nothing is
/// written: the write is the script.
#[tokio::test]
async fn a_user_without_scripting_gets_an_error_and_nothing_written() {
    const STREAM: &str = "idem-noscript";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let mut con = stack.redis();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "noscript",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ])
        .query(&mut con)
        .expect("ACL SETUSER");
    let url = format!("redis://noscript:pw@127.0.0.1:{}", stack.redis.port());
    for idempotent in [true, false] {
        let p = producer(&stack, url.clone(), idempotent);
        let err = (p.publish_batch(STREAM, batch(0..10)).await).expect_err("no script, no write");
        assert!(err.to_string().to_lowercase().contains("noperm"), "{err}");
    }
    for s in 0..2 {
        assert_eq!(pods::xlen(&mut con, &shard_key(STREAM, s)), 0);
    }
}

/// `XLEN` of each of the stream's shards.
fn xlens<C: redis::ConnectionLike>(con: &mut C, stream: &str, shards: u32) -> Vec<u64> {
    (0..shards)
        .map(|s| {
            redis::cmd("XLEN")
                .arg(shard_key(stream, s))
                .query(con)
                .expect("XLEN")
        })
        .collect()
}

/// With a list at `bad` (a marker or a producer record of the wrong type: the check fails at
/// run time), publishing `records` fails with the check's error naming `bad`, nothing is
/// written on any shard, `bad` is left as it was and no abort key holds a value; once `bad`
/// is gone the same records are published.
async fn a_wrong_type_fails_the_publish<C: redis::ConnectionLike>(
    p: &Producer,
    con: &mut C,
    (stream, shards): (&str, u32),
    bad: &str,
    records: Vec<Record>,
) {
    let n = records.len() as u64;
    let _: () = redis::cmd("DEL").arg(bad).query(con).expect("DEL");
    let _: () = redis::cmd("RPUSH")
        .arg(bad)
        .arg("x")
        .query(con)
        .expect("RPUSH");
    let before = xlens(con, stream, shards);
    let err = (p.publish_batch(stream, records.clone()).await).expect_err("the check failed");
    let msg = err.to_string();
    assert!(msg.contains("WRONGTYPE") && msg.contains(bad), "{msg}");
    assert_eq!(xlens(con, stream, shards), before, "nothing written: {msg}");
    let kept: Vec<String> = (redis::cmd("LRANGE").arg(bad).arg(0).arg(-1))
        .query(con)
        .expect("LRANGE");
    assert_eq!(kept, ["x"], "{bad} is left as it was");
    for s in 0..shards {
        let abort = rsc_protocol::routing::publish_abort_key(&shard_key(stream, s));
        let exists: u64 = redis::cmd("EXISTS").arg(&abort).query(con).expect("EXISTS");
        assert_eq!(exists, 0, "{abort} holds nothing");
    }
    let _: () = redis::cmd("DEL").arg(bad).query(con).expect("DEL");
    p.publish_batch(stream, records).await.expect("published");
    let after: u64 = xlens(con, stream, shards).iter().sum();
    assert_eq!(after, before.iter().sum::<u64>() + n);
}

/// A check that fails at run time — an epoch marker, then a producer record, holding a value
/// of the wrong type — fails the publish with its error and writes nothing: the check aborts
/// the transaction before the `XADD`s run (fail closed, PROTOCOL §15). The bad key is on the
/// batch's second shard, so the check fails after the first shard passed, and the abort key
/// is the first shard's.
#[tokio::test]
async fn a_check_that_fails_writes_nothing() {
    const STREAM: &str = "idem-wrongtype";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let mut con = stack.redis();
    let on = |r: std::ops::Range<u64>, s: u32| {
        r.into_iter()
            .any(|i| shard_for_key(format!("k{}", i % 37).as_bytes(), 2) == s)
    };
    assert!(
        on(10..20, 0) && on(10..20, 1),
        "the batch writes both shards"
    );
    let shard1 = shard_key(STREAM, 1);
    let marker = rsc_protocol::routing::epoch_key(&shard1);
    for idempotent in [true, false] {
        let p = producer(&stack, stack.redis.url(), idempotent);
        p.publish_batch(STREAM, batch(0..10))
            .await
            .expect("warm-up");
        a_wrong_type_fails_the_publish(&p, &mut con, (STREAM, 2), &marker, batch(10..20)).await;
    }
    let p = Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .producer_fields(true)
        .build()
        .expect("producer");
    let at = (p.publish_batch(STREAM, batch(0..10)).await).expect("warm-up");
    let id = (entries(&stack, STREAM, 2).into_iter())
        .find(|(s, id, _)| (*s, id) == (at[0].shard, &at[0].id))
        .and_then(|(_, _, f)| f.get("producer_id").cloned())
        .expect("the producer's entry");
    let record = rsc_protocol::routing::producer_key(&shard1, &id);
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&record)
        .query(&mut con)
        .expect("EXISTS");
    assert_eq!(exists, 1, "the producer record {record} exists");
    a_wrong_type_fails_the_publish(&p, &mut con, (STREAM, 2), &record, batch(10..20)).await;
}

/// The same on a Redis Cluster (one transaction per shard, its abort key in its slot): a
/// marker of the wrong type fails the publish to its shard and writes nothing there.
#[tokio::test]
async fn a_check_that_fails_writes_nothing_on_a_redis_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = rsc_testkit::RedisCluster::shared().expect("redis cluster starts");
    let coordinator = rsc_testkit::CoordinatorProcess::start_on_cluster(cluster, &[])
        .expect("coordinator starts");
    let api = rsc_e2e::Api::new(coordinator.url());
    let stream = format!("iw{}", std::process::id());
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "g-iw", "stream": stream, "shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let p = Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(cluster.urls().join(","))
        .redis_cluster(true)
        .build()
        .expect("producer");
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .and_then(|c| c.get_connection())
        .expect("cluster connection");
    // Records of shard 1 only: the other shard's transaction is not the one that fails.
    let on1: Vec<Record> = (0..40)
        .filter(|i| shard_for_key(format!("k{i}").as_bytes(), 2) == 1)
        .map(|i| Record::raw(format!("m{i}")).key(format!("k{i}")))
        .collect();
    assert!(!on1.is_empty());
    p.publish_batch(&stream, on1.clone())
        .await
        .expect("warm-up");
    let marker = rsc_protocol::routing::epoch_key(&shard_key(&stream, 1));
    a_wrong_type_fails_the_publish(&p, &mut con, (&stream, 2), &marker, on1).await;
}

/// What became of one publish of [`a_sentinel_failover_neither_duplicates_nor_loses`]: its
/// batch number and where its records went, or its error.
type Outcome = (u64, Result<Vec<Published>, String>);

/// Sentinel failover (PROTOCOL §21, "Across a failover"): an idempotent producer behind Redis
/// Sentinel, waiting for one replica (`WAIT 1`), publishes batches of 10 records numbered
/// in a loop (field `n`); the only replica is paused (SIGSTOP) so that the publish in flight
/// has its transaction sent to the replica but not confirmed, the master is killed (SIGKILL)
/// and the replica resumed: it reads what the master sent (the entries and the producer
/// records) and is promoted. The publish in flight is sent again to the new master, where
/// its records are found written (their entry ids are from before the kill) and not written
/// again; it returns success, with those ids, once a fresh replica confirms. The checker reads every shard on the final master: no two entries
/// share a number (the default producer writes no producer fields; its duplicate check lives
/// in the producer records, replicated with the entries), and every record of a publish that
/// returned success is there (`WAIT 1` with one replica: the promoted server had each of
/// them). A publish that returned an error (none is expected here) may be missing; it must
/// not be duplicated either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_neither_duplicates_nor_loses() {
    use rsc_testkit::{SENTINEL_MASTER, SentinelDeployment, Signal, signal};
    const STREAM: &str = "idem-sentinel";
    const SHARDS: u32 = 3;
    let _serial = SERIAL.lock().await;
    let mut deployment = SentinelDeployment::start(1, 3).expect("sentinel deployment starts");
    let coordinator =
        rsc_testkit::CoordinatorProcess::start(&["--store", "memory"]).expect("coordinator");
    let api = rsc_e2e::Api::new(coordinator.url());
    let (s, body) = (api.post(
        "/v1/groups",
        json!({"group": "g-sentinel", "stream": STREAM,
        "shard_count": SHARDS}),
    ))
    .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let p = Producer::builder()
        .coordinator(&coordinator.url())
        .redis_sentinel(deployment.sentinel_addrs(), SENTINEL_MASTER)
        .wait_for_replicas(1, Duration::from_millis(500))
        .retry_budget(Duration::from_secs(60))
        .build()
        .expect("producer");
    let (old, replica) = (deployment.servers[0].port(), deployment.servers[1].port());
    assert_eq!(deployment.master_port(), Some(old));
    let ok = Arc::new(AtomicU64::new(0));
    let current = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publishing = {
        let (ok, current, stop) = (ok.clone(), current.clone(), stop.clone());
        tokio::spawn(async move {
            let mut out: Vec<Outcome> = Vec::new();
            for b in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                current.store(b, Ordering::SeqCst);
                let r = p.publish_batch(STREAM, batch(b * 10..b * 10 + 10)).await;
                if r.is_ok() {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
                out.push((b, r.map_err(|e| format!("{e:#}"))));
            }
            out
        })
    };
    eventually("20 publishes confirmed", 20, || {
        (ok.load(Ordering::SeqCst) >= 20).then_some(())
    })
    .await;
    let replica_pid = deployment.servers[1].pid().expect("the replica runs");
    signal(replica_pid, Signal::SIGSTOP).expect("pause the replica");
    // The publish in flight waits for the paused replica (`WAIT`): its transaction ran and
    // was sent to the replica's socket, unconfirmed.
    eventually("a publish waits for the paused replica", 10, || {
        let info = deployment.servers[0].command("INFO clients").ok()?;
        info.contains("blocked_clients:1").then_some(())
    })
    .await;
    let in_flight = current.load(Ordering::SeqCst);
    let ok_at_kill = ok.load(Ordering::SeqCst);
    let kill_ms = pods::now_ms();
    deployment.servers[0].kill();
    signal(replica_pid, Signal::SIGCONT).expect("resume the replica");
    // The first sentinel that answers may lag the leader by a couple of seconds.
    eventually("the sentinels name the replica as master", 30, || {
        (deployment.master_port() == Some(replica)).then_some(())
    })
    .await;
    let fresh = rsc_testkit::RedisServer::start().expect("a new replica");
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(replica)
        .query(&mut redis_on(fresh.port()))
        .expect("REPLICAOF");
    eventually("20 more publishes confirmed after the failover", 60, || {
        (ok.load(Ordering::SeqCst) >= ok_at_kill + 20).then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let outcomes = publishing.await.expect("publishing task");
    let failed: Vec<(u64, &String)> = (outcomes.iter())
        .filter_map(|(b, r)| Some((*b, r.as_ref().err()?)))
        .collect();
    let (b, r) = &outcomes[in_flight as usize];
    assert_eq!(*b, in_flight);
    let at = r
        .as_ref()
        .expect("the publish in flight at the kill succeeds");

    let mut master = redis_on(replica);
    let role: redis::Value = redis::cmd("ROLE").query(&mut master).expect("ROLE");
    assert!(format!("{role:?}").contains("master"), "{role:?}");
    let all = entries_on(&mut master, STREAM, SHARDS);
    let mut pairs: HashMap<(String, String), usize> = HashMap::new();
    let mut numbers: HashMap<u64, usize> = HashMap::new();
    for (_, _, f) in &all {
        // The default producer writes no producer fields: duplicates show by number.
        if let (Some(id), Some(seq)) = (f.get("producer_id"), f.get("producer_seq")) {
            *pairs.entry((id.clone(), seq.clone())).or_default() += 1;
        }
        let n = f.get("n").and_then(|v| v.parse().ok()).expect("numbered");
        *numbers.entry(n).or_default() += 1;
    }
    let duplicates: usize = pairs.values().map(|&c| c - 1).sum();
    let twice = numbers.values().filter(|&&c| c > 1).count();
    let confirmed = outcomes.iter().filter(|(_, r)| r.is_ok());
    let lost: Vec<u64> = (confirmed.flat_map(|(b, _)| b * 10..b * 10 + 10))
        .filter(|n| !numbers.contains_key(n))
        .collect();
    println!(
        "Sentinel failover: {} publishes ({} failed: {failed:?}), in flight at the kill: \
         #{in_flight}; {} entries on the new master, {duplicates} duplicates, {} confirmed \
         records lost",
        outcomes.len(),
        failed.len(),
        all.len(),
        lost.len()
    );
    assert_eq!((duplicates, twice), (0, 0), "nothing written twice");
    assert!(lost.is_empty(), "confirmed records lost: {lost:?}");
    // Its records were replicated before the kill, not written again by the new master.
    let by_n: HashMap<u64, (u32, String)> = (all.into_iter())
        .filter_map(|(s, id, f)| Some((f.get("n")?.parse().ok()?, (s, id))))
        .collect();
    for (k, p) in at.iter().enumerate() {
        let n = in_flight * 10 + k as u64;
        assert_eq!(by_n.get(&n), Some(&(p.shard, p.id.clone())), "record {n}");
        let ms: u64 =
            p.id.split('-')
                .next()
                .and_then(|t| t.parse().ok())
                .expect("id");
        assert!(
            ms <= kill_ms,
            "record {n} ({}) written before the kill",
            p.id
        );
    }
}

fn redis_on(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("redis connection")
}

/// A producer with records that expire after `ttl` idle.
fn producer_with_ttl(stack: &Stack, ttl: Duration) -> Producer {
    Producer::builder()
        .coordinator(&stack.coordinator.url())
        .redis_url(stack.redis.url())
        .idempotence_ttl(ttl)
        .producer_fields(true)
        .build()
        .expect("producer")
}

/// Publishes records `range`, all with one key (so to one shard): the shard, the producer id
/// and the entry ids written.
async fn publish_one_shard(
    p: &Producer,
    stack: &Stack,
    stream: &str,
    range: std::ops::Range<u64>,
) -> (u32, String, Vec<String>) {
    let records = range.map(|i| {
        Record::raw(format!("m{i}"))
            .key("one")
            .field("n", i.to_string())
    });
    let at = p.publish_batch(stream, records).await.expect("publish");
    let shard = at[0].shard;
    assert!(at.iter().all(|a| a.shard == shard));
    let ids: Vec<String> = at.into_iter().map(|a| a.id).collect();
    let all = entries(stack, stream, 2);
    let (_, _, f) = (all.iter())
        .find(|(_, id, _)| *id == ids[0])
        .expect("the entry written");
    (shard, f["producer_id"].clone(), ids)
}

/// Writes reported published that vanish from their shard (the entries and the producer
/// record rolled back, as by a failover to a replica that had not received them, without
/// `WAIT`) are reported by the next publish to that shard, which succeeds and writes: first
/// with the record gone (sequences from 1), then with the record rewound. Successive
/// publishes report nothing.
#[tokio::test]
async fn writes_lost_after_a_publish_returned_are_reported_by_the_next_write() {
    const STREAM: &str = "idem-lost";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let p = producer_with_ttl(&stack, Duration::from_secs(60));
    let (shard, id, first) = publish_one_shard(&p, &stack, STREAM, 0..3).await;
    let (_, id2, _) = publish_one_shard(&p, &stack, STREAM, 3..4).await;
    assert_eq!(
        id2, id,
        "one lane: successive publishes share the producer id"
    );
    assert_eq!(p.lost_writes(), [], "successive publishes lose nothing");
    // Roll back everything the producer wrote: its entries and its record.
    let key = shard_key(STREAM, shard);
    let record = rsc_protocol::routing::producer_key(&key, &id);
    let mut con = stack.redis();
    let all: Vec<String> = (entries(&stack, STREAM, 2).into_iter())
        .filter(|(_, _, f)| f.get("producer_id") == Some(&id))
        .map(|(_, e, _)| e)
        .collect();
    assert_eq!(all.len(), 4);
    let _: () = redis::cmd("XDEL")
        .arg(&key)
        .arg(&all)
        .query(&mut con)
        .expect("XDEL");
    let _: () = redis::cmd("DEL").arg(&record).query(&mut con).expect("DEL");
    let (_, _, again) = publish_one_shard(&p, &stack, STREAM, 4..6).await;
    let lost = |first_seq, last_seq| LostWrites {
        stream: STREAM.into(),
        shard,
        producer_id: id.clone(),
        first_seq,
        last_seq,
    };
    assert_eq!(p.lost_writes(), [lost(1, 4)]);
    assert_eq!(
        check(&stack, STREAM, 2, 6).lost,
        4,
        "the new publish was written"
    );
    assert!(
        entries(&stack, STREAM, 2)
            .iter()
            .any(|(_, e, _)| *e == again[1])
    );
    assert_ne!(first, again);
    // The record rewound (its last write, sequences 5 and 6, rolled back).
    let _: () = redis::cmd("XDEL")
        .arg(&key)
        .arg(&again)
        .query(&mut con)
        .expect("XDEL");
    let _: () = (redis::cmd("HSET").arg(&record).arg("s").arg(4))
        .query(&mut con)
        .expect("HSET");
    publish_one_shard(&p, &stack, STREAM, 6..7).await;
    assert_eq!(p.lost_writes(), [lost(1, 4), lost(5, 6)]);
    publish_one_shard(&p, &stack, STREAM, 7..8).await;
    assert_eq!(p.lost_writes().len(), 2, "nothing lost since");
}

/// A producer record that expired because its producer wrote nothing to the shard for longer
/// than the idle expiry is not a loss: the next write does not report one.
#[tokio::test]
async fn a_record_expired_after_an_idle_lane_is_not_a_loss() {
    const STREAM: &str = "idem-idle";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let p = producer_with_ttl(&stack, Duration::from_secs(2));
    let (shard, id, _) = publish_one_shard(&p, &stack, STREAM, 0..2).await;
    let record = rsc_protocol::routing::producer_key(&shard_key(STREAM, shard), &id);
    let mut con = stack.redis();
    eventually("the producer record expired", 10, || {
        let n: i64 = redis::cmd("EXISTS")
            .arg(&record)
            .query(&mut con)
            .expect("EXISTS");
        (n == 0).then_some(())
    })
    .await;
    let (_, id2, _) = publish_one_shard(&p, &stack, STREAM, 2..3).await;
    assert_eq!(id2, id, "the same lane wrote again");
    assert_eq!(p.lost_writes(), [], "an expired record is not a loss");
    assert_eq!(check(&stack, STREAM, 2, 3).lost, 0);
}

/// A batch over both shards after only one shard was rolled back: the loss is reported for
/// that shard alone (its sequences from 1 up to the highest the producer wrote there), and
/// the whole batch is written.
#[tokio::test]
async fn a_loss_on_one_shard_of_a_batch_is_reported_for_that_shard_only() {
    const STREAM: &str = "idem-lost-one";
    let _serial = SERIAL.lock().await;
    let stack = stack_with(STREAM, 2).await;
    let p = producer_with_ttl(&stack, Duration::from_secs(60));
    let at = p
        .publish_batch(STREAM, batch(0..20))
        .await
        .expect("publish");
    assert!(at.iter().any(|a| a.shard == 0) && at.iter().any(|a| a.shard == 1));
    let on_0: Vec<Entry> = (entries(&stack, STREAM, 2).into_iter())
        .filter(|(s, _, _)| *s == 0)
        .collect();
    let id = on_0[0].2["producer_id"].clone();
    let top: u64 = (on_0.iter())
        .map(|(_, _, f)| f["producer_seq"].parse::<u64>().expect("seq"))
        .max()
        .expect("entries on shard 0");
    let key = shard_key(STREAM, 0);
    let mut con = stack.redis();
    let ids: Vec<&String> = on_0.iter().map(|(_, e, _)| e).collect();
    let _: () = redis::cmd("XDEL")
        .arg(&key)
        .arg(&ids)
        .query(&mut con)
        .expect("XDEL");
    let record = rsc_protocol::routing::producer_key(&key, &id);
    let _: () = redis::cmd("DEL").arg(&record).query(&mut con).expect("DEL");
    let again = p
        .publish_batch(STREAM, batch(20..40))
        .await
        .expect("publish");
    assert_eq!(again.len(), 20);
    let want = LostWrites {
        stream: STREAM.into(),
        shard: 0,
        producer_id: id,
        first_seq: 1,
        last_seq: top,
    };
    assert_eq!(p.lost_writes(), [want]);
    let c = check(&stack, STREAM, 2, 40);
    assert_eq!(
        (c.lost, c.duplicates),
        (on_0.len(), 0),
        "the second batch written in full"
    );
}
