//! `Connection: close` on an HTTP/1 response whose request body was not read to its end
//! (PROTOCOL §20, "Keep-alive and unread request bodies").
//!
//! A route can answer before it reads the body: a refused token (401), a wrong method
//! (405), a content type it does not take (400), a body over the limit (413). hyper then
//! writes the response head as a keep-alive one, and only afterwards notices that nobody
//! reads the rest of the body; unless that rest is already in its buffer it closes the
//! connection. A client that had read the keep-alive response and sent its next request on
//! the same connection then sees the connection end without an answer (over TLS Python
//! reports `EOF occurred in violation of protocol`). RFC 9112 §9.6 has the server say
//! `Connection: close` on the response after which it closes; this middleware does, on
//! every HTTP/1 response to a request whose body was not read to its end, so the client
//! does not reuse that connection. (HTTP/2 ends the stream alone and keeps the connection.)

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// The middleware: runs the request with its body wrapped in [`Tracked`], and adds
/// `Connection: close` to the response of an HTTP/1 request whose body did not end.
pub(crate) async fn close_if_body_unread(req: Request, next: Next) -> Response {
    let http1 = req.version() < Version::HTTP_2;
    let (parts, body) = req.into_parts();
    let (body, ended) = Tracked::new(body);
    let mut response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if http1 && !ended.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records whether it was read to its end.
struct Tracked {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl Tracked {
    /// `body` wrapped, and the flag it sets once it has ended (at once for an empty body).
    fn new(body: Body) -> (Self, Arc<AtomicBool>) {
        let ended = Arc::new(AtomicBool::new(body.is_end_stream()));
        let tracked = Tracked {
            inner: body,
            ended: ended.clone(),
        };
        (tracked, ended)
    }
}

impl HttpBody for Tracked {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // The end: no more frames, or the last frame of a body of known length.
        let end = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if end {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    /// `/read` reads the body, `/ignore` answers without reading it.
    fn app() -> Router {
        Router::new()
            .route("/read", post(|body: String| async move { body }))
            .route("/ignore", post(|| async { "refused" }))
            .layer(axum::middleware::from_fn(close_if_body_unread))
    }

    async fn connection(path: &str, body: &'static str, version: Version) -> Option<String> {
        let req = Request::post(path)
            .version(version)
            .body(Body::from(body))
            .unwrap();
        let resp = app().oneshot(req).await.unwrap();
        resp.headers()
            .get(header::CONNECTION)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    #[tokio::test]
    async fn only_a_response_to_an_unread_http1_body_closes_the_connection() {
        assert_eq!(
            connection("/ignore", "x", Version::HTTP_11)
                .await
                .as_deref(),
            Some("close")
        );
        assert_eq!(connection("/read", "x", Version::HTTP_11).await, None);
        assert_eq!(connection("/ignore", "", Version::HTTP_11).await, None);
        assert_eq!(connection("/ignore", "x", Version::HTTP_2).await, None);
    }
}
