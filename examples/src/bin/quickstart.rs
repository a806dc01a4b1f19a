//! The smallest real listener program: copy this file to start.
//!
//! ```text
//! rsc-coordinator serve &                       # the control plane (memory store)
//! rsc-coordinator group create billing --stream orders --shards 8
//! RSC_COORDINATOR_URL=http://127.0.0.1:7070 RSC_REDIS_URL=redis://127.0.0.1:6379 \
//!   POD_IP=10.0.0.7 cargo run --bin quickstart
//! ```
//! Member ids are `<POD_IP>-billing-0` and `-1`. Stop with Ctrl-C: in-flight messages finish,
//! are acknowledged, and the members leave the group so their shards move on at once.

use rsc_client::prelude::*;

/// The payload, as JSON in the entry's `payload` field.
#[derive(Debug, serde::Deserialize)]
struct Order {
    id: u64,
    total_cents: u64,
}

/// State every handler shares (a database pool, a client, a configuration): given once with
/// `.data(...)`, received as a `Data<T>` argument.
struct Billing {
    /// Orders above this are refused.
    max_cents: u64,
}

/// Runs for each message of `orders` that group `billing` gives this process, two members
/// (`concurrency = 2`) at a time, in order within each shard.
#[stream_listener(group = "billing", stream = "orders", concurrency = 2)]
async fn on_order(msg: Message<Order>, billing: Data<Billing>) -> Result<(), HandlerError> {
    let order = msg.payload();
    if order.total_cents == 0 || order.total_cents > billing.max_cents {
        // Retrying cannot fix this: straight to `orders:dlq`, then acknowledged.
        return Err(HandlerError::dead_letter(format!(
            "order {} is empty or over the limit",
            order.id
        )));
    }
    tracing::info!(order = order.id, shard = msg.shard(), key = ?msg.key(), "billed");
    // Any other error (`?`) is retried with backoff, then dead-lettered.
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rsc_examples::init_logging();
    ConsumerApp::builder()
        .data(Billing {
            max_cents: 1_000_000,
        })
        .registered_listeners()
        .build()?
        .run()
        .await?;
    Ok(())
}
