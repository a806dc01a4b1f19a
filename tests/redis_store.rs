//! Several coordinator processes on one Redis (and on a Redis Cluster): members heartbeating
//! to coordinators chosen at random while admin mutations race, coordinators killed and
//! restarted, Redis restarted and down. Checked throughout: no shard in two live members'
//! assignments, revisions only grow, every acknowledged mutation is visible, the group
//! converges afterwards.

use reqwest::{Method, StatusCode};
use rsc_e2e::{Api, Backend, Stack, code};
use rsc_testkit::{CoordinatorProcess, RedisOptions, RedisServer};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GROUP: &str = "g";
const STREAM: &str = "s";
/// Session timeout of the test group: long enough that a few seconds of outage expire
/// nobody, short enough for a test.
const SESSION_MS: u64 = 6_000;
/// How often the simulated members heartbeat (more often than the group's 100 ms interval,
/// to make races likelier).
const HEARTBEAT_MS: u64 = 40;

// ---------------------------------------------------------------------------------------
// The simulated members and the safety check.

/// What every member currently believes it may process, and when it sent the heartbeat
/// that last succeeded (it self-fences `FENCE` after that, like the client: PROTOCOL §5.3).
#[derive(Debug, Default)]
struct World {
    coordinators: Vec<Api>,
    owners: Mutex<HashMap<String, (BTreeSet<u32>, Instant)>>,
    violations: Mutex<Vec<String>>,
    stop: AtomicBool,
    /// While set, members keep processing (and reporting) the shards they are asked to
    /// revoke, as a slow handler would: the group stays reconciling until it is cleared.
    hold_revocations: AtomicBool,
    ok: AtomicU64,
    unavailable: AtomicU64,
}

/// Self-fencing: session timeout minus a 10% margin.
const FENCE: Duration = Duration::from_millis(SESSION_MS * 9 / 10);

impl World {
    fn new(coordinators: Vec<Api>) -> Arc<Self> {
        Arc::new(World {
            coordinators,
            ..World::default()
        })
    }

    fn pick(&self) -> &Api {
        &self.coordinators[rand::random_range(0..self.coordinators.len())]
    }

    /// Records a granted assignment; a shard another live (not self-fenced) member still
    /// holds is a violation.
    fn granted(&self, member: &str, assignment: BTreeSet<u32>, sent: Instant) {
        let mut owners = self.owners.lock().unwrap();
        for (other, (shards, last_ok)) in owners.iter() {
            if other == member || last_ok.elapsed() > FENCE {
                continue;
            }
            let both: Vec<u32> = shards.intersection(&assignment).copied().collect();
            if !both.is_empty() {
                self.violations.lock().unwrap().push(format!(
                    "shards {both:?} given to {member} while {other} holds them"
                ));
            }
        }
        owners.insert(member.to_owned(), (assignment, sent));
    }

    fn released(&self, member: &str) {
        self.owners.lock().unwrap().remove(member);
    }

    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    fn assert_safe(&self) {
        let v = self.violations.lock().unwrap();
        assert!(
            v.is_empty(),
            "{} violations, first: {:?}",
            v.len(),
            &v[..v.len().min(5)]
        );
    }
}

#[derive(Debug, Default)]
struct MemberState {
    epoch: i64,
    owned: Vec<u32>,
    shard_count: u32,
}

