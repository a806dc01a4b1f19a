//! The operators' live page at `GET /` (PROTOCOL §4): groups, members, a shard ownership grid
//! (target vs current owner, pending revocations, draining shards, lag), reshard progress and
//! recent audit entries, refreshed every second.
//!
//! The page is one self-contained HTML document: `index.html` with `dashboard.css` and
//! `dashboard.js` inlined, all embedded in the binary at compile time. There is no front-end
//! build step and it fetches nothing but this coordinator's own `/v1` API (its
//! Content-Security-Policy forbids anything else). The shell is served without a token; the
//! page asks for a viewer token, keeps it in `sessionStorage` and sends it as a bearer token
//! on its API calls (a coordinator running open needs none).

use axum::http::header;
use axum::response::IntoResponse;
use std::sync::LazyLock;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

const HTML: &str = include_str!("index.html");
const CSS: &str = include_str!("dashboard.css");
const JS: &str = include_str!("dashboard.js");

/// Only inline script and style, and requests to this origin.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

static PAGE: LazyLock<String> = LazyLock::new(|| {
    HTML.replacen("/*@STYLE@*/", CSS, 1)
        .replacen("/*@SCRIPT@*/", JS, 1)
});

/// The whole dashboard page, as served.
pub(crate) fn page() -> &'static str {
    &PAGE
}

/// `GET /` (and `HEAD /`), documented in the OpenAPI document.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> OpenApiRouter<S> {
    OpenApiRouter::new().routes(routes!(serve_page))
}

/// The dashboard page (HTML, open: its data calls need a viewer token).
#[utoipa::path(
    get, path = "/", tag = "dashboard",
    responses((status = 200, description = "The dashboard page", content_type = "text/html", body = String))
)]
async fn serve_page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        page(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_is_assembled_and_self_contained() {
        let p = page();
        assert!(!p.contains("/*@STYLE@*/") && !p.contains("/*@SCRIPT@*/"));
        assert!(p.contains("function renderGrid") && p.contains(".cell.revoking"));
        // Inlined assets must not close their own element early.
        assert!(!JS.contains("</script") && !CSS.contains("</style"));
        // No external fetches: no absolute URLs anywhere in the page.
        assert!(
            !p.contains("http://") && !p.contains("https://") && !p.contains("//cdn"),
            "the dashboard must not reference external resources"
        );
    }
}
