//! Non-blocking retries end to end (GUIDE "Non-blocking retries: retry stages", PROTOCOL §2.2
//! "Retry stages"): a real redis-server, a real coordinator and a sample-consumer pod whose
//! listener gets `retry_stages = 1s,2s` from the environment (`RSC_LISTENER_G_RETRY_STAGES`).
//!
//! One key, five entries: seq 1 fails every attempt (poison), seq 3 fails its first attempt
//! only (flaky). The poison entry goes through stage 1 and stage 2, each after its delay, and
//! ends in `<stream>:dlq` with 3 attempts; the key's later entries are handled before its
//! first retry; the flaky entry is handled once, on its 2nd attempt, and never dead-lettered;
//! the retry streams end empty.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{Consumer, SERIAL, Stack, eventually, read_stream, xlen};

const STREAM: &str = "rs";
const SHARD: &str = "rs:0";
const RECORD: &str = "rs-handled";

fn publish(con: &mut redis::Connection, seq: u64) -> String {
    publish_to(con, SHARD, seq)
}

fn publish_to(con: &mut redis::Connection, shard: &str, seq: u64) -> String {
    redis::cmd("XADD")
        .arg(shard)
        .arg("*")
        .arg("payload")
        .arg(format!(r#"{{"seq":{seq},"key":"k"}}"#))
        .arg("key")
        .arg("k")
        .query(con)
        .expect("XADD")
}

fn id_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("an entry id")
}

#[tokio::test]
async fn a_poison_entry_goes_through_each_stage_to_the_dlq_and_its_key_does_not_wait() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack.create_group("g", STREAM, 1, 3000, 300).await;
    let _pod = Consumer::start_env(
        &stack,
        "127.0.0.61",
        &[
            "--group",
            "g",
            "--stream",
            STREAM,
            "--poison-seq",
            "1",
            "--flaky-seq",
            "3",
            "--record-stream",
            RECORD,
        ],
        &[("RSC_LISTENER_G_RETRY_STAGES", "1s,2s")],
    );
    stack.wait_stable("g", 1, 1).await;
    let mut con = stack.redis();
    let ids: Vec<String> = (1..=5).map(|seq| publish(&mut con, seq)).collect();

    let dead = eventually("the poison entry in the dlq", 30, || {
        let d = read_stream(&mut con, "rs:dlq");
        (!d.is_empty()).then_some(d)
    })
    .await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let d = &dead[0];
    assert_eq!(d["origin_id"], ids[0]);
    assert_eq!(d["attempts"], "3", "the first attempt and one per stage");
    assert!(d["error"].contains("failing seq 1 (attempt 3)"), "{d:?}");
    assert_eq!(d["key"], "k", "the entry's own fields are kept");
    let waited = d["failed_ms"].parse::<u64>().expect("failed_ms") - id_ms(&ids[0]);
    assert!(
        waited >= 3_000,
        "1 s in stage 1, then 2 s in stage 2: {waited} ms"
    );

    let handled = eventually("seq 2..5 handled", 10, || {
        let h = read_stream(&mut con, RECORD);
        (h.len() == 4).then_some(h)
    })
    .await;
    let by_seq = |seq: &str| {
        let found: Vec<_> = handled.iter().filter(|h| h["seq"] == seq).collect();
        assert_eq!(found.len(), 1, "seq {seq} handled once: {handled:?}");
        found[0].clone()
    };
    let ms = |h: &std::collections::HashMap<String, String>, f: &str| {
        h[f].parse::<u64>().expect("a number")
    };
    for seq in ["2", "4", "5"] {
        let h = by_seq(seq);
        assert_eq!(h["attempt"], "1");
        // The key did not wait for the poison entry's first retry (1 s after it failed).
        assert!(
            ms(&h, "finished_ms") < id_ms(&ids[0]) + 1_000,
            "seq {seq} handled at once: {h:?}"
        );
    }
    let flaky = by_seq("3");
    assert_eq!(flaky["attempt"], "2", "handled on its 2nd attempt");
    assert_eq!(flaky["entry_id"], ids[2], "under its shard id");
    assert_eq!(flaky["delivery_count"], "2");
    assert!(
        ms(&flaky, "started_ms") >= id_ms(&ids[2]) + 1_000,
        "after stage 1's delay: {flaky:?}"
    );

    // Nothing left: the retry streams are empty, nothing pending on the shard.
    for stage in 1..=2 {
        assert_eq!(xlen(&mut con, &format!("{{{SHARD}}}:retry:g:{stage}")), 0);
    }
    let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(SHARD)
        .arg("g")
        .query(&mut con)
        .expect("XPENDING");
    assert_eq!(pending.count(), 0);
}

/// A shard changes hands while an entry waits in its retry stage (GUIDE "Non-blocking
/// retries", PROTOCOL §2.2: "an entry not settled when the owner stops stays in its stream
/// for the next owner"): the first pod stages the flaky entry and is killed (-9) before its
/// delay ends; the next owner of the shard retries it when due, under its shard id, once, as
/// attempt 2; nothing is dead-lettered and the stage ends empty.
#[tokio::test]
async fn an_entry_waiting_in_a_stage_is_retried_by_the_next_owner_after_a_kill() {
    const STREAM: &str = "rsk";
    const SHARD: &str = "rsk:0";
    const RECORD: &str = "rsk-handled";
    let _serial = SERIAL.lock().await;
    let stack = Stack::start();
    stack.create_group("gk", STREAM, 1, 3000, 300).await;
    let args = [
        "--group",
        "gk",
        "--stream",
        STREAM,
        "--flaky-seq",
        "1",
        "--record-stream",
        RECORD,
    ];
    let env = [("RSC_LISTENER_GK_RETRY_STAGES", "5s")];
    let mut first = Consumer::start_env(&stack, "127.0.0.62", &args, &env);
    stack.wait_stable("gk", 1, 1).await;
    let mut con = stack.redis();
    let staged_id = publish_to(&mut con, SHARD, 1);
    publish_to(&mut con, SHARD, 2);
    let stage = format!("{{{SHARD}}}:retry:gk:1");
    eventually("the flaky entry staged and seq 2 handled", 10, || {
        (xlen(&mut con, &stage) == 1 && read_stream(&mut con, RECORD).len() == 1).then_some(())
    })
    .await;
    first.kill9();

    let _second = Consumer::start_env(&stack, "127.0.0.63", &args, &env);
    let handled = eventually("seq 1 retried by the next owner", 30, || {
        let h = read_stream(&mut con, RECORD);
        h.iter().any(|h| h["seq"] == "1").then_some(h)
    })
    .await;
    let retried: Vec<_> = handled.iter().filter(|h| h["seq"] == "1").collect();
    assert_eq!(retried.len(), 1, "handled once: {handled:?}");
    assert_eq!(retried[0]["attempt"], "2", "{handled:?}");
    assert_eq!(retried[0]["entry_id"], staged_id, "under its shard id");
    assert!(
        retried[0]["member"].starts_with("127.0.0.63-"),
        "by the next owner: {handled:?}"
    );
    eventually("the stage empty", 10, || {
        (xlen(&mut con, &stage) == 0).then_some(())
    })
    .await;
    assert!(read_stream(&mut con, "rsk:dlq").is_empty());
}
