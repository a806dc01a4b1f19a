//! The driver of the shard worker: the read loop around the pure [`super::dispatch`] —
//! `XREADGROUP` (lease fencing) or the guarded transaction (strict fencing), the
//! acknowledgements given since in the same round trip, recovery after a lost reply, the
//! wait for new entries (the doorbell, or a blocked read on a connection of its own), the drained check and
//! the lag gauge. The calls in flight run on beside every read and wait.

use super::conn::{GUARD_TIMEOUT, WorkerConn};
use super::cursor::Next;
use super::{ShardWorker, entry_from};
use crate::consumer::backoff::Backoff;
use crate::consumer::fence::{self, Guard};
use crate::consumer::reply::OrderedRead;
use crate::message::Entry;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::{RedisError, Value};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How often, at most, the lag gauge of a shard that has entries is read from Redis (an idle
/// shard's lag is 0 and costs no command).
const LAG_EVERY: Duration = Duration::from_secs(5);

/// How long handled entries' acknowledgements wait for the next read (or the next call's end)
/// while the worker waits on calls in flight, before they are sent on their own.
const ACK_LINGER: Duration = Duration::from_millis(10);

/// What one read of the shard found.
enum Found {
    /// Strict fencing: Redis refused the owner token (the shard moved on).
    Fenced,
    /// Entries, now pending for this member.
    Entries(Vec<Entry>),
    /// Nothing. The stream's last entry id when the read learned it (always with strict
    /// fencing's guarded read; a non-blocking read when asked to); `None` otherwise (a
    /// blocked read has waited already).
    Idle(Option<String>),
}

/// What the next read asks for.
struct Plan {
    /// After which id: `>` (new entries), or this member's own pending entries after an id.
    from: String,
    /// At most this many entries.
    count: usize,
    /// A blocked read's `BLOCK` (only on a connection that may block).
    block_ms: u64,
}

/// Sleeps `d`, or forever.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

impl ShardWorker {
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

    /// Reads and handles entries until stopped: the driver of the worker's [`super::dispatch`].
    ///
    /// Each turn: takes the ends of calls, releases held entries whose parents are done,
    /// starts the calls the dispatch allows, then either waits (every lane busy, paused, the
    /// hold full: for a call to end), waits on the doorbell (the last read found nothing), or
    /// reads. Each read goes the way the shard is fenced at that moment: with an owner token
    /// (strict fencing) through the guarded transaction ([`fence::Guard`], non-blocking); without
    /// one (lease fencing) as a plain `XREADGROUP`; either way with the acknowledgements given
    /// since in the same round trip. On a Redis Cluster the read blocks instead of the
    /// doorbell's wait (`XREADGROUP … BLOCK`, or a plain `XREAD BLOCK … <last id>` under strict
    /// fencing). Calls in flight run on through every wait and read.
    pub(super) async fn read_until_stopped(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
    ) {
        // The WATCH of the owner key: a new one each time the group switches to strict
        // fencing.
        let mut guard: Option<Guard> = None;
        loop {
            if !self.turn().await {
                self.finish(conn).await;
                return;
            }
            let paused = *self.shared.paused.borrow();
            if paused || self.hold_is_full() || !self.dispatch.wants_read() {
                let poll = self.holds_entries().then_some(super::hold::HOLD_POLL);
                self.wait_calls_acking(conn, paused, poll).await;
                continue;
            }
            if let Some(after) = self.waiting_after.clone() {
                self.flush_acks(conn).await;
                self.wait_for_ring(conn, &after).await;
                continue;
            }
            let token = self.flags.token();
            if token.is_none() {
                guard = None;
            } else if guard.is_none() {
                guard = Some(Guard::new(&self.origin));
            }
            self.read_once(conn, backoff, guard.as_mut().zip(token.as_deref()))
                .await;
        }
    }

    /// One read with the acknowledgements waiting, and what follows from its reply.
    async fn read_once(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
        guarded: Option<(&mut Guard, &str)>,
    ) {
        let acks = self.dispatch.take_acks();
        let plan = Plan {
            from: self.read_from(),
            count: self
                .shared
                .listener
                .settings
                .batch_size
                .min(self.dispatch.room())
                .max(1),
            block_ms: self.block_ms(),
        };
        let stop = self.stop.clone();
        let mut calls = std::mem::take(&mut self.calls);
        let reply = calls
            .beside(async {
                tokio::select! {
                    r = self.fetch(conn, guarded, &acks, &plan) => Some(r),
                    // Entries this read may have fetched stay pending for the next owner.
                    _ = stop.cancelled() => None,
                }
            })
            .await;
        self.calls = calls;
        match reply {
            // Stopped: the acknowledgements are sent again to be sure (XACK is idempotent).
            None => self.dispatch.unsent(acks),
            Some(Ok(found)) => {
                self.dispatch.acked(&acks);
                backoff.reset();
                self.found(conn, backoff, found, &plan.from).await;
            }
            Some(Err(e)) => {
                // The acknowledgements may not have landed: send them on their own.
                self.dispatch.unsent(acks);
                self.flush_acks(conn).await;
                self.read_failed(conn, backoff, &e).await;
            }
        }
    }

    /// The start of each turn of the read loop: takes the ends of calls, stops the dispatch
    /// when the worker is stopped or the lease ran out, releases held entries, starts the
    /// calls that may start. `false` when stopping.
    async fn turn(&mut self) -> bool {
        for (call, verdicts) in self.calls.take_done() {
            self.dispatch.finished(call, &verdicts);
        }
        if self.stop.is_cancelled() || self.shared.lease_expired() {
            // Past the lease a worker starts nothing more: the rest stays pending for the
            // next owner.
            self.dispatch.stop();
        }
        if self.dispatch.is_stopping() {
            return false;
        }
        self.release_held().await;
        self.start_calls();
        true
    }

    /// Starts the calls the dispatch allows (none while the listener is paused). A call
    /// that ends at once is settled straight away, so its lane takes the next entry in the
    /// same turn, as one lane's call takes a read's worth.
    fn start_calls(&mut self) {
        if !*self.shared.paused.borrow() {
            while let Some(call) = self.dispatch.next_call() {
                if let Some((call, verdicts)) = self.calls.start(self.runner.clone().run(call)) {
                    self.dispatch.finished(call, &verdicts);
                }
            }
        }
        self.in_flight_gauge
            .set(self.dispatch.entries_in_flight() as f64);
        self.queued_gauge.set(self.dispatch.queued() as f64);
        self.skipped.increment(self.dispatch.take_skipped());
    }

    /// Stopping: waits for the calls in flight (a retry's wait is cut short by the stop; a
    /// handler running is not) unless the wait is cut short (a revocation past its deadline:
    /// those still running are dropped, their entries stay pending), then sends the
    /// acknowledgements of what they settled.
    async fn finish(&mut self, conn: &mut WorkerConn) {
        self.dispatch.stop();
        let cut = self.flags.cut_short.clone();
        tokio::select! {
            () = self.calls.all_done() => {}
            () = cut.cancelled() => {
                let dropped = self.calls.drop_running();
                warn!(calls = dropped, "revocation deadline: handler calls still running are \
                    dropped; their entries stay pending for the next owner");
            }
        }
        for (call, verdicts) in self.calls.take_done() {
            self.dispatch.finished(call, &verdicts);
        }
        self.flush_acks(conn).await;
        self.in_flight_gauge.set(0.0);
        self.queued_gauge.set(0.0);
    }

    /// Runs the calls until every entry given to the dispatch is settled (a takeover's
    /// claimed entries), then sends their acknowledgements. `false` when stopped.
    pub(super) async fn settle_all(&mut self, conn: &mut WorkerConn) -> bool {
        loop {
            if !self.turn().await {
                self.finish(conn).await;
                return false;
            }
            if self.dispatch.is_idle() {
                self.flush_acks(conn).await;
                return true;
            }
            let paused = *self.shared.paused.borrow();
            let poll = self.holds_entries().then_some(super::hold::HOLD_POLL);
            self.wait_calls_acking(conn, paused, poll).await;
        }
    }

    /// [`Self::wait_calls`], sending the acknowledgements waiting first when no call ends
    /// within [`ACK_LINGER`] (or at once while paused, or once a read's worth is waiting):
    /// while calls end quickly the acknowledgements ride with the next read, one `XACK` for
    /// many entries; a handled entry never stays pending for long behind a slow call.
    async fn wait_calls_acking(
        &mut self,
        conn: &mut WorkerConn,
        paused: bool,
        poll: Option<Duration>,
    ) {
        if self.dispatch.has_acks() {
            let many = self.dispatch.acks_waiting() >= self.shared.listener.settings.batch_size;
            if !paused && !many {
                let linger = poll.map_or(ACK_LINGER, |p| p.min(ACK_LINGER));
                if self.wait_calls(paused, Some(linger)).await {
                    return;
                }
            }
            self.flush_acks(conn).await;
        }
        self.wait_calls(paused, poll).await;
    }

    /// Waits for a call to end, the stop, a change of the pause from `paused`, or `poll`;
    /// `false` when `poll` ran out first.
    async fn wait_calls(&mut self, paused: bool, poll: Option<Duration>) -> bool {
        let mut pause = self.shared.paused.clone();
        if *pause.borrow_and_update() != paused {
            return true;
        }
        let stop = self.stop.clone();
        let woken = self
            .calls
            .race(async {
                tokio::select! {
                    _ = pause.changed() => true,
                    _ = stop.cancelled() => true,
                    _ = sleep_or_never(poll) => false,
                }
            })
            .await;
        woken.unwrap_or(true)
    }

    /// After a failed read: recreates a vanished consumer group; otherwise the reply
    /// (entries now pending for this member) may be lost, so this member's own pending
    /// entries are read first once the backoff is over.
    async fn read_failed(&mut self, conn: &mut WorkerConn, backoff: &mut Backoff, e: &RedisError) {
        let mut calls = std::mem::take(&mut self.calls);
        if e.code() == Some("NOGROUP") {
            warn!("the Redis consumer group is gone (Redis restarted?); recreating it");
            self.pending_from = None;
            calls.beside(self.ensure_group(conn, backoff)).await;
        } else {
            warn!(error = %e, "read failed; retrying");
            if self.pending_from.is_none() {
                self.pending_from = Some("0".to_owned());
            }
            calls.beside(self.pause_for(backoff.next_delay())).await;
        }
        self.calls = calls;
    }

    /// Acknowledges `acks`, then reads up to `plan.count` entries after `plan.from`: through
    /// the guard with its owner token under strict fencing, else `XREADGROUP` (blocking for
    /// new entries on a connection of its own, with the `XACK` pipelined first).
    async fn fetch(
        &self,
        conn: &mut WorkerConn,
        guarded: Option<(&mut Guard, &str)>,
        acks: &[String],
        plan: &Plan,
    ) -> Result<Found, RedisError> {
        if conn.master_left() {
            return Err(rsc_redis::sentinel::switched_error());
        }
        if let Some((guard, token)) = guarded {
            let (from, count) = (plan.from.as_str(), plan.count);
            let read = match conn {
                WorkerConn::Dedicated { node, armed_by } => {
                    guard
                        .read(node, armed_by, &self.origin, token, acks, from, count)
                        .await?
                }
                WorkerConn::Shared { guards, .. } => {
                    guards
                        .read(guard, &self.origin, token, acks, from, count, GUARD_TIMEOUT)
                        .await?
                }
            };
            return Ok(match read {
                fence::Read::Fenced => Found::Fenced,
                fence::Read::Entries(ids) => Found::Entries(
                    ids.into_iter()
                        .map(|s| entry_from(s.id, s.map, 1))
                        .collect(),
                ),
                fence::Read::Idle(last) => Found::Idle(Some(last)),
            });
        }
        self.lease_read(conn, acks, plan).await
    }

    /// Lease fencing's read: `XREADGROUP` (blocking on a connection of its own) with the
    /// `XACK` of `acks` pipelined first, and, before a non-blocking read when the position
    /// is unknown, `XREVRANGE … COUNT 1` (the stream's last id, for the doorbell).
    async fn lease_read(
        &self,
        conn: &mut WorkerConn,
        acks: &[String],
        plan: &Plan,
    ) -> Result<Found, RedisError> {
        let (from, count) = (plan.from.as_str(), plan.count);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.origin.group)
            .arg(&self.origin.member_id)
            .arg("COUNT")
            .arg(count);
        if from == ">" && conn.may_block() {
            cmd.arg("BLOCK").arg(plan.block_ms);
        }
        cmd.arg("STREAMS").arg(&self.origin.shard_key).arg(from);
        // The doorbell waits for entries after the stream's last one: read its id first, in
        // the same round trip (before the read, so that an entry added in between is read,
        // not waited for).
        let learn_last = from == ">" && !conn.may_block() && self.cursor.must_learn();
        let (reply, last) = if acks.is_empty() && !learn_last {
            (cmd.query_async::<Option<OrderedRead>>(conn).await?, None)
        } else {
            let mut pipe = redis::pipe();
            if !acks.is_empty() {
                pipe.cmd("XACK")
                    .arg(&self.origin.shard_key)
                    .arg(&self.origin.group)
                    .arg(acks)
                    .ignore();
            }
            if learn_last {
                pipe.cmd("XREVRANGE")
                    .arg(&self.origin.shard_key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1);
            }
            pipe.add_command(cmd);
            if learn_last {
                let (last, reply) = pipe
                    .query_async::<(StreamRangeReply, Option<OrderedRead>)>(conn)
                    .await?;
                let last = last
                    .ids
                    .first()
                    .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
                (reply, Some(last))
            } else {
                let (reply,) = pipe.query_async::<(Option<OrderedRead>,)>(conn).await?;
                (reply, None)
            }
        };
        let entries: Vec<Entry> = reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .map(|s| entry_from(s.id, s.map, 1))
            .collect();
        Ok(if entries.is_empty() {
            Found::Idle(last)
        } else {
            Found::Entries(entries)
        })
    }

    /// Acts on what a read after `from` found.
    async fn found(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
        found: Found,
        from: &str,
    ) {
        match found {
            Found::Fenced => {
                self.flags.refuse("read");
                self.dispatch.stop();
            }
            Found::Entries(entries) => {
                self.waiting_after = None;
                self.advance(entries.last().map(|e| e.id.as_str()));
                // New entries: the group has delivered up to the last one (the doorbell's poll
                // looks for entries after it). A re-read of pending entries says nothing.
                if from == ">"
                    && let Some(last) = entries.last()
                {
                    self.cursor.read_entries(&last.id);
                }
                self.flags.drained.store(false, Ordering::Relaxed);
                let entries = self.linger(conn, entries, from).await;
                let mut calls = std::mem::take(&mut self.calls);
                let ready = calls.beside(self.admit(entries)).await;
                self.calls = calls;
                match ready {
                    Some(ready) => {
                        self.dispatch.offer(ready.into_iter().map(Arc::new));
                    }
                    None => self.dispatch.stop(),
                }
                self.refresh_lag(conn).await;
            }
            // This member's own pending entries, re-read after a lost reply: none are left.
            Found::Idle(_) if from != ">" => self.advance(None),
            Found::Idle(last) => {
                // Nothing new was delivered: nothing is undelivered (no command needed).
                self.lag.set(0.0);
                if !conn.may_block() {
                    if let Next::WaitAfter(after) = self.cursor.read_nothing(last) {
                        self.waiting_after = Some(after);
                    }
                    return;
                }
                match last {
                    None => self.idle(conn).await,
                    Some(last) => self.wait_for_new(conn, backoff, &last).await,
                }
            }
        }
    }

    /// Waits on the doorbell until the shard may have new entries (a ring, or the poll found
    /// one after `after`), or, while entries are held for their parents, until the hold's
    /// next check is due; returns early, still waiting, when a call ends, the worker stops or
    /// the pause changes. A draining shard is checked each `block` of quiet (see
    /// [`ShardWorker::idle`]); an idle shard costs no command.
    async fn wait_for_ring(&mut self, conn: &mut WorkerConn, after: &str) {
        let Some(bell) = &self.bell else {
            self.waiting_after = None;
            return;
        };
        // Entries held for their parents (ordered resharding) are released between reads:
        // with some held, wait at most the hold's poll and read again.
        let held = self.holds_entries();
        let quiet = if held {
            super::hold::HOLD_POLL
        } else {
            self.shared.listener.settings.block
        };
        let mut pause = self.shared.paused.clone();
        if *pause.borrow_and_update() {
            return;
        }
        let stop = self.stop.clone();
        let woken = self
            .calls
            .race(async {
                tokio::select! {
                    woken = bell.wait(after) => Some(Some(woken)),
                    _ = tokio::time::sleep(quiet) => Some(None),
                    _ = stop.cancelled() => None,
                    _ = pause.changed() => None,
                }
            })
            .await;
        match woken.flatten() {
            Some(Some(woken)) => {
                self.cursor.woken(woken);
                self.waiting_after = None;
            }
            Some(None) if held => self.waiting_after = None,
            Some(None) => self.idle(conn).await,
            None => {}
        }
    }

    /// Strict fencing, nothing to read: a plain `XREAD BLOCK … <last id>`, which only wakes
    /// the worker (it delivers nothing to the group), so idle shards do not poll.
    async fn wait_for_new(&mut self, conn: &mut WorkerConn, backoff: &mut Backoff, last: &str) {
        let mut wake = redis::cmd("XREAD");
        wake.arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(self.block_ms())
            .arg("STREAMS")
            .arg(&self.origin.shard_key)
            .arg(last);
        let stop = self.stop.clone();
        let mut calls = std::mem::take(&mut self.calls);
        let woke = calls
            .beside(async {
                tokio::select! {
                    r = wake.query_async::<Value>(conn) => Some(r),
                    _ = stop.cancelled() => None,
                }
            })
            .await;
        match woke {
            // Nothing new for a whole block: as in lease mode, only then is a draining
            // shard with nothing pending called drained (a shard that is merely empty
            // between a stale producer's writes is not).
            Some(Ok(Value::Nil)) if calls.is_idle() => {
                calls.beside(self.idle(conn)).await;
            }
            Some(Err(e)) => {
                debug!(error = %e, "XREAD wake-up failed");
                calls.beside(self.pause_for(backoff.next_delay())).await;
            }
            _ => {}
        }
        self.calls = calls;
    }

    /// After a read found nothing: a draining shard with nothing pending is drained.
    async fn idle(&self, conn: &mut WorkerConn) {
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

    async fn refresh_lag(&mut self, conn: &mut WorkerConn) {
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
}
