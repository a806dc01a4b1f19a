//! A store that stops answering (a frozen Redis master) must not expire the members it kept
//! silent, whoever's call saw it fail: replayed deterministically with a store wrapper that
//! holds calls while "frozen" and fails them when the test lets them go (their deadline), and
//! a manual clock.

// The heartbeat future is deep enough to exceed the default limit when spawned.
#![recursion_limit = "256"]

use rsc_coordinator::clock::ManualClock;
use rsc_coordinator::service::{Coordinator, ServiceConfig};
use rsc_coordinator::store::{
    Layered, MemoryStore, MetadataStore, StoreError, StoreLayer, buckets_of,
};
use rsc_protocol::{CreateGroupRequest, HeartbeatRequest};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// While `frozen`, every call is held until the test fails it (as a reply timeout would).
#[derive(Debug, Default)]
struct Freezer {
    frozen: AtomicBool,
    held: Mutex<Vec<oneshot::Sender<()>>>,
}

impl StoreLayer for Freezer {
    async fn around<T: Send>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        if !self.frozen.load(Ordering::SeqCst) {
            return call.await;
        }
        let (tx, rx) = oneshot::channel();
        self.held.lock().unwrap().push(tx);
        let _ = rx.await;
        Err(StoreError::timed_out(format!("{operation}: no reply")))
    }
}

impl Freezer {
    /// Waits until `n` calls are held.
    async fn holding(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.held.lock().unwrap().len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} calls never held"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Fails the call held `index`-th (0: the oldest still held).
    fn fail(&self, index: usize) {
        let tx = self.held.lock().unwrap().remove(index);
        tx.send(()).unwrap();
    }
}

type FrozenStore = Layered<Freezer>;

fn setup() -> (Arc<FrozenStore>, ManualClock, Coordinator) {
    let store = Arc::new(Layered::with_layer(
        Arc::new(MemoryStore::new()) as Arc<dyn MetadataStore>,
        Freezer::default(),
    ));
    let clock = ManualClock::new(1_000);
    let c = Coordinator::new(
        store.clone(),
        Arc::new(clock.clone()),
        ServiceConfig::default(),
    );
    (store, clock, c)
}

fn hb(epoch: i64, owned: Vec<u32>) -> HeartbeatRequest {
    HeartbeatRequest {
        protocol_version: 1,
        member_id: "m".into(),
        member_epoch: epoch,
        owned_shards: Some(owned),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    }
}

/// One member owning every shard of a group with a 2 s session, heard last at 1 000.
async fn stable_member(c: &Coordinator) -> HeartbeatRequest {
    c.create_group(&CreateGroupRequest {
        shard_count: Some(4),
        session_timeout_ms: Some(2_000),
        heartbeat_interval_ms: Some(100),
        ..CreateGroupRequest::new("g".parse().unwrap(), "s".parse().unwrap())
    })
    .await
    .unwrap();
    let r = c
        .heartbeat(&"g".parse().unwrap(), &hb(0, vec![]))
        .await
        .unwrap();
    let steady = hb(r.member_epoch, r.assignment.clone());
    c.heartbeat(&"g".parse().unwrap(), &steady).await.unwrap();
    steady
}

/// `steady` sent in a task of its own (it may be held by the store).
fn spawn_heartbeat(
    c: &Coordinator,
    steady: &HeartbeatRequest,
) -> tokio::task::JoinHandle<
    Result<rsc_protocol::HeartbeatResponse, rsc_coordinator::service::ServiceError>,
> {
    let (c, steady) = (c.clone(), steady.clone());
    tokio::spawn(async move { c.heartbeat(&"g".parse().unwrap(), &steady).await })
}

/// The member's heartbeat is the only call that sees the store fail (no sweep ran during
/// the outage): its next heartbeat, 2.4 s after the last one recorded, is still accepted.
#[tokio::test]
async fn a_heartbeat_that_found_the_store_down_counts_as_an_outage() {
    let (store, clock, c) = setup();
    let steady = stable_member(&c).await;
    store.layer().frozen.store(true, Ordering::SeqCst);
    clock.set(1_100);
    let held = spawn_heartbeat(&c, &steady);
    store.layer().holding(1).await;
    clock.set(2_100);
    store.layer().fail(0);
    assert!(held.await.unwrap().is_err(), "the store did not answer");
    store.layer().frozen.store(false, Ordering::SeqCst);
    clock.set(3_400);
    let r = c
        .heartbeat(&"g".parse().unwrap(), &steady)
        .await
        .expect("still a member");
    assert_eq!(r.member_epoch, steady.member_epoch);
    assert_eq!(
        c.describe_group(&"g".parse().unwrap())
            .await
            .unwrap()
            .members
            .len(),
        1
    );
}

/// The member's heartbeat is held on the frozen store until its deadline, past the moment
/// the store answered others again (the sweep, on a new master): the outage lasted, for
/// this member, until its call failed, and its retry is judged so.
#[tokio::test]
async fn a_heartbeat_held_across_the_recovery_extends_the_outage() {
    let (store, clock, c) = setup();
    let steady = stable_member(&c).await;
    store.layer().frozen.store(true, Ordering::SeqCst);
    clock.set(1_100);
    let held = spawn_heartbeat(&c, &steady);
    store.layer().holding(1).await;
    clock.set(1_200);
    let sweep = tokio::spawn({
        let c = c.clone();
        async move { c.sweep(&buckets_of(0, 1)).await }
    });
    store.layer().holding(2).await;
    // The sweep's call fails first; then the store answers again.
    clock.set(3_100);
    store.layer().fail(1);
    assert!(sweep.await.unwrap().is_err());
    store.layer().frozen.store(false, Ordering::SeqCst);
    assert_eq!(c.sweep(&buckets_of(0, 1)).await.unwrap(), 0);
    // The heartbeat held since 1 100 fails at its deadline, 2 s after the recovery; others
    // are answered all along (other members' heartbeats, here reads).
    clock.set(5_050);
    c.describe_group(&"g".parse().unwrap()).await.unwrap();
    clock.set(5_100);
    store.layer().fail(0);
    assert!(held.await.unwrap().is_err());
    clock.set(5_150);
    c.describe_group(&"g".parse().unwrap()).await.unwrap();
    // Its retry comes 300 ms later; a sweep runs just before it.
    clock.set(5_400);
    assert_eq!(
        c.sweep(&buckets_of(0, 1)).await.unwrap(),
        0,
        "the member whose heartbeat the outage held was expired"
    );
    let r = c
        .heartbeat(&"g".parse().unwrap(), &steady)
        .await
        .expect("still a member");
    assert_eq!(r.member_epoch, steady.member_epoch);
    // A member that really went silent still expires, a session after the extended outage.
    clock.set(7_500);
    assert_eq!(c.sweep(&buckets_of(0, 1)).await.unwrap(), 1);
}
