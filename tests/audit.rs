//! The audit log (allowed and refused admin mutations, filters, revisions), the admin rate
//! limit under a burst, and JSON logs, against a real coordinator with an ACL.

use crate::security as support;
use crate::security::Secured;
use reqwest::{Method, StatusCode};
use rsc_e2e::code;
use serde_json::{Value, json};

fn entries(v: &Value) -> &Vec<Value> {
    v["entries"].as_array().expect("entries")
}

#[tokio::test]
async fn allowed_and_refused_mutations_are_audited() {
    let stack = Secured::start(&["--log-format", "json"]);
    let admin = stack.api("admin");
    let viewer = stack.api("viewer");

    let (s, _) = admin
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    // Refused: no token (401), not an admin (403), out of scope (403), conflict (409).
    let (s, _) = stack
        .api("none")
        .post("/v1/groups", json!({"group": "g2", "stream": "s1"}))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = viewer
        .call(
            Method::PATCH,
            "/v1/groups/g1",
            Some(json!({"max_members": 3})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = stack
        .api("admin-elsewhere")
        .call(Method::DELETE, "/v1/groups/g1", None)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = admin
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    // Allowed update: the group document goes from revision 1 to 2.
    let (s, _) = admin
        .call(
            Method::PATCH,
            "/v1/groups/g1",
            Some(json!({"max_members": 3})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // Heartbeats and reads are not audited.
    let (s, _) = admin.heartbeat("g1", "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = viewer.get("/v1/groups/g1").await;
    assert_eq!(s, StatusCode::OK);

    // Two logs (PROTOCOL §7): the admitted mutations, with their bodies ...
    let (s, log) = viewer.get("/v1/audit?log=mutations").await;
    assert_eq!(s, StatusCode::OK, "{log}");
    let e = entries(&log);
    let summary = |e: &[Value]| -> Vec<(String, String, u64, String)> {
        e.iter()
            .map(|e| {
                (
                    e["principal"].as_str().unwrap().to_owned(),
                    e["action"].as_str().unwrap().to_owned(),
                    e["result"]["status"].as_u64().unwrap(),
                    e["result"]["code"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    };
    let owned = |want: &[(&str, &str, u64, &str)]| -> Vec<(String, String, u64, String)> {
        want.iter()
            .map(|(p, a, s, c)| (p.to_string(), a.to_string(), *s, c.to_string()))
            .collect()
    };
    assert_eq!(
        summary(e),
        owned(&[
            ("admin", "group.update", 200, ""),
            ("admin", "group.create", 409, "GROUP_ALREADY_EXISTS"),
            ("admin", "group.create", 201, ""),
        ]),
        "newest first: {log}"
    );
    assert!(
        e.iter().all(|e| e["client_addr"] == "127.0.0.1"),
        "every entry records the client address: {log}"
    );
    // ... and the refusals, counted, by route template, without bodies or targets.
    let (s, refused) = viewer.get("/v1/audit?log=refusals").await;
    assert_eq!(s, StatusCode::OK, "{refused}");
    let r = entries(&refused);
    assert_eq!(
        summary(r),
        owned(&[
            ("admin-elsewhere", "group.delete", 403, "FORBIDDEN"),
            ("viewer", "group.update", 403, "FORBIDDEN"),
            ("anonymous", "group.create", 401, "UNAUTHENTICATED"),
        ]),
        "newest first: {refused}"
    );
    for e in r {
        assert_eq!(e["count"], 1, "{e}");
        assert_eq!(e["client_addr"], "127.0.0.1", "{e}");
        assert!(e["request"].get("body").is_none(), "no body: {e}");
        assert_eq!(e["target"], json!({}), "{e}");
    }
    assert_eq!(r[0]["request"]["path"], "/v1/groups/{group}");
    // Both, merged by time (the default).
    let (_, both) = viewer.get("/v1/audit").await;
    assert_eq!(entries(&both).len(), 6, "{both}");

    // The allowed create: target, request body, revisions of both documents.
    let create = &e[2];
    assert_eq!(create["target"], json!({"group": "g1", "stream": "s1"}));
    assert_eq!(create["request"]["method"], "POST");
    assert_eq!(create["request"]["path"], "/v1/groups");
    assert_eq!(create["request"]["body"]["shard_count"], 2);
    assert_eq!(
        create["revisions"],
        json!([
            {"document": "stream:s1", "before": 0, "after": 1},
            {"document": "group:g1", "before": 0, "after": 1},
        ])
    );
    assert_eq!(
        e[0]["revisions"],
        json!([{"document": "group:g1", "before": 1, "after": 2}])
    );
    assert_eq!(
        e[1]["revisions"],
        json!([]),
        "a failed create writes nothing"
    );
    assert!(e[0]["time_ms"].as_u64().unwrap() >= create["time_ms"].as_u64().unwrap());

    // Filters and limit.
    let (_, v) = viewer.get("/v1/audit?log=mutations&limit=2").await;
    assert_eq!(entries(&v).len(), 2);
    assert_eq!(entries(&v)[0]["action"], "group.update");
    let (_, v) = viewer.get("/v1/audit?stream=s1").await;
    assert_eq!(entries(&v).len(), 2, "the admitted creates name s1: {v}");
    let (_, v) = viewer.get("/v1/audit?group=g1&stream=s1").await;
    assert_eq!(entries(&v).len(), 2, "the two creates of g1: {v}");
    let (_, v) = viewer.get("/v1/audit?group=nope").await;
    assert!(entries(&v).is_empty());
    for bad in [
        "/v1/audit?limit=0",
        "/v1/audit?limit=1001",
        "/v1/audit?group=a%20b",
        "/v1/audit?bogus=1",
        "/v1/audit?log=other",
    ] {
        let (s, v) = viewer.get(bad).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{bad}"
        );
    }
    // A scoped viewer sees only entries about its groups, and no refusal.
    let (_, v) = stack.api("viewer-g1").get("/v1/audit").await;
    assert!(
        entries(&v)
            .iter()
            .all(|e| e["target"]["group"] == "g1" && e["target"].get("stream").is_none()),
        "viewer-g1 has no stream scope: {v}"
    );
    assert_eq!(entries(&v).len(), 1, "the update of g1: {v}");

    // The same entries went to the log as JSON events; every log line is JSON.
    let lines = stack.coordinator.log();
    let mut audit_events = Vec::new();
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
        if v["target"] == "rsc::audit" {
            audit_events.push(v);
        }
    }
    assert_eq!(audit_events.len(), 6, "one audit event per entry");
    let first = &audit_events[0]["fields"];
    assert_eq!(first["principal"], "admin");
    assert_eq!(first["action"], "group.create");
    assert_eq!(first["status"], 201);
    assert!(audit_events[1]["fields"]["code"] == "UNAUTHENTICATED");
}

#[tokio::test]
async fn admin_mutations_are_rate_limited_per_principal_under_a_burst() {
    let stack = Secured::start(&[
        "--admin-rate",
        "1",
        "--admin-burst",
        "3",
        "--audit-refusal-interval-ms",
        "200",
    ]);
    let admin = stack.api("admin");
    let (s, _) = admin
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    // The create used one token of three; fire a burst of updates.
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for i in 0..10 {
        let resp = rsc_e2e::http()
            .patch(format!("{}/v1/groups/g1", stack.url))
            .bearer_auth(support::token_of("admin"))
            .json(&json!({"max_members": 10 + i}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS && retry_after.is_none() {
            retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let body: Value = resp.json().await.unwrap();
            assert_eq!(code(&body), "RATE_LIMITED");
        }
        statuses.push(status.as_u16());
    }
    assert_eq!(
        &statuses[..2],
        &[200, 200],
        "the rest of the burst passes: {statuses:?}"
    );
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert!(
        limited >= 1,
        "a burst over the rate is refused: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    assert!(
        retry_after.is_some_and(|s| s >= 1),
        "Retry-After in whole seconds"
    );

    // Another principal has its own bucket.
    let (s, _) = stack
        .api("admin2")
        .call(
            Method::PATCH,
            "/v1/groups/g1",
            Some(json!({"max_members": 99})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // Heartbeats and reads of the limited principal are not limited.
    let mut epoch = 0;
    for _ in 0..30 {
        let (s, b) = admin.heartbeat("g1", "m1", epoch, &[]).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        epoch = b["member_epoch"].as_i64().unwrap();
        let (s, _) = admin.get("/v1/groups/g1").await;
        assert_eq!(s, StatusCode::OK);
    }
    // The refusals are audited: merged, and counted (PROTOCOL §7).
    let viewer = stack.api("viewer");
    crate::pods::eventually_async("every 429 counted in the audit log", 10, || async {
        let (_, v) = viewer.get("/v1/audit?log=refusals&limit=1000").await;
        let audited_429: u64 = entries(&v)
            .iter()
            .filter(|e| e["result"]["code"] == "RATE_LIMITED" && e["principal"] == "admin")
            .map(|e| e["count"].as_u64().unwrap_or(0))
            .sum();
        (audited_429 == limited as u64).then_some(())
    })
    .await;
}
