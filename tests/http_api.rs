//! The HTTP API of a real `rsc-coordinator` process, on every store backend: the protocol
//! (join, revoke before assign, fencing, leave, expiry by the background sweep), the admin
//! routes, and every PROTOCOL §4 error code reachable without an ACL.

use reqwest::{Method, StatusCode};
use rsc_e2e::{Api, Backend, Stack, code, store_suite};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

store_suite!(
    join_and_routing_over_a_real_socket,
    second_member_waits_for_revocation,
    a_heartbeat_without_owned_shards_releases_nothing,
    a_replaced_static_run_is_fenced,
    fencing_and_unknown_members,
    leave_frees_shards_at_once,
    static_member_steps_away_and_resumes,
    silent_member_is_expired_by_the_sweep,
    admin_group_lifecycle,
    reshard_and_rollback_errors,
    rollback_window_expires,
    request_validation_errors,
    unknown_routes_and_methods,
    stream_retention_policy,
);

async fn create(api: &Api, group: &str, stream: &str, shards: u32, extra: Value) -> Value {
    let mut body = json!({"group": group, "stream": stream, "shard_count": shards});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    let (s, v) = api.post("/v1/groups", body).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

fn shards(v: &Value) -> Vec<u64> {
    v["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Polls `f` every 20 ms until it returns `Some`, failing after `secs` seconds.
async fn eventually<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn join_and_routing_over_a_real_socket(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    let view = create(api, "g", "s", 2, json!({})).await;
    assert_eq!(view["state"], "empty");
    assert_eq!(view["session_timeout_ms"], 45_000);
    let (s, body) = api.heartbeat("g", "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["assignment"], json!([0, 1]));
    assert_eq!(body["member_epoch"], 1);
    assert_eq!(body["start"], "earliest");
    let (s, routing) = api.get("/v1/streams/s/routing").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        routing,
        json!({"stream": "s", "shard_count": 2, "routing_epoch": 1, "hash": "xxh3_64-jump",
               "shard_keys": ["s:0", "s:1"], "resharding": null})
    );
    let (s, list) = api.get("/v1/groups").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["groups"][0]["members"][0]["member_id"], "m1");
    let (s, streams) = api.get("/v1/streams").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(streams["streams"][0]["groups"], json!(["g"]));
    let (s, health) = api.get("/healthz").await;
    assert_eq!((s, health["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (s, _) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::OK);
}

async fn second_member_waits_for_revocation(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 4, json!({})).await;
    let (_, r1) = api.heartbeat("g", "m1", 0, &[]).await;
    assert_eq!(shards(&r1), vec![0, 1, 2, 3]);
    let (_, r2) = api.heartbeat("g", "m2", 0, &[]).await;
    assert_eq!(
        (r2["member_epoch"].as_i64(), shards(&r2)),
        (Some(2), vec![])
    );
    // m1 is asked to give up 2 and 3, moving to the assignment epoch (PROTOCOL §5.2).
    let (_, r1) = api.heartbeat("g", "m1", 1, &[0, 1, 2, 3]).await;
    assert_eq!(
        (r1["member_epoch"].as_i64(), shards(&r1)),
        (Some(2), vec![0, 1])
    );
    let (_, view) = api.get("/v1/groups/g").await;
    assert_eq!(view["state"], "reconciling");
    let m1 = &view["members"][0];
    assert_eq!(
        (m1["state"].as_str(), &m1["pending_revocation"]),
        (Some("unrevoked"), &json!([2, 3]))
    );
    assert_eq!(view["shards"][2]["current_owner"], "m1");
    assert_eq!(view["shards"][2]["target_owner"], "m2");
    // m2 waits until m1 confirms.
    let (_, r2) = api.heartbeat("g", "m2", 2, &[]).await;
    assert_eq!(shards(&r2), Vec::<u64>::new());
    let (_, r1) = api.heartbeat("g", "m1", 2, &[0, 1]).await;
    assert_eq!(
        (r1["member_epoch"].as_i64(), shards(&r1)),
        (Some(2), vec![0, 1])
    );
    let (_, r2) = api.heartbeat("g", "m2", 2, &[]).await;
    assert_eq!(shards(&r2), vec![2, 3]);
    api.heartbeat("g", "m2", 2, &[2, 3]).await;
    let (_, view) = api.get("/v1/groups/g").await;
    assert_eq!(view["state"], "stable");
    assert_eq!(
        (
            view["group_epoch"].as_u64(),
            view["assignment_epoch"].as_u64()
        ),
        (Some(2), Some(2))
    );
}

async fn fencing_and_unknown_members(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 2, json!({"max_members": 2})).await;
    api.heartbeat("g", "m1", 0, &[]).await;
    api.heartbeat("g", "m2", 0, &[]).await;
    for epoch in [3, 99] {
        let (s, body) = api.heartbeat("g", "m1", epoch, &[]).await;
        assert_eq!(
            (s, code(&body)),
            (StatusCode::CONFLICT, "FENCED_MEMBER_EPOCH"),
            "{body}"
        );
    }
    let (s, body) = api.heartbeat("g", "ghost", 4, &[]).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "UNKNOWN_MEMBER_ID")
    );
    let (s, body) = api.heartbeat("g", "m3", 0, &[]).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "GROUP_MAX_SIZE_REACHED")
    );
    let (s, body) = api
        .post(
            "/v1/groups/g/heartbeat",
            json!({"protocol_version": 2, "member_id": "m1", "member_epoch": 1}),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::BAD_REQUEST, "UNSUPPORTED_PROTOCOL_VERSION")
    );
    let (s, body) = api.heartbeat("nope", "m1", 0, &[]).await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "GROUP_NOT_FOUND"));
    // An operator removes m2: its next heartbeat is unknown, and it can rejoin.
    let (s, _) = api
        .call(Method::DELETE, "/v1/groups/g/members/m2", None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, body) = api.heartbeat("g", "m2", 2, &[]).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "UNKNOWN_MEMBER_ID")
    );
    let (s, _) = api
        .call(Method::DELETE, "/v1/groups/g/members/m2", None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, body) = api.heartbeat("g", "m2", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

async fn leave_frees_shards_at_once(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 2, json!({})).await;
    api.heartbeat("g", "m1", 0, &[]).await;
    api.heartbeat("g", "m2", 0, &[]).await;
    api.heartbeat("g", "m1", 1, &[0, 1]).await; // asked to revoke 1
    let (s, body) = api
        .post(
            "/v1/groups/g/leave",
            json!({"member_id": "m1", "member_epoch": 0}),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "FENCED_MEMBER_EPOCH")
    );
    let (s, body) = api
        .post(
            "/v1/groups/g/leave",
            json!({"member_id": "m1", "member_epoch": 1}),
        )
        .await;
    assert_eq!(
        (s, body),
        (
            StatusCode::OK,
            json!({"member_id": "m1", "member_epoch": -1})
        )
    );
    let (_, r2) = api.heartbeat("g", "m2", 2, &[]).await;
    assert_eq!(
        shards(&r2),
        vec![0, 1],
        "m1's shards are free without waiting"
    );
    let (s, body) = api
        .post(
            "/v1/groups/g/leave",
            json!({"member_id": "m1", "member_epoch": 1}),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "UNKNOWN_MEMBER_ID")
    );
    // A heartbeat with epoch -1 is a leave too.
    let (s, body) = api.heartbeat("g", "m2", -1, &[]).await;
    assert_eq!(
        (s, body["member_epoch"].as_i64()),
        (StatusCode::OK, Some(-1))
    );
    let (_, view) = api.get("/v1/groups/g").await;
    assert_eq!(view["members"], json!([]));
}

