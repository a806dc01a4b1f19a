//! Connection timeouts (PROTOCOL §4.4).
//!
//! - **Header read**: the head of a request (HTTP/1 request line and headers) must arrive
//!   within `--header-read-timeout-ms` of its first byte, and a new connection must bring
//!   its first request head within that time of being opened; else the connection is closed
//!   (`rsc_http_header_timeouts_total`).
//! - **Idle**: a connection with no request in flight is closed after `--idle-timeout-ms`
//!   (`rsc_http_idle_closed_total`; HTTP/2 gets a `GOAWAY` first). A request in flight —
//!   a long poll, a wake-up channel streaming for minutes — keeps its connection open,
//!   however quiet it is.
//! - **Body read**: a request body must arrive within `--body-read-timeout-ms` of its head;
//!   a route reading it after that gets an error and refuses the request
//!   (`rsc_http_body_timeouts_total`).
//!
//! hyper's own `header_read_timeout` cannot do the first two: its timer (hyper 1.12) also
//! runs while a keep-alive connection waits for its next request, so it would close every
//! keep-alive connection idle for longer than the header timeout. Here a connection's
//! [`Activity`] (requests in flight, and when it went idle or when the next request's first
//! byte came) is shared by its I/O ([`Watched`], HTTP/1), its service ([`InFlight`] from the
//! call to the end of the response body) and its task, which sleeps until the deadline
//! [`Deadlines::poll_expired`] computes from it after every poll of the connection.

use axum::body::Body;
use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The timeouts of one connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    /// From a request's first byte (or the connection's start) to the end of its head.
    pub(super) header: Duration,
    /// With no request in flight.
    pub(super) idle: Duration,
}

/// Which timeout ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// A request head did not arrive in time.
    Header,
    /// No request for the idle timeout.
    Idle,
}

/// The mark bit of a request head on its way (else the connection is idle).
const HEAD: u64 = 1 << 63;

/// The origin of the millisecond times in [`Activity`]: a day before its first use, so that
/// no clock reads earlier (the paused clocks of tests start at the real time of their
/// runtime's start, which may come before another test's first use).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now)
    })
}

/// Milliseconds since [`epoch`].
fn now_ms() -> u64 {
    Instant::now()
        .saturating_duration_since(epoch())
        .as_millis() as u64
}

/// What one connection is doing, as far as its timeouts care.
#[derive(Debug)]
pub(super) struct Activity {
    /// Requests in flight: from the service call to the end (or drop) of the response body.
    in_flight: AtomicU32,
    /// With no request in flight: since when (ms after [`epoch`]) the connection is idle, or,
    /// with [`HEAD`] set, since when a request head is on its way.
    mark: AtomicU64,
}

impl Activity {
    /// A new connection: it owes its first request head from now.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_flight: AtomicU32::new(0),
            mark: AtomicU64::new(now_ms() | HEAD),
        })
    }

    /// Bytes arrived: with no request in flight, the next request's head has begun.
    fn received(&self) {
        if self.in_flight.load(Ordering::Acquire) != 0 {
            return;
        }
        let mark = self.mark.load(Ordering::Acquire);
        if mark & HEAD == 0 {
            let _ = self.mark.compare_exchange(
                mark,
                now_ms() | HEAD,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The next deadline and what it would end; `None` while a request is in flight.
    fn due(&self, timeouts: &Timeouts) -> Option<(Instant, Expiry)> {
        if self.in_flight.load(Ordering::Acquire) != 0 {
            return None;
        }
        let mark = self.mark.load(Ordering::Acquire);
        let (since, timeout, expiry) = if mark & HEAD != 0 {
            (mark & !HEAD, timeouts.header, Expiry::Header)
        } else {
            (mark, timeouts.idle, Expiry::Idle)
        };
        Some((epoch() + Duration::from_millis(since) + timeout, expiry))
    }
}

/// A request in flight on its connection, from the service call to the end of the
/// response body (it travels in the body, [`Answered`]).
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    /// Counts a request in flight on `activity`'s connection.
    pub(super) fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.mark.store(now_ms(), Ordering::Release);
        }
    }
}

/// A response body that holds its request [`InFlight`] until it is done with.
pub(super) struct Answered {
    body: Body,
    _in_flight: InFlight,
}

impl Answered {
    /// `body`, keeping `in_flight` until it ends or is dropped, as a response body.
    pub(super) fn body(body: Body, in_flight: InFlight) -> Body {
        Body::new(Answered {
            body,
            _in_flight: in_flight,
        })
    }
}

impl HttpBody for Answered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that must arrive within the body read timeout of its head.
pub(super) struct ReadDeadline<B> {
    body: B,
    deadline: Instant,
    /// Made the first time the body is not ready (most bodies come with their head).
    sleep: Option<Pin<Box<Sleep>>>,
    /// The deadline passed (counted once; every later read fails too).
    expired: bool,
}

/// The error of a request body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body read timeout (--body-read-timeout-ms)")]
pub(super) struct BodyTimedOut;

impl<B> ReadDeadline<B> {
    /// `body`, due within `timeout` from now.
    pub(super) fn new(body: B, timeout: Duration) -> Self {
        ReadDeadline {
            body,
            deadline: Instant::now() + timeout,
            sleep: None,
            expired: false,
        }
    }
}

