//! Health endpoints of the sample consumer pod, for Kubernetes probes (`--health-listen`).
//!
//! - `GET /healthz` — liveness: `200 {"status":"ok"}` while the process serves requests.
//! - `GET /readyz` — readiness: `200 {"status":"ready"}` when the data Redis answers `PING` and
//!   a coordinator answers its own `/readyz`; `503` with the reason otherwise, and from the
//!   moment a graceful shutdown starts (the pod finishes its in-flight messages and leaves).
//! - `GET /metrics` — the client's metrics (`rsc_client_*`) in the Prometheus text format,
//!   when a recorder was installed ([`Health::metrics`]); scrape it with the pod annotations
//!   `prometheus.io/scrape: "true"`, `prometheus.io/port`, `prometheus.io/path: /metrics`.
//!
//! Every check has a short timeout, so a probe never hangs on a dead dependency.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

/// How long one dependency check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// What `/readyz` checks, and whether the pod is shutting down.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    coordinators: Vec<String>,
    /// The data Redis's nodes (one, or a cluster's seeds): ready when one answers.
    redis: Vec<redis::Client>,
    /// Behind Redis Sentinel: the master the sentinels name (instead of `redis`).
    sentinel: Option<rsc_redis::LazyRedis>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    http: reqwest::Client,
    shutting_down: AtomicBool,
}

impl Health {
    /// Checks the coordinators (comma-separated base URLs, as `--coordinator`) and the data
    /// Redis `data` names ([`crate::data_redis`]): its server or cluster seed nodes (with its
    /// TLS settings), or behind Redis Sentinel the master the sentinels name.
    pub fn new(coordinators: &str, data: &rsc_redis::LazyRedis) -> anyhow::Result<Self> {
        let coordinators: Vec<String> = coordinators
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        let https = coordinators.iter().any(|u| u.starts_with("https://"));
        Ok(Health {
            inner: Arc::new(Inner {
                coordinators,
                redis: match data.sentinel() {
                    Some(_) => Vec::new(),
                    None => (data.seeds().iter().cloned())
                        .map(redis::Client::open)
                        .collect::<Result<_, _>>()?,
                },
                sentinel: data.sentinel().map(|_| data.clone()),
                metrics: None,
                // The coordinator's TLS files as the client library reads them
                // (`RSC_COORDINATOR_CA`, `RSC_COORDINATOR_CERT`, `RSC_COORDINATOR_KEY`).
                http: reqwest::Client::builder()
                    .tls_backend_preconfigured(
                        rsc_client::ClientConfig::from_env()
                            .coordinator_tls
                            .rustls_config(https)?,
                    )
                    .timeout(CHECK_TIMEOUT)
                    .build()?,
                shutting_down: AtomicBool::new(false),
            }),
        })
    }

    /// Serves `/metrics` from this Prometheus recorder ([`crate::install_metrics`]).
    pub fn metrics(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.metrics = Some(handle);
        }
        self
    }

    /// From now on `/readyz` answers 503: the pod is shutting down.
    pub fn shutting_down(&self) {
        self.inner.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Serves `/healthz` and `/readyz` on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self);
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Why the pod is not ready, or `None` when it is.
    pub async fn not_ready(&self) -> Option<String> {
        if self.inner.shutting_down.load(Ordering::Relaxed) {
            return Some("shutting down".into());
        }
        if let Err(e) = self.ping_redis().await {
            return Some(format!("data Redis: {e}"));
        }
        let mut errors = Vec::new();
        for base in &self.inner.coordinators {
            match self.inner.http.get(format!("{base}/readyz")).send().await {
                Ok(r) if r.status().is_success() => return None,
                Ok(r) => errors.push(format!("{base}: {}", r.status())),
                Err(e) => errors.push(format!("{base}: {e}")),
            }
        }
        Some(format!("no coordinator ready ({})", errors.join("; ")))
    }

    async fn ping_redis(&self) -> anyhow::Result<()> {
        let ping = async {
            if let Some(master) = &self.inner.sentinel {
                let mut conn = master.get().await?;
                let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
                anyhow::ensure!(pong == "PONG", "PING answered {pong:?}");
                return Ok(());
            }
            let mut last = anyhow::anyhow!("no Redis URL");
            for node in &self.inner.redis {
                let answer = async {
                    let mut conn = node.get_multiplexed_async_connection().await?;
                    let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
                    anyhow::ensure!(pong == "PONG", "PING answered {pong:?}");
                    Ok(())
                };
                match answer.await {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        };
        tokio::time::timeout(CHECK_TIMEOUT, ping)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {CHECK_TIMEOUT:?}"))?
    }
}

async fn healthz() -> Response {
    (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response()
}

async fn metrics(State(health): State<Health>) -> Response {
    match &health.inner.metrics {
        Some(h) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no metrics recorder in this process\n",
        )
            .into_response(),
    }
}

async fn readyz(State(health): State<Health>) -> Response {
    match health.not_ready().await {
        None => (StatusCode::OK, axum::Json(json!({"status": "ready"}))).into_response(),
        Some(reason) => {
            tracing::debug!(%reason, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({"status": "not ready", "reason": reason})),
            )
                .into_response()
        }
    }
}
