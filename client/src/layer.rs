//! Middleware around a listener's handler: [tower](https://docs.rs/tower) layers, added with
//! [`crate::Listener::layer`] (GUIDE "Layers").
//!
//! Each attempt of the handler is one call of a [`tower::Service`] taking an [`Attempt`] (the
//! message, or a batch listener's messages, with their attempt numbers) and answering
//! [`Verdicts`] (one per message). The innermost service decodes the payloads, calls the
//! handler (a panic is a failed attempt) and carries the trace context; the listener's layers
//! wrap it, the last added outermost. Retries (the listener's backoff), dead letters,
//! acknowledgements and the handler metrics are around the whole stack: a layer sees every
//! attempt, and what it answers is settled by the same rules as a handler's verdict.
//!
//! A layer's error (`Err`) fails every message of the attempt with a retry, e.g. tower's
//! `Elapsed` from a timeout; to give another verdict, answer [`Verdicts::all`].
//!
//! ```
//! use rsc_client::layer::{Attempt, Verdicts};
//! use rsc_client::prelude::*;
//! use std::time::Duration;
//!
//! async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> { Ok(()) }
//!
//! let listener = Listener::new("billing", "orders", on_order)
//!     // Each attempt gets 5 s (then it fails and is retried); at most 32 run at once in the
//!     // process (all shards and members of the listener together).
//!     .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(5)))
//!     .layer(tower::limit::ConcurrencyLimitLayer::new(32))
//!     // Your own: a function of the attempt and the next service.
//!     .layer(tower::layer::layer_fn(|inner: rsc_client::layer::HandlerService| {
//!         tower::service_fn(move |attempt: Attempt| {
//!             let inner = inner.clone();
//!             async move {
//!                 let shard = attempt.shard();
//!                 let verdicts = tower::ServiceExt::oneshot(inner, attempt).await?;
//!                 if verdicts.failed() > 0 {
//!                     eprintln!("shard {shard}: {} failed", verdicts.failed());
//!                 }
//!                 Ok::<Verdicts, rsc_client::BoxError>(verdicts)
//!             }
//!         })
//!     }));
//! assert_eq!(listener.layer_count(), 3);
//! ```

use crate::error::BoxError;
use crate::handler::HandlerError;
use crate::message::{Entry, Origin};
use futures::future::BoxFuture;
use std::sync::Arc;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

/// The service a layer wraps: one attempt in, the verdicts out.
pub type HandlerService = BoxCloneSyncService<Attempt, Verdicts, BoxError>;

/// Wraps the stack below in one more layer (type-erased: applied once the handler is bound).
pub(crate) type Wrap = Arc<dyn Fn(HandlerService) -> HandlerService + Send + Sync>;

/// One attempt of the handler on a call's messages: one message for a single-message
/// listener, up to `max_batch` for a batch listener, in stream order.
#[derive(Clone)]
pub struct Attempt {
    pub(crate) entries: Vec<(Arc<Entry>, u32)>,
    pub(crate) origin: Arc<Origin>,
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempt")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .field("attempt", &self.attempt())
            .field("shard_key", &self.origin.shard_key)
            .finish()
    }
}

impl Attempt {
    /// How many messages.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no message (never, for an attempt the runtime makes).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The messages' entry ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(e, _)| e.id.as_str())
    }

    /// The messages' routing keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = Option<&str>> {
        self.entries.iter().map(|(e, _)| e.key.as_deref())
    }

    /// The attempt number (1 for a first attempt; a batch: the highest of its messages).
    pub fn attempt(&self) -> u32 {
        self.entries.iter().map(|(_, a)| *a).max().unwrap_or(1)
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.origin.group
    }

    /// The stream.
    pub fn stream(&self) -> &str {
        &self.origin.stream
    }

    /// The shard index.
    pub fn shard(&self) -> u32 {
        self.origin.shard
    }

    /// The member handling it.
    pub fn member_id(&self) -> &str {
        &self.origin.member_id
    }
}

/// An attempt's verdicts: one per message, in order (`None`: handled).
#[derive(Debug)]
pub struct Verdicts(pub(crate) Vec<Option<HandlerError>>);

impl Verdicts {
    /// Every one of `attempt`'s messages gets `error` (a batch-wide verdict; e.g. a layer
    /// that dead-letters what it refuses).
    pub fn all(attempt: &Attempt, error: HandlerError) -> Self {
        Verdicts(
            (0..attempt.len())
                .map(|_| Some(error.duplicate()))
                .collect(),
        )
    }

    /// How many messages failed.
    pub fn failed(&self) -> usize {
        self.0.iter().filter(|v| v.is_some()).count()
    }

    /// The verdict of message `i` (`None`: handled, or no such message).
    pub fn error(&self, i: usize) -> Option<&HandlerError> {
        self.0.get(i).and_then(Option::as_ref)
    }
}

/// Type-erases `layer` for [`crate::Listener::layer`].
pub(crate) fn wrap<L>(layer: L) -> Wrap
where
    L: Layer<HandlerService> + Send + Sync + 'static,
    L::Service: Service<Attempt, Response = Verdicts> + Clone + Send + Sync + 'static,
    <L::Service as Service<Attempt>>::Error: Into<BoxError>,
    <L::Service as Service<Attempt>>::Future: Send + 'static,
{
    Arc::new(move |inner| BoxCloneSyncService::new(layer.layer(inner).map_err(Into::into)))
}

/// Runs one attempt through `service`: the verdicts, or, when the stack failed, that error
/// (a retry) for every message.
pub(crate) fn run(
    service: HandlerService,
    attempt: Attempt,
) -> BoxFuture<'static, Vec<Option<HandlerError>>> {
    let n = attempt.len();
    Box::pin(async move {
        match service.oneshot(attempt).await {
            Ok(Verdicts(v)) if v.len() == n => v,
            Ok(Verdicts(v)) => {
                let e = format!("a layer answered {} verdicts for {n} messages", v.len());
                (0..n)
                    .map(|_| Some(HandlerError::retry(e.clone())))
                    .collect()
            }
            Err(e) => {
                let first = HandlerError::retry(e);
                let mut v: Vec<Option<HandlerError>> =
                    (1..n).map(|_| Some(first.duplicate())).collect();
                v.insert(0, Some(first));
                v
            }
        }
    })
}
