//! Listeners whose handler lives outside Rust: the one seam that language bindings (the
//! Python package, a Node.js addon) call, so that no protocol rule is written twice.
//!
//! A binding turns its handler into a [`ForeignHandler`]: a function from an owned
//! [`ForeignMessage`] (plain data: strings, numbers, bytes, and an [`Acker`]) to a future of
//! a [`Verdict`]. [`listener`] and [`batch_listener`] wrap it in an ordinary [`Listener`]
//! whose payload is [`Raw`] bytes: reading, retries, dead letters, acknowledgements, lanes,
//! fencing and rebalancing stay the client's. The binding only converts values and calls.
//! A binding's producer calls [`publish_batch`], which takes the publish's turn at the call
//! (an event loop's publishes keep their call order).
//!
//! ```
//! use rsc_client::foreign::{ForeignMessage, ListenerSpec, Verdict, listener};
//! use std::sync::Arc;
//!
//! let spec = ListenerSpec::new("billing", "orders");
//! let l = listener(&spec, Arc::new(|msg: ForeignMessage| {
//!     Box::pin(async move {
//!         if msg.payload.is_empty() { Verdict::DeadLetter("empty".into()) } else { Verdict::Done }
//!     })
//! }));
//! assert_eq!(l.group(), "billing");
//! ```

use crate::ClientError;
use crate::handler::{BatchError, HandlerError};
use crate::listener::{AckMode, Listener, Rebalance};
use crate::message::{Acker, Batch, Headers, Message, Raw};
use crate::producer::{Producer, Published, Record};
use futures::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// One message, owned and decoded into plain values, for a handler in another language.
#[derive(Debug, Clone)]
pub struct ForeignMessage {
    /// The entry id.
    pub id: String,
    /// The stream's base name.
    pub stream: String,
    /// The consumer group.
    pub group: String,
    /// The member handling it.
    pub member_id: String,
    /// The shard index.
    pub shard: u32,
    /// The shard's Redis key.
    pub shard_key: String,
    /// The routing key, if any.
    pub key: Option<String>,
    /// The entry's headers.
    pub headers: Headers,
    /// Redis's delivery count in this group.
    pub delivery_count: u64,
    /// This attempt's number in this process, from 1.
    pub attempt: u32,
    /// The payload's content type.
    pub content_type: String,
    /// The payload bytes, as sent.
    pub payload: Vec<u8>,
    /// The entry's extra fields (beside payload, key, headers, content type).
    pub fields: Vec<(String, Vec<u8>)>,
    /// Acknowledges the entry (manual acknowledgement).
    pub acker: Acker,
}

impl ForeignMessage {
    fn of(msg: Message<Raw>) -> Self {
        const KNOWN: [&str; 4] = ["payload", "key", "headers", "content_type"];
        ForeignMessage {
            id: msg.id().to_owned(),
            stream: msg.stream().to_owned(),
            group: msg.group().to_owned(),
            member_id: msg.member_id().to_owned(),
            shard: msg.shard(),
            shard_key: msg.shard_key().to_owned(),
            key: msg.key().map(str::to_owned),
            headers: msg.headers().clone(),
            delivery_count: msg.delivery_count(),
            attempt: msg.attempt(),
            content_type: msg.content_type().to_owned(),
            fields: msg
                .fields()
                .filter(|(n, _)| !KNOWN.contains(n))
                .map(|(n, v)| (n.to_owned(), v.to_vec()))
                .collect(),
            acker: msg.acker(),
            payload: msg.into_payload().0,
        }
    }
}

/// What a foreign handler decided about a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Handled: acknowledged (automatic acknowledgement).
    Done,
    /// Failed: retried with the listener's backoff, then dead-lettered.
    Retry(String),
    /// Failed: retried after this delay.
    RetryAfter(Duration, String),
    /// Failed for good: dead-lettered now.
    DeadLetter(String),
}

impl Verdict {
    /// The handler error this verdict is (`None`: handled).
    pub fn into_error(self) -> Option<HandlerError> {
        match self {
            Verdict::Done => None,
            Verdict::Retry(why) => Some(HandlerError::retry(why)),
            Verdict::RetryAfter(d, why) => Some(HandlerError::retry_after(d, why)),
            Verdict::DeadLetter(why) => Some(HandlerError::dead_letter(why)),
        }
    }
}

/// The verdicts of a foreign batch handler: one for the whole batch (applied to every
/// message not named), and one per named entry id.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchVerdict {
    /// The whole batch's verdict.
    pub all: Verdict,
    /// Verdicts of single messages, by entry id.
    pub each: Vec<(String, Verdict)>,
}

/// A handler in another language: one message in, a future of its verdict out. The future
/// must never panic across the boundary; a binding catches its language's exceptions and
/// returns them as verdicts.
pub type ForeignHandler =
    Arc<dyn Fn(ForeignMessage) -> BoxFuture<'static, Verdict> + Send + Sync + 'static>;