/// A member: heartbeats through random coordinators, follows the protocol (revokes what is
/// no longer assigned at once, reports draining shards it holds as drained, rejoins when
/// fenced or unknown).
struct Member {
    id: String,
    state: Arc<tokio::sync::Mutex<MemberState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Member {
    fn spawn(world: &Arc<World>, id: &str) -> Member {
        let state = Arc::new(tokio::sync::Mutex::new(MemberState::default()));
        let task = tokio::spawn(member_loop(world.clone(), id.to_owned(), state.clone()));
        Member {
            id: id.to_owned(),
            state,
            task,
        }
    }
}

async fn member_loop(world: Arc<World>, id: String, state: Arc<tokio::sync::Mutex<MemberState>>) {
    while !world.stop.load(Ordering::SeqCst) {
        {
            let mut st = state.lock().await;
            let drained: Vec<u32> = st
                .owned
                .iter()
                .copied()
                .filter(|s| *s >= st.shard_count)
                .collect();
            let body = json!({
                "protocol_version": 1, "member_id": id, "member_epoch": st.epoch,
                "owned_shards": st.owned, "drained_shards": drained,
            });
            let sent = Instant::now();
            let api = world.pick();
            // Half the heartbeats through the batch route (a batch of one): the safety check
            // holds for both.
            let batched = rand::random::<bool>();
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                api.member_heartbeat(GROUP, body, batched),
            )
            .await;
            match r {
                Ok(Ok((StatusCode::OK, v))) => {
                    let assignment: BTreeSet<u32> = v["assignment"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s.as_u64().unwrap() as u32)
                        .collect();
                    // Holding, it keeps what it is asked to revoke besides what it gets.
                    let holding: BTreeSet<u32> = if world.hold_revocations.load(Ordering::SeqCst) {
                        assignment.iter().chain(st.owned.iter()).copied().collect()
                    } else {
                        assignment
                    };
                    world.granted(&id, holding.clone(), sent);
                    st.epoch = v["member_epoch"].as_i64().unwrap();
                    st.owned = holding.into_iter().collect();
                    st.shard_count = v["shard_count"].as_u64().unwrap() as u32;
                    world.ok.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Ok((_, v)))
                    if matches!(code(&v), "UNKNOWN_MEMBER_ID" | "FENCED_MEMBER_EPOCH") =>
                {
                    world.released(&id);
                    st.epoch = 0;
                    st.owned.clear();
                }
                Ok(Ok((StatusCode::SERVICE_UNAVAILABLE, _))) | Ok(Err(_)) => {
                    // Store down, lock contention or a coordinator gone: keep what it owns
                    // (until it self-fences) and try again.
                    world.unavailable.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Ok((s, v))) => world.violation(format!("{id}: unexpected {s} {v}")),
                Err(_) => world.violation(format!("{id}: heartbeat hung for 10 s")),
            }
        }
        let jitter = rand::random_range(0..HEARTBEAT_MS / 2);
        tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS + jitter)).await;
    }
}

/// Removes a member (admin) while it cannot heartbeat. The coordinator frees its shards the
/// moment it removes it, before the answer reaches the test: the test stops counting the
/// member as a holder when it sends the request (a removed member is not live), and counts
/// it again only if the removal was refused. Returns the status.
async fn remove_member(world: &World, admin: &Api, member: &Member) -> StatusCode {
    let mut st = member.state.lock().await;
    let held = world.owners.lock().unwrap().remove(&member.id);
    let (s, v) = admin
        .call(
            Method::DELETE,
            &format!("/v1/groups/{GROUP}/members/{}", member.id),
            None,
        )
        .await;
    match s {
        StatusCode::NO_CONTENT => {
            st.epoch = 0;
            st.owned.clear();
            // Acknowledged: every coordinator shows it gone (nothing can rejoin it now).
            let (_, view) = world.pick().get(&format!("/v1/groups/{GROUP}")).await;
            let ids = member_ids(&view);
            assert!(
                !ids.contains(&member.id),
                "removed {} still listed: {ids:?}",
                member.id
            );
        }
        StatusCode::NOT_FOUND => assert_eq!(code(&v), "UNKNOWN_MEMBER_ID", "{v}"),
        StatusCode::SERVICE_UNAVAILABLE => {
            // Not removed: it still holds what it held.
            if let Some(h) = held {
                world.owners.lock().unwrap().insert(member.id.clone(), h);
            }
        }
        other => panic!("remove member: unexpected {other} {v}"),
    }
    s
}

