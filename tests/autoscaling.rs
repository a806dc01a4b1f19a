//! The autoscaling signal: `GET /v1/groups/{group}/scaling` (role viewer) against the
//! `rsc_group_*` gauges of `/metrics` and against what is really in the data Redis, and the
//! KEDA manifests in `docker/k8s/` (parsed; the fields KEDA requires; `maxReplicaCount`
//! derived from shards and concurrency; the metrics-api trigger reads a field the route
//! serves). No Kubernetes cluster needed.

use crate::security::Secured;
use rsc_testkit::RedisServer;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::PathBuf;

const GROUP: &str = "g1";
const STREAM: &str = "s1";
const SHARDS: u64 = 4;

fn redis(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("redis")
}

/// The value of `name{labels…}` in a Prometheus text body, for the sample whose labels
/// contain `group="…"`.
fn gauge(text: &str, name: &str, group: &str) -> Option<f64> {
    let needle = format!("group=\"{group}\"");
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| l.contains(&needle))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn the_scaling_route_matches_the_gauges_and_the_data_redis() {
    let data = RedisServer::start().expect("redis");
    let url = data.url();
    let coord = Secured::start(&["--data-redis-url", &url]);
    let admin = coord.api("admin");
    let (s, b) = admin
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": STREAM, "shard_count": SHARDS,
                "session_timeout_ms": 30_000, "heartbeat_interval_ms": 1_000}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{b}");

    // Three members in two pods of concurrency 2.
    let member = coord.api("member");
    for (id, ip) in [
        ("p1-0", "10.0.0.1"),
        ("p1-1", "10.0.0.1"),
        ("p2-0", "10.0.0.2"),
    ] {
        let (s, b) = member
            .post(
                &format!("/v1/groups/{GROUP}/heartbeat"),
                json!({"protocol_version": 1, "member_id": id, "member_epoch": 0,
                    "owned_shards": [], "client": {"pod_ip": ip, "concurrency": 2}}),
            )
            .await;
        assert_eq!(s.as_u16(), 200, "{b}");
    }

    // Entries in the shards: 10, 20, 30, 40; 5 of shard 0 delivered and not acknowledged.
    let (_, routing) = admin.get(&format!("/v1/streams/{STREAM}/routing")).await;
    let keys: Vec<String> = serde_json::from_value(routing["shard_keys"].clone()).expect("keys");
    assert_eq!(keys.len() as u64, SHARDS);
    let mut con = redis(&data);
    for (i, key) in keys.iter().enumerate() {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(key)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query(&mut con)
            .expect("XGROUP CREATE");
        for n in 0..(i + 1) * 10 {
            let _: String = redis::cmd("XADD")
                .arg(key)
                .arg("*")
                .arg("n")
                .arg(n)
                .query(&mut con)
                .expect("XADD");
        }
    }
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("c")
        .arg("COUNT")
        .arg(5)
        .arg("STREAMS")
        .arg(&keys[0])
        .arg(">")
        .query(&mut con)
        .expect("XREADGROUP");

    let viewer = coord.api("viewer");
    let (s, v) = viewer.get(&format!("/v1/groups/{GROUP}/scaling")).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    assert_eq!(v["group"], GROUP);
    assert_eq!(v["stream"], STREAM);
    assert_eq!(v["lag"], 95, "{v}");
    assert_eq!(v["pending"], 5, "{v}");
    assert_eq!(v["backlog"], 100, "{v}");
    assert_eq!(v["shards"], SHARDS);
    assert_eq!(v["shards_reporting"], SHARDS);
    assert_eq!(v["active_shards"], SHARDS);
    assert_eq!(v["members"], 3);
    assert_eq!(v["idle_members"], 0, "3 members, 4 shards: none idle");
    assert_eq!(v["processes"], 2);
    assert_eq!(v["concurrency"], 2, "reported by the members");
    assert_eq!(v["max_replicas"], 2, "ceil(4 shards / 2 per pod)");

    // The same numbers as the gauges.
    let (s, text) = viewer.get("/metrics").await;
    assert_eq!(s.as_u16(), 200);
    let text = text.as_str().expect("text").to_owned();
    for (field, metric) in [
        ("lag", "rsc_group_lag_entries"),
        ("pending", "rsc_group_pending_entries"),
        ("backlog", "rsc_group_backlog_entries"),
        ("shards_reporting", "rsc_group_shards_reporting"),
        ("active_shards", "rsc_group_active_shards"),
        ("members", "rsc_group_member_count"),
        ("idle_members", "rsc_group_idle_members"),
        ("processes", "rsc_group_processes"),
        ("max_replicas", "rsc_group_max_replicas"),
    ] {
        assert_eq!(
            gauge(&text, metric, GROUP),
            v[field].as_f64(),
            "{metric} vs .{field}"
        );
    }

    // Concurrency given by the caller; out of range refused.
    let (_, one) = viewer
        .get(&format!("/v1/groups/{GROUP}/scaling?concurrency=1"))
        .await;
    assert_eq!(one["max_replicas"], 4);
    let (s, b) = viewer
        .get(&format!("/v1/groups/{GROUP}/scaling?concurrency=0"))
        .await;
    assert_eq!(s.as_u16(), 400, "{b}");
    assert_eq!(b["error"]["code"], "INVALID_REQUEST");

    // Viewer role, within its group scope.
    let (s, _) = coord
        .api("member")
        .get(&format!("/v1/groups/{GROUP}/scaling"))
        .await;
    assert_eq!(s.as_u16(), 403, "a member token is not a viewer");
    let (s, _) = coord
        .api("none")
        .get(&format!("/v1/groups/{GROUP}/scaling"))
        .await;
    assert_eq!(s.as_u16(), 401);
    let (s, _) = coord
        .api("viewer-g1")
        .get(&format!("/v1/groups/{GROUP}/scaling"))
        .await;
    assert_eq!(s.as_u16(), 200);
    let (s, _) = coord.api("viewer-g1").get("/v1/groups/g2/scaling").await;
    assert_eq!(s.as_u16(), 403, "outside the viewer's group scope");
    let (s, b) = viewer.get("/v1/groups/nope/scaling").await;
    assert_eq!(s.as_u16(), 404, "{b}");

    // The metrics-api manifest reads a numeric field of this answer.
    let docs = manifest("keda-metrics-api.yaml");
    let so = find(&docs, "ScaledObject");
    let location = so["spec"]["triggers"][0]["metadata"]["valueLocation"]
        .as_str()
        .expect("valueLocation");
    assert!(v[location].is_u64(), "{location} is not a number in {v}");
}

