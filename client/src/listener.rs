//! A listener: a handler bound to a consumer group and a stream, with its settings.

use crate::codec::CodecSpec;
use crate::handler::{BatchError, BatchHandler, Handler, HandlerError};
use crate::message::{Batch, Entry, Message, Origin, Payload};
use crate::state::{DataKey, DataMap};
use futures::FutureExt;
use futures::future::BoxFuture;
use rsc_protocol::entry as fields;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info_span, warn};

/// When entries are acknowledged (`XACK`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckMode {
    /// The runtime acknowledges an entry after its handler succeeded (or after it was
    /// dead-lettered). The default.
    #[default]
    Auto,
    /// The handler acknowledges with [`Message::ack`] or an [`crate::Acker`]; the runtime
    /// still acknowledges dead-lettered entries. An entry never acknowledged stays pending and
    /// is handled again by the shard's next owner.
    Manual,
}

/// Which shards a member was given or gave up, passed to rebalance callbacks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rebalance {
    /// The consumer group.
    pub group: String,
    /// The member.
    pub member_id: String,
    /// The stream.
    pub stream: String,
    /// The shards concerned (indexes).
    pub shards: Vec<u32>,
}

type Callback = Arc<dyn Fn(&Rebalance) + Send + Sync>;

/// Decodes an entry's payload for a handler; a failure is a dead-letter verdict with the reason.
fn decode<T: Payload>(entry: &Entry, codec: &CodecSpec) -> Result<T, HandlerError> {
    if let Some(why) = &entry.malformed {
        return Err(HandlerError::dead_letter(format!(
            "entry {} is malformed: {why}",
            entry.id
        )));
    }
    if !T::ANY_CONTENT_TYPE
        && let Some(ct) = entry.field(fields::CONTENT_TYPE)
        && ct != codec.content_type.as_bytes()
    {
        return Err(HandlerError::dead_letter(format!(
            "content type mismatch: the entry is {}, the listener decodes {}",
            String::from_utf8_lossy(ct),
            codec.content_type
        )));
    }
    let bytes = entry.field(fields::PAYLOAD).unwrap_or_default();
    T::decode_with(bytes, codec).map_err(|e| {
        HandlerError::dead_letter(format!(
            "payload does not decode as {} ({}): {e}",
            std::any::type_name::<T>(),
            codec.content_type
        ))
    })
}

/// The handler with its payload type erased: decodes the entry, then calls the function.
pub(crate) trait ErasedHandler: Send + Sync {
    /// The [`crate::Data`] types the handler asks for.
    fn requires(&self) -> Vec<DataKey>;

    /// The same handler, reading its [`crate::Data`] arguments from `data`.
    fn bind(&self, data: Arc<DataMap>, codec: CodecSpec) -> Arc<dyn ErasedHandler>;

    fn call(
        &self,
        entry: Arc<Entry>,
        origin: Arc<Origin>,
        attempt: u32,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
}

struct Typed<H, T, A> {
    handler: Arc<H>,
    data: Arc<DataMap>,
    codec: CodecSpec,
    _payload: std::marker::PhantomData<fn() -> (T, A)>,
}

impl<H: Handler<T, A>, T: Payload, A: 'static> ErasedHandler for Typed<H, T, A> {
    fn requires(&self) -> Vec<DataKey> {
        H::requires()
    }

    fn bind(&self, data: Arc<DataMap>, codec: CodecSpec) -> Arc<dyn ErasedHandler> {
        Arc::new(Typed::<H, T, A> {
            handler: self.handler.clone(),
            data,
            codec,
            _payload: std::marker::PhantomData,
        })
    }

    fn call(
        &self,
        entry: Arc<Entry>,
        origin: Arc<Origin>,
        attempt: u32,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        match decode::<T>(&entry, &self.codec) {
            Ok(payload) => self
                .handler
                .call(Message::new(payload, entry, origin, attempt), &self.data),
            Err(err) => Box::pin(async move { Err(err) }),
        }
    }
}

