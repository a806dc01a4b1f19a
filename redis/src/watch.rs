//! Following the sentinels' master switches as they happen: one watcher per process, set of
//! sentinels and master name, shared by every connection to that master.
//!
//! A client that looks the master up again only after an error keeps writing to a server
//! that was promoted and then lost a second, quick failover: it still calls itself master
//! until the sentinels convert it, and what it accepted meanwhile is thrown away when it
//! resyncs. The watcher learns of a switch within about a second, from two sources:
//!
//! - a subscription to the `+promoted-slave` and `+switch-master` channels of every sentinel,
//!   kept open across sentinel restarts, reconnected with a backoff of 100 ms doubling to
//!   5 s. `+promoted-slave` comes first: the failover's replica answers as master, and from
//!   then on the old master's writes are lost when it is converted; `+switch-master` only
//!   ends the failover, once the other replicas were reconfigured (a second or more later);
//! - a poll of every sentinel (`SENTINEL MASTER NAME`, for the `config-epoch`, and
//!   `SENTINEL GET-MASTER-ADDR-BY-NAME`, which names the promoted replica as soon as the
//!   failover reconfigures replicas) every second, and at once after an event or a
//!   resubscription (events sent while a subscription was down are lost).
//!
//! Sentinels may disagree for a moment after a failover (the configuration spreads through
//! their hello messages): the master with the highest `config-epoch` wins, and an answer of
//! an older epoch never moves the watcher back ([`Tracker`], the pure core).
//!
//! On a switch every registered follower (each [`crate::sentinel::SentinelRedis`]) is
//! told synchronously; it drops its connection to the old master, and the connections made
//! from it (shared, dedicated, pub/sub) stop sending there (see [`crate::sentinel`]).

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// How often the sentinels are asked for the master when no event came.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// First wait before a sentinel subscription is opened again.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between subscription attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The channel the sentinels announce a new master on, at the end of a failover.
const SWITCH_CHANNEL: &str = "+switch-master";
/// The channel the sentinels announce the failover's replica on, once it answers as master.
const PROMOTED_CHANNEL: &str = "+promoted-slave";

/// A master as the sentinels name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedMaster {
    /// Host (as the sentinels announce it).
    pub host: String,
    /// Port.
    pub port: u16,
    /// The sentinels' `config-epoch` of this configuration (after an event, one more than
    /// the last known: a failover always raises it).
    pub epoch: u64,
}

impl NamedMaster {
    /// Whether this is the server at `host:port`.
    pub fn is_at(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port == port
    }
}

/// What the sentinels said, reduced to the master to use (pure; see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Tracker {
    current: Option<NamedMaster>,
}

impl Tracker {
    /// The master to use, once one is known.
    pub fn current(&self) -> Option<&NamedMaster> {
        self.current.as_ref()
    }

    /// The answers of one poll (one per sentinel that answered). Returns the new master
    /// when they name another one than the current at an epoch at least as recent.
    pub fn polled(&mut self, answers: &[NamedMaster]) -> Option<NamedMaster> {
        let best = answers.iter().max_by_key(|m| m.epoch)?;
        match &mut self.current {
            Some(c) if best.epoch < c.epoch => None,
            Some(c) if c.is_at(&best.host, best.port) => {
                c.epoch = best.epoch;
                None
            }
            _ => {
                self.current = Some(best.clone());
                Some(best.clone())
            }
        }
    }

    /// A `+switch-master` event named `host:port`. Returns the new master when it is
    /// another one than the current.
    pub fn switched(&mut self, host: &str, port: u16) -> Option<NamedMaster> {
        if self.current.as_ref().is_some_and(|c| c.is_at(host, port)) {
            return None;
        }
        let next = NamedMaster {
            host: host.to_owned(),
            port,
            epoch: self.current.as_ref().map_or(1, |c| c.epoch + 1),
        };
        self.current = Some(next.clone());
        Some(next)
    }
}

/// The new master in a `+switch-master` payload (`NAME OLD-IP OLD-PORT NEW-IP NEW-PORT`),
/// when it is about `master_name`.
pub fn parse_switch(payload: &str, master_name: &str) -> Option<(String, u16)> {
    let parts: Vec<&str> = payload.split_whitespace().collect();
    match parts.as_slice() {
        [name, _, _, host, port] if *name == master_name => {
            Some(((*host).to_owned(), port.parse().ok()?))
        }
        _ => None,
    }
}

