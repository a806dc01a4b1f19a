//! The README's curl walk-through runs as written against a real coordinator process.

use rsc_testkit::CoordinatorProcess;
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
    let lines: Vec<&str> = stdout.split_inclusive('}').collect();
    assert!(stdout.contains(r#""member_id":"m1","member_epoch":1,"heartbeat_interval_ms":3000,"session_timeout_ms":45000,"assignment":[0,1,2,3]"#), "{stdout}");
    assert!(stdout.contains(r#""member_id":"m2","member_epoch":2,"heartbeat_interval_ms":3000,"session_timeout_ms":45000,"assignment":[2,3]"#), "{stdout}");
    assert!(
        stdout.contains(r#""state":"unrevoked""#),
        "the revocation is visible: {stdout}"
    );
    assert!(
        stdout.ends_with(
            r#""shard_keys":["orders:0","orders:1","orders:2","orders:3"],"resharding":null}"#
        ),
        "routing last: {:?}",
        lines.last()
    );
}
