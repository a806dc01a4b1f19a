//! What a listener function returns, and the trait that turns an `async fn` into a handler.

use crate::message::{Message, Payload};
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// A boxed error, what [`HandlerError`] carries.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What the runtime does with a message whose handler failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureAction {
    /// Retry after the listener's backoff, until its `max_retries`; then dead-letter.
    Retry,
    /// Retry after this delay (counts as a retry).
    RetryAfter(Duration),
    /// Write the message to `<stream>:dlq` now and acknowledge it: retrying cannot help.
    DeadLetter,
}

/// The error a listener returns: the cause, and what the runtime should do about it.
///
/// `?` on any `std::error::Error` gives a [`FailureAction::Retry`]. Say otherwise with
/// [`HandlerError::dead_letter`] (a poison message) or [`HandlerError::retry_after`] (a
/// dependency asked to wait).
///
/// ```
/// use rsc_client::{FailureAction, HandlerError};
/// use std::time::Duration;
///
/// fn parse(s: &str) -> Result<u64, HandlerError> {
///     let n: u64 = s.parse()?; // a ParseIntError: retried
///     if n == 0 {
///         return Err(HandlerError::dead_letter("zero is never valid"));
///     }
///     Ok(n)
/// }
/// assert_eq!(parse("x").unwrap_err().action(), FailureAction::Retry);
/// assert_eq!(parse("0").unwrap_err().action(), FailureAction::DeadLetter);
/// let later = HandlerError::retry_after(Duration::from_secs(1), "rate limited");
/// assert_eq!(later.action(), FailureAction::RetryAfter(Duration::from_secs(1)));
/// ```
pub struct HandlerError {
    action: FailureAction,
    error: BoxError,
}

impl HandlerError {
    /// A failure to retry with the listener's backoff.
    pub fn retry(error: impl Into<BoxError>) -> Self {
        HandlerError {
            action: FailureAction::Retry,
            error: error.into(),
        }
    }

    /// A failure to retry after `delay`.
    pub fn retry_after(delay: Duration, error: impl Into<BoxError>) -> Self {
        HandlerError {
            action: FailureAction::RetryAfter(delay),
            error: error.into(),
        }
    }

    /// A failure to dead-letter at once, without retrying.
    pub fn dead_letter(error: impl Into<BoxError>) -> Self {
        HandlerError {
            action: FailureAction::DeadLetter,
            error: error.into(),
        }
    }

    /// What the runtime will do.
    pub fn action(&self) -> FailureAction {
        self.action
    }

    /// The cause.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::retry(e)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("action", &self.action)
            .field("error", &self.error)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// An `async fn(Message<T>) -> Result<(), HandlerError>`: what a listener runs per message.
///
/// Implemented for every such function and closure; you do not implement it yourself.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a listener handler",
    label = "expected an `async fn(Message<T>) -> Result<(), HandlerError>`",
    note = "T is the payload type: a `serde::Deserialize` type, or `Raw` for the bytes as sent"
)]
pub trait Handler<T>: Send + Sync + 'static {
    /// The future the handler returns.
    type Future: Future<Output = Result<(), HandlerError>> + Send + 'static;

    /// Handles one message.
    fn call(&self, msg: Message<T>) -> Self::Future;
}

impl<F, Fut, T> Handler<T> for F
where
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    T: Payload,
{
    type Future = Fut;

    fn call(&self, msg: Message<T>) -> Fut {
        self(msg)
    }
}
