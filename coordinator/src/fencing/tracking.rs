//! Owner keys known to hold their tokens, kept true by the data Redis itself
//! (server-assisted client-side caching, `CLIENT TRACKING`, Redis 6 and later; PROTOCOL §5.6,
//! docs/FENCING.md).
//!
//! The re-assertion's `MGET` goes through a connection of its own, in RESP3 with
//! `CLIENT TRACKING ON`: Redis then remembers every key that connection read and, when one
//! changes (written, deleted, expired, evicted, or the database flushed), pushes an
//! `invalidate` message on it. The keys read holding their token are kept in [`State`] until
//! such a message, or the loss of the connection, drops them; while all the owner keys of a
//! steady heartbeat's re-assertion are kept, it is answered without a round trip (any other
//! heartbeat reads). Nothing else is sent on the connection then, so a `PING` every
//! [`PING_EVERY`] makes sure it still carries the invalidations: one left unanswered drops
//! everything, as a closed connection does.
//!
//! Ordering: Redis writes an invalidation after the replies of the commands it read before,
//! and the connection hands replies and pushes on in that order; but a reply's reader may
//! record its keys after the push was handled. So a read is recorded only when no push was
//! handled since it was sent ([`State::record`]); otherwise it is simply not kept.
//!
//! A standalone Redis or a master named by Redis Sentinel only: a Redis Cluster's owner keys
//! are spread over nodes, and their reads keep going to Redis every time. Behind sentinels,
//! what was read from a master that was since switched is not used. When the connection
//! cannot be made or `CLIENT TRACKING` is refused (a Redis before 6, an ACL without
//! `client`), reads go through the shared connection, as before, and nothing is kept; the
//! connection is tried again after [`RETRY_AFTER`].

use rsc_redis::LazyRedis;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The name the tracking connection gives itself (`CLIENT SETNAME`), for operators.
pub const CONNECTION_NAME: &str = "rsc-coordinator-owner-tracking";

/// How long after a failed connection, or a refused `CLIENT TRACKING`, the next attempt waits.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Most keys kept; past it, the set starts over (each key is then read once more).
const MAX_KEYS: usize = 1 << 20;

/// How often the open tracking connection is checked with a `PING`. While every
/// re-assertion is answered from the tracked keys nothing else is sent on it, so a link that
/// went silent (a host gone without closing its sockets, a dropped route) would go unnoticed
/// with the invalidations it no longer carries: it is noticed within this plus the timeout.
const PING_EVERY: Duration = Duration::from_secs(1);

/// The tracked owner keys, and what they were read on. Pure: fed by the connection's pushes
/// and by the reads' answers.
#[derive(Debug, Default)]
pub(super) struct State {
    /// The number of the connection whose reads the keys come from (0: none yet).
    conn: u64,
    /// Whether that connection is still open.
    live: bool,
    /// Behind sentinels: the master look-up that connection was made to.
    master: u64,
    /// Pushes and losses handled so far: a read sent before one of them is not recorded.
    changes: u64,
    /// Owner key → the token it was read holding.
    tokens: HashMap<String, String>,
}

/// What a read was sent on, to record its answer against ([`State::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    conn: u64,
    changes: u64,
}

impl State {
    /// Connection `conn` (made to master look-up `master`) is open and tracking: nothing read
    /// before counts.
    pub(super) fn connected(&mut self, conn: u64, master: u64) {
        self.conn = conn;
        self.master = master;
        self.live = true;
        self.forget_all();
    }

    /// Connection `conn` is gone (closed, failed, or its master switched): nothing is known
    /// any more. A loss of an older connection changes nothing (`false`).
    pub(super) fn lost(&mut self, conn: u64) -> bool {
        let current = conn == self.conn;
        if current {
            self.live = false;
            self.forget_all();
        }
        current
    }

    fn forget_all(&mut self) {
        self.tokens.clear();
        self.changes += 1;
    }

    /// An `invalidate` push of connection `conn`: `keys` changed; `None`: the whole database
    /// was flushed.
    pub(super) fn invalidated(&mut self, conn: u64, keys: Option<&[Vec<u8>]>) {
        if conn != self.conn {
            return;
        }
        self.changes += 1;
        match keys {
            None => self.tokens.clear(),
            Some(keys) => {
                for k in keys {
                    if let Ok(k) = std::str::from_utf8(k) {
                        self.tokens.remove(k);
                    }
                }
            }
        }
    }

    /// The stamp of a read sent now on the open connection; `None` when there is none.
    pub(super) fn stamp(&self) -> Option<Stamp> {
        self.live.then_some(Stamp {
            conn: self.conn,
            changes: self.changes,
        })
    }