/// PROTOCOL §5: a heartbeat without `owned_shards` means "unchanged" — on the single and
/// the batched route alike: the member revoking 3, 4, 5 keeps them pending, stays at the
/// epoch it was asked at, the other member is not given them, and at the tolerated previous
/// epoch the omission is fenced (§5.4).
async fn a_heartbeat_without_owned_shards_releases_nothing(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    for (group, batched) in [("single", false), ("batched", true)] {
        create(api, group, &format!("s-{group}"), 6, json!({})).await;
        let hb = |member: &str, epoch: i64, owned: Option<&[u32]>| {
            let mut body =
                json!({"protocol_version": 1, "member_id": member, "member_epoch": epoch});
            if let Some(owned) = owned {
                body["owned_shards"] = json!(owned);
            }
            api.member_heartbeat(group, body, batched)
        };
        let (s, a) = hb("a", 0, None).await.unwrap();
        assert_eq!((s, shards(&a).len()), (StatusCode::OK, 6), "{a}");
        let (_, b) = hb("b", 0, None).await.unwrap();
        assert_eq!(b["member_epoch"], 2, "{b}");
        let (_, a) = hb("a", 1, Some(&[0, 1, 2, 3, 4, 5])).await.unwrap();
        assert_eq!(
            (a["member_epoch"].as_i64(), shards(&a)),
            (Some(2), vec![0, 1, 2])
        );

        // The omission: 200, still epoch 2 and unrevoked, 3, 4, 5 still pending.
        let (s, a) = hb("a", 2, None).await.unwrap();
        assert_eq!(s, StatusCode::OK, "{a}");
        assert_eq!(
            (a["member_epoch"].as_i64(), shards(&a)),
            (Some(2), vec![0, 1, 2])
        );
        let (_, view) = api.get(&format!("/v1/groups/{group}")).await;
        let m = &view["members"][0];
        assert_eq!(m["member_id"], "a");
        assert_eq!(
            (m["state"].as_str(), &m["pending_revocation"]),
            (Some("unrevoked"), &json!([3, 4, 5])),
            "{view}"
        );
        let (_, b) = hb("b", 2, Some(&[])).await.unwrap();
        assert_eq!(shards(&b), Vec::<u64>::new(), "3, 4, 5 are still a's: {b}");

        // a revokes; its previous epoch without the list is fenced, with a subset accepted.
        let (_, a) = hb("a", 2, Some(&[0, 1, 2])).await.unwrap();
        assert_eq!(a["member_epoch"], 2, "{a}");
        let (s, e) = hb("a", 1, None).await.unwrap();
        assert_eq!(
            (s, code(&e)),
            (StatusCode::CONFLICT, "FENCED_MEMBER_EPOCH"),
            "{e}"
        );
        let (s, a) = hb("a", 1, Some(&[0, 1])).await.unwrap();
        assert_eq!(
            (s, a["member_epoch"].as_i64()),
            (StatusCode::OK, Some(2)),
            "{a}"
        );
        let (_, b) = hb("b", 2, None).await.unwrap();
        assert_eq!(shards(&b), vec![3, 4, 5], "{b}");
        // Stable members may leave the list out: nothing changes.
        let (s, b) = hb("b", 2, None).await.unwrap();
        assert_eq!((s, shards(&b)), (StatusCode::OK, vec![3, 4, 5]), "{b}");
    }
}

