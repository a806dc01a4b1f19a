//! The doorbell: how the shard workers of a process learn that their shards have new
//! entries without a blocked read, a connection or a periodic command of their own
//! (ARCHITECTURE "Data plane", PROTOCOL §16).
//!
//! One per app and data Redis: standalone, the master behind Sentinel, or a Redis Cluster
//! (sharded pub/sub and a poll per node, [`cluster`]):
//!
//! - **Rings.** Producers publish an empty message on the shard's doorbell channel
//!   ([`rsc_protocol::routing::ring_channel`]) in the round trip of their `XADD`s. One
//!   subscriber connection per process listens on the channels of every shard the process
//!   reads and wakes those shards' workers. It is opened again when it drops and, behind
//!   Sentinel, when the sentinels name another master; every worker is woken then.
//! - **Fallback poll**, for producers that do not ring (other clients, `redis-cli`), a ring
//!   lost with a dropped subscriber connection, or a master switch not followed yet: every
//!   [`POLL`] one non-blocking `XREAD COUNT 1 STREAMS k1 … kn id1 … idn` over the shards
//!   whose workers wait, each after the last entry its worker saw, on the shared
//!   connection. Nothing is sent while no worker waits.
//!
//! A wake-up is a hint only: a woken worker reads its shard (non-blocking) and finds what
//! there is. A ring that comes while the worker is busy is kept (one permit), so a ring
//! between the worker's last read and its wait is never lost.

mod cluster;

use futures::StreamExt;
use redis::RedisError;
use redis::aio::{PubSubSink, PubSubStream};
use redis::streams::StreamReadReply;
use rsc_protocol::routing::{parse_entry_id, ring_channel, ring_channel_key};
use rsc_redis::LazyRedis;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, info, warn};

/// How often the fallback poll runs while some worker waits.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// At most this many shard keys in one poll command.
const POLL_CHUNK: usize = 2_000;

/// Bound of opening the subscriber connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often, behind Sentinel, the subscriber checks that it is still on the sentinels'
/// master.
const MASTER_CHECK: Duration = Duration::from_secs(1);

/// The doorbell of one app's data Redis (see the module docs). Dropping the last handle stops
/// its task.
pub(crate) struct Doorbell {
    shared: Arc<Shared>,
    _stop: DropGuard,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell").finish_non_exhaustive()
    }
}

/// What the workers and the doorbell's task share.
#[derive(Default)]
struct Shared {
    /// The bells of each shard key (several when several groups of the app read it).
    bells: Mutex<HashMap<String, Vec<Arc<BellState>>>>,
    /// The set of keys changed: the task subscribes or unsubscribes.
    changed: Notify,
}

impl Shared {
    fn bells(&self) -> MutexGuard<'_, HashMap<String, Vec<Arc<BellState>>>> {
        // The map stays consistent (every change is one insert or remove); a poisoned lock
        // costs at worst a wake-up for nothing.
        self.bells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the workers of `key` (`polled`: for the poll's finding); `false` when none
    /// reads it.
    pub(super) fn ring(&self, key: &str, polled: bool) -> bool {
        let bells = self.bells();
        let Some(list) = bells.get(key) else {
            return false;
        };
        for b in list {
            if polled {
                b.polled.store(true, Ordering::Relaxed);
            }
            b.notify.notify_one();
        }
        true
    }

    /// Wakes every worker (after the subscriber connection changed: rings may be lost).
    fn ring_all(&self) {
        for b in self.bells().values().flatten() {
            b.notify.notify_one();
        }
    }

    /// The keys whose workers wait, each with the lowest id after which one of them has
    /// seen everything.
    pub(super) fn waiting(&self) -> Vec<(String, String)> {
        let bells = self.bells();
        let mut out = Vec::new();
        for (key, list) in bells.iter() {
            let lowest = list
                .iter()
                .filter_map(|b| b.waiting_after())
                .min_by_key(|id| parse_entry_id(id).unwrap_or((0, 0)));
            if let Some(id) = lowest {
                out.push((key.clone(), id));
            }
        }
        out
    }
}

/// Why a [`Bell::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The shard's channel rang (or the subscriber connection changed).
    Ring,
    /// The fallback poll found an entry after the worker's last one.
    Poll,
}