    /// Keeps the `(key, token)` pairs a read stamped `stamp` found in place, unless a push
    /// or a loss was handled since it was sent (it may have been about these keys).
    pub(super) fn record<'a>(
        &mut self,
        stamp: Stamp,
        found: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> bool {
        if self.stamp() != Some(stamp) {
            return false;
        }
        for (key, token) in found {
            if self.tokens.len() >= MAX_KEYS {
                self.tokens.clear();
            }
            self.tokens.insert(key.to_owned(), token.to_owned());
        }
        true
    }

    /// Whether every `(key, token)` pair is known in place on the open connection.
    pub(super) fn holds<'a>(&self, mut pairs: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
        self.live && pairs.all(|(key, token)| self.tokens.get(key).is_some_and(|t| t == token))
    }
}

/// The tracked owner keys of one data Redis (standalone or behind sentinels) and the
/// connection that keeps them.
pub(super) struct Tracking {
    redis: LazyRedis,
    timeout: Duration,
    state: Arc<Mutex<State>>,
    conn: tokio::sync::Mutex<Conn>,
}

/// The tracking connection, when open, and when to try again when not.
#[derive(Default)]
struct Conn {
    open: Option<(redis::aio::MultiplexedConnection, u64)>,
    made: u64,
    retry_at: Option<Instant>,
    /// The last attempt failed (said once, at warning level).
    failing: bool,
}

impl Tracking {
    /// Tracking for `redis` (not a cluster); nothing is connected yet.
    pub(super) fn new(redis: LazyRedis, timeout: Duration) -> Self {
        Tracking {
            redis,
            timeout,
            state: Arc::default(),
            conn: tokio::sync::Mutex::default(),
        }
    }

    /// The state, fail closed: a lock poisoned by a panic mid-update forgets everything.
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Behind sentinels: whether master look-up `master` is still the current one (a
    /// connection made from a switched one must not be believed).
    fn master_live(&self, master: u64) -> bool {
        self.redis.sentinel().is_none_or(|s| s.is_live(master))
    }

    /// Whether the tracking connection is open (and so may answer re-assertions).
    pub(super) fn live(&self) -> bool {
        let state = self.state();
        state.live && self.master_live(state.master)
    }

    /// Whether every `(key, token)` pair is known in place: the assertion needs no read.
    pub(super) fn holds<'a>(&self, pairs: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
        let held = {
            let state = self.state();
            self.master_live(state.master) && state.holds(pairs)
        };
        if held {
            crate::metrics::record_tracked_hit();
        }
        held
    }

    /// `MGET keys` on the tracking connection, with the stamp to record the answer against;
    /// `None` when there is no tracking connection (the caller reads elsewhere).
    pub(super) async fn read(&self, keys: &[&str]) -> Option<(Vec<Option<Vec<u8>>>, Stamp)> {
        let (mut conn, number) = self.connection().await?;
        let stamp = self.state().stamp().filter(|s| s.conn == number)?;
        let mut mget = redis::cmd("MGET");
        for k in keys {
            mget.arg(*k);
        }
        match tokio::time::timeout(self.timeout, mget.query_async(&mut conn)).await {
            Ok(Ok(values)) => Some((values, stamp)),
            Ok(Err(e)) => {
                warn!(error = %e, "owner-key tracking: read failed; reading without it");
                self.drop_connection(number).await;
                None
            }
            Err(_) => {
                warn!(timeout = ?self.timeout, "owner-key tracking: read timed out; reading without it");
                self.drop_connection(number).await;
                None
            }
        }
    }

