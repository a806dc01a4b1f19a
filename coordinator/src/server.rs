//! Assembles and runs the server: store, service, expiry sweep, HTTP listener.

use crate::api::{self, AppState};
use crate::clock::SystemClock;
use crate::config::{ServeConfig, StoreKind};
use crate::service::{Coordinator, ServiceConfig};
use crate::store::{MemoryStore, MetadataStore, RedisStore, RedisStoreConfig};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::{info, warn};

/// Builds the store the configuration names.
pub async fn build_store(cfg: &ServeConfig) -> anyhow::Result<Arc<dyn MetadataStore>> {
    Ok(match cfg.store {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Redis => {
            let store = RedisStore::open(RedisStoreConfig {
                urls: cfg.redis_urls.clone(),
                cluster: cfg.redis_cluster,
                key_prefix: cfg.key_prefix.clone(),
                ..RedisStoreConfig::default()
            })
            .await?;
            info!(?store, "using the Redis store");
            Arc::new(store)
        }
    })
}

/// Serves until `shutdown` resolves, then drains in-flight requests and returns.
///
/// Logs `listening on ADDR` once the socket is bound (ADDR is the real address, so a
/// `:0` port shows the one the system picked).
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let store = build_store(&cfg).await?;
    let coordinator = Coordinator::new(
        store,
        Arc::new(SystemClock),
        ServiceConfig {
            rollback_window_ms: cfg.rollback_window_ms,
            ..ServiceConfig::default()
        },
    );
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener.local_addr()?;

    let sweeper = tokio::spawn(sweep_loop(
        coordinator.clone(),
        Duration::from_millis(cfg.sweep_interval_ms),
    ));
    let app = api::router(AppState { coordinator }, cfg.body_limit);
    info!(store = ?cfg.store, "listening on {addr}");
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    sweeper.abort();
    info!("stopped");
    result.map_err(Into::into)
}

async fn sweep_loop(coordinator: Coordinator, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match coordinator.sweep().await {
            Ok(0) => {}
            Ok(n) => info!(removed = n, "expiry sweep removed members"),
            Err(e) => warn!(error = %e, "expiry sweep failed; retrying next tick"),
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => info!("Ctrl-C received; shutting down"),
        _ = term => info!("SIGTERM received; shutting down"),
    }
}
