//! Wake-up channels: a group change reaches the members that must act on it at once, not at
//! their next heartbeat.
//!
//! A process opens one channel (`POST /v1/wakeups`, a server-sent event stream) for all its
//! members; the coordinator holding it writes `event: wake` with `{group, member_id}` when a
//! write changed what that member must do ([`crate::engine::members_to_wake`]). The member
//! then heartbeats at once. A wake-up is only a hint: the heartbeat stays the one authority
//! and the one liveness signal, so a lost wake-up costs at most one heartbeat interval.
//!
//! Across coordinator replicas ([`WakeHub::with_redis`]): the coordinator that decided a
//! change delivers to its own channels directly and publishes `PUBLISH <prefix>:wake:{<group>}`
//! once (only when a change was written: a steady heartbeat publishes nothing). Every
//! coordinator subscribes, on one dedicated pub/sub connection, to the channels of the groups
//! its open channels cover (SUBSCRIBE when the first channel of a group opens, UNSUBSCRIBE
//! when the last one closes), and resubscribes after a reconnect. On a Redis Cluster classic
//! pub/sub is cluster-wide: the subscriber connects to one seed node (the next one after a
//! failure) and publishes go through the cluster connection.

use rsc_protocol::{WakeEvent, WakeMember};
use rsc_redis::{ConnSettings, LazyRedis, Reconnect};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tracing::{debug, info, warn};

/// Limits of the wake-up channels of one coordinator.
#[derive(Debug, Clone, Copy)]
pub struct WakeLimits {
    /// Most channels open at once; one more is refused with `429 RATE_LIMITED`.
    pub max_channels: usize,
    /// Most channels one principal holds open at once (PROTOCOL §13): one more is refused
    /// with `429 RATE_LIMITED`, so that one credential cannot take every channel.
    pub max_channels_per_principal: usize,
    /// A channel with no wake-up for this long is closed (the client reopens it): bounds how
    /// long a vanished client's channel lingers.
    pub idle_timeout: Duration,
    /// How often an idle channel carries a keep-alive comment.
    pub keep_alive: Duration,
}

impl Default for WakeLimits {
    fn default() -> Self {
        WakeLimits {
            max_channels: 20_000,
            max_channels_per_principal: DEFAULT_MAX_CHANNELS_PER_PRINCIPAL,
            idle_timeout: Duration::from_secs(300),
            keep_alive: Duration::from_secs(15),
        }
    }
}

/// The default of [`WakeLimits::max_channels_per_principal`]: a process opens one channel
/// per 250 of its members on the one coordinator its heartbeats go to, so this is about a
/// thousand processes sharing one credential on one coordinator.
pub(crate) const DEFAULT_MAX_CHANNELS_PER_PRINCIPAL: usize = 1000;

/// A channel could not be opened: a limit of [`WakeLimits`] is reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelLimit {
    /// This coordinator holds its maximum of channels.
    #[error(
        "this coordinator holds its maximum of {0} wake-up channels; heartbeats work as usual \
         (retry later or on another coordinator)"
    )]
    Coordinator(usize),
    /// The principal holds its maximum of channels on this coordinator.
    #[error(
        "principal {principal} holds its maximum of {max} wake-up channels on this \
         coordinator (--wake-max-channels-per-principal); heartbeats work as usual \
         (close channels, or retry later)"
    )]
    Principal {
        /// Who.
        principal: String,
        /// Its limit.
        max: usize,
    },
}

impl ChannelLimit {
    /// The `reason` label of `rsc_wake_channels_refused_total`: `max_channels` or
    /// `per_principal`.
    pub fn reason(&self) -> &'static str {
        match self {
            ChannelLimit::Coordinator(_) => "max_channels",
            ChannelLimit::Principal { .. } => "per_principal",
        }
    }
}

