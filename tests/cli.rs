//! The operators' CLI (`rsc-coordinator group|stream|member …`), run as a real process against
//! a real coordinator process: output, exit status and error messages.

use reqwest::StatusCode;
use rsc_e2e::{Api, Backend, Stack};
use rsc_testkit::{binary_path, wait_for};
use serde_json::{Value, json};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// What a CLI run produced.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    fn ok(self) -> Self {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }

    /// Asserts a refusal: exit status 1 and `error: CODE: …` on stderr.
    #[track_caller]
    fn refused(self, code: &str) -> Self {
        assert_eq!(self.code, 1, "{self:?}");
        assert!(
            self.stderr.starts_with(&format!("error: {code}: ")),
            "{self:?}"
        );
        assert!(self.stdout.is_empty(), "{self:?}");
        self
    }
}

fn from_output(o: Output) -> Run {
    Run {
        code: o.status.code().expect("exited, not killed by a signal"),
        stdout: String::from_utf8(o.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(o.stderr).expect("utf-8 stderr"),
    }
}

fn command(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(binary_path("rsc-coordinator").expect("binary built"));
    c.args(args)
        .arg("--coordinator")
        .arg(url)
        .env_remove("RSC_COORDINATOR_URL")
        .env_remove("RSC_TOKEN")
        .stdin(Stdio::null());
    c
}

/// Runs the CLI against `url` to completion.
fn cli(url: &str, args: &[&str]) -> Run {
    from_output(command(url, args).output().expect("cli runs"))
}

/// Starts the CLI without waiting for it.
fn spawn_cli(url: &str, args: &[&str]) -> Child {
    command(url, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cli starts")
}

fn finish(child: Child) -> Run {
    let mut child = child;
    wait_for("the CLI to exit", Duration::from_secs(20), || {
        child.try_wait().expect("wait").map(|_| ())
    })
    .unwrap_or_else(|e| {
        let _ = child.kill();
        panic!("{e}")
    });
    from_output(child.wait_with_output().expect("output"))
}

/// Joins `members` and heartbeats them until the group is stable; returns each member's epoch.
async fn converge(api: &Api, group: &str, members: &[&str]) -> Vec<(String, i64, Vec<u32>)> {
    let mut state: Vec<(String, i64, Vec<u32>)> = members
        .iter()
        .map(|m| ((*m).to_owned(), 0, Vec::new()))
        .collect();
    for _ in 0..20 {
        for (id, epoch, owned) in state.iter_mut() {
            let (s, body) = api.heartbeat(group, id, *epoch, owned).await;
            assert_eq!(s, StatusCode::OK, "{body}");
            *epoch = body["member_epoch"].as_i64().unwrap();
            *owned = serde_json::from_value(body["assignment"].clone()).unwrap();
        }
        let (_, view) = api.get(&format!("/v1/groups/{group}")).await;
        if view["state"] == "stable" {
            return state;
        }
    }
    panic!("group {group} did not converge");
}

fn cells(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test]
async fn group_lifecycle_tables_and_json() {
    let stack = Stack::start(Backend::Memory, &[]);
    let url = stack.coordinator.url();
    let api = &stack.api;

    let r = cli(
        &url,
        &[
            "group",
            "create",
            "billing",
            "--stream",
            "orders",
            "--shards",
            "6",
            "--start",
            "latest",
            "--session-timeout-ms",
            "30000",
            "--heartbeat-interval-ms",
            "1000",
            "--rebalance-timeout-ms",
            "20000",
            "--max-members",
            "5",
        ],
    )
    .ok();
    assert!(
        r.stdout
            .starts_with("Created group billing on stream orders (6 shards)."),
        "{r:?}"
    );
    let (_, view) = api.get("/v1/groups/billing").await;
    assert_eq!(
        (
            &view["start"],
            &view["session_timeout_ms"],
            &view["heartbeat_interval_ms"],
            &view["rebalance_timeout_ms"],
            &view["max_members"]
        ),
        (
            &json!("latest"),
            &json!(30000),
            &json!(1000),
            &json!(20000),
            &json!(5)
        )
    );
    cli(
        &url,
        &[
            "group", "create", "billing", "--stream", "orders", "--shards", "6",
        ],
    )
    .refused("GROUP_ALREADY_EXISTS");
    cli(
        &url,
        &[
            "group", "create", "other", "--stream", "orders", "--shards", "3",
        ],
    )
    .refused("SHARD_COUNT_MISMATCH");
    // `--output json` prints the API's view; the group flags go before or after the verb.
    let created = cli(
        &url,
        &[
            "group", "--output", "json", "create", "audit", "--stream", "orders",
        ],
    )
    .ok()
    .json();
    assert_eq!(
        (&created["group"], &created["stream"]),
        (&json!("audit"), &json!("orders"))
    );
    assert_eq!(created["shards"].as_array().unwrap().len(), 6);

    converge(api, "billing", &["m1", "m2"]).await;

    // describe (table): one row per shard with the real owners, one row per member.
    let r = cli(&url, &["group", "describe", "billing"]).ok();
    let (_, view) = api.get("/v1/groups/billing").await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        cells(lines[0])[..5],
        ["GROUP", "STREAM", "STATE", "GROUP", "EPOCH"]
    );
    assert_eq!(cells(lines[1])[..3], ["billing", "orders", "stable"]);
    let header = lines
        .iter()
        .position(|l| l.starts_with("SHARD "))
        .expect("shard table");
    assert_eq!(
        cells(lines[header]),
        [
            "SHARD",
            "KEY",
            "CURRENT",
            "OWNER",
            "TARGET",
            "OWNER",
            "STATE",
            "LAST",
            "DELIVERED",
            "DELIVERED",
            "AT",
            "LAG",
            "PENDING",
            "OLDEST",
            "PENDING",
            "STALE",
            "CONSUMERS"
        ]
    );
    // Without a data Redis: no position, lag or pending entries.
    for (i, shard) in view["shards"].as_array().unwrap().iter().enumerate() {
        let owner = shard["current_owner"].as_str().unwrap();
        assert_eq!(
            cells(lines[header + 1 + i]),
            [
                &i.to_string(),
                &format!("orders:{i}"),
                owner,
                owner,
                "active",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            ]
        );
        assert!(shard.get("last_delivered_id").is_none(), "{shard}");
    }
    let member_header = lines
        .iter()
        .position(|l| l.starts_with("MEMBER "))
        .expect("member table");
    for (i, m) in view["members"].as_array().unwrap().iter().enumerate() {
        let row = cells(lines[member_header + 1 + i]);
        assert_eq!(row[0], m["member_id"].as_str().unwrap());
        assert_eq!(row[1], m["member_epoch"].to_string());
        assert_eq!(row[2], "stable");
        assert_eq!(row.len(), 9, "{row:?}"); // … last heartbeat "X ago", client "-"
    }

    // describe (json) is the API's view.
    let mut printed = cli(&url, &["group", "describe", "billing", "--output", "json"])
        .ok()
        .json();
    let (_, mut fetched) = api.get("/v1/groups/billing").await;
    for v in [&mut printed, &mut fetched] {
        for m in v["members"].as_array_mut().unwrap() {
            m["last_heartbeat_ms_ago"] = json!(0);
        }
    }
    assert_eq!(printed, fetched);

    // list, both ways.
    let r = cli(&url, &["group", "list"]).ok();
    let rows: Vec<Vec<&str>> = r.stdout.lines().map(cells).collect();
    assert_eq!(rows[0][..3], ["GROUP", "STREAM", "STATE"]);
    assert_eq!(rows[1][..5], ["audit", "orders", "empty", "0", "6"]);
    assert_eq!(rows[2][..5], ["billing", "orders", "stable", "2", "6"]);
    let listed = cli(&url, &["group", "list", "--output", "json"])
        .ok()
        .json();
    let names: Vec<&str> = listed["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["audit", "billing"]);

    // member remove fences the member and frees its shards.
    let r = cli(&url, &["member", "remove", "billing", "m2"]).ok();
    assert!(
        r.stdout.starts_with("Removed member m2 from group billing"),
        "{r:?}"
    );
    let (_, view) = api.get("/v1/groups/billing").await;
    let ids: Vec<&str> = view["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["member_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1"]);
    cli(&url, &["member", "remove", "billing", "m2"]).refused("UNKNOWN_MEMBER_ID");
    let removed = cli(
        &url,
        &["member", "remove", "billing", "m1", "--output", "json"],
    )
    .ok()
    .json();
    assert_eq!(
        removed,
        json!({"group": "billing", "member": "m1", "removed": true})
    );

    // delete: refused while members live, then forced; then the group is gone.
    converge(api, "billing", &["m3"]).await;
    let r = cli(&url, &["group", "delete", "billing"]).refused("GROUP_NOT_EMPTY");
    assert!(r.stderr.contains("hint: add --force"), "{r:?}");
    let r = cli(&url, &["group", "delete", "billing", "--force"]).ok();
    assert_eq!(r.stdout, "Deleted group billing.\n");
    cli(&url, &["group", "describe", "billing"]).refused("GROUP_NOT_FOUND");
    let deleted = cli(&url, &["group", "delete", "audit", "--output", "json"])
        .ok()
        .json();
    assert_eq!(deleted, json!({"group": "audit", "deleted": true}));
    assert_eq!(cli(&url, &["group", "list"]).ok().stdout, "No groups.\n");
}

#[tokio::test]
async fn reshard_wait_rollback_and_describe() {
    let stack = Stack::start(Backend::Memory, &[]);
    let url = stack.coordinator.url();
    let api = &stack.api;
    let (s, _) = api
        .post(
            "/v1/groups",
            json!({"group": "g", "stream": "s", "shard_count": 8}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let member = converge(api, "g", &["m1"]).await.remove(0);

    // Scale-down with --wait: the CLI waits while the member still reads the draining shards,
    // and exits once it reports them drained.
    let waiting = spawn_cli(
        &url,
        &[
            "stream", "reshard", "s", "--shards", "4", "--wait", "--output", "json",
        ],
    );
    wait_for("the reshard to start", Duration::from_secs(10), || {
        let out = cli(&url, &["stream", "describe", "s", "--output", "json"]);
        (out.json()["resharding"]["state"] == "draining").then_some(())
    })
    .unwrap();
    let mut waiting = waiting;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "--wait returned before the draining shards retired"
    );
    let r = cli(&url, &["stream", "describe", "s"]).ok();
    assert!(
        r.stdout
            .contains("Reshard of s 8 -> 4: draining, 0 of 4 shards retired"),
        "{r:?}"
    );
    let drain_row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("s:5 "))
        .expect("row");
    assert_eq!(cells(drain_row), ["s:5", "-", "g"]);
    let (s, body) = api
        .post(
            "/v1/groups/g/heartbeat",
            json!({"protocol_version": 1, "member_id": "m1", "member_epoch": member.1,
                   "owned_shards": member.2, "drained_shards": [4, 5, 6, 7]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let done = finish(waiting).ok().json();
    assert_eq!(done["shard_count"], 4);
    assert_eq!(done["resharding"], Value::Null);
    assert_eq!(done["last_reshard"]["state"], "complete");

    // A rollback of it (a scale-up) completes at once.
    let r = cli(&url, &["stream", "rollback", "s", "--wait"]).ok();
    assert!(r.stdout.contains("Rollback of s 4 -> 8: complete"), "{r:?}");
    cli(&url, &["stream", "rollback", "s"]).refused("NOTHING_TO_ROLLBACK");
    let described = cli(&url, &["stream", "describe", "s", "--output", "json"])
        .ok()
        .json();
    let (_, fetched) = api.get("/v1/streams/s").await;
    assert_eq!(described, fetched);
    assert_eq!(described["shard_count"], 8);

    // Waiting on a reshard that a rollback replaces ends with exit status 4.
    let waiting = spawn_cli(&url, &["stream", "reshard", "s", "--shards", "2", "--wait"]);
    wait_for("the reshard to start", Duration::from_secs(10), || {
        let out = cli(&url, &["stream", "describe", "s", "--output", "json"]);
        (out.json()["resharding"]["to"] == 2).then_some(())
    })
    .unwrap();
    let (s, body) = api.post("/v1/streams/s/rollback", json!(null)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    let r = finish(waiting);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(
        r.stderr
            .contains("the reshard of s 8 -> 2 was replaced by a rollback 2 -> 8"),
        "{r:?}"
    );

    // Without --wait, a scale-down answers at once and says how to follow it; --timeout-ms
    // gives up with exit status 4; a second reshard meanwhile is refused.
    let r = cli(&url, &["stream", "reshard", "s", "--shards", "6"]).ok();
    assert!(r.stdout.contains("still draining"), "{r:?}");
    cli(&url, &["stream", "reshard", "s", "--shards", "3"]).refused("RESHARD_IN_PROGRESS");
    let r = cli(
        &url,
        &["stream", "rollback", "s", "--wait", "--timeout-ms", "1"],
    );
    // The rollback 6 -> 8 is a scale-up: complete at once, so the time-out does not matter.
    assert_eq!(r.code, 0, "{r:?}");
    let r = cli(
        &url,
        &[
            "stream",
            "reshard",
            "s",
            "--shards",
            "5",
            "--wait",
            "--timeout-ms",
            "300",
        ],
    );
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("gave up waiting after 300 ms"), "{r:?}");

    let r = cli(&url, &["stream", "list"]).ok();
    assert_eq!(
        cells(r.stdout.lines().nth(1).unwrap()),
        ["s", "5", "8", "1", "8", "->", "5", "(3", "draining)"]
    );
    cli(&url, &["stream", "describe", "nope"]).refused("STREAM_NOT_FOUND");
}

#[tokio::test]
async fn errors_and_exit_statuses() {
    let stack = Stack::start(Backend::Memory, &[]);
    let url = stack.coordinator.url();

    let r = cli(&url, &["group", "describe", "nope"]).refused("GROUP_NOT_FOUND");
    assert_eq!(
        r.stderr,
        "error: GROUP_NOT_FOUND: group nope does not exist\n"
    );
    // A name the protocol forbids (PROTOCOL §1) is refused by the argument parser, before any
    // request: a usage error (exit status 2) that says what is wrong with it.
    let r = cli(&url, &["group", "describe", "a/b"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains(r#"group id "a/b" contains '/'; allowed are letters, digits and . _ : -"#),
        "{r:?}"
    );
    cli(
        &url,
        &["group", "create", "g", "--stream", "s", "--shards", "0"],
    )
    .refused("INVALID_REQUEST");
    cli(&url, &["stream", "reshard", "nope", "--shards", "2"]).refused("STREAM_NOT_FOUND");
    cli(&url, &["member", "remove", "nope", "m"]).refused("GROUP_NOT_FOUND");

    // RSC_COORDINATOR_URL is read when --coordinator is absent.
    let out = Command::new(binary_path("rsc-coordinator").unwrap())
        .args(["group", "list"])
        .env("RSC_COORDINATOR_URL", &url)
        .output()
        .unwrap();
    assert_eq!(from_output(out).ok().stdout, "No groups.\n");

    // Nothing listening: exit status 3 and a message naming the address.
    let dead = format!("http://127.0.0.1:{}", rsc_testkit::free_port().unwrap());
    let r = cli(&dead, &["group", "list"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.starts_with(&format!(
            "error: cannot reach the coordinator at {dead}/v1/groups"
        )),
        "{r:?}"
    );
    assert!(
        r.stderr
            .contains("--coordinator URL or RSC_COORDINATOR_URL"),
        "says where the CLI looks: {r:?}"
    );
    // A wrong base path reaches the coordinator's 404 fallback: a refusal.
    let r = cli(&format!("{url}/not-here"), &["group", "list"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.starts_with("error: NOT_FOUND: "), "{r:?}");
    // A failing server that is not a coordinator (a proxy's HTML 502): exit status 3.
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut conn, _) = proxy.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = conn.read(&mut buf);
        let body = "<html>bad gateway</html>";
        let _ = write!(
            conn,
            "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    let r = cli(&proxy_url, &["group", "list"]);
    server.join().unwrap();
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains("unexpected answer")
            && r.stderr.contains("502")
            && r.stderr.contains("bad gateway"),
        "{r:?}"
    );

    // Command-line mistakes: exit status 2.
    let r = cli("ftp://x", &["group", "list"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("invalid coordinator URL"), "{r:?}");
    let r = cli(&url, &["group", "create", "g"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("--stream"), "{r:?}");
    let r = cli(
        &url,
        &[
            "stream",
            "reshard",
            "s",
            "--shards",
            "2",
            "--timeout-ms",
            "5",
        ],
    );
    assert_eq!(r.code, 2, "--timeout-ms requires --wait: {r:?}");
}

/// `stream retention` sets the policy (PROTOCOL §18), `stream describe` shows it, bad
/// durations are usage errors and a refused policy exits 1.
#[tokio::test]
async fn stream_retention_and_describe() {
    let stack = Stack::start(Backend::Memory, &[]);
    let url = stack.coordinator.url();
    let r = cli(
        &url,
        &[
            "group",
            "create",
            "g",
            "--stream",
            "s",
            "--shards",
            "2",
            "--keep-acked",
            "15m",
        ],
    )
    .ok();
    assert!(r.stdout.contains("Created group g"), "{r:?}");
    let r = cli(&url, &["stream", "describe", "s"]).ok();
    assert!(
        r.stdout.contains(
            "Retention: acknowledged entries kept 15m00s, max age none, max entries per shard none"
        ),
        "{r:?}"
    );
    assert!(
        r.stdout
            .contains("Dead letters (s:dlq): max age 168h00m, max entries per shard none"),
        "{r:?}"
    );
    let r = cli(
        &url,
        &[
            "stream",
            "retention",
            "s",
            "--keep-acked",
            "1h",
            "--max-age",
            "7d",
            "--max-entries",
            "5000",
            "--output",
            "json",
        ],
    )
    .ok();
    assert_eq!(
        r.json()["retention"],
        json!({"keep_acked_ms": 3_600_000, "max_age_ms": 604_800_000_u64, "max_entries_per_shard": 5000})
    );
    // A --keep-acked change that does not repeat the caps would drop them: refused, naming
    // them; adding a cap merges; --replace sets exactly what is given.
    let r = cli(&url, &["stream", "retention", "s", "--keep-acked", "0"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("--max-age 7d")
            && r.stderr.contains("--max-entries 5000")
            && r.stderr.contains("--replace"),
        "{r:?}"
    );
    let out = cli(&url, &["stream", "describe", "s", "--output", "json"]).json();
    assert_eq!(
        out["retention"]["max_age_ms"], 604_800_000_u64,
        "unchanged: {out}"
    );
    let r = cli(&url, &["stream", "retention", "s", "--max-entries", "9000"]).ok();
    assert!(
        r.stdout
            .contains("max age 168h00m, max entries per shard 9000"),
        "merged: {r:?}"
    );
    let r = cli(
        &url,
        &["stream", "retention", "s", "--keep-acked", "0", "--replace"],
    )
    .ok();
    assert!(
        r.stdout
            .contains("Retention: acknowledged entries trimmed at once, max age none"),
        "{r:?}"
    );
    let r = cli(
        &url,
        &[
            "stream",
            "retention",
            "s",
            "--keep-acked",
            "0",
            "--dlq",
            "--max-age",
            "2d",
        ],
    )
    .ok();
    assert!(
        r.stdout.contains("Dead letters (s:dlq): max age 48h00m"),
        "{r:?}"
    );
    let out = cli(&url, &["stream", "describe", "s", "--output", "json"]).json();
    assert_eq!(out["retention"], json!({"keep_acked_ms": 0}), "{out}");
    let r = cli(&url, &["stream", "retention", "s", "--keep-acked", "1w"]);
    assert_eq!(r.code, 2, "a bad duration is a usage error: {r:?}");
    cli(
        &url,
        &[
            "stream",
            "retention",
            "s",
            "--keep-acked",
            "1h",
            "--max-age",
            "1m",
        ],
    )
    .refused("INVALID_REQUEST");
    cli(&url, &["stream", "retention", "nope", "--keep-acked", "1h"]).refused("STREAM_NOT_FOUND");
    // `group seek` (PROTOCOL §18): a bad target is a usage error; without a data Redis the
    // coordinator refuses it.
    let r = cli(&url, &["group", "seek", "g", "--to", "yesterday"]);
    assert_eq!(r.code, 2, "{r:?}");
    cli(&url, &["group", "seek", "g", "--to", "earliest"]).refused("INVALID_REQUEST");
}

/// `rsc-coordinator --help` names every command of each group in its one-liner, and the
/// README's command list names them all.
#[test]
fn help_and_readme_list_every_command() {
    let help = |args: &[&str]| -> String {
        let o = Command::new(binary_path("rsc-coordinator").expect("binary built"))
            .args(args)
            .output()
            .expect("cli runs");
        assert!(o.status.success(), "{args:?}: {o:?}");
        String::from_utf8(o.stdout).expect("utf-8")
    };
    // The sub-commands clap lists under `Commands:` (without `help`).
    let commands = |text: &str| -> Vec<String> {
        text.split("Commands:")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| *c != "help")
            .map(str::to_owned)
            .collect()
    };
    let top = help(&["--help"]);
    let readme = include_str!("../README.md");
    // A command's own options come first; the options every command takes are apart.
    let seek = help(&["group", "seek", "--help"]);
    let (own, global) = seek
        .split_once("Global options:")
        .unwrap_or_else(|| panic!("no Global options heading: {seek}"));
    assert!(
        own.contains("--execute") && !own.contains("--coordinator"),
        "{seek}"
    );
    assert!(
        global.contains("--coordinator") && global.contains("--output"),
        "{seek}"
    );
    for noun in ["group", "stream", "member", "dlq"] {
        let verbs = commands(&help(&[noun, "--help"]));
        assert!(!verbs.is_empty(), "{noun} has commands");
        let line = top
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{noun} ")))
            .unwrap_or_else(|| panic!("{noun} in --help: {top}"));
        // The one-liner may wrap: take the text up to the next command.
        let mut one_liner = line.to_owned();
        for l in top.lines().skip_while(|l| *l != line).skip(1) {
            if !l.starts_with("            ") {
                break;
            }
            one_liner.push_str(l);
        }
        let list = &readme[readme
            .find("operators' CLI")
            .expect("the README's CLI list")..];
        let listed = [format!("`rsc-coordinator {noun} "), format!("`{noun} ")]
            .iter()
            .find_map(|start| list.split(start.as_str()).nth(1))
            .and_then(|rest| rest.split('`').next())
            .unwrap_or_else(|| panic!("README lists `{noun} …`"));
        for verb in &verbs {
            assert!(
                one_liner.contains(verb.as_str()),
                "`rsc-coordinator --help` line of {noun} names {verb}: {one_liner}"
            );
            assert!(
                listed.split('|').any(|v| v == verb),
                "the README's list `{noun} {listed}` names {verb}"
            );
        }
    }
}

/// The flags (`--x`) a hint names exist on the command it is about.
fn hint_flags_exist(run: &Run, command: &[&str]) {
    let help = Command::new(binary_path("rsc-coordinator").expect("binary built"))
        .args(command)
        .arg("--help")
        .output()
        .expect("cli runs");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for line in run.stderr.lines().filter(|l| l.starts_with("hint:")) {
        for flag in line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
        {
            assert!(
                help.contains(flag),
                "the hint names {flag}, which `{}` does not have: {line}",
                command.join(" ")
            );
        }
    }
}

/// `group seek` (PROTOCOL §18) against a coordinator with a data Redis: a dry run by default
/// that prints each shard's position now and after; `--execute`; every target form; refusals
/// that say what to run; `group describe` with each shard's position.
#[tokio::test]
async fn group_seek_plans_by_default_executes_and_describes_positions() {
    let redis = rsc_testkit::RedisServer::start().expect("redis-server starts");
    let coordinator = rsc_testkit::CoordinatorProcess::start(&[
        "--store",
        "memory",
        "--data-redis-url",
        &redis.url(),
    ])
    .expect("coordinator starts");
    let url = coordinator.url();
    let api = Api::new(&url);
    cli(
        &url,
        &["group", "create", "g", "--stream", "sk", "--shards", "4"],
    )
    .ok();
    // 10 entries per shard, the group's consumer groups past them all (as after handling).
    let mut con = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("redis");
    let mut ids: Vec<Vec<String>> = Vec::new();
    for shard in 0..4 {
        let key = format!("sk:{shard}");
        let mut on_shard = Vec::new();
        for i in 0..10 {
            let id: String = redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg("payload")
                .arg(format!("p{i}"))
                .query(&mut con)
                .expect("XADD");
            on_shard.push(id);
        }
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("g")
            .arg("$")
            .query(&mut con)
            .expect("XGROUP CREATE");
        ids.push(on_shard);
    }
    // A live member, not paused: refused, with a hint naming the command that pauses it.
    let (s, b) = api.heartbeat("g", "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let r = cli(&url, &["group", "seek", "g", "--to", "earliest"]).refused("GROUP_NOT_EMPTY");
    assert!(
        r.stderr
            .contains("hint: pause it first: rsc-coordinator group pause g"),
        "{r:?}"
    );
    assert!(!r.stderr.contains("--force"), "{r:?}");
    hint_flags_exist(&r, &["group", "seek"]);
    cli(&url, &["group", "pause", "g"]).ok();

    // The dry run (the default): the plan per shard, nothing moved.
    let r = cli(&url, &["group", "seek", "g", "--to", "earliest"]).ok();
    assert!(
        r.stdout.starts_with(
            "Dry run: seek of group g to earliest on 4 shards: 40 entries to be delivered \
             again, 0 skipped; 40 to deliver after it."
        ),
        "{r:?}"
    );
    assert!(r.stdout.contains("--execute"), "{r:?}");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("2 "))
        .expect("shard 2's row");
    let c = cells(row);
    assert_eq!(c[1], "sk:2");
    assert_eq!(c[2], ids[2][9], "the current position: {row}");
    assert!(c[3].ends_with('Z'), "its time in RFC 3339: {row}");
    assert_eq!(c[4..], ["0-0", "-", "0", "10", "10", "0", "0"], "{row}");
    let view = cli(&url, &["group", "describe", "g", "--output", "json"]).json();
    assert_eq!(
        view["shards"][2]["lag"], 0,
        "a dry run moves nothing: {view}"
    );
    assert_eq!(view["shards"][2]["last_delivered_id"], ids[2][9].as_str());

    // Executed: moved, and the group is said to be still paused.
    let r = cli(
        &url,
        &["group", "seek", "g", "--to", "earliest", "--execute"],
    )
    .ok();
    assert!(
        r.stdout
            .starts_with("Moved group g to earliest on 4 shards"),
        "{r:?}"
    );
    assert!(
        r.stdout
            .contains("resume it with `rsc-coordinator group resume g`"),
        "{r:?}"
    );
    let view = cli(&url, &["group", "describe", "g", "--output", "json"]).json();
    for s in view["shards"].as_array().unwrap() {
        assert_eq!(s["lag"], 10, "the backlog shows at once: {s}");
        assert_eq!(s["last_delivered_id"], "0-0", "{s}");
        assert!(s.get("last_delivered_ms").is_none(), "0-0 has no time: {s}");
    }
    assert_eq!(view["last_seek"]["to"], "earliest", "{view}");
    let r = cli(&url, &["group", "describe", "g"]).ok();
    assert!(r.stdout.contains("LAST DELIVERED"), "{r:?}");
    assert!(r.stdout.contains("Last seek: to earliest at "), "{r:?}");

    // Latest, then 3 entries back on every shard.
    cli(&url, &["group", "seek", "g", "--to", "latest", "--execute"]).ok();
    let out = cli(
        &url,
        &[
            "group",
            "seek",
            "g",
            "--shift-by",
            "-3",
            "--execute",
            "--output",
            "json",
        ],
    )
    .ok()
    .json();
    assert_eq!(out["redelivered"], 12, "{out}");
    assert_eq!(out["plan"][1]["new_id"], ids[1][6].as_str(), "{out}");
    // One shard to an entry id.
    let out = cli(
        &url,
        &[
            "group", "seek", "g", "--shard", "3", "--to-id", &ids[3][4], "--output", "json",
        ],
    )
    .ok()
    .json();
    assert_eq!(out["dry_run"], true);
    assert_eq!(out["plan"].as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(out["plan"][0]["lag_after"], 5, "{out}");
    // A duration back and an RFC 3339 time: every entry is younger than an hour.
    let out = cli(
        &url,
        &[
            "group",
            "seek",
            "g",
            "--by-duration",
            "1h",
            "--output",
            "json",
        ],
    )
    .ok()
    .json();
    assert_eq!(out["lag_after"], 40, "{out}");
    let hour_ago = time_rfc3339(now_ms() - 3_600_000);
    let out = cli(
        &url,
        &["group", "seek", "g", "--to", &hour_ago, "--output", "json"],
    )
    .ok()
    .json();
    assert_eq!(out["lag_after"], 40, "{out}");

    // Refusals and usage errors.
    let future = time_rfc3339(now_ms() + 3_600_000);
    cli(&url, &["group", "seek", "g", "--to", &future]).refused("INVALID_REQUEST");
    cli(&url, &["group", "seek", "g", "--to-id", "99999999999999-0"]).refused("INVALID_REQUEST");
    cli(&url, &["group", "seek", "g", "--shift-by", "0"]).refused("INVALID_REQUEST");
    cli(
        &url,
        &["group", "seek", "g", "--shard", "9", "--to", "latest"],
    )
    .refused("INVALID_REQUEST");
    for bad in [
        &["group", "seek", "g"][..],
        &["group", "seek", "g", "--to", "earliest", "--shift-by", "-1"],
        &["group", "seek", "g", "--to", "yesterday"],
        &[
            "group",
            "seek",
            "g",
            "--to",
            "earliest",
            "--execute",
            "--dry-run",
        ],
    ] {
        let r = cli(&url, bad);
        assert_eq!(r.code, 2, "{bad:?}: {r:?}");
    }
    // `group delete`'s refusal still points at its own --force.
    cli(&url, &["group", "resume", "g"]).ok();
    let r = cli(&url, &["group", "delete", "g"]).refused("GROUP_NOT_EMPTY");
    assert!(r.stderr.contains("hint: add --force"), "{r:?}");
    hint_flags_exist(&r, &["group", "delete"]);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Unix ms as an RFC 3339 UTC time, to the second.
fn time_rfc3339(ms: u64) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}", ms / 1000),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .expect("date runs");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}
