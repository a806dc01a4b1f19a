//! The HTTP edge (axum): routers by audience, one error type, JSON in and out.
//!
//! Handlers are a few lines each: extract, call the [`Coordinator`], answer. Every failure
//! becomes the SPEC's error body in exactly one place ([`ApiError`]'s `IntoResponse`).

mod admin;
mod error;
mod members;
mod monitoring;
mod producers;

pub use error::{ApiError, Json, Path, Query};

use crate::service::Coordinator;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use rsc_protocol::ErrorCode;
use tower_http::trace::TraceLayer;

/// The default request body limit (SPEC §4: 64 KiB).
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Shared state of every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The coordinator service.
    pub coordinator: Coordinator,
}

/// The whole `/v1` API plus health routes, with the SPEC's fallbacks for unknown routes and
/// methods and the body size limit.
pub fn router(state: AppState, body_limit: usize) -> Router {
    Router::new()
        .merge(admin::routes())
        .merge(members::routes())
        .merge(producers::routes())
        .merge(monitoring::routes())
        .merge(crate::dashboard::routes())
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
