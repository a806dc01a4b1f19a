//! Dead letters as a queue (PROTOCOL §7, §18) end to end: a real redis-server, a real
//! coordinator reading it and sample pods of two groups that dead-letter every entry of a
//! poison key each. The depth and oldest-age gauges show them per group; `dlq list` filters
//! by group, key, error and time and pages; `dlq purge` is a dry run by default (nothing
//! deleted) and with `--execute` deletes exactly what its filters take, audited.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use crate::pods::{Consumer, SERIAL, Stack, eventually, finish_producer, spawn_producer, xlen};
use reqwest::StatusCode;
use serde_json::Value;
use std::collections::BTreeSet;

use crate::retention::operator_cli;

const SESSION_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;

/// A pod of `group` on `stream` that dead-letters every entry of `poison` at once.
fn sick_pod(stack: &Stack, ip: &str, group: &str, stream: &str, poison: &str) -> Consumer {
    Consumer::start(
        stack,
        ip,
        &[
            "--group",
            group,
            "--stream",
            stream,
            "--poison-key",
            poison,
            "--max-retries",
            "0",
        ],
    )
}

/// The `dlq_id`s of a list or purge answer.
fn ids(v: &Value) -> Vec<String> {
    v["entries"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["dlq_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Every id in `<stream>:dlq`, oldest first.
fn dlq_ids(con: &mut redis::Connection, key: &str) -> Vec<String> {
    let reply: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    reply.into_iter().map(|(id, _)| id).collect()
}

fn id_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("an entry id")
}

/// Pages through `GET /v1/streams/dq/dlq?<query>` `count` at a time; every id seen.
async fn all_pages(stack: &Stack, query: &str, count: u32) -> Vec<String> {
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/streams/dq/dlq?{query}&count={count}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let (s, page) = stack.api.get(&path).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        let got = ids(&page);
        assert!(got.len() <= count as usize, "{page}");
        seen.extend(got);
        match page["next_after"].as_str() {
            Some(a) => after = Some(a.to_owned()),
            None => return seen,
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test]
async fn dead_letters_have_a_depth_a_filtered_list_and_an_audited_purge() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start_with_data_redis_args(&["--history-interval-ms", "200"]);
    stack
        .create_group("g", "dq", 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    stack
        .create_group("other", "dq", 2, SESSION_MS, HEARTBEAT_MS)
        .await;
    let _g = sick_pod(&stack, "127.0.0.51", "g", "dq", "k3");
    let _other = sick_pod(&stack, "127.0.0.52", "other", "dq", "k5");
    stack.wait_stable("g", 1, 2).await;
    stack.wait_stable("other", 1, 2).await;
    finish_producer(spawn_producer(&stack, "dq", 200, 10, None), 200);
    let mut con = stack.redis();
    eventually(
        "40 dead letters: 20 of k3 (g), 20 of k5 (other)",
        60,
        || (xlen(&mut con, "dq:dlq") == 40).then_some(()),
    )
    .await;
    let all = dlq_ids(&mut con, "dq:dlq");

    // The gauges: the depth of each group, and an oldest age that grows.
    let url = stack.coordinator.url();
    let gauge = |name: &'static str, group: &'static str| {
        let url = url.clone();
        async move {
            rsc_e2e::metric_sum(
                &rsc_e2e::scrape(&url).await,
                name,
                &[("stream", "dq"), ("group", group)],
            )
        }
    };
    assert_eq!(gauge("rsc_dlq_entries", "g").await, 20.0);
    assert_eq!(gauge("rsc_dlq_entries", "other").await, 20.0);
    let oldest = id_ms(&all[0]);
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let age = gauge("rsc_dlq_oldest_age_seconds", "g").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    assert!(
        age >= 1.0 && age <= (now - oldest) as f64 / 1000.0 + 1.0,
        "oldest age {age} s; the oldest dead letter is {} ms old",
        now - oldest
    );

    // The list: filters, depth per group, paging.
    let (s, l) = stack.api.get("/v1/streams/dq/dlq?group=g").await;
    assert_eq!(s, StatusCode::OK, "{l}");
    assert_eq!(ids(&l).len(), 20, "{l}");
    assert!(
        l["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["key"] == "k3"
                && e["group"] == "g"
                && e["error"].as_str().unwrap().contains("poison key k3"))
    );
    assert_eq!(l["depth"][0]["group"], "g", "{l}");
    assert_eq!(l["depth"][0]["entries"], 20, "{l}");
    assert_eq!(l["depth"][1]["entries"], 20, "{l}");
    let (_, by_error) = stack
        .api
        .get("/v1/streams/dq/dlq?error=poison%20key%20k5")
        .await;
    assert_eq!(ids(&by_error).len(), 20, "{by_error}");
    assert!(
        by_error["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["group"] == "other")
    );
    let (_, none) = stack.api.get("/v1/streams/dq/dlq?group=other&key=k3").await;
    assert!(ids(&none).is_empty(), "{none}");
    let paged = all_pages(&stack, "group=g", 7).await;
    let g_ids: Vec<String> = ids(&l);
    assert_eq!(
        paged, g_ids,
        "pages of 7 give the 20, oldest first, once each"
    );
    let newest = all_pages(&stack, "group=g&newest_first=true", 6).await;
    assert_eq!(newest, g_ids.iter().rev().cloned().collect::<Vec<_>>());
    // A time window: the dead letters of g from the 11th one's millisecond on.
    let since = id_ms(&g_ids[10]);
    let (_, windowed) = stack
        .api
        .get(&format!("/v1/streams/dq/dlq?group=g&since_ms={since}"))
        .await;
    let expected: Vec<String> = g_ids
        .iter()
        .filter(|id| id_ms(id) >= since)
        .cloned()
        .collect();
    assert_eq!(ids(&windowed), expected);
    let (_, before) = stack
        .api
        .get(&format!("/v1/streams/dq/dlq?group=g&until_ms={since}"))
        .await;
    assert_eq!(ids(&before).len() + expected.len(), 20);
    // Bad input is refused with the protocol's error body.
    for bad in ["count=0", "after=nope", "since_ms=5&until_ms=5"] {
        let (s, b) = stack.api.get(&format!("/v1/streams/dq/dlq?{bad}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {b}");
        assert_eq!(rsc_e2e::code(&b), "INVALID_REQUEST", "{bad}: {b}");
    }
    let (s, b) = stack.api.get("/v1/streams/nope/dlq").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");

    // The CLI's list: the group's stream found, a page, the way to the next.
    let (code, out, err) = operator_cli(&url, &["dlq", "list", "--group", "g", "--count", "5"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("DEAD LETTERS") && out.contains("poison key k3"),
        "{out}"
    );
    assert!(out.contains(&format!("--after {}", g_ids[4])), "{out}");
    let (code, out, err) = operator_cli(
        &url,
        &[
            "dlq", "list", "dq", "--error", "k5", "--since", "1h", "--output", "json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(ids(&v).len(), 20, "{v}");

    // Purge: a dry run deletes nothing; --execute deletes exactly what the filters take.
    let since_arg = since.to_string();
    let purge = [
        "dlq", "purge", "--group", "g", "--key", "k3", "--since", &since_arg,
    ];
    let (code, out, err) = operator_cli(&url, &purge);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("Dry run: {} dead letters", expected.len())),
        "{out}"
    );
    assert_eq!(
        dlq_ids(&mut con, "dq:dlq"),
        all,
        "a dry run deletes nothing"
    );
    let mut exec = purge.to_vec();
    exec.extend(["--execute", "--output", "json"]);
    let (code, out, err) = operator_cli(&url, &exec);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(ids(&v), expected, "{v}");
    let left: BTreeSet<String> = dlq_ids(&mut con, "dq:dlq").into_iter().collect();
    let want: BTreeSet<String> = all
        .iter()
        .filter(|id| !expected.contains(id))
        .cloned()
        .collect();
    assert_eq!(left, want, "exactly the filtered dead letters are gone");
    let g_left = (20 - expected.len()) as f64;
    eventually_gauge(&url, "g", g_left).await;
    assert_eq!(gauge("rsc_dlq_entries", "other").await, 20.0);

    // Both purges are in the audit log, the dry run said as such.
    let (_, audit) = stack.api.get("/v1/audit?stream=dq").await;
    let purges: Vec<&Value> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["action"] == "stream.dlq_purge")
        .collect();
    assert_eq!(purges.len(), 2, "{audit}");
    assert!(
        purges
            .iter()
            .any(|e| e["request"]["body"]["dry_run"] == false),
        "{audit}"
    );
}

/// Waits until `rsc_dlq_entries{stream="dq",group}` reads `want`.
async fn eventually_gauge(url: &str, group: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = rsc_e2e::metric_sum(
            &rsc_e2e::scrape(url).await,
            "rsc_dlq_entries",
            &[("stream", "dq"), ("group", group)],
        );
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rsc_dlq_entries of {group}: {got}, not {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
