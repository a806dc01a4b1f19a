//! The `MetadataStore` contract, run against every store: in memory, a real standalone
//! Redis and a real 3-node Redis Cluster. The stores must behave identically.

use rsc_coordinator::engine::{GroupConfig, GroupDoc, StreamDoc};
use rsc_coordinator::revisions::{Actor, Cause};
use rsc_coordinator::store::{
    DocKind, LivenessChange, LockResource, MemoryStore, MetadataStore, Note, RedisStore,
    RedisStoreConfig, SteadyTouch, StoreError, TouchOutcome, buckets_of, due_bucket,
};
use rsc_redis::RedisSettings;
use rsc_testkit::{RedisCluster, RedisServer};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    Redis,
    Cluster,
}

struct Fixture {
    store: Arc<dyn MetadataStore>,
    _redis: Option<RedisServer>,
}

fn unique_prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "contract-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

async fn fixture(kind: Kind) -> Fixture {
    match kind {
        Kind::Memory => Fixture {
            store: Arc::new(MemoryStore::new()),
            _redis: None,
        },
        Kind::Redis => {
            let redis = RedisServer::start().expect("redis starts");
            let store = redis_store(vec![redis.url()], false, RedisStoreConfig::default()).await;
            Fixture {
                store: Arc::new(store),
                _redis: Some(redis),
            }
        }
        Kind::Cluster => {
            let cluster = RedisCluster::shared().expect("cluster starts");
            let store = redis_store(cluster.urls(), true, RedisStoreConfig::default()).await;
            Fixture {
                store: Arc::new(store),
                _redis: None,
            }
        }
    }
}

async fn redis_store(urls: Vec<String>, cluster: bool, base: RedisStoreConfig) -> RedisStore {
    RedisStore::open(RedisStoreConfig {
        redis: RedisSettings {
            url: Some(urls.join(",").into()),
            cluster,
            ..RedisSettings::default()
        },
        key_prefix: unique_prefix(),
        ..base
    })
    .await
    .expect("store opens")
}

/// A Redis store on `redis` with the default key prefix `rsc`, as PROTOCOL §2 writes the keys.
async fn spec_store(redis: &RedisServer) -> RedisStore {
    RedisStore::open(RedisStoreConfig {
        redis: url(redis.url()),
        key_prefix: "rsc".into(),
        ..RedisStoreConfig::default()
    })
    .await
    .expect("store opens")
}

fn docs(group: &str, stream: &str) -> (GroupDoc, StreamDoc) {
    let s = StreamDoc::new(stream, 4, 0).unwrap();
    (GroupDoc::new(group, GroupConfig::default(), &s, 0), s)
}

fn note() -> Note {
    Note::blank()
}

fn is_conflict<T: std::fmt::Debug>(r: Result<T, StoreError>) -> bool {
    matches!(r, Err(e) if e.is_conflict())
}

async fn documents_are_compare_and_set(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (mut g, mut s) = docs("billing", "orders");
    assert_eq!(st.load_group("billing").await.unwrap(), None);
    assert_eq!(
        st.group_revision("billing").await.unwrap(),
        None,
        "a tombstone has no revision to offer"
    );
    assert_eq!(st.put_stream(&s, 0, &note()).await.unwrap(), 1);
    assert_eq!(st.put_group(&g, 0, &note()).await.unwrap(), 1);
    assert!(
        is_conflict(st.put_group(&g, 0, &note()).await),
        "create of an existing group"
    );
    g.group_epoch = 7;
    assert_eq!(st.put_group(&g, 1, &note()).await.unwrap(), 2);
    assert!(
        is_conflict(st.put_group(&g, 1, &note()).await),
        "stale revision"
    );
    let v = st.load_group("billing").await.unwrap().unwrap();
    assert_eq!((v.revision, v.doc.group_epoch), (2, 7));
    assert_eq!(v.doc, g);
    s.shard_count = 8;
    assert!(is_conflict(st.put_stream(&s, 0, &note()).await));
    assert_eq!(st.put_stream(&s, 1, &note()).await.unwrap(), 2);
    assert_eq!(st.stream_revision("orders").await.unwrap(), Some(2));
    assert_eq!(st.stream_revision("nope").await.unwrap(), None);
    assert_eq!(st.group_revision("billing").await.unwrap(), Some(2));
    assert_eq!(st.group_revision("nope").await.unwrap(), None);
    assert_eq!(
        st.load_stream("orders")
            .await
            .unwrap()
            .unwrap()
            .doc
            .shard_count,
        8
    );

    let (a, _) = docs("alpha", "orders");
    st.put_group(&a, 0, &note()).await.unwrap();
    assert_eq!(st.list_groups().await.unwrap(), ["alpha", "billing"]);
    assert_eq!(st.list_streams().await.unwrap(), ["orders"]);

    assert!(is_conflict(st.delete_group("billing", 1).await));
    st.delete_group("billing", 2).await.unwrap();
    assert_eq!(st.load_group("billing").await.unwrap(), None);
    assert_eq!(st.list_groups().await.unwrap(), ["alpha"]);
    // A deleted group can be created again; its revisions go on from where the deleted one
    // stopped (+1 for the deletion), so that no revision names two documents.
    assert!(
        is_conflict(st.put_group(&g, 3, &note()).await),
        "the tombstone is not a document"
    );
    assert_eq!(st.put_group(&g, 0, &note()).await.unwrap(), 4);
    assert_eq!(st.load_group("billing").await.unwrap().unwrap().revision, 4);
    assert_eq!(st.list_groups().await.unwrap(), ["alpha", "billing"]);
    assert_eq!(
        st.touch_if("billing", 2, "m", 1, None).await.unwrap(),
        TouchOutcome::Stale,
        "a revision of the deleted group"
    );
    assert!(st.ping().await.is_ok());
}

