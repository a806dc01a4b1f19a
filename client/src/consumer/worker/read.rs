//! The driver of the shard worker: asks the pure [`super::machine`] for the next step, does
//! the Redis I/O or the wait it names, and gives back what happened. Every decision (what to
//! read from, when to acknowledge, wait, retry, recover, stop) is the machine's; this module
//! only talks to Redis, the doorbell, the clock and the handler calls, which run on beside
//! every command and wait.
//!
//! Reads: with an owner token (strict fencing) through the guarded transaction
//! ([`fence::Guard`], non-blocking); without one (lease fencing) as a plain `XREADGROUP`;
//! either way with the acknowledgements given since in the same round trip.

use super::conn::{GUARD_TIMEOUT, WorkerConn};
use super::machine::{Ctx, Event, ReadPlan, Step};
use super::{ShardWorker, entry_from};
use crate::consumer::fence::{self, Guard, ReadAsk, Seals};
use crate::consumer::reply::OrderedRead;
use crate::message::Entry;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::{RedisError, Value};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// What one read of the shard found.
enum Found {
    /// Strict fencing: Redis refused the owner token (the shard moved on).
    Fenced,
    /// Entries, now pending for this member, and the shard's seals read right after them
    /// when the group orders by key (PROTOCOL §15).
    Entries(Vec<Entry>, Option<Seals>),
    /// Nothing; the stream's last entry id when the read learned it.
    Idle(Option<String>),
}

/// The next reply of a pipeline sent with `ignore_errors`, converted: a server's error reply
/// is that error, with its code (e.g. `NOGROUP`, which makes the worker create the group
/// again); a missing reply is a protocol error.
fn next_reply<T: redis::FromRedisValue>(
    values: &mut impl Iterator<Item = Value>,
) -> Result<T, RedisError> {
    match values.next() {
        Some(Value::ServerError(e)) => Err(e.into()),
        Some(v) => Ok(redis::from_redis_value(v)?),
        None => Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a reply is missing",
        ))),
    }
}