/// The replica promoted for `master_name` in a `+promoted-slave` payload (`slave IP:PORT IP
/// PORT @ NAME MASTER-IP MASTER-PORT`).
pub fn parse_promoted(payload: &str, master_name: &str) -> Option<(String, u16)> {
    let parts: Vec<&str> = payload.split_whitespace().collect();
    match parts.as_slice() {
        [_, _, host, port, "@", name, _, _] if *name == master_name => {
            Some(((*host).to_owned(), port.parse().ok()?))
        }
        _ => None,
    }
}

/// The master in a `SENTINEL MASTER NAME` reply (field → value) and the address
/// `SENTINEL GET-MASTER-ADDR-BY-NAME` gave with it. When that address is another one, the
/// sentinel is failing over to it: it is named at the epoch the failover will end at (one
/// more, at least).
pub fn parse_master(
    fields: &HashMap<String, String>,
    addr: Option<(String, u16)>,
) -> Option<NamedMaster> {
    let configured = NamedMaster {
        host: fields.get("ip")?.clone(),
        port: fields.get("port")?.parse().ok()?,
        epoch: fields.get("config-epoch")?.parse().ok()?,
    };
    Some(match addr {
        Some((host, port)) if !configured.is_at(&host, port) => NamedMaster {
            host,
            port,
            epoch: configured.epoch + 1,
        },
        _ => configured,
    })
}

/// Told of every master switch the watcher sees.
pub(crate) trait Follower: Send + Sync {
    /// The sentinels now name `to`.
    fn follow(&self, to: &NamedMaster);
}

/// What a watcher is set up from.
#[derive(Debug, Clone)]
pub(crate) struct WatchConfig {
    /// One connection description per sentinel (TLS and credentials included).
    pub sentinels: Vec<ConnectionInfo>,
    /// The monitored master's name.
    pub master_name: String,
    /// Connect and reply timeout towards a sentinel.
    pub timeout: Duration,
}

/// The watcher's state, shared with its tasks.
struct State {
    master_name: String,
    tracker: Mutex<Tracker>,
    followers: Mutex<Vec<Weak<dyn Follower>>>,
    poke: Notify,
}

impl State {
    fn tell(&self, to: Option<NamedMaster>, source: &'static str) {
        let Some(to) = to else { return };
        info!(master = %self.master_name, host = %to.host, port = to.port, epoch = to.epoch, source,
            "the sentinels name a new Redis master: every connection moves to it");
        metrics::counter!("rsc_redis_master_switches_total", "master" => self.master_name.clone(), "source" => source)
            .increment(1);
        let followers: Vec<Arc<dyn Follower>> = {
            let mut list = self.followers.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|f| f.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for f in followers {
            f.follow(&to);
        }
    }
}

/// One process-wide watcher of a master (see the module docs); its tasks stop when the last
/// handle is dropped.
pub(crate) struct Watch {
    state: Arc<State>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

type Registry = Mutex<HashMap<String, Weak<Watch>>>;
static WATCHES: LazyLock<Registry> = LazyLock::new(Registry::default);

impl Watch {
    /// The watcher of `config`'s master, started (on the current Tokio runtime) when this
    /// process has none yet.
    pub(crate) fn shared(config: &WatchConfig) -> Arc<Watch> {
        let addrs: Vec<String> = config
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        let key = format!("{}@{}", config.master_name, addrs.join(","));
        let mut all = WATCHES.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, w| w.strong_count() > 0);
        if let Some(w) = all.get(&key).and_then(Weak::upgrade) {
            return w;
        }
        let w = Arc::new(Watch::start(config));
        all.insert(key, Arc::downgrade(&w));
        w
    }

    fn start(config: &WatchConfig) -> Watch {
        let state = Arc::new(State {
            master_name: config.master_name.clone(),
            tracker: Mutex::default(),
            followers: Mutex::default(),
            poke: Notify::new(),
        });
        let mut tasks: Vec<_> = config
            .sentinels
            .iter()
            .map(|s| {
                let sub = subscribe_loop(Arc::downgrade(&state), s.clone(), config.timeout);
                tokio::spawn(sub).abort_handle()
            })
            .collect();
        let poll = poll_loop(Arc::downgrade(&state), config.clone());
        tasks.push(tokio::spawn(poll).abort_handle());
        Watch { state, tasks }
    }