/// PROTOCOL §11: a heartbeat naming another incarnation than the one holding a static
/// member's id is fenced, also at the epoch the resumed run shares with the one it replaced.
async fn a_replaced_static_run_is_fenced(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 2, json!({})).await;
    let hb = |epoch: i64, incarnation: &str| {
        json!({"protocol_version": 1, "member_id": "pod-0", "member_epoch": epoch,
               "owned_shards": [], "incarnation": incarnation})
    };
    let (_, r) = api
        .member_heartbeat("g", hb(0, "run-1"), false)
        .await
        .unwrap();
    let epoch = r["member_epoch"].as_i64().unwrap();
    let (s, _) = api
        .member_heartbeat("g", hb(-2, "run-1"), false)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    let (_, r) = api
        .member_heartbeat("g", hb(0, "run-2"), false)
        .await
        .unwrap();
    assert_eq!(r["member_epoch"].as_i64(), Some(epoch), "resumed: {r}");
    for batched in [false, true] {
        let (s, e) = api
            .member_heartbeat("g", hb(epoch, "run-1"), batched)
            .await
            .unwrap();
        assert_eq!(
            (s, code(&e)),
            (StatusCode::CONFLICT, "FENCED_MEMBER_EPOCH"),
            "{e}"
        );
        let (s, e) = api
            .member_heartbeat("g", hb(-1, "run-1"), batched)
            .await
            .unwrap();
        assert_eq!(
            (s, code(&e)),
            (StatusCode::CONFLICT, "MEMBER_ID_IN_USE"),
            "{e}"
        );
    }
    let (s, r) = api
        .member_heartbeat("g", hb(epoch, "run-2"), true)
        .await
        .unwrap();
    assert_eq!(
        (s, r["member_epoch"].as_i64()),
        (StatusCode::OK, Some(epoch)),
        "{r}"
    );
}