fn manifest(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docker/k8s")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// `--concurrency` of the sample consumer Deployment the ScaledObject targets.
fn target_concurrency(so: &Value) -> u64 {
    let target = so["spec"]["scaleTargetRef"]["name"]
        .as_str()
        .expect("scaleTargetRef.name");
    let docs = manifest("sample-consumer.yaml");
    let deploy = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == target)
        .unwrap_or_else(|| panic!("the target {target} is not in sample-consumer.yaml"));
    let args: Vec<&str> = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let i = args
        .iter()
        .position(|a| *a == "--concurrency")
        .expect("--concurrency");
    args[i + 1].parse().expect("a number")
}

fn check_scaled_object(so: &Value, trigger_type: &str, required: &[&str]) {
    assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
    assert!(so["metadata"]["name"].is_string());
    assert!(so["spec"]["scaleTargetRef"]["name"].is_string());
    let min = so["spec"]["minReplicaCount"]
        .as_u64()
        .expect("minReplicaCount");
    let max = so["spec"]["maxReplicaCount"]
        .as_u64()
        .expect("maxReplicaCount");
    let shards: u64 = so["metadata"]["annotations"]["redis-stream-coordinator/shards"]
        .as_str()
        .expect("the shards annotation")
        .parse()
        .expect("a number");
    let concurrency = target_concurrency(so);
    assert_eq!(
        max,
        shards.div_ceil(concurrency),
        "maxReplicaCount must be ceil(shards / concurrency)"
    );
    assert!(min >= 1 && min <= max);
    let triggers = so["spec"]["triggers"].as_array().expect("triggers");
    assert_eq!(triggers.len(), 1, "one trigger covers the whole group");
    let t = &triggers[0];
    assert_eq!(t["type"], trigger_type);
    for key in required {
        assert!(
            t["metadata"][key].as_str().is_some_and(|v| !v.is_empty()),
            "{trigger_type} trigger without metadata.{key}"
        );
    }
}

#[test]
fn keda_manifests_have_what_keda_requires() {
    let api = manifest("keda-metrics-api.yaml");
    let so = find(&api, "ScaledObject");
    check_scaled_object(so, "metrics-api", &["url", "valueLocation", "targetValue"]);
    let t = &so["spec"]["triggers"][0];
    let url = t["metadata"]["url"].as_str().expect("url");
    // The coordinator Service and the scaling route of the group the consumer runs.
    let coord = manifest("coordinator.yaml");
    let service = coord
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("coordinator Service");
    let base = format!(
        "http://{}:{}/v1/groups/",
        service["metadata"]["name"].as_str().expect("name"),
        service["spec"]["ports"][0]["port"]
    );
    assert!(url.starts_with(&base), "{url} vs {base}");
    assert!(url.contains("/scaling"), "{url}");
    // Bearer auth through a TriggerAuthentication in the same file.
    assert_eq!(t["metadata"]["authMode"], "bearer");
    let auth = find(&api, "TriggerAuthentication");
    assert_eq!(t["authenticationRef"]["name"], auth["metadata"]["name"]);
    assert_eq!(auth["spec"]["secretTargetRef"][0]["parameter"], "token");
    assert!(
        t["metadata"]["targetValue"]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| v > 0.0)
    );

    let prom = manifest("keda-prometheus.yaml");
    let so = find(&prom, "ScaledObject");
    check_scaled_object(so, "prometheus", &["serverAddress", "query", "threshold"]);
    let query = so["spec"]["triggers"][0]["metadata"]["query"]
        .as_str()
        .expect("query");
    assert!(query.contains("rsc_group_backlog_entries"), "{query}");
}
