//! `rsc-coordinator`: the control plane of Redis Stream Coordinator.
//!
//! Kafka-style consumer groups (KIP-848) for sharded Redis Streams: the coordinator owns
//! membership, sticky shard assignment with revoke-before-assign, member epochs and fencing,
//! expiry, resharding with rollback and producers' routing metadata. Consumers and producers
//! talk to it over HTTP/JSON (`/v1`) and move the data through Redis themselves.
//!
//! The layers, inside out:
//! - [`engine`]: the protocol as a pure, synchronous state machine (documents in, decisions
//!   out; time is a parameter);
//! - [`assignor`]: who should own which shard;
//! - [`store`]: where the documents live ([`store::MemoryStore`] for development);
//! - [`service`]: sequences store reads, engine decisions and store writes under locks;
//! - `api`: the axum HTTP edge; `http_error`, below it and `auth`, the only place errors
//!   become protocol error codes;
//! - `dashboard`: the live operator page at `GET /`;
//! - `replay`: seeks, moving a group's position on its shards in the data Redis;
//! - [`cli`]: the operators' command line (`rsc-coordinator group describe …`);
//! - `auth`, `audit`, `metrics`, `wake`: ACL and rate limit, the audit trail, Prometheus
//!   metrics, wake-up channels — around the API and the store, private to the crate;
//! - [`server`] assembles them from a [`config::ServeConfig`].
//!
//! ```
//! use rsc_coordinator::engine::{GroupConfig, GroupDoc, StreamDoc};
//! use rsc_protocol::HeartbeatRequest;
//!
//! let stream = StreamDoc::new("orders", 4, 0).unwrap();
//! let mut group = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
//! let join = HeartbeatRequest {
//!     protocol_version: 1,
//!     member_id: "m1".into(),
//!     member_epoch: 0,
//!     owned_shards: Some(vec![]),
//!     drained_shards: vec![],
//!     client: None,
//!     incarnation: None,
//! };
//! let out = group.heartbeat(&stream, &join, 1_000).unwrap();
//! assert_eq!(out.response.assignment, vec![0, 1, 2, 3]);
//! assert_eq!(out.response.member_epoch, 1);
//! ```
#![deny(missing_docs)]
// The HTTP handlers' futures are deep (axum, the store, Redis): proving them `Send` needs
// more than the default 128 levels once an error type holds a `redis::RedisError`.
#![recursion_limit = "256"]
#![warn(missing_debug_implementations, unreachable_pub)]

mod api;
pub mod assignor;
mod audit;
mod auth;
pub mod cli;
pub mod clock;
pub mod config;
mod dashboard;
mod dlq;
pub mod engine;
pub mod fencing;
mod group_commit;
mod http_error;
mod metrics;
mod outage;
pub mod recovery;
mod replay;
pub mod retention;
mod retired;
pub mod revisions;
pub mod server;
pub mod service;
pub mod store;
pub mod tls;
mod wake;
mod watch;
