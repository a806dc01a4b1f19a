//! The HTTP server of the ops endpoints: `/healthz`, `/readyz`, `/metrics`.

use super::MetricsHandle;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::BoxFuture;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Why the process is not ready (`None`: ready).
type Check = Arc<dyn Fn() -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// The ops endpoints (`/healthz`, `/readyz`, `/metrics`, see [`crate::ops`]) with a
/// readiness check of the caller's choosing. A [`crate::ConsumerApp`] serves them itself
/// ([`crate::ConsumerAppBuilder::ops`]); this is for other programs, e.g. a producer pod:
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use rsc_client::ops::Ops;
/// use rsc_client::producer::Producer;
///
/// let producer = Producer::builder().build()?;
/// let ready = producer.clone();
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// tokio::spawn(
///     Ops::new()
///         .readiness(move || {
///             let p = ready.clone();
///             async move { p.not_ready().await }
///         })
///         .serve(listener, rsc_client::shutdown_signal()),
/// );
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Ops {
    check: Check,
    metrics: Option<MetricsHandle>,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops").finish_non_exhaustive()
    }
}

impl Default for Ops {
    fn default() -> Self {
        Self::new()
    }
}

impl Ops {
    /// Always ready, metrics from [`super::install_metrics`] (installed now if no other
    /// recorder was: without it, `/metrics` answers 404 with the reason).
    pub fn new() -> Self {
        Ops {
            check: Arc::new(|| Box::pin(async { None })),
            metrics: super::install_metrics().ok(),
        }
    }

    /// `/readyz` answers 503 with the reason `check` returns, 200 when it returns `None`.
    /// Keep it quick and bounded: probes time out.
    pub fn readiness<F, Fut>(mut self, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        self.check = Arc::new(move || Box::pin(check()));
        self
    }

    /// Serves the endpoints on `listener` until `shutdown` completes.
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
}

async fn healthz() -> Response {
    (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response()
}

async fn readyz(State(ops): State<Ops>) -> Response {
    match (ops.check)().await {
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

async fn metrics(State(ops): State<Ops>) -> Response {
    match &ops.metrics {
        Some(h) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no metrics here: the program installed its own metrics recorder\n",
        )
            .into_response(),
    }
}

/// Serves the endpoints of a consumer app, whose readiness `handle` tells, on `addr` until
/// the returned guard drops (when the app has stopped).
pub(crate) async fn serve_app(
    addr: std::net::SocketAddr,
    handle: crate::AppHandle,
) -> Result<tokio_util::sync::DropGuard, crate::ClientError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| crate::ClientError::OpsListen { addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %local, "ops endpoints listening (/healthz, /readyz, /metrics)");
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let ops = Ops::new().readiness(move || std::future::ready(handle.not_ready()));
    tokio::spawn(async move {
        if let Err(e) = ops.serve(listener, stopped.cancelled_owned()).await {
            tracing::error!(error = %e, addr = %local, "the ops endpoints stopped");
        }
    });
    Ok(stop.drop_guard())
}
