//! What a listener function returns, and the trait that turns an `async fn` into a handler.

use crate::message::{Batch, Message};
use crate::state::{Data, DataKey, DataMap};
use futures::future::BoxFuture;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::error::BoxError;

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
    /// Not a failure of the message: try it again after this delay, without counting the
    /// attempt against `max_retries` (a dependency answered "later", such as an HTTP `429` or
    /// `503` with `Retry-After`, or could not be reached). The shard (with key concurrency,
    /// the key) waits meanwhile, so the worker reads no further than its queue's bound: an
    /// unavailable dependency holds entries back rather than dead-lettering them. A stop
    /// (revocation, shutdown) cuts the wait short and leaves the entry pending.
    Defer(Duration),
}

/// The error a listener returns: the cause, and what the runtime should do about it.
///
/// `?` on any `std::error::Error` (or an `anyhow::Error`, a `String`) gives a
/// [`FailureAction::Retry`]; a handler may also return `Result<(), E>` for any such `E`, e.g.
/// `anyhow::Result<()>`. Say otherwise with
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

/// The text of a panic payload (`&str` or `String`).
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

impl HandlerError {
    /// The handler panicked: retried like any failure (the panic's text is the error).
    pub(crate) fn panicked(panic: &(dyn std::any::Any + Send)) -> Self {
        HandlerError::retry(format!("handler panicked: {}", panic_text(panic)))
    }

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

    /// Not a failure: try the message again after `delay` without counting an attempt
    /// ([`FailureAction::Defer`]); `reason` is logged.
    pub fn defer(delay: Duration, reason: impl Into<BoxError>) -> Self {
        HandlerError {
            action: FailureAction::Defer(delay),
            error: reason.into(),
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

    /// The same verdict and message, for each message of a batch that failed as a whole.
    pub(crate) fn duplicate(&self) -> HandlerError {
        HandlerError {
            action: self.action,
            // The whole chain: the copy has no source of its own.
            error: self.to_string().into(),
        }
    }

    /// The cause.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

/// Any error that converts into a boxed error converts into a retried [`HandlerError`]: every
/// `std::error::Error`, `anyhow::Error`, `String` and `&str`.
impl<E: Into<BoxError>> From<E> for HandlerError {
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

/// The error and its causes (`source()` chain), `: `-separated as anyhow's `{:#}` prints
/// them: the dead letter's `error` field and the logs keep the whole chain. A cause whose
/// text the message before it already ends with (`"redis: {0}"` over its own source) is not
/// printed twice.
impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::error::chain_text(&*self.error))
    }
}

/// The verdicts of a batch handler that failed: one for the whole batch, or one per message.
///
/// `?` in a batch handler fails the whole batch with a [`HandlerError`] (every message is
/// retried, or dead-lettered, individually). To fail some messages only, name them: the
/// others are acknowledged.
///
/// ```
/// use rsc_client::prelude::*;
///
/// async fn on_orders(batch: Batch<u64>) -> Result<(), BatchError> {
///     let mut failed = BatchError::new();
///     for msg in &batch {
///         if *msg.payload() == 0 {
///             failed = failed.message(msg, HandlerError::dead_letter("zero"));
///         }
///     }
///     failed.into_result()
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err = on_orders(Batch::test(vec![1, 0, 2])).await.unwrap_err();
/// assert_eq!(err.failed_messages(), 1);
/// # }
/// ```
pub struct BatchError {
    pub(crate) all: Option<HandlerError>,
    pub(crate) each: Vec<(String, HandlerError)>,
}

impl BatchError {
    /// No failure yet: add some with [`Self::message`].
    pub fn new() -> Self {
        BatchError {
            all: None,
            each: Vec::new(),
        }
    }

    /// The whole batch failed with `error`.
    pub fn all(error: HandlerError) -> Self {
        BatchError {
            all: Some(error),
            each: Vec::new(),
        }
    }

    /// `msg` failed with `error` (the batch's other messages succeeded unless named too).
    pub fn message<T>(self, msg: &Message<T>, error: HandlerError) -> Self {
        self.entry(msg.id(), error)
    }

    /// The message with entry id `id` failed with `error`.
    pub fn entry(mut self, id: impl Into<String>, error: HandlerError) -> Self {
        self.each.push((id.into(), error));
        self
    }

    /// How many messages were named as failed.
    pub fn failed_messages(&self) -> usize {
        self.each.len()
    }

    /// `Ok(())` when no message was named and the batch did not fail, else `Err(self)`.
    pub fn into_result(self) -> Result<(), BatchError> {
        if self.all.is_none() && self.each.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl Default for BatchError {
    fn default() -> Self {
        Self::new()
    }
}

impl From<HandlerError> for BatchError {
    fn from(e: HandlerError) -> Self {
        BatchError::all(e)
    }
}

impl fmt::Debug for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchError")
            .field("all", &self.all)
            .field("each", &self.each)
            .finish()
    }
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.all {
            Some(e) => write!(f, "the batch failed: {e}"),
            None => write!(f, "{} message(s) of the batch failed", self.each.len()),
        }
    }
}

