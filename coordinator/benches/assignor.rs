//! The sticky assignor at 1,000 members × 4,096 shards: a full assignment and one join
//! (PROTOCOL §5.5 goal: < 1 ms and < 0.3 ms on one core).

use criterion::{Criterion, criterion_group, criterion_main};
use rsc_coordinator::assignor::{Assignor, AssignorMember, StickyAssignor};
use std::collections::BTreeSet;
use std::hint::black_box;

const MEMBERS: usize = 1_000;
const SHARDS: u32 = 4_096;

fn bench(c: &mut Criterion) {
    let ids: Vec<String> = (0..=MEMBERS)
        .map(|i| format!("10.0.{}.{}-billing-0", i / 250, i % 250))
        .collect();
    let shards: Vec<u32> = (0..SHARDS).collect();
    let empty = BTreeSet::new();

    let fresh: Vec<AssignorMember<'_>> = ids[..MEMBERS]
        .iter()
        .map(|id| AssignorMember {
            id,
            previous: &empty,
        })
        .collect();
    c.bench_function("sticky full 1000x4096", |b| {
        b.iter(|| StickyAssignor.assign(black_box(&fresh), black_box(&shards)))
    });

    // A balanced group of 1,000 members; one more joins.
    let balanced: Vec<BTreeSet<u32>> = StickyAssignor
        .assign(&fresh, &shards)
        .into_iter()
        .map(|v| v.into_iter().collect())
        .collect();
    let mut joined: Vec<AssignorMember<'_>> = ids[..MEMBERS]
        .iter()
        .zip(&balanced)
        .map(|(id, previous)| AssignorMember { id, previous })
        .collect();
    joined.push(AssignorMember {
        id: &ids[MEMBERS],
        previous: &empty,
    });
    c.bench_function("sticky join 1000+1x4096", |b| {
        b.iter(|| StickyAssignor.assign(black_box(&joined), black_box(&shards)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
