//! Coordinated retention (PROTOCOL §18) end to end: a real redis-server, a real coordinator
//! reading it (`--data-redis-url`, sampling every 200 ms) and sample consumer pods. What every
//! group handled is trimmed; what any group still needs (no members, paused) stays until it
//! is handled; hard caps count what they drop.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods;

use crate::pods::{
    Consumer, SERIAL, Stack, eventually, eventually_async, finish_producer, handled,
    order_violations, spawn_producer, xlen,
};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

const SHARDS: u32 = 4;
const SESSION_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;

/// A stack whose coordinator samples (and so trims) every 200 ms.
fn stack() -> Stack {
    Stack::start_with_data_redis_args(&["--history-interval-ms", "200"])
}

async fn set_retention(stack: &Stack, stream: &str, retention: serde_json::Value) {
    let (s, v) = stack
        .api
        .call(
            Method::PATCH,
            &format!("/v1/streams/{stream}"),
            Some(json!({ "retention": retention })),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// A pod of concurrency 2 for `group`, recording what it handles in `record`.
fn pod(stack: &Stack, ip: &str, group: &str, stream: &str, record: &str) -> Consumer {
    Consumer::start(
        stack,
        ip,
        &[
            "--group",
            group,
            "--stream",
            stream,
            "--concurrency",
            "2",
            "--record-stream",
            record,
        ],
    )
}

/// Entries left in the stream's shard keys.
fn shard_entries(con: &mut redis::Connection, stream: &str) -> u64 {
    (0..SHARDS)
        .map(|i| xlen(con, &format!("{stream}:{i}")))
        .sum()
}

/// Waits until `record` holds `count` distinct shard entries (each handled at least once).
async fn wait_handled(stack: &Stack, record: &str, count: u64) {
    let mut con = stack.redis();
    eventually(&format!("{record}: all {count} handled"), 90, || {
        if xlen(&mut con, record) < count {
            return None;
        }
        let entries: HashSet<(u32, String)> = handled(&mut con, record)
            .into_iter()
            .map(|r| (r.shard, r.entry_id))
            .collect();
        (entries.len() as u64 == count).then_some(())
    })
    .await;
}

/// Waits until the stream's shards hold at most [`SLACK`] entries; past 90 s, panics with
/// what the coordinator's trimmer logged. (New entries on a shard that was idle are seen at
/// the sampler's once-a-minute re-read of it, ARCHITECTURE "How lag is sampled".)
async fn wait_trimmed(stack: &Stack, stream: &str) {
    let mut con = stack.redis();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while shard_entries(&mut con, stream) > SLACK {
        if tokio::time::Instant::now() > deadline {
            let log: Vec<String> = stack
                .coordinator
                .log()
                .into_iter()
                .filter(|l| l.contains("retention"))
                .collect();
            panic!(
                "{stream} not trimmed: {} entries left; trimmer log:\n{}",
                shard_entries(&mut con, stream),
                log.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Entries a `~` trim may leave: up to one Redis stream node (100 entries) per shard.
const SLACK: u64 = 100 * SHARDS as u64;

/// The window of a negative check: ten sampling passes.
const WINDOW: Duration = Duration::from_secs(2);

#[tokio::test]
async fn entries_every_group_acknowledged_are_trimmed() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("a", "ret", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    stack
        .create_group("b", "ret", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    let (_, v) = stack.api.get("/v1/streams/ret").await;
    assert_eq!(
        v["retention"]["keep_acked_ms"], 3_600_000,
        "the default keeps an hour"
    );
    set_retention(&stack, "ret", json!({"keep_acked_ms": 0})).await;
    let _pa = pod(&stack, "127.0.0.21", "a", "ret", "rec-a");
    let _pb = pod(&stack, "127.0.0.22", "b", "ret", "rec-b");
    stack.wait_stable("a", 2, SHARDS as usize).await;
    stack.wait_stable("b", 2, SHARDS as usize).await;
    let count = 5_000;
    finish_producer(spawn_producer(&stack, "ret", count, 50, None), count);
    wait_handled(&stack, "rec-a", count).await;
    wait_handled(&stack, "rec-b", count).await;
    let mut con = stack.redis();
    let left = eventually("the acknowledged entries trimmed", 90, || {
        let n = shard_entries(&mut con, "ret");
        (n <= SLACK).then_some(n)
    })
    .await;
    let trimmed = stack
        .api
        .metric("rsc_retention_trimmed_entries_total", &[("stream", "ret")])
        .await;
    assert_eq!(trimmed as u64 + left, count, "trimmed + left = written");
    let commands = stack
        .api
        .metric("rsc_retention_trim_commands_total", &[])
        .await;
    eprintln!(
        "RETENTION: {count} written to {SHARDS} shards, 2 groups: {left} left after both acked, {trimmed} trimmed with {commands} trim commands"
    );
    assert_eq!(
        stack
            .api
            .metric("rsc_retention_dropped_undelivered_total", &[])
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_group_without_members_keeps_what_it_has_not_handled() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("a", "idle", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    stack
        .create_group("late", "idle", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    set_retention(&stack, "idle", json!({"keep_acked_ms": 0})).await;
    let _pa = pod(&stack, "127.0.0.23", "a", "idle", "rec-a");
    stack.wait_stable("a", 2, SHARDS as usize).await;
    // `late` has members for a while, handles the first batch and leaves.
    let mut late = pod(&stack, "127.0.0.24", "late", "idle", "rec-late");
    stack.wait_stable("late", 2, SHARDS as usize).await;
    finish_producer(spawn_producer(&stack, "idle", 1_000, 50, None), 1_000);
    wait_handled(&stack, "rec-late", 1_000).await;
    late.terminate();
    let mut con = stack.redis();
    eventually_async("late has no members", 30, || async {
        let g = stack.group("late").await;
        g["members"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(())
    })
    .await;
    // More entries while `late` has none: `a` handles them, `late` still needs them.
    finish_producer(spawn_producer(&stack, "idle", 3_000, 50, None), 3_000);
    wait_handled(&stack, "rec-a", 4_000).await;
    tokio::time::sleep(WINDOW).await;
    let left = shard_entries(&mut con, "idle");
    assert!(
        left >= 3_000,
        "entries `late` has not handled were trimmed: {left} left"
    );
    let (_, v) = stack.api.get("/v1/streams/idle").await;
    assert_eq!(v["retention_blocked_by"], "late", "{v}");
    // Back with members, it handles every one of them: nothing lost.
    let _late = pod(&stack, "127.0.0.25", "late", "idle", "rec-late");
    wait_handled(&stack, "rec-late", 4_000).await;
    wait_trimmed(&stack, "idle").await;
}

#[tokio::test]
async fn a_paused_group_holds_retention() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("a", "held", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    stack
        .create_group("p", "held", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    set_retention(&stack, "held", json!({"keep_acked_ms": 0})).await;
    let _pa = pod(&stack, "127.0.0.26", "a", "held", "rec-a");
    let _pp = pod(&stack, "127.0.0.27", "p", "held", "rec-p");
    stack.wait_stable("a", 2, SHARDS as usize).await;
    stack.wait_stable("p", 2, SHARDS as usize).await;
    let (s, _) = stack.api.post("/v1/groups/p/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    let count = 2_000;
    finish_producer(spawn_producer(&stack, "held", count, 50, None), count);
    wait_handled(&stack, "rec-a", count).await;
    tokio::time::sleep(WINDOW).await;
    let mut con = stack.redis();
    assert_eq!(
        shard_entries(&mut con, "held"),
        count,
        "nothing trimmed while p is paused"
    );
    let (s, _) = stack.api.post("/v1/groups/p/resume", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    wait_handled(&stack, "rec-p", count).await;
    wait_trimmed(&stack, "held").await;
}

#[tokio::test]
async fn hard_caps_trim_undelivered_entries_and_count_them() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    // A paused group (its consumer groups exist, it reads nothing): only the cap trims.
    stack
        .create_group("slow", "capped", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    let _pod = pod(&stack, "127.0.0.28", "slow", "capped", "rec-slow");
    stack.wait_stable("slow", 2, SHARDS as usize).await;
    let (s, _) = stack.api.post("/v1/groups/slow/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    set_retention(
        &stack,
        "capped",
        json!({"keep_acked_ms": 0, "max_entries_per_shard": 200}),
    )
    .await;
    let count = 4_000;
    finish_producer(spawn_producer(&stack, "capped", count, 50, None), count);
    let mut con = stack.redis();
    let left = eventually("the shards capped", 90, || {
        let n = shard_entries(&mut con, "capped");
        (n <= SHARDS as u64 * (200 + 100)).then_some(n)
    })
    .await;
    let dropped = eventually_async("the drops counted", 90, || async {
        let n = stack
            .api
            .metric(
                "rsc_retention_dropped_undelivered_total",
                &[("stream", "capped"), ("group", "slow")],
            )
            .await as u64;
        (n + shard_entries(&mut stack.redis(), "capped") == count).then_some(n)
    })
    .await;
    assert!(dropped >= count - left, "{dropped} counted, {left} left");
    let (_, audit) = stack.api.get("/v1/audit?stream=capped").await;
    let entries = audit["entries"].as_array().expect("entries");
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "stream.retention_dropped_undelivered"
                && e["request"]["body"]["dropped_undelivered"]["slow"].as_u64() > Some(0)),
        "{audit}"
    );
}

#[tokio::test]
async fn dead_letters_past_their_max_age_are_trimmed() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    let mut con = stack.redis();
    // One entry per stream node, so that the `~` trim is exact here.
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "stream-node-max-entries", "1"][..])
        .query(&mut con)
        .expect("CONFIG SET");
    for id in ["1000-1", "1000-2", "*"] {
        let _: String = redis::cmd("XADD")
            .arg(&["dl:dlq", id, "error", "boom"][..])
            .query(&mut con)
            .expect("XADD");
    }
    stack
        .create_group("a", "dl", 1, SESSION_MS, HEARTBEAT_MS)
        .await;
    let (_, v) = stack.api.get("/v1/streams/dl").await;
    assert_eq!(v["dlq_retention"]["max_age_ms"], 604_800_000_u64, "{v}");
    eventually("the dead letters older than 7 days trimmed", 30, || {
        (xlen(&mut con, "dl:dlq") == 1).then_some(())
    })
    .await;
    assert_eq!(
        stack
            .api
            .metric(
                "rsc_retention_dlq_trimmed_entries_total",
                &[("stream", "dl")]
            )
            .await,
        2.0
    );
}

/// Ordered resharding (PROTOCOL §15) 4 → 8 → rollback with `keep_acked_ms` 0 and a producer
/// running: the trimming passes no seal and no draining shard, so nothing is lost and every
/// key is handled in order; the stream is trimmed meanwhile.
#[tokio::test]
async fn an_ordered_reshard_and_rollback_with_retention_at_zero_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("g", "rs", SHARDS, SESSION_MS, HEARTBEAT_MS)
        .await;
    set_retention(&stack, "rs", json!({"keep_acked_ms": 0})).await;
    let args = [
        "--group",
        "g",
        "--stream",
        "rs",
        "--concurrency",
        "2",
        "--handle-ms",
        "2",
        "--record-stream",
        "rec-rs",
    ];
    let _pods: Vec<Consumer> = ["127.0.0.31", "127.0.0.32", "127.0.0.33"]
        .iter()
        .map(|ip| Consumer::start(&stack, ip, &args))
        .collect();
    stack.wait_stable("g", 6, SHARDS as usize).await;
    let count = 9_000;
    let producer = spawn_producer(&stack, "rs", count, 64, Some(2_000));
    eventually_async("a first trim", 30, || async {
        let n = stack
            .api
            .metric("rsc_retention_trimmed_entries_total", &[("stream", "rs")])
            .await;
        (n > 0.0).then_some(())
    })
    .await;
    let (s, v) = stack
        .api
        .post("/v1/streams/rs/reshard", json!({"shard_count": 8}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    stack.wait_stable("g", 6, 8).await;
    let (s, v) = stack.api.post("/v1/streams/rs/rollback", json!({})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    finish_producer(producer, count);
    let mut con = stack.redis();
    let records = eventually("every entry handled", 120, || {
        let rs = handled(&mut con, "rec-rs");
        let distinct: HashSet<(String, u64)> = rs.iter().map(|r| (r.key.clone(), r.seq)).collect();
        (distinct.len() as u64 >= count).then_some(rs)
    })
    .await;
    let distinct: HashSet<(String, u64)> = records.iter().map(|r| (r.key.clone(), r.seq)).collect();
    assert_eq!(distinct.len() as u64, count, "nothing lost");
    let (violations, examples) = order_violations(&records);
    assert_eq!(violations, 0, "per-key order: {examples:#?}");
    let trimmed = stack
        .api
        .metric("rsc_retention_trimmed_entries_total", &[("stream", "rs")])
        .await;
    assert!(trimmed > 0.0);
    assert_eq!(
        stack
            .api
            .metric("rsc_retention_dropped_undelivered_total", &[])
            .await,
        0.0
    );
}

/// A seek of a group whose shards were never written (no shard key exists yet, nor its
/// Redis consumer group) creates each shard's key and group at the target instead of failing
/// on the missing key.
#[tokio::test]
async fn seek_of_a_group_never_written_to_creates_its_shards_groups() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("fresh", "never-written", 3, SESSION_MS, HEARTBEAT_MS)
        .await;
    let mut con = stack.redis();
    let exists: u32 = redis::cmd("EXISTS")
        .arg("never-written:0")
        .query(&mut con)
        .expect("EXISTS");
    assert_eq!(exists, 0, "nothing wrote the shard key yet");
    for to in [json!({"time_ms": 1}), json!("latest"), json!("earliest")] {
        let (s, body) = stack
            .api
            .post("/v1/groups/fresh/seek", json!({ "to": to }))
            .await;
        assert_eq!(s, StatusCode::OK, "seek to {to}: {body}");
        assert_eq!(
            body["shards"].as_object().map(|m| m.len()),
            Some(3),
            "{body}"
        );
    }
    for shard in 0..3 {
        let groups: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(format!("never-written:{shard}"))
            .query(&mut con)
            .expect("XINFO GROUPS");
        assert_eq!(groups.len(), 1, "shard {shard}: one consumer group");
    }
}

/// `POST /v1/groups/{group}/seek` by time (PROTOCOL §18): refused while the group runs, then,
/// paused, the group is moved back and handles again exactly the entries from that time on.
#[tokio::test]
async fn seek_by_time_replays_the_entries_from_then_on() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("g", "sk", 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    let _pod = pod(&stack, "127.0.0.35", "g", "sk", "rec-sk");
    stack.wait_stable("g", 2, 2).await;
    finish_producer(spawn_producer(&stack, "sk", 600, 20, None), 600);
    wait_handled(&stack, "rec-sk", 600).await;
    let t = pods::now_ms() + 1;
    eventually("a later millisecond", 5, || {
        (pods::now_ms() > t).then_some(())
    })
    .await;
    finish_producer(spawn_producer(&stack, "sk", 400, 20, None), 400);
    wait_handled(&stack, "rec-sk", 1_000).await;
    let (s, body) = stack
        .api
        .post("/v1/groups/g/seek", json!({"to": {"time_ms": t}}))
        .await;
    assert_eq!(
        (s, rsc_e2e::code(&body)),
        (StatusCode::CONFLICT, "GROUP_NOT_EMPTY"),
        "{body}"
    );
    let (s, _) = stack.api.post("/v1/groups/g/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = stack
        .api
        .post("/v1/groups/g/seek", json!({"to": {"time_ms": t}}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(
        body["shards"].as_object().map(|m| m.len()),
        Some(2),
        "{body}"
    );
    let (s, _) = stack.api.post("/v1/groups/g/resume", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    // New entries after the seek are handled too (`replay.rs` shows idle shards re-deliver
    // with nothing published).
    finish_producer(spawn_producer(&stack, "sk", 20, 20, None), 20);
    let mut con = stack.redis();
    let records = eventually("the entries after the seek handled again", 60, || {
        let rs = handled(&mut con, "rec-sk");
        (rs.len() >= 1_420).then_some(rs)
    })
    .await;
    let id_ms = |id: &str| -> u64 { id.split('-').next().unwrap().parse().unwrap() };
    let from_t: HashSet<(u32, String)> = records
        .iter()
        .filter(|r| id_ms(&r.entry_id) >= t)
        .map(|r| (r.shard, r.entry_id.clone()))
        .collect();
    assert_eq!(
        from_t.len(),
        420,
        "the second and third batches were written after t"
    );
    let again: HashSet<(u32, String)> = records[1_000..]
        .iter()
        .map(|r| (r.shard, r.entry_id.clone()))
        .collect();
    assert_eq!(records.len(), 1_420, "nothing before t handled again");
    assert_eq!(
        again, from_t,
        "exactly the entries from t on are handled after the seek"
    );
    let (_, audit) = stack.api.get("/v1/audit?group=g").await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "group.seek" && e["result"]["status"] == 200),
        "{audit}"
    );
}

/// Runs `rsc-coordinator <args> --coordinator <url>`: (exit code, stdout, stderr).
pub(crate) fn operator_cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let out =
        std::process::Command::new(rsc_testkit::binary_path("rsc-coordinator").expect("built"))
            .args(args)
            .args(["--coordinator", url])
            .env_remove("RSC_TOKEN")
            .output()
            .expect("the CLI runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Dead-letter redrive (PROTOCOL §18): a pod dead-letters every entry of a poison key; a dry
/// run lists them and changes nothing; bad input is refused clearly; the redrive (API with
/// a limit, then the CLI) republishes them to the key's shard with `rsc-redrive-count` and
/// empties `<stream>:dlq`; a healthy pod of the group then handles them all, in key order,
/// while a pod of another group of the stream acknowledges them without handling them.
#[tokio::test]
async fn redrive_republishes_the_dead_letters_and_empties_the_dlq() {
    let _serial = SERIAL.lock().await;
    let stack = stack();
    stack
        .create_group("g", "rd", 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    stack
        .create_group("other", "rd", 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    let other_pod = pod(&stack, "127.0.0.45", "other", "rd", "rec-rd-other");
    let mut sick = Consumer::start(
        &stack,
        "127.0.0.36",
        &[
            "--group",
            "g",
            "--stream",
            "rd",
            "--record-stream",
            "rec-rd",
            "--poison-key",
            "k3",
            "--max-retries",
            "0",
        ],
    );
    stack.wait_stable("g", 1, 2).await;
    stack.wait_stable("other", 2, 2).await;
    finish_producer(spawn_producer(&stack, "rd", 200, 10, None), 200);
    let mut con = stack.redis();
    eventually("20 dead letters of k3 and 180 handled", 30, || {
        (xlen(&mut con, "rd:dlq") == 20 && xlen(&mut con, "rec-rd") >= 180).then_some(())
    })
    .await;
    sick.terminate();
    let shards_before = xlen(&mut con, "rd:0") + xlen(&mut con, "rd:1");
    let redrive = |body: serde_json::Value| {
        let api = &stack.api;
        async move { api.post("/v1/streams/rd/dlq/redrive", body).await }
    };
    // A dry run lists the 20 and changes nothing.
    let (s, dry) = redrive(json!({"group": "g", "dry_run": true})).await;
    assert_eq!(s, StatusCode::OK, "{dry}");
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["redriven"].as_u64()),
        (Some(true), Some(20)),
        "{dry}"
    );
    let k3_shard = dry["entries"][0]["shard"].as_u64().unwrap();
    assert!(
        dry["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["key"] == "k3"
                && e["shard"] == k3_shard
                && e.get("id").is_none()
                && e["redrive_count"] == 1),
        "{dry}"
    );
    assert_eq!(xlen(&mut con, "rd:dlq"), 20, "a dry run removes nothing");
    assert_eq!(
        xlen(&mut con, "rd:0") + xlen(&mut con, "rd:1"),
        shards_before,
        "nor writes"
    );
    // Bad input: clear refusals.
    for (body, path, status, code) in [
        (
            json!({"group": "nope"}),
            "/v1/streams/rd/dlq/redrive",
            StatusCode::NOT_FOUND,
            "GROUP_NOT_FOUND",
        ),
        (
            json!({"group": "g"}),
            "/v1/streams/nope/dlq/redrive",
            StatusCode::NOT_FOUND,
            "STREAM_NOT_FOUND",
        ),
        (
            json!({"group": "g", "limit": 0}),
            "/v1/streams/rd/dlq/redrive",
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        (
            json!({"group": "g", "since_ms": "yesterday"}),
            "/v1/streams/rd/dlq/redrive",
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
    ] {
        let (s, b) = stack.api.post(path, body).await;
        assert_eq!((s, rsc_e2e::code(&b)), (status, code), "{path}: {b}");
    }
    let url = stack.coordinator.url();
    let (code, _, err) = operator_cli(
        &url,
        &[
            "dlq",
            "redrive",
            "rd",
            "--group",
            "g",
            "--since",
            "yesterday",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Unix time in ms"), "{err}");
    let (code, _, err) = operator_cli(&url, &["dlq", "redrive", "rd", "--group", "nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("GROUP_NOT_FOUND"), "{err}");
    // A since after every dead letter takes none.
    let (s, none) = redrive(json!({"group": "g", "since_ms": pods::now_ms() + 60_000})).await;
    assert_eq!(
        (s, none["redriven"].as_u64()),
        (StatusCode::OK, Some(0)),
        "{none}"
    );
    // The redrive: 5 through the API, the other 15 through the CLI.
    let (s, first) = redrive(json!({"group": "g", "limit": 5})).await;
    assert_eq!(
        (s, first["redriven"].as_u64()),
        (StatusCode::OK, Some(5)),
        "{first}"
    );
    assert_eq!(xlen(&mut con, "rd:dlq"), 15);
    let (code, out, err) = operator_cli(
        &url,
        &["dlq", "redrive", "rd", "--group", "g", "--output", "json"],
    );
    assert_eq!(code, 0, "{err}");
    let rest: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(rest["redriven"].as_u64(), Some(15), "{rest}");
    assert_eq!(
        xlen(&mut con, "rd:dlq"),
        0,
        "the dead-letter stream is emptied"
    );
    assert_eq!(
        xlen(&mut con, "rd:0") + xlen(&mut con, "rd:1"),
        shards_before + 20,
        "each republished once"
    );
    let shard_key = format!("rd:{k3_shard}");
    let republished: Vec<_> = pods::read_stream(&mut con, &shard_key)
        .into_iter()
        .filter(|e| {
            e.get("headers")
                .is_some_and(|h| h.contains("rsc-redrive-count"))
        })
        .collect();
    assert_eq!(republished.len(), 20, "on the key's shard");
    assert!(
        republished.iter().all(|e| e["key"] == "k3"
            && e["headers"].contains(r#""rsc-redrive-count":"1""#)
            && e["headers"].contains(r#""rsc-redrive-group":"g""#)
            && !e.contains_key("error")),
        "{republished:?}"
    );
    // A healthy pod handles them all, in per-key order.
    let _healthy = pod(&stack, "127.0.0.37", "g", "rd", "rec-rd");
    let records = eventually("the 20 redriven entries handled", 30, || {
        let rs = handled(&mut con, "rec-rd");
        let k3: Vec<_> = rs.into_iter().filter(|r| r.key == "k3").collect();
        (k3.len() >= 20).then_some(k3)
    })
    .await;
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(seqs, sorted, "per-key order of the redriven entries");
    assert_eq!(seqs.len(), 20, "each handled once");
    // The other group was delivered the 20 too (nothing pending, no lag on either shard) and
    // handled none of them: its record holds the 200 originals only.
    eventually("the other group acknowledged everything", 30, || {
        ["rd:0", "rd:1"]
            .iter()
            .all(|key| pods::group_on_shard(&mut con, key, "other") == (0, Some(0)))
            .then_some(())
    })
    .await;
    let other = handled(&mut con, "rec-rd-other");
    assert_eq!(
        other.len(),
        200,
        "the other group handled only the originals"
    );
    let skipped = other_pod
        .metric(
            "rsc_client_redriven_skipped_total",
            &[("group", "other"), ("stream", "rd")],
        )
        .await;
    assert_eq!(skipped, Some(20.0), "counted as skipped");
    let (_, audit) = stack.api.get("/v1/audit").await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "stream.dlq_redrive" && e["result"]["status"] == 200),
        "{audit}"
    );
}

/// Retention on a Redis Cluster data Redis (PROTOCOL §18): the shard keys sit in different
/// slots (the lag reads and the trims go one pipeline per key); what both groups handled is
/// trimmed. Then a dead-letter redrive on the cluster reaches only its group.
#[tokio::test]
async fn entries_every_group_acknowledged_are_trimmed_on_a_redis_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = rsc_testkit::RedisCluster::shared().expect("cluster");
    let seeds = cluster.urls().join(",");
    let coordinator = rsc_testkit::CoordinatorProcess::start(&[
        "--store",
        "memory",
        "--data-redis-url",
        &seeds,
        "--data-redis-cluster",
        "--history-interval-ms",
        "200",
    ])
    .expect("coordinator");
    let api = rsc_e2e::Api::new(coordinator.url());
    let stream = format!("{}-ret", rsc_e2e::unique_key_prefix());
    for g in ["a", "b"] {
        let (s, b) = api
            .post(
                "/v1/groups",
                json!({"group": g, "stream": stream, "shard_count": SHARDS,
                    "session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": HEARTBEAT_MS,
                    "retention": {"keep_acked_ms": 0}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let seen: std::sync::Arc<std::sync::Mutex<HashSet<(String, String)>>> = Default::default();
    let mut app = rsc_client::ConsumerApp::builder()
        .coordinator(&coordinator.url())
        .redis_url(&seeds)
        .redis_cluster(true)
        .instance_id("127.0.0.38");
    for g in ["a", "b"] {
        let seen = seen.clone();
        app = app.listener(
            rsc_client::Listener::new(
                g,
                &stream,
                move |m: rsc_client::Message<rsc_client::Raw>| {
                    let seen = seen.clone();
                    async move {
                        let id = format!("{}/{}", m.shard(), m.id());
                        seen.lock().unwrap().insert((g.to_owned(), id));
                        Ok::<(), rsc_client::HandlerError>(())
                    }
                },
            )
            .batch_size(64),
        );
    }
    let app = app.build().expect("app");
    let run = tokio::spawn(app.run_until(std::future::pending()));
    let producer = rsc_client::producer::Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(&seeds)
        .redis_cluster(true)
        .build()
        .expect("producer");
    let n = 2_000u64;
    for chunk in 0..(n / 200) {
        let records = (0..200).map(|i| {
            rsc_client::producer::Record::raw(format!("m{}", chunk * 200 + i)).key(format!("k{i}"))
        });
        producer
            .publish_batch(&stream, records)
            .await
            .expect("publish");
    }
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let mut con = client.get_connection().expect("cluster");
    let on_shards = |con: &mut redis::cluster::ClusterConnection| -> u64 {
        (0..SHARDS)
            .map(|i| {
                redis::cmd("XLEN")
                    .arg(format!("{stream}:{i}"))
                    .query::<u64>(con)
                    .unwrap()
            })
            .sum()
    };
    // Every entry landed: counted by `entries-added` (Redis 7), which trimming does not
    // lower — the consumers and retention (keep_acked_ms 0) are already at work.
    let added: u64 = (0..SHARDS)
        .map(|i| {
            let info: std::collections::HashMap<String, redis::Value> = redis::cmd("XINFO")
                .arg("STREAM")
                .arg(format!("{stream}:{i}"))
                .query(&mut con)
                .unwrap();
            redis::from_redis_value_ref::<u64>(&info["entries-added"]).unwrap()
        })
        .sum();
    assert_eq!(added, n);
    eventually("both groups handled every entry", 30, || {
        (seen.lock().unwrap().len() as u64 == 2 * n).then_some(())
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while on_shards(&mut con) > SLACK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stream} not trimmed on the cluster: {} entries left",
            on_shards(&mut con)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let trimmed = api
        .metric(
            "rsc_retention_trimmed_entries_total",
            &[("stream", stream.as_str())],
        )
        .await;
    assert!(trimmed >= (n - SLACK) as f64, "trimmed {trimmed}");

    // Redrive on the cluster: dead letters of group a (in `<stream>:dlq`'s slot) go back to
    // their keys' shards (other slots, one fenced transaction each); a handles them, b
    // acknowledges them unhandled.
    let dlq = format!("{stream}:dlq");
    for i in 0..6 {
        let _: String = redis::cmd("XADD")
            .arg(&dlq)
            .arg("*")
            .arg(&[
                ("payload", format!("dead{i}")),
                ("key", format!("k{i}")),
                ("group", "a".into()),
                ("error", "boom".into()),
                ("origin", format!("{stream}:0")),
                ("origin_id", "1-0".into()),
                ("attempts", "1".into()),
            ])
            .query(&mut con)
            .expect("XADD dead letter");
    }
    let (s, b) = api
        .post(
            &format!("/v1/streams/{stream}/dlq/redrive"),
            json!({"group": "a"}),
        )
        .await;
    assert_eq!(
        (s, b["redriven"].as_u64()),
        (StatusCode::OK, Some(6)),
        "{b}"
    );
    let left: u64 = redis::cmd("XLEN").arg(&dlq).query(&mut con).unwrap();
    assert_eq!(left, 0, "the dead-letter stream is emptied");
    let count = |g: &str| seen.lock().unwrap().iter().filter(|(h, _)| h == g).count() as u64;
    eventually("group a handled the 6 redriven entries", 30, || {
        (count("a") == n + 6).then_some(())
    })
    .await;
    // b has been delivered everything on every shard and has nothing pending.
    let caught_up = |con: &mut redis::cluster::ClusterConnection, key: &str| {
        let info: redis::streams::StreamInfoStreamReply = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(key)
            .query(con)
            .unwrap();
        let b = pods::group_info(con, key, "b");
        b.pending == 0 && b.last_delivered_id == info.last_generated_id
    };
    eventually("group b acknowledged them", 30, || {
        (0..SHARDS)
            .all(|i| caught_up(&mut con, &format!("{stream}:{i}")))
            .then_some(())
    })
    .await;
    assert_eq!(count("b"), n, "group b handled none of a's redrive");
    run.abort();
}
