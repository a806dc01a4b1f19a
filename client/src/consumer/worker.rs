//! The shard worker: reads one shard for one member until it is told to stop.
//!
//! Order of work on a shard it was just given: make sure the Redis consumer group exists
//! (`XGROUP CREATE … MKSTREAM`, `BUSYGROUP` is fine), take over every entry still pending in
//! the group (`XAUTOCLAIM` with min-idle 0, cursor loop until `0-0`; safe because the
//! coordinator gives a shard to one member at a time), then read new entries
//! (`XREADGROUP … BLOCK … STREAMS key >`) on its own connection, to the node that serves the
//! shard (see [`crate::data::NodeConn`]). After a failed read whose reply may have been lost
//! (a timeout, a dropped connection), the worker first reads its own pending entries again
//! (`XREADGROUP … STREAMS key 0`): entries Redis delivered into a lost reply are not left
//! pending until the next takeover.
//!
//! Entries are handled one at a time, in stream order, so the order of one key's messages is
//! kept within a shard. Through reshards (ordering `key`, issue 16), an entry whose key moved
//! to this shard at a routing-epoch switch is held aside, with its key's later entries, until
//! the group handled and acknowledged the key's old shard up to its seal (see
//! [`super::order`]); at most [`MAX_HELD`] entries are held, past which the worker stops
//! reading the shard until releases make room. A stop request (revocation, self-fence, shutdown) lets the handler in
//! flight finish; acknowledgements of what succeeded are sent; entries fetched but not started
//! stay pending for the next owner.

use super::MemberShared;
use super::backoff::{Backoff, retry_delay};
use super::fence;
use super::order::{Gate, HoldQueue, SealBook};
use super::reply::{OrderedClaim, OrderedRead};
use crate::data::NodeConn;
use crate::handler::{FailureAction, HandlerError};
use crate::listener::AckMode;
use crate::message::{Entry, Origin};
use futures::FutureExt;
use redis::streams::StreamInfoGroupsReply;
use redis::{RedisError, Value};
use rsc_protocol::StartPosition;
use rsc_protocol::entry as fields;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

mod batch;

/// How many pending entries one `XAUTOCLAIM` takes over.
const CLAIM_COUNT: usize = 100;
/// How often the shard's lag gauge is refreshed.
const LAG_EVERY: Duration = Duration::from_secs(5);
/// Ordered resharding: at most this many entries are held aside per shard; past it the
/// worker reads no more of the shard until held entries are released.
pub(crate) const MAX_HELD: usize = 10_000;
/// Ordered resharding: how often held keys' parents are checked (and the longest a read
/// blocks while entries are held). Polling: a wake-up when a parent reaches its seal (e.g.
/// through the coordinator's wake-up channel, once it is on main) would let this grow.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// Ordered resharding state of one shard worker (issue 16).
struct OrderState {
    /// This shard's seals.
    book: SealBook,
    /// Entries held until their key's parent reached its seal.
    hold: HoldQueue<Entry>,
    /// Seal ids of the parents waited for.
    parent_seals: HashMap<Gate, String>,
    /// When each gate first held an entry (for the hold-time histogram).
    held_since: HashMap<Gate, Instant>,
    /// When the parents were last checked.
    checked: Option<Instant>,
    progress: redis::Script,
    held_gauge: metrics::Gauge,
}

/// Flags the member and its worker share for one shard.
#[derive(Debug, Default)]
pub(crate) struct ShardFlags {
    /// The shard is beyond the stream's shard count: it is being drained (SPEC §6).
    pub(crate) draining: AtomicBool,
    /// The worker found the draining shard empty (nothing pending, nothing unread).
    pub(crate) drained: AtomicBool,
    /// Strict fencing: the owner token the coordinator gave for the shard (`None`: lease only).
    pub(crate) token: std::sync::Mutex<Option<String>>,
    /// Redis refused the token: the shard moved on; the worker stops and the member drops it.
    pub(crate) refused: AtomicBool,
    /// The worker's stop signal (cancelled on a refusal too).
    pub(crate) stop: CancellationToken,
}

impl ShardFlags {
    /// The owner token to present, with strict fencing.
    pub(crate) fn token(&self) -> Option<String> {
        self.token.lock().map_or(None, |t| t.clone())
    }

    /// Sets the owner token from a heartbeat answer.
    pub(crate) fn set_token(&self, token: Option<String>) {
        if let Ok(mut t) = self.token.lock() {
            *t = token;
        }
    }

