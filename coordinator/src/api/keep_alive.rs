//! An HTTP/1 request whose body the route did not read to its end (PROTOCOL §20,
//! "Keep-alive and unread request bodies").
//!
//! A route can answer before it reads the body: a refused token (401), a wrong method
//! (405), a content type it does not take (400), a body over the limit (413). hyper then
//! writes the response head as a keep-alive one, and only afterwards notices that nobody
//! reads the rest of the body; unless that rest is already in its buffer it closes the
//! connection. A client that had read the keep-alive response and sent its next request on
//! the same connection then sees the connection end without an answer (over TLS, Python
//! reports `EOF occurred in violation of protocol`); and a client still sending the body
//! when the server closes gets a TCP reset, which can discard the response it has not read
//! yet. So before the response leaves, this middleware reads the rest of the body and
//! discards it — at most [`DRAIN_LIMIT`] bytes, for at most [`DRAIN_TIMEOUT`] — and the
//! connection stays usable. When that is not possible (a larger or slower body, a request
//! that waits for `100 Continue`, a body the route still holds) the response says
//! `Connection: close` (RFC 9112 §9.6), and the client does not reuse the connection.
//! HTTP/2 ends the stream alone and keeps the connection: nothing is done there.

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
use std::time::Duration;
use tokio::sync::oneshot;

/// The most of an unread request body read and discarded to keep the connection: the
/// default body limit (PROTOCOL §4).
pub(crate) const DRAIN_LIMIT: usize = super::DEFAULT_BODY_LIMIT;
/// The longest the response to an unread request body waits for the rest of that body.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The middleware: runs the request with its body wrapped in [`Tracked`]; when the body
/// did not end, drains what the route left or else adds `Connection: close`.
pub(crate) async fn close_if_body_unread(req: Request, next: Next) -> Response {
    let http1 = req.version() < Version::HTTP_2;
    let waits_for_continue = req.headers().contains_key(header::EXPECT);
    let (parts, body) = req.into_parts();
    let (body, ended, mut left) = Tracked::new(body);
    let mut response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if !http1 || ended.load(Ordering::Acquire) {
        return response;
    }
    let drained = match left.try_recv() {
        Ok(rest) if !waits_for_continue => drain(rest).await,
        _ => false,
    };
    if !drained {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reads `rest` to its end and discards it; false if it is longer than [`DRAIN_LIMIT`],
/// takes longer than [`DRAIN_TIMEOUT`] or fails.
async fn drain(rest: Body) -> bool {
    let read = axum::body::to_bytes(rest, DRAIN_LIMIT);
    matches!(tokio::time::timeout(DRAIN_TIMEOUT, read).await, Ok(Ok(_)))
}

/// A request body that records whether it was read to its end, and that hands what is
/// left of it back to the middleware when the route drops it before the end.
struct Tracked {
    inner: Option<Body>,
    ended: Arc<AtomicBool>,
    left: Option<oneshot::Sender<Body>>,
}

impl Tracked {
    /// `body` wrapped, the flag it sets once it has ended (at once for an empty body), and
    /// the receiver of what is left if it is dropped before.
    fn new(body: Body) -> (Self, Arc<AtomicBool>, oneshot::Receiver<Body>) {
        let ended = Arc::new(AtomicBool::new(body.is_end_stream()));
        let (tx, rx) = oneshot::channel();
        let tracked = Tracked {
            inner: Some(body),
            ended: ended.clone(),
            left: Some(tx),
        };
        (tracked, ended, rx)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.ended.load(Ordering::Acquire)
            && let (Some(inner), Some(left)) = (self.inner.take(), self.left.take())
        {
            let _ = left.send(inner);
        }
    }
}

impl HttpBody for Tracked {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        // The end: no more frames, or the last frame of a body of known length.
        let end = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => inner.is_end_stream(),
            _ => false,
        };
        if end {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
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

    /// The `Connection` header of the response to `POST path` with `body`.
    async fn connection(path: &str, body: Body, version: Version, expect: bool) -> Option<String> {
        let mut req = Request::post(path).version(version);
        if expect {
            req = req.header(header::EXPECT, "100-continue");
        }
        let resp = app().oneshot(req.body(body).unwrap()).await.unwrap();
        resp.headers()
            .get(header::CONNECTION)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// A body whose next frame never comes.
    struct Stalled;

    impl HttpBody for Stalled {
        type Data = axum::body::Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn an_unread_body_is_drained_and_the_connection_kept() {
        let h1 = Version::HTTP_11;
        assert_eq!(connection("/read", Body::from("x"), h1, false).await, None);
        assert_eq!(
            connection("/ignore", Body::from("x"), h1, false).await,
            None
        );
        assert_eq!(connection("/ignore", Body::empty(), h1, false).await, None);
    }

    #[tokio::test]
    async fn a_body_that_cannot_be_drained_closes_the_connection() {
        let h1 = Version::HTTP_11;
        let big = || Body::from(vec![b'x'; DRAIN_LIMIT + 1]);
        let close = Some("close");
        assert_eq!(
            connection("/ignore", big(), h1, false).await.as_deref(),
            close
        );
        let waits = connection("/ignore", Body::from("x"), h1, true).await;
        assert_eq!(waits.as_deref(), close, "Expect: 100-continue");
        // A body whose rest does not come within the drain timeout (its sender stays open).
        let slow = Body::new(Stalled);
        let started = std::time::Instant::now();
        assert_eq!(
            connection("/ignore", slow, h1, false).await.as_deref(),
            close
        );
        assert!(started.elapsed() >= DRAIN_TIMEOUT);
        // HTTP/2 ends the stream, not the connection.
        assert_eq!(
            connection("/ignore", big(), Version::HTTP_2, false).await,
            None
        );
    }
}