/// Sleeps until `t`, or forever.
async fn sleep_until_or_never(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl ShardWorker {
    /// Runs the machine until it is done: the worker's whole life on the shard, from the
    /// takeover to the last acknowledgement.
    pub(super) async fn drive(&mut self, conn: &mut WorkerConn) {
        // The WATCH of the owner key: a new one each time the group switches to strict
        // fencing.
        let mut guard: Option<Guard> = None;
        let mut pause = self.shared.paused.clone();
        loop {
            let now = Instant::now();
            let ctx = self.observe(&mut pause, now);
            let step = self.machine.next(now, ctx);
            let event = match step {
                Step::Done => break,
                Step::Start(call) => self
                    .calls
                    .start(self.runner.clone().run(call))
                    .map(|(call, verdicts)| Event::CallEnded(call, verdicts)),
                Step::CreateGroup => Some(self.beside(Self::create_group, conn).await),
                Step::Claim { cursor } => self.claim_page(conn, &cursor).await,
                Step::Clean => {
                    self.beside(Self::clean_consumers, conn).await;
                    Some(Event::Cleaned)
                }
                Step::CheckHolds => {
                    let mut calls = std::mem::take(&mut self.calls);
                    let released = calls.beside(self.check_holds()).await;
                    self.calls = calls;
                    Some(released)
                }
                Step::Ack(ids) => {
                    self.beside(async |w, conn| w.ack(conn, &ids).await, conn)
                        .await;
                    Some(Event::Acked(ids))
                }
                Step::Read(plan) => {
                    let token = self.flags.token();
                    if token.is_none() {
                        guard = None;
                    } else if guard.is_none() {
                        guard = Some(Guard::new(&self.origin));
                    }
                    let guarded = guard.as_mut().zip(token.as_deref());
                    Some(self.read_once(conn, guarded, plan).await)
                }
                Step::ReadLag => {
                    self.beside(Self::refresh_lag, conn).await;
                    None
                }
                Step::CheckDrained => {
                    self.beside(Self::check_drained, conn).await;
                    None
                }
                Step::WaitNew { after, block } => self.wait_for_new(conn, &after, block).await,
                Step::Wait { until, ring } => self.wait(&mut pause, until, ring).await,
                Step::DrainCalls => {
                    self.drain_calls().await;
                    Some(Event::CallsSettled)
                }
            };
            if let Some(event) = event {
                self.machine.on(event, Instant::now());
            }
            self.set_gauges();
        }
        self.in_flight_gauge.set(0.0);
        self.queued_gauge.set(0.0);
    }

    /// Gives the machine what changed outside it since the last step (the pause, the stop or
    /// the lease running out, the calls that ended) and what the next step depends on.
    fn observe(&mut self, pause: &mut tokio::sync::watch::Receiver<bool>, now: Instant) -> Ctx {
        self.machine
            .on(Event::Paused(*pause.borrow_and_update()), now);
        if self.stop.is_cancelled() || self.shared.lease_expired() {
            // Past the lease a worker starts nothing more: the rest stays pending for the
            // next owner.
            self.machine.on(Event::Stop, now);
        }
        for (call, verdicts) in self.calls.take_done() {
            self.machine.on(Event::CallEnded(call, verdicts), now);
        }
        Ctx {
            guarded: self.flags.has_token(),
            ordered: self.shared.ordered.load(Ordering::Relaxed),
            draining: self.flags.draining.load(Ordering::Relaxed),
        }
    }

    /// The gauges of the calls in flight and the queue, and the redrive skip counter.
    fn set_gauges(&mut self) {
        self.in_flight_gauge
            .set(self.machine.entries_in_flight() as f64);
        self.queued_gauge.set(self.machine.queued() as f64);
        self.skipped.increment(self.machine.take_skipped());
    }

    /// Runs one command of the worker's (`f(self, conn)`) while the calls go on.
    async fn beside<'a, F, T>(&'a mut self, f: F, conn: &'a mut WorkerConn) -> T
    where
        F: AsyncFnOnce(&ShardWorker, &mut WorkerConn) -> T,
    {
        let mut calls = std::mem::take(&mut self.calls);
        let out = calls.beside(f(self, conn)).await;
        self.calls = calls;
        out
    }

    /// [`Step::Wait`]: a call's end, the stop, a change of the pause, a ring after `ring`,
    /// or `until`.
    async fn wait(
        &mut self,
        pause: &mut tokio::sync::watch::Receiver<bool>,
        until: Option<Instant>,
        ring: Option<String>,
    ) -> Option<Event<Arc<Entry>>> {
        let stop = self.stop.clone();
        let bell = self.bell.as_ref().zip(ring.as_deref());
        let woken = self
            .calls
            .race(async {
                tokio::select! {
                    woken = async {
                        match bell {
                            Some((bell, after)) => bell.wait(after).await,
                            None => std::future::pending().await,
                        }
                    } => Some(woken),
                    () = sleep_until_or_never(until) => None,
                    _ = stop.cancelled() => None,
                    _ = pause.changed() => None,
                }
            })
            .await;
        woken.flatten().map(Event::Woken)
    }

    /// [`Step::DrainCalls`]: waits for the calls in flight (a retry's wait is cut short by
    /// the stop; a handler running is not) unless the wait is cut short (a revocation past
    /// its deadline, PROTOCOL §5.3: those still running are dropped, their entries stay
    /// pending), and gives back the ends of those that ended.
    async fn drain_calls(&mut self) {
        let cut = self.flags.cut_short.clone();
        tokio::select! {
            () = self.calls.all_done() => {}
            () = cut.cancelled() => {
                let dropped = self.calls.drop_running();
                warn!(calls = dropped, "revocation deadline: handler calls still running are \
                    dropped; their entries stay pending for the next owner");
            }
        }
        let now = Instant::now();
        for (call, verdicts) in self.calls.take_done() {
            self.machine.on(Event::CallEnded(call, verdicts), now);
        }
    }

    /// [`Step::Read`]: the read, with the acknowledgements of the plan, while the calls go
    /// on; then what it found, admitted through the hold (ordered resharding).
    async fn read_once(
        &mut self,
        conn: &mut WorkerConn,
        guarded: Option<(&mut Guard, &str)>,
        plan: ReadPlan,
    ) -> Event<Arc<Entry>> {
        let stop = self.stop.clone();
        let mut calls = std::mem::take(&mut self.calls);
        let reply = calls
            .beside(async {
                tokio::select! {
                    r = self.fetch(conn, guarded, &plan) => Some(r),
                    // Entries this read may have fetched stay pending for the next owner.
                    _ = stop.cancelled() => None,
                }
            })
            .await;
        let event = match reply {
            None => Event::ReadCut,
            Some(Ok(Found::Fenced)) => {
                self.flags.refuse("read");
                Event::Fenced
            }
            Some(Ok(Found::Entries(entries, seals))) => {
                self.flags.drained.store(false, Ordering::Relaxed);
                let last = entries.last().map(|e| e.id.clone()).unwrap_or_default();
                match calls.beside(self.admit(entries, seals)).await {
                    Some(ready) => Event::ReadEntries {
                        ready: ready.into_iter().map(Arc::new).collect(),
                        last,
                        held: self.held(),
                    },
                    // Stopped while reading the seals: the entries stay pending.
                    None => Event::ReadCut,
                }
            }
            Some(Ok(Found::Idle(learned))) => {
                if plan.from == ">" {
                    // Nothing new was delivered: nothing is undelivered (no command needed).
                    self.lag.set(0.0);
                } else {
                    info!("re-read this member's pending entries after a lost reply");
                }
                Event::ReadNothing { learned }
            }
            Some(Err(e)) => {
                let nogroup = e.code() == Some("NOGROUP");
                if nogroup {
                    warn!("the Redis consumer group is gone (Redis restarted?); recreating it");
                } else {
                    warn!(error = %e, "read failed; retrying");
                }
                Event::ReadFailed { nogroup }
            }
        };
        self.calls = calls;
        event
    }

    /// Acknowledges `plan.acks`, then reads up to `plan.count` entries after `plan.from`:
    /// through the guard with its owner token under strict fencing, else `XREADGROUP`.
    async fn fetch(
        &self,
        conn: &mut WorkerConn,
        guarded: Option<(&mut Guard, &str)>,
        plan: &ReadPlan,
    ) -> Result<Found, RedisError> {
        if conn.master_left() {
            return Err(rsc_redis::sentinel::switched_error());
        }
        // Ordering `key`: the seals are read in the same round trip, after the entries, so
        // they name every switch an entry read may follow (PROTOCOL §15).
        let seals = self.shared.ordered.load(Ordering::Relaxed);
        let Some((guard, token)) = guarded else {
            return self.lease_read(conn, plan, seals).await;
        };
        let ask = ReadAsk {
            acks: &plan.acks,
            from: &plan.from,
            count: plan.count,
            seals,
        };
        let read = match conn {
            WorkerConn::Dedicated { node, armed_by } => {
                guard.read(node, armed_by, &self.origin, token, ask).await?
            }
            WorkerConn::Shared { guards, .. } => {
                guards
                    .read(guard, &self.origin, token, ask, GUARD_TIMEOUT)
                    .await?
            }
        };
        Ok(match read {
            fence::Read::Fenced => Found::Fenced,
            fence::Read::Entries(ids, seals) => Found::Entries(
                ids.into_iter()
                    .map(|s| entry_from(s.id, s.map, 1))
                    .collect(),
                seals,
            ),
            fence::Read::Idle(last) => Found::Idle(Some(last)),
        })
    }

    /// Lease fencing's read: `XREADGROUP` (with `BLOCK` when the plan says so) with the
    /// `XACK` of the plan's acknowledgements pipelined first, and, when the plan asks to
    /// learn the stream's last id, `XREVRANGE … COUNT 1` before the read (so that an entry
    /// added in between is read, not waited for); with `seals`, `HGETALL` of the shard's
    /// seals after it.
    async fn lease_read(
        &self,
        conn: &mut WorkerConn,
        plan: &ReadPlan,
        seals: bool,
    ) -> Result<Found, RedisError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.origin.group)
            .arg(&self.origin.member_id)
            .arg("COUNT")
            .arg(plan.count);
        if let Some(block) = plan.block {
            cmd.arg("BLOCK").arg(block.as_millis().max(1) as u64);
        }
        cmd.arg("STREAMS")
            .arg(&self.origin.shard_key)
            .arg(&plan.from);
        let (reply, last, seals) = if plan.acks.is_empty() && !plan.learn_last && !seals {
            (
                cmd.query_async::<Option<OrderedRead>>(conn).await?,
                None,
                None,
            )
        } else {
            let mut pipe = redis::pipe();
            if !plan.acks.is_empty() {
                pipe.cmd("XACK")
                    .arg(&self.origin.shard_key)
                    .arg(&self.origin.group)
                    .arg(&*plan.acks);
            }
            if plan.learn_last {
                pipe.cmd("XREVRANGE")
                    .arg(&self.origin.shard_key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1);
            }
            pipe.add_command(cmd);
            if seals {
                pipe.cmd("HGETALL")
                    .arg(rsc_protocol::routing::seals_key(&self.origin.shard_key));
            }
            // Error replies come back in place, so that the read's own error keeps its code.
            pipe.ignore_errors();
            let mut values = pipe.query_async::<Vec<Value>>(conn).await?.into_iter();
            if !plan.acks.is_empty() {
                next_reply::<i64>(&mut values)?; // how many were pending: nothing to check
            }
            let last = match plan.learn_last {
                true => {
                    let last: StreamRangeReply = next_reply(&mut values)?;
                    let first = last.ids.into_iter().next();
                    Some(first.map_or_else(|| "0-0".to_owned(), |e| e.id))
                }
                false => None,
            };
            let reply: Option<OrderedRead> = next_reply(&mut values)?;
            let seals = match seals {
                true => Some(next_reply::<Seals>(&mut values)?),
                false => None,
            };
            (reply, last, seals)
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
            Found::Entries(entries, seals)
        })
    }

    /// [`Step::WaitNew`]: strict fencing on a connection of its own, nothing to read: a plain
    /// `XREAD BLOCK … <last id>`, which only wakes the worker (it delivers nothing to the
    /// group), so idle shards do not poll.
    async fn wait_for_new(
        &mut self,
        conn: &mut WorkerConn,
        after: &str,
        block: std::time::Duration,
    ) -> Option<Event<Arc<Entry>>> {
        let mut wake = redis::cmd("XREAD");
        wake.arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&self.origin.shard_key)
            .arg(after);
        let stop = self.stop.clone();
        let woke = self
            .calls
            .beside(async {
                tokio::select! {
                    r = wake.query_async::<Value>(conn) => Some(r),
                    _ = stop.cancelled() => None,
                }
            })
            .await?;
        Some(match woke {
            Ok(Value::Nil) => Event::NoNew,
            Ok(_) => Event::NewMaybe,
            Err(e) => {
                debug!(error = %e, "XREAD wake-up failed");
                Event::WaitFailed
            }
        })
    }

    /// [`Step::CheckDrained`]: a draining shard with nothing pending is drained.
    async fn check_drained(&self, conn: &mut WorkerConn) {
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
            && self.retry_stages_empty(conn).await
            && !self.flags.drained.swap(true, Ordering::Relaxed)
        {
            info!("draining shard is empty");
        }
    }

    /// Non-blocking retries: whether the shard's retry streams are empty (a draining shard
    /// with entries waiting in a stage is not drained: they are its owner's to try).
    async fn retry_stages_empty(&self, conn: &mut WorkerConn) -> bool {
        let stages = self.shared.listener.settings.retry_stages.len() as u32;
        if stages == 0 {
            return true;
        }
        let mut pipe = redis::pipe();
        for stage in 1..=stages {
            let o = &self.origin;
            pipe.cmd("XLEN").arg(rsc_protocol::routing::retry_key(
                &o.shard_key,
                &o.group,
                stage,
            ));
        }
        let lens: Result<Vec<u64>, RedisError> = pipe.query_async(conn).await;
        lens.is_ok_and(|l| l.iter().all(|n| *n == 0))
    }

    /// [`Step::ReadLag`]: the shard's lag gauge from `XINFO GROUPS`.
    async fn refresh_lag(&self, conn: &mut WorkerConn) {
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

#[cfg(test)]
mod tests {
    use super::super::ShardFlags;
    use super::super::dispatch::CallId;
    use super::*;
    use crate::consumer::MemberShared;
    use futures::FutureExt;
    use std::time::Duration;

    fn worker() -> (ShardWorker, Arc<ShardFlags>) {
        let listener = crate::Listener::new("g", "s", |_msg: crate::Message<crate::Raw>| async {
            Ok::<_, std::convert::Infallible>(())
        });
        let flags = Arc::new(ShardFlags::default());
        let w = ShardWorker::new(
            MemberShared::for_tests(listener),
            0,
            rsc_protocol::StartPosition::Earliest,
            flags.stop.clone(),
            flags.clone(),
        );
        (w, flags)
    }

    /// Stopping waits for the calls in flight, however long they take, until the revocation
    /// deadline cuts the wait short (PROTOCOL §5.3): those still running then are dropped.
    #[tokio::test(start_paused = true)]
    async fn the_drain_waits_for_the_calls_until_the_deadline_cuts_it_short() {
        let (mut w, flags) = worker();
        let ends_in = |secs: u64, id: u64| {
            async move {
                tokio::time::sleep(Duration::from_secs(secs)).await;
                (CallId::test(id), vec![])
            }
            .boxed()
        };
        assert!(w.calls.start(ends_in(3, 1)).is_none());
        assert!(w.calls.start(ends_in(3_600, 2)).is_none());
        let cut = flags.cut_short.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            cut.cancel();
        });
        let t0 = Instant::now();
        w.drain_calls().await;
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(10),
            "waited until the deadline"
        );
        assert!(w.calls.is_idle(), "the call still running was dropped");

        // Without a deadline, the drain ends when the last call ends.
        let (mut w, _flags) = worker();
        assert!(w.calls.start(ends_in(3, 1)).is_none());
        let t0 = Instant::now();
        w.drain_calls().await;
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
    }

    /// A wait on the calls with a deadline (the backoff after a failed read, the
    /// acknowledgement linger) ends at that deadline on the worker's clock, or at once when
    /// the worker is stopped.
    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_deadline_or_at_the_stop() {
        let (mut w, flags) = worker();
        let mut pause = w.shared.paused.clone();
        let t0 = Instant::now();
        let until = t0 + Duration::from_millis(1_600);
        assert!(w.wait(&mut pause, Some(until), None).await.is_none());
        assert_eq!(Instant::now(), until);
        let stop = flags.stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            stop.cancel();
        });
        let t1 = Instant::now();
        w.wait(&mut pause, None, None).await;
        assert_eq!(t1.elapsed(), Duration::from_secs(2));
    }
}
