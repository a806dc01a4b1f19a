//! The dashboard at `GET /`, rendered by a real headless Chromium against a real coordinator
//! with a live group: the shard grid must show the owners the API reports, with pending
//! revocations and draining shards marked. A screenshot is kept as a test artifact
//! (`$RSC_ARTIFACTS_DIR`, else `<target dir>/artifacts/dashboard.png`).
//!
//! Needs Debian's `chromium` (`apt-get install -y chromium`), or `RSC_CHROMIUM=/path/to/chrome`.

use reqwest::StatusCode;
use rsc_e2e::{Api, Backend, Stack};
use rsc_testkit::{binary_path, wait_for};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("RSC_CHROMIUM") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "no Chromium found: install it (`apt-get install -y chromium`) or set RSC_CHROMIUM \
         to a Chrome/Chromium binary"
    );
}

fn artifacts_dir() -> PathBuf {
    let dir = match std::env::var_os("RSC_ARTIFACTS_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            // <target>/<profile>/rsc-coordinator → <target>/artifacts
            let bin = binary_path("rsc-coordinator").expect("binary built");
            bin.parent()
                .and_then(Path::parent)
                .expect("target dir")
                .join("artifacts")
        }
    };
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// Runs headless Chromium on `url` with `extra` flags; returns its stdout.
fn run_chromium(url: &str, extra: &[String]) -> String {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let profile = std::env::temp_dir().join(format!(
        "rsc-dashboard-chromium-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--hide-scrollbars",
            "--window-size=1400,900",
            // Let the page's fetches and first render finish before dumping.
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let exited = wait_for("chromium to exit", Duration::from_secs(90), || {
        child.try_wait().expect("wait").map(|_| ())
    });
    if exited.is_err() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("chromium output");
    let _ = std::fs::remove_dir_all(&profile);
    exited.expect("chromium finished in time");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 DOM")
}

/// The first tag of `dom` (its text up to `>`) that contains `needle`.
fn tag_with<'a>(dom: &'a str, needle: &str) -> Option<&'a str> {
    let i = dom.find(needle)?;
    let start = dom[..i].rfind('<')?;
    let end = dom[i..].find('>')? + i;
    Some(&dom[start..end])
}

/// The value of attribute `name` in the tag text `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// Grid cells of the dumped DOM: shard → its `data-*` attributes.
fn grid_cells(dom: &str) -> BTreeMap<u32, BTreeMap<&'static str, String>> {
    let mut cells = BTreeMap::new();
    let mut rest = dom;
    while let Some(i) = rest.find(" data-shard=\"") {
        let tag_end = rest[i..].find('>').expect("tag closes") + i;
        let tag = &rest[i..tag_end];
        let shard: u32 = attr(tag, "data-shard").unwrap().parse().unwrap();
        let mut a = BTreeMap::new();
        for name in ["data-owner", "data-target", "data-state", "data-revoking"] {
            a.insert(name, attr(tag, name).unwrap_or("<missing>").to_owned());
        }
        cells.insert(shard, a);
        rest = &rest[tag_end..];
    }
    cells
}