    /// Keeps the pairs a read stamped `stamp` found in place ([`State::record`]).
    pub(super) fn record<'a>(
        &self,
        stamp: Stamp,
        found: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        self.state().record(stamp, found);
    }

    /// Waits until every push Redis sent before now was handled: a `PING` on the open
    /// tracking connection, whose reply comes after them (nothing when none is open; a
    /// failure counts the connection lost).
    pub(super) async fn sync(&self) {
        let open = self.conn.lock().await.open.clone();
        let Some((mut conn, number)) = open else {
            return;
        };
        if !answers(&mut conn, self.timeout).await {
            self.drop_connection(number).await;
        }
    }

    async fn drop_connection(&self, number: u64) {
        let mut c = self.conn.lock().await;
        if c.open.as_ref().is_some_and(|(_, n)| *n == number) {
            c.open = None;
        }
        lose(&self.state, number);
    }

    /// The open tracking connection and its number, opened when there is none (and the
    /// last attempt is [`RETRY_AFTER`] old); behind sentinels, one whose master was
    /// switched is replaced.
    async fn connection(&self) -> Option<(redis::aio::MultiplexedConnection, u64)> {
        let mut c = self.conn.lock().await;
        if let Some((conn, number)) = &c.open {
            let usable = {
                let state = self.state();
                state.live && state.conn == *number && self.master_live(state.master)
            };
            if usable {
                return Some((conn.clone(), *number));
            }
            let number = *number;
            c.open = None;
            lose(&self.state, number);
        }
        if c.retry_at.is_some_and(|at| Instant::now() < at) {
            return None;
        }
        c.made += 1;
        let number = c.made;
        match tokio::time::timeout(self.timeout, self.open(number)).await {
            Ok(Ok((conn, master))) => {
                lock(&self.state).connected(number, master);
                info!(
                    connection = number,
                    "owner-key tracking on: steady re-assertions are answered from the keys Redis tracks"
                );
                metrics::gauge!("rsc_fencing_token_tracking_connected").set(1.0);
                c.retry_at = None;
                c.failing = false;
                c.open = Some((conn.clone(), number));
                let state = Arc::clone(&self.state);
                tokio::spawn(keep_alive(state, conn.clone(), number, self.timeout));
                Some((conn, number))
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", self.timeout),
                };
                if c.failing {
                    debug!(%error, "owner-key tracking still unavailable");
                } else {
                    warn!(%error, retry_in = ?RETRY_AFTER, "owner-key tracking unavailable (needs RESP3, CLIENT TRACKING (Redis 6+) and the CLIENT command): owner keys are read on every re-assertion until it works");
                }
                c.failing = true;
                c.retry_at = Some(Instant::now() + RETRY_AFTER);
                None
            }
        }
    }

    /// Opens connection `number`: RESP3, named, tracking on, its pushes feeding the state.
    async fn open(
        &self,
        number: u64,
    ) -> redis::RedisResult<(redis::aio::MultiplexedConnection, u64)> {
        let (master, target) = match self.redis.sentinel() {
            Some(s) => s.master().await?,
            None => (0, self.redis.seeds()[0].clone()),
        };
        let settings = target.redis_settings().clone();
        let target =
            target.set_redis_settings(settings.set_protocol(redis::ProtocolVersion::RESP3));
        let state = Arc::clone(&self.state);
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(move |push: redis::PushInfo| {
                on_push(&state, number, push);
                Ok::<(), std::convert::Infallible>(())
            });
        let mut conn = redis::Client::open(target)?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let () = redis::pipe()
            .cmd("CLIENT")
            .arg("SETNAME")
            .arg(CONNECTION_NAME)
            .ignore()
            .cmd("CLIENT")
            .arg("TRACKING")
            .arg("ON")
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok((conn, master))
    }
}

/// Checks connection `number` every [`PING_EVERY`] while it is the one in use; one that does
/// not answer within `timeout` is counted lost (everything tracked on it is forgotten).
async fn keep_alive(
    state: Arc<Mutex<State>>,
    mut conn: redis::aio::MultiplexedConnection,
    number: u64,
    timeout: Duration,
) {
    loop {
        tokio::time::sleep(PING_EVERY).await;
        if lock(&state).stamp().is_none_or(|s| s.conn != number) {
            return;
        }
        if !answers(&mut conn, timeout).await {
            warn!(
                connection = number,
                "owner-key tracking: the connection did not answer a PING; what it tracked is forgotten"
            );
            lose(&state, number);
            return;
        }
    }
}

/// Whether `conn` answers a `PING` within `timeout` (its reply comes after every push Redis
/// wrote before it).
async fn answers(conn: &mut redis::aio::MultiplexedConnection, timeout: Duration) -> bool {
    let ping = redis::cmd("PING");
    let pong = tokio::time::timeout(timeout, ping.query_async::<redis::Value>(conn));
    matches!(pong.await, Ok(Ok(_)))
}

/// Counts connection `number` lost ([`State::lost`]); the gauge follows only the current one.
fn lose(state: &Mutex<State>, number: u64) {
    let current = lock(state).lost(number);
    if current {
        metrics::gauge!("rsc_fencing_token_tracking_connected").set(0.0);
    }
}

/// A push of connection `number`: an invalidation, or the library's word that the
/// connection closed.
fn on_push(state: &Mutex<State>, number: u64, push: redis::PushInfo) {
    match push.kind {
        redis::PushKind::Invalidate => {
            let keys = match push.data.first() {
                Some(redis::Value::Array(keys)) => Some(
                    keys.iter()
                        .filter_map(|k| match k {
                            redis::Value::BulkString(b) => Some(b.clone()),
                            _ => None,
                        })
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            };
            lock(state).invalidated(number, keys.as_deref());
            metrics::counter!("rsc_fencing_token_invalidations_total").increment(1);
        }
        redis::PushKind::Disconnection => lose(state, number),
        _ => {}
    }
}

/// Locks the state; a lock poisoned by a panic mid-update is taken over with everything
/// forgotten and the connection counted lost (so nothing is answered from it: fail closed).
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    match state.lock() {
        Ok(g) => g,
        Err(poisoned) => {
            let mut g = poisoned.into_inner();
            let conn = g.conn;
            let _ = g.lost(conn);
            state.clear_poison();
            g
        }
    }
}

#[cfg(test)]
mod tests;