/// Records that `member` of `group` was heard from at `now_ms`: a touch at the group's
/// current revision, which creates a missing liveness.
async fn touch(st: &dyn MetadataStore, group: &str, member: &str, now_ms: u64) {
    let revision = st
        .group_revision(group)
        .await
        .unwrap()
        .expect("the group exists");
    assert_eq!(
        st.touch_if(group, revision, member, now_ms, None)
            .await
            .unwrap(),
        TouchOutcome::Touched
    );
}

async fn liveness_moves_strictly_forward(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (g, _) = docs("g", "s");
    st.put_group(&g, 0, &note()).await.unwrap();
    touch(st.as_ref(), "g", "m1", 1_000).await;
    touch(st.as_ref(), "g", "m1", 1_000).await;
    touch(st.as_ref(), "g", "m1", 900).await;
    touch(st.as_ref(), "g", "m2", 5_000).await;
    let live = st.liveness("g").await.unwrap();
    assert_eq!(
        live["m1"], 1_002,
        "every touch moves liveness forward by at least 1 ms"
    );
    assert_eq!(live["m2"], 5_000);
    touch(st.as_ref(), "g", "m1", 2_000).await;
    let (v, live) = st.load_group_live("g").await.unwrap().unwrap();
    assert_eq!(v.revision, 1);
    assert_eq!(live["m1"], 2_000);
    let forget_m2 = LivenessChange {
        forget: vec!["m2".to_owned()],
        ..LivenessChange::default()
    };
    assert_eq!(
        st.put_group_live(&g, 1, &forget_m2, &note()).await.unwrap(),
        2
    );
    assert!(!st.liveness("g").await.unwrap().contains_key("m2"));
    assert!(st.load_group_live("absent").await.unwrap().is_none());
    st.delete_group("g", 2).await.unwrap();
    assert!(
        st.liveness("g").await.unwrap().is_empty(),
        "deleted with the group"
    );
}

async fn touch_if_requires_the_revision_and_a_live_session(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (g, _) = docs("g", "s");
    assert_eq!(
        st.touch_if("g", 0, "m", 1_000, None).await.unwrap(),
        TouchOutcome::Stale,
        "no document"
    );
    st.put_group(&g, 0, &note()).await.unwrap();
    assert_eq!(
        st.touch_if("g", 2, "m", 1_000, None).await.unwrap(),
        TouchOutcome::Stale
    );
    assert_eq!(
        st.touch_if("g", 1, "m", 1_000, Some(500)).await.unwrap(),
        TouchOutcome::NotLive,
        "no liveness yet"
    );
    assert!(
        st.liveness("g").await.unwrap().is_empty(),
        "nothing written"
    );
    assert_eq!(
        st.touch_if("g", 1, "m", 1_000, None).await.unwrap(),
        TouchOutcome::Touched
    );
    assert_eq!(
        st.touch_if("g", 1, "m", 1_500, Some(500)).await.unwrap(),
        TouchOutcome::Touched
    );
    assert_eq!(
        st.touch_if("g", 1, "m", 2_001, Some(500)).await.unwrap(),
        TouchOutcome::NotLive,
        "silent for 501 ms > 500"
    );
    assert_eq!(st.liveness("g").await.unwrap()["m"], 1_500);
    assert_eq!(
        st.touch_if("g", 1, "m", 1_500, Some(500)).await.unwrap(),
        TouchOutcome::Touched
    );
    assert_eq!(st.liveness("g").await.unwrap()["m"], 1_501);
}