    /// Redis refused the owner token: stop the worker; the member drops the shard.
    pub(crate) fn refuse(&self, op: &str) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            warn!(
                op,
                "owner token refused by Redis: the shard belongs to another member now; dropping it"
            );
        }
        self.stop.cancel();
    }
}

/// One shard worker.
pub(crate) struct ShardWorker {
    shared: Arc<MemberShared>,
    origin: Arc<Origin>,
    start: StartPosition,
    stop: CancellationToken,
    flags: Arc<ShardFlags>,
    lag: metrics::Gauge,
    lag_at: Option<Instant>,
    /// Entries handled (or dead-lettered) and not yet acknowledged.
    acks: Vec<String>,
    /// Read this member's own pending entries after this id before new ones (set after a
    /// read whose reply may have been lost).
    pending_from: Option<String>,
    /// Ordered resharding: held entries and seals.
    order: OrderState,
}

enum Outcome {
    /// The handler succeeded.
    Handled,
    /// Written to the dead-letter stream.
    DeadLettered,
    /// Stopped before the entry was finished: it stays pending.
    Abandoned,
}

impl ShardWorker {
    pub(crate) fn new(
        shared: Arc<MemberShared>,
        shard: u32,
        start: StartPosition,
        stop: CancellationToken,
        flags: Arc<ShardFlags>,
    ) -> Self {
        let origin = Arc::new(Origin {
            group: shared.group.clone(),
            stream: shared.stream.clone(),
            shard,
            shard_key: rsc_protocol::routing::shard_key(&shared.stream, shard),
            member_id: shared.member_id.clone(),
            ack_conn: Some(shared.ack_conn.clone()),
            fence: Some(flags.clone()),
        });
        let lag = super::WorkerMetrics::lag(&shared.group, &shared.stream, shard);
        let held_gauge = metrics::gauge!("rsc_client_order_held_entries",
            "group" => shared.group.clone(), "stream" => shared.stream.clone(),
            "shard" => shard.to_string());
        ShardWorker {
            shared,
            origin,
            start,
            stop,
            flags,
            lag,
            lag_at: None,
            acks: Vec::new(),
            pending_from: None,
            order: OrderState {
                book: SealBook::default(),
                hold: HoldQueue::default(),
                parent_seals: HashMap::new(),
                held_since: HashMap::new(),
                checked: None,
                progress: redis::Script::new(rsc_protocol::routing::SEAL_PROGRESS_LUA),
                held_gauge,
            },
        }
    }

    /// Runs until stopped; returns the shard index.
    pub(crate) async fn run(self) -> u32 {
        let shard = self.origin.shard;
        let span = info_span!("shard", group = %self.origin.group,
            member = %self.origin.member_id, shard, key = %self.origin.shard_key);
        self.work().instrument(span).await;
        shard
    }