/// One worker's registration.
struct BellState {
    notify: Notify,
    /// The last wake-up came from the poll.
    polled: AtomicBool,
    /// While the worker waits: the last entry id it saw on the shard.
    after: Mutex<Option<String>>,
}

impl BellState {
    fn waiting_after(&self) -> Option<String> {
        self.after
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_after(&self, after: Option<String>) {
        *self.after.lock().unwrap_or_else(PoisonError::into_inner) = after;
    }
}

impl Doorbell {
    /// The doorbell of `redis`. Needs a Tokio runtime: it spawns its tasks.
    pub(crate) fn start(redis: &LazyRedis) -> Arc<Doorbell> {
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        tokio::spawn(run(Arc::downgrade(&shared), redis.clone(), stop.clone()));
        // The poll has a task of its own, so that its round trip never delays a ring.
        tokio::spawn(poll_loop(
            Arc::downgrade(&shared),
            redis.clone(),
            stop.clone(),
            POLL,
        ));
        Arc::new(Doorbell {
            shared,
            _stop: stop.drop_guard(),
        })
    }

    /// Registers a worker of `key`: rings on the key's channel and the fallback poll wake
    /// it from [`Bell::wait`] until the [`Bell`] is dropped.
    pub(crate) fn bell(&self, key: &str) -> Bell {
        let state = Arc::new(BellState {
            notify: Notify::new(),
            polled: AtomicBool::new(false),
            after: Mutex::new(None),
        });
        let new_key = {
            let mut bells = self.shared.bells();
            let list = bells.entry(key.to_owned()).or_default();
            list.push(state.clone());
            list.len() == 1
        };
        if new_key {
            self.shared.changed.notify_one();
        }
        Bell {
            key: key.to_owned(),
            state,
            shared: self.shared.clone(),
        }
    }
}

/// A worker's registration with the [`Doorbell`] (removed when dropped).
pub(crate) struct Bell {
    key: String,
    state: Arc<BellState>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell").field("key", &self.key).finish()
    }
}

impl Bell {
    /// Waits for a ring of the shard, or for the fallback poll to find an entry after
    /// `after` (the last entry id the worker saw on the shard). Returns at once when the
    /// shard rang since the last wait. Cancel-safe.
    pub(crate) async fn wait(&self, after: &str) -> Woken {
        struct Reset<'a>(&'a BellState);
        impl Drop for Reset<'_> {
            fn drop(&mut self) {
                self.0.set_after(None);
            }
        }
        self.state.set_after(Some(after.to_owned()));
        let _reset = Reset(&self.state);
        self.state.notify.notified().await;
        if self.state.polled.swap(false, Ordering::Relaxed) {
            Woken::Poll
        } else {
            Woken::Ring
        }
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        let last = {
            let mut bells = self.shared.bells();
            let mut last = false;
            if let Some(list) = bells.get_mut(&self.key) {
                list.retain(|b| !Arc::ptr_eq(b, &self.state));
                if list.is_empty() {
                    bells.remove(&self.key);
                    last = true;
                }
            }
            last
        };
        if last {
            self.shared.changed.notify_one();
        }
    }
}

/// The subscriber connection.
struct Subscriber {
    channel: Channel,
    /// Behind Sentinel: the master look-up it was opened on.
    master: u64,
    /// The shard keys subscribed to.
    keys: HashSet<String>,
}

/// The pub/sub connection of a [`Subscriber`].
enum Channel {
    /// Standalone or behind Sentinel: `SUBSCRIBE` on the server.
    Plain {
        sink: PubSubSink,
        messages: PubSubStream,
    },
    /// Redis Cluster: `SSUBSCRIBE` on each node.
    Sharded(cluster::Sharded),
}

/// What the subscriber connection received.
enum Event {
    /// A ring on this channel.
    Ring(String),
    /// The subscription of this channel was dropped by the server (Redis Cluster: its slot
    /// moved): subscribe again.
    Dropped(String),
    /// Rings may have been lost (a node connection dropped and is subscribed again).
    Gap,
    /// Nothing to act on.
    Other,
}

