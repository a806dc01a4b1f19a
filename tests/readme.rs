//! The README's curl walk-through runs as written against a real coordinator process.

use rsc_testkit::CoordinatorProcess;
use serde_json::{Value, json};
use std::process::Command;

#[test]
fn readme_walkthrough_runs() {
    let readme = include_str!("../README.md");
    let start = readme
        .find("\nC=http://")
        .expect("walk-through block in README");
    let block = &readme[start..];
    let block = &block[..block.find("```").expect("end of the block")];
    let coordinator = CoordinatorProcess::start(&[]).expect("coordinator starts");
    // Same commands, pointed at this test's coordinator.
    let script = block.replacen(
        "C=http://127.0.0.1:7070",
        &format!("C={}", coordinator.url()),
        1,
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "walk-through failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The walk-through prints one JSON document per call: compare them as JSON, not text.
    let docs: Vec<Value> = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("not a sequence of JSON documents ({e}): {stdout}"));
    let heartbeat = |member: &str, epoch: u64, assignment: Value| {
        docs.iter().any(|d| {
            d["member_id"] == member
                && d["member_epoch"] == epoch
                && d["heartbeat_interval_ms"] == 3000
                && d["session_timeout_ms"] == 45000
                && d["assignment"] == assignment
        })
    };
    assert!(
        heartbeat("m1", 1, json!([0, 1, 2, 3])),
        "m1 gets every shard: {stdout}"
    );
    assert!(heartbeat("m2", 2, json!([2, 3])), "m2 gets two: {stdout}");
    assert!(
        docs.iter().any(|d| contains_value(d, &json!("unrevoked"))),
        "the revocation is visible: {stdout}"
    );
    let routing = docs.last().expect("some output");
    assert_eq!(
        routing["shard_keys"],
        json!(["orders:0", "orders:1", "orders:2", "orders:3"]),
        "routing last: {routing}"
    );
    assert_eq!(routing.get("resharding"), Some(&Value::Null), "{routing}");
}

/// Whether `needle` occurs anywhere in `v` (as a value, at any depth).
fn contains_value(v: &Value, needle: &Value) -> bool {
    v == needle
        || match v {
            Value::Array(a) => a.iter().any(|x| contains_value(x, needle)),
            Value::Object(o) => o.values().any(|x| contains_value(x, needle)),
            _ => false,
        }
}