fn member_ids(view: &Value) -> Vec<String> {
    view["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| m["member_id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Calls until the answer is not `503` (lock contention, a coordinator restarting).
async fn call_retrying(
    world: &World,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((s, v)) = world
            .pick()
            .try_call(method.clone(), path, body.clone())
            .await
            && s != StatusCode::SERVICE_UNAVAILABLE
        {
            return (s, v);
        }
        assert!(Instant::now() < deadline, "{method} {path}: 503 for 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the group view (every 10 ms, at most 20 s) until `done` holds; returns that view.
async fn wait_view(world: &World, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = group_view(world).await;
        if done(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn group_view(world: &World) -> Value {
    let (s, v) = call_retrying(world, Method::GET, &format!("/v1/groups/{GROUP}"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// Waits until the group is stable with exactly `members`, every shard of `0..shards`
/// owned by exactly one of them, balanced, and the members' own view agrees.
async fn wait_converged(world: &World, members: &[&Member], shards: u32) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let want: BTreeSet<String> = members.iter().map(|m| m.id.clone()).collect();
    loop {
        let view = group_view(world).await;
        let ids: BTreeSet<String> = member_ids(&view).into_iter().collect();
        let owners = world.owners.lock().unwrap().clone();
        let mut all: Vec<u32> = owners
            .iter()
            .filter(|(m, _)| want.contains(*m))
            .flat_map(|(_, (s, _))| s.iter().copied())
            .collect();
        all.sort_unstable();
        let sizes: Vec<usize> = want
            .iter()
            .map(|m| owners.get(m).map_or(0, |(s, _)| s.len()))
            .collect();
        let balanced = sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0) <= 1;
        if view["state"] == "stable"
            && view["resharding"].is_null()
            && ids == want
            && all == (0..shards).collect::<Vec<_>>()
            && balanced
        {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "not converged after 30 s: state {} members {ids:?} (want {want:?}) owned {all:?} sizes {sizes:?}",
            view["state"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create_group(api: &Api, shards: u32) {
    let (s, v) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": STREAM, "shard_count": shards,
                   "session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 100}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

fn coordinator_args(stack: &Stack) -> Vec<String> {
    let mut args = vec!["--sweep-interval-ms".to_owned(), "20".to_owned()];
    args.extend(stack.store_args.iter().cloned());
    args
}

fn start_on(addr: std::net::SocketAddr, args: &[String]) -> CoordinatorProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The port was ours a moment ago; retry briefly if the OS has not released it yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match CoordinatorProcess::start_listening(&addr.to_string(), &args) {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("restart on {addr} failed ({e}); retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("coordinator restart on {addr}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Several coordinators, racing admin mutations.

async fn racing_coordinators(backend: Backend, coordinators: usize) {
    let stack = Stack::start(backend, &[]);
    let mut others = Vec::new();
    for _ in 1..coordinators {
        others.push(stack.another_coordinator(&[]));
    }
    let mut apis = vec![stack.api.clone()];
    apis.extend(others.iter().map(|c| Api::new(c.url())));
    let world = World::new(apis);
    create_group(&stack.api, 12).await;
    let members: Vec<Member> = (0..6)
        .map(|i| Member::spawn(&world, &format!("m{i}")))
        .collect();
    let refs: Vec<&Member> = members.iter().collect();
    wait_converged(&world, &refs, 12).await;

    // Admin mutations, one after another, each through a random coordinator while the
    // members keep heartbeating through random coordinators.
    let mut last_revision = group_view(&world).await["revision"].as_u64().unwrap();
    let mut shard_count = 12u32;
    let mut acknowledged = 0;
    let until = Instant::now() + Duration::from_secs(6);
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        match i % 4 {
            0 | 1 => {
                // A config change: bumps the group epoch, every member moves to it.
                let value = 60_000 + i;
                let (s, v) = call_retrying(
                    &world,
                    Method::PATCH,
                    &format!("/v1/groups/{GROUP}"),
                    Some(json!({"rebalance_timeout_ms": value})),
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{v}");
                let seen = group_view(&world).await;
                assert_eq!(
                    seen["rebalance_timeout_ms"], value,
                    "acknowledged PATCH visible"
                );
                let rev = seen["revision"].as_u64().unwrap();
                assert!(rev > last_revision, "revision {rev} after {last_revision}");
                last_revision = rev;
                acknowledged += 1;
            }
            2 => {
                let m = &members[rand::random_range(0..members.len())];
                if remove_member(&world, world.pick(), m).await == StatusCode::NO_CONTENT {
                    acknowledged += 1;
                }
            }
            _ => {
                let to = if shard_count == 12 { 16 } else { 12 };
                let (s, v) = call_retrying(
                    &world,
                    Method::POST,
                    &format!("/v1/streams/{STREAM}/reshard"),
                    Some(json!({"shard_count": to})),
                )
                .await;
                match s {
                    StatusCode::ACCEPTED => {
                        shard_count = to;
                        acknowledged += 1;
                        let (_, sv) = call_retrying(
                            &world,
                            Method::GET,
                            &format!("/v1/streams/{STREAM}"),
                            None,
                        )
                        .await;
                        assert_eq!(sv["shard_count"], to, "acknowledged reshard visible");
                    }
                    StatusCode::CONFLICT => assert_eq!(code(&v), "RESHARD_IN_PROGRESS", "{v}"),
                    other => panic!("reshard: {other} {v}"),
                }
            }
        }
        let rev = group_view(&world).await["revision"].as_u64().unwrap();
        assert!(
            rev >= last_revision,
            "revision went back: {rev} < {last_revision}"
        );
        last_revision = rev;
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..80))).await;
    }
    let view = wait_converged(&world, &refs, shard_count).await;
    assert!(view["revision"].as_u64().unwrap() >= last_revision);
    world.stop.store(true, Ordering::SeqCst);
    for m in members {
        m.task.await.unwrap();
    }
    world.assert_safe();
    assert!(
        acknowledged >= 10,
        "only {acknowledged} admin mutations went through"
    );
    eprintln!(
        "{coordinators} coordinators on {backend:?}: {acknowledged} admin mutations, {} heartbeats ok, {} unavailable",
        world.ok.load(Ordering::SeqCst),
        world.unavailable.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_coordinators_on_one_redis() {
    racing_coordinators(Backend::Redis, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_coordinators_on_one_redis() {
    racing_coordinators(Backend::Redis, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_coordinators_on_a_redis_cluster() {
    racing_coordinators(Backend::RedisCluster, 3).await;
}

// ---------------------------------------------------------------------------------------
// A coordinator killed (SIGKILL) in the middle of a rebalance, then restarted.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_mid_rebalance_and_restarted() {
    let stack = Stack::start(Backend::Redis, &[]);
    let args = coordinator_args(&stack);
    let mut victim = stack.another_coordinator(&[]);
    let third = stack.another_coordinator(&[]);
    let victim_addr = victim.addr();
    let world = World::new(vec![
        stack.api.clone(),
        Api::new(victim.url()),
        Api::new(third.url()),
    ]);
    create_group(&stack.api, 12).await;
    let mut members: Vec<Member> = (0..3)
        .map(|i| Member::spawn(&world, &format!("m{i}")))
        .collect();
    wait_converged(&world, &members.iter().collect::<Vec<_>>(), 12).await;
    let before = group_view(&world).await;

    // Rebalance: three more members join and the stream grows; kill a coordinator while
    // the old members are still revoking (they hold their revoked shards until told to
    // let go, so the rebalance cannot finish before the kill).
    world.hold_revocations.store(true, Ordering::SeqCst);
    members.extend((3..6).map(|i| Member::spawn(&world, &format!("m{i}"))));
    let (s, v) = call_retrying(
        &world,
        Method::POST,
        &format!("/v1/streams/{STREAM}/reshard"),
        Some(json!({"shard_count": 18})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    // Kill it mid-rebalance: once the group is seen reconciling with the new members
    // waiting for shards the old ones still hold, not after a guessed delay.
    let mid = wait_view(&world, "the group reconciling", |v| {
        v["state"] == "reconciling"
            && v["members"].as_array().is_some_and(|m| {
                m.iter()
                    .any(|m| !m["pending_revocation"].as_array().unwrap().is_empty())
            })
    })
    .await;
    victim.kill();
    world.hold_revocations.store(false, Ordering::SeqCst);
    assert!(mid["revision"].as_u64() > before["revision"].as_u64());

    let view = wait_converged(&world, &members.iter().collect::<Vec<_>>(), 18).await;
    // Restarted on the same address, it serves the same state (all of it is in Redis).
    let restarted = start_on(victim_addr, &args);
    let (s, again) = Api::new(restarted.url())
        .get(&format!("/v1/groups/{GROUP}"))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(again["revision"].as_u64() >= view["revision"].as_u64());
    assert_eq!(member_ids(&again).len(), 6);
    // And the group stays healthy with it back in the rotation: converged again after the
    // members' heartbeats went through it (its request counter moved).
    let restarted_api = Api::new(restarted.url());
    let served = restarted_api.metric("rsc_heartbeats_total", &[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while restarted_api.metric("rsc_heartbeats_total", &[]).await <= served {
        assert!(
            Instant::now() < deadline,
            "no heartbeat reached the restarted coordinator"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_converged(&world, &members.iter().collect::<Vec<_>>(), 18).await;
    world.stop.store(true, Ordering::SeqCst);
    for m in members {
        m.task.await.unwrap();
    }
    world.assert_safe();
}

// ---------------------------------------------------------------------------------------
// Redis itself restarted (AOF on) in the middle of a rebalance.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_with_aof_mid_rebalance() {
    let mut redis = RedisServer::start_with(RedisOptions {
        aof: true,
        ..RedisOptions::default()
    })
    .unwrap();
    let prefix = rsc_e2e::unique_key_prefix();
    let args = [
        "--sweep-interval-ms",
        "20",
        "--store",
        "redis",
        "--redis-url",
        &redis.url(),
        "--key-prefix",
        &prefix,
    ];
    let a = CoordinatorProcess::start(&args).unwrap();
    let b = CoordinatorProcess::start(&args).unwrap();
    let world = World::new(vec![Api::new(a.url()), Api::new(b.url())]);
    create_group(&world.coordinators[0], 8).await;
    let mut members: Vec<Member> = (0..2)
        .map(|i| Member::spawn(&world, &format!("m{i}")))
        .collect();
    wait_converged(&world, &members.iter().collect::<Vec<_>>(), 8).await;
    // A 503 (lock wait or CAS budget exhausted on a loaded machine) is retried, as clients do.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, v) = world.coordinators[1]
            .call(
                Method::PATCH,
                &format!("/v1/groups/{GROUP}"),
                Some(json!({"rebalance_timeout_ms": 77_000})),
            )
            .await;
        if s == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(s, StatusCode::OK, "{v}");
        break;
    }
    // Rebalance: two members join; Redis is killed while they wait for shards.
    members.extend((2..4).map(|i| Member::spawn(&world, &format!("m{i}"))));
    let before = wait_view(&world, "the new members joined", |v| {
        member_ids(v).len() == 4
    })
    .await;
    let noticed = world.unavailable.load(Ordering::SeqCst);
    redis.kill();
    // Down until the members notice (heartbeats answered 503), then back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while world.unavailable.load(Ordering::SeqCst) == noticed {
        assert!(Instant::now() < deadline, "the outage is not noticed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.restart().unwrap();

    let view = wait_converged(&world, &members.iter().collect::<Vec<_>>(), 8).await;
    assert_eq!(
        view["rebalance_timeout_ms"], 77_000,
        "acknowledged change survived"
    );
    assert!(
        view["revision"].as_u64() >= before["revision"].as_u64(),
        "no revision lost"
    );
    assert!(view["group_epoch"].as_u64() >= before["group_epoch"].as_u64());
    world.stop.store(true, Ordering::SeqCst);
    for m in members {
        m.task.await.unwrap();
    }
    world.assert_safe();
    assert!(
        world.unavailable.load(Ordering::SeqCst) > 0,
        "the outage was noticed"
    );
}

// ---------------------------------------------------------------------------------------
// Redis down for a few seconds.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_quickly_and_recovers() {
    let mut redis = RedisServer::start_with(RedisOptions {
        aof: true,
        ..RedisOptions::default()
    })
    .unwrap();
    let prefix = rsc_e2e::unique_key_prefix();
    let c = CoordinatorProcess::start(&[
        "--sweep-interval-ms",
        "20",
        "--store",
        "redis",
        "--redis-url",
        &redis.url(),
        "--key-prefix",
        &prefix,
    ])
    .unwrap();
    let api = Api::new(c.url());
    create_group(&api, 4).await;
    let (s, v) = api.heartbeat(GROUP, "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let epoch = v["member_epoch"].as_i64().unwrap();
    let owned: Vec<u32> = serde_json::from_value(v["assignment"].clone()).unwrap();
    assert_eq!(api.get("/readyz").await.0, StatusCode::OK);

    redis.kill();
    let down = Instant::now();
    let mut slowest = Duration::ZERO;
    while down.elapsed() < Duration::from_secs(3) {
        for (what, call) in [
            ("heartbeat", api.heartbeat(GROUP, "m1", epoch, &owned).await),
            ("describe", api.get(&format!("/v1/groups/{GROUP}")).await),
            ("readyz", api.get("/readyz").await),
        ] {
            let (s, v) = call;
            assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{what}: {v}");
            assert_eq!(code(&v), "STORE_UNAVAILABLE", "{what}: {v}");
        }
        let t = Instant::now();
        let _ = api.heartbeat(GROUP, "m1", epoch, &owned).await;
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Fast, not a hang: bounded by the store's operation timeout, not by anything longer.
    assert!(slowest < Duration::from_secs(3), "a 503 took {slowest:?}");
    eprintln!("slowest 503 while Redis was down: {slowest:?}");

    redis.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while api.get("/readyz").await.0 != StatusCode::OK {
        assert!(
            Instant::now() < deadline,
            "readyz recovers without a restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The first requests after Redis returns may still wait out a lock taken before the
    // outage (503, retried by clients with backoff).
    let deadline = Instant::now() + Duration::from_secs(15);
    let (s, v) = loop {
        let (s, v) = api.heartbeat(GROUP, "m1", epoch, &owned).await;
        if s == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        break (s, v);
    };
    assert_eq!(s, StatusCode::OK, "the member carries on: {v}");
    assert_eq!(v["member_epoch"].as_i64(), Some(epoch));
    let (s, _) = api.get(&format!("/v1/groups/{GROUP}")).await;
    assert_eq!(s, StatusCode::OK);

    // A Redis that hangs (SIGSTOP) rather than refusing: answered by the timeouts.
    let pid = redis.pid().unwrap();
    rsc_testkit::signal(pid, rsc_testkit::Signal::SIGSTOP).unwrap();
    let t = Instant::now();
    let (s, v) = api.heartbeat(GROUP, "m1", epoch, &owned).await;
    let hung = t.elapsed();
    let (r, _) = api.get("/readyz").await;
    rsc_testkit::signal(pid, rsc_testkit::Signal::SIGCONT).unwrap();
    assert_eq!(
        (s, code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "STORE_UNAVAILABLE"),
        "{v}"
    );
    assert_eq!(r, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        hung < Duration::from_secs(4),
        "a hung Redis answered in {hung:?}"
    );
    eprintln!("503 from a hung Redis after {hung:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, v) = api.heartbeat(GROUP, "m1", epoch, &owned).await;
        if s == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery after SIGCONT: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Expiry with several coordinators: exactly one of them expires each member.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_coordinator_expires_each_silent_member() {
    let stack = Stack::start(Backend::Redis, &[]);
    let others = [
        stack.another_coordinator(&[]),
        stack.another_coordinator(&[]),
    ];
    let api = &stack.api;
    let (s, v) = api
        .post(
            "/v1/groups",
            json!({"group": GROUP, "stream": STREAM, "shard_count": 8,
                   "session_timeout_ms": 600, "heartbeat_interval_ms": 100}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let silent: Vec<String> = (0..5).map(|i| format!("silent-{i}")).collect();
    for m in &silent {
        let (s, v) = api.heartbeat(GROUP, m, 0, &[]).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    // Nobody heartbeats again: three coordinators sweep every 20 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, view) = api.get(&format!("/v1/groups/{GROUP}")).await;
        if member_ids(&view).is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not expired: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Counted once per expiry by the coordinator that committed it: summed over the three,
    // each silent member exactly once (a double expiry would count twice).
    let apis: Vec<Api> = std::iter::once(&stack.coordinator)
        .chain(&others)
        .map(|c| Api::new(c.url()))
        .collect();
    let labels = [("group", GROUP), ("reason", "session_timeout")];
    let want = silent.len() as f64;
    let deadline = Instant::now() + Duration::from_secs(5);
    let expired = loop {
        let mut expired = 0.0;
        for api in &apis {
            expired += api.metric("rsc_members_expired_total", &labels).await;
        }
        if expired >= want || Instant::now() > deadline {
            break expired;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(expired, want, "expiries summed over the coordinators");
    // And it is gone for every coordinator.
    for c in &others {
        let (s, v) = Api::new(c.url()).heartbeat(GROUP, &silent[0], 1, &[]).await;
        assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "UNKNOWN_MEMBER_ID"));
    }
}

/// `--store-wait-replicas 1` on a master without a replica: a group document commit is not
/// acknowledged (503 STORE_UNAVAILABLE, counted) instead of being acknowledged on a server
/// that no replica follows (PROTOCOL §19); with a replica attached it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_no_replica_acknowledged_is_refused() {
    let master = RedisServer::start().unwrap();
    let prefix = rsc_e2e::unique_key_prefix();
    let c = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-url",
        &master.url(),
        "--key-prefix",
        &prefix,
        "--store-wait-replicas",
        "1",
    ])
    .unwrap();
    let api = Api::new(c.url());
    let body = json!({"group": GROUP, "stream": STREAM, "shard_count": 2});
    let (s, v) = api
        .try_call(reqwest::Method::POST, "/v1/groups", Some(body.clone()))
        .await
        .unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(code(&v), "STORE_UNAVAILABLE", "{v}");
    let refused = api
        .metric("rsc_store_commits_refused_total", &[("reason", "replicas")])
        .await;
    assert!(refused >= 1.0, "{refused}");

    // A replica follows the master: the next change is acknowledged.
    let replica = RedisServer::start().unwrap();
    let r = replica
        .command(&format!("REPLICAOF 127.0.0.1 {}", master.port()))
        .unwrap();
    assert!(r.starts_with('+'), "{r}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !master
        .command("INFO replication")
        .is_ok_and(|i| i.contains("connected_slaves:1") && i.contains("state=online"))
    {
        assert!(Instant::now() < deadline, "the replica never got in sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The replica acknowledges on its next `REPLCONF ACK`: on a loaded machine the first
    // change may still miss the 250 ms wait (and be refused, never acknowledged unreplicated);
    // a later one is acknowledged.
    for attempt in 0.. {
        let body = json!({"group": format!("other-{attempt}"), "stream": "other-stream", "shard_count": 2});
        let (s, v) = api
            .try_call(reqwest::Method::POST, "/v1/groups", Some(body))
            .await
            .unwrap();
        if s == StatusCode::CREATED {
            break;
        }
        assert_eq!(
            (s, code(&v)),
            (StatusCode::SERVICE_UNAVAILABLE, "STORE_UNAVAILABLE"),
            "{v}"
        );
        assert!(
            Instant::now() < deadline,
            "no change acknowledged with the replica in sync: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
