//! The quick start of `docs/GUIDE.md` runs as written (on free ports instead of 6379 / 7070):
//! Redis, a coordinator, a group, a sample consumer pod and a producer; then every published
//! message is consumed.

use rsc_testkit::{binary_path, free_port, wait_for};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn guide_quick_start_runs() {
    let guide = include_str!("../docs/GUIDE.md");
    let start = guide.find("## Quick start").expect("quick start section");
    let block = &guide[start..];
    let block = &block[block.find("```sh\n").expect("sh block") + 6..];
    let block = &block[..block.find("```").expect("end of block")];
    let (redis_port, http_port) = (free_port().unwrap(), free_port().unwrap());
    let coordinator = format!("127.0.0.1:{http_port}");
    let script = block
        .replace("6379", &redis_port.to_string())
        .replace("127.0.0.1:7070", &coordinator);
    let bin_dir = binary_path("rsc-coordinator")
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    // Background jobs of the block are stopped when the test ends, and so is the Redis.
    let wrapped = format!(
        "cleanup() {{ kill $(jobs -p) 2>/dev/null; wait; redis-cli -p {redis_port} shutdown nosave >/dev/null 2>&1; }}\n\
         trap cleanup EXIT\nset -euo pipefail\n{script}\n\
         for _ in $(seq 1 300); do\n\
           lag=$(rsc-coordinator group describe billing --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); print(len(v[\"members\"]), 0 if all(s.get(\"lag\") == 0 and s.get(\"pending\") == 0 for s in v[\"shards\"]) else 1)')\n\
           [ \"$lag\" = \"2 0\" ] && break; sleep 0.1\n\
         done\n\
         echo members-and-lag: $lag after $SECONDS s\n\
         rsc-coordinator group describe billing\n"
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&wrapped)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("RSC_LISTEN", &coordinator)
        .env("RSC_COORDINATOR_URL", format!("http://{coordinator}"))
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "quick start failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("published 1000"), "{stdout}");
    // (The block's own describe may run before the pod's members joined on a loaded
    // machine; the one after the wait shows them.)
    assert!(
        stdout.contains("127.0.0.1-billing-0"),
        "describe shows the members: {stdout}"
    );
    assert!(
        stdout.contains("members-and-lag: 2 0"),
        "both members joined and consumed everything: {stdout}"
    );
    // Nothing is left listening once the script is over.
    wait_for("the coordinator to stop", Duration::from_secs(10), || {
        std::net::TcpStream::connect(&coordinator)
            .is_err()
            .then_some(())
    })
    .expect("the script's background jobs are stopped");
}

/// `quickstart.rs` uses no crate of this repository but `rsc-client`, and only the crates its
/// header tells a new project to add: it compiles when copied out.
#[test]
fn quickstart_needs_only_the_crates_it_names() {
    let source = include_str!("../examples/src/bin/quickstart.rs");
    let (header, code): (Vec<&str>, Vec<&str>) = source.lines().partition(|l| l.starts_with("//!"));
    let header = header.join("\n");
    let named: Vec<&str> = header
        .lines()
        .filter_map(|l| {
            l.trim_start_matches("//!")
                .trim()
                .strip_prefix("cargo add ")
        })
        .flat_map(|l| l.split_whitespace().take_while(|w| !w.starts_with("--")))
        .collect();
    let code = code.join("\n");
    let mut used: Vec<String> = Vec::new();
    for (i, _) in code.match_indices("::") {
        let start = code[..i]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let path_start = code[..start].ends_with("::");
        let name = &code[start..i];
        if !path_start && !name.is_empty() && name.chars().next().is_some_and(char::is_lowercase) {
            used.push(name.replace('_', "-"));
        }
    }
    used.sort();
    used.dedup();
    let std_or_self = ["std", "core", "crate", "self", "super"];
    for krate in used.iter().filter(|c| !std_or_self.contains(&c.as_str())) {
        assert!(
            named.contains(&krate.as_str()),
            "quickstart.rs uses `{krate}`, which its header does not tell a new project to add \
             (it names {named:?})"
        );
    }
    assert!(used.contains(&"rsc-client".to_owned()), "{used:?}");
}
