//! Wake-up channels (`POST /v1/wakeups`): a change decided on one coordinator reaches the
//! members it concerns at once, on whichever coordinator holds their channel; real
//! coordinator processes, real Redis (standalone and cluster), real sample pods.

use rsc_e2e::{Api, Backend, Stack, store_suite};
use rsc_testkit::{RedisServer, Signal, binary_path, signal};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Long enough that only a wake-up explains hearing of a change in time.
const SLOW_HEARTBEAT_MS: u64 = 20_000;

/// An open wake-up channel: its `wake` events as (group, member), in a queue.
struct Channel {
    events: mpsc::UnboundedReceiver<(String, String)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Channel {
    /// Opens a channel on `base` for `members` of `group`; returns once `ready` arrived.
    async fn open(base: &str, group: &str, members: &[&str]) -> Channel {
        let body = json!({"members": members.iter().map(|m| json!({"group": group, "member_id": m})).collect::<Vec<_>>()});
        let resp = rsc_e2e::http()
            .post(format!("{base}/v1/wakeups"))
            .json(&body)
            .send()
            .await
            .expect("coordinator reachable");
        assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let (tx, events) = mpsc::unbounded_channel();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut buf = String::new();
            let mut resp = resp;
            while let Ok(Some(chunk)) = resp.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let block: String = buf.drain(..end + 2).collect();
                    let event = block
                        .lines()
                        .find_map(|l| l.strip_prefix("event: "))
                        .unwrap_or_default()
                        .to_owned();
                    let data = block
                        .lines()
                        .find_map(|l| l.strip_prefix("data: "))
                        .unwrap_or_default()
                        .to_owned();
                    match event.as_str() {
                        "ready" => {
                            if let Some(r) = ready_tx.take() {
                                let _ = r.send(());
                            }
                        }
                        "wake" => {
                            let v: Value = serde_json::from_str(&data).expect("wake event json");
                            let _ = tx.send((
                                v["group"].as_str().unwrap().to_owned(),
                                v["member_id"].as_str().unwrap().to_owned(),
                            ));
                        }
                        _ => {}
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(5), ready)
            .await
            .expect("ready event")
            .expect("channel task alive");
        Channel { events, task }
    }

    /// The members woken within `within`, waiting until `expect` were all woken.
    async fn woken(&mut self, expect: &[&str], within: Duration) -> BTreeSet<String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut got = BTreeSet::new();
        while !expect.iter().all(|m| got.contains(*m)) {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some((_, m))) => {
                    got.insert(m);
                }
                _ => panic!("expected {expect:?} woken within {within:?}, got {got:?}"),
            }
        }
        got
    }

    /// Asserts that no wake-up arrives for `quiet`.
    async fn quiet(&mut self, quiet: Duration) {
        if let Ok(Some(e)) = tokio::time::timeout(quiet, self.events.recv()).await {
            panic!("unexpected wake-up {e:?}");
        }
    }
}

async fn create(api: &Api, group: &str, shards: u32, heartbeat_ms: u64) {
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": group, "stream": group, "shard_count": shards,
                "heartbeat_interval_ms": heartbeat_ms, "session_timeout_ms": heartbeat_ms * 3}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
}

