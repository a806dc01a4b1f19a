//! The consumer side: one member runtime per listener × concurrency index.
//!
//! - [`member`]: joins the group, heartbeats on its own task (never waiting on handlers),
//!   reconciles its shards with each answer (revoke before assign, PROTOCOL §5.2), self-fences
//!   when its lease runs out, rejoins after `UNKNOWN_MEMBER_ID` / `FENCED_MEMBER_EPOCH`, and
//!   leaves on shutdown.
//! - [`worker`]: one task per owned shard: `XGROUP CREATE … MKSTREAM`, `XAUTOCLAIM` of the
//!   previous owner's pending entries, then `XREADGROUP` on the app's shared connection
//!   (own connections with `shared_reader(false)`); retries, dead letters, acknowledgements.
//! - [`doorbell`]: wakes the workers of shards with new entries (producers' rings, a
//!   fallback poll), one subscriber connection per app.
//! - [`heartbeats`]: the heartbeat path shared by the members of one app: batched on
//!   `POST /v1/heartbeats` when the app runs several members, else the single-member route.
//! - [`health`]: whether the data Redis answers (one probe per app): members join only once
//!   it does, and give their shards back while it stays unreachable past a grace.
//! - [`drain`]: the drain check of a draining shard, made when the member reports it.
//! - [`fence`]: strict fencing: the guarded read (a `WATCH`ed transaction), takeover and
//!   acknowledgement scripts.
//! - [`order`]: per-key order through reshards (PROTOCOL §15): which entries wait for their
//!   key's parent shard, held aside in order and released once the parent reached its seal.

pub(crate) mod backoff;
pub(crate) mod doorbell;
pub(crate) mod drain;
pub(crate) mod fence;
pub(crate) mod health;
pub(crate) mod heartbeats;
pub(crate) mod hooks;
pub(crate) mod hygiene;
pub(crate) mod lease;
pub(crate) mod member;
pub(crate) mod order;
pub(crate) mod readiness;
pub(crate) mod reply;
pub(crate) mod wake;
pub(crate) mod worker;

use crate::listener::Listener;
use metrics::{Counter, Gauge, Histogram};
use rsc_redis::LazyRedis;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

/// What every shard worker of one member shares.
pub(crate) struct MemberShared {
    pub(crate) group: String,
    pub(crate) stream: String,
    pub(crate) member_id: String,
    /// This process run's incarnation (PROTOCOL §11), sent with the join and the leave, so
    /// that a second live process with the same member id is refused (`None` only in tests).
    pub(crate) incarnation: Option<String>,
    /// Static membership: the member leaves with -2 (its shards wait for its return).
    pub(crate) static_member: bool,
    pub(crate) listener: Listener,
    /// The data Redis (workers of the per-shard reader open their own connections to it).
    pub(crate) redis: LazyRedis,
    /// The app's doorbell on the data Redis (`None` when the app reads with a connection per
    /// shard).
    pub(crate) doorbell: Option<std::sync::Arc<doorbell::Doorbell>>,
    /// The shared connection: manual acknowledgements, dead letters, drain checks (never
    /// blocked by a read).
    pub(crate) ack_conn: LazyRedis,
    /// The app's guard connections for strict fencing's guarded reads (see [`fence`]).
    pub(crate) guards: std::sync::Arc<fence::GuardConns>,
    /// `true` while the listener is paused (by the app's handle or by the group's operator
    /// pause): the effective value of `pause`.
    pub(crate) paused: watch::Receiver<bool>,
    /// The listener's pause switches (shared by its members).
    pub(crate) pause: std::sync::Arc<PauseState>,
    pub(crate) metrics: WorkerMetrics,
    /// When the member's lease runs out (set by the member on every successful heartbeat):
    /// a worker starts no further entry past it, even before the member's self-fence timer
    /// has stopped it (e.g. right after the process was paused).
    pub(crate) lease_until: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// The group's ordering through reshards is `key` (from the heartbeat answer; `true`
    /// until the first answer says otherwise).
    pub(crate) ordered: std::sync::atomic::AtomicBool,
    /// Whether the app's data Redis answers (see [`health`]).
    pub(crate) data_health: watch::Receiver<health::DataRedis>,
    /// How long the data Redis may stay unreachable before the member gives its shards back.
    pub(crate) data_redis_grace: std::time::Duration,
    /// Set by the member while it is a member of its group in good standing (see
    /// [`readiness`]).
    pub(crate) joined: std::sync::Arc<AtomicBool>,
}

/// Why a listener is paused: by the app ([`crate::AppHandle::pause`]), or by an operator's
/// pause of its group (PROTOCOL §14, carried in every heartbeat answer). Workers watch the
/// effective value (either one).
#[derive(Debug)]
pub(crate) struct PauseState {
    by_app: AtomicBool,
    by_group: AtomicBool,
    effective: watch::Sender<bool>,
}