/// An `async fn(Message<T>, Data<A>…) -> Result<(), E>`: what a listener runs per message.
///
/// Implemented for every such function and closure (with up to four [`Data`] arguments, `E`
/// any error that converts into a [`HandlerError`]); you do not implement it yourself.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a listener handler",
    label = "expected an `async fn(Message<T>, Data<A>…) -> Result<(), HandlerError>`",
    note = "T is the payload type: a `serde::Deserialize` type, or `Raw` for the bytes as sent; \
            the optional further arguments are `Data<A>` values given to the app with `.data()`"
)]
pub trait Handler<T, Args>: Send + Sync + 'static {
    /// The [`Data`] types the handler asks for.
    #[doc(hidden)]
    fn requires() -> Vec<DataKey>;

    /// Handles one message.
    #[doc(hidden)]
    fn call(&self, msg: Message<T>, data: &DataMap)
    -> BoxFuture<'static, Result<(), HandlerError>>;
}

/// An `async fn(Batch<T>, Data<A>…) -> Result<(), E>`: what a batch listener runs per batch.
///
/// `E` is [`BatchError`] (verdicts per message) or anything that converts into a
/// [`HandlerError`] (one verdict for the batch). Implemented for every such function and
/// closure; you do not implement it yourself.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a batch listener handler",
    label = "expected an `async fn(Batch<T>, Data<A>…) -> Result<(), BatchError>`",
    note = "T is the payload type; the optional further arguments are `Data<A>` values given \
            to the app with `.data()`"
)]
pub trait BatchHandler<T, Args>: Send + Sync + 'static {
    /// The [`Data`] types the handler asks for.
    #[doc(hidden)]
    fn requires() -> Vec<DataKey>;

    /// Handles one batch.
    #[doc(hidden)]
    fn call(&self, batch: Batch<T>, data: &DataMap) -> BoxFuture<'static, Result<(), BatchError>>;
}

/// What a batch handler's error may be: [`BatchError`], or anything that converts into a
/// [`HandlerError`] (a verdict for the whole batch).
pub trait IntoBatchError {
    /// The verdicts.
    fn into_batch_error(self) -> BatchError;
}

impl IntoBatchError for BatchError {
    fn into_batch_error(self) -> BatchError {
        self
    }
}

impl<E: Into<HandlerError>> IntoBatchError for E {
    fn into_batch_error(self) -> BatchError {
        BatchError::all(self.into())
    }
}

fn missing<T, R: Send + 'static>(wrap: fn(HandlerError) -> R) -> BoxFuture<'static, Result<(), R>> {
    // build() refuses a listener whose data is missing: this is only reached by a listener
    // that was never built into an app.
    let err = HandlerError::dead_letter(format!(
        "no Data<{}> was given to the app (ConsumerAppBuilder::data)",
        std::any::type_name::<T>()
    ));
    let err = wrap(err);
    Box::pin(async move { Err(err) })
}

macro_rules! handler_impls {
    ($($d:ident),*) => {
        #[allow(non_snake_case, unused_variables)]
        impl<F, Fut, T, E, $($d,)*> Handler<T, ($(Data<$d>,)*)> for F
        where
            F: Fn(Message<T> $(, Data<$d>)*) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<(), E>> + Send + 'static,
            E: Into<HandlerError>,
            // No `T: Payload` here: `Listener::new` asks it, so that a payload type that does
            // not decode gets one error saying so (`Payload`'s), not a second one here.
            T: Send + 'static,
            $($d: Send + Sync + 'static,)*
        {
            fn requires() -> Vec<DataKey> {
                vec![$(DataKey::of::<$d>()),*]
            }

            fn call(
                &self,
                msg: Message<T>,
                data: &DataMap,
            ) -> BoxFuture<'static, Result<(), HandlerError>> {
                $(let Some($d) = data.get::<$d>() else { return missing::<$d, _>(|e| e) };)*
                let fut = self(msg $(, $d)*);
                Box::pin(async move { fut.await.map_err(Into::into) })
            }
        }

        #[allow(non_snake_case, unused_variables)]
        impl<F, Fut, T, E, $($d,)*> BatchHandler<T, ($(Data<$d>,)*)> for F
        where
            F: Fn(Batch<T> $(, Data<$d>)*) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<(), E>> + Send + 'static,
            E: IntoBatchError,
            T: Send + 'static,
            $($d: Send + Sync + 'static,)*
        {
            fn requires() -> Vec<DataKey> {
                vec![$(DataKey::of::<$d>()),*]
            }

            fn call(
                &self,
                batch: Batch<T>,
                data: &DataMap,
            ) -> BoxFuture<'static, Result<(), BatchError>> {
                $(let Some($d) = data.get::<$d>() else {
                    return missing::<$d, _>(BatchError::all)
                };)*
                let fut = self(batch $(, $d)*);
                Box::pin(async move { fut.await.map_err(IntoBatchError::into_batch_error) })
            }
        }
    };
}

handler_impls!();
handler_impls!(A1);
handler_impls!(A1, A2);
handler_impls!(A1, A2, A3);
handler_impls!(A1, A2, A3, A4);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Db {
        #[error("db: {0}")]
        Io(#[from] std::io::Error),
    }

    #[test]
    fn the_error_text_keeps_every_cause_once() {
        use anyhow::Context as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Err::<(), _>(Db::from(io))
            .context("saving order 7")
            .unwrap_err();
        let handler_error = HandlerError::from(err);
        assert_eq!(handler_error.to_string(), "saving order 7: db: refused");
        assert_eq!(
            handler_error.duplicate().to_string(),
            "saving order 7: db: refused",
            "each message of a failed batch keeps the chain"
        );
        assert_eq!(HandlerError::retry("plain").to_string(), "plain");
    }
}