/// A member's heartbeat; returns (epoch, assignment).
async fn beat(
    api: &Api,
    group: &str,
    member: &str,
    epoch: i64,
    owned: &[u32],
    n: u32,
) -> (i64, Vec<u32>) {
    let (s, body) = api
        .post(
            &format!("/v1/groups/{group}/heartbeat"),
            json!({"protocol_version": 1, "member_id": member, "member_epoch": epoch,
                   "owned_shards": owned,
                   "client": {"host": format!("pod-{n}"), "pod_ip": format!("10.0.0.{n}")}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    (
        body["member_epoch"].as_i64().unwrap(),
        serde_json::from_value(body["assignment"].clone()).unwrap(),
    )
}

#[tokio::test]
async fn dashboard_grid_shows_the_real_owners() {
    let stack = Stack::start(Backend::Memory, &[]);
    let api = &stack.api;
    let url = stack.coordinator.url();

    // The page shell: HTML, self-contained, locked to this origin.
    let resp = rsc_e2e::http().get(format!("{url}/")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let headers = resp.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    let html = resp.text().await.unwrap();
    assert!(html.contains("<title>Redis Stream Coordinator</title>"));

    // A live group: two members converge on 8 shards, then a scale-down to 6 leaves shards
    // 6 and 7 draining, and a third member's join makes m1 revoke a shard it still reports.
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "billing", "stream": "orders", "shard_count": 8}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let mut members = [
        ("m1", 0i64, Vec::<u32>::new(), 1u32),
        ("m2", 0, Vec::new(), 2),
    ];
    for _ in 0..4 {
        for (id, epoch, owned, n) in members.iter_mut() {
            (*epoch, *owned) = beat(api, "billing", id, *epoch, owned, *n).await;
        }
    }
    let (_, view) = api.get("/v1/groups/billing").await;
    assert_eq!(view["state"], "stable", "{view}");
    let (s, body) = api
        .post("/v1/streams/orders/reshard", json!({"shard_count": 6}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    for (id, epoch, owned, n) in members.iter_mut() {
        (*epoch, *owned) = beat(api, "billing", id, *epoch, owned, *n).await;
    }
    beat(api, "billing", "m3", 0, &[], 3).await;
    let (id, epoch, owned, n) = &members[0];
    beat(api, "billing", id, *epoch, owned, *n).await;

    let (_, truth) = api.get("/v1/groups/billing").await;
    let revoking: Vec<u64> = truth["members"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| {
            m["pending_revocation"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap())
        })
        .collect();
    assert!(
        !revoking.is_empty(),
        "the scenario must have a pending revocation: {truth}"
    );

    // An operator's pause changes no ownership; the page shows it.
    let (s, body) = api.post("/v1/groups/billing/pause", json!(null)).await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // Render it.
    let page = format!("{url}/#group=billing");
    let mut dom = String::new();
    for _ in 0..3 {
        dom = run_chromium(&page, &["--dump-dom".to_owned()]);
        if dom.contains("data-loaded=\"true\"") {
            break;
        }
    }
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page never loaded its data:\n{dom}"
    );
    let cells = grid_cells(&dom);
    let shards = truth["shards"].as_array().unwrap();
    assert_eq!(cells.len(), shards.len(), "one cell per shard: {cells:?}");
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let mut owners = std::collections::BTreeSet::new();
    for s in shards {
        let shard = s["shard"].as_u64().unwrap();
        let cell = &cells[&(shard as u32)];
        let expect: BTreeMap<&str, String> = [
            ("data-owner", text(&s["current_owner"])),
            ("data-target", text(&s["target_owner"])),
            ("data-state", text(&s["state"])),
            ("data-revoking", revoking.contains(&shard).to_string()),
        ]
        .into();
        assert_eq!(cell, &expect, "shard {shard}");
        owners.insert(cell["data-owner"].clone());
    }
    assert!(owners.contains("m1") && owners.contains("m2"), "{owners:?}");
    assert_eq!(
        cells
            .values()
            .filter(|c| c["data-state"] == "draining")
            .count(),
        2,
        "shards 6 and 7 are draining"
    );
    assert!(
        dom.contains("id=\"group-name\">billing<"),
        "the selected group is shown"
    );
    assert!(
        dom.contains("id=\"group-paused\""),
        "the paused group shows its badge"
    );
    for m in ["m1", "m2", "m3"] {
        assert!(
            dom.contains(&format!("data-member=\"{m}\"")),
            "member {m} listed"
        );
    }
    assert!(
        dom.contains("orders</b> reshard 8 → 6"),
        "reshard progress shown"
    );
    assert!(
        dom.contains("id=\"audit-unavailable\"") || dom.contains("<th>principal</th>"),
        "the audit panel renders either entries or its unavailable note"
    );

    // Keep a screenshot as an artifact.
    let shot = artifacts_dir().join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(&page, &[format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "a real PNG"
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}

/// One point of the lag chart: `[t_ms, lag, handled_per_s]`.
type ChartPoint = (u64, Option<u64>, Option<f64>);

/// The `data-points` of the lag chart in a dumped DOM.
fn chart_points(dom: &str) -> Option<Vec<ChartPoint>> {
    let i = dom.find("id=\"lag-chart\"")?;
    let start = dom[..i].rfind('<')?;
    let end = dom[i..].find('>')? + i;
    let raw = attr(&dom[start..end], "data-points")?
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    let v: Vec<ChartPoint> = serde_json::from_str(&raw).ok()?;
    Some(v)
}

/// The chart of the selected group's lag and handled/s over time draws what
/// `GET /v1/groups/{group}/history` reports, sampled from a real data Redis while entries are
/// added and consumed.
#[tokio::test]
async fn dashboard_chart_shows_the_history_the_api_reports() {
    let data = rsc_testkit::RedisServer::start().expect("redis");
    let stack = Stack::start(
        Backend::Memory,
        &[
            "--data-redis-url",
            &data.url(),
            "--history-interval-ms",
            "200",
        ],
    );
    let api = &stack.api;
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "billing", "stream": "orders", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (_, routing) = api.get("/v1/streams/orders/routing").await;
    let keys: Vec<String> = serde_json::from_value(routing["shard_keys"].clone()).unwrap();
    let mut con = redis::Client::open(data.url())
        .and_then(|c| c.get_connection())
        .expect("redis");
    for key in &keys {
        let _: () = redis::cmd("XGROUP")
            .arg(&["CREATE", key.as_str(), "billing", "0", "MKSTREAM"][..])
            .query(&mut con)
            .unwrap();
        for n in 0..100 {
            let _: String = redis::cmd("XADD")
                .arg(key)
                .arg("*")
                .arg("n")
                .arg(n)
                .query(&mut con)
                .unwrap();
        }
    }
    let history = || async {
        let (s, h) = api.get("/v1/groups/billing/history").await;
        assert_eq!(s, StatusCode::OK, "{h}");
        h["samples"].as_array().cloned().unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !history().await.iter().any(|s| s["lag"] == 200) {
        assert!(
            std::time::Instant::now() < deadline,
            "no sample of the backlog"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Handle 60 entries of shard 0 (read and acknowledged): the lag drops, a rate shows.
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg(
            &[
                "GROUP",
                "billing",
                "c",
                "COUNT",
                "60",
                "STREAMS",
                keys[0].as_str(),
                ">",
            ][..],
        )
        .query(&mut con)
        .unwrap();
    let ids: Vec<String> = read.keys[0].ids.iter().map(|i| i.id.clone()).collect();
    let _: u64 = redis::cmd("XACK")
        .arg(&keys[0])
        .arg("billing")
        .arg(&ids)
        .query(&mut con)
        .unwrap();
    while !history().await.iter().any(|s| s["lag"] == 140) {
        assert!(
            std::time::Instant::now() < deadline,
            "no sample after handling"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let page = format!("{}/#group=billing", stack.coordinator.url());
    let mut points = None;
    for _ in 0..3 {
        let dom = run_chromium(&page, &["--dump-dom".to_owned()]);
        points = chart_points(&dom);
        if points.as_ref().is_some_and(|p| p.len() >= 3) {
            break;
        }
    }
    let points = points.expect("the page draws the lag chart");
    assert!(points.len() >= 3, "{points:?}");
    // Every point drawn is a sample the API reports (the page read it a moment earlier).
    let truth = history().await;
    for (t, lag, rate) in &points {
        let s = truth
            .iter()
            .find(|s| s["t_ms"].as_u64() == Some(*t))
            .unwrap_or_else(|| panic!("chart point at {t} is not in the API's history"));
        assert_eq!(s["lag"].as_u64(), *lag, "lag at {t}");
        assert_eq!(s["handled_per_s"].as_f64(), *rate, "handled/s at {t}");
    }
    assert!(
        points.iter().any(|p| p.1 == Some(200)),
        "the backlog is drawn"
    );
    assert!(points.iter().any(|p| p.1 == Some(140)), "the drop is drawn");
    assert!(
        points.iter().any(|p| p.2.is_some_and(|r| r > 0.0)),
        "a handling rate is drawn: {points:?}"
    );
    // Retention and time lag (PROTOCOL §18): with keep_acked 0, billing (not yet delivered
    // most of the entries) is the group that holds retention back; the page shows it, the
    // policy, and each shard's time lag as the API reports it.
    let (s, v) = api
        .call(
            reqwest::Method::PATCH,
            "/v1/streams/orders",
            Some(json!({"retention": {"keep_acked_ms": 0}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    while api.get("/v1/streams/orders").await.1["retention_blocked_by"] != "billing" {
        assert!(
            std::time::Instant::now() < deadline + Duration::from_secs(10),
            "retention_blocked_by never named billing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let time_lags = || async {
        let (_, g) = api.get("/v1/groups/billing").await;
        g["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["shard"].as_u64().unwrap() as u32,
                    s["time_lag_ms"].as_u64(),
                )
            })
            .collect::<BTreeMap<u32, Option<u64>>>()
    };
    let before = time_lags().await;
    assert!(
        before.values().all(|t| t.is_some_and(|ms| ms > 0)),
        "{before:?}"
    );
    let dom = run_chromium(&page, &["--dump-dom".to_owned()]);
    let after = time_lags().await;
    let row = tag_with(&dom, " data-stream-row=\"orders\"").expect("the stream's row");
    assert_eq!(attr(row, "data-blocked-by"), Some("billing"), "{row}");
    let keep = tag_with(&dom, " data-keep-acked-ms=\"").expect("the retention cell");
    assert_eq!(attr(keep, "data-keep-acked-ms"), Some("0"), "{keep}");
    for (shard, lo) in &before {
        let cell = tag_with(&dom, &format!(" data-shard=\"{shard}\"")).expect("the shard's cell");
        let shown: u64 = attr(cell, "data-time-lag-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("shard {shard}: no time lag shown"));
        let hi = after[shard].unwrap();
        assert!(
            (lo.unwrap()..=hi).contains(&shown),
            "shard {shard}: time lag shown {shown} ms, API {lo:?}..{hi} ms"
        );
    }
    assert!(
        dom.contains("id=\"group-time-lag\""),
        "the group's time lag fact"
    );
    // Dead letters (PROTOCOL §18): the panel shows each group's depth and the selected
    // group's latest errors, long ones cut with their full text as the title.
    let long_error = format!("payment provider refused: {}", "x".repeat(300));
    for (group, key, error) in [
        ("billing", "k1", "timeout talking to the bank"),
        ("billing", "k2", long_error.as_str()),
        ("audit", "k1", "schema v1"),
    ] {
        let _: String = redis::cmd("XADD")
            .arg("orders:dlq")
            .arg("*")
            .arg(
                &[
                    "payload", "{}", "key", key, "error", error, "group", group, "attempts", "4",
                ][..],
            )
            .query(&mut con)
            .unwrap();
    }
    let mut dom = String::new();
    for _ in 0..3 {
        dom = run_chromium(&page, &["--dump-dom".to_owned()]);
        if dom.contains("data-dlq-group=\"billing\"") {
            break;
        }
    }
    let row = tag_with(&dom, " data-dlq-group=\"billing\"").expect("billing's dead-letter row");
    assert_eq!(attr(row, "data-entries"), Some("2"), "{row}");
    let row = tag_with(&dom, " data-dlq-group=\"audit\"").expect("audit's dead-letter row");
    assert_eq!(attr(row, "data-entries"), Some("1"), "{row}");
    assert!(
        dom.contains("timeout talking to the bank")
            && dom.contains(&format!("title=\"{long_error}\"")),
        "billing's latest errors, the long one in full as a title"
    );
    assert!(
        !dom.contains(">schema v1<"),
        "only the selected group's errors"
    );
    let shot = artifacts_dir().join("dashboard-chart.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(&page, &[format!("--screenshot={}", shot.display())]);
    assert!(std::fs::read(&shot).is_ok_and(|png| png.starts_with(b"\x89PNG")));
    eprintln!("dashboard chart screenshot: {}", shot.display());
}