async fn static_member_steps_away_and_resumes(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 4, json!({"session_timeout_ms": 30000})).await;
    let hb = |epoch: i64, owned: &[u32], incarnation: Option<&str>| {
        let mut body = json!({"protocol_version": 1, "member_id": "pod-0", "member_epoch": epoch,
            "owned_shards": owned});
        if let Some(i) = incarnation {
            body["incarnation"] = json!(i);
        }
        body
    };
    let (s, r) = api
        .member_heartbeat("g", hb(0, &[], Some("run-1")), false)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{r}");
    let epoch = r["member_epoch"].as_i64().unwrap();
    api.member_heartbeat("g", hb(epoch, &[0, 1, 2, 3], None), false)
        .await
        .unwrap();
    // Another process claiming the id while the first is live: refused, with when to retry,
    // on the single route (body and Retry-After) and in a batch item alike.
    for batched in [false, true] {
        let (s, body) = api
            .member_heartbeat("g", hb(0, &[], Some("run-2")), batched)
            .await
            .unwrap();
        assert_eq!(
            (s, code(&body)),
            (StatusCode::CONFLICT, "MEMBER_ID_IN_USE"),
            "{body}"
        );
        let after = body["error"]["retry_after_ms"]
            .as_u64()
            .expect("retry_after_ms");
        assert!(after > 20_000 && after <= 30_001, "{after}");
    }
    let raw = rsc_e2e::http()
        .post(format!("{}/v1/groups/g/heartbeat", api.base()))
        .json(&hb(0, &[], Some("run-2")))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.headers()["retry-after"], "30");
    // A dynamic member cannot step away; an unknown incarnation cannot make it step away.
    api.heartbeat("g", "dyn", 0, &[]).await;
    let body = json!({"protocol_version": 1, "member_id": "dyn", "member_epoch": -2});
    let (s, body) = api.member_heartbeat("g", body, false).await.unwrap();
    assert_eq!(
        (s, code(&body)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST")
    );
    let (_, view) = api.get("/v1/groups/g").await;
    let group_epoch = view["group_epoch"].clone();
    // The restart: -2 keeps the shards with the member; the group does not rebalance.
    let (s, r) = api
        .member_heartbeat("g", hb(-2, &[], Some("run-1")), false)
        .await
        .unwrap();
    assert_eq!(
        (s, r["member_epoch"].as_i64()),
        (StatusCode::OK, Some(-2)),
        "{r}"
    );
    let (_, view) = api.get("/v1/groups/g").await;
    let pod = view["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["member_id"] == "pod-0")
        .unwrap()
        .clone();
    assert_eq!(
        (pod["is_static"].as_bool(), pod["away_ms"].is_u64()),
        (Some(true), true),
        "{pod}"
    );
    assert_eq!(view["group_epoch"], group_epoch);
    // The new run resumes at once with its shards and epoch.
    let (s, r) = api
        .member_heartbeat("g", hb(0, &[], Some("run-2")), true)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{r}");
    // (At the assignment epoch: "dyn" joined before the restart.)
    assert_eq!(r["member_epoch"], view["assignment_epoch"]);
    let target: Vec<u64> = pod["target_shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(shards(&r), target);
    let (_, view) = api.get("/v1/groups/g").await;
    assert_eq!(view["group_epoch"], group_epoch);
}

async fn silent_member_is_expired_by_the_sweep(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(
        api,
        "g",
        "s",
        2,
        json!({"session_timeout_ms": 400, "heartbeat_interval_ms": 100}),
    )
    .await;
    api.heartbeat("g", "m1", 0, &[]).await;
    let started = tokio::time::Instant::now();
    // Nobody heartbeats: the background sweep alone must remove m1.
    eventually("the sweep to expire m1", 10, || async {
        let (_, view) = api.get("/v1/groups/g").await;
        view["members"].as_array().unwrap().is_empty().then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "expired before its session timeout"
    );
    let (s, body) = api.heartbeat("g", "m1", 1, &[0, 1]).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "UNKNOWN_MEMBER_ID")
    );
}

async fn admin_group_lifecycle(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 3, json!({"start": "latest"})).await;
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "g", "stream": "s", "shard_count": 3}),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "GROUP_ALREADY_EXISTS")
    );
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "g2", "stream": "s", "shard_count": 5}),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "SHARD_COUNT_MISMATCH")
    );
    // Joining an existing stream without a shard count is fine (fan-out).
    let (s, v) = api
        .post("/v1/groups", json!({"group": "g2", "stream": "s"}))
        .await;
    assert_eq!(
        (s, v["shards"].as_array().map(Vec::len)),
        (StatusCode::CREATED, Some(3))
    );
    let (s, body) = api
        .post("/v1/groups", json!({"group": "g3", "stream": "new"}))
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST")
    );

    let (_, hb) = api.heartbeat("g", "m1", 0, &[]).await;
    assert_eq!(hb["start"], "latest");
    let (s, v) = api
        .call(
            Method::PATCH,
            "/v1/groups/g",
            Some(json!({"session_timeout_ms": 20_000})),
        )
        .await;
    assert_eq!(
        (
            s,
            v["session_timeout_ms"].as_u64(),
            v["group_epoch"].as_u64()
        ),
        (StatusCode::OK, Some(20_000), Some(2))
    );
    let (s, body) = api
        .call(
            Method::PATCH,
            "/v1/groups/g",
            Some(json!({"heartbeat_interval_ms": 30_000})),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST")
    );
    let (_, hb) = api.heartbeat("g", "m1", 1, &[0, 1, 2]).await;
    assert_eq!(
        (
            hb["member_epoch"].as_i64(),
            hb["session_timeout_ms"].as_u64()
        ),
        (Some(2), Some(20_000))
    );

    let (s, body) = api.call(Method::DELETE, "/v1/groups/g", None).await;
    assert_eq!((s, code(&body)), (StatusCode::CONFLICT, "GROUP_NOT_EMPTY"));
    let (s, _) = api
        .call(Method::DELETE, "/v1/groups/g?force=true", None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, body) = api.get("/v1/groups/g").await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "GROUP_NOT_FOUND"));
    let (s, _) = api.call(Method::DELETE, "/v1/groups/g2", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, body) = api.call(Method::DELETE, "/v1/groups/g2", None).await;
    assert_eq!((s, code(&body)), (StatusCode::NOT_FOUND, "GROUP_NOT_FOUND"));
    // The stream outlives its groups: producers keep routing.
    let (s, _) = api.get("/v1/streams/s/routing").await;
    assert_eq!(s, StatusCode::OK);
}

