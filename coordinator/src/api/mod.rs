//! The HTTP edge (axum): routers by audience, one error type, JSON in and out.
//!
//! Handlers are a few lines each: extract, call the [`Coordinator`], answer. Every failure
//! becomes the protocol's error body in exactly one place ([`ApiError`]'s `IntoResponse`).
//! Routes are registered with their OpenAPI description (`utoipa_axum::routes!`), so the
//! router and [`openapi()`] come from the same list; access is decided per route by
//! [`crate::auth::enforce`] from [`crate::auth::policy::ROUTES`].

mod admin;
mod extract;
mod keep_alive;
mod members;
mod monitoring;
mod openapi;
mod producers;
mod revisions;

pub(crate) use crate::http_error::ApiError;

use crate::auth::{self, Security};
use crate::metrics::{self, History, LagProbe};
use crate::service::Coordinator;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use rsc_protocol::ErrorCode;
use std::sync::Arc;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;

/// The default request body limit (PROTOCOL §4: 64 KiB).
pub(crate) const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Shared state of every handler: one `Arc`, because the router clones the state for every
/// request (and every `State` extractor once more); a clone is one reference count.
#[derive(Debug, Clone)]
pub(crate) struct AppState(Arc<Shared>);

impl AppState {
    pub(crate) fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The coordinator service.
    pub coordinator: Coordinator,
    /// ACL, rate limit and audit.
    pub security: Arc<Security>,
    /// Lag and pending per shard from the data Redis, when configured.
    pub lag: Option<Arc<LagProbe>>,
    /// The lag history's cadence and bounds (sampled through `lag`).
    pub history: History,
}

/// Every route with its OpenAPI description.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .merge(admin::routes())
        .merge(members::routes())
        .merge(producers::routes())
        .merge(monitoring::routes())
        .merge(revisions::routes())
        .merge(openapi::routes())
        .merge(crate::dashboard::routes())
}

/// The OpenAPI 3.1 document of every route (served at `/openapi.json`).
pub(crate) fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = routes().into_openapi();
    openapi::document_access(&mut doc);
    doc
}

/// The whole `/v1` API plus health, metrics and the OpenAPI document, behind the access
/// middleware, with the protocol's fallbacks for unknown routes and methods and the body size
/// limit; an HTTP/1 response to a request whose body was not read says `Connection: close`
/// (PROTOCOL §20).
pub(crate) fn router(state: AppState, body_limit: usize) -> Router {
    let (router, _) = routes().split_for_parts();
    with_edges(router, state, body_limit)
}

/// `router`'s routes behind the access middleware and the edges every request passes.
fn with_edges(router: Router<AppState>, state: AppState, body_limit: usize) -> Router {
    router
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(from_fn_with_state(state.security.clone(), auth::enforce))
        .layer(from_fn(metrics::track_http))
        .layer(TraceLayer::new_for_http())
        .layer(from_fn(keep_alive::close_if_body_unread))
        .with_state(state)
}

#[cfg(test)]
mod tests;