/// A batch handler with its payload type erased.
pub(crate) trait ErasedBatch: Send + Sync {
    fn requires(&self) -> Vec<DataKey>;

    fn bind(&self, data: Arc<DataMap>, codec: CodecSpec) -> Arc<dyn ErasedBatch>;

    /// Decodes the entries (with their attempt numbers): those that do not decode come back
    /// with their verdict (by index); the others go to the handler, if any are left.
    #[allow(clippy::type_complexity)]
    fn call(
        &self,
        entries: &[(Arc<Entry>, u32)],
        origin: &Arc<Origin>,
    ) -> (
        Vec<(usize, HandlerError)>,
        Option<BoxFuture<'static, Result<(), BatchError>>>,
    );
}

struct TypedBatch<H, T, A> {
    handler: Arc<H>,
    data: Arc<DataMap>,
    codec: CodecSpec,
    _payload: std::marker::PhantomData<fn() -> (T, A)>,
}

impl<H: BatchHandler<T, A>, T: Payload, A: 'static> ErasedBatch for TypedBatch<H, T, A> {
    fn requires(&self) -> Vec<DataKey> {
        H::requires()
    }

    fn bind(&self, data: Arc<DataMap>, codec: CodecSpec) -> Arc<dyn ErasedBatch> {
        Arc::new(TypedBatch::<H, T, A> {
            handler: self.handler.clone(),
            data,
            codec,
            _payload: std::marker::PhantomData,
        })
    }

    fn call(
        &self,
        entries: &[(Arc<Entry>, u32)],
        origin: &Arc<Origin>,
    ) -> (
        Vec<(usize, HandlerError)>,
        Option<BoxFuture<'static, Result<(), BatchError>>>,
    ) {
        let mut failed = Vec::new();
        let mut messages = Vec::with_capacity(entries.len());
        for (i, (entry, attempt)) in entries.iter().enumerate() {
            match decode::<T>(entry, &self.codec) {
                Ok(p) => messages.push(Message::new(p, entry.clone(), origin.clone(), *attempt)),
                Err(e) => failed.push((i, e)),
            }
        }
        let call =
            (!messages.is_empty()).then(|| self.handler.call(Batch::new(messages), &self.data));
        (failed, call)
    }
}

/// A listener's handler: one message at a time, or batches.
#[derive(Clone)]
pub(crate) enum HandlerKind {
    Single(Arc<dyn ErasedHandler>),
    Batch(Arc<dyn ErasedBatch>),
}

impl HandlerKind {
    pub(crate) fn requires(&self) -> Vec<DataKey> {
        match self {
            HandlerKind::Single(h) => h.requires(),
            HandlerKind::Batch(h) => h.requires(),
        }
    }

    pub(crate) fn bind(&self, data: Arc<DataMap>, codec: CodecSpec) -> HandlerKind {
        match self {
            HandlerKind::Single(h) => HandlerKind::Single(h.bind(data, codec)),
            HandlerKind::Batch(h) => HandlerKind::Batch(h.bind(data, codec)),
        }
    }
}

/// Settings of a listener's shard workers.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) ack_mode: AckMode,
    pub(crate) max_retries: u32,
    pub(crate) retry_min: Duration,
    pub(crate) retry_max: Duration,
    /// Non-blocking retries: the delay of each retry stage (empty: retries in place).
    pub(crate) retry_stages: Vec<Duration>,
    pub(crate) batch_size: usize,
    pub(crate) block: Duration,
    pub(crate) drain_grace: Duration,
    /// Batch listeners: the most messages one call handles.
    pub(crate) max_batch: usize,
    /// Batch listeners: how long to wait for more entries after a read that returned fewer
    /// than `max_batch`.
    pub(crate) linger: Duration,
    /// Handler calls of one shard in flight at once, never two of one key (1: the shard in
    /// stream order, one call at a time).
    pub(crate) key_concurrency: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ack_mode: AckMode::Auto,
            max_retries: 3,
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(10),
            retry_stages: Vec::new(),
            batch_size: 64,
            block: Duration::from_secs(2),
            drain_grace: Duration::from_secs(3),
            max_batch: 64,
            linger: Duration::ZERO,
            key_concurrency: 1,
        }
    }
}

