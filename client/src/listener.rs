//! A listener: a handler bound to a consumer group and a stream, with its settings.

use crate::handler::{Handler, HandlerError};
use crate::message::{Entry, Message, Origin, Payload};
use futures::future::BoxFuture;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// When entries are acknowledged (`XACK`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

/// The handler with its payload type erased: decodes the entry, then calls the function.
pub(crate) trait ErasedHandler: Send + Sync {
    fn call(
        &self,
        entry: Arc<Entry>,
        origin: Arc<Origin>,
        attempt: u32,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
}

struct Typed<H, T> {
    handler: H,
    _payload: std::marker::PhantomData<fn() -> T>,
}

impl<H: Handler<T>, T: Payload> ErasedHandler for Typed<H, T> {
    fn call(
        &self,
        entry: Arc<Entry>,
        origin: Arc<Origin>,
        attempt: u32,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        if let Some(why) = &entry.malformed {
            let err = HandlerError::dead_letter(format!("entry {} is malformed: {why}", entry.id));
            return Box::pin(async move { Err(err) });
        }
        let bytes = entry.field("payload").unwrap_or_default();
        match T::decode(bytes) {
            Ok(payload) => Box::pin(
                self.handler
                    .call(Message::new(payload, entry, origin, attempt)),
            ),
            Err(e) => {
                let err = HandlerError::dead_letter(format!(
                    "payload does not decode as {}: {e}",
                    std::any::type_name::<T>()
                ));
                Box::pin(async move { Err(err) })
            }
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
    pub(crate) batch_size: usize,
    pub(crate) block: Duration,
    pub(crate) drain_grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ack_mode: AckMode::Auto,
            max_retries: 3,
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(10),
            batch_size: 64,
            block: Duration::from_secs(2),
            drain_grace: Duration::from_secs(3),
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
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) on_assigned: Option<Callback>,
    pub(crate) on_revoked: Option<Callback>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("name", &self.name)
            .field("group", &self.group)
            .field("stream", &self.stream)
            .field("concurrency", &self.concurrency)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener of `group` on `stream` that runs `handler` for each message.
    pub fn new<T: Payload, H: Handler<T>>(
        group: impl Into<String>,
        stream: impl Into<String>,
        handler: H,
    ) -> Self {
        let group = group.into();
        Listener {
            name: group.clone(),
            group,
            stream: stream.into(),
            concurrency: 1,
            settings: Settings::default(),
            handler: Arc::new(Typed {
                handler,
                _payload: std::marker::PhantomData,
            }),
            on_assigned: None,
            on_revoked: None,
        }
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

    /// When entries are acknowledged (default [`AckMode::Auto`]).
    pub fn ack_mode(mut self, mode: AckMode) -> Self {
        self.settings.ack_mode = mode;
        self
    }

    /// How many times a failed message is retried before it is dead-lettered (default 3).
    ///
    /// Retries happen in place: the shard waits for them, so that one key's messages stay in
    /// order. A message that can never succeed should say so with
    /// [`HandlerError::dead_letter`] rather than hold its shard for every retry.
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
    /// 3 s; SPEC §6).
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