/// Opens the subscriber connection to the server (behind Sentinel: the sentinels' master;
/// on a Redis Cluster: each node).
async fn connect(redis: &LazyRedis) -> Result<Subscriber, RedisError> {
    if redis.is_cluster() {
        return Ok(Subscriber {
            channel: Channel::Sharded(cluster::connect(redis).await?),
            master: 0,
            keys: HashSet::new(),
        });
    }
    let (master, info) = match redis.sentinel() {
        Some(s) => s.master().await?,
        None => (0, redis.seeds()[0].clone()),
    };
    let client = redis::Client::open(info)?;
    let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    let (sink, messages) = pubsub.split();
    Ok(Subscriber {
        channel: Channel::Plain { sink, messages },
        master,
        keys: HashSet::new(),
    })
}

impl Subscriber {
    /// Subscribes to the channels of the keys read now and unsubscribes from the others.
    async fn sync(&mut self, shared: &Shared) -> Result<(), RedisError> {
        let want: HashSet<String> = shared.bells().keys().cloned().collect();
        let add = channels(want.difference(&self.keys));
        let drop = channels(self.keys.difference(&want));
        match &mut self.channel {
            Channel::Plain { sink, .. } => {
                if !add.is_empty() {
                    sink.subscribe(&add).await?;
                }
                if !drop.is_empty() {
                    sink.unsubscribe(&drop).await?;
                }
            }
            Channel::Sharded(sharded) => {
                sharded.change(&add, true).await?;
                sharded.change(&drop, false).await?;
            }
        }
        self.keys = want;
        Ok(())
    }

    /// The next event; `None` when the connection closed.
    async fn next(&mut self) -> Option<Event> {
        match &mut self.channel {
            Channel::Plain { messages, .. } => {
                let msg = messages.next().await?;
                Some(Event::Ring(msg.get_channel_name().to_owned()))
            }
            Channel::Sharded(sharded) => Some(match sharded.next().await? {
                cluster::Push::Ring(ch) => Event::Ring(ch),
                cluster::Push::Dropped(ch) => Event::Dropped(ch),
                cluster::Push::Disconnected => Event::Gap,
                cluster::Push::Other => Event::Other,
            }),
        }
    }
}

/// Metric handles of the doorbell's subscriber.
struct Metrics {
    rings: metrics::Counter,
    connected: metrics::Gauge,
}

impl Metrics {
    fn new() -> Self {
        Metrics {
            rings: metrics::counter!("rsc_client_doorbell_rings_total"),
            connected: metrics::gauge!("rsc_client_doorbell_connected"),
        }
    }
}

/// The doorbell's fallback poll, every `poll` (see the module docs). Ends when the doorbell is
/// dropped.
async fn poll_loop(
    shared: Weak<Shared>,
    redis: LazyRedis,
    stop: CancellationToken,
    poll: Duration,
) {
    let wakeups = metrics::counter!("rsc_client_doorbell_poll_wakeups_total");
    let mut slots = None;
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let Some(s) = shared.upgrade() else { return };
        let woken = if redis.is_cluster() {
            cluster::poll_once(&s, &redis, &mut slots).await
        } else {
            poll_once(&s, &redis).await
        };
        wakeups.increment(woken);
    }
}