/// What a channel and the hub share: the wake-ups not yet written, and the signal.
#[derive(Debug, Default)]
struct Inbox {
    /// `(group, member)` pairs to wake.
    pending: Mutex<BTreeSet<(String, String)>>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct Registry {
    /// (group, member) → the inboxes of the channels covering it.
    members: HashMap<(String, String), Vec<Arc<Inbox>>>,
    /// Open channels per group (the Redis subscription lives while it is above 0).
    groups: HashMap<String, usize>,
    /// Open channels per capped principal (removed at 0).
    principals: HashMap<String, usize>,
}

/// The wake-up channels of one coordinator, and their link to the other replicas.
#[derive(Debug)]
pub struct WakeHub {
    /// Who publishes (skipped when the message comes back).
    origin: String,
    limits: WakeLimits,
    registry: Mutex<Registry>,
    open: AtomicUsize,
    bus: Option<RedisBus>,
    closing: watch::Sender<bool>,
}

impl WakeHub {
    /// A hub for one process only (the memory store: there is no other replica).
    pub fn local(limits: WakeLimits) -> Arc<Self> {
        Arc::new(Self::new(limits, None))
    }

    fn new(limits: WakeLimits, bus: Option<RedisBus>) -> Self {
        WakeHub {
            origin: format!("{:016x}", rand::random::<u64>()),
            limits,
            registry: Mutex::default(),
            open: AtomicUsize::new(0),
            bus,
            closing: watch::channel(false).0,
        }
    }

    /// The connection settings of the wake-up publisher ([`Self::with_redis`]).
    pub const REDIS_SETTINGS: ConnSettings = ConnSettings {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(2),
        operation_timeout: Duration::from_secs(2),
        reconnect: Reconnect::Quick,
    };

    /// A hub linked to the other coordinators on the same Redis (`publisher`, opened with
    /// [`Self::REDIS_SETTINGS`]: one server, a cluster, or the master the sentinels name)
    /// through pub/sub on `<prefix>:wake:{<group>}`. Connects lazily; spawns the subscriber
    /// task, whose own connections go where the publisher's do, with its TLS settings (needs a
    /// Tokio runtime).
    pub fn with_redis(limits: WakeLimits, publisher: LazyRedis, prefix: &str) -> Arc<Self> {
        let redis = publisher.clone();
        let (commands, rx) = mpsc::unbounded_channel();
        let bus = RedisBus {
            publisher,
            prefix: prefix.to_owned(),
            commands,
        };
        let hub = Arc::new(Self::new(limits, Some(bus)));
        tokio::spawn(subscriber(Arc::downgrade(&hub), redis, rx));
        hub
    }

    /// The limits.
    pub fn limits(&self) -> WakeLimits {
        self.limits
    }