impl PauseState {
    pub(crate) fn new() -> Self {
        PauseState {
            by_app: AtomicBool::new(false),
            by_group: AtomicBool::new(false),
            effective: watch::channel(false).0,
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.effective.subscribe()
    }

    pub(crate) fn by_app(&self) -> bool {
        self.by_app.load(Ordering::SeqCst)
    }

    pub(crate) fn by_group(&self) -> bool {
        self.by_group.load(Ordering::SeqCst)
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.effective.borrow()
    }

    /// Sets the app's switch; `true` when it changed.
    pub(crate) fn set_by_app(&self, on: bool) -> bool {
        let changed = self.by_app.swap(on, Ordering::SeqCst) != on;
        self.publish();
        changed
    }

    /// Sets the group's switch (from a heartbeat answer); `true` when it changed.
    pub(crate) fn set_by_group(&self, on: bool) -> bool {
        let changed = self.by_group.swap(on, Ordering::SeqCst) != on;
        self.publish();
        changed
    }

    /// Recomputes the effective value under the channel's lock, so that concurrent setters
    /// cannot leave a stale value behind.
    fn publish(&self) {
        self.effective.send_if_modified(|v| {
            let now = self.by_app() || self.by_group();
            std::mem::replace(v, now) != now
        });
    }
}

impl MemberShared {
    /// A member of `listener` for unit tests: its Redis handles point at a closed port
    /// (they connect on first use; a test that reaches Redis fails).
    #[cfg(test)]
    pub(crate) fn for_tests(listener: Listener) -> std::sync::Arc<Self> {
        Self::for_tests_with_health(listener, watch::channel(health::DataRedis::Up).1)
    }

    /// [`Self::for_tests`] with the data Redis health the test drives.
    #[cfg(test)]
    pub(crate) fn for_tests_with_health(
        listener: Listener,
        data_health: watch::Receiver<health::DataRedis>,
    ) -> std::sync::Arc<Self> {
        let settings = rsc_redis::ConnSettings {
            connect_timeout: std::time::Duration::from_millis(100),
            response_timeout: std::time::Duration::from_millis(100),
            operation_timeout: std::time::Duration::from_millis(100),
            reconnect: rsc_redis::Reconnect::Quick,
        };
        let redis = LazyRedis::open(
            &["redis://127.0.0.1:1".to_owned()],
            false,
            &settings,
            &rsc_redis::Tls::default(),
        )
        .expect("a valid URL");
        let pause = std::sync::Arc::new(PauseState::new());
        std::sync::Arc::new(MemberShared {
            group: listener.group.clone(),
            stream: listener.stream.clone(),
            member_id: "test-member".into(),
            incarnation: None,
            static_member: false,
            metrics: WorkerMetrics::new(&listener.group, &listener.stream),
            listener,
            redis: redis.clone(),
            doorbell: None,
            guards: std::sync::Arc::new(fence::GuardConns::new(redis.clone())),
            ack_conn: redis,
            paused: pause.subscribe(),
            pause,
            lease_until: std::sync::Mutex::new(None),
            ordered: AtomicBool::new(false),
            data_health,
            data_redis_grace: std::time::Duration::from_secs(15),
            joined: Default::default(),
        })
    }

    /// Whether the lease has run out.
    pub(crate) fn lease_expired(&self) -> bool {
        // A poisoned lock still holds a deadline (a panic cannot tear an `Option<Instant>`):
        // it is read, never taken for "unexpired".
        self.lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|d| tokio::time::Instant::now() >= d)
    }
}

/// Handles of the per-message metrics (labels `group`, `stream`).
#[derive(Clone)]
pub(crate) struct WorkerMetrics {
    pub(crate) handled: Counter,
    pub(crate) failed: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) duration: Histogram,
}

impl WorkerMetrics {
    pub(crate) fn new(group: &str, stream: &str) -> Self {
        let labels = [("group", group.to_owned()), ("stream", stream.to_owned())];
        WorkerMetrics {
            handled: metrics::counter!("rsc_client_messages_handled_total", &labels),
            failed: metrics::counter!("rsc_client_handler_failures_total", &labels),
            retried: metrics::counter!("rsc_client_messages_retried_total", &labels),
            dead_lettered: metrics::counter!("rsc_client_messages_dead_lettered_total", &labels),
            duration: metrics::histogram!("rsc_client_handler_duration_seconds", &labels),
        }
    }

    /// Entries of a shard not yet delivered to the group (`XINFO GROUPS` lag).
    pub(crate) fn lag(group: &str, stream: &str, shard: u32) -> Gauge {
        metrics::gauge!("rsc_client_shard_lag", "group" => group.to_owned(),
            "stream" => stream.to_owned(), "shard" => shard.to_string())
    }
}