/// The doorbell's subscriber task: keeps the subscriber connection and turns its messages
/// into wake-ups. Ends when the doorbell is dropped.
async fn run(shared: Weak<Shared>, redis: LazyRedis, stop: CancellationToken) {
    let m = Metrics::new();
    let mut sub: Option<Subscriber> = None;
    let mut backoff =
        super::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut reconnect_at = tokio::time::Instant::now();
    let mut failures = 0u64;
    let mut master_tick = tokio::time::interval(MASTER_CHECK);
    master_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let Some(s) = shared.upgrade() else { return };
        if sub.is_none() && tokio::time::Instant::now() >= reconnect_at {
            sub = tokio::select! {
                opened = open(&redis, &s, &m, &mut failures) => opened,
                _ = stop.cancelled() => return,
            };
            if sub.is_none() {
                reconnect_at = tokio::time::Instant::now() + backoff.next_delay();
            } else {
                backoff.reset();
            }
        }
        let on = sub.as_ref().map(|s| s.master);
        let lost = tokio::select! {
            _ = stop.cancelled() => return,
            // The sentinels named a new master: resubscribe there at once.
            () = master_left(&redis, on) => true,
            _ = s.changed.notified() => match sub.as_mut() {
                Some(sub) => sub.sync(&s).await.is_err(),
                None => false,
            },
            event = next_event(&mut sub) => match event {
                Some(event) => {
                    on_event(&s, sub.as_mut(), &m, event);
                    false
                }
                None => true,
            },
            _ = master_tick.tick(), if redis.sentinel().is_some() && sub.is_some() => {
                master_moved(&redis, sub.as_ref()).await
            }
            _ = tokio::time::sleep_until(reconnect_at), if sub.is_none() => false,
        };
        if lost {
            debug!("doorbell subscriber connection lost or stale; opening another");
            sub = None;
            m.connected.set(0.0);
            s.ring_all();
        }
    }
}

/// Opens the subscriber connection and subscribes to every key read now; wakes every worker
/// (rings sent while no connection listened are lost). `None` when it failed (`failures`
/// counts the failures in a row; the first and every 30th is logged as a warning).
async fn open(
    redis: &LazyRedis,
    shared: &Shared,
    m: &Metrics,
    failures: &mut u64,
) -> Option<Subscriber> {
    let opened = match connect(redis).await {
        Ok(mut fresh) => fresh.sync(shared).await.map(|()| fresh),
        Err(e) => Err(e),
    };
    match opened {
        Ok(fresh) => {
            if *failures > 0 {
                info!(
                    after_failures = *failures,
                    "doorbell subscriber connected again"
                );
            }
            *failures = 0;
            m.connected.set(1.0);
            shared.ring_all();
            Some(fresh)
        }
        Err(e) => {
            *failures += 1;
            if *failures == 1 || failures.is_multiple_of(30) {
                warn!(error = %e, failures = *failures, "doorbell: cannot open the subscriber connection; workers fall back to the poll");
            }
            None
        }
    }
}

/// The doorbell channels of `keys`.
fn channels<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<String> {
    keys.map(|k| ring_channel(k)).collect()
}