/// A handler bound to a consumer group and a stream: what `#[stream_listener]` declares,
/// or what you build by hand and give to [`crate::ConsumerAppBuilder::listener`].
///
/// Each listener runs `concurrency` members in the process, each one a member of the group
/// with id `<instance>-<name>-<index>` (the name defaults to the group id).
///
/// ```
/// use rsc_client::prelude::*;
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
///     println!("order {} from shard {}", msg.payload().id, msg.shard());
///     Ok(())
/// }
///
/// let listener = Listener::new("billing", "orders", on_order)
///     .concurrency(4)
///     .max_retries(5)
///     .on_revoked(|r| println!("gave up shards {:?}", r.shards));
/// assert_eq!(listener.listener_name(), "billing");
/// ```
#[derive(Clone)]
pub struct Listener {
    pub(crate) name: String,
    pub(crate) group: String,
    pub(crate) stream: String,
    pub(crate) concurrency: u32,
    pub(crate) settings: Settings,
    pub(crate) handler: HandlerKind,
    /// How payloads are decoded (default JSON).
    pub(crate) codec: CodecSpec,
    pub(crate) on_assigned: Option<Callback>,
    pub(crate) on_revoked: Option<Callback>,
    /// The layers around the handler, the first added innermost.
    pub(crate) layers: Vec<crate::layer::Wrap>,
    /// The handler inside its layers, once bound to the app's data (at build).
    pub(crate) service: Option<crate::layer::HandlerService>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("name", &self.name)
            .field("group", &self.group)
            .field("stream", &self.stream)
            .field("concurrency", &self.concurrency)
            .field("settings", &self.settings)
            .field("codec", &self.codec)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener of `group` on `stream` that runs `handler` for each message.
    ///
    /// The handler takes the [`Message`], then any number (up to four) of
    /// [`crate::Data`] arguments provided with [`crate::ConsumerAppBuilder::data`].
    pub fn new<T: Payload, A: 'static, H: Handler<T, A>>(
        group: impl Into<String>,
        stream: impl Into<String>,
        handler: H,
    ) -> Self {
        Self::with_handler(
            group.into(),
            stream.into(),
            HandlerKind::Single(Arc::new(Typed::<H, T, A> {
                handler: Arc::new(handler),
                data: Arc::default(),
                codec: CodecSpec::JSON,
                _payload: std::marker::PhantomData,
            })),
        )
    }

    /// A batch listener of `group` on `stream`: `handler` receives up to
    /// [`Self::max_batch`] messages of one shard at once (default 64), as a
    /// [`crate::Batch`].
    ///
    /// The handler returns one verdict for the batch (`Result<(), HandlerError>`, or `?`),
    /// or one per message ([`BatchError::message`]). Messages that succeeded are acknowledged
    /// after the handler returns; failed ones are retried (as a smaller batch) with the
    /// listener's backoff, then dead-lettered one by one. A payload that does not decode is
    /// dead-lettered without reaching the handler.
    ///
    /// ```
    /// use rsc_client::prelude::*;
    /// use std::time::Duration;
    ///
    /// async fn store(batch: Batch<serde_json::Value>) -> Result<(), HandlerError> {
    ///     println!("{} rows in one INSERT", batch.len());
    ///     Ok(())
    /// }
    ///
    /// let listener = Listener::batch("warehouse", "orders", store)
    ///     .max_batch(100)
    ///     .linger(Duration::from_millis(20));
    /// ```
    pub fn batch<T: Payload, A: 'static, H: BatchHandler<T, A>>(
        group: impl Into<String>,
        stream: impl Into<String>,
        handler: H,
    ) -> Self {
        Self::with_handler(
            group.into(),
            stream.into(),
            HandlerKind::Batch(Arc::new(TypedBatch::<H, T, A> {
                handler: Arc::new(handler),
                data: Arc::default(),
                codec: CodecSpec::JSON,
                _payload: std::marker::PhantomData,
            })),
        )
    }

    fn with_handler(group: String, stream: String, handler: HandlerKind) -> Self {
        Listener {
            name: group.clone(),
            group,
            stream,
            concurrency: 1,
            settings: Settings::default(),
            handler,
            codec: CodecSpec::JSON,
            on_assigned: None,
            on_revoked: None,
            layers: Vec::new(),
            service: None,
        }
    }

    /// Wraps each attempt of the handler in `layer`, a [`tower::Layer`] (a timeout, a
    /// concurrency limit, your own middleware): see [`crate::layer`] and the GUIDE, "Layers".
    /// The first layer added is the innermost; retries, dead letters and acknowledgements
    /// stay around the whole stack.
    ///
    /// ```
    /// use rsc_client::prelude::*;
    /// use std::time::Duration;
    ///
    /// async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> { Ok(()) }
    /// let listener = Listener::new("billing", "orders", on_order)
    ///     .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(5)));
    /// assert_eq!(listener.layer_count(), 1);
    /// ```
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: tower::Layer<crate::layer::HandlerService> + Send + Sync + 'static,
        L::Service: tower::Service<crate::layer::Attempt, Response = crate::layer::Verdicts>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as tower::Service<crate::layer::Attempt>>::Error: Into<crate::BoxError>,
        <L::Service as tower::Service<crate::layer::Attempt>>::Future: Send + 'static,
    {
        self.layers.push(crate::layer::wrap(layer));
        self.service = None;
        self
    }

    /// How many layers wrap the handler ([`Self::layer`]).
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Batch listeners: the most messages one call of the handler receives (default 64;
    /// also the read's `COUNT`). Ignored by a single-message listener.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.settings.max_batch = n.max(1);
        self.settings.batch_size = n.max(1);
        self
    }

    /// Batch listeners: after a read that returned fewer than [`Self::max_batch`] entries,
    /// wait up to this long for more before calling the handler (default 0: hand over what
    /// the read returned). Bounds the latency a fuller batch costs. Ignored by a
    /// single-message listener.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.settings.linger = linger;
        self
    }

    /// The payload format (default [`crate::codec::Json`]): payloads are decoded with `C`,
    /// and an entry whose `content_type` field names another format is dead-lettered with
    /// the reason (entries without the field are decoded with `C`). A `Message<Raw>`
    /// handler takes any content type.
    ///
    /// ```
    /// use rsc_client::codec::Json;
    /// use rsc_client::prelude::*;
    ///
    /// async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> { Ok(()) }
    /// let listener = Listener::new("billing", "orders", on_order).codec::<Json>();
    /// ```
    pub fn codec<C: crate::codec::Codec>(mut self) -> Self {
        self.codec = CodecSpec::of::<C>();
        self
    }

    /// Whether this is a batch listener ([`Self::batch`]).
    pub fn is_batch(&self) -> bool {
        matches!(self.handler, HandlerKind::Batch(_))
    }

    /// The name used in member ids (default: the group id). Two listeners of one app need
    /// distinct names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many members of the group this process runs for the listener (default 1).
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    /// Up to `n` handler calls of one shard in flight at once (default 1), **never two of one
    /// key**: each key's entries still start in stream order, one at a time, while other
    /// keys of the shard flow past a slow or retrying one. Raises a shard's throughput for
    /// I/O-bound handlers without resharding; ordering becomes per key rather than per shard
    /// (see the GUIDE, "Key concurrency").
    ///
    /// An entry without a key waits only for a free lane (it has no order to keep with
    /// others). A batch listener runs up to `n` batches at once; with `n` > 1 a batch holds
    /// at most one entry per key. Entries are acknowledged each after its own verdict, in
    /// whatever order they finish. At most a bounded number of entries (a few reads' worth,
    /// more with more lanes, at most 10,000) wait behind busy keys; past it the worker stops
    /// reading the shard until they drain.
    ///
    /// ```
    /// use rsc_client::prelude::*;
    ///
    /// async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> { Ok(()) }
    /// // 8 orders of different customers (keys) of one shard handled at once.
    /// let listener = Listener::new("billing", "orders", on_order).key_concurrency(8);
    /// ```
    pub fn key_concurrency(mut self, n: usize) -> Self {
        self.settings.key_concurrency = n.max(1);
        self
    }

    /// When entries are acknowledged (default [`AckMode::Auto`]).
    pub fn ack_mode(mut self, mode: AckMode) -> Self {
        self.settings.ack_mode = mode;
        self
    }

    /// How many times a failed message is retried before it is dead-lettered (default 3).
    ///
    /// Retries happen in place: the shard (with [`Self::key_concurrency`] above 1, the key)
    /// waits for them, so that one key's messages stay in order. A message that can never
    /// succeed should say so with [`HandlerError::dead_letter`] rather than hold its shard
    /// for every retry.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.settings.max_retries = n;
        self
    }

    /// The retry backoff: exponential from `min`, capped at `max`, with jitter
    /// (default 200 ms to 10 s).
    pub fn retry_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.settings.retry_min = min;
        self.settings.retry_max = max.max(min);
        self
    }

    /// Non-blocking retries (GUIDE "Non-blocking retries: retry stages"): a failed message
    /// leaves its shard for retry stage 1, is tried again `delays[0]` later, on failure moves
    /// to stage 2, and so on; after the last stage it is dead-lettered. Its key does not wait:
    /// the shard's later messages (of the same key too) are handled meanwhile, so a retried
    /// message is handled after them. [`Self::max_retries`] and [`Self::retry_backoff`] then
    /// no longer apply. Empty (the default): retries in place.
    ///
    /// At most [`rsc_protocol::retry::MAX_STAGES`] stages of 1 ms to 7 days each (longer
    /// lists are cut, delays clamped).
    ///
    /// ```
    /// use rsc_client::prelude::*;
    /// use std::time::Duration;
    /// # async fn on_order(_msg: Message<serde_json::Value>) -> Result<(), HandlerError> { Ok(()) }
    /// let listener = Listener::new("billing", "orders", on_order)
    ///     .retry_stages(&[Duration::from_secs(10), Duration::from_secs(60)]);
    /// # let _ = listener;
    /// ```
    pub fn retry_stages(mut self, delays: &[Duration]) -> Self {
        self.settings.retry_stages = clamp_stages(delays);
        self
    }

    /// How many entries one read fetches (`XREADGROUP COUNT`, default 64).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.settings.batch_size = n.max(1);
        self
    }

    /// How long one read waits for new entries (`XREADGROUP BLOCK`, default 2 s).
    pub fn block_timeout(mut self, block: Duration) -> Self {
        self.settings.block = block.max(Duration::from_millis(1));
        self
    }

    /// How long a member works a draining shard before it may report it drained (default
    /// 3 s; PROTOCOL §6).
    ///
    /// Producers learn a reshard from their routing refresh (every second by default), so a
    /// draining shard can still receive entries for about that long after the switch. A
    /// shard is reported drained only after this grace, and only if, when the heartbeat is
    /// sent, nothing is pending and the group has read up to the shard's last entry. Keep it
    /// above the producers' routing refresh interval.
    pub fn drain_grace(mut self, grace: Duration) -> Self {
        self.settings.drain_grace = grace;
        self
    }

    /// Called when a member starts working shards (after the coordinator granted them).
    /// Runs on the member's task: keep it quick.
    pub fn on_assigned(mut self, f: impl Fn(&Rebalance) + Send + Sync + 'static) -> Self {
        self.on_assigned = Some(Arc::new(f));
        self
    }

    /// Called when a member has stopped working shards (their in-flight handlers finished
    /// and were acknowledged). Runs on the member's task: keep it quick.
    pub fn on_revoked(mut self, f: impl Fn(&Rebalance) + Send + Sync + 'static) -> Self {
        self.on_revoked = Some(Arc::new(f));
        self
    }

    /// The listener's name.
    pub fn listener_name(&self) -> &str {
        &self.name
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The stream.
    pub fn stream(&self) -> &str {
        &self.stream
    }
}

