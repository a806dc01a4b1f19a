//! `POST /v1/heartbeats` against a real coordinator: every item answered exactly as
//! `POST /v1/groups/{group}/heartbeat` answers it (compared with single heartbeats on twin
//! groups), item-level errors beside successes in one batch (including a group the token's
//! scope does not cover), and the whole-request errors (400, 401, 403, 413).

use reqwest::StatusCode;
use rsc_e2e::{Api, Backend, Stack, code};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

/// One batch item.
fn item(group: &str, member: &str, epoch: i64, owned: &[u32]) -> Value {
    json!({"group": group, "heartbeat": {
        "protocol_version": 1, "member_id": member, "member_epoch": epoch, "owned_shards": owned
    }})
}

async fn batch(api: &Api, items: Vec<Value>) -> (StatusCode, Value) {
    api.post("/v1/heartbeats", json!({ "heartbeats": items }))
        .await
}

async fn create(api: &Api, group: &str, stream: &str, shards: u32) {
    let (s, v) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": stream, "shard_count": shards}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

fn shards(v: &Value) -> Vec<u32> {
    v["assignment"]
        .as_array()
        .unwrap_or_else(|| panic!("no assignment in {v}"))
        .iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).unwrap())
        .collect()
}

/// A heartbeat answer without the field that names the group's stream (twin groups read
/// twin streams).
fn comparable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("stream");
    }
    v
}

/// What a member last learned: its epoch and assignment.
#[derive(Debug, Clone, Default)]
struct Member {
    epoch: i64,
    owned: Vec<u32>,
}

/// The members of the scenario: (batch group, twin group for single heartbeats, member,
/// the wave it joins in). Request order is this order, so the wave-3 member joins ahead of
/// stable members of its group: they must see its join as single heartbeats sent in this
/// order do.
const MEMBERS: [(&str, &str, &str, u32); 6] = [
    ("app-a", "app-c", "m0", 3),
    ("app-a", "app-c", "m1", 1),
    ("app-b", "app-d", "m1", 1),
    ("app-a", "app-c", "m2", 2),
    ("app-a", "app-c", "m3", 2),
    ("app-b", "app-d", "m2", 2),
];

/// Two groups of members heartbeat through batches, their twins (same configuration, same
/// members) through single heartbeats in request order, round for round: joins in waves,
/// revoke-before-assign, steady state. Every answer of a batch must equal its twin's.
async fn batch_answers_as_single_heartbeats(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "app-a", "s-a", 5).await;
    create(api, "app-b", "s-b", 3).await;
    create(api, "app-c", "s-c", 5).await;
    create(api, "app-d", "s-d", 3).await;

    let mut batch_members: Vec<Member> = vec![Member::default(); MEMBERS.len()];
    let mut single_members: Vec<Member> = vec![Member::default(); MEMBERS.len()];
    let mut wave = 1;
    let mut steady_rounds = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut round = 0;
    loop {
        round += 1;
        assert!(
            tokio::time::Instant::now() < deadline,
            "no steady state after {round} rounds"
        );
        let active: Vec<usize> = (0..MEMBERS.len())
            .filter(|&i| MEMBERS[i].3 <= wave)
            .collect();
        let items: Vec<Value> = active
            .iter()
            .map(|&i| {
                let (g, _, m, _) = MEMBERS[i];
                item(g, m, batch_members[i].epoch, &batch_members[i].owned)
            })
            .collect();
        let (s, body) = batch(api, items).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let results = body["results"].as_array().expect("results");
        assert_eq!(results.len(), active.len(), "{body}");

        let mut changed = false;
        for (r, &i) in results.iter().zip(&active) {
            let (bg, sg, m, _) = MEMBERS[i];
            assert_eq!(r["group"], bg, "results out of order: {body}");
            assert_eq!(r["member_id"], m, "results out of order: {body}");
            assert_eq!(r["status"], 200, "{r}");
            assert!(r.get("error").is_none(), "{r}");
            let st = &single_members[i];
            let (ss, single) = api.heartbeat(sg, m, st.epoch, &st.owned).await;
            assert_eq!(ss, StatusCode::OK, "{single}");
            assert_eq!(
                comparable(r["response"].clone()),
                comparable(single.clone()),
                "round {round}: batch answer for {bg}/{m} differs from the single answer for {sg}/{m}"
            );
            assert_eq!(r["response"]["stream"], format!("s-{}", &bg[4..]));
            let learned = Member {
                epoch: r["response"]["member_epoch"].as_i64().unwrap(),
                owned: shards(&r["response"]),
            };
            changed |=
                learned.epoch != batch_members[i].epoch || learned.owned != batch_members[i].owned;
            batch_members[i] = learned;
            single_members[i] = Member {
                epoch: single["member_epoch"].as_i64().unwrap(),
                owned: shards(&single),
            };
        }
        if changed {
            steady_rounds = 0;
            continue;
        }
        steady_rounds += 1;
        if steady_rounds == 2 {
            if wave == 3 {
                break;
            }
            wave += 1;
            steady_rounds = 0;
        }
    }

    // Converged: every shard of each group owned exactly once, balanced.
    let mut per_group: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for ((g, _, _, _), st) in MEMBERS.iter().zip(&batch_members) {
        per_group.entry(g).or_default().extend(&st.owned);
    }
    for (g, mut owned) in per_group {
        owned.sort_unstable();
        let n = if g == "app-a" { 5 } else { 3 };
        assert_eq!(owned, (0..n).collect::<Vec<_>>(), "{g}");
    }
    // The group views agree too: members, epochs, ownership.
    for (bg, sg) in [("app-a", "app-c"), ("app-b", "app-d")] {
        let (_, b) = api.get(&format!("/v1/groups/{bg}")).await;
        let (_, s) = api.get(&format!("/v1/groups/{sg}")).await;
        for key in ["group_epoch", "assignment_epoch", "state"] {
            assert_eq!(b[key], s[key], "{key}: {b} vs {s}");
        }
        let members = |v: &Value| -> Vec<(Value, Value, Value)> {
            v["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["member_id"].clone(),
                        m["member_epoch"].clone(),
                        m["owned_shards"].clone(),
                    )
                })
                .collect()
        };
        assert_eq!(members(&b), members(&s));
        assert_eq!(b["state"], "stable", "{b}");
    }
}