    /// Channels open now.
    pub fn open_channels(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Ends every open channel (graceful shutdown: open streams would hold it up).
    pub fn close_all(&self) {
        self.closing.send_replace(true);
    }

    /// Opens a channel for `members` (names already checked), counted against `principal`'s
    /// limit (`None`: only the coordinator's; the open coordinator's `anonymous`). With
    /// Redis, returns once this coordinator is subscribed to the channel's groups (at most
    /// 2 s), so that a change decided elsewhere right after the channel is ready reaches it.
    pub async fn open(
        self: &Arc<Self>,
        members: Vec<WakeMember>,
        principal: Option<&str>,
    ) -> Result<Channel, ChannelLimit> {
        let (channel, subscribed) = self.register(members, principal).inspect_err(|e| {
            ::metrics::counter!("rsc_wake_channels_refused_total", "reason" => e.reason())
                .increment(1);
        })?;
        if !subscribed.is_empty() {
            let all = futures::future::join_all(subscribed);
            if tokio::time::timeout(Duration::from_secs(2), all)
                .await
                .is_err()
            {
                debug!("wake-up subscription not confirmed within 2 s; the channel opens anyway");
            }
        }
        Ok(channel)
    }

    fn register(
        self: &Arc<Self>,
        members: Vec<WakeMember>,
        principal: Option<&str>,
    ) -> Result<(Channel, Vec<tokio::sync::oneshot::Receiver<()>>), ChannelLimit> {
        let members: BTreeSet<WakeMember> = members.into_iter().collect();
        let groups: BTreeSet<String> = members.iter().map(|m| m.group.to_string()).collect();
        let inbox = Arc::new(Inbox::default());
        let mut first = Vec::new();
        {
            let mut reg = self.lock();
            // Under the registry lock, so that two opens of one principal cannot both pass.
            let per_principal = self.limits.max_channels_per_principal;
            if let Some(p) = principal
                && reg.principals.get(p).copied().unwrap_or(0) >= per_principal
            {
                return Err(ChannelLimit::Principal {
                    principal: p.to_owned(),
                    max: per_principal,
                });
            }
            let max = self.limits.max_channels;
            if self
                .open
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_err()
            {
                return Err(ChannelLimit::Coordinator(max));
            }
            ::metrics::gauge!("rsc_wake_channels_open").increment(1.0);
            if let Some(p) = principal {
                *reg.principals.entry(p.to_owned()).or_default() += 1;
            }
            for m in &members {
                reg.members
                    .entry((m.group.to_string(), m.member_id.to_string()))
                    .or_default()
                    .push(inbox.clone());
            }
            for g in &groups {
                let n = reg.groups.entry(g.clone()).or_default();
                *n += 1;
                if *n == 1 {
                    first.push(g.clone());
                }
            }
        }
        let mut subscribed = Vec::new();
        if let Some(bus) = &self.bus {
            for g in first {
                let (done, wait) = tokio::sync::oneshot::channel();
                if bus
                    .commands
                    .send(BusCommand::Subscribe(g, Some(done)))
                    .is_ok()
                {
                    subscribed.push(wait);
                }
            }
        }
        let channel = Channel {
            hub: self.clone(),
            inbox,
            members,
            groups,
            principal: principal.map(str::to_owned),
            closing: self.closing.subscribe(),
        };
        Ok((channel, subscribed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self, ch: &Channel) {
        let mut last = Vec::new();
        {
            let mut reg = self.lock();
            for m in &ch.members {
                let key = (m.group.to_string(), m.member_id.to_string());
                if let Some(list) = reg.members.get_mut(&key) {
                    list.retain(|i| !Arc::ptr_eq(i, &ch.inbox));
                    if list.is_empty() {
                        reg.members.remove(&key);
                    }
                }
            }
            for g in &ch.groups {
                if let Some(n) = reg.groups.get_mut(g) {
                    *n -= 1;
                    if *n == 0 {
                        reg.groups.remove(g);
                        last.push(g.clone());
                    }
                }
            }
            if let Some(p) = &ch.principal
                && let Some(n) = reg.principals.get_mut(p)
            {
                *n -= 1;
                if *n == 0 {
                    reg.principals.remove(p);
                }
            }
        }
        if let Some(bus) = &self.bus {
            for g in last {
                let _ = bus.commands.send(BusCommand::Unsubscribe(g));
            }
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
        ::metrics::gauge!("rsc_wake_channels_open").decrement(1.0);
    }

    /// Wakes `members` of `group`: on this coordinator's channels at once, and through Redis
    /// on the others' (the publish runs in the background: the caller's answer does not wait).
    pub fn wake(&self, group: &str, members: Vec<String>) {
        if members.is_empty() {
            return;
        }
        debug!(group, ?members, "waking members");
        self.deliver(group, &members);
        if let Some(bus) = &self.bus {
            let mut payload = self.origin.clone();
            for m in &members {
                payload.push('\n');
                payload.push_str(m);
            }
            let channel = bus.channel(group);
            let publisher = bus.publisher.clone();
            tokio::spawn(async move {
                let r = async {
                    let mut conn = publisher.get().await?;
                    redis::cmd("PUBLISH")
                        .arg(&channel)
                        .arg(&payload)
                        .query_async::<i64>(&mut conn)
                        .await
                };
                match tokio::time::timeout(Duration::from_secs(2), r).await {
                    Ok(Ok(_)) => {
                        ::metrics::counter!("rsc_wake_publishes_total", "result" => "ok")
                            .increment(1);
                    }
                    Ok(Err(e)) => {
                        ::metrics::counter!("rsc_wake_publishes_total", "result" => "error")
                            .increment(1);
                        debug!(%channel, error = %e, "wake-up not published; members learn at their next heartbeat");
                    }
                    Err(_) => {
                        ::metrics::counter!("rsc_wake_publishes_total", "result" => "error")
                            .increment(1);
                        debug!(%channel, "wake-up publish timed out; members learn at their next heartbeat");
                    }
                }
            });
        }
    }

    /// Puts the wake-ups in the inboxes of this coordinator's channels covering them.
    fn deliver(&self, group: &str, members: &[String]) {
        let reg = self.lock();
        for m in members {
            let Some(inboxes) = reg.members.get(&(group.to_owned(), m.clone())) else {
                continue;
            };
            for inbox in inboxes {
                inbox
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((group.to_owned(), m.clone()));
                inbox.notify.notify_one();
            }
        }
    }

    /// A message from the bus: `<origin>\n<member>\n<member>…` on `channel`.
    fn received(&self, group: &str, payload: &str) {
        let mut lines = payload.split('\n');
        if lines.next() == Some(self.origin.as_str()) {
            return; // delivered locally when it was decided
        }
        let members: Vec<String> = lines.filter(|l| !l.is_empty()).map(str::to_owned).collect();
        self.deliver(group, &members);
    }

    fn subscribed_groups(&self) -> Vec<String> {
        self.lock().groups.keys().cloned().collect()
    }
}

/// One open wake-up channel; unregistered when dropped.
#[derive(Debug)]
pub struct Channel {
    hub: Arc<WakeHub>,
    inbox: Arc<Inbox>,
    members: BTreeSet<WakeMember>,
    groups: BTreeSet<String>,
    /// The principal it counts against, if capped.
    principal: Option<String>,
    closing: watch::Receiver<bool>,
}

/// What [`Channel::next`] returns.
#[derive(Debug)]
pub enum Next {
    /// Wake-ups to write.
    Wake(Vec<WakeEvent>),
    /// Nothing for the idle timeout, or the coordinator shuts down: end the stream.
    Close,
}

impl Channel {
    /// Waits for the next wake-ups of this channel's members, at most the idle timeout.
    pub async fn next(&mut self) -> Next {
        let idle = tokio::time::sleep(self.hub.limits.idle_timeout);
        tokio::pin!(idle);
        loop {
            if *self.closing.borrow() {
                return Next::Close;
            }
            let taken =
                std::mem::take(&mut *self.inbox.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if !taken.is_empty() {
                ::metrics::counter!("rsc_wakeups_sent_total").increment(taken.len() as u64);
                return Next::Wake(
                    taken
                        .into_iter()
                        .map(|(group, member_id)| WakeEvent { group, member_id })
                        .collect(),
                );
            }
            tokio::select! {
                _ = self.inbox.notify.notified() => {}
                _ = self.closing.changed() => {}
                _ = &mut idle => return Next::Close,
            }
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        let hub = self.hub.clone();
        hub.close(self);
    }
}

#[derive(Debug)]
struct RedisBus {
    publisher: LazyRedis,
    prefix: String,
    commands: mpsc::UnboundedSender<BusCommand>,
}

impl RedisBus {
    fn channel(&self, group: &str) -> String {
        wake_channel(&self.prefix, group)
    }
}

/// The pub/sub channel of a group's wake-ups (a hash tag, as the group's keys have).
pub(crate) fn wake_channel(prefix: &str, group: &str) -> String {
    format!("{prefix}:wake:{{{group}}}")
}

#[derive(Debug)]
enum BusCommand {
    /// Subscribe to a group's channel; signal when Redis confirmed it.
    Subscribe(String, Option<tokio::sync::oneshot::Sender<()>>),
    Unsubscribe(String),
}

/// The subscriber task: one pub/sub connection, subscribed to the groups with open channels;
/// reconnects (to the next seed on a cluster) and resubscribes after a failure. Ends when the
/// hub is gone.
async fn subscriber(
    hub: Weak<WakeHub>,
    redis: LazyRedis,
    commands: mpsc::UnboundedReceiver<BusCommand>,
) {
    Subscriber {
        hub,
        redis,
        commands,
        attempt: 0,
        backoff: Duration::from_millis(100),
        master: 0,
    }
    .run()
    .await;
}

/// The state of the [`subscriber`] task across its connections.
struct Subscriber {
    hub: Weak<WakeHub>,
    /// Where to connect: the next seed, or the master the sentinels name.
    redis: LazyRedis,
    commands: mpsc::UnboundedReceiver<BusCommand>,
    /// Connection attempts so far (picks the seed).
    attempt: usize,
    /// The wait before the next connection attempt.
    backoff: Duration,
    /// Behind sentinels: the master connection the current one was made from.
    master: u64,
}

/// Why a subscriber connection is given up.
enum Ended {
    /// It failed: connect again.
    Reconnect,
    /// The hub is gone: stop.
    Stop,
}

impl Subscriber {
    /// Connects, resubscribes and relays, again and again, until the hub is gone.
    async fn run(mut self) {
        loop {
            let Some(h) = self.hub.upgrade() else { return };
            let prefix = h.bus.as_ref().map(|b| b.prefix.clone()).unwrap_or_default();
            drop(h);
            let Some(pubsub) = self.connect().await else {
                tokio::time::sleep(self.backoff).await;
                self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
                continue;
            };
            let (mut sink, stream) = pubsub.split();
            match self.resubscribe(&mut sink, &prefix).await {
                Ok(()) => {}
                Err(Ended::Stop) => return,
                Err(Ended::Reconnect) => {
                    tokio::time::sleep(self.backoff).await;
                    continue;
                }
            }
            self.backoff = Duration::from_millis(100);
            if let Ended::Stop = self.relay(&mut sink, stream, &prefix).await {
                return;
            }
            tokio::time::sleep(self.backoff).await;
        }
    }

    /// One connection attempt to the next seed, or behind sentinels to the current master
    /// (within 2 s, or the sentinels' look-up bound); `None` after logging a failure.
    async fn connect(&mut self) -> Option<redis::aio::PubSub> {
        let seeds = self.redis.seeds();
        let seed = seeds[self.attempt % seeds.len()].clone();
        self.attempt += 1;
        let sentinel = self.redis.sentinel().cloned();
        let mut master = None;
        let connected = async {
            let target = match &sentinel {
                Some(s) => {
                    let (generation, info) = s.master().await?;
                    master = Some(generation);
                    info
                }
                None => seed,
            };
            let client = redis::Client::open(target)?;
            client.get_async_pubsub().await
        };
        let bound = match &sentinel {
            Some(_) => Duration::from_secs(10),
            None => Duration::from_secs(2),
        };
        match tokio::time::timeout(bound, connected).await {
            Ok(Ok(p)) => {
                self.master = master.unwrap_or(0);
                Some(p)
            }
            Ok(Err(e)) => {
                if let (Some(s), Some(generation)) = (&sentinel, master) {
                    // A dead master: the next attempt asks the sentinels again.
                    s.report(generation, &e);
                }
                warn!(error = %e, "wake-up subscriber cannot connect; retrying (members wake at their heartbeats meanwhile)");
                None
            }
            Err(_) => {
                warn!("wake-up subscriber connect timed out; retrying");
                None
            }
        }
    }

    /// Subscribes a new connection to every group with open channels. Queued commands are
    /// dropped: the registry is the truth.
    async fn resubscribe(
        &mut self,
        sink: &mut redis::aio::PubSubSink,
        prefix: &str,
    ) -> Result<(), Ended> {
        while self.commands.try_recv().is_ok() {}
        let groups = match self.hub.upgrade() {
            Some(h) => h.subscribed_groups(),
            None => return Err(Ended::Stop),
        };
        for g in &groups {
            if let Err(e) = sink.subscribe(wake_channel(prefix, g)).await {
                warn!(error = %e, "wake-up subscribe failed; reconnecting");
                return Err(Ended::Reconnect);
            }
        }
        info!(groups = groups.len(), "wake-up subscriber connected");
        Ok(())
    }

    /// Applies subscription changes and hands received wake-ups to the hub until the
    /// connection fails or the hub is gone.
    async fn relay(
        &mut self,
        sink: &mut redis::aio::PubSubSink,
        mut stream: redis::aio::PubSubStream,
        prefix: &str,
    ) -> Ended {
        use futures::StreamExt;
        let marker = format!("{prefix}:wake:{{");
        let sentinel = self.redis.sentinel().cloned();
        loop {
            tokio::select! {
                // The sentinels named a new master: resubscribe there at once.
                _ = left(sentinel.as_ref(), self.master) => {
                    info!("wake-up subscriber: the Redis master switched; resubscribing on the new one");
                    return Ended::Reconnect;
                }
                cmd = self.commands.recv() => {
                    let Some(cmd) = cmd else { return Ended::Stop };
                    if let Err(e) = apply(sink, prefix, cmd).await {
                        warn!(error = %e, "wake-up subscription change failed; reconnecting");
                        return Ended::Reconnect;
                    }
                }
                msg = stream.next() => {
                    let Some(msg) = msg else {
                        warn!("wake-up subscriber lost its connection; reconnecting");
                        return Ended::Reconnect;
                    };
                    let Some(h) = self.hub.upgrade() else { return Ended::Stop };
                    let channel = msg.get_channel_name();
                    let Some(group) = channel
                        .strip_prefix(marker.as_str())
                        .and_then(|g| g.strip_suffix('}'))
                    else {
                        continue;
                    };
                    if let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) {
                        h.received(group, payload);
                    }
                }
            }
        }
    }
}

/// Resolves when connection `master` of `sentinel` is no longer the one in use; never
/// without sentinels.
async fn left(sentinel: Option<&rsc_redis::sentinel::SentinelRedis>, master: u64) {
    match sentinel {
        Some(s) => s.left(master).await,
        None => std::future::pending().await,
    }
}

/// Applies one subscription change; a subscribe signals when Redis confirmed it.
async fn apply(
    sink: &mut redis::aio::PubSubSink,
    prefix: &str,
    cmd: BusCommand,
) -> redis::RedisResult<()> {
    match cmd {
        BusCommand::Subscribe(g, done) => {
            let r = sink.subscribe(wake_channel(prefix, &g)).await;
            if let (Ok(()), Some(done)) = (&r, done) {
                let _ = done.send(());
            }
            r
        }
        BusCommand::Unsubscribe(g) => sink.unsubscribe(wake_channel(prefix, &g)).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wm(g: &str, m: &str) -> WakeMember {
        WakeMember {
            group: g.parse().unwrap(),
            member_id: m.parse().unwrap(),
        }
    }

    #[tokio::test]
    async fn a_wake_reaches_the_channels_covering_the_member_only() {
        let hub = WakeHub::local(WakeLimits::default());
        let mut a = hub
            .open(vec![wm("g", "a"), wm("h", "a")], None)
            .await
            .unwrap();
        let mut b = hub.open(vec![wm("g", "b")], None).await.unwrap();
        hub.wake("g", vec!["a".into(), "x".into()]);
        match a.next().await {
            Next::Wake(e) => assert_eq!(
                e,
                vec![WakeEvent {
                    group: "g".into(),
                    member_id: "a".into()
                }]
            ),
            Next::Close => panic!("closed"),
        }
        let nothing = tokio::time::timeout(Duration::from_millis(50), b.next()).await;
        assert!(nothing.is_err(), "b was not woken");
        assert_eq!(hub.open_channels(), 2);
        drop(a);
        assert_eq!(hub.open_channels(), 1);
        assert!(!hub.lock().members.contains_key(&("g".into(), "a".into())));
        assert_eq!(hub.lock().groups.get("g"), Some(&1));
    }

    #[tokio::test]
    async fn wake_ups_coalesce_until_written_and_none_is_lost() {
        let hub = WakeHub::local(WakeLimits::default());
        let mut a = hub
            .open(vec![wm("g", "a"), wm("g", "b")], None)
            .await
            .unwrap();
        hub.wake("g", vec!["a".into()]);
        hub.wake("g", vec!["a".into(), "b".into()]);
        let Next::Wake(e) = a.next().await else {
            panic!("closed")
        };
        assert_eq!(e.len(), 2);
    }

    #[tokio::test]
    async fn the_limit_refuses_one_channel_more_and_close_all_ends_them() {
        let hub = WakeHub::local(WakeLimits {
            max_channels: 1,
            ..WakeLimits::default()
        });
        let mut a = hub.open(vec![wm("g", "a")], None).await.unwrap();
        assert!(hub.open(vec![wm("g", "b")], None).await.is_err());
        hub.close_all();
        assert!(matches!(a.next().await, Next::Close));
    }

    #[tokio::test]
    async fn an_idle_channel_closes_after_the_idle_timeout() {
        let hub = WakeHub::local(WakeLimits {
            idle_timeout: Duration::from_millis(50),
            ..WakeLimits::default()
        });
        let mut a = hub.open(vec![wm("g", "a")], None).await.unwrap();
        assert!(matches!(a.next().await, Next::Close));
    }
    #[tokio::test]
    async fn a_principal_over_its_limit_is_refused_while_another_still_opens() {
        let hub = WakeHub::local(WakeLimits {
            max_channels: 4,
            max_channels_per_principal: 2,
            ..WakeLimits::default()
        });
        let a1 = hub.open(vec![wm("g", "a1")], Some("a")).await.unwrap();
        let _a2 = hub.open(vec![wm("g", "a2")], Some("a")).await.unwrap();
        let e = hub.open(vec![wm("g", "a3")], Some("a")).await.unwrap_err();
        assert_eq!(
            e,
            ChannelLimit::Principal {
                principal: "a".into(),
                max: 2
            }
        );
        assert_eq!(e.reason(), "per_principal");
        assert!(
            e.to_string().contains("principal a holds its maximum of 2"),
            "{e}"
        );
        assert_eq!(hub.open_channels(), 2, "a refusal holds no channel");
        // Another principal, and the uncapped (no ACL), still open channels.
        let _b = hub.open(vec![wm("g", "b")], Some("b")).await.unwrap();
        let _n1 = hub.open(vec![wm("g", "n1")], None).await.unwrap();
        // Closing one of a's channels makes room for it again.
        drop(a1);
        let _a3 = hub.open(vec![wm("g", "a3")], Some("a")).await.unwrap();
        // The coordinator's limit still holds for everyone.
        let e = hub.open(vec![wm("g", "c")], Some("c")).await.unwrap_err();
        assert_eq!(
            (e.clone(), e.reason()),
            (ChannelLimit::Coordinator(4), "max_channels")
        );
        assert!(
            !hub.lock().principals.contains_key("c"),
            "a refused open counts nothing"
        );
        assert_eq!(hub.lock().principals.get("a"), Some(&2));
    }
}
