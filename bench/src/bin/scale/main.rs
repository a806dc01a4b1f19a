//! Control-plane scale (rows S1–S3): what idle groups cost, what batching heartbeats buys, and
//! whether 100,000 members heartbeating every 3 s are sustained.
//!
//! - **S1 idle**: N idle groups (1 member each, heartbeat interval 20 min, so nobody heartbeats
//!   during the window) on 1 and on 3 coordinators sharing one `redis-server` (Redis store):
//!   Redis commands/s (`total_commands_processed` of `INFO stats`, less the `INFO` calls
//!   themselves) and each coordinator's CPU (`/proc/<pid>/stat`), against the same window
//!   with 0 groups.
//! - **S2 batched**: the same members, joined and converged, heartbeating at full speed from
//!   the same load generator (32 requests in flight), once as single
//!   `POST /v1/groups/{g}/heartbeat` and once as batches of one process's 32 members in
//!   `POST /v1/heartbeats`, alternating which goes first.
//! - **S3 100k members**: P simulated processes × 32 members over G groups, each process
//!   sending one batch every heartbeat interval (3 s), phases spread evenly; batch latency,
//!   achieved vs offered member-heartbeats/s, CPU, expired members; then the same on 3
//!   coordinators with a 3-node Redis Cluster store, and the saturation rate of both.
//!
//! ```text
//! cargo build --release --bins && target/release/scale            # full (S3: 100,000 members)
//! target/debug/scale --quick                                        # CI smoke run
//! target/release/scale --rows s1 --s1-groups 1000,5000,10000        # one row
//! ```
//! Figures only: no thresholds are asserted (the goals are printed beside them).

use anyhow::{Context, Result, bail};
use clap::Parser;
use rsc_bench::{Row, emit, num, summarize};
use rsc_protocol::{
    BatchedHeartbeat, HeartbeatBatchRequest, HeartbeatBatchResponse, HeartbeatRequest,
    HeartbeatResponse,
};
use rsc_testkit::{CoordinatorProcess, RedisCluster, RedisServer};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod measure;
mod members;
mod s1;
mod s2;
mod s3;
mod setup;

use measure::*;
use members::*;
use setup::*;

#[derive(Debug, Parser)]
#[command(
    about = "Control-plane scale: idle groups (S1), batched heartbeats (S2), 100k members (S3)"
)]
struct Args {
    /// Short run for CI (well under a minute on debug binaries).
    #[arg(long)]
    quick: bool,
    /// Which rows to run.
    #[arg(long, value_delimiter = ',', default_value = "s1,s2,s3")]
    rows: Vec<String>,
    /// S1: idle group counts [default: 1000,5000,10000; quick: 50,200].
    #[arg(long, value_delimiter = ',')]
    s1_groups: Option<Vec<usize>>,
    /// S1: measurement window per configuration, ms [default: 10000; quick: 1000].
    #[arg(long)]
    s1_window_ms: Option<u64>,
    /// S2: simulated processes of 32 members [default: 32; quick: 16].
    #[arg(long)]
    s2_processes: Option<usize>,
    /// S2: groups the members are spread over [default: 32; quick: 16].
    #[arg(long)]
    s2_groups: Option<usize>,
    /// S2: repetitions of each measurement [default: 5; quick: 2].
    #[arg(long)]
    s2_reps: Option<usize>,
    /// S2: length of one measurement, ms [default: 3000; quick: 500].
    #[arg(long)]
    s2_duration_ms: Option<u64>,
    /// S3: simulated processes of 32 members [default: 3125; quick: 20].
    #[arg(long)]
    s3_processes: Option<usize>,
    /// S3: groups [default: 10000; quick: 64].
    #[arg(long)]
    s3_groups: Option<usize>,
    /// S3: steady window, ms [default: 60000; quick: 3000].
    #[arg(long)]
    s3_window_ms: Option<u64>,
    /// S3: heartbeat interval of the groups (session timeout: 15 intervals).
    #[arg(long, default_value_t = 3000)]
    s3_interval_ms: u64,
    /// S3: coordinator counts to run (1: standalone redis-server; 3: 3-node Redis Cluster).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    s3_coordinators: Vec<usize>,
    /// Members per simulated process (the batch size).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Requests in flight (set-up, S2 and the saturation phase of S3).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Batches in flight while members join and converge (S2, S3): every batch carries a
    /// member of many groups, so each in-flight batch adds a concurrent join per group.
    #[arg(long, default_value_t = 8)]
    setup_concurrency: usize,
    /// Groups per stream (a stream's document lists its groups: keep it small).
    #[arg(long, default_value_t = 100)]
    groups_per_stream: usize,
    /// Passed to every coordinator as `--sweep-interval-ms` (unset: its default).
    #[arg(long)]
    sweep_interval_ms: Option<u64>,
}

impl Args {
    fn pick<T: Copy>(&self, set: Option<T>, full: T, quick: T) -> T {
        set.unwrap_or(if self.quick { quick } else { full })
    }
}

fn row(name: String, unit: &str, samples: &[f64], baseline: Option<&[f64]>, goal: &str) -> Row {
    Row {
        name,
        unit: unit.into(),
        value: summarize(samples),
        baseline: baseline.map(summarize),
        goal: goal.into(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    for r in &args.rows {
        let rows = match r.as_str() {
            "s1" => s1::s1(&args).await?,
            "s2" => s2::s2(&args).await?,
            "s3" => s3::s3(&args).await?,
            other => bail!("unknown row {other} (s1, s2, s3)"),
        };
        if !rows.is_empty() {
            emit(&rows)?;
        }
    }
    Ok(())
}