/// PROTOCOL §18: the default policy, `PATCH /v1/streams/{stream}`, its validation, a policy
/// set at creation, and the audit entry of the change.
async fn stream_retention_policy(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    create(api, "g", "s", 2, json!({})).await;
    let (_, v) = api.get("/v1/streams/s").await;
    assert_eq!(v["retention"], json!({"keep_acked_ms": 3_600_000}), "{v}");
    assert_eq!(
        v["dlq_retention"],
        json!({"keep_acked_ms": 0, "max_age_ms": 604_800_000_u64})
    );
    let policy =
        json!({"keep_acked_ms": 0, "max_age_ms": 86_400_000, "max_entries_per_shard": 1000});
    let (s, v) = api
        .call(
            Method::PATCH,
            "/v1/streams/s",
            Some(json!({"retention": policy})),
        )
        .await;
    assert_eq!((s, &v["retention"]), (StatusCode::OK, &policy), "{v}");
    let (_, v) = api.get("/v1/streams/s").await;
    assert_eq!(v["retention"], policy, "kept in the store");
    assert_eq!(
        v["routing_epoch"], 1,
        "a retention change is no layout change"
    );
    for bad in [
        json!({"retention": {"keep_acked_ms": 60_000, "max_age_ms": 1_000}}),
        json!({"retention": {"keep_acked_ms": 0, "max_entries_per_shard": 0}}),
        json!({"retention": {"keep_acked_ms": 40_000_000_000_u64}}),
        json!({"retention": {"max_age_ms": 1_000}}),
        json!({"retention": {"keep_acked_ms": 0, "maxage": 1}}),
        json!({"retention": 5}),
    ] {
        let (s, body) = api
            .call(Method::PATCH, "/v1/streams/s", Some(bad.clone()))
            .await;
        assert_eq!(
            (s, code(&body)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{bad}"
        );
    }
    let (s, body) = api
        .call(
            Method::PATCH,
            "/v1/streams/nope",
            Some(json!({"retention": {"keep_acked_ms": 0}})),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "STREAM_NOT_FOUND")
    );
    // Creating a stream may set it; an existing stream's policy is changed by PATCH only.
    let (s, v) = api
        .post(
            "/v1/groups",
            json!({"group": "g2", "stream": "t", "shard_count": 1, "retention": {"keep_acked_ms": 5_000}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, v) = api.get("/v1/streams/t").await;
    assert_eq!(v["retention"], json!({"keep_acked_ms": 5_000}));
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "g3", "stream": "t", "retention": {"keep_acked_ms": 6_000}}),
        )
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "{body}"
    );
    let (s, _) = api
        .post(
            "/v1/groups",
            json!({"group": "g3", "stream": "t", "retention": {"keep_acked_ms": 5_000}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "the same policy is accepted");
    let (_, audit) = api.get("/v1/audit?stream=s").await;
    let changes: Vec<&Value> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "stream.update" && e["result"]["status"] == 200)
        .collect();
    assert_eq!(changes.len(), 1, "{audit}");
    assert_eq!(changes[0]["target"]["stream"], "s");
    assert_eq!(changes[0]["request"]["body"]["retention"], policy);
}

