//! The front door for members (PROTOCOL §4.3, §8, §13), against real coordinator processes:
//! a heartbeat with a field over its limit is refused with `400` and leaves the group view
//! small; a principal over its wake-up channel cap is refused with `429` while another one
//! still opens channels (and without an ACL no principal cap applies); a token bound to
//! member ids (`members` in its ACL entry) is refused as another member (`403`) on every
//! member route, and accepted as its own.

use reqwest::StatusCode;
use rsc_e2e::{Api, code, metric_sum};
use rsc_testkit::CoordinatorProcess;
use serde_json::{Value, json};
use std::io::Write;

/// `(principal, token, toml lines)` of the ACL of these tests.
const ACL: &[(&str, &str, &str)] = &[
    (
        "ops",
        "t-ops",
        "roles = [\"admin\"]\ngroups = [\"*\"]\nstreams = [\"*\"]",
    ),
    (
        "pods-a",
        "t-pods-a",
        "roles = [\"member\"]\ngroups = [\"*\"]",
    ),
    (
        "pods-b",
        "t-pods-b",
        "roles = [\"member\"]\ngroups = [\"*\"]",
    ),
    (
        "billing",
        "t-billing",
        "roles = [\"member\"]\ngroups = [\"*\"]\nmembers = [\"billing-*\"]",
    ),
];

/// A memory-store coordinator with [`ACL`] and `extra` flags; the ACL file lives beside it.
fn secured(extra: &[&str]) -> (CoordinatorProcess, tempfile::NamedTempFile) {
    let mut acl = tempfile::NamedTempFile::new().expect("temp file");
    for (principal, token, rest) in ACL {
        writeln!(
            acl,
            "[[tokens]]\nprincipal = \"{principal}\"\ntoken = \"{token}\"\n{rest}\n"
        )
        .unwrap();
    }
    acl.flush().unwrap();
    let path = acl.path().to_str().unwrap().to_owned();
    let mut args = vec!["--store", "memory", "--acl", &path];
    args.extend_from_slice(extra);
    let c = CoordinatorProcess::start(&args).expect("coordinator starts");
    (c, acl)
}

