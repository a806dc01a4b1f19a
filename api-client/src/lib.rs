//! The HTTP client of the Redis Stream Coordinator's `/v1` API.
//!
//! One [`CoordinatorClient`] serves both sides of the coordinator: the members and producers
//! of `rsc-client` (heartbeats, leaving, routing, the wake-up channel) and the operators'
//! command line of `rsc-coordinator` (groups, streams, resharding, pausing, member removal).
//! It holds the coordinator URLs (moving to the next one after a transport error or a 5xx),
//! the bearer token (or a token file it re-reads when it changes), the TLS files of
//! `https://` URLs (CA, client certificate) and the timeouts, and decodes every error answer (`{"error": {"code": …,
//! "message": …}}`) into one typed [`CoordinatorError`].
//!
//! ```no_run
//! use rsc_api::CoordinatorClient;
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), rsc_api::CoordinatorError> {
//! let coordinator = CoordinatorClient::builder(["http://127.0.0.1:7070"])
//!     .token(Some("s3cret".into()))
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//! match coordinator.describe_group("billing").await {
//!     Ok(group) => println!("{} members", group.view.members.len()),
//!     Err(e) if e.code() == Some(rsc_protocol::ErrorCode::GroupNotFound) => println!("no such group"),
//!     Err(e) if e.is_retriable() => println!("try again later: {e}"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod admin;
mod client;
mod error;
mod member;
mod tls;

pub use client::{CoordinatorClient, CoordinatorClientBuilder, Fetched};
pub use error::{CoordinatorError, ErrorKind};
pub use tls::{ClientTls, install_crypto_provider};
