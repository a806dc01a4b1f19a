//! Client framework of Redis Stream Coordinator: Kafka-style consumer groups over sharded
//! Redis Streams, for application code.
//!
//! - **Consumers**: write an `async fn(Message<T>) -> Result<(), HandlerError>`, mark it
//!   [`#[stream_listener]`](stream_listener) (or wrap it in a [`Listener`]), and run a
//!   [`ConsumerApp`]. Each listener runs `concurrency` members of its consumer group; the
//!   coordinator gives each member a share of the stream's shards, and the framework reads,
//!   retries, dead-letters and acknowledges — at-least-once, in order per shard.
//! - **Producers**: [`producer::Producer`] routes each message to its shard by key (PROTOCOL §3)
//!   and writes it with `XADD`.
//!
//! ```
//! use rsc_client::prelude::*;
//!
//! #[derive(serde::Deserialize)]
//! struct Order {
//!     id: u64,
//!     total_cents: u64,
//! }
//!
//! async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
//!     let order = msg.payload();
//!     if order.total_cents == 0 {
//!         // Retrying cannot fix this one: straight to `orders:dlq`.
//!         return Err(HandlerError::dead_letter(format!("order {} is empty", order.id)));
//!     }
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Handlers are plain functions: test them without Redis.
//! let result = on_order(Message::test(Order { id: 7, total_cents: 0 })).await;
//! assert_eq!(result.unwrap_err().action(), FailureAction::DeadLetter);
//!
//! // What `#[stream_listener(group = "billing", stream = "orders", concurrency = 2)]`
//! // registers, built by hand:
//! let app = ConsumerApp::builder()
//!     .coordinator("http://127.0.0.1:7070")
//!     .redis_url("redis://127.0.0.1:6379")
//!     .instance_id("10.0.0.7")
//!     .listener(Listener::new("billing", "orders", on_order).concurrency(2))
//!     .build()
//!     .unwrap();
//! assert_eq!(app.member_ids(), ["10.0.0.7-billing-0", "10.0.0.7-billing-1"]);
//! // app.run().await runs until SIGTERM / Ctrl-C, then leaves the group gracefully.
//! # }
//! ```
//!
//! # Guarantees and their limits
//! - A shard is worked by one member at a time: the coordinator revokes before it assigns,
//!   and a member that cannot heartbeat stops on its own (self-fence) before its session could
//!   expire.
//! - At-least-once: an entry is acknowledged only after its handler succeeded (or it was
//!   dead-lettered). A crash, a kill or a self-fence can hand an entry to a new owner that was
//!   already handled: make handlers idempotent.
//! - Order: one shard's entries are handled one at a time, in stream order (with
//!   [`Listener::key_concurrency`], several at once but one key's one at a time), so one key's
//!   messages are handled in the order they were published — while the shard does not move.
//!
//! # Metrics
//! Through the [`metrics`](https://docs.rs/metrics) facade (install any recorder):
//! `rsc_client_messages_handled_total`, `rsc_client_handler_failures_total`,
//! `rsc_client_messages_retried_total`, `rsc_client_messages_dead_lettered_total`,
//! `rsc_client_handler_duration_seconds` (labels `group`, `stream`); `rsc_client_shard_lag`
//! (`group`, `stream`, `shard`); `rsc_client_heartbeats_total` (`group`, `result`),
//! `rsc_client_self_fenced_total`, `rsc_client_rejoins_total`, `rsc_client_owned_shards`;
//! `rsc_client_published_total`, `rsc_client_publish_errors_total`,
//! `rsc_client_routing_refresh_failures_total` (`stream`).
//! Tracing spans: `member` (group, member), `shard` (shard, key), `message` (entry_id, attempt).
//!
//! # Configuration outside the code
//! An app built from the environment ([`ConsumerApp::from_env`], [`ConsumerApp::builder`])
//! takes each listener's settings (`group`, `stream`, `concurrency`, `key_concurrency`,
//! `max_retries`, `retry_backoff_ms`, `retry_backoff_max_ms`, `batch_size`, `max_batch`,
//! `linger_ms`) from, highest precedence first: a variable `RSC_LISTENER_<NAME>_<SETTING>`
//! (e.g. `RSC_LISTENER_BILLING_CONCURRENCY=8`), the section of the profile `RSC_PROFILE`
//! names in the TOML file `RSC_CONFIG_FILE` (`[profiles.<profile>.listeners.<name>]`), that
//! file's `[listeners.<name>]`, then the code. A bad value, or one naming no listener, fails
//! [`ConsumerAppBuilder::build`] with [`ConfigError::InvalidSetting`] naming the variable or
//! key. GUIDE "Configuration outside the code". [`ListenerOverrides`] reads the same layers
//! for a program that runs listeners from its own configuration, with settings of its own
//! (`rsc-bridge`).
//!
//! # Features
//! - `tls` (default): TLS to the data Redis (`rediss://`).
//! - `msgpack`: MessagePack payloads (`codec::MsgPack`).
//! - `otel`: W3C trace context from the producer to the handler.
//! - `ops`: the ops endpoints and defaults of a pod (`ops` module): `ConsumerAppBuilder::ops`
//!   serves `/healthz`, `/readyz` (every member joined, the data Redis answers) and
//!   `/metrics` (Prometheus text; the series of shards the process gave up are removed), and
//!   `ops::init_tracing` logs by `RSC_LOG` / `RSC_LOG_FORMAT` (`text`, `json`).
#![deny(missing_docs)]

