//! HTTP request metrics by route template, method and status.

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;

/// Middleware: counts every request (`rsc_http_requests_total{route,method,status}`) and
/// times it (`rsc_http_request_duration_seconds{route,method}`). `route` is the matched path
/// template (`/v1/groups/{group}`), or `unmatched`.
pub(crate) async fn track_http(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = method_label(req.method());
    let start = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!("rsc_http_request_duration_seconds", "route" => route.clone(), "method" => method)
        .record(start.elapsed().as_secs_f64());
    metrics::counter!("rsc_http_requests_total", "route" => route, "method" => method, "status" => status)
        .increment(1);
    response
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}
