//! The end-to-end tests: real redis-server, rsc-coordinator and sample-pod processes on
//! loopback ports (start them with `cargo build --workspace --bins` first).
//!
//! One test binary, one module per area (`cargo test -p rsc-e2e --test e2e <module>::`), rather
//! than a binary per file: each binary links the whole client and Redis stack again, and
//! `cargo test` runs binaries one after another, so a binary with one long test left the other
//! core idle. Heavy scenarios still take `pods::SERIAL` to run one at a time.

#[allow(dead_code)]
mod pods;
#[path = "support/security.rs"]
mod security;

mod acl;
mod acl_reload;
mod audit;
mod autoscaling;
mod bridge;
mod chaos;
mod cli;
mod client_batching;
mod client_limits;
mod compat;
mod connection_limits;
mod contract;
mod dashboard;
mod data_path;
mod data_plane;
mod deploy;
mod dlq;
mod expiry;
mod fencing;
mod front_door;
mod guide;
mod heartbeat_batch;
mod http_api;
mod idempotence;
mod in_flight;
mod jwt;
mod keep_alive;
mod key_lanes;
mod lag_sampling;
mod lifecycle;
mod listener;
mod metrics;
mod ordered_reshard;
mod readme;
mod redis_store;
mod replay;
mod reshard;
mod retention;
mod retry_stages;
mod revisions;
mod secrets;
mod sentinel_failover;
mod store_loss;
mod structure;
mod tls;
mod wakeups;