async fn touch_steady_requires_both_revisions(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (g, mut s) = docs("g", "s");
    st.put_stream(&s, 0, &note()).await.unwrap();
    st.put_group(&g, 0, &note()).await.unwrap();
    touch(st.as_ref(), "g", "m", 1_000).await;
    let t = SteadyTouch {
        group: "g",
        revision: 1,
        stream: "s",
        stream_revision: 1,
        member: "m",
        now_ms: 1_100,
        max_silence_ms: 500,
    };
    assert_eq!(st.touch_steady(&t).await.unwrap(), TouchOutcome::Touched);
    assert_eq!(st.liveness("g").await.unwrap()["m"], 1_100);
    let again = SteadyTouch { now_ms: 1_050, ..t };
    assert_eq!(
        st.touch_steady(&again).await.unwrap(),
        TouchOutcome::Touched
    );
    assert_eq!(
        st.liveness("g").await.unwrap()["m"],
        1_101,
        "a steady touch moves liveness forward by at least 1 ms too"
    );
    let at_the_limit = SteadyTouch { now_ms: 1_601, ..t };
    assert_eq!(
        st.touch_steady(&at_the_limit).await.unwrap(),
        TouchOutcome::Touched,
        "silent for exactly 500 ms: still live"
    );
    assert_eq!(st.liveness("g").await.unwrap()["m"], 1_601);
    let t = SteadyTouch { now_ms: 1_700, ..t };
    assert_eq!(st.touch_steady(&t).await.unwrap(), TouchOutcome::Touched);
    let silent = SteadyTouch { now_ms: 2_201, ..t };
    assert_eq!(
        st.touch_steady(&silent).await.unwrap(),
        TouchOutcome::NotLive
    );
    let stranger = SteadyTouch { member: "x", ..t };
    assert_eq!(
        st.touch_steady(&stranger).await.unwrap(),
        TouchOutcome::NotLive
    );
    s.shard_count = 8;
    st.put_stream(&s, 1, &note()).await.unwrap();
    let later = SteadyTouch { now_ms: 1_800, ..t };
    assert_eq!(
        st.touch_steady(&later).await.unwrap(),
        TouchOutcome::Stale,
        "the stream moved on"
    );
    assert_eq!(
        st.touch_steady(&SteadyTouch {
            stream_revision: 2,
            ..later
        })
        .await
        .unwrap(),
        TouchOutcome::Touched
    );
    assert_eq!(
        st.touch_steady(&SteadyTouch {
            revision: 2,
            stream_revision: 2,
            ..later
        })
        .await
        .unwrap(),
        TouchOutcome::Stale,
        "the group is at revision 1"
    );
}

/// A group's liveness lists its members and nothing else, at every size (the Redis store
/// pads the sorted set of a group of 16 members or more: `lua/liveness_pad.lua`), whichever
/// write touched them, and however many leave again.
async fn liveness_lists_only_members_at_any_size(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (g, s) = docs("g", "s");
    st.put_stream(&s, 0, &note()).await.unwrap();
    st.put_group(&g, 0, &note()).await.unwrap();
    let members: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    for (i, m) in members.iter().enumerate() {
        touch(st.as_ref(), "g", m, 1_000 + i as u64).await;
        let live = st.liveness("g").await.unwrap();
        assert_eq!(live.len(), i + 1, "{live:?}");
    }
    let joined = LivenessChange {
        touch: Some(("late".to_owned(), 2_000)),
        ..LivenessChange::default()
    };
    assert_eq!(st.put_group_live(&g, 1, &joined, &note()).await.unwrap(), 2);
    let (_, live) = st.load_group_live("g").await.unwrap().unwrap();
    assert_eq!(live.len(), 41, "{live:?}");
    assert_eq!(live["late"], 2_000);
    assert!(live.values().all(|&t| (1_000..=2_000).contains(&t)));
    for m in &members {
        let t = SteadyTouch {
            group: "g",
            revision: 2,
            stream: "s",
            stream_revision: 1,
            member: m,
            now_ms: 1_500,
            max_silence_ms: 10_000,
        };
        assert_eq!(st.touch_steady(&t).await.unwrap(), TouchOutcome::Touched);
    }
    assert!(st.liveness("g").await.unwrap()["m0"] == 1_500);
    let all_leave = LivenessChange {
        forget: members.iter().cloned().chain(["late".to_owned()]).collect(),
        ..LivenessChange::default()
    };
    assert_eq!(
        st.put_group_live(&g, 2, &all_leave, &note()).await.unwrap(),
        3
    );
    assert!(st.liveness("g").await.unwrap().is_empty());
    assert!(st.load_group_live("g").await.unwrap().unwrap().1.is_empty());
}