    /// The master the sentinels name, once known.
    pub(crate) fn current(&self) -> Option<NamedMaster> {
        let t = self.state.tracker.lock().unwrap_or_else(|p| p.into_inner());
        t.current().cloned()
    }

    /// Tells `f` of every switch from now on.
    pub(crate) fn follow(&self, f: Weak<dyn Follower>) {
        let mut list = self
            .state
            .followers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        list.push(f);
    }

    /// Asks the sentinels now (a connection found the master it was given a replica).
    pub(crate) fn poke(&self) {
        self.state.poke.notify_one();
    }
}

/// Keeps a `+switch-master` subscription open on one sentinel.
async fn subscribe_loop(state: Weak<State>, sentinel: ConnectionInfo, timeout: Duration) {
    use futures::StreamExt;
    let addr = sentinel.addr().to_string();
    let mut backoff = BACKOFF_MIN;
    let mut failures = 0u32;
    loop {
        let opened = async {
            let mut p = redis::Client::open(sentinel.clone())?
                .get_async_pubsub()
                .await?;
            p.subscribe(&[SWITCH_CHANNEL, PROMOTED_CHANNEL]).await?;
            Ok::<_, redis::RedisError>(p)
        };
        match tokio::time::timeout(timeout, opened).await {
            Ok(Ok(pubsub)) => {
                let Some(s) = state.upgrade() else { return };
                debug!(sentinel = %addr, "subscribed to the sentinel's +switch-master");
                backoff = BACKOFF_MIN;
                failures = 0;
                let gauge = metrics::gauge!("rsc_redis_sentinels_subscribed", "master" => s.master_name.clone());
                gauge.increment(1.0);
                // Events sent while no subscription listened are lost: ask now.
                s.poke.notify_one();
                drop(s);
                let mut messages = pubsub.into_on_message();
                while let Some(msg) = messages.next().await {
                    let Some(s) = state.upgrade() else { return };
                    let payload: String = msg.get_payload().unwrap_or_default();
                    let named = match msg.get_channel_name() {
                        PROMOTED_CHANNEL => parse_promoted(&payload, &s.master_name),
                        _ => parse_switch(&payload, &s.master_name),
                    };
                    if let Some((host, port)) = named {
                        let to = s
                            .tracker
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .switched(&host, port);
                        s.tell(to, "event");
                        s.poke.notify_one();
                    }
                }
                gauge.decrement(1.0);
            }
            Ok(Err(e)) => note_failure(&addr, &mut failures, &e),
            Err(_) => note_failure(&addr, &mut failures, &"timed out"),
        }
        if state.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn note_failure(addr: &str, failures: &mut u32, e: &dyn std::fmt::Display) {
    *failures += 1;
    if *failures == 1 || failures.is_multiple_of(60) {
        warn!(sentinel = %addr, error = %e, failures = *failures,
            "cannot subscribe to a sentinel's master switches; retrying (the other sentinels and the 1 s poll still tell)");
    }
}

/// Asks every sentinel for the master every [`POLL_INTERVAL`], and at once when poked.
async fn poll_loop(state: Weak<State>, config: WatchConfig) {
    let mut conns: Vec<Option<MultiplexedConnection>> = vec![None; config.sentinels.len()];
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let Some(s) = state.upgrade() else { return };
        tokio::select! {
            _ = tick.tick() => {}
            _ = s.poke.notified() => {}
        }
        let mut answers = Vec::new();
        for (i, info) in config.sentinels.iter().enumerate() {
            match ask(&mut conns[i], info, &config).await {
                Ok(Some(m)) => answers.push(m),
                Ok(None) => {}
                Err(e) => {
                    debug!(sentinel = %info.addr(), error = %e, "sentinel poll failed");
                    conns[i] = None;
                }
            }
        }
        let to = s
            .tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .polled(&answers);
        s.tell(to, "poll");
    }
}

/// `SENTINEL MASTER NAME`'s fields and `SENTINEL GET-MASTER-ADDR-BY-NAME`'s address.
type MasterReply = (HashMap<String, String>, Option<(String, u16)>);

/// One sentinel's answer to `SENTINEL MASTER NAME` (`None`: it does not know the name).
async fn ask(
    conn: &mut Option<MultiplexedConnection>,
    info: &ConnectionInfo,
    config: &WatchConfig,
) -> redis::RedisResult<Option<NamedMaster>> {
    if conn.is_none() {
        let c = redis::Client::open(info.clone())?
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.timeout))
                    .set_response_timeout(Some(config.timeout)),
            )
            .await?;
        *conn = Some(c);
    }
    let Some(c) = conn.as_mut() else {
        return Ok(None);
    };
    let mut pipe = redis::pipe();
    pipe.cmd("SENTINEL").arg("MASTER").arg(&config.master_name);
    pipe.cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(&config.master_name);
    let reply: redis::RedisResult<MasterReply> = pipe.query_async(c).await;
    match reply {
        Ok((fields, addr)) => Ok(parse_master(&fields, addr)),
        // "No such master with that name": a sentinel that does not monitor it (yet).
        Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(host: &str, port: u16, epoch: u64) -> NamedMaster {
        NamedMaster {
            host: host.into(),
            port,
            epoch,
        }
    }

    #[test]
    fn the_highest_epoch_wins_and_older_answers_never_move_back() {
        let mut t = Tracker::default();
        assert_eq!(t.polled(&[]), None);
        assert_eq!(t.polled(&[m("a", 1, 0)]), Some(m("a", 1, 0)));
        assert_eq!(t.polled(&[m("a", 1, 0), m("a", 1, 0)]), None);
        // One sentinel saw the failover, two not yet.
        let to = t.polled(&[m("a", 1, 0), m("b", 2, 3), m("a", 1, 0)]);
        assert_eq!(to, Some(m("b", 2, 3)));
        assert_eq!(t.polled(&[m("a", 1, 0)]), None, "a stale sentinel");
        assert_eq!(t.current(), Some(&m("b", 2, 3)));
        // A second failover right after the first.
        assert_eq!(t.polled(&[m("b", 2, 3), m("c", 3, 4)]), Some(m("c", 3, 4)));
    }

    #[test]
    fn an_event_moves_at_once_and_stale_polls_do_not_undo_it() {
        let mut t = Tracker::default();
        t.polled(&[m("a", 1, 5)]);
        assert_eq!(t.switched("b", 2), Some(m("b", 2, 6)));
        assert_eq!(
            t.switched("b", 2),
            None,
            "the same event from another sentinel"
        );
        assert_eq!(t.polled(&[m("a", 1, 5)]), None, "sentinels not updated yet");
        assert_eq!(
            t.polled(&[m("b", 2, 7)]),
            None,
            "confirmed, with its real epoch"
        );
        assert_eq!(t.current(), Some(&m("b", 2, 7)));
        assert_eq!(t.switched("c", 3), Some(m("c", 3, 8)));
        let mut fresh = Tracker::default();
        assert_eq!(fresh.switched("x", 9), Some(m("x", 9, 1)));
    }

    #[test]
    fn payloads_and_replies_parse() {
        assert_eq!(
            parse_switch("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster"),
            Some(("127.0.0.1".to_owned(), 6380))
        );
        assert_eq!(parse_switch("other 1 2 3 4", "mymaster"), None);
        assert_eq!(parse_switch("mymaster 1 2 3 x", "mymaster"), None);
        assert_eq!(parse_switch("mymaster", "mymaster"), None);
        let fields: HashMap<String, String> = [
            ("ip", "10.0.0.1"),
            ("port", "6379"),
            ("config-epoch", "4"),
            ("flags", "master"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into_iter()
        .collect();
        assert_eq!(parse_master(&fields, None), Some(m("10.0.0.1", 6379, 4)));
        let same = Some(("10.0.0.1".to_owned(), 6379));
        assert_eq!(parse_master(&fields, same), Some(m("10.0.0.1", 6379, 4)));
        let failing_over = Some(("10.0.0.2".to_owned(), 6380));
        assert_eq!(
            parse_master(&fields, failing_over),
            Some(m("10.0.0.2", 6380, 5)),
            "the promoted replica, at the failover's epoch"
        );
        assert_eq!(parse_master(&HashMap::new(), None), None);
        assert_eq!(
            parse_promoted(
                "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379",
                "mymaster"
            ),
            Some(("127.0.0.1".to_owned(), 6380))
        );
        assert_eq!(
            parse_promoted(
                "slave 127.0.0.1:6380 127.0.0.1 6380 @ other 127.0.0.1 6379",
                "mymaster"
            ),
            None
        );
    }
}
