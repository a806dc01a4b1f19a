//! The smallest real listener program: copy this file to start. It uses nothing of this
//! repository but `rsc-client`; a project of its own needs these dependencies:
//!
//! ```text
//! cargo add rsc-client anyhow tracing tracing-subscriber --features tracing-subscriber/env-filter
//! cargo add serde --features derive
//! cargo add tokio --features macros,rt-multi-thread,signal
//! ```
//!
//! Run it against a coordinator and a Redis:
//!
//! ```text
//! rsc-coordinator serve --data-redis-url redis://127.0.0.1:6379 &   # the control plane (memory store)
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
    // Logs to stderr, at the level RSC_LOG names (default info).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
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
