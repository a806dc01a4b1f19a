//! `sample-producer`: publishes `--count` keyed messages (SPEC §8).
//!
//! ```text
//! sample-producer --coordinator URL --redis-url URL --stream S --count N --keys K
//!   [--rate R] [--token T]
//! ```
//! Entry fields: `payload` (JSON `{"seq": …, "key": …}`), `key` (`k{seq % K}`), `seq`
//! (0..N-1). Prints `published N` at the end.

use clap::Parser;
use rsc_client::producer::{Producer, Record};
use std::time::{Duration, Instant};

/// (No `Debug`: the arguments hold the token and the Redis URL's password.)
#[derive(Parser)]
#[command(
    name = "sample-producer",
    version,
    about = "Publishes keyed sample messages"
)]
struct Args {
    /// Coordinator URL(s), comma-separated for failover.
    #[arg(long, env = "RSC_COORDINATOR_URL")]
    coordinator: String,
    /// The data Redis (with `--redis-cluster`, seed nodes, comma-separated).
    #[arg(long, env = "RSC_REDIS_URL")]
    redis_url: String,
    /// The data Redis is a Redis Cluster.
    #[arg(long)]
    redis_cluster: bool,
    /// The stream.
    #[arg(long)]
    stream: String,
    /// How many messages.
    #[arg(long)]
    count: u64,
    /// How many distinct keys (`k0` … `k{K-1}`).
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// Messages per second (as fast as possible when absent).
    #[arg(long)]
    rate: Option<f64>,
    /// Bearer token for the coordinator.
    #[arg(long, env = "RSC_TOKEN")]
    token: Option<String>,
}

const BATCH: u64 = 500;

/// How long a batch is retried while Redis is unreachable before the producer gives up.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// Publishes one batch, retrying while Redis is unreachable (a restart, an outage) for up to
/// [`RETRY_FOR`]. At-least-once: a batch whose reply was lost may be published twice.
async fn publish_retrying(
    producer: &Producer,
    stream: &str,
    batch: Vec<Record>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        match producer.publish_batch(stream, batch.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "publish failed; retrying the batch");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn record(seq: u64, keys: u64) -> anyhow::Result<Record> {
    let key = format!("k{}", seq % keys.max(1));
    Ok(Record::json(&serde_json::json!({"seq": seq, "key": key}))?
        .key(key)
        .field("seq", seq.to_string()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rsc_examples::init_logging();
    let args = Args::parse();
    let mut builder = Producer::builder()
        .coordinator(&args.coordinator)
        .redis_url(&args.redis_url)
        .redis_cluster(args.redis_cluster);
    if let Some(t) = &args.token {
        builder = builder.token(t);
    }
    let producer = builder.build()?;
    let started = Instant::now();
    let mut next = 0u64;
    while next < args.count {
        // With a rate: publish what is due by now, in batches of at most BATCH.
        let due = match args.rate {
            Some(r) if r > 0.0 => {
                ((started.elapsed().as_secs_f64() * r) as u64 + 1).min(args.count)
            }
            _ => args.count,
        };
        if due <= next {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let end = due.min(next + BATCH);
        let batch = (next..end)
            .map(|seq| record(seq, args.keys))
            .collect::<anyhow::Result<Vec<_>>>()?;
        publish_retrying(&producer, &args.stream, batch).await?;
        next = end;
    }
    println!("published {}", args.count);
    Ok(())
}