async fn reshard_and_rollback_errors(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    let (s, body) = api
        .post("/v1/streams/none/reshard", json!({"shard_count": 2}))
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "STREAM_NOT_FOUND")
    );
    let (s, body) = api.get("/v1/streams/none/routing").await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::NOT_FOUND, "STREAM_NOT_FOUND")
    );
    create(api, "g", "s", 4, json!({})).await;
    let (s, body) = api.post("/v1/streams/s/rollback", json!(null)).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "NOTHING_TO_ROLLBACK")
    );
    api.heartbeat("g", "m1", 0, &[]).await;
    // Scale down: shards 2 and 3 drain while the member still holds them.
    let (s, v) = api
        .post("/v1/streams/s/reshard", json!({"shard_count": 2}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(
        (v["shard_count"].as_u64(), v["routing_epoch"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(v["resharding"]["state"], "draining");
    let (_, routing) = api.get("/v1/streams/s/routing").await;
    assert_eq!(
        (
            routing["shard_count"].as_u64(),
            &routing["resharding"]["to"]
        ),
        (Some(2), &json!(2))
    );
    let (_, hb) = api.heartbeat("g", "m1", 1, &[0, 1, 2, 3]).await;
    assert_eq!(
        (hb["shard_count"].as_u64(), shards(&hb)),
        (Some(2), vec![0, 1, 2, 3])
    );
    let (s, body) = api
        .post("/v1/streams/s/reshard", json!({"shard_count": 8}))
        .await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "RESHARD_IN_PROGRESS")
    );
    // Rollback replaces the running reshard; a rollback cannot be rolled back.
    let (s, v) = api.post("/v1/streams/s/rollback", json!(null)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(
        (
            v["shard_count"].as_u64(),
            v["last_reshard"]["rollback"].as_bool()
        ),
        (Some(4), Some(true))
    );
    let (s, body) = api.post("/v1/streams/s/rollback", json!(null)).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "NOTHING_TO_ROLLBACK")
    );
    // Draining completes when the member reports the shards drained.
    api.post("/v1/streams/s/reshard", json!({"shard_count": 3}))
        .await;
    let (_, hb) = api.heartbeat("g", "m1", 1, &[0, 1, 2, 3]).await;
    let epoch = hb["member_epoch"].as_i64().unwrap();
    let (s, _) = api
        .post(
            "/v1/groups/g/heartbeat",
            json!({"protocol_version": 1, "member_id": "m1", "member_epoch": epoch,
                   "owned_shards": [0, 1, 2, 3], "drained_shards": [3]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = api.get("/v1/streams/s").await;
    assert_eq!(
        (v["resharding"].clone(), v["last_reshard"]["state"].as_str()),
        (Value::Null, Some("complete"))
    );
    let (_, hb) = api.heartbeat("g", "m1", epoch, &[0, 1, 2, 3]).await;
    assert_eq!(shards(&hb), vec![0, 1, 2], "the retired shard is revoked");
}

async fn rollback_window_expires(backend: Backend) {
    let stack = Stack::start(backend, &["--rollback-window-ms", "300"]);
    let api = &stack.api;
    create(api, "g", "s", 2, json!({})).await;
    let (s, v) = api
        .post("/v1/streams/s/reshard", json!({"shard_count": 3}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let until = v["rollback_until_ms"]
        .as_u64()
        .expect("rollback window shown");
    eventually("the rollback window to close", 10, || async {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        (now > until + 5).then_some(())
    })
    .await;
    let (s, body) = api.post("/v1/streams/s/rollback", json!(null)).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "ROLLBACK_WINDOW_EXPIRED")
    );
}

async fn request_validation_errors(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    let bad_bodies = [
        json!({"group": "-bad", "stream": "s", "shard_count": 1}),
        json!({"group": "g", "stream": "s s", "shard_count": 1}),
        json!({"group": "g", "stream": "s", "shard_count": 0}),
        json!({"group": "g", "stream": "s", "shard_count": 4097}),
        json!({"group": "g", "stream": "s", "shard_count": -1}),
        json!({"group": "g", "stream": "s", "shard_count": 1, "session_timeout_ms": 50}),
        json!({"group": "g", "stream": "s", "shard_count": 1, "heartbeat_interval_ms": 45000}),
        json!({"group": "g", "stream": "s", "shard_count": 1, "assignor": "roulette"}),
        json!({"group": "g", "stream": "s", "shard_count": 1, "start": "middle"}),
        json!({"group": "g", "stream": "s", "shard_count": 1, "colour": "blue"}),
        json!({"group": "g", "stream": "s", "shard_count": 1, "max_members": 0}),
        json!({"stream": "s", "shard_count": 1}),
        json!([1, 2, 3]),
    ];
    for body in bad_bodies {
        let (s, v) = api.post("/v1/groups", body.clone()).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{body} → {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    // Not JSON at all.
    let resp = rsc_e2e::http()
        .post(format!("{}/v1/groups", stack.coordinator.url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(code(&v), "INVALID_REQUEST");
    // Over the 64 KiB body limit.
    let huge =
        json!({"group": "g", "stream": "s", "shard_count": 1, "assignor": "x".repeat(70_000)});
    let (s, v) = api.post("/v1/groups", huge).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE")
    );
    create(api, "g", "s", 1, json!({})).await;
    let bad_heartbeats = [
        json!({"protocol_version": 1, "member_id": "m", "member_epoch": -3}),
        json!({"protocol_version": 1, "member_id": "has space", "member_epoch": 0}),
        json!({"protocol_version": 1, "member_id": "m", "member_epoch": 0, "owned_shards": [-1]}),
        json!({"protocol_version": 1, "member_id": "m", "member_epoch": 0, "extra": true}),
        json!({"protocol_version": 1, "member_epoch": 0}),
    ];
    for body in bad_heartbeats {
        let (s, v) = api.post("/v1/groups/g/heartbeat", body.clone()).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{body} → {v}"
        );
    }
    let (s, v) = api
        .post("/v1/streams/s/reshard", json!({"shard_count": 1}))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "same count: {v}"
    );
    let (s, v) = api
        .call(Method::DELETE, "/v1/groups/g?force=maybe", None)
        .await;
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));
    let (s, v) = api.get("/v1/groups/bad%20name").await;
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));
}

async fn unknown_routes_and_methods(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    let (s, v) = api.get("/v2/groups").await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "NOT_FOUND"));
    let (s, v) = api.call(Method::PUT, "/v1/groups", Some(json!({}))).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED")
    );
    let (s, v) = api.get("/v1/groups/g/heartbeat").await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED")
    );
}

/// SIGTERM drains and exits 0.
#[tokio::test]
async fn sigterm_shuts_down_cleanly() {
    let mut stack = Stack::start(Backend::Memory, &[]);
    let status = stack
        .coordinator
        .terminate(Duration::from_secs(10))
        .expect("exits within 10 s");
    assert!(status.success(), "exit status {status}");
    assert!(
        stack
            .coordinator
            .log()
            .iter()
            .any(|l| l.contains("SIGTERM received"))
    );
}

/// A non-loopback address without an ACL or --allow-anonymous is refused at start.
#[test]
fn refuses_open_non_loopback_bind() {
    let err = rsc_testkit::CoordinatorProcess::start_listening("0.0.0.0:0", &[]).unwrap_err();
    assert!(err.to_string().contains("--allow-anonymous"), "{err}");
}
