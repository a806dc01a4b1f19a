//! The metadata history (PROTOCOL §22) on real coordinator processes: every committed change
//! of a group or stream document is listed with its cause and principal (admin changes, a
//! rebalance from members' heartbeats), a steady heartbeat writes nothing, two revisions
//! diff, and a group restored to an earlier revision gets its settings back with every
//! member removed and epochs above any held: the old members are fenced and rejoin higher.
//! A restore while members are live is refused unless forced. Run on the memory store and on
//! a Redis Cluster store (the history shares its document's slot), and through the CLI.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use reqwest::{Method, StatusCode};
use rsc_e2e::{Api, Backend, Stack, code};
use rsc_testkit::binary_path;
use serde_json::{Value, json};
use std::process::{Command, Stdio};

const GROUP: &str = "hist";
const STREAM: &str = "hist-s";

async fn revisions(api: &Api, path: &str) -> Vec<Value> {
    let (status, body) = api.get(path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["revisions"].as_array().expect("revisions").clone()
}

fn revision_numbers(recs: &[Value]) -> Vec<u64> {
    recs.iter().map(|r| r["r"].as_u64().unwrap()).collect()
}

/// Creates the group, changes its session timeout, and lets two members join and settle.
/// Returns the members' epochs.
async fn populate(api: &Api) -> (i64, i64, Vec<u32>) {
    let (s, b) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": STREAM, "shard_count": 4, "session_timeout_ms": 30000}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = api
        .call(
            Method::PATCH,
            &format!("/v1/groups/{GROUP}"),
            Some(json!({"session_timeout_ms": 45000})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, a) = api.heartbeat(GROUP, "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{a}");
    let (s, b) = api.heartbeat(GROUP, "m2", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // m1 gives up what m2 now targets, then both converge.
    let mut e1 = a["member_epoch"].as_i64().unwrap();
    let mut e2 = b["member_epoch"].as_i64().unwrap();
    let (mut own1, mut own2) = (shards(&a), shards(&b));
    for _ in 0..10 {
        let (_, a) = api.heartbeat(GROUP, "m1", e1, &own1).await;
        let (_, b) = api.heartbeat(GROUP, "m2", e2, &own2).await;
        e1 = a["member_epoch"].as_i64().unwrap();
        e2 = b["member_epoch"].as_i64().unwrap();
        (own1, own2) = (shards(&a), shards(&b));
    }
    assert_eq!(
        own1.len() + own2.len(),
        4,
        "every shard owned: {own1:?} {own2:?}"
    );
    (e1, e2, own1)
}

fn shards(answer: &Value) -> Vec<u32> {
    answer["assignment"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .unwrap_or_default()
}

async fn history_restore_and_fencing(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    let (e1, e2, own1) = populate(api).await;
    let path = format!("/v1/groups/{GROUP}/revisions?limit=1000");
    let recs = revisions(api, &path).await;
    let revs = revision_numbers(&recs);
    let (_, view) = api.get(&format!("/v1/groups/{GROUP}")).await;
    let (_, page) = api.get(&path).await;
    let current = page["revision"].as_u64().unwrap();
    assert_eq!(revs[0], current, "newest first, up to the current revision");
    assert_eq!(
        revs,
        (1..=current).rev().collect::<Vec<_>>(),
        "one record per revision, none missing"
    );
    let oldest = &recs[recs.len() - 1];
    assert_eq!(
        (oldest["c"].as_str(), oldest["p"].as_str()),
        (Some("admin"), Some("anonymous"))
    );
    let patch = &recs[recs.len() - 2];
    assert_eq!(patch["c"], "admin");
    assert!(
        patch["d"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["k"] == "/config/session_timeout_ms" && c["o"] == 30000 && c["n"] == 45000),
        "the patch records the old and new timeout: {patch}"
    );
    assert!(
        recs.iter().any(|r| r["c"] == "heartbeat" && r["p"] == "m2"),
        "the join and rebalance are recorded with the member: {recs:?}"
    );
    // Steady heartbeats change nothing and write nothing.
    let (_, a) = api.heartbeat(GROUP, "m1", e1, &own1).await;
    assert_eq!(a["member_epoch"].as_i64(), Some(e1));
    let (_, page) = api.get(&path).await;
    assert_eq!(
        page["revision"].as_u64(),
        Some(current),
        "a steady heartbeat wrote nothing"
    );

    // Diff of the patch.
    let (s, d) = api
        .get(&format!("/v1/groups/{GROUP}/diff?from=1&to=2"))
        .await;
    assert_eq!(s, StatusCode::OK, "{d}");
    let paths: Vec<&str> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["k"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/assignment_epoch",
            "/config/session_timeout_ms",
            "/group_epoch"
        ],
        "a patch changes the setting and bumps the epochs: {d}"
    );
    let (s, e) = api
        .get(&format!(
            "/v1/groups/{GROUP}/diff?from=0&to={}",
            current + 5
        ))
        .await;
    assert_eq!((s, code(&e)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));

    // Refused while live, planned in a dry run, then forced.
    let restore = format!("/v1/groups/{GROUP}/restore");
    let (s, e) = api.post(&restore, json!({"revision": 1})).await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::CONFLICT, "GROUP_NOT_EMPTY"),
        "{e}"
    );
    let (s, plan) = api
        .post(
            &restore,
            json!({"revision": 1, "force": true, "dry_run": true}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{plan}");
    assert_eq!(plan["members_removed"], json!(["m1", "m2"]));
    let (_, page) = api.get(&path).await;
    assert_eq!(
        page["revision"].as_u64(),
        Some(current),
        "a dry run changes nothing"
    );
    let (s, done) = api
        .post(&restore, json!({"revision": 1, "force": true}))
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    let old_epoch = view["group_epoch"].as_u64().unwrap();
    let (_, after) = api.get(&format!("/v1/groups/{GROUP}")).await;
    assert_eq!(
        after["session_timeout_ms"], 30000,
        "the settings of revision 1"
    );
    assert!(
        after["group_epoch"].as_u64().unwrap() >= old_epoch + 1000,
        "{after}"
    );
    assert_eq!(after["members"].as_array().map(Vec::len), Some(0));
    let recs = revisions(api, &path).await;
    assert_eq!(
        (recs[0]["c"].as_str(), recs[0]["r"].as_u64()),
        (Some("restore"), done["revision"].as_u64())
    );

    // The old members are fenced: their epochs are unknown; they rejoin above them.
    for (m, e) in [("m1", e1), ("m2", e2)] {
        let (s, body) = api.heartbeat(GROUP, m, e, &[]).await;
        assert_eq!(code(&body), "UNKNOWN_MEMBER_ID", "{m} at {e}: {s} {body}");
        let (s, body) = api.heartbeat(GROUP, m, 0, &[]).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert!(body["member_epoch"].as_i64().unwrap() > e + 1000, "{body}");
    }
    let (_, audit) = api
        .get(&format!("/v1/audit?group={GROUP}&log=mutations"))
        .await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "group.restore"),
        "the restore is audited: {audit}"
    );
    let srecs = revisions(api, &format!("/v1/streams/{STREAM}/revisions")).await;
    assert_eq!(
        srecs.last().unwrap()["c"],
        "admin",
        "the stream's creation: {srecs:?}"
    );
}

#[tokio::test]
async fn history_restore_and_fencing_in_memory() {
    history_restore_and_fencing(Backend::Memory).await;
}

#[tokio::test]
async fn history_restore_and_fencing_on_a_cluster_store() {
    history_restore_and_fencing(Backend::RedisCluster).await;
}

fn cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(binary_path("rsc-coordinator").expect("binary built"))
        .args(args)
        .arg("--coordinator")
        .arg(url)
        .env_remove("RSC_COORDINATOR_URL")
        .env_remove("RSC_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("cli runs");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `group revisions` (text and JSON), `group diff`, and `group restore` (a dry run unless
/// `--execute`, refused while live unless `--force`).
#[tokio::test]
async fn the_cli_lists_diffs_and_restores() {
    let stack = Stack::start(Backend::Memory, &[]);
    let url = stack.coordinator.url();
    populate(&stack.api).await;
    let (rc, out, err) = cli(&url, &["group", "revisions", GROUP]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("REVISION")
            && out.contains("heartbeat")
            && out.contains("/config/session_timeout_ms"),
        "{out}"
    );
    let (rc, out, err) = cli(
        &url,
        &[
            "group",
            "revisions",
            GROUP,
            "--limit",
            "2",
            "--output",
            "json",
        ],
    );
    assert_eq!(rc, 0, "{err}");
    let page: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(page["revisions"].as_array().map(Vec::len), Some(2));
    assert!(page["next_before"].is_u64(), "{page}");
    let (rc, out, err) = cli(&url, &["group", "diff", GROUP, "--from", "1", "--to", "2"]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("/config/session_timeout_ms")
            && out.contains("30000")
            && out.contains("45000"),
        "{out}"
    );
    let (rc, _, err) = cli(
        &url,
        &["group", "restore", GROUP, "--revision", "1", "--execute"],
    );
    assert_ne!(rc, 0);
    assert!(err.contains("GROUP_NOT_EMPTY"), "{err}");
    let (rc, out, err) = cli(
        &url,
        &["group", "restore", GROUP, "--revision", "1", "--force"],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("Dry run") && out.contains("--execute"),
        "{out}"
    );
    let (rc, out, err) = cli(
        &url,
        &[
            "group",
            "restore",
            GROUP,
            "--revision",
            "1",
            "--force",
            "--execute",
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("Restored group"), "{out}");
    let (_, view) = stack.api.get(&format!("/v1/groups/{GROUP}")).await;
    assert_eq!(view["session_timeout_ms"], 30000);
}

/// Heartbeats every member in turn until the assignment settles; updates epochs and shards.
async fn settle(api: &Api, members: &mut [(&str, i64, Vec<u32>)]) {
    for _ in 0..10 {
        for (m, e, own) in members.iter_mut() {
            let (s, a) = api.heartbeat(GROUP, m, *e, own).await;
            assert_eq!(s, StatusCode::OK, "{m}: {a}");
            *e = a["member_epoch"].as_i64().unwrap();
            *own = shards(&a);
        }
    }
    let owned: usize = members.iter().map(|(_, _, o)| o.len()).sum();
    assert_eq!(owned, 4, "every shard owned once settled");
}

/// The store is brought back from an older snapshot (here: the group document rewritten by
/// hand to a revision from before the second member joined). The first heartbeat whose epoch
/// is above every epoch the stored document records, confirmed by the recovery copy in the
/// data Redis (a member's word alone is not enough), shows the store went back: the group is
/// rewritten with no members and epochs 1000 above that epoch, every member is answered
/// `UNKNOWN_MEMBER_ID` — none is trusted on the old document's word — and they rejoin higher.
#[tokio::test]
async fn a_store_brought_back_from_an_older_snapshot_fences_every_member() {
    let data = rsc_testkit::RedisServer::start().expect("data redis-server starts");
    let data_url = data.url();
    let stack = Stack::start(Backend::Redis, &["--data-redis-url", &data_url]);
    let api = &stack.api;
    let at = stack
        .store_args
        .iter()
        .position(|a| a == "--key-prefix")
        .unwrap();
    let key = format!("{}:group:{{{GROUP}}}", stack.store_args[at + 1]);
    let url = stack.redis.as_ref().unwrap().url();
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (s, b) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": STREAM, "shard_count": 4}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let mut members = vec![("m1", 0, Vec::new())];
    settle(api, &mut members).await;
    let (old_revision, old_doc): (String, String) = redis::cmd("HMGET")
        .arg(&key)
        .arg("revision")
        .arg("doc")
        .query_async(&mut con)
        .await
        .unwrap();
    members.push(("m2", 0, Vec::new()));
    settle(api, &mut members).await;
    let (e1, e2) = (members[0].1, members[1].1);
    let old: Value = serde_json::from_str(&old_doc).unwrap();
    assert!(
        e2 > old["group_epoch"].as_i64().unwrap(),
        "m2 holds a newer epoch"
    );
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("revision")
        .arg(&old_revision)
        .arg("doc")
        .arg(&old_doc)
        .query_async(&mut con)
        .await
        .unwrap();

    let (_, body) = api.heartbeat(GROUP, "m2", e2, &members[1].2).await;
    assert_eq!(code(&body), "UNKNOWN_MEMBER_ID", "{body}");
    let (_, view) = api.get(&format!("/v1/groups/{GROUP}")).await;
    assert!(view["group_epoch"].as_i64().unwrap() >= e2 + 1000, "{view}");
    assert_eq!(view["members"].as_array().map(Vec::len), Some(0), "{view}");
    let (_, body) = api.heartbeat(GROUP, "m1", e1, &members[0].2).await;
    assert_eq!(
        code(&body),
        "UNKNOWN_MEMBER_ID",
        "m1 is not trusted either: {body}"
    );
    for m in ["m1", "m2"] {
        let (s, body) = api.heartbeat(GROUP, m, 0, &[]).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert!(body["member_epoch"].as_i64().unwrap() > e2 + 1000, "{body}");
    }
    assert!(api.metric("rsc_store_rewinds_total", &[]).await >= 1.0);
    assert!(stack.coordinator.logged("the store went back in time"));
    let recs = revisions(api, &format!("/v1/groups/{GROUP}/revisions")).await;
    let restore = recs
        .iter()
        .find(|r| r["c"] == "restore")
        .expect("a restore record");
    assert_eq!(restore["p"], "rsc-coordinator");
}