impl<B> HttpBody for ReadDeadline<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        ready!(sleep.as_mut().poll(cx));
        this.expired = true;
        this.sleep = None;
        metrics::counter!("rsc_http_body_timeouts_total").increment(1);
        tracing::debug!("request body timed out");
        Poll::Ready(Some(Err(BodyTimedOut.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An HTTP/1 connection's I/O, telling its [`Activity`] when bytes arrive.
pub(super) struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I> Watched<I> {
    /// `io`, reporting to `activity`.
    pub(super) fn new(io: I, activity: Arc<Activity>) -> Self {
        Watched { io, activity }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.received();
        }
        read
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A connection's deadlines: its [`Activity`] against its [`Timeouts`].
pub(super) struct Deadlines {
    activity: Arc<Activity>,
    timeouts: Timeouts,
}

impl Deadlines {
    /// The deadlines of `activity`'s connection.
    pub(super) fn new(activity: Arc<Activity>, timeouts: Timeouts) -> Self {
        Deadlines { activity, timeouts }
    }

    /// A timer to pass to [`Self::poll_expired`].
    pub(super) fn timer(&self) -> Sleep {
        tokio::time::sleep(self.timeouts.idle)
    }

    /// Ready with the timeout that expired. Call it after every poll of the connection
    /// (which is what changes the activity of an HTTP/1 connection): it moves `timer` to
    /// the current deadline. While a request is in flight (on HTTP/2, where requests end
    /// on other tasks), the timer looks again every idle timeout.
    pub(super) fn poll_expired(
        &self,
        mut timer: Pin<&mut Sleep>,
        cx: &mut Context<'_>,
    ) -> Poll<Expiry> {
        loop {
            let due = self.activity.due(&self.timeouts);
            match due {
                Some((at, _)) if timer.deadline() != at => timer.as_mut().reset(at),
                None if timer.is_elapsed() => {
                    timer.as_mut().reset(Instant::now() + self.timeouts.idle)
                }
                _ => {}
            }
            ready!(timer.as_mut().poll(cx));
            if let Some((_, expiry)) = due {
                return Poll::Ready(expiry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    /// Polls `deadlines` once the way a connection task does; the expiry if any.
    async fn expired(deadlines: &Deadlines, mut timer: Pin<&mut Sleep>) -> Option<Expiry> {
        poll_fn(|cx| match deadlines.poll_expired(timer.as_mut(), cx) {
            Poll::Ready(e) => Poll::Ready(Some(e)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    /// A request body whose first frame comes at once and whose rest never does.
    struct Stalled(Option<Bytes>);

    impl HttpBody for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    /// The time until `deadlines` expire, and how, advancing paused time in 100 ms steps
    /// for at most `limit`.
    async fn time_to_expiry(
        deadlines: &Deadlines,
        timer: &mut Pin<&mut Sleep>,
        limit: Duration,
    ) -> Option<(Duration, Expiry)> {
        let start = Instant::now();
        while start.elapsed() <= limit {
            if let Some(e) = expired(deadlines, timer.as_mut()).await {
                return Some((start.elapsed(), e));
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        None
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_owes_its_head_then_idles_after_each_answer() {
        let activity = Activity::new();
        let deadlines = Deadlines::new(activity.clone(), T);
        let mut timer = std::pin::pin!(deadlines.timer());
        let (after, how) = time_to_expiry(&deadlines, &mut timer, T.idle)
            .await
            .unwrap();
        assert_eq!(how, Expiry::Header);
        assert!(after >= T.header && after < T.header + Duration::from_millis(200));

        // A request answered: idle from the end of its response.
        let activity = Activity::new();
        let deadlines = Deadlines::new(activity.clone(), T);
        let mut timer = std::pin::pin!(deadlines.timer());
        let request = InFlight::start(&activity);
        assert_eq!(
            time_to_expiry(&deadlines, &mut timer, T.idle * 3).await,
            None,
            "a request in flight is never cut"
        );
        drop(request);
        let (after, how) = time_to_expiry(&deadlines, &mut timer, T.idle * 2)
            .await
            .unwrap();
        assert_eq!(how, Expiry::Idle);
        assert!(after >= T.idle && after < T.idle + Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_of_a_new_head_on_an_idle_connection_start_the_header_clock() {
        let activity = Activity::new();
        let deadlines = Deadlines::new(activity.clone(), T);
        let mut timer = std::pin::pin!(deadlines.timer());
        drop(InFlight::start(&activity));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(expired(&deadlines, timer.as_mut()).await, None);
        activity.received();
        let (after, how) = time_to_expiry(&deadlines, &mut timer, T.idle)
            .await
            .unwrap();
        assert_eq!(how, Expiry::Header, "the head's clock, not the idle one");
        assert!(after >= T.header && after < T.header + Duration::from_millis(200));
        // Bytes while a request is in flight (a pipelined request, an EOF check) do not.
        let activity = Activity::new();
        let request = InFlight::start(&activity);
        activity.received();
        drop(request);
        assert_eq!(activity.due(&T).map(|d| d.1), Some(Expiry::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_come_in_time_fails() {
        let body = Stalled(Some(Bytes::from_static(b"{")));
        let mut read = ReadDeadline::new(body, Duration::from_secs(5));
        let first = poll_fn(|cx| Pin::new(&mut read).poll_frame(cx)).await;
        assert!(matches!(first, Some(Ok(_))));
        let started = Instant::now();
        let second = poll_fn(|cx| Pin::new(&mut read).poll_frame(cx)).await;
        assert!(matches!(second, Some(Err(_))), "the rest never came");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let again = poll_fn(|cx| Pin::new(&mut read).poll_frame(cx)).await;
        assert!(matches!(again, Some(Err(_))), "and it stays failed");
    }
}