/// The next event of the subscriber connection; `None` when it closed. Pending forever
/// without a connection.
async fn next_event(sub: &mut Option<Subscriber>) -> Option<Event> {
    match sub {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// Acts on an event of the subscriber connection.
fn on_event(shared: &Shared, sub: Option<&mut Subscriber>, m: &Metrics, event: Event) {
    match event {
        Event::Ring(channel) => {
            if let Some(key) = ring_channel_key(&channel)
                && shared.ring(key, false)
            {
                m.rings.increment(1);
            }
        }
        Event::Dropped(channel) => {
            // Still wanted: forget it was subscribed, so the next sync subscribes it again
            // (on the node that serves the slot now); rings sent meanwhile may be lost.
            if let (Some(key), Some(sub)) = (ring_channel_key(&channel), sub)
                && shared.ring(key, false)
                && sub.keys.remove(key)
            {
                shared.changed.notify_one();
            }
        }
        Event::Gap => shared.ring_all(),
        Event::Other => {}
    }
}

/// Behind Sentinel: resolves when the master connection `on` (the subscriber's) is no longer
/// the one in use. Pending forever without Sentinel or a subscriber.
async fn master_left(redis: &LazyRedis, on: Option<u64>) {
    match (redis.sentinel(), on) {
        (Some(s), Some(generation)) => s.left(generation).await,
        _ => std::future::pending().await,
    }
}

/// Behind Sentinel: whether the sentinels name another master than the subscriber's.
async fn master_moved(redis: &LazyRedis, sub: Option<&Subscriber>) -> bool {
    let (Some(s), Some(sub)) = (redis.sentinel(), sub) else {
        return false;
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, s.master()).await {
        Ok(Ok((generation, _))) => generation != sub.master,
        _ => false,
    }
}

/// One fallback poll: wakes the waiting workers of every shard that has an entry after the
/// one they saw last; the number of shards woken.
async fn poll_once(shared: &Shared, redis: &LazyRedis) -> u64 {
    let waiting = shared.waiting();
    let mut woken = 0;
    for chunk in waiting.chunks(POLL_CHUNK) {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(1).arg("STREAMS");
        for (key, _) in chunk {
            cmd.arg(key);
        }
        for (_, id) in chunk {
            cmd.arg(id);
        }
        let r: Result<Option<StreamReadReply>, RedisError> =
            cmd.query_async(&mut redis.clone()).await;
        match r {
            Ok(reply) => {
                for k in reply.into_iter().flat_map(|r| r.keys) {
                    if shared.ring(&k.key, true) {
                        woken += 1;
                    }
                }
            }
            Err(e) => {
                debug!(error = %e, "doorbell poll failed");
                return woken;
            }
        }
    }
    woken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_with(keys: &[&str]) -> (Arc<Shared>, Vec<Bell>) {
        let shared = Arc::new(Shared::default());
        let bells = keys
            .iter()
            .map(|k| {
                let state = Arc::new(BellState {
                    notify: Notify::new(),
                    polled: AtomicBool::new(false),
                    after: Mutex::new(None),
                });
                shared
                    .bells()
                    .entry((*k).to_owned())
                    .or_default()
                    .push(state.clone());
                Bell {
                    key: (*k).to_owned(),
                    state,
                    shared: shared.clone(),
                }
            })
            .collect();
        (shared, bells)
    }

    #[tokio::test]
    async fn a_ring_before_the_wait_is_kept() {
        let (shared, bells) = shared_with(&["s:0"]);
        assert!(shared.ring("s:0", false));
        // The ring came while the worker was busy: its wait returns at once.
        let woken = tokio::time::timeout(Duration::from_secs(1), bells[0].wait("1-0"))
            .await
            .expect("the kept ring");
        assert_eq!(woken, Woken::Ring);
        assert!(shared.ring("s:0", true));
        assert_eq!(bells[0].wait("1-0").await, Woken::Poll);
        assert!(shared.ring("s:0", false));
        assert_eq!(
            bells[0].wait("1-0").await,
            Woken::Ring,
            "the poll's mark is cleared"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_without_a_ring_waits() {
        let (shared, bells) = shared_with(&["s:0", "s:1"]);
        assert!(shared.ring("s:1", false));
        assert!(!shared.ring("s:9", false));
        let r = tokio::time::timeout(Duration::from_secs(5), bells[0].wait("1-0")).await;
        assert!(r.is_err(), "woken by another shard's ring");
    }

    #[tokio::test]
    async fn waiting_lists_only_waiting_workers_with_their_lowest_id() {
        let (shared, bells) = shared_with(&["s:0", "s:0", "s:1"]);
        assert!(shared.waiting().is_empty());
        let a = bells[0].wait("5-1");
        let b = bells[1].wait("12-0");
        let c = bells[2].wait("3-0");
        tokio::pin!(a, b, c);
        // Register the waits (each future sets its id on first poll).
        for _ in 0..2 {
            let _ = futures::poll!(&mut a);
            let _ = futures::poll!(&mut b);
            let _ = futures::poll!(&mut c);
        }
        let mut w = shared.waiting();
        w.sort();
        assert_eq!(
            w,
            vec![
                ("s:0".to_owned(), "5-1".to_owned()),
                ("s:1".to_owned(), "3-0".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn a_cancelled_wait_is_not_listed_and_a_dropped_bell_is_gone() {
        let (shared, mut bells) = shared_with(&["s:0", "s:1"]);
        {
            let w = bells[0].wait("1-0");
            tokio::pin!(w);
            let _ = futures::poll!(&mut w);
            assert_eq!(shared.waiting().len(), 1);
        }
        assert!(shared.waiting().is_empty());
        bells.remove(0);
        assert!(!shared.ring("s:0", false));
        assert!(shared.ring("s:1", false));
    }
}