/// Many steady touches at once (the Redis store sends them in batches): each gets its own
/// answer.
async fn concurrent_steady_touches_each_get_their_answer(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (g, s) = docs("g", "s");
    st.put_stream(&s, 0, &note()).await.unwrap();
    st.put_group(&g, 0, &note()).await.unwrap();
    for i in 0..100 {
        if i % 3 != 0 {
            touch(st.as_ref(), "g", &format!("m{i}"), 1_000).await;
        }
    }
    let members: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    let outcomes = futures::future::join_all(members.iter().enumerate().map(|(i, m)| async move {
        st.touch_steady(&SteadyTouch {
            group: "g",
            revision: if i % 5 == 0 { 7 } else { 1 },
            stream: "s",
            stream_revision: 1,
            member: m,
            now_ms: 1_200,
            max_silence_ms: 500,
        })
        .await
    }))
    .await;
    let live = st.liveness("g").await.unwrap();
    for (i, o) in outcomes.into_iter().enumerate() {
        let want = if i % 5 == 0 {
            TouchOutcome::Stale
        } else if i % 3 == 0 {
            TouchOutcome::NotLive
        } else {
            TouchOutcome::Touched
        };
        assert_eq!(o.unwrap(), want, "m{i}");
        let expect_live = match want {
            TouchOutcome::Touched => Some(1_200),
            TouchOutcome::Stale if i % 3 != 0 => Some(1_000),
            _ => None,
        };
        assert_eq!(live.get(&format!("m{i}")).copied(), expect_live, "m{i}");
    }
}

/// The race a steady heartbeat could lose against an expiry: the expiry read the liveness,
/// the heartbeat touched it, the expiry writes. The write must lose.
async fn expiry_loses_to_a_heartbeat_it_did_not_see(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (mut g, _) = docs("g", "s");
    st.put_group(&g, 0, &note()).await.unwrap();
    touch(st.as_ref(), "g", "silent", 1_000).await;
    touch(st.as_ref(), "g", "other", 1_000).await;
    let (_, seen) = st.load_group_live("g").await.unwrap().unwrap();
    // A steady heartbeat of `silent` lands between the read and the write.
    assert_eq!(
        st.touch_if("g", 1, "silent", 1_000, Some(45_000))
            .await
            .unwrap(),
        TouchOutcome::Touched
    );
    g.group_epoch += 1;
    let change = LivenessChange {
        expired: vec![("silent".into(), seen["silent"])],
        forget: vec!["silent".into()],
        touch: None,
    };
    assert!(is_conflict(
        st.put_group_live(&g, 1, &change, &note()).await
    ));
    let (v, live) = st.load_group_live("g").await.unwrap().unwrap();
    assert_eq!(v.revision, 1, "nothing written");
    assert!(live.contains_key("silent"));
    // With the liveness it really has, the expiry goes through, and forgets it atomically.
    let change = LivenessChange {
        expired: vec![("silent".into(), live["silent"])],
        forget: vec!["silent".into()],
        touch: Some(("other".into(), 2_000)),
    };
    assert_eq!(st.put_group_live(&g, 1, &change, &note()).await.unwrap(), 2);
    let (v, live) = st.load_group_live("g").await.unwrap().unwrap();
    assert_eq!(v.doc.group_epoch, g.group_epoch);
    assert!(!live.contains_key("silent"));
    assert_eq!(live["other"], 2_000);
    // And a heartbeat computed on the old revision can no longer touch.
    assert_eq!(
        st.touch_if("g", 1, "other", 3_000, Some(45_000))
            .await
            .unwrap(),
        TouchOutcome::Stale
    );
}

