//! The engine's cost per heartbeat in a group of 1,000 members × 4,096 shards: a steady
//! heartbeat (nothing changes) and a join (a rebalance of the whole group).

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rsc_coordinator::engine::{GroupConfig, GroupDoc, StreamDoc};
use rsc_protocol::HeartbeatRequest;
use std::hint::black_box;

fn req(member: &str, epoch: i64, owned: Vec<u32>) -> HeartbeatRequest {
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

/// A converged group: every member joined and reported its assignment.
fn converged(members: usize, shards: u32) -> (StreamDoc, GroupDoc) {
    let mut stream = StreamDoc::new("orders", shards, 0).unwrap();
    stream.add_group("g");
    let config = GroupConfig {
        max_members: None,
        ..GroupConfig::default()
    };
    let mut group = GroupDoc::new("g", config, &stream, 0);
    let ids: Vec<String> = (0..members).map(|i| format!("member-{i:04}")).collect();
    for id in &ids {
        group.heartbeat(&stream, &req(id, 0, vec![]), 1).unwrap();
    }
    // Two rounds: revoke, then take what was released.
    for _ in 0..3 {
        for id in &ids {
            let m = &group.members[id];
            let (epoch, owned) = (m.member_epoch, m.assigned.iter().copied().collect());
            group.heartbeat(&stream, &req(id, epoch, owned), 2).unwrap();
        }
    }
    assert!(group.is_stable());
    (stream, group)
}

fn bench(c: &mut Criterion) {
    let (stream, group) = converged(1_000, 4_096);
    let m = &group.members["member-0500"];
    let steady = req(
        "member-0500",
        m.member_epoch,
        m.assigned.iter().copied().collect(),
    );
    c.bench_function("engine steady heartbeat 1000x4096", |b| {
        b.iter_batched_ref(
            || group.clone(),
            |g| {
                g.heartbeat(black_box(&stream), black_box(&steady), 3)
                    .unwrap()
            },
            BatchSize::LargeInput,
        )
    });
    c.bench_function("engine clone group doc 1000x4096", |b| {
        b.iter(|| black_box(&group).clone())
    });
    let join = req("member-new", 0, vec![]);
    c.bench_function("engine join 1000+1x4096", |b| {
        b.iter_batched_ref(
            || group.clone(),
            |g| {
                g.heartbeat(black_box(&stream), black_box(&join), 3)
                    .unwrap()
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
