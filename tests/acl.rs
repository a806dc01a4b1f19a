//! The ACL matrix: every role (and scope, and no or a bad token) × every route → the
//! expected status, against a real coordinator with an ACL file. The routes are the ones
//! the coordinator's own OpenAPI document lists: a route missing from this table, or a
//! table row missing from the document, fails the test.

use crate::security as support;
use crate::security::Secured;
use reqwest::{Method, StatusCode};
use rsc_e2e::code;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};

/// Column order of the expectations.
const WHO: [&str; 10] = [
    "admin",
    "member",
    "producer",
    "viewer",
    "none",
    "bad",
    "admin-elsewhere",
    "member-elsewhere",
    "producer-elsewhere",
    "viewer-g1",
];

struct Row {
    method: Method,
    template: &'static str,
    path: &'static str,
    expect: [u16; 10],
}

const R: [u16; 10] = [200; 10];
const ADMIN_ONLY: fn(u16) -> [u16; 10] = |ok| [ok, 403, 403, 403, 401, 401, 403, 403, 403, 403];

fn rows() -> Vec<Row> {
    let row = |method: Method, template, path, expect| Row {
        method,
        template,
        path,
        expect,
    };
    vec![
        // Admin: only an admin whose scopes cover the target; 401 without a valid token.
        row(Method::POST, "/v1/groups", "/v1/groups", ADMIN_ONLY(201)),
        row(
            Method::PATCH,
            "/v1/groups/{group}",
            "/v1/groups/g1",
            ADMIN_ONLY(200),
        ),
        row(
            Method::DELETE,
            "/v1/groups/{group}",
            "/v1/groups/g-del",
            ADMIN_ONLY(204),
        ),
        row(
            Method::POST,
            "/v1/groups/{group}/pause",
            "/v1/groups/g1/pause",
            ADMIN_ONLY(200),
        ),
        row(
            Method::POST,
            "/v1/groups/{group}/resume",
            "/v1/groups/g1/resume",
            ADMIN_ONLY(200),
        ),
        row(
            Method::DELETE,
            "/v1/groups/{group}/members/{member}",
            "/v1/groups/g1/members/m-rm",
            ADMIN_ONLY(204),
        ),
        row(
            Method::PATCH,
            "/v1/streams/{stream}",
            "/v1/streams/s1",
            ADMIN_ONLY(200),
        ),
        // Allowed, then refused: this coordinator has no data Redis to seek in.
        row(
            Method::POST,
            "/v1/groups/{group}/seek",
            "/v1/groups/g1/seek",
            ADMIN_ONLY(400),
        ),
        // Allowed, then refused: revision 0 is not an earlier revision to restore.
        row(
            Method::POST,
            "/v1/groups/{group}/restore",
            "/v1/groups/g1/restore",
            ADMIN_ONLY(400),
        ),
        // Allowed, then refused: no data Redis to redrive in.
        row(
            Method::POST,
            "/v1/streams/{stream}/dlq/redrive",
            "/v1/streams/s1/dlq/redrive",
            ADMIN_ONLY(400),
        ),
        // Allowed, then refused: no data Redis holding dead letters.
        row(
            Method::POST,
            "/v1/streams/{stream}/dlq/purge",
            "/v1/streams/s1/dlq/purge",
            ADMIN_ONLY(400),
        ),
        row(
            Method::POST,
            "/v1/streams/{stream}/reshard",
            "/v1/streams/s1/reshard",
            ADMIN_ONLY(202),
        ),
        row(
            Method::POST,
            "/v1/streams/{stream}/rollback",
            "/v1/streams/s1/rollback",
            ADMIN_ONLY(202),
        ),
        // Members: role member (or admin) with the group in scope.
        row(
            Method::POST,
            "/v1/groups/{group}/heartbeat",
            "/v1/groups/g1/heartbeat",
            [200, 200, 403, 403, 401, 401, 403, 403, 403, 403],
        ),
        row(
            Method::POST,
            "/v1/groups/{group}/leave",
            "/v1/groups/g1/leave",
            [200, 200, 403, 403, 401, 401, 403, 403, 403, 403],
        ),
        // Batched heartbeats: role member (or admin); the group scope is checked per item,
        // so a token scoped elsewhere gets 200 with the item refused (checked below).
        row(
            Method::POST,
            "/v1/heartbeats",
            "/v1/heartbeats",
            [200, 200, 403, 403, 401, 401, 200, 200, 403, 403],
        ),
        // Wake-up channel: role member (or admin); every item's group in scope, else the
        // whole channel is refused. (The stack closes an idle channel after 1 s, so that a
        // 200 stream ends.)
        row(
            Method::POST,
            "/v1/wakeups",
            "/v1/wakeups",
            [200, 200, 403, 403, 401, 401, 403, 403, 403, 403],
        ),
        // Producers (and viewers): the stream in scope.
        row(
            Method::GET,
            "/v1/streams/{stream}/routing",
            "/v1/streams/s1/routing",
            [200, 403, 200, 200, 401, 401, 403, 403, 403, 403],
        ),
        // Monitoring: viewers; lists are filtered by scope rather than refused.
        row(
            Method::GET,
            "/v1/groups",
            "/v1/groups",
            [200, 403, 403, 200, 401, 401, 200, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/v1/groups/{group}",
            "/v1/groups/g1",
            [200, 200, 403, 200, 401, 401, 403, 403, 403, 200],
        ),
        // The autoscaling signal and the lag history: viewers only, in their group scope.
        row(
            Method::GET,
            "/v1/groups/{group}/scaling",
            "/v1/groups/g1/scaling",
            [200, 403, 403, 200, 401, 401, 403, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/v1/groups/{group}/history",
            "/v1/groups/g1/history",
            [200, 403, 403, 200, 401, 401, 403, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/v1/groups/{group}/revisions",
            "/v1/groups/g1/revisions",
            [200, 403, 403, 200, 401, 401, 403, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/v1/groups/{group}/diff",
            "/v1/groups/g1/diff?from=0&to=1",
            [200, 403, 403, 200, 401, 401, 403, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/v1/streams/{stream}/revisions",
            "/v1/streams/s1/revisions",
            [200, 403, 403, 200, 401, 401, 403, 403, 403, 403],
        ),
        row(
            Method::GET,
            "/v1/streams",
            "/v1/streams",
            [200, 403, 403, 200, 401, 401, 200, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/v1/streams/{stream}",
            "/v1/streams/s1",
            [200, 403, 403, 200, 401, 401, 403, 403, 403, 403],
        ),
        // Viewers in the stream's scope; allowed, then refused: no data Redis.
        row(
            Method::GET,
            "/v1/streams/{stream}/dlq",
            "/v1/streams/s1/dlq",
            [400, 403, 403, 400, 401, 401, 403, 403, 403, 403],
        ),
        row(
            Method::GET,
            "/v1/audit",
            "/v1/audit",
            [200, 403, 403, 200, 401, 401, 200, 403, 403, 200],
        ),
        row(
            Method::GET,
            "/metrics",
            "/metrics",
            [200, 403, 403, 200, 401, 401, 200, 403, 403, 200],
        ),
        // Open.
        row(Method::GET, "/healthz", "/healthz", R),
        row(Method::GET, "/readyz", "/readyz", R),
        row(Method::GET, "/openapi.json", "/openapi.json", R),
        row(Method::GET, "/", "/", R),
    ]
}

/// The body each request carries (distinct names per principal where an allowed request
/// creates something).
fn body(row: &Row, who: &str, epochs: &HashMap<String, i64>) -> Option<Value> {
    match (row.method.as_str(), row.template) {
        ("POST", "/v1/groups") => Some(json!({"group": format!("g-new-{who}"), "stream": "s1"})),
        ("PATCH", "/v1/streams/{stream}") => Some(json!({"retention": {"keep_acked_ms": 0}})),
        ("PATCH", _) => Some(json!({"max_members": 100})),
        ("POST", "/v1/groups/{group}/seek") => Some(json!({"to": "earliest"})),
        ("POST", "/v1/groups/{group}/restore") => Some(json!({"revision": 0, "force": true})),
        ("POST", "/v1/streams/{stream}/dlq/redrive") => Some(json!({"group": "g1"})),
        ("POST", "/v1/streams/{stream}/dlq/purge") => Some(json!({})),
        ("POST", "/v1/streams/{stream}/reshard") => Some(json!({"shard_count": 3})),
        ("POST", "/v1/groups/{group}/heartbeat") => Some(json!({
            "protocol_version": 1, "member_id": format!("m-{who}"), "member_epoch": 0, "owned_shards": []
        })),
        ("POST", "/v1/heartbeats") => Some(json!({"heartbeats": [{"group": "g1", "heartbeat": {
            "protocol_version": 1, "member_id": format!("m-batch-{who}"), "member_epoch": 0
        }}]})),
        ("POST", "/v1/wakeups") => {
            Some(json!({"members": [{"group": "g1", "member_id": format!("m-{who}")}]}))
        }
        ("POST", "/v1/groups/{group}/leave") => {
            let id = format!("m-{who}");
            let epoch = epochs.get(&id).copied().unwrap_or(1);
            Some(json!({"member_id": id, "member_epoch": epoch}))
        }
        _ => None,
    }
}

#[tokio::test]
async fn every_role_on_every_route() {
    let stack = Secured::start(&["--admin-burst", "100", "--wake-idle-timeout-ms", "1000"]);
    let admin = stack.api("admin");
    // Fixtures: g1 and g-del on s1 (2 shards), member m-rm in g1.
    for g in ["g1", "g-del"] {
        let (s, b) = admin
            .post(
                "/v1/groups",
                json!({"group": g, "stream": "s1", "shard_count": 2}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let (s, b) = admin.heartbeat("g1", "m-rm", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    // The table covers exactly the documented operations.
    let (s, doc) = stack.api("none").get("/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&m.as_str()) {
                documented.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    let rows = rows();
    let table: BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| (r.method.to_string(), r.template.to_owned()))
        .collect();
    assert_eq!(
        table, documented,
        "the ACL matrix and the OpenAPI document must list the same routes"
    );

    let mut epochs: HashMap<String, i64> = HashMap::new();
    let mut failures = Vec::new();
    for row in &rows {
        for (i, who) in WHO.iter().enumerate() {
            let api = stack.api(who);
            let (status, resp) = api
                .call(row.method.clone(), row.path, body(row, who, &epochs))
                .await;
            if row.template == "/v1/groups/{group}/heartbeat" && status == StatusCode::OK {
                epochs.insert(format!("m-{who}"), resp["member_epoch"].as_i64().unwrap());
            }
            if row.template == "/v1/heartbeats" && status == StatusCode::OK {
                // The item: processed when the token's group scope covers g1.
                let in_scope = !who.ends_with("-elsewhere");
                let item = &resp["results"][0];
                let (want, want_code) = if in_scope {
                    (200, None)
                } else {
                    (403, Some("FORBIDDEN"))
                };
                if item["status"] != want || want_code.is_some_and(|c| item["error"]["code"] != c) {
                    failures.push(format!("{who:>18} POST /v1/heartbeats: item {item}"));
                }
            }
            let want = row.expect[i];
            if status.as_u16() != want {
                failures.push(format!(
                    "{who:>18} {} {}: want {want}, got {status} {resp}",
                    row.method, row.path
                ));
                continue;
            }
            // Refusals carry the protocol error body.
            let expected_code = match want {
                401 => Some("UNAUTHENTICATED"),
                403 => Some("FORBIDDEN"),
                _ => None,
            };
            if let Some(c) = expected_code
                && code(&resp) != c
            {
                failures.push(format!("{who} {} {}: body {resp}", row.method, row.path));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "ACL matrix mismatches:\n{}",
        failures.join("\n")
    );

    // Lists are filtered by scope.
    let names = |v: &Value, field: &str, key: &str| -> Vec<String> {
        v[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[key].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, v) = stack.api("viewer-g1").get("/v1/groups").await;
    assert_eq!(names(&v, "groups", "group"), vec!["g1"]);
    let (_, v) = stack.api("viewer-g1").get("/v1/streams").await;
    assert!(
        names(&v, "streams", "stream").is_empty(),
        "no stream scope: {v}"
    );
    let (_, v) = stack.api("admin-elsewhere").get("/v1/groups").await;
    assert!(names(&v, "groups", "group").is_empty(), "{v}");
    let (_, v) = stack.api("viewer").get("/v1/groups").await;
    assert_eq!(
        names(&v, "groups", "group"),
        vec!["g-new-admin", "g1"],
        "only the admin's create went through"
    );

    // Tokens never reach the log.
    let log = stack.coordinator.log().join("\n");
    for (_, token, _) in support::PRINCIPALS {
        assert!(!log.contains(token), "token {token} appears in the log");
    }
    assert!(!log.contains("not-a-token"));
}
