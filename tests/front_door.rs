//! The front door, tried as an attacker on the same loopback would (docs/SECURITY.md): no
//! method reaches a handler without a credential, refusals neither bloat nor erase the audit
//! log, and an address that keeps being refused is slowed before authentication.

use crate::pods::eventually_async;
use crate::security::{Secured, token_of};
use reqwest::{Method, StatusCode};
use rsc_testkit::{RedisServer, metric_sum};
use serde_json::{Value, json};
use std::net::IpAddr;
use std::time::Duration;

/// A client whose connections come from `source` (a loopback address).
fn client_from(source: &str) -> reqwest::Client {
    rsc_client::install_crypto_provider();
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn send(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    token: Option<&str>,
) -> StatusCode {
    let mut req = client.request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status()
}

async fn audit(stack: &Secured, log: &str) -> Vec<Value> {
    let v: Value = rsc_e2e::http()
        .get(format!("{}/v1/audit?log={log}&limit=1000", stack.url))
        .bearer_auth(token_of("viewer"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["entries"].as_array().cloned().unwrap_or_default()
}

async fn metrics(stack: &Secured) -> String {
    rsc_e2e::http()
        .get(format!("{}/metrics", stack.url))
        .bearer_auth(token_of("viewer"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// HEAD (and OPTIONS, and any other method) on a protected route needs a credential: HEAD is
/// a GET for the access checks, and a method a path does not serve is refused 401 before the
/// router's 405 would tell that the path exists.
#[tokio::test]
async fn head_and_other_methods_need_a_credential() {
    let stack = Secured::start(&[]);
    let admin = stack.api("admin");
    let (s, _) = admin
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let http = rsc_e2e::http();
    let paths = [
        "/metrics",
        "/v1/groups",
        "/v1/groups/g1",
        "/v1/groups/g1/history",
        "/v1/groups/g1/scaling",
        "/v1/streams",
        "/v1/streams/s1",
        "/v1/streams/s1/routing",
        "/v1/audit",
    ];
    for path in paths {
        let url = format!("{}{path}", stack.url);
        for method in [Method::HEAD, Method::OPTIONS, Method::PUT] {
            for token in [None, Some("not-a-token")] {
                let s = send(&http, method.clone(), &url, token).await;
                assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {path} {token:?}");
            }
        }
        // With a credential that covers the route, HEAD is GET without a body.
        let s = send(&http, Method::HEAD, &url, Some(token_of("viewer"))).await;
        assert_eq!(s, StatusCode::OK, "HEAD {path} as viewer");
    }
    // A principal out of scope is refused on HEAD as on GET.
    for path in ["/v1/groups/g1", "/v1/groups/g1/history", "/v1/streams/s1"] {
        let url = format!("{}{path}", stack.url);
        for method in [Method::GET, Method::HEAD] {
            let s = send(
                &http,
                method.clone(),
                &url,
                Some(token_of("admin-elsewhere")),
            )
            .await;
            assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}");
        }
    }
    // Open routes stay open.
    let s = send(&http, Method::HEAD, &format!("{}/healthz", stack.url), None).await;
    assert_eq!(s, StatusCode::OK);
}

/// 3,000 refused POSTs of 60 KB: the store Redis holds no body of theirs, the audit log's
/// refusals are a handful of counted entries, the admin's mutation is still in the log, and
/// the address is throttled before authentication past its refusal burst.
#[tokio::test]
async fn refused_floods_neither_bloat_nor_erase_the_audit_log() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let stack = Secured::start_with_store(
        &["--store", "redis", "--redis-url", &url],
        &["--audit-refusal-interval-ms", "1000"],
    );
    let admin = stack.api("admin");
    let (s, _) = admin
        .post(
            "/v1/groups",
            json!({"group": "g1", "stream": "s1", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let used = |redis: &RedisServer| -> u64 {
        let info = redis.command("INFO memory").unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let before = used(&redis);
    let body = json!({"group": "g2", "stream": "s2", "pad": "x".repeat(60_000)}).to_string();
    let http = rsc_e2e::http();
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    let started = std::time::Instant::now();
    for _ in 0..3_000 {
        let s = http
            .post(format!("{}/v1/groups", stack.url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap()
            .status();
        *statuses.entry(s.as_u16()).or_default() += 1;
    }
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![401, 429],
        "refused, then throttled past the refusal burst: {statuses:?}"
    );
    // Every refusal is counted: the counted entries add up once the interval closed.
    eventually_async("3,000 refusals counted in the audit log", 10, || async {
        let total: u64 = audit(&stack, "refusals")
            .await
            .iter()
            .filter(|e| e["client_addr"] == "127.0.0.1" && e["action"] == "group.create")
            .map(|e| e["count"].as_u64().unwrap())
            .sum();
        (total == 3_000).then_some(())
    })
    .await;
    // At most two entries per kind (401, 429) and interval (1 s) the flood lasted.
    let intervals = started.elapsed().as_secs() + 2;
    let refusals = audit(&stack, "refusals").await;
    assert!(
        refusals.len() as u64 <= 2 * 2 * intervals,
        "{} refusal entries for 3,000 requests over {intervals} intervals",
        refusals.len()
    );
    assert!(refusals.iter().all(|e| e["request"].get("body").is_none()));
    let grown = used(&redis).saturating_sub(before);
    assert!(
        grown < 2 << 20,
        "the store Redis grew {grown} bytes for 3,000 refused 60 KB requests"
    );
    let reply = redis.command("XLEN rsc:audit:refusals").unwrap();
    let xlen: u64 = reply
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|e| panic!("XLEN answered {reply:?}: {e}"));
    assert!(
        xlen <= 2 * 2 * intervals,
        "{xlen} entries in rsc:audit:refusals"
    );
    // The admin's create is still in the log of mutations.
    let mutations = audit(&stack, "mutations").await;
    assert!(
        mutations
            .iter()
            .any(|e| e["action"] == "group.create" && e["result"]["status"] == 201),
        "{mutations:?}"
    );
    let m = metrics(&stack).await;
    assert!(
        metric_sum(
            &m,
            "rsc_client_throttled_total",
            &[("reason", "refusal_rate")]
        ) > 0.0,
        "throttling is counted"
    );
}

/// An address over its refusal rate is throttled; another address is not, and a trusted
/// proxy's `X-Forwarded-For` names the client (PROTOCOL §7).
#[tokio::test]
async fn refusals_throttle_their_address_and_trusted_proxies_name_the_client() {
    let stack = Secured::start(&[
        "--client-refusal-rate",
        "1",
        "--client-refusal-burst",
        "5",
        "--trusted-proxies",
        "127.0.0.4",
    ]);
    let url = format!("{}/v1/groups", stack.url);
    let attacker = client_from("127.0.0.2");
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(
            send(&attacker, Method::GET, &url, Some("guess"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(&statuses[..5], &[401; 5], "{statuses:?}");
    assert!(statuses[5..].contains(&429), "{statuses:?}");
    // Throttled before authentication: even a valid token waits.
    let s = send(&attacker, Method::GET, &url, Some(token_of("viewer"))).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    // The open routes are not throttled: a health probe from that address is answered.
    let health = format!("{}/healthz", stack.url);
    assert_eq!(
        send(&attacker, Method::GET, &health, None).await,
        StatusCode::OK
    );
    // Another address is served.
    let other = client_from("127.0.0.3");
    let s = send(&other, Method::GET, &url, Some(token_of("viewer"))).await;
    assert_eq!(s, StatusCode::OK);
    // Behind the trusted proxy 127.0.0.4, the client is the header's address; a header from
    // anyone else is ignored.
    for (source, want) in [("127.0.0.4", "192.0.2.77"), ("127.0.0.3", "127.0.0.3")] {
        let s = client_from(source)
            .get(&url)
            .header("x-forwarded-for", "192.0.2.77")
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let refusals = audit(&stack, "refusals").await;
        assert!(
            refusals.iter().any(|e| e["client_addr"] == want),
            "{source}: {refusals:?}"
        );
    }
}
