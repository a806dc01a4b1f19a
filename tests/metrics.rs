//! `/metrics` in Prometheus text format, and lag / pending per shard read from a real data
//! Redis (`XINFO GROUPS`) into both the metrics and the group view.

use crate::security as support;
use crate::security::Secured;
use reqwest::StatusCode;
use rsc_testkit::{RedisServer, free_port};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition format strictly enough to catch malformed output; checks
/// that every sample's family has a `# TYPE`.
fn parse(text: &str) -> Vec<Sample> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "TYPE {name} twice"
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels {line}"));
                let mut labels = BTreeMap::new();
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair
                        .split_once("=\"")
                        .unwrap_or_else(|| panic!("bad label {line}"));
                    labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
                }
                (name.to_owned(), labels)
            }
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.contains_key(*f)))
            .unwrap_or(&name)
            .to_owned();
        let kind = types
            .get(&family)
            .unwrap_or_else(|| panic!("no TYPE for {name}"));
        assert!(name.starts_with("rsc_"), "{name} lacks the rsc_ prefix");
        if kind == "counter" {
            assert!(
                name.ends_with("_total"),
                "counter {name} must end in _total"
            );
        }
        samples.push((name, labels, value));
    }
    samples
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
}

#[tokio::test]
async fn metrics_and_lag_from_the_data_redis() {
    let redis = RedisServer::start().expect("redis starts");
    let stack = Secured::start(&["--data-redis-url", &redis.url()]);
    let admin = stack.api("admin");
    let viewer = stack.api("viewer");
    let (s, _) = admin
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    // Shard 0: 5 entries, 2 delivered and not acked → lag 3, pending 2. Shard 1: no key.
    for i in 0..5 {
        redis.command(&format!("XADD s1:0 * n {i}")).unwrap();
    }
    redis.command("XGROUP CREATE s1:0 g1 0").unwrap();
    let r = redis
        .command("XREADGROUP GROUP g1 c1 COUNT 2 STREAMS s1:0 >")
        .unwrap();
    assert!(r.starts_with('*'), "{r}");

    // Two members converge: m1 joins, m2 joins, m1 revokes one shard.
    let (_, a) = admin.heartbeat("g1", "m1", 0, &[]).await;
    let e1 = a["member_epoch"].as_i64().unwrap();
    let (_, b) = admin.heartbeat("g1", "m2", 0, &[]).await;
    let (_, a2) = admin.heartbeat("g1", "m1", e1, &[0, 1]).await;
    let keep: Vec<u32> = a2["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let e1 = a2["member_epoch"].as_i64().unwrap(); // asked to revoke: the assignment epoch
    let (_, a3) = admin.heartbeat("g1", "m1", e1, &keep).await;
    let (_, b2) = admin
        .heartbeat("g1", "m2", b["member_epoch"].as_i64().unwrap(), &[])
        .await;
    let (_, a4) = admin
        .heartbeat("g1", "m1", a3["member_epoch"].as_i64().unwrap(), &keep)
        .await;
    let b_owned: Vec<u32> = b2["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    admin
        .heartbeat("g1", "m2", b2["member_epoch"].as_i64().unwrap(), &b_owned)
        .await;
    let _ = a4;
    // A fenced heartbeat.
    let (s, _) = admin.heartbeat("g1", "m1", 999, &[]).await;
    assert_eq!(s, StatusCode::CONFLICT);

    let (s, view) = viewer.get("/v1/groups/g1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(view["state"], "stable", "{view}");
    assert_eq!(view["shards"][0]["lag"], 3, "{view}");
    assert_eq!(view["shards"][0]["pending"], 2, "{view}");
    assert!(
        view["shards"][1].get("lag").is_none(),
        "no key, no lag: {view}"
    );

    let (s, _) = stack.api("none").get("/metrics").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let resp = rsc_e2e::http()
        .get(format!("{}/metrics", stack.url))
        .bearer_auth(support::token_of("viewer"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain"),
        "Prometheus text format"
    );
    let text = resp.text().await.unwrap();
    let m = parse(&text);
    let g = ("group", "g1");
    let shard0 = [g, ("stream", "s1"), ("shard", "0")];
    assert_eq!(
        value(&m, "rsc_shard_lag_entries", &shard0),
        Some(3.0),
        "{text}"
    );
    assert_eq!(value(&m, "rsc_shard_pending_entries", &shard0), Some(2.0));
    assert_eq!(
        value(&m, "rsc_shard_lag_entries", &[g, ("shard", "1")]),
        None
    );
    assert_eq!(
        value(&m, "rsc_group_members", &[g, ("state", "stable")]),
        Some(2.0)
    );
    assert_eq!(
        value(&m, "rsc_group_shards", &[g, ("state", "owned")]),
        Some(2.0)
    );
    assert_eq!(value(&m, "rsc_group_pending_revocations", &[g]), Some(0.0));
    assert_eq!(value(&m, "rsc_group_reconciling_seconds", &[g]), Some(0.0));
    let ge = value(&m, "rsc_group_epoch", &[g]).unwrap();
    assert_eq!(value(&m, "rsc_group_assignment_epoch", &[g]), Some(ge));
    assert!(ge >= 2.0);
    assert_eq!(
        value(
            &m,
            "rsc_stream_shards",
            &[("stream", "s1"), ("state", "active")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &m,
            "rsc_reshard_state",
            &[("stream", "s1"), ("state", "none")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&m, "rsc_state_scrape_ok", &[]), Some(1.0));
    assert!(value(&m, "rsc_heartbeats_total", &[g, ("result", "ok")]).unwrap() >= 6.0);
    assert_eq!(
        value(
            &m,
            "rsc_heartbeats_total",
            &[g, ("result", "FENCED_MEMBER_EPOCH")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &m,
            "rsc_members_fenced_total",
            &[g, ("reason", "stale_epoch")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&m, "rsc_member_changes_total", &[g, ("change", "joined")]),
        Some(2.0)
    );
    assert!(value(&m, "rsc_rebalances_total", &[g]).unwrap() >= 2.0);
    assert!(
        value(&m, "rsc_group_convergence_seconds_count", &[g]).unwrap() >= 1.0,
        "the group converged at least once"
    );
    assert!(
        value(
            &m,
            "rsc_http_requests_total",
            &[
                ("route", "/v1/groups/{group}/heartbeat"),
                ("method", "POST"),
                ("status", "200")
            ]
        )
        .unwrap()
            >= 6.0
    );
    assert!(
        value(
            &m,
            "rsc_store_operation_duration_seconds_count",
            &[("operation", "put_group")]
        )
        .unwrap()
            >= 1.0
    );
    assert_eq!(
        value(
            &m,
            "rsc_http_requests_total",
            &[("route", "/metrics"), ("status", "401")]
        ),
        Some(1.0)
    );
    // Bounded labels: no member ids, no raw paths.
    let label_values: BTreeSet<&str> = m
        .iter()
        .flat_map(|(_, l, _)| l.values().map(String::as_str))
        .collect();
    for forbidden in ["m1", "m2", "/v1/groups/g1", "/v1/groups/g1/heartbeat"] {
        assert!(!label_values.contains(forbidden), "label value {forbidden}");
    }
}

#[tokio::test]
async fn an_unreachable_data_redis_leaves_lag_out() {
    let port = free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let stack = Secured::start(&["--data-redis-url", &url]);
    let (s, _) = stack
        .api("admin")
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, view) = stack.api("viewer").get("/v1/groups/g1").await;
    assert_eq!(s, StatusCode::OK);
    for shard in view["shards"].as_array().unwrap() {
        assert!(
            shard.get("lag").is_none() && shard.get("pending").is_none(),
            "{shard}"
        );
    }
    let (s, _) = stack.api("viewer").get("/metrics").await;
    assert_eq!(s, StatusCode::OK);
}
