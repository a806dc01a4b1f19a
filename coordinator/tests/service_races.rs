//! Races between coordinators sharing one store, replayed deterministically: a store wrapper
//! pauses a chosen write until the test lets it go, and each coordinator has its own clock.

use rsc_coordinator::clock::ManualClock;
use rsc_coordinator::service::{Coordinator, ServiceConfig};
use rsc_coordinator::store::{
    Layered, MemoryStore, MetadataStore, StoreError, StoreLayer, buckets_of,
};
use rsc_protocol::{CreateGroupRequest, HeartbeatRequest};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Counts the locks and group writes of the store it wraps, and can hold the next group
/// write until released.
#[derive(Debug, Default)]
struct Gate {
    hold_next_write: AtomicBool,
    reached: Notify,
    release: Notify,
    locks: AtomicUsize,
    group_writes: AtomicUsize,
}

impl StoreLayer for Gate {
    async fn around<T: Send>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        match operation {
            "lock" => {
                self.locks.fetch_add(1, Ordering::SeqCst);
            }
            "put_group" | "put_group_live" => {
                if self.hold_next_write.swap(false, Ordering::SeqCst) {
                    self.reached.notify_one();
                    self.release.notified().await;
                }
                self.group_writes.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        call.await
    }
}

/// A [`MemoryStore`] behind a [`Gate`].
type GatedStore = Layered<Gate>;

fn gated_store() -> Arc<GatedStore> {
    Arc::new(Layered::with_layer(
        Arc::new(MemoryStore::new()),
        Gate::default(),
    ))
}

/// Every bucket of the deadline index (one coordinator sweeping alone).
fn all_buckets() -> Vec<u32> {
    buckets_of(0, 1)
}

fn coordinator(store: &Arc<GatedStore>, clock: &ManualClock) -> Coordinator {
    Coordinator::new(
        store.clone(),
        Arc::new(clock.clone()),
        ServiceConfig::default(),
    )
}

fn hb(member: &str, epoch: i64, owned: Vec<u32>) -> HeartbeatRequest {
    HeartbeatRequest {
        protocol_version: 1,
        member_id: member.into(),
        member_epoch: epoch,
        owned_shards: Some(owned),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    }
}

async fn stable_member(c: &Coordinator, session_timeout_ms: u64) -> (i64, Vec<u32>) {
    c.create_group(&CreateGroupRequest {
        group: "g".parse().unwrap(),
        stream: "s".parse().unwrap(),
        shard_count: Some(4),
        start: None,
        session_timeout_ms: Some(session_timeout_ms),
        heartbeat_interval_ms: Some(100),
        rebalance_timeout_ms: None,
        max_members: None,
        assignor: None,
        fencing: None,
        ordering: None,
        retention: None,
    })
    .await
    .unwrap();
    let r = c
        .heartbeat(&"g".parse().unwrap(), &hb("m", 0, vec![]))
        .await
        .unwrap();
    // The first heartbeat reporting the granted shards records them (a write); from then on
    // the member is steady.
    let r2 = c
        .heartbeat(
            &"g".parse().unwrap(),
            &hb("m", r.member_epoch, r.assignment.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        (r2.member_epoch, &r2.assignment),
        (r.member_epoch, &r.assignment)
    );
    (r.member_epoch, r.assignment)
}

#[tokio::test]
async fn steady_heartbeat_takes_no_lock_and_writes_nothing() {
    let store = gated_store();
    let clock = ManualClock::new(1_000);
    let c = coordinator(&store, &clock);
    let (epoch, owned) = stable_member(&c, 10_000).await;
    let (locks, writes) = (
        store.layer().locks.load(Ordering::SeqCst),
        store.layer().group_writes.load(Ordering::SeqCst),
    );
    for _ in 0..5 {
        clock.advance(100);
        let r = c
            .heartbeat(&"g".parse().unwrap(), &hb("m", epoch, owned.clone()))
            .await
            .unwrap();
        assert_eq!((r.member_epoch, &r.assignment), (epoch, &owned));
    }
    assert_eq!(
        store.layer().locks.load(Ordering::SeqCst),
        locks,
        "no lock taken"
    );
    assert_eq!(
        store.layer().group_writes.load(Ordering::SeqCst),
        writes,
        "no write"
    );
    assert_eq!(store.liveness("g").await.unwrap()["m"], 1_500);
    // Anything that changes state takes the full path.
    c.heartbeat(&"g".parse().unwrap(), &hb("m", epoch, vec![]))
        .await
        .unwrap();
    assert!(store.layer().locks.load(Ordering::SeqCst) > locks);
}

/// The lost-update race of a lock-free heartbeat: coordinator A's sweep (its clock ahead)
/// reads the member as silent and is about to write it out; coordinator B (clock behind)
/// answers the member's steady heartbeat meanwhile. The member must not end up told
/// "alive" and removed: A's write loses, A rereads, and the member stays.
#[tokio::test]
async fn a_sweep_never_removes_a_member_a_steady_heartbeat_just_kept() {
    let store = gated_store();
    let clock_b = ManualClock::new(1_000);
    let b = coordinator(&store, &clock_b);
    let (epoch, owned) = stable_member(&b, 1_000).await;
    // A's clock is 1.5 s ahead: to A, the member has been silent longer than its session.
    let clock_a = ManualClock::new(2_500);
    let a = coordinator(&store, &clock_a);
    store.layer().hold_next_write.store(true, Ordering::SeqCst);
    let sweep = tokio::spawn({
        let a = a.clone();
        async move { a.sweep(&all_buckets()).await }
    });
    store.layer().reached.notified().await;
    // A holds the group lock and has decided; B answers a steady heartbeat without a lock.
    clock_b.advance(900);
    let r = b
        .heartbeat(&"g".parse().unwrap(), &hb("m", epoch, owned.clone()))
        .await
        .expect("the member is alive for B");
    assert_eq!(r.assignment, owned);
    store.layer().release.notify_one();
    let removed = sweep.await.unwrap().unwrap();
    assert_eq!(
        removed, 0,
        "A's expiry lost to the heartbeat it had not seen"
    );
    let view = a.describe_group(&"g".parse().unwrap()).await.unwrap();
    assert_eq!(
        view.members.len(),
        1,
        "the member B kept alive is still there"
    );
}

/// Several coordinators sweeping the same expired member: exactly one removes it.
#[tokio::test]
async fn exactly_one_coordinator_expires_a_member() {
    let store = gated_store();
    let clock = ManualClock::new(1_000);
    let first = coordinator(&store, &clock);
    stable_member(&first, 1_000).await;
    clock.advance(5_000);
    let sweepers: Vec<Coordinator> = (0..3).map(|_| coordinator(&store, &clock)).collect();
    let results = futures::future::join_all(
        sweepers
            .iter()
            .map(|c| async move { c.sweep(&all_buckets()).await }),
    )
    .await;
    let removed: usize = results.into_iter().map(Result::unwrap).sum();
    assert_eq!(removed, 1);
    assert!(
        first
            .describe_group(&"g".parse().unwrap())
            .await
            .unwrap()
            .members
            .is_empty()
    );
}

/// 1,000 create / join / delete cycles on the memory store leave it holding what it held
/// before: no tombstone past its retention, no liveness, no deadline-index entry, no lock.
#[tokio::test]
async fn create_delete_cycles_leave_the_memory_store_as_it_was() {
    let store = Arc::new(MemoryStore::new().with_tombstone_retention(std::time::Duration::ZERO));
    let clock = ManualClock::new(1_000);
    let c = Coordinator::new(
        store.clone(),
        Arc::new(clock.clone()),
        ServiceConfig::default(),
    );
    let create = |group: &str| CreateGroupRequest {
        group: group.parse().unwrap(),
        stream: "s".parse().unwrap(),
        shard_count: Some(2),
        start: None,
        session_timeout_ms: None,
        heartbeat_interval_ms: None,
        rebalance_timeout_ms: None,
        max_members: None,
        assignor: None,
        fencing: None,
        ordering: None,
        retention: None,
    };
    c.create_group(&create("base")).await.unwrap();
    c.heartbeat(&"base".parse().unwrap(), &hb("m", 0, vec![]))
        .await
        .unwrap();
    let start = store.footprint();
    for i in 0..1_000 {
        let group = format!("c{i}");
        c.create_group(&create(&group)).await.unwrap();
        c.heartbeat(&group.parse().unwrap(), &hb("m", 0, vec![]))
            .await
            .unwrap();
        c.delete_group(&group.parse().unwrap(), true).await.unwrap();
        clock.advance(1);
    }
    assert_eq!(store.footprint(), start);
}