    async fn work(mut self) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        // Every worker has its own connection: a blocked XREADGROUP would stall any command
        // queued behind it. The response timeout must exceed BLOCK (CRATES.md).
        let block = self.shared.listener.settings.block;
        let mut conn = self.shared.redis.dedicated(block + Duration::from_secs(5));
        info!("shard worker started");
        if !self.ensure_group(&mut conn, &mut backoff).await {
            return;
        }
        if !self.claim_pending(&mut conn, &mut backoff).await {
            return;
        }
        self.clean_consumers(&mut conn).await;
        loop {
            let switched = if self.flags.token().is_some() {
                self.read_guarded(&mut conn, &mut backoff).await
            } else {
                self.read_new(&mut conn, &mut backoff).await
            };
            if !switched {
                break;
            }
        }
        debug!("shard worker stopped");
    }

    /// Sleeps unless stopped first; `false` when stopped.
    async fn pause_for(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.stop.cancelled() => false,
        }
    }

    /// Waits while the listener is paused; `false` when stopped.
    async fn wait_unpaused(&self) -> bool {
        if !*self.shared.paused.borrow() {
            return !self.stop.is_cancelled();
        }
        let mut paused = self.shared.paused.clone();
        loop {
            if self.stop.is_cancelled() {
                return false;
            }
            if !*paused.borrow_and_update() {
                return true;
            }
            tokio::select! {
                changed = paused.changed() => if changed.is_err() { return !self.stop.is_cancelled() },
                _ = self.stop.cancelled() => return false,
            }
        }
    }

    /// `XGROUP CREATE <key> <group> <start> MKSTREAM`, retried until it works or the worker
    /// is stopped.
    async fn ensure_group(&self, conn: &mut NodeConn, backoff: &mut Backoff) -> bool {
        loop {
            if self.stop.is_cancelled() {
                return false;
            }
            let r: Result<(), RedisError> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&self.origin.shard_key)
                .arg(&self.origin.group)
                .arg(self.start.xgroup_id())
                .arg("MKSTREAM")
                .query_async(conn)
                .await;
            match r {
                Ok(()) => {
                    info!(
                        start = self.start.xgroup_id(),
                        "created the Redis consumer group"
                    );
                    backoff.reset();
                    return true;
                }
                Err(e) if e.code() == Some("BUSYGROUP") => {
                    backoff.reset();
                    return true;
                }
                Err(e) => {
                    warn!(error = %e, "XGROUP CREATE failed; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Takes over and handles every entry pending in the group on this shard. `false` when
    /// stopped.
    async fn claim_pending(&mut self, conn: &mut NodeConn, backoff: &mut Backoff) -> bool {
        let mut cursor = "0-0".to_owned();
        let mut claimed_total = 0usize;
        loop {
            if !self.wait_unpaused().await {
                return false;
            }
            let reply: Result<OrderedClaim, RedisError> = match self.flags.token() {
                Some(token) => {
                    match fence::claim(conn, &self.origin, &token, &cursor, CLAIM_COUNT).await {
                        Ok(Some(r)) => Ok(r),
                        Ok(None) => {
                            self.flags.refuse("claim");
                            return false;
                        }
                        Err(e) => Err(e),
                    }
                }
                None => {
                    redis::cmd("XAUTOCLAIM")
                        .arg(&self.origin.shard_key)
                        .arg(&self.origin.group)
                        .arg(&self.origin.member_id)
                        .arg(0)
                        .arg(&cursor)
                        .arg("COUNT")
                        .arg(CLAIM_COUNT)
                        .query_async(conn)
                        .await
                }
            };
            match reply {
                Ok(reply) => {
                    backoff.reset();
                    let ids: Vec<String> = reply.claimed.iter().map(|s| s.id.clone()).collect();
                    let counts = self.delivery_counts(conn, &ids).await;
                    let entries: Vec<Entry> = reply
                        .claimed
                        .into_iter()
                        .map(|s| {
                            let n = counts
                                .iter()
                                .find(|(id, _)| *id == s.id)
                                .map_or(1, |(_, n)| *n);
                            entry_from(s.id, s.map, n)
                        })
                        .collect();
                    claimed_total += entries.len();
                    if !entries.is_empty() && !self.handle_batch(conn, entries, true).await {
                        return false;
                    }
                    if reply.next_stream_id == "0-0" {
                        if claimed_total > 0 {
                            info!(claimed = claimed_total, "took over pending entries");
                        }
                        return true;
                    }
                    cursor = reply.next_stream_id;
                }
                Err(e) if e.code() == Some("NOGROUP") => {
                    // The group vanished (e.g. Redis restarted without persistence): nothing
                    // is pending any more.
                    return self.ensure_group(conn, backoff).await;
                }
                Err(e) => {
                    warn!(error = %e, "XAUTOCLAIM failed; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return false;
                    }
                }
            }
        }
    }

    /// After the takeover claim: deletes the shard's other consumers that hold no pending
    /// entry (departed members; see [`super::hygiene`]). A failure is only logged: the next
    /// takeover tries again.
    async fn clean_consumers(&self, conn: &mut NodeConn) {
        let o = &self.origin;
        match super::hygiene::clean_shard(conn, &o.shard_key, &o.group, &o.member_id).await {
            Ok(done) => {
                if !done.deleted.is_empty() {
                    info!(deleted = ?done.deleted, "deleted departed consumers of the shard");
                    metrics::counter!("rsc_client_consumers_deleted_total", "group" => o.group.clone())
                        .increment(done.deleted.len() as u64);
                }
                if !done.kept.is_empty() {
                    info!(kept = ?done.kept, "departed consumers still hold pending entries: kept for a later cleanup");
                }
            }
            Err(e) => debug!(error = %e, "could not clean up the shard's consumers"),
        }
    }

    /// Redis's delivery counts of entries this member now holds (after a claim).
    async fn delivery_counts(&self, conn: &mut NodeConn, ids: &[String]) -> Vec<(String, u64)> {
        let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
            return Vec::new();
        };
        let r: Result<redis::streams::StreamPendingCountReply, RedisError> = redis::cmd("XPENDING")
            .arg(&self.origin.shard_key)
            .arg(&self.origin.group)
            .arg(first)
            .arg(last)
            .arg(ids.len())
            .arg(&self.origin.member_id)
            .query_async(conn)
            .await;
        match r {
            Ok(r) => r
                .ids
                .into_iter()
                .map(|p| (p.id, p.times_delivered as u64))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The next read's id: `>` (new entries), or this member's own pending entries after
    /// an id while recovering from a lost reply.
    fn read_from(&self) -> String {
        self.pending_from.clone().unwrap_or_else(|| ">".to_owned())
    }

    /// After a successful read of `entries` (their last id): moves on through this member's
    /// own pending entries, or back to new ones when none are left.
    fn advance(&mut self, last: Option<&str>) {
        if self.pending_from.is_some() {
            match last {
                Some(id) => self.pending_from = Some(id.to_owned()),
                None => {
                    info!("re-read this member's pending entries after a lost reply");
                    self.pending_from = None;
                }
            }
        }
    }

    /// Before a read: acknowledges what was handled while the listener is paused, then waits
    /// until it is resumed; `false` when stopped.
    async fn ready_to_read(&mut self, conn: &mut NodeConn) -> bool {
        if *self.shared.paused.borrow() {
            self.flush_acks(conn).await;
        }
        if !self.wait_unpaused().await {
            self.flush_acks(conn).await;
            return false;
        }
        true
    }

    /// After a failed read: recreates a vanished consumer group; otherwise the reply
    /// (entries now pending for this member) may be lost, so this member's own pending
    /// entries are read first once the backoff is over. `false` when stopped.
    async fn read_failed(
        &mut self,
        conn: &mut NodeConn,
        backoff: &mut Backoff,
        e: &RedisError,
    ) -> bool {
        if e.code() == Some("NOGROUP") {
            warn!("the Redis consumer group is gone (Redis restarted?); recreating it");
            self.pending_from = None;
            return self.ensure_group(conn, backoff).await;
        }
        warn!(error = %e, "read failed; retrying");
        if self.pending_from.is_none() {
            self.pending_from = Some("0".to_owned());
        }
        self.pause_for(backoff.next_delay()).await
    }

    /// Reads and handles new entries until stopped.
    /// `true` when the group switched to strict fencing (continue with [`Self::read_guarded`]).
    async fn read_new(&mut self, conn: &mut NodeConn, backoff: &mut Backoff) -> bool {
        let count = self.shared.listener.settings.batch_size;
        loop {
            if self.flags.token().is_some() {
                // Switched to strict fencing: acknowledgements and reads go guarded from now.
                return true;
            }
            if !self.ready_to_read(conn).await || !self.make_room(conn).await {
                return false;
            }
            let block_ms = self.block_ms();
            let from = self.read_from();
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(&self.origin.group)
                .arg(&self.origin.member_id)
                .arg("COUNT")
                .arg(count);
            if from == ">" {
                cmd.arg("BLOCK").arg(block_ms);
            }
            cmd.arg("STREAMS").arg(&self.origin.shard_key).arg(&from);
            // The previous batch's acknowledgements travel in the same round trip as the next
            // read (XACK first, then XREADGROUP).
            let acks = std::mem::take(&mut self.acks);
            let read = async {
                if acks.is_empty() {
                    cmd.query_async::<Option<OrderedRead>>(conn).await
                } else {
                    let mut pipe = redis::pipe();
                    pipe.cmd("XACK")
                        .arg(&self.origin.shard_key)
                        .arg(&self.origin.group)
                        .arg(&acks)
                        .ignore();
                    pipe.add_command(cmd.clone());
                    pipe.query_async::<(Option<OrderedRead>,)>(conn)
                        .await
                        .map(|(r,)| r)
                }
            };
            let reply = tokio::select! {
                r = read => r,
                // Entries this read may have fetched stay pending for the next owner; the
                // acknowledgements are sent again to be sure (XACK is idempotent).
                _ = self.stop.cancelled() => {
                    self.acks = acks;
                    self.flush_acks(conn).await;
                    return false;
                }
            };
            if reply.is_err() {
                // The acknowledgements may not have landed: send them on their own.
                self.acks = acks;
                self.flush_acks(conn).await;
            }
            match reply {
                Ok(reply) => {
                    backoff.reset();
                    let entries: Vec<Entry> = reply
                        .into_iter()
                        .flat_map(|r| r.keys)
                        .flat_map(|k| k.ids)
                        .map(|s| entry_from(s.id, s.map, 1))
                        .collect();
                    self.advance(entries.last().map(|e| e.id.as_str()));
                    if entries.is_empty() {
                        if from == ">" {
                            self.idle(conn).await;
                        }
                    } else {
                        self.flags.drained.store(false, Ordering::Relaxed);
                        if !self.handle_batch(conn, entries, false).await {
                            return false;
                        }
                    }
                    self.refresh_lag(conn).await;
                }
                Err(e) => {
                    if !self.read_failed(conn, backoff, &e).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Strict fencing: reads and acknowledges through the guarded transaction
    /// ([`fence::Guard`], non-blocking, `COUNT n`); an idle shard waits on a plain
    /// `XREAD BLOCK … <last id>`, which only wakes it (it delivers nothing to the group), so
    /// idle shards do not poll.
    /// `true` when the group switched to lease fencing (continue with [`Self::read_new`]).
    async fn read_guarded(&mut self, conn: &mut NodeConn, backoff: &mut Backoff) -> bool {
        let count = self.shared.listener.settings.batch_size;
        let mut guard = fence::Guard::new(&self.origin);
        loop {
            if !self.ready_to_read(conn).await || !self.make_room(conn).await {
                return false;
            }
            let block_ms = self.block_ms();
            let Some(token) = self.flags.token() else {
                // Switched to lease fencing: no token to present any more.
                return true;
            };
            let acks = std::mem::take(&mut self.acks);
            let from = self.read_from();
            let reply = tokio::select! {
                r = guard.read(conn, &self.origin, &token, &acks, &from, count) => r,
                _ = self.stop.cancelled() => {
                    self.acks = acks;
                    self.flush_acks(conn).await;
                    return false;
                }
            };
            if reply.is_err() {
                // The acknowledgements may not have landed: send them on their own.
                self.acks = acks;
                self.flush_acks(conn).await;
            }
            match reply {
                Ok(fence::Read::Fenced) => {
                    self.flags.refuse("read");
                    return false;
                }
                Ok(fence::Read::Entries(ids)) => {
                    backoff.reset();
                    self.advance(ids.last().map(|e| e.id.as_str()));
                    let entries: Vec<Entry> = ids
                        .into_iter()
                        .map(|s| entry_from(s.id, s.map, 1))
                        .collect();
                    self.flags.drained.store(false, Ordering::Relaxed);
                    if !self.handle_batch(conn, entries, false).await {
                        return false;
                    }
                    self.refresh_lag(conn).await;
                }
                Ok(fence::Read::Idle(_)) if from != ">" => {
                    backoff.reset();
                    self.advance(None);
                }
                Ok(fence::Read::Idle(last)) => {
                    backoff.reset();
                    self.refresh_lag(conn).await;
                    let mut wake = redis::cmd("XREAD");
                    wake.arg("COUNT")
                        .arg(1)
                        .arg("BLOCK")
                        .arg(block_ms)
                        .arg("STREAMS")
                        .arg(&self.origin.shard_key)
                        .arg(&last);
                    tokio::select! {
                        r = wake.query_async::<Value>(conn) => match r {
                            // Nothing new for a whole block: as in lease mode, only then is a
                            // draining shard with nothing pending called drained (a shard
                            // that is merely empty between a stale producer's writes is not).
                            Ok(Value::Nil) => self.idle(conn).await,
                            Ok(_) => {}
                            Err(e) => {
                                debug!(error = %e, "XREAD wake-up failed");
                                if !self.pause_for(backoff.next_delay()).await {
                                    return false;
                                }
                            }
                        },
                        _ = self.stop.cancelled() => return false,
                    }
                }
                Err(e) => {
                    if !self.read_failed(conn, backoff, &e).await {
                        return false;
                    }
                }
            }
        }
    }

    /// After a read found nothing: a draining shard with nothing pending is drained.
    async fn idle(&self, conn: &mut NodeConn) {
        if !self.flags.draining.load(Ordering::Relaxed) {
            return;
        }
        let pending: Result<redis::streams::StreamPendingReply, RedisError> =
            redis::cmd("XPENDING")
                .arg(&self.origin.shard_key)
                .arg(&self.origin.group)
                .query_async(conn)
                .await;
        if let Ok(p) = pending
            && p.count() == 0
            && !self.flags.drained.swap(true, Ordering::Relaxed)
        {
            info!("draining shard is empty");
        }
    }

    async fn refresh_lag(&mut self, conn: &mut NodeConn) {
        if self.lag_at.is_some_and(|t| t.elapsed() < LAG_EVERY) {
            return;
        }
        self.lag_at = Some(Instant::now());
        let info: Result<StreamInfoGroupsReply, RedisError> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.origin.shard_key)
            .query_async(conn)
            .await;
        if let Ok(info) = info
            && let Some(g) = info.groups.iter().find(|g| g.name == self.origin.group)
            && let Some(lag) = g.lag
        {
            self.lag.set(lag as f64);
        }
    }

    /// Handles entries in order. `false` when stopped before the end of the batch.
    ///
    /// Acknowledgements are sent in one `XACK` per batch: at the end when `flush` is set (or
    /// when stopped), otherwise with the next read; and early before anything that may wait
    /// (a pause, a retry delay), so that a handled entry is not left pending for long.
    /// How long a read blocks: the listener's setting, or [`HOLD_POLL`] while entries are
    /// held (their parents are checked between reads).
    fn block_ms(&self) -> u64 {
        let block = self.shared.listener.settings.block;
        let block = if self.order.hold.is_empty() {
            block
        } else {
            block.min(HOLD_POLL)
        };
        block.as_millis().max(1) as u64
    }

    /// Before a read: releases held entries whose parents reached their seals; while
    /// [`MAX_HELD`] entries are held, reads nothing more and waits for releases. `false`
    /// when stopped.
    async fn make_room(&mut self, conn: &mut NodeConn) -> bool {
        loop {
            if !self.release_held(conn).await {
                return false;
            }
            if self.order.hold.len() < MAX_HELD {
                return true;
            }
            if !self.pause_for(HOLD_POLL).await {
                return false;
            }
        }
    }

    /// Ordering `key`: sorts a batch read in stream order into entries to handle now and
    /// entries held for their key's parent. Reads this shard's seals again first when an
    /// entry with a key lies past every known seal (a switch may have happened since).
    /// `None` when stopped.
    async fn admit(&mut self, entries: Vec<Entry>) -> Option<Vec<Entry>> {
        if !self.shared.ordered.load(Ordering::Relaxed) {
            return Some(entries);
        }
        let stale = entries
            .iter()
            .any(|e| e.key.is_some() && !self.order.book.covers(&e.id));
        if stale {
            let key = rsc_protocol::routing::seals_key(&self.origin.shard_key);
            let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
            loop {
                let mut c = self.shared.ack_conn.clone();
                let r: Result<Vec<(String, String)>, RedisError> =
                    redis::cmd("HGETALL").arg(&key).query_async(&mut c).await;
                match r {
                    Ok(fields) => {
                        self.order.book = SealBook::from_hash(fields);
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, "could not read the shard's seals; retrying");
                        if !self.pause_for(backoff.next_delay()).await {
                            return None;
                        }
                    }
                }
            }
        }
        if self.order.book.is_empty() && self.order.hold.is_empty() {
            return Some(entries);
        }
        let shard = self.origin.shard;
        let mut ready = Vec::with_capacity(entries.len());
        for entry in entries {
            let gate = entry
                .key
                .as_deref()
                .and_then(|k| self.order.book.gate_for(shard, &entry.id, k.as_bytes()));
            let id = entry.id.clone();
            let key = entry.key.clone();
            if let Some(g) = gate.filter(|g| !self.order.hold.is_released(g)) {
                self.order.held_since.entry(g).or_insert_with(Instant::now);
            }
            if let Some(e) = self.order.hold.admit(&id, key.as_deref(), gate, entry) {
                ready.push(e);
            }
        }
        self.order.held_gauge.set(self.order.hold.len() as f64);
        Some(ready)
    }

    /// Checks the parents the held keys wait for (at most every [`HOLD_POLL`]) and handles
    /// the entries of those that reached their seals. `false` when stopped.
    async fn release_held(&mut self, conn: &mut NodeConn) -> bool {
        loop {
            if self.order.hold.is_empty() {
                return true;
            }
            if self.order.checked.is_some_and(|t| t.elapsed() < HOLD_POLL) {
                return true;
            }
            self.order.checked = Some(Instant::now());
            let ordered = self.shared.ordered.load(Ordering::Relaxed);
            let mut freed = Vec::new();
            for gate in self.order.hold.waiting_for() {
                if ordered && !self.parent_reached_seal(gate).await {
                    continue;
                }
                if let Some(t) = self.order.held_since.remove(&gate) {
                    metrics::histogram!("rsc_client_order_hold_seconds",
                        "group" => self.origin.group.clone(), "stream" => self.origin.stream.clone())
                    .record(t.elapsed().as_secs_f64());
                    info!(
                        parent = gate.parent,
                        routing_epoch = gate.epoch,
                        held_ms = t.elapsed().as_millis() as u64,
                        "parent shard reached its seal: releasing its moved keys"
                    );
                }
                freed.extend(self.order.hold.release(gate));
            }
            self.order.held_gauge.set(self.order.hold.len() as f64);
            if freed.is_empty() {
                return true;
            }
            self.order.checked = None;
            if !self.run_entries(conn, freed).await {
                return false;
            }
            // The acknowledgements of released entries may open gates of other shards.
            self.flush_acks(conn).await;
        }
    }

    /// Whether the group handled and acknowledged every entry of `gate.parent` up to its
    /// seal of the switch to `gate.epoch` (exact: the group's last-delivered id and pending
    /// entries list on the parent, one script call). Errors count as "not yet".
    async fn parent_reached_seal(&mut self, gate: Gate) -> bool {
        let parent_key = rsc_protocol::routing::shard_key(&self.origin.stream, gate.parent);
        let mut c = self.shared.ack_conn.clone();
        let seal = match self.order.parent_seals.get(&gate) {
            Some(s) => s.clone(),
            None => {
                let v: Result<Option<String>, RedisError> = redis::cmd("HGET")
                    .arg(rsc_protocol::routing::seals_key(&parent_key))
                    .arg(gate.epoch)
                    .query_async(&mut c)
                    .await;
                match v
                    .ok()
                    .flatten()
                    .as_deref()
                    .and_then(rsc_protocol::routing::Seal::parse)
                {
                    Some(seal) => {
                        self.order.parent_seals.insert(gate, seal.id.clone());
                        seal.id
                    }
                    None => return false,
                }
            }
        };
        let mut call = self.order.progress.key(&parent_key);
        call.arg(&self.origin.group).arg(&seal).arg(1);
        match call.invoke_async::<(i64, i64)>(&mut c).await {
            Ok((undelivered, pending)) => undelivered == 0 && pending == 0,
            Err(e) => {
                debug!(error = %e, parent = gate.parent, "parent progress check failed");
                false
            }
        }
    }

    async fn handle_batch(
        &mut self,
        conn: &mut NodeConn,
        entries: Vec<Entry>,
        flush: bool,
    ) -> bool {
        let Some(entries) = self.admit(entries).await else {
            return false;
        };
        if !self.shared.ordered.load(Ordering::Relaxed)
            && let crate::listener::HandlerKind::Batch(h) = &self.shared.listener.handler
        {
            // Ordering none: batches may linger for company (reads past `admit`).
            let h = h.clone();
            return self.handle_batches(conn, entries, flush, h).await;
        }
        let mut complete = self.run_entries(conn, entries).await;
        if complete {
            self.order.checked = None;
            complete = self.release_held(conn).await;
        }
        if flush || !complete {
            self.flush_acks(conn).await;
        }
        complete
    }

    /// Handles entries in order; `false` when stopped before the end (the rest stays
    /// pending for the next owner). A batch listener gets them as batches, without
    /// lingering (an entry read while lingering would bypass the ordering check).
    async fn run_entries(&mut self, conn: &mut NodeConn, entries: Vec<Entry>) -> bool {
        if let crate::listener::HandlerKind::Batch(h) = &self.shared.listener.handler {
            let h = h.clone();
            return self.handle_batches(conn, entries, true, h).await;
        }
        let auto = self.shared.listener.settings.ack_mode == AckMode::Auto;
        let mut complete = true;
        for entry in entries {
            if *self.shared.paused.borrow() {
                self.flush_acks(conn).await;
            }
            if !self.wait_unpaused().await || self.shared.lease_expired() {
                // Stopped, or the lease ran out: the rest stays pending for the next owner.
                complete = false;
                break;
            }
            let entry = Arc::new(entry);
            match self.process(conn, &entry).await {
                Outcome::Handled => {
                    if auto {
                        self.acks.push(entry.id.clone());
                    }
                }
                Outcome::DeadLettered => self.acks.push(entry.id.clone()),
                Outcome::Abandoned => {
                    complete = false;
                    break;
                }
            }
        }
        complete
    }

    async fn flush_acks(&mut self, conn: &mut NodeConn) {
        let ids = std::mem::take(&mut self.acks);
        self.ack(conn, &ids).await;
    }

    /// `XACK` of handled entries, retried a few times even when stopping (the handlers ran:
    /// an acknowledgement lost here means the entry is handled again by the next owner).
    async fn ack(&self, conn: &mut NodeConn, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        for attempt in 1..=5 {
            let r: Result<i64, RedisError> = match self.flags.token() {
                Some(token) => fence::ack(conn, &self.origin, &token, ids)
                    .await
                    .map(|ok| if ok { 0 } else { -1 }),
                None => {
                    redis::cmd("XACK")
                        .arg(&self.origin.shard_key)
                        .arg(&self.origin.group)
                        .arg(ids)
                        .query_async(conn)
                        .await
                }
            };
            match r {
                Ok(-1) => {
                    self.flags.refuse("ack");
                    return;
                }
                Ok(_) => return,
                Err(e) if e.code() == Some("NOGROUP") => return,
                Err(e) => {
                    warn!(error = %e, attempt, entries = ids.len(), "XACK failed");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
        warn!(
            entries = ids.len(),
            "giving up acknowledging: these entries will be handled again"
        );
    }

    /// Runs the handler with retries; dead-letters when retries are exhausted or the handler
    /// asks for it.
    async fn process(&mut self, conn: &mut NodeConn, entry: &Arc<Entry>) -> Outcome {
        let shared = self.shared.clone();
        let settings = &shared.listener.settings;
        let m = &shared.metrics;
        let mut attempt = 1u32;
        loop {
            let span = info_span!("message", entry_id = %entry.id, attempt);
            crate::otel::continue_trace(&span, entry);
            let started = Instant::now();
            let call =
                self.shared
                    .listener
                    .handler
                    .call(entry.clone(), self.origin.clone(), attempt);
            let result = AssertUnwindSafe(call).catch_unwind().instrument(span).await;
            m.duration.record(started.elapsed().as_secs_f64());
            let err = match result {
                Ok(Ok(())) => {
                    m.handled.increment(1);
                    return Outcome::Handled;
                }
                Ok(Err(e)) => e,
                Err(panic) => HandlerError::retry(format!(
                    "handler panicked: {}",
                    super::member::panic_text(panic.as_ref())
                )),
            };
            m.failed.increment(1);
            let dead = err.action() == FailureAction::DeadLetter || attempt > settings.max_retries;
            if dead {
                return self.dead_letter(entry, &err, attempt).await;
            }
            let delay = match err.action() {
                FailureAction::RetryAfter(d) => d,
                _ => retry_delay(attempt, settings.retry_min, settings.retry_max),
            };
            debug!(entry_id = %entry.id, attempt, error = %err, ?delay, "handler failed; will retry");
            m.retried.increment(1);
            self.flush_acks(conn).await;
            if !self.pause_for(delay).await {
                return Outcome::Abandoned;
            }
            attempt += 1;
        }
    }

    /// Copies the entry to `<stream>:dlq` with `error`, `origin` (shard key), `origin_id`,
    /// `group`, `member`, `attempts` and `failed_ms`. Retried until written or stopped.
    async fn dead_letter(&self, entry: &Entry, err: &HandlerError, attempts: u32) -> Outcome {
        let dlq = rsc_protocol::routing::dlq_key(&self.origin.stream);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&dlq).arg("*");
        for (name, value) in &entry.fields {
            if !fields::DEAD_LETTER_FIELDS.contains(&name.as_str()) {
                cmd.arg(name).arg(value);
            }
        }
        cmd.arg(fields::ERROR)
            .arg(err.to_string())
            .arg(fields::ORIGIN)
            .arg(&self.origin.shard_key)
            .arg(fields::ORIGIN_ID)
            .arg(&entry.id)
            .arg(fields::GROUP)
            .arg(&self.origin.group)
            .arg(fields::MEMBER)
            .arg(&self.origin.member_id)
            .arg(fields::ATTEMPTS)
            .arg(attempts)
            .arg(fields::FAILED_MS)
            .arg(now_ms);
        // On the shared connection: on a cluster the dead-letter stream lives in another slot.
        let mut conn = self.shared.ack_conn.clone();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let r: Result<String, RedisError> = cmd.query_async(&mut conn).await;
            match r {
                Ok(_) => {
                    self.shared.metrics.dead_lettered.increment(1);
                    warn!(entry_id = %entry.id, attempts, error = %err, dlq = %dlq, "dead-lettered");
                    return Outcome::DeadLettered;
                }
                Err(e) => {
                    warn!(error = %e, "cannot write the dead letter; retrying");
                    if !self.pause_for(backoff.next_delay()).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }
}

/// An entry as read, fields in Redis's order. A value that is not a string (Redis stream
/// values always are; anything else means a broken reply or proxy) makes the entry malformed:
/// it is dead-lettered with the reason rather than handled with an empty value.
fn entry_from(id: String, map: Vec<(String, Value)>, delivery_count: u64) -> Entry {
    let mut malformed = None;
    let fields = map
        .into_iter()
        .map(|(k, v)| {
            let bytes = match v {
                Value::BulkString(b) => b,
                Value::SimpleString(s) => s.into_bytes(),
                other => {
                    malformed.get_or_insert_with(|| {
                        format!("field {k:?} is not a string but {other:?}")
                    });
                    Vec::new()
                }
            };
            (k, bytes)
        })
        .collect();
    let mut entry = Entry::new(id, fields, delivery_count);
    entry.malformed = malformed;
    entry
}
