//! P2: the sticky assignor at 1,000 members × 4,096 shards, timed directly in a release
//! binary: a full assignment (every member new) and one join to a balanced group.
//! Goal (PROTOCOL §5.5): < 1 ms and < 0.3 ms. Each repetition is the mean of a batch of calls;
//! the table gives the median, min and max of the repetitions.
//!
//! ```text
//! cargo run --release -p rsc-bench --bin assignor [-- --quick]
//! ```

use clap::Parser;
use rsc_bench::{Row, emit, summarize};
use rsc_coordinator::assignor::{Assignor, AssignorMember, StickyAssignor};
use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Instant;

#[derive(Debug, Parser)]
#[command(about = "Sticky assignor at 1,000 members x 4,096 shards: full and one join")]
struct Args {
    /// Fewer calls per repetition (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Repetitions (median, min, max are reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Members.
    #[arg(long, default_value_t = 1_000)]
    members: usize,
    /// Shards.
    #[arg(long, default_value_t = 4_096)]
    shards: u32,
}

/// Mean time of one call of `f` over `calls` calls, in ms.
fn time_ms(calls: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        f();
    }
    start.elapsed().as_secs_f64() * 1000.0 / calls as f64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let calls = if args.quick { 20 } else { 200 };
    let reps = if args.quick { 5 } else { args.reps.max(5) };
    let ids: Vec<String> = (0..=args.members)
        .map(|i| format!("10.0.{}.{}-billing-0", i / 250, i % 250))
        .collect();
    let shards: Vec<u32> = (0..args.shards).collect();
    let empty = BTreeSet::new();
    let fresh: Vec<AssignorMember<'_>> = ids[..args.members]
        .iter()
        .map(|id| AssignorMember {
            id,
            previous: &empty,
        })
        .collect();
    let balanced: Vec<BTreeSet<u32>> = StickyAssignor
        .assign(&fresh, &shards)
        .into_iter()
        .map(|v| v.into_iter().collect())
        .collect();
    let mut joined: Vec<AssignorMember<'_>> = ids[..args.members]
        .iter()
        .zip(&balanced)
        .map(|(id, previous)| AssignorMember { id, previous })
        .collect();
    joined.push(AssignorMember {
        id: &ids[args.members],
        previous: &empty,
    });

    // Warm-up (allocator, caches), then the measured repetitions.
    time_ms(calls / 4 + 1, || {
        black_box(StickyAssignor.assign(black_box(&fresh), black_box(&shards)));
    });
    let (mut full, mut join) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        full.push(time_ms(calls, || {
            black_box(StickyAssignor.assign(black_box(&fresh), black_box(&shards)));
        }));
        join.push(time_ms(calls, || {
            black_box(StickyAssignor.assign(black_box(&joined), black_box(&shards)));
        }));
    }
    let m = args.members;
    let s = args.shards;
    emit(&[
        Row {
            name: format!("P2 assignor full assignment ({m} members x {s} shards)"),
            unit: "ms".into(),
            value: summarize(&full),
            baseline: None,
            goal: "< 1 ms".into(),
        },
        Row {
            name: format!("P2 assignor one join ({m}+1 members x {s} shards)"),
            unit: "ms".into(),
            value: summarize(&join),
            baseline: None,
            goal: "< 0.3 ms".into(),
        },
    ])?;
    Ok(())
}