/// `delays` within the limits of [`rsc_protocol::retry`]: at most `MAX_STAGES`, each from
/// 1 ms to `MAX_DELAY`.
pub(crate) fn clamp_stages(delays: &[Duration]) -> Vec<Duration> {
    use rsc_protocol::retry::{MAX_DELAY, MAX_STAGES};
    delays
        .iter()
        .take(MAX_STAGES)
        .map(|d| (*d).clamp(Duration::from_millis(1), MAX_DELAY))
        .collect()
}

/// The innermost service: decodes, calls the handler (a panic is a failed attempt), in a span
/// that continues the message's trace.
fn handler_service(kind: HandlerKind) -> crate::layer::HandlerService {
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |a: crate::layer::Attempt| {
        let kind = kind.clone();
        async move {
            Ok::<_, crate::BoxError>(crate::layer::Verdicts(
                call(&kind, &a.entries, &a.origin).await,
            ))
        }
    }))
}

/// One attempt of the handler itself (the innermost service; also the whole stack of a
/// listener without layers).
pub(crate) async fn call(
    kind: &HandlerKind,
    entries: &[(Arc<Entry>, u32)],
    origin: &Arc<Origin>,
) -> Vec<Option<HandlerError>> {
    match kind {
        HandlerKind::Single(h) => {
            let (entry, attempt) = &entries[0];
            let span = info_span!("message", entry_id = %entry.id, attempt);
            crate::otel::continue_trace(&span, entry);
            let call = h.call(entry.clone(), origin.clone(), *attempt);
            let result = AssertUnwindSafe(call).catch_unwind().instrument(span).await;
            vec![match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(panic) => Some(HandlerError::panicked(panic.as_ref())),
            }]
        }
        HandlerKind::Batch(h) => call_batch(h, entries, origin).await,
    }
}