async fn locks_exclude_and_release_on_drop(kind: Kind) {
    let f = fixture(kind).await;
    let st = f.store.clone();
    let g = LockResource::Group("g".into());
    let first = st.lock(&g).await.unwrap();
    // Another resource is independent: a stream and a group of the same name too.
    let _s = st.lock(&LockResource::Stream("g".into())).await.unwrap();
    let _h = st.lock(&LockResource::Group("h".into())).await.unwrap();
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let st2 = st.clone();
    let g2 = g.clone();
    let waiter = tokio::spawn(async move {
        let guard = st2.lock(&g2).await;
        let _ = tx.send(());
        guard.map(drop)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err(), "the second lock waits");
    drop(first);
    waiter.await.unwrap().expect("acquired after release");
}

async fn audit_log_is_newest_first_and_filtered(kind: Kind) {
    use rsc_coordinator::store::{AuditFilter, AuditLog};
    use rsc_protocol::{AuditEntry, AuditRequest, AuditResult, AuditTarget};
    let f = fixture(kind).await;
    let entry = |i: u64| AuditEntry {
        client_addr: None,
        count: None,
        since_ms: None,
        credential: None,
        time_ms: i,
        principal: "ops".into(),
        action: "group.update".into(),
        target: AuditTarget {
            group: Some(if i.is_multiple_of(2) { "even" } else { "odd" }.into()),
            ..AuditTarget::default()
        },
        request: AuditRequest {
            method: "PATCH".into(),
            path: "/v1/groups/x".into(),
            query: None,
            body: None,
        },
        result: AuditResult {
            status: 200,
            code: None,
        },
        revisions: vec![],
    };
    // More than one page of the Redis store's reverse scan.
    for i in 0..250 {
        f.store
            .append_audit(AuditLog::Mutations, &entry(i))
            .await
            .unwrap();
    }
    // The refusals are another log (PROTOCOL §7): kept apart, read apart.
    for i in 1000..1003 {
        f.store
            .append_audit(AuditLog::Refusals, &entry(i))
            .await
            .unwrap();
    }
    let all = f
        .store
        .read_audit(AuditLog::Mutations, 1000, &AuditFilter::default())
        .await
        .unwrap();
    let times: Vec<u64> = all.iter().map(|e| e.time_ms).collect();
    assert_eq!(times, (0..250).rev().collect::<Vec<_>>());
    let refusals = f
        .store
        .read_audit(AuditLog::Refusals, 1000, &AuditFilter::default())
        .await
        .unwrap();
    let times: Vec<u64> = refusals.iter().map(|e| e.time_ms).collect();
    assert_eq!(times, vec![1002, 1001, 1000]);
    let odd = AuditFilter {
        group: Some("odd".into()),
        stream: None,
    };
    let times: Vec<u64> = f
        .store
        .read_audit(AuditLog::Mutations, 3, &odd)
        .await
        .unwrap()
        .iter()
        .map(|e| e.time_ms)
        .collect();
    assert_eq!(times, vec![249, 247, 245]);
    let odd_all = f
        .store
        .read_audit(AuditLog::Mutations, 1000, &odd)
        .await
        .unwrap();
    assert_eq!(odd_all.len(), 125);
    assert_eq!(odd_all.last().unwrap().time_ms, 1);
}

async fn deadline_index_is_lowered_by_writes_and_claimed_once(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (g, s) = docs("g", "s");
    st.put_stream(&s, 0, &note()).await.unwrap();
    let r1 = st.put_group(&g, 0, &note()).await.unwrap();
    let all = buckets_of(0, 1);
    let claim = |now: u64| st.claim_due(&all, now, 1_000, 100);
    assert!(
        claim(10_000).await.unwrap().is_empty(),
        "nothing indexed yet"
    );
    st.lower_deadline("g", r1, 5_000).await.unwrap();
    st.lower_deadline("g", r1, 7_000).await.unwrap();
    assert!(
        claim(4_999).await.unwrap().is_empty(),
        "a write never moves it later"
    );
    assert_eq!(claim(5_000).await.unwrap(), vec!["g".to_owned()]);
    assert!(
        claim(5_500).await.unwrap().is_empty(),
        "a claimed group is not claimed again while the claim lasts"
    );
    assert_eq!(
        claim(6_000).await.unwrap(),
        vec!["g".to_owned()],
        "a claim that lapsed (its sweeper died) is due again"
    );
    // A write at a newer revision: a sweeper that computed from the older one cannot raise.
    let r2 = st.put_group(&g, r1, &note()).await.unwrap();
    st.lower_deadline("g", r2, 20_000).await.unwrap();
    assert!(!st.reschedule("g", r1, Some(50_000)).await.unwrap());
    assert_eq!(claim(7_000).await.unwrap(), vec!["g".to_owned()]);
    assert!(st.reschedule("g", r2, Some(50_000)).await.unwrap());
    assert!(claim(49_999).await.unwrap().is_empty(), "rescheduled later");
    assert_eq!(claim(50_000).await.unwrap(), vec!["g".to_owned()]);
    assert!(st.reschedule("g", r2, None).await.unwrap());
    assert!(claim(u64::MAX / 2).await.unwrap().is_empty(), "removed");
    // Buckets: only the group's own bucket yields it.
    st.lower_deadline("g", r2, 1).await.unwrap();
    let mine = due_bucket("g");
    let others: Vec<u32> = all.iter().copied().filter(|b| *b != mine).collect();
    assert!(st.claim_due(&others, 100, 1, 10).await.unwrap().is_empty());
    assert_eq!(
        st.claim_due(&[mine], 100, 1, 10).await.unwrap(),
        vec!["g".to_owned()]
    );
    // Deleting the group removes its entry.
    st.lower_deadline("g", r2, 1).await.unwrap();
    st.delete_group("g", r2).await.unwrap();
    assert!(claim(u64::MAX / 2).await.unwrap().is_empty());
}

async fn concurrent_claims_share_out_due_groups(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (_, s) = docs("x", "s");
    st.put_stream(&s, 0, &note()).await.unwrap();
    for i in 0..40 {
        let (g, _) = docs(&format!("g{i}"), "s");
        let r = st.put_group(&g, 0, &note()).await.unwrap();
        st.lower_deadline(&g.group, r, 1_000 + i).await.unwrap();
    }
    let all = buckets_of(0, 1);
    let claims =
        futures::future::join_all((0..4).map(|_| st.claim_due(&all, 2_000, 60_000, 1_000))).await;
    let mut claimed: Vec<String> = claims.into_iter().flat_map(Result::unwrap).collect();
    claimed.sort();
    let before = claimed.len();
    claimed.dedup();
    assert_eq!(before, claimed.len(), "no group claimed twice");
    assert_eq!(claimed.len(), 40, "every due group claimed");
}

async fn coordinators_register_and_lapse(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    assert_eq!(
        st.register_coordinator("b", 1_000, 3_000).await.unwrap(),
        ["b"]
    );
    assert_eq!(
        st.register_coordinator("a", 1_500, 3_000).await.unwrap(),
        ["a", "b"]
    );
    assert_eq!(
        st.register_coordinator("a", 4_500, 3_000).await.unwrap(),
        ["a"],
        "b did not renew within its time to live"
    );
}

/// Each document write appends one record with the committed revision, in the same step;
/// the history is bounded by count and by age, kept per document, and deleted with the group.
async fn every_write_appends_one_revision_record(kind: Kind) {
    let f = fixture(kind).await;
    let st = &f.store;
    let (mut g, s) = docs("hist", "hs");
    let by = |t: u64, e: u64| {
        let before = serde_json::json!({"group_epoch": e - 1});
        let after = serde_json::json!({"group_epoch": e});
        Note::of(&Actor::coordinator(Cause::Sweep), t, Some(&before), &after).unwrap()
    };
    st.put_stream(&s, 0, &note()).await.unwrap();
    let mut revision = st.put_group(&g, 0, &by(1_000, 1)).await.unwrap();
    // The default retention keeps 1000 records and 7 days; a write 8 days later drops the
    // older ones, and at most 1000 are kept.
    for e in 2..=5u64 {
        g.group_epoch = e;
        revision = st.put_group(&g, revision, &by(1_000 + e, e)).await.unwrap();
    }
    let recs = st.read_revisions(DocKind::Group, "hist").await.unwrap();
    let revs: Vec<u64> = recs.iter().map(|r| r.revision).collect();
    assert_eq!(revs, [1, 2, 3, 4, 5], "oldest first, one per write");
    assert_eq!(recs[4].cause, Cause::Sweep);
    assert_eq!(recs[4].changes[0].new, Some(serde_json::json!(5)));
    let late = 1_000 + 8 * 86_400_000;
    g.group_epoch = 6;
    st.put_group_live(&g, revision, &LivenessChange::default(), &by(late, 6))
        .await
        .unwrap();
    let recs = st.read_revisions(DocKind::Group, "hist").await.unwrap();
    assert_eq!(recs.len(), 1, "records older than the max age are dropped");
    assert_eq!(recs[0].revision, 6);
    let streams = st.read_revisions(DocKind::Stream, "hs").await.unwrap();
    assert_eq!(streams.len(), 1, "the stream's history is its own");
    assert!(is_conflict(st.put_group(&g, 1, &by(late, 7)).await));
    assert_eq!(
        st.read_revisions(DocKind::Group, "hist")
            .await
            .unwrap()
            .len(),
        1,
        "a refused write appends nothing"
    );
    st.delete_group("hist", 6).await.unwrap();
    assert!(
        st.read_revisions(DocKind::Group, "hist")
            .await
            .unwrap()
            .is_empty()
    );
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod memory { $( #[tokio::test] async fn $name() { super::$name(super::Kind::Memory).await; } )* }
        mod redis { $( #[tokio::test] async fn $name() { super::$name(super::Kind::Redis).await; } )* }
        mod cluster { $( #[tokio::test] async fn $name() { super::$name(super::Kind::Cluster).await; } )* }
    };
}

contract!(
    documents_are_compare_and_set,
    liveness_moves_strictly_forward,
    touch_if_requires_the_revision_and_a_live_session,
    touch_steady_requires_both_revisions,
    concurrent_steady_touches_each_get_their_answer,
    expiry_loses_to_a_heartbeat_it_did_not_see,
    locks_exclude_and_release_on_drop,
    audit_log_is_newest_first_and_filtered,
    deadline_index_is_lowered_by_writes_and_claimed_once,
    concurrent_claims_share_out_due_groups,
    coordinators_register_and_lapse,
    liveness_lists_only_members_at_any_size,
    every_write_appends_one_revision_record,
);

/// A deleted group's tombstone is collected after the retention, and a group created again
/// under the name afterwards does not inherit its expiry.
#[tokio::test]
async fn redis_tombstones_expire_and_a_recreated_group_persists() {
    let redis = RedisServer::start().unwrap();
    let store = RedisStore::open(RedisStoreConfig {
        redis: url(redis.url()),
        key_prefix: "rsc".into(),
        tombstone_retention: Duration::from_millis(300),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    let (g, s) = docs("billing", "orders");
    store.put_stream(&s, 0, &note()).await.unwrap();
    let r = store.put_group(&g, 0, &note()).await.unwrap();
    store.delete_group("billing", r).await.unwrap();
    // Re-created within the retention: the revision sequence goes on, and no expiry is left.
    let r = store.put_group(&g, 0, &note()).await.unwrap();
    assert_eq!(r, 3, "continues after the tombstone (1, deleted at 2)");
    assert!(
        redis
            .command("PTTL rsc:group:{billing}")
            .unwrap()
            .contains(":-1")
    );
    store.delete_group("billing", r).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis
        .command("EXISTS rsc:group:{billing}")
        .unwrap()
        .contains(":1")
    {
        assert!(
            Instant::now() < deadline,
            "the tombstone was never collected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.put_group(&g, 0, &note()).await.unwrap(), 1);
}

// ---- Redis only: lock bounds, outage and recovery, cluster-mode checks ----

/// The liveness of a group of 16 members or more is padded into Redis' skiplist encoding
/// (`lua/liveness_pad.lua`), by a join's write as by a touch; a smaller one is left compact.
#[tokio::test]
async fn redis_liveness_of_16_members_or_more_is_a_skiplist() {
    let redis = RedisServer::start().unwrap();
    let store = spec_store(&redis).await;
    let encoding = |group: &str| {
        redis
            .command(&format!("OBJECT ENCODING rsc:live:{{{group}}}"))
            .unwrap()
    };
    for (group, by_join) in [("touched", false), ("joined", true)] {
        let (g, _) = docs(group, "s");
        let mut revision = store.put_group(&g, 0, &note()).await.unwrap();
        for i in 0..16 {
            if i == 15 {
                assert!(encoding(group).contains("listpack"), "{}", encoding(group));
            }
            let member = format!("m{i}");
            if by_join {
                let joined = LivenessChange {
                    touch: Some((member, 1_000)),
                    ..LivenessChange::default()
                };
                revision = store
                    .put_group_live(&g, revision, &joined, &note())
                    .await
                    .unwrap();
            } else {
                touch(&store, group, &member, 1_000).await;
            }
        }
        assert!(encoding(group).contains("skiplist"), "{}", encoding(group));
        assert!(
            redis
                .command(&format!("ZCARD rsc:live:{{{group}}}"))
                .unwrap()
                .contains(":17"),
            "16 members and the padding"
        );
        assert_eq!(store.liveness(group).await.unwrap().len(), 16);
    }
}

#[tokio::test]
async fn redis_lock_wait_is_bounded_and_an_abandoned_lock_expires() {
    let redis = RedisServer::start().unwrap();
    let store = redis_store(
        vec![redis.url()],
        false,
        RedisStoreConfig {
            lock_hold: Duration::from_millis(400),
            lock_wait: Duration::from_millis(150),
            ..RedisStoreConfig::default()
        },
    )
    .await;
    let g = LockResource::Group("g".into());
    // A holder that never releases (a crashed coordinator).
    std::mem::forget(store.lock(&g).await.unwrap());
    let t = Instant::now();
    let err = store.lock(&g).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "bounded wait");
    // After the hold time it is free again (each try waits at most the 150 ms lock wait).
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.lock(&g).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the abandoned lock never expired"
        );
    }
}

#[tokio::test]
async fn redis_lock_release_only_deletes_its_own_token() {
    let redis = RedisServer::start().unwrap();
    let config = RedisStoreConfig {
        redis: url(redis.url()),
        key_prefix: unique_prefix(),
        lock_hold: Duration::from_millis(100),
        lock_wait: Duration::from_millis(1000),
        ..RedisStoreConfig::default()
    };
    let slow = RedisStore::open(config.clone()).await.unwrap();
    let other = RedisStore::open(RedisStoreConfig {
        lock_hold: Duration::from_secs(5),
        lock_wait: Duration::from_millis(40),
        ..config
    })
    .await
    .unwrap();
    let g = LockResource::Group("g".into());
    let stale = slow.lock(&g).await.unwrap();
    // Taken over once the 100 ms hold lapsed (each try waits at most 40 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    let _current = loop {
        match other.lock(&g).await {
            Ok(current) => break current,
            Err(e) => assert!(Instant::now() < deadline, "never taken over: {e}"),
        }
    };
    // The first holder's lock expired; releasing it must not free the current holder's.
    drop(stale);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = other.lock(&g).await.unwrap_err();
    assert!(err.is_unavailable(), "still held: {err}");
}

#[tokio::test]
async fn redis_outage_fails_fast_and_recovers() {
    let mut redis = RedisServer::start().unwrap();
    let store = redis_store(vec![redis.url()], false, RedisStoreConfig::default()).await;
    let (g, _) = docs("g", "s");
    store.put_group(&g, 0, &note()).await.unwrap();
    redis.kill();
    for _ in 0..3 {
        let t = Instant::now();
        let err = store.load_group("g").await.unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "no hang: {:?}",
            t.elapsed()
        );
        assert!(store.ping().await.is_err());
        assert!(store.lock(&LockResource::Group("g".into())).await.is_err());
    }
    redis.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.ping().await.is_err() {
        assert!(Instant::now() < deadline, "the store reconnects by itself");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without AOF the data is gone, but the store works again (scripts reloaded too).
    assert_eq!(store.load_group("g").await.unwrap(), None);
    assert_eq!(store.put_group(&g, 0, &note()).await.unwrap(), 1);
}

#[tokio::test]
async fn redis_store_starts_while_redis_is_down() {
    let mut redis = RedisServer::start().unwrap();
    let url = redis.url();
    redis.kill();
    let store = redis_store(vec![url], false, RedisStoreConfig::default()).await;
    assert!(store.ping().await.is_err());
    redis.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.ping().await.is_err() {
        assert!(Instant::now() < deadline, "connects once Redis is up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn redis_mode_mismatch_is_refused_at_start() {
    let cluster = RedisCluster::shared().unwrap();
    let err = RedisStore::open(RedisStoreConfig {
        redis: url(cluster.urls()[0].clone()),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("--redis-cluster"), "{err}");
    let redis = RedisServer::start().unwrap();
    let err = RedisStore::open(RedisStoreConfig {
        redis: RedisSettings {
            cluster: true,
            ..url(redis.url())
        },
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("not a Redis Cluster"), "{err}");
    let err = RedisStore::open(RedisStoreConfig {
        key_prefix: "bad{tag}".into(),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");
}

#[tokio::test]
async fn redis_layout_follows_the_spec() {
    let redis = RedisServer::start().unwrap();
    let store = spec_store(&redis).await;
    let (g, s) = docs("billing", "orders");
    store.put_stream(&s, 0, &note()).await.unwrap();
    store.put_group(&g, 0, &note()).await.unwrap();
    touch(&store, "billing", "m1", 1_000).await;
    let _l = store
        .lock(&LockResource::Group("billing".into()))
        .await
        .unwrap();
    let _k = store
        .lock(&LockResource::Stream("orders".into()))
        .await
        .unwrap();
    let keys = redis.command("KEYS *").unwrap();
    for key in [
        "rsc:group:{billing}",
        "rsc:stream:{orders}",
        "rsc:live:{billing}",
        "rsc:lock:{billing}",
        "rsc:lock:stream:{orders}",
        "rsc:groups",
        "rsc:streams",
    ] {
        assert!(keys.contains(key), "{key} missing in {keys}");
    }
    assert!(
        redis
            .command("HGET rsc:group:{billing} revision")
            .unwrap()
            .contains("\r\n1\r\n")
    );
}

#[tokio::test]
async fn redis_cluster_node_outage_fails_fast_and_recovers() {
    let mut cluster = RedisCluster::start().unwrap();
    let store = redis_store(cluster.urls(), true, RedisStoreConfig::default()).await;
    // Groups spread over the three nodes' slots.
    let groups: Vec<String> = (0..12).map(|i| format!("g{i}")).collect();
    for g in &groups {
        store.put_group(&docs(g, "s").0, 0, &note()).await.unwrap();
    }
    cluster.nodes_mut()[1].kill();
    let mut failed = 0;
    for g in &groups {
        let t = Instant::now();
        match store.load_group(g).await {
            Ok(v) => assert_eq!(v.unwrap().revision, 1),
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                failed += 1;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "no hang: {:?}",
            t.elapsed()
        );
    }
    assert!(failed > 0, "some groups live on the stopped node");
    assert!(failed < groups.len(), "the other nodes still answer");
    cluster.nodes_mut()[1].restart().unwrap();
    cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    for g in &groups {
        loop {
            match store.load_group(g).await {
                Ok(v) => {
                    // No persistence on the restarted node: its groups are gone, but it
                    // answers again and takes writes.
                    if v.is_none() {
                        store.put_group(&docs(g, "s").0, 0, &note()).await.unwrap();
                    }
                    break;
                }
                Err(e) => {
                    assert!(Instant::now() < deadline, "no recovery: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Settings of the standalone Redis at `url`.
fn url(url: impl Into<String>) -> RedisSettings {
    RedisSettings {
        url: Some(rsc_protocol::redact::SecretUrl::new(url)),
        ..RedisSettings::default()
    }
}
