//! Operations endpoints and defaults for a pod (feature `ops`), as Spring Boot's actuator:
//! probes, metrics and logging without writing them.
//!
//! - [`crate::ConsumerAppBuilder::ops`]: one builder call serves, while the app runs,
//!   - `GET /healthz` — liveness: `200 {"status":"ok"}` while the process serves requests;
//!   - `GET /readyz` — readiness: `200 {"status":"ready"}` once every member of the app has
//!     joined its group and the data Redis answers; `503 {"status":"not ready","reason":…}`
//!     otherwise, and from the moment a graceful shutdown starts (`"reason":"shutting down"`);
//!   - `GET /metrics` — the client's metrics (`rsc_client_*`, and any other metric of the
//!     process) in the Prometheus text format, from the recorder [`install_metrics`] installs.
//! - [`Ops`]: the same endpoints for another program (a producer pod) with its own readiness
//!   check, e.g. [`crate::producer::Producer::not_ready`].
//! - [`init_tracing`]: logs to stderr, filtered by `RSC_LOG` (an `EnvFilter` directive,
//!   default `info`), as text or JSON lines (`RSC_LOG_FORMAT=text|json`, default `text`).
//!
//! ```no_run
//! use rsc_client::prelude::*;
//!
//! #[stream_listener(group = "billing", stream = "orders")]
//! async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> {
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), ClientError> {
//!     rsc_client::ops::init_tracing()?;
//!     ConsumerApp::builder()
//!         .registered_listeners()
//!         .ops("0.0.0.0:8080".parse().unwrap())
//!         .build()?
//!         .run()
//!         .await
//! }
//! ```
//!
//! Every check has a short bound, so a probe never hangs on a dead dependency. Scrape
//! `/metrics` with the pod annotations `prometheus.io/scrape: "true"`, `prometheus.io/port`,
//! `prometheus.io/path: /metrics`.

mod recorder;
mod server;
mod tracing_setup;

pub use recorder::{MetricsHandle, install_metrics};
pub use server::Ops;
pub(crate) use server::serve_app;
pub use tracing_setup::{LogFormat, init_tracing};