mod app;
pub mod codec;
mod config;
mod consumer;
mod data;
mod error;
pub mod foreign;
mod handler;
pub mod layer;
mod listener;
mod logging;
mod message;
#[cfg(feature = "ops")]
pub mod ops;
mod otel;
mod overrides;
pub mod producer;
mod registry;
mod state;

pub use app::{AppHandle, ConsumerApp, ConsumerAppBuilder, shutdown_signal};
pub use config::ClientConfig;
pub use error::{BoxError, ClientError, ConfigError, CoordinatorError, CoordinatorErrorKind};
pub use handler::{BatchError, BatchHandler, FailureAction, Handler, HandlerError, IntoBatchError};
pub use listener::{AckMode, Listener, Rebalance};
pub use message::{Acker, Batch, Headers, Message, Payload, Raw};
pub use overrides::{ListenerOverrides, ListenerSettings, OverrideSources, SettingKind};
pub use rsc_api::{ClientTls as CoordinatorTls, install_crypto_provider};
/// The types of [`ClientConfig`]'s secrets (the token, the Redis URL, the sentinels'
/// password): their `Debug` hides them (PROTOCOL §12).
pub use rsc_protocol::redact::{ExposeSecret, SecretString, SecretUrl};
/// The data Redis settings of [`ClientConfig::redis`].
pub use rsc_redis::RedisSettings;
pub use state::Data;

/// Declares a stream listener: an `async fn(msg: Message<T>) -> Result<(), HandlerError>` run
/// for every message of `stream` that its consumer `group` gives this process.
///
/// ```no_run
/// use rsc_client::prelude::*;
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// #[stream_listener(group = "billing", stream = "orders", concurrency = 4)]
/// async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
///     println!("order {}", msg.payload().id);
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), ClientError> {
///     ConsumerApp::from_env()?.run().await
/// }
/// ```
///
/// Keys: `group` and `stream` (required), `concurrency` (members in this process, default 1),
/// `name` (used in member ids, default the group), `ack` (`"auto"` default, or `"manual"`),
/// `max_retries` (default 3), `batch` (a batch listener taking a [`Batch<T>`], at most this
/// many messages per call) and `linger_ms` (a batch listener's wait for a fuller batch).
///
/// After the message (or batch), the function may take up to four [`Data<T>`] arguments:
/// state given to the app with [`ConsumerAppBuilder::data`]. It may return any
/// `Result<(), E>` whose `E` converts into a [`HandlerError`] (e.g. `anyhow::Result<()>`).
///
/// The function stays an ordinary function (call it in tests with [`Message::test`]). The
/// attribute adds a registration that [`ConsumerApp::from_env`] (or
/// [`ConsumerAppBuilder::registered_listeners`]) collects; it is equivalent to:
///
/// ```no_run
/// # use rsc_client::prelude::*;
/// # async fn on_order(msg: Message<String>) -> Result<(), HandlerError> { Ok(()) }
/// # fn main() -> Result<(), ClientError> {
/// let app = ConsumerApp::builder()
///     .listener(Listener::new("billing", "orders", on_order).concurrency(4))
///     .build()?;
/// # Ok(()) }
/// ```
pub use rsc_macros::stream_listener;

/// The names most programs need: `use rsc_client::prelude::*;`.
pub mod prelude {
    pub use crate::producer::{Producer, Record};
    pub use crate::{
        AckMode, Batch, BatchError, ClientError, ConsumerApp, Data, FailureAction, HandlerError,
        Listener, Message, Raw, stream_listener,
    };
}

#[doc(hidden)]
pub mod __private {
    //! Used by the code `#[stream_listener]` expands to. Not a public API.
    pub use crate::registry::Registration;
    pub use inventory;
}

/// The application developers' guide (`docs/GUIDE.md`): its code blocks run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/GUIDE.md")]
pub struct Guide;