#[tokio::test]
async fn batch_answers_as_single_heartbeats_redis() {
    batch_answers_as_single_heartbeats(Backend::Redis).await;
}

#[tokio::test]
async fn batch_answers_as_single_heartbeats_memory() {
    batch_answers_as_single_heartbeats(Backend::Memory).await;
}

/// An ACL file: an admin, a member scoped to `app-*`, a viewer.
fn acl_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    write!(
        f,
        r#"
[[tokens]]
principal = "admin"
token = "t-admin"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[tokens]]
principal = "member"
token = "t-member"
roles = ["member"]
groups = ["app-*"]

[[tokens]]
principal = "viewer"
token = "t-viewer"
roles = ["viewer"]
groups = ["*"]
streams = ["*"]
"#
    )
    .unwrap();
    f.flush().unwrap();
    f
}

/// The body limit of the item-error stack: large enough for 1,001 small items, so that
/// the count limit (not the size limit) is what refuses them.
const BODY_LIMIT: usize = 256 * 1024;

#[tokio::test]
async fn item_errors_beside_successes_and_whole_request_errors() {
    let acl = acl_file();
    let limit = BODY_LIMIT.to_string();
    let mut stack = Stack::start(
        Backend::Redis,
        &[
            "--acl",
            acl.path().to_str().unwrap(),
            "--body-limit",
            &limit,
        ],
    );
    let admin = stack.api.clone().with_token("t-admin");
    let member = stack.api.clone().with_token("t-member");
    let viewer = stack.api.clone().with_token("t-viewer");
    create(&admin, "app-a", "s-a", 2).await;
    create(&admin, "other", "s-o", 2).await;
    let (s, m1) = member.heartbeat("app-a", "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{m1}");
    let m1_epoch = m1["member_epoch"].as_i64().unwrap();
    let m1_owned = shards(&m1);

    // One batch: successes and every kind of item error, in an order that interleaves them.
    let mut bad_version = item("app-a", "m-v", 0, &[]);
    bad_version["heartbeat"]["protocol_version"] = json!(2);
    let items = vec![
        item("app-a", "m1", m1_epoch, &m1_owned), // steady: 200
        item("app-zzz", "m1", 0, &[]),            // unknown group: 404
        item("app-a", "m1", m1_epoch + 7, &[]),   // fenced epoch: 409
        item("app-bad name!", "m1", 0, &[]),      // invalid group name (in scope): 400
        item("other", "m-forbidden", 0, &[]),     // out of the token's scope: 403
        item("app-a", "m-ghost", 5, &[]),         // unknown member: 404
        bad_version,                              // unsupported protocol version: 400
        item("app-a", "m2", 0, &[]),              // a join: 200
        item("bad name", "m1", 0, &[]),           // out of scope too: scope before name
    ];
    let (s, body) = batch(&member, items.clone()).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let results = body["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), items.len(), "{body}");
    let expected: [(u16, &str); 9] = [
        (200, ""),
        (404, "GROUP_NOT_FOUND"),
        (409, "FENCED_MEMBER_EPOCH"),
        (400, "INVALID_REQUEST"),
        (403, "FORBIDDEN"),
        (404, "UNKNOWN_MEMBER_ID"),
        (400, "UNSUPPORTED_PROTOCOL_VERSION"),
        (200, ""),
        (403, "FORBIDDEN"),
    ];
    for (i, ((status, c), r)) in expected.iter().zip(&results).enumerate() {
        assert_eq!(r["group"], items[i]["group"], "order: {body}");
        assert_eq!(
            r["member_id"], items[i]["heartbeat"]["member_id"],
            "order: {body}"
        );
        assert_eq!(r["status"], *status, "item {i}: {r}");
        if *status == 200 {
            assert!(r["response"].is_object() && r.get("error").is_none(), "{r}");
        } else {
            assert!(r.get("response").is_none(), "{r}");
            assert_eq!(code(r), *c, "item {i}: {r}");
            assert!(
                r["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{r}"
            );
        }
    }
    assert_eq!(shards(&results[0]["response"]), m1_owned, "steady answer");
    assert_eq!(results[0]["response"]["member_epoch"], m1_epoch);
    assert_eq!(
        results[7]["response"]["member_epoch"].as_i64(),
        Some(m1_epoch + 1)
    );

    // Each item's status and code are what the single route answers for it.
    for (i, it) in items.iter().enumerate() {
        if results[i]["status"] == 200 {
            // The steady answer predates the join after it, and a second join is a rejoin:
            // both answer differently now (the twin-group test compares successes).
            continue;
        }
        let group = it["group"].as_str().unwrap();
        let path = format!("/v1/groups/{}/heartbeat", group.replace(' ', "%20"));
        let (s, single) = member.post(&path, it["heartbeat"].clone()).await;
        assert_eq!(
            u64::from(s.as_u16()),
            results[i]["status"].as_u64().unwrap(),
            "item {i}: single {single} vs batch {}",
            results[i]
        );
        assert_eq!(code(&single), code(&results[i]), "item {i}");
    }
    // The forbidden item was not processed.
    let (_, other) = admin.get("/v1/groups/other").await;
    assert_eq!(other["members"], json!([]), "{other}");

    // Each processed item counted as a heartbeat; the batch size was recorded.
    let (s, metrics) = viewer.get("/metrics").await;
    assert_eq!(s, StatusCode::OK);
    let text = metrics.as_str().unwrap_or_default();
    assert!(text.contains("rsc_heartbeat_batch_size_count"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("rsc_heartbeats_total")
            && l.contains("FENCED_MEMBER_EPOCH")
            && l.contains("app-a")),
        "{text}"
    );

    // Whole-request errors.
    let (s, v) = batch(&member, vec![]).await;
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("1000"),
        "{v}"
    );
    let many: Vec<Value> = (0..1001)
        .map(|i| item("app-a", &format!("m{i}"), 0, &[]))
        .collect();
    let (s, v) = batch(&member, many).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "{v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("1000"),
        "{v}"
    );
    let (s, v) = member
        .post(
            "/v1/heartbeats",
            json!({"heartbeats": [item("app-a", "m1", 0, &[])], "extra": 1}),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "{v}"
    );
    let mut unknown_inner = item("app-a", "m1", 0, &[]);
    unknown_inner["heartbeat"]["colour"] = json!("red");
    let (s, v) = batch(&member, vec![unknown_inner]).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "{v}"
    );
    let (s, v) = member.post("/v1/heartbeats", json!([1, 2])).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "{v}"
    );
    // Just over the limit (by a few KiB): far over, the server's 413 can cut the client off
    // while it still writes the body (a broken pipe rather than an answer).
    let long = "x".repeat(BODY_LIMIT / 1000 - 100);
    let big: Vec<Value> = (0..1000)
        .map(|i| item("app-a", &format!("m{i:04}-{long}"), 0, &[]))
        .collect();
    let size = serde_json::to_vec(&json!({ "heartbeats": big }))
        .unwrap()
        .len();
    assert!(
        (BODY_LIMIT..BODY_LIMIT + 16 * 1024).contains(&size),
        "{size} bytes"
    );
    let (s, v) = batch(&member, big).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE"),
        "{v}"
    );
    let one = vec![item("app-a", "m1", 0, &[])];
    let (s, v) = batch(&stack.api, one.clone()).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        "{v}"
    );
    let (s, v) = batch(&stack.api.clone().with_token("nope"), one.clone()).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        "{v}"
    );
    let (s, v) = batch(&viewer, one.clone()).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "FORBIDDEN"), "{v}");
    // Another method: 401 without a credential (PROTOCOL §4: a refused client learns nothing
    // of the path), 405 for a principal the route would serve.
    let (s, v) = stack.api.get("/v1/heartbeats").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let (s, v) = member.get("/v1/heartbeats").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{v}");

    // The store down: each item answers 503, the request itself still 200.
    let (s, m1) = member.heartbeat("app-a", "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{m1}");
    stack.redis.as_mut().expect("redis").kill();
    let items = vec![
        item(
            "app-a",
            "m1",
            m1["member_epoch"].as_i64().unwrap(),
            &shards(&m1),
        ),
        item("app-a", "m3", 0, &[]),
        item("other", "m1", 0, &[]),
    ];
    let (s, body) = batch(&member, items).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let statuses: Vec<(u64, &str)> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["status"].as_u64().unwrap(), code(r)))
        .collect();
    assert_eq!(
        statuses,
        vec![
            (503, "STORE_UNAVAILABLE"),
            (503, "STORE_UNAVAILABLE"),
            (403, "FORBIDDEN")
        ],
        "{body}"
    );
    let log = stack.coordinator.log().join("\n");
    assert!(!log.contains("panicked"), "{log}");
}