/// A metric's value on the coordinator at `base`, scraped with `token`.
async fn metric(base: &str, token: Option<&str>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut req = rsc_e2e::http().get(format!("{base}/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let text = req.send().await.unwrap().text().await.unwrap();
    metric_sum(&text, name, labels)
}

async fn create_group(api: &Api, group: &str) {
    let (s, v) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": format!("{group}-s"), "shard_count": 4}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

fn join(member: &str, client: Value) -> Value {
    json!({"protocol_version": 1, "member_id": member, "member_epoch": 0, "owned_shards": [],
        "client": client})
}

/// Opens a wake-up channel with `token` for `members` of `group`: the status and, on
/// success, the open stream (held to keep the channel open).
async fn open_channel(
    base: &str,
    token: Option<&str>,
    group: &str,
    members: &[&str],
) -> (StatusCode, Option<reqwest::Response>, Value) {
    let body = json!({"members": members.iter()
        .map(|m| json!({"group": group, "member_id": m})).collect::<Vec<_>>()});
    let mut req = rsc_e2e::http()
        .post(format!("{base}/v1/wakeups"))
        .json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("coordinator reachable");
    let status = resp.status();
    if status == StatusCode::OK {
        return (status, Some(resp), Value::Null);
    }
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let mut v: Value = resp.json().await.unwrap_or_default();
    if let Some(r) = retry_after {
        v["retry_after_header"] = r.into();
    }
    (status, None, v)
}

#[tokio::test]
async fn a_heartbeat_field_over_its_limit_is_refused_and_the_group_view_stays_small() {
    let (c, _acl) = secured(&[]);
    let base = c.url();
    let ops = Api::new(base.clone()).with_token("t-ops");
    let pods = Api::new(base.clone()).with_token("t-pods-a");
    create_group(&ops, "g1").await;

    // The attacker's trial: 20 joins with a 63 KB client.host (10 on each heartbeat route).
    let host = "h".repeat(63 * 1024);
    for i in 0..20 {
        let body = join(&format!("m{i}"), json!({"host": host, "version": "0.1.0"}));
        let (s, v) = pods.member_heartbeat("g1", body, i % 2 == 1).await.unwrap();
        assert_eq!((s.as_u16(), code(&v)), (400, "INVALID_REQUEST"), "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert_eq!(
            message,
            "client.host is 64512 bytes long; at most 256 are allowed (PROTOCOL §4.3)"
        );
    }
    let (s, view) = ops.get("/v1/groups/g1").await;
    assert_eq!(s, StatusCode::OK);
    let size = view.to_string().len();
    assert_eq!(view["members"].as_array().unwrap().len(), 0, "{view}");
    assert!(size < 4096, "the group view is {size} bytes");
    let refused = metric(
        &base,
        Some("t-ops"),
        "rsc_invalid_requests_total",
        &[("reason", "field_too_long"), ("field", "client.host")],
    )
    .await;
    assert_eq!(refused, 20.0);

    // At the limit, every client field is accepted and shown.
    let at = "x".repeat(256);
    for (i, field) in ["host", "pod_ip", "version"].into_iter().enumerate() {
        let (s, v) = pods
            .member_heartbeat("g1", join(&format!("ok{i}"), json!({field: at})), i == 1)
            .await
            .unwrap();
        assert_eq!(s, StatusCode::OK, "{field}: {v}");
    }
    // Shard lists: an index no stream has, or more items than any stream has shards.
    let (s, v) = pods
        .member_heartbeat(
            "g1",
            json!({"protocol_version": 1, "member_id": "ok0", "member_epoch": 1,
                "owned_shards": vec![0; 4097]}),
            false,
        )
        .await
        .unwrap();
    assert_eq!(s.as_u16(), 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("owned_shards has 4097 items; at most 4096"),
        "{v}"
    );
    let (_, view) = ops.get("/v1/groups/g1").await;
    let members = view["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{view}");
    let size = view.to_string().len();
    assert!(size < 8192, "three members at the limits: {size} bytes");
}

#[tokio::test]
async fn a_principal_over_its_wake_channel_cap_is_refused_while_another_still_opens() {
    let (c, _acl) = secured(&["--wake-max-channels-per-principal", "2"]);
    let base = c.url();
    create_group(&Api::new(base.clone()).with_token("t-ops"), "g1").await;

    let mut held = Vec::new();
    for m in ["a1", "a2"] {
        let (s, ch, v) = open_channel(&base, Some("t-pods-a"), "g1", &[m]).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        held.push(ch);
    }
    let (s, _, v) = open_channel(&base, Some("t-pods-a"), "g1", &["a3"]).await;
    assert_eq!((s.as_u16(), code(&v)), (429, "RATE_LIMITED"), "{v}");
    assert_eq!(v["retry_after_header"], "30", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("principal pods-a holds its maximum of 2 wake-up channels"),
        "{message}"
    );
    // Another principal is not held back by the first one's channels.
    let (s, b, v) = open_channel(&base, Some("t-pods-b"), "g1", &["b1"]).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let refused = metric(
        &base,
        Some("t-ops"),
        "rsc_wake_channels_refused_total",
        &[("reason", "per_principal")],
    )
    .await;
    assert_eq!(refused, 1.0);
    let open = metric(&base, Some("t-ops"), "rsc_wake_channels_open", &[]).await;
    assert_eq!(open, 3.0);
    drop((held, b));

    // Without an ACL every request is `anonymous`: the per-principal cap does not apply
    // (the coordinator's own limit does).
    let open_coordinator = CoordinatorProcess::start(&[
        "--store",
        "memory",
        "--wake-max-channels-per-principal",
        "1",
        "--wake-max-channels",
        "3",
    ])
    .expect("coordinator starts");
    let base = open_coordinator.url();
    create_group(&Api::new(base.clone()), "g1").await;
    let mut held = Vec::new();
    for m in ["n1", "n2", "n3"] {
        let (s, ch, v) = open_channel(&base, None, "g1", &[m]).await;
        assert_eq!(s, StatusCode::OK, "{m}: {v}");
        held.push(ch);
    }
    let (s, _, v) = open_channel(&base, None, "g1", &["n4"]).await;
    assert_eq!((s.as_u16(), code(&v)), (429, "RATE_LIMITED"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this coordinator holds its maximum of 3"),
        "{v}"
    );
    let refused = metric(
        &base,
        None,
        "rsc_wake_channels_refused_total",
        &[("reason", "max_channels")],
    )
    .await;
    assert_eq!(refused, 1.0);
}

#[tokio::test]
async fn a_token_bound_to_member_ids_acts_only_as_its_own_members() {
    let (c, _acl) = secured(&[]);
    let base = c.url();
    create_group(&Api::new(base.clone()).with_token("t-ops"), "g1").await;
    let billing = Api::new(base.clone()).with_token("t-billing");
    let forbidden_before = metric(
        &base,
        Some("t-ops"),
        "rsc_access_refusals_total",
        &[("code", "FORBIDDEN")],
    )
    .await;
    let expect_forbidden = |what: &str, s: StatusCode, v: &Value, member: &str| {
        assert_eq!((s.as_u16(), code(v)), (403, "FORBIDDEN"), "{what}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("principal billing is not bound to member id")
                && message.contains(member),
            "{what}: {message}"
        );
    };

    // As another member id: every member route refuses it.
    for batched in [false, true] {
        let (s, v) = billing
            .member_heartbeat("g1", join("shipping-0", json!({})), batched)
            .await
            .unwrap();
        expect_forbidden("heartbeat", s, &v, "shipping-0");
    }
    let (s, v) = billing
        .post(
            "/v1/groups/g1/leave",
            json!({"member_id": "shipping-0", "member_epoch": 1}),
        )
        .await;
    expect_forbidden("leave", s, &v, "shipping-0");
    let (s, _, v) =
        open_channel(&base, Some("t-billing"), "g1", &["billing-0", "shipping-0"]).await;
    expect_forbidden("wake-up channel", s, &v, "shipping-0");
    let forbidden = metric(
        &base,
        Some("t-ops"),
        "rsc_access_refusals_total",
        &[("code", "FORBIDDEN")],
    )
    .await;
    assert_eq!(forbidden - forbidden_before, 4.0);
    // Nothing of it reached the group.
    let (_, view) = Api::new(base.clone())
        .with_token("t-ops")
        .get("/v1/groups/g1")
        .await;
    assert_eq!(view["members"].as_array().unwrap().len(), 0, "{view}");

    // As its own member ids: accepted on every route.
    let (s, v) = billing
        .member_heartbeat("g1", join("billing-0", json!({})), false)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
    let epoch = v["member_epoch"].as_i64().unwrap();
    let (s, v) = billing
        .member_heartbeat("g1", join("billing-1", json!({})), true)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, ch, v) =
        open_channel(&base, Some("t-billing"), "g1", &["billing-0", "billing-1"]).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    drop(ch);
    let (s, v) = billing
        .post(
            "/v1/groups/g1/leave",
            json!({"member_id": "billing-0", "member_epoch": epoch}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // An unbound member token still acts as any member id.
    let (s, v) = Api::new(base.clone())
        .with_token("t-pods-a")
        .member_heartbeat("g1", join("shipping-0", json!({})), false)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
}