/// Calls the batch handler once on `pending` (entry, attempt): each message's verdict, in
/// order (`None`: handled). A payload that does not decode fails its message before the call;
/// a panic or an error for the whole batch fails every message not failed yet.
async fn call_batch(
    handler: &Arc<dyn ErasedBatch>,
    pending: &[(Arc<Entry>, u32)],
    origin: &Arc<Origin>,
) -> Vec<Option<HandlerError>> {
    let span = info_span!(
        "batch",
        entries = pending.len(),
        first_id = %pending[0].0.id,
        attempt = pending.iter().map(|(_, a)| *a).max().unwrap_or(1)
    );
    crate::otel::link_all(&span, pending.iter().map(|(e, _)| &**e));
    let (decode_failed, call) = handler.call(pending, origin);
    let mut verdicts: Vec<Option<HandlerError>> = pending.iter().map(|_| None).collect();
    for (i, e) in decode_failed {
        verdicts[i] = Some(e);
    }
    let Some(call) = call else {
        return verdicts;
    };
    let result = AssertUnwindSafe(call).catch_unwind().instrument(span).await;
    let all = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => {
            for (id, err) in e.each {
                match pending.iter().position(|(entry, _)| entry.id == id) {
                    Some(i) if verdicts[i].is_none() => verdicts[i] = Some(err),
                    Some(_) => {}
                    None => {
                        warn!(entry_id = %id, "the batch handler failed an entry that is not in the batch")
                    }
                }
            }
            e.all
        }
        Err(panic) => Some(HandlerError::panicked(panic.as_ref())),
    };
    if let Some(all) = all {
        for v in verdicts.iter_mut().filter(|v| v.is_none()) {
            *v = Some(all.duplicate());
        }
    }
    verdicts
}

/// The listener's stack ([`crate::layer`]): the handler's service inside its layers (the first added innermost).
pub(crate) fn stack(
    kind: &HandlerKind,
    layers: &[crate::layer::Wrap],
) -> crate::layer::HandlerService {
    layers
        .iter()
        .fold(handler_service(kind.clone()), |inner, wrap| wrap(inner))
}