/// A batch handler in another language.
pub type ForeignBatchHandler =
    Arc<dyn Fn(Vec<ForeignMessage>) -> BoxFuture<'static, BatchVerdict> + Send + Sync + 'static>;

/// A rebalance callback in another language.
pub type ForeignCallback = Arc<dyn Fn(&Rebalance) + Send + Sync + 'static>;

/// A listener's settings as plain values (what a binding's keyword arguments fill in);
/// `None` keeps the client's default.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ListenerSpec {
    /// The consumer group.
    pub group: String,
    /// The stream.
    pub stream: String,
    /// The name used in member ids (default: the group).
    pub name: Option<String>,
    /// Members in this process.
    pub concurrency: Option<u32>,
    /// Handler calls of one shard at once, never two of one key.
    pub key_concurrency: Option<usize>,
    /// Retries before the dead letter.
    pub max_retries: Option<u32>,
    /// Retry backoff (first delay, cap).
    pub retry_backoff: Option<(Duration, Duration)>,
    /// Manual acknowledgement.
    pub manual_ack: bool,
    /// Batch listeners: the most messages per call.
    pub max_batch: Option<usize>,
    /// Batch listeners: how long to wait for a fuller batch.
    pub linger: Option<Duration>,
    /// Entries per read.
    pub batch_size: Option<usize>,
    /// How long one read waits.
    pub block_timeout: Option<Duration>,
    /// How long a draining shard is worked before it may be reported drained.
    pub drain_grace: Option<Duration>,
    /// Called when a member starts working shards.
    pub on_assigned: Option<ForeignCallback>,
    /// Called when a member stopped working shards.
    pub on_revoked: Option<ForeignCallback>,
}

impl std::fmt::Debug for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSpec")
            .field("group", &self.group)
            .field("stream", &self.stream)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ListenerSpec {
    /// A listener of `group` on `stream` with the default settings.
    pub fn new(group: impl Into<String>, stream: impl Into<String>) -> Self {
        ListenerSpec {
            group: group.into(),
            stream: stream.into(),
            ..ListenerSpec::default()
        }
    }

    /// Applies the settings to `l`.
    fn apply(&self, mut l: Listener) -> Listener {
        if let Some(n) = &self.name {
            l = l.name(n.clone());
        }
        if let Some(n) = self.concurrency {
            l = l.concurrency(n);
        }
        if let Some(n) = self.key_concurrency {
            l = l.key_concurrency(n);
        }
        if let Some(n) = self.max_retries {
            l = l.max_retries(n);
        }
        if let Some((min, max)) = self.retry_backoff {
            l = l.retry_backoff(min, max);
        }
        if self.manual_ack {
            l = l.ack_mode(AckMode::Manual);
        }
        if let Some(n) = self.max_batch {
            l = l.max_batch(n);
        }
        if let Some(d) = self.linger {
            l = l.linger(d);
        }
        if let Some(n) = self.batch_size {
            l = l.batch_size(n);
        }
        if let Some(d) = self.block_timeout {
            l = l.block_timeout(d);
        }
        if let Some(d) = self.drain_grace {
            l = l.drain_grace(d);
        }
        if let Some(f) = self.on_assigned.clone() {
            l = l.on_assigned(move |r| f(r));
        }
        if let Some(f) = self.on_revoked.clone() {
            l = l.on_revoked(move |r| f(r));
        }
        l
    }
}

/// A single-message listener running `handler`.
pub fn listener(spec: &ListenerSpec, handler: ForeignHandler) -> Listener {
    let call = move |msg: Message<Raw>| {
        let verdict = handler(ForeignMessage::of(msg));
        async move { verdict.await.into_error().map_or(Ok(()), Err) }
    };
    spec.apply(Listener::new(spec.group.clone(), spec.stream.clone(), call))
}

/// A batch listener running `handler` on up to `max_batch` messages of one shard at once.
pub fn batch_listener(spec: &ListenerSpec, handler: ForeignBatchHandler) -> Listener {
    let call = move |batch: Batch<Raw>| {
        let messages = batch.into_messages().into_iter().map(ForeignMessage::of);
        let verdict = handler(messages.collect());
        async move {
            let v = verdict.await;
            let mut err = match v.all.into_error() {
                Some(all) => BatchError::all(all),
                None => BatchError::new(),
            };
            for (id, each) in v.each {
                if let Some(e) = each.into_error() {
                    err = err.entry(id, e);
                }
            }
            err.into_result()
        }
    };
    spec.apply(Listener::batch(
        spec.group.clone(),
        spec.stream.clone(),
        call,
    ))
}

/// Publishes `records` as [`Producer::publish_batch`] does, with the publish's turn taken now,
/// at the call: per key, publishes keep the order of these calls (PROTOCOL §21 "Several
/// publishes in flight") whatever order their futures are polled in. The future must be
/// spawned (or polled) at once: later publishes wait for this one's turn.
pub fn publish_batch(
    producer: &Producer,
    stream: &str,
    records: Vec<Record>,
) -> impl Future<Output = Result<Vec<Published>, ClientError>> + Send + use<> {
    producer.publish_batch_now(stream, records)
}