fn shards(v: &Value) -> Vec<u32> {
    v["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap() as u32)
        .collect()
}

/// Heartbeats `member` reporting what it was given until its answer is stable; returns
/// (epoch, assignment).
async fn settle(
    api: &Api,
    group: &str,
    member: &str,
    mut epoch: i64,
    mut owned: Vec<u32>,
) -> (i64, Vec<u32>) {
    for _ in 0..5 {
        let (s, v) = api.heartbeat(group, member, epoch, &owned).await;
        assert_eq!(s.as_u16(), 200, "{v}");
        let (e, a) = (v["member_epoch"].as_i64().unwrap(), shards(&v));
        if e == epoch && a == owned {
            break;
        }
        (epoch, owned) = (e, a);
    }
    (epoch, owned)
}

/// Every change a member must act on wakes it, on a channel held by another coordinator than
/// the one that decided (one coordinator on the memory store); a steady heartbeat wakes
/// nobody.
async fn changes_wake_the_members_that_must_act(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    // The deciding coordinator, and the one holding the channel.
    let other = match backend {
        Backend::Memory => None,
        _ => Some(stack.another_coordinator(&[])),
    };
    let decide = &stack.api;
    let channel_url = other.as_ref().map_or(stack.coordinator.url(), |c| c.url());
    let g = "wake-g";
    create(decide, g, 4, SLOW_HEARTBEAT_MS).await;
    let (s, v) = decide.heartbeat(g, "a", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    let (ea, owned_a) = settle(decide, g, "a", v["member_epoch"].as_i64().unwrap(), vec![]).await;
    assert_eq!(owned_a, vec![0, 1, 2, 3]);
    let mut ch = Channel::open(&channel_url, g, &["a", "b"]).await;
    let within = Duration::from_secs(3);

    // A steady heartbeat changes nothing: nobody is woken.
    settle(decide, g, "a", ea, owned_a.clone()).await;
    ch.quiet(Duration::from_millis(300)).await;

    // b joins: a must give shards up.
    let t = Instant::now();
    let (s, v) = decide.heartbeat(g, "b", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    let eb = v["member_epoch"].as_i64().unwrap();
    assert_eq!(
        ch.woken(&["a"], within).await,
        BTreeSet::from(["a".to_owned()])
    );
    eprintln!("join -> a woken in {:?}", t.elapsed());

    // a heartbeats: asked to revoke two shards (it keeps reporting them for now), at the
    // assignment epoch (PROTOCOL §5.2).
    let (s, v) = decide.heartbeat(g, "a", ea, &owned_a).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    let keep = shards(&v);
    assert_eq!(keep.len(), 2, "{v}");
    let ea = v["member_epoch"].as_i64().unwrap();
    // b is waiting for them.
    let (s, v) = decide.heartbeat(g, "b", eb, &[]).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    assert!(shards(&v).is_empty(), "{v}");
    let eb = v["member_epoch"].as_i64().unwrap();
    ch.quiet(Duration::from_millis(200)).await;

    // a releases them: b, waiting, is woken at once.
    let t = Instant::now();
    let (s, v) = decide.heartbeat(g, "a", ea, &keep).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    assert_eq!(
        ch.woken(&["b"], within).await,
        BTreeSet::from(["b".to_owned()])
    );
    eprintln!("release -> b woken in {:?}", t.elapsed());
    let (eb, owned_b) = settle(decide, g, "b", eb, vec![]).await;
    assert_eq!(owned_b.len(), 2);
    let ea = settle(decide, g, "a", v["member_epoch"].as_i64().unwrap(), keep)
        .await
        .0;

    // a leaves: b takes over (its assignment grows).
    let (s, v) = decide
        .post(
            &format!("/v1/groups/{g}/leave"),
            json!({"member_id": "a", "member_epoch": ea}),
        )
        .await;
    assert_eq!(s.as_u16(), 200, "{v}");
    assert!(ch.woken(&["b"], within).await.contains("b"));
    let (eb, owned_b) = settle(decide, g, "b", eb, owned_b).await;
    assert_eq!(owned_b, vec![0, 1, 2, 3]);

    // A reshard wakes b.
    let (s, v) = decide
        .post(
            &format!("/v1/streams/{g}/reshard"),
            json!({"shard_count": 6}),
        )
        .await;
    assert_eq!(s.as_u16(), 202, "{v}");
    ch.woken(&["b"], within).await;
    settle(decide, g, "b", eb, owned_b).await;

    // An operator removes b: it is woken (its heartbeat learns UNKNOWN_MEMBER_ID).
    let (s, v) = decide
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/groups/{g}/members/b"),
            None,
        )
        .await;
    assert_eq!(s.as_u16(), 204, "{v}");
    ch.woken(&["b"], within).await;

    // Deleting the group wakes its members.
    let (s, v) = decide.heartbeat(g, "b", 0, &[]).await;
    assert_eq!(s.as_u16(), 200, "{v}");
    let (s, v) = decide
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/groups/{g}?force=true"),
            None,
        )
        .await;
    assert_eq!(s.as_u16(), 204, "{v}");
    ch.woken(&["b"], within).await;
}

/// The channel's limits: past `--wake-max-channels` a clear 429; bad requests are 400;
/// `--wake-max-channels 0` turns the route off (404, as on an older coordinator).
async fn channel_limits_and_errors(backend: Backend) {
    let stack = Stack::start(backend, &["--wake-max-channels", "1"]);
    let url = stack.coordinator.url();
    let _first = Channel::open(&url, "g", &["a"]).await;
    let http = rsc_e2e::http();
    let r = http
        .post(format!("{url}/v1/wakeups"))
        .json(&json!({"members": [{"group": "g", "member_id": "b"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "30");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED", "{body}");
    assert_eq!(body["error"]["retry_after_ms"], 30_000, "{body}");
    let (s, v) = stack.api.post("/v1/wakeups", json!({"members": []})).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (400, Some("INVALID_REQUEST")),
        "{v}"
    );
    let (s, v) = stack
        .api
        .post(
            "/v1/wakeups",
            json!({"members": [{"group": "bad name", "member_id": "a"}]}),
        )
        .await;
    assert_eq!(s.as_u16(), 400, "{v}");
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("rsc_wake_channels_open 1"), "{metrics}");
    assert!(
        metrics.contains("rsc_wake_channels_refused_total{reason=\"max_channels\"} 1"),
        "{metrics}"
    );

    let off = stack.another_coordinator(&["--wake-max-channels", "0"]);
    let (s, v) = Api::new(off.url())
        .post(
            "/v1/wakeups",
            json!({"members": [{"group": "g", "member_id": "a"}]}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{v}"
    );
}

store_suite!(
    changes_wake_the_members_that_must_act,
    channel_limits_and_errors
);

// ---- Real pods: join and graceful leave settle well under one heartbeat interval. ----

/// The heartbeat interval of the pod scenarios without wake-ups: they converge at their
/// heartbeats, so a short interval keeps them short.
const HEARTBEAT_MS: u64 = 2_000;

/// The heartbeat interval of the pod scenarios with wake-ups. The join is measured from the
/// new pod's spawn, process start included, which a loaded machine can stretch to two
/// seconds; a long interval keeps "well under an interval" a statement about the wake-up
/// path (members learn of the join at once, not at their next heartbeat), not about how fast
/// a debug binary starts.
const WAKE_HEARTBEAT_MS: u64 = 8_000;

/// A `sample-consumer` process; killed when dropped.
struct Pod(Option<Child>);

impl Pod {
    fn start(coordinator: &str, redis: &str, group: &str, pod_ip: &str, wake: bool) -> Pod {
        let child = Command::new(binary_path("sample-consumer").expect("built"))
            .args(["--coordinator", coordinator, "--redis-url", redis])
            .args(["--group", group, "--stream", group, "--concurrency", "1"])
            .args(["--pod-ip", pod_ip])
            .env("RSC_WAKE_CHANNEL", if wake { "true" } else { "false" })
            .env(
                "RSC_LOG",
                std::env::var("RSC_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("RSC_TEST_ECHO").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("sample-consumer starts");
        Pod(Some(child))
    }

    fn terminate(&mut self) {
        if let Some(c) = &self.0 {
            signal(c.id(), Signal::SIGTERM).expect("SIGTERM");
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until `group` is stable with `members` members owning all `shards`; returns the
/// time from `since`.
async fn stable(api: &Api, group: &str, members: usize, shards: usize, since: Instant) -> Duration {
    loop {
        let (_, v) = api.get(&format!("/v1/groups/{group}")).await;
        let ms = v["members"].as_array().cloned().unwrap_or_default();
        let owned: usize = ms
            .iter()
            .map(|m| m["owned_shards"].as_array().map_or(0, Vec::len))
            .sum();
        if v["state"] == "stable"
            && ms.len() == members
            && owned == shards
            && ms.iter().all(|m| m["owned_shards"] == m["assigned_shards"])
        {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{group} never stable: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Pods on `coordinators` coordinators (pod i talks to coordinator i mod n, so the joining
/// or leaving pod's coordinator decides and the others' channels are elsewhere): a third
/// pod joining and a pod leaving gracefully settle in well under one interval. Returns the
/// (join, leave) times in intervals.
async fn join_and_leave(coordinators: usize, wake: bool, serve: &[&str]) -> (f64, f64) {
    let heartbeat_ms = if wake {
        WAKE_HEARTBEAT_MS
    } else {
        HEARTBEAT_MS
    };
    let stack = Stack::start(Backend::Redis, serve);
    let data = RedisServer::start().expect("data redis");
    let mut coords = vec![];
    for _ in 1..coordinators {
        coords.push(stack.another_coordinator(serve));
    }
    let urls: Vec<String> = std::iter::once(stack.coordinator.url())
        .chain(coords.iter().map(|c| c.url()))
        .collect();
    let g = "pods";
    create(&stack.api, g, 12, heartbeat_ms).await;
    let mut pods = vec![
        Pod::start(&urls[0], &data.url(), g, "10.0.0.1", wake),
        Pod::start(&urls[1 % urls.len()], &data.url(), g, "10.0.0.2", wake),
    ];
    stable(&stack.api, g, 2, 12, Instant::now()).await;
    // Let the heartbeat phases spread: the join lands anywhere within the interval.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let t = Instant::now();
    pods.push(Pod::start(
        &urls[2 % urls.len()],
        &data.url(),
        g,
        "10.0.0.3",
        wake,
    ));
    // The pod's process start counts too: measured from the spawn, as the bench does.
    let join = stable(&stack.api, g, 3, 12, t).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let t = Instant::now();
    pods[1].terminate();
    let leave = stable(&stack.api, g, 2, 12, t).await;
    let iv = |d: Duration| d.as_secs_f64() * 1000.0 / heartbeat_ms as f64;
    eprintln!(
        "{coordinators} coordinator(s), wake {wake}, {serve:?}: join settled in {join:?} ({:.2} interval), leave in {leave:?} ({:.2})",
        iv(join),
        iv(leave)
    );
    (iv(join), iv(leave))
}

#[tokio::test]
async fn pods_settle_well_under_an_interval_with_one_coordinator() {
    let (join, leave) = join_and_leave(1, true, &[]).await;
    assert!(
        join < 0.5 && leave < 0.5,
        "join {join:.2}, leave {leave:.2} intervals"
    );
}

#[tokio::test]
async fn pods_settle_well_under_an_interval_across_three_coordinators() {
    let (join, leave) = join_and_leave(3, true, &[]).await;
    assert!(
        join < 0.5 && leave < 0.5,
        "join {join:.2}, leave {leave:.2} intervals"
    );
}

/// Without a channel the pods converge at their heartbeats, as before: the client option
/// off (as with an older client), or a coordinator without the route (as an older one).
#[tokio::test]
async fn without_a_channel_pods_converge_at_their_heartbeats() {
    let (join, leave) = join_and_leave(1, false, &[]).await;
    assert!(
        join < 3.0 && leave < 3.0,
        "join {join:.2}, leave {leave:.2} intervals"
    );
    let (join, leave) = join_and_leave(1, true, &["--wake-max-channels", "0"]).await;
    assert!(
        join < 3.0 && leave < 3.0,
        "join {join:.2}, leave {leave:.2} intervals"
    );
}

/// Channels the coordinators keep dropping (an idle timeout of one second) are reopened:
/// the pods still settle well under an interval.
#[tokio::test]
async fn dropped_channels_are_reopened() {
    let (join, leave) = join_and_leave(3, true, &["--wake-idle-timeout-ms", "1000"]).await;
    assert!(
        join < 0.5 && leave < 0.5,
        "join {join:.2}, leave {leave:.2} intervals"
    );
}

/// A wake-up sent while a process had no channel open is lost, so on the `ready` of a
/// reopened channel each of its members heartbeats once (PROTOCOL §13). With a one-minute
/// heartbeat interval and channels the coordinator closes after one idle second, a stable
/// pod's member is heard from once per reopen; without the catch-up, not for a minute.
#[tokio::test]
async fn a_reopened_channel_makes_its_members_heartbeat_once() {
    let stack = Stack::start(Backend::Redis, &["--wake-idle-timeout-ms", "1000"]);
    let data = RedisServer::start().expect("data redis");
    let g = "catch-up";
    create(&stack.api, g, 4, 60_000).await;
    let _pod = Pod::start(&stack.coordinator.url(), &data.url(), g, "127.0.0.2", true);
    stable(&stack.api, g, 1, 4, Instant::now()).await;
    let labels = [("group", g), ("result", "ok")];
    let before = stack.api.metric("rsc_heartbeats_total", &labels).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = stack.api.metric("rsc_heartbeats_total", &labels).await;
        if now >= before + 3.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} heartbeats in 30 s of reopened channels (interval 60 s)",
            now - before
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The coordinator holding the pods' channels dies: heartbeats and channels move to the
/// next coordinator URL, and a join decided there still wakes them at once.
#[tokio::test]
async fn channels_move_to_another_coordinator_after_a_crash() {
    let mut stack = Stack::start(Backend::Redis, &[]);
    let data = RedisServer::start().expect("data redis");
    let b = stack.another_coordinator(&[]);
    let both = format!("{},{}", stack.coordinator.url(), b.url());
    let api_b = Api::new(b.url());
    let g = "crash";
    create(&api_b, g, 12, WAKE_HEARTBEAT_MS).await;
    let _p1 = Pod::start(&both, &data.url(), g, "10.0.0.1", true);
    let _p2 = Pod::start(&both, &data.url(), g, "10.0.0.2", true);
    stable(&api_b, g, 2, 12, Instant::now()).await;
    stack.coordinator.kill();
    // The pods' next heartbeats fail over to b; their channels follow.
    let deadline = Instant::now() + Duration::from_millis(3 * WAKE_HEARTBEAT_MS + 10_000);
    loop {
        let open = api_b.metric("rsc_wake_channels_open", &[]).await;
        if open >= 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pods' channels never moved to the second coordinator: {open} open there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stable(&api_b, g, 2, 12, Instant::now()).await;
    let t = Instant::now();
    let _p3 = Pod::start(&b.url(), &data.url(), g, "10.0.0.3", true);
    let join = stable(&api_b, g, 3, 12, t).await;
    let iv = join.as_secs_f64() * 1000.0 / WAKE_HEARTBEAT_MS as f64;
    eprintln!("after a coordinator crash: join settled in {join:?} ({iv:.2} interval)");
    assert!(iv < 0.5, "join {iv:.2} intervals");
}
