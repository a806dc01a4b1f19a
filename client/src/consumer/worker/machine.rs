//! The shard worker's pure core: every decision of a shard worker, from the takeover to the
//! last acknowledgement, as a state machine with no I/O and an injected clock (the same
//! shape as the coordinator's `engine/`). The driver ([`super::read`]) asks it for the next
//! [`Step`] with the time now, does the Redis I/O or the wait the step names, and gives back
//! what happened as an [`Event`]. Unit- and property-tested without Redis (`machine/tests.rs`).
//!
//! The steps of a shard's life (PROTOCOL §5.3, §15, §16; ARCHITECTURE "Data plane"):
//!
//! 1. **Takeover**: the Redis consumer group exists (`XGROUP CREATE … MKSTREAM`, retried with
//!    a backoff); the entries still pending in the group are claimed a page at a time
//!    (`XAUTOCLAIM` from `0-0` until the cursor comes back to `0-0`, waiting while the listener
//!    is paused) and each page is handled and acknowledged before the next; departed
//!    consumers are cleaned up.
//! 2. **Reading**: each turn first starts the handler calls the [`Dispatch`] allows (none while
//!    paused) and, while entries are held for their parents (ordered resharding), checks the
//!    parents every [`HOLD_POLL`]. Then, in this order of precedence: the lag is read (at most
//!    every [`LAG_EVERY`], after a read that found entries); a draining shard that went quiet
//!    is checked; with every lane busy, the listener paused or the hold full, the worker waits
//!    for a call to end, sending the acknowledgements waiting once [`ACK_LINGER`] passed with
//!    none (at once while paused, or once a read's worth waits); after a read that found
//!    nothing it waits on the doorbell for entries after the stream's last known id (see
//!    [`Cursor`]), checking a draining shard at each `quiet` period without a ring; otherwise
//!    it reads, with the acknowledgements waiting in the same round trip.
//!    A resume (of the listener or of the group) ends any such wait: the worker reads at
//!    once, since a seek made while it was paused may have moved the group's position
//!    behind the last entry it saw (PROTOCOL §18).
//! 3. **Recovery**: a read that failed may have lost a reply that delivered entries: the worker
//!    first re-reads this member's own pending entries (from `0`, then after the last one
//!    re-read) before new ones, after the backoff; a vanished consumer group (`NOGROUP`) is
//!    created again.
//! 4. **Stop** (revocation, self-fence, lease run out, refused owner token, shutdown): no call
//!    starts, nothing more is read; the calls in flight run to their end (or are dropped when
//!    the driver cuts the wait short, PROTOCOL §5.3), then what they settled is acknowledged.
//!    Entries read and not started stay pending for the next owner.
//!
//! The driver may be on a connection that blocks ([`Config::blocking`], the per-shard reader):
//! reads of new entries then block in Redis (`BLOCK`, shorter while calls are in flight or
//! entries are held) instead of waiting on the doorbell.

use super::cursor::{Cursor, Next};
use super::dispatch::{Call, CallId, Dispatch, Keyed, Shape, Verdict};
use crate::consumer::backoff::Backoff;
use crate::consumer::doorbell::Woken;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Ordered resharding: at most this many entries are held aside per shard; past it the worker
/// reads no more of the shard until held entries are released.
pub(crate) const MAX_HELD: usize = 10_000;
/// Ordered resharding: how often held keys' parents are checked (and the longest a blocked
/// read blocks while entries are held). The worker asks the data Redis itself (one small
/// script per parent waited for) rather than waiting for a wake-up: only the data Redis sees
/// the parent's acknowledgements, so a coordinator relay would poll it too and add its own
/// latency. The poll runs only while entries are held, and a release follows a parent's last
/// acknowledgement by at most this long.
pub(crate) const HOLD_POLL: Duration = Duration::from_millis(20);
/// The longest a blocked read blocks while handler calls are in flight: the worker starts
/// the calls their ends make possible between reads.
pub(crate) const BUSY_BLOCK: Duration = Duration::from_millis(100);
/// How often, at most, the lag of a shard that has entries is read from Redis (an idle
/// shard's lag is 0 and costs no command).
pub(crate) const LAG_EVERY: Duration = Duration::from_secs(5);
/// How long handled entries' acknowledgements wait for the next read (or the next call's
/// end) while the worker waits on calls in flight, before they are sent on their own.
pub(crate) const ACK_LINGER: Duration = Duration::from_millis(10);
/// The cursor `XAUTOCLAIM` starts from and ends with.
const CLAIM_START: &str = "0-0";

/// How a worker's machine is set up (from the listener's settings and the connection).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The dispatch's shape (lanes, batch, queue bound, automatic acknowledgement).
    pub(crate) shape: Shape,
    /// The group: entries redriven for another group are acknowledged unhandled.
    pub(crate) group: String,
    /// Entries per read (`batch_size`).
    pub(crate) read_count: usize,
    /// The listener's `block`: how long a blocked read blocks, and the quiet period after
    /// which a draining shard waiting on the doorbell is checked.
    pub(crate) quiet: Duration,
    /// The connection may block: reads of new entries block in Redis (the per-shard reader)
    /// instead of waiting on the doorbell.
    pub(crate) blocking: bool,
    /// A batch listener's `linger` and `max_batch`: after a read of new entries that brought
    /// fewer than `max_batch`, wait `linger` and read what arrived meanwhile.
    pub(crate) batch_linger: Option<(Duration, usize)>,
    /// The backoff of a failed Redis command (group creation, claim, read).
    pub(crate) retry: (Duration, Duration),
}

/// What the driver knows at the moment it asks for the next step.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ctx {
    /// Strict fencing: reads go through the guarded transaction (never lingered over).
    pub(crate) guarded: bool,
    /// The group's ordering through reshards is `key` (entries are admitted through the
    /// hold; never lingered over).
    pub(crate) ordered: bool,
    /// The shard is being drained (PROTOCOL §6): a quiet shard is checked for emptiness.
    pub(crate) draining: bool,
}

/// The next thing the driver does.
#[derive(Debug)]
pub(crate) enum Step<E> {
    /// `XGROUP CREATE <key> <group> <start> MKSTREAM` (`BUSYGROUP` is success):
    /// [`Event::GroupReady`] or [`Event::GroupFailed`].
    CreateGroup,
    /// `XAUTOCLAIM <key> <group> <member> 0 <cursor> COUNT n` (through the fence with an
    /// owner token): [`Event::Claimed`], [`Event::ClaimFailed`] or [`Event::Fenced`].
    Claim {
        /// Where the claim starts.
        cursor: String,
    },
    /// Delete the shard's departed consumers: [`Event::Cleaned`].
    Clean,
    /// Start this handler call; its end comes back as [`Event::CallEnded`].
    Start(Call<E>),
    /// Check the parents of held entries: [`Event::Released`].
    CheckHolds,
    /// Acknowledge these ids (retried a few times even when stopping): [`Event::Acked`].
    Ack(Vec<String>),
    /// Read: [`Event::ReadEntries`], [`Event::ReadNothing`], [`Event::ReadFailed`],
    /// [`Event::Fenced`], or [`Event::ReadCut`] when stopped meanwhile.
    Read(ReadPlan),
    /// Read the shard's lag (`XINFO GROUPS`) into its gauge; no event.
    ReadLag,
    /// Check whether the draining shard is empty (`XPENDING`); no event.
    CheckDrained,
    /// Strict fencing on a blocking connection, nothing to read: a plain `XREAD BLOCK` after
    /// `after`, which only wakes the worker: [`Event::NewMaybe`], [`Event::NoNew`] or
    /// [`Event::WaitFailed`].
    WaitNew {
        /// The stream's last id.
        after: String,
        /// How long to block.
        block: Duration,
    },
    /// Wait for a call to end, the stop, a change of the pause, a ring of the shard after
    /// `ring` (when set: [`Event::Woken`]), or `until`, whichever comes first; then ask
    /// again.
    Wait {
        /// Give up waiting at this instant (`None`: no deadline).
        until: Option<Instant>,
        /// Wait on the doorbell for entries after this id.
        ring: Option<String>,
    },
    /// Stopping: wait for every call in flight to end (unless cut short), report their ends,
    /// then [`Event::CallsSettled`].
    DrainCalls,
    /// The worker is done.
    Done,
}

/// A read the driver is to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadPlan {
    /// `>` (new entries), or this member's own pending entries after an id.
    pub(crate) from: String,
    /// At most this many entries.
    pub(crate) count: usize,
    /// Acknowledge these first, in the same round trip (shared with the machine, which
    /// settles them by the read's outcome).
    pub(crate) acks: Arc<[String]>,
    /// Learn the stream's last id in the same round trip, before the read (for the doorbell;
    /// a guarded read always learns it).
    pub(crate) learn_last: bool,
    /// Block this long for new entries (a blocking connection only).
    pub(crate) block: Option<Duration>,
}

/// What happened, for the machine.
#[derive(Debug)]
pub(crate) enum Event<E> {
    /// The listener was paused (`true`) or resumed.
    Paused(bool),
    /// Stop (revocation, self-fence, the lease ran out, shutdown).
    Stop,
    /// The consumer group exists.
    GroupReady,
    /// Creating the consumer group failed: retried after the backoff.
    GroupFailed,
    /// A claim took these entries over (`held` entries are held for their parents now);
    /// the next claim starts at `next` (`0-0`: none left).
    Claimed {
        /// Entries to handle now, in stream order.
        ready: Vec<E>,
        /// The next cursor.
        next: String,
        /// Entries held in all.
        held: usize,
    },
    /// A claim failed; `nogroup`: the consumer group is gone.
    ClaimFailed {
        /// Redis answered `NOGROUP`.
        nogroup: bool,
    },
    /// Redis refused the owner token (strict fencing): the shard moved on.
    Fenced,
    /// The departed consumers were cleaned up (or that failed: the next takeover tries again).
    Cleaned,
    /// A call ended with a verdict per settled entry (an entry without one is abandoned).
    CallEnded(CallId, Vec<(String, Verdict)>),
    /// Stopping: every call ended, or the rest was dropped (their entries stay pending).
    CallsSettled,
    /// These acknowledgements were sent, or given up on.
    Acked(Vec<String>),
    /// The read found entries: `ready` to handle now (the others are held for their parents,
    /// `held` in all); `last` is the last id read.
    ReadEntries {
        /// Entries to handle now, in stream order.
        ready: Vec<E>,
        /// The last entry id the read returned.
        last: String,
        /// Entries held in all.
        held: usize,
    },
    /// The read found nothing; `learned`: the stream's last id, when the read learned it.
    ReadNothing {
        /// The stream's last id (`0-0` for an empty stream).
        learned: Option<String>,
    },
    /// The read failed (its reply, and the acknowledgements sent with it, may be lost);
    /// `nogroup`: the consumer group is gone.
    ReadFailed {
        /// Redis answered `NOGROUP`.
        nogroup: bool,
    },
    /// The read was given up because the worker stops.
    ReadCut,
    /// The doorbell woke the worker.
    Woken(Woken),
    /// [`Step::WaitNew`]: the stream moved.
    NewMaybe,
    /// [`Step::WaitNew`]: nothing new for a whole block.
    NoNew,
    /// [`Step::WaitNew`] failed: retried after the backoff.
    WaitFailed,
    /// Held entries whose parents reached their seals, in stream order per key (`held` still
    /// held).
    Released {
        /// Entries to handle now.
        ready: Vec<E>,
        /// Entries held in all.
        held: usize,
    },
}

/// Where the worker is in the shard's life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Creating the consumer group, then `then`.
    CreateGroup(Box<Phase>),
    /// Claiming pending entries from this cursor.
    Claim(String),
    /// Handling a claimed page; then the next claim from this cursor (`0-0`: the cleanup).
    Settle(String),
    /// Cleaning up departed consumers.
    Clean,
    /// Reading new entries.
    Read,
    /// Stopping: calls drain, then the last acknowledgements.
    Finish,
    /// Done.
    Done,
}

/// The read in progress: what the events of its reply refer to.
#[derive(Debug)]
struct Reading {
    from: String,
    acks: Arc<[String]>,
    /// It is the read after a batch listener's linger.
    linger_read: bool,
    /// Its entries may be lingered over (a batch listener's read of new entries, neither
    /// guarded nor ordered).
    may_linger: bool,
}

/// A batch listener waiting for company for the entries of a short read.
#[derive(Debug)]
struct Lingering<E> {
    entries: Vec<E>,
    last: String,
    until: Instant,
}

/// One shard worker's decisions (see the module docs).
#[derive(Debug)]
pub(crate) struct Machine<E> {
    cfg: Config,
    phase: Phase,
    dispatch: Dispatch<E>,
    cursor: Cursor,
    backoff: Backoff,
    /// After a failure: nothing but the calls until then.
    retry_at: Option<Instant>,
    paused: bool,
    /// Re-read this member's own pending entries after this id before new ones (after a
    /// read whose reply may have been lost).
    recovering: Option<String>,
    /// The last read of new entries found none: wait on the doorbell for entries after
    /// this id, since `ring_since`.
    waiting_after: Option<String>,
    ring_since: Option<Instant>,
    /// Strict fencing on a blocking connection: wait for the stream to move past this id.
    wait_new: Option<String>,
    reading: Option<Reading>,
    lingering: Option<Lingering<E>>,
    /// Entries held for their parents, and when they were last checked.
    held: usize,
    hold_checked: Option<Instant>,
    /// Since when acknowledgements wait while the worker waits on calls.
    acks_since: Option<Instant>,
    /// Send the acknowledgements waiting before anything else (after a failed read).
    flush_first: bool,
    lag_at: Option<Instant>,
    lag_due: bool,
    check_drained: bool,
    /// Stopping: the calls in flight have all ended or were dropped.
    calls_settled: bool,
}

impl<E: Keyed + Clone> Machine<E> {
    /// A worker's machine at the start of the takeover.
    pub(crate) fn new(cfg: Config) -> Self {
        let (min, max) = cfg.retry;
        Machine {
            dispatch: Dispatch::new(cfg.shape).for_group(&cfg.group),
            phase: Phase::CreateGroup(Box::new(Phase::Claim(CLAIM_START.to_owned()))),
            cursor: Cursor::default(),
            backoff: Backoff::new(min, max),
            retry_at: None,
            paused: false,
            recovering: None,
            waiting_after: None,
            ring_since: None,
            wait_new: None,
            reading: None,
            lingering: None,
            held: 0,
            hold_checked: None,
            acks_since: None,
            flush_first: false,
            lag_at: None,
            lag_due: false,
            check_drained: false,
            calls_settled: false,
            cfg,
        }
    }

    /// The next step at `now`.
    pub(crate) fn next(&mut self, now: Instant, ctx: Ctx) -> Step<E> {
        loop {
            match &self.phase {
                Phase::Done => return Step::Done,
                Phase::Finish => return self.finish_step(),
                _ => {}
            }
            if let Some(step) = self.turn(now) {
                return step;
            }
            if std::mem::take(&mut self.flush_first) && self.dispatch.has_acks() {
                return self.ack_step();
            }
            if let Some(t) = self.retry_at {
                if now < t {
                    return self.wait_for_calls(now, Some(t));
                }
                self.retry_at = None;
            }
            match self.phase.clone() {
                Phase::CreateGroup(_) => return Step::CreateGroup,
                Phase::Claim(_) if self.paused => {
                    return Step::Wait {
                        until: None,
                        ring: None,
                    };
                }
                Phase::Claim(cursor) => return Step::Claim { cursor },
                Phase::Settle(next) => {
                    if !self.dispatch.is_idle() {
                        return self.wait_for_calls(now, None);
                    }
                    if self.dispatch.has_acks() {
                        return self.ack_step();
                    }
                    // The page is handled and acknowledged: the next one, or the cleanup.
                    self.phase = if next == CLAIM_START {
                        Phase::Clean
                    } else {
                        Phase::Claim(next)
                    };
                }
                Phase::Clean => return Step::Clean,
                Phase::Read => return self.read_step(now, ctx),
                // Answered at the top of the loop.
                Phase::Finish | Phase::Done => continue,
            }
        }
    }

    /// What happened at `now`.
    pub(crate) fn on(&mut self, event: Event<E>, now: Instant) {
        match event {
            Event::Paused(p) => {
                if self.paused && !p {
                    self.resumed();
                }
                self.paused = p;
            }
            Event::Stop | Event::Fenced => self.stop(),
            Event::CallEnded(id, verdicts) => {
                self.dispatch.finished(id, &verdicts);
                if self.dispatch.has_acks() {
                    self.acks_since.get_or_insert(now);
                }
            }
            Event::CallsSettled => {
                self.dispatch.abandon_in_flight();
                self.calls_settled = true;
            }
            Event::Acked(ids) => self.dispatch.acked(&ids),
            Event::GroupReady => {
                self.backoff.reset();
                if let Phase::CreateGroup(then) = &self.phase {
                    self.phase = (**then).clone();
                }
            }
            Event::GroupFailed | Event::WaitFailed => self.retry_later(now),
            Event::Claimed { ready, next, held } => {
                self.backoff.reset();
                self.held = held;
                self.dispatch.offer(ready);
                if !self.dispatch.is_stopping() {
                    self.phase = Phase::Settle(next);
                }
            }
            Event::ClaimFailed { nogroup: true } => {
                // The group vanished (e.g. Redis restarted without persistence): nothing is
                // pending any more.
                self.phase = Phase::CreateGroup(Box::new(Phase::Clean));
            }
            Event::ClaimFailed { nogroup: false } => self.retry_later(now),
            Event::Cleaned => {
                if self.phase == Phase::Clean {
                    self.phase = Phase::Read;
                }
            }
            Event::ReadEntries { ready, last, held } => self.read_entries(ready, last, held, now),
            Event::ReadNothing { learned } => self.read_nothing(learned, now),
            Event::ReadFailed { nogroup } => self.read_failed(nogroup, now),
            Event::ReadCut => {
                if let Some(r) = self.reading.take() {
                    // The acknowledgements may not have landed: they are sent again (XACK is
                    // idempotent).
                    self.dispatch.unsent(r.acks.to_vec());
                }
            }
            Event::Woken(by) => {
                self.cursor.woken(by);
                self.waiting_after = None;
            }
            Event::NewMaybe => {}
            Event::NoNew => {
                // Nothing new for a whole block: only then is a draining shard with nothing
                // pending called drained (one merely empty between a stale producer's writes
                // is not).
                if self.dispatch.in_flight() == 0 {
                    self.check_drained = true;
                }
            }
            Event::Released { ready, held } => {
                self.held = held;
                if !ready.is_empty() {
                    // Other gates may open soon after: check again at the next turn.
                    self.hold_checked = None;
                    self.dispatch.offer(ready);
                }
            }
        }
    }

    /// The start of each turn: the parents of held entries when due, then the calls that
    /// may start (none while paused).
    fn turn(&mut self, now: Instant) -> Option<Step<E>> {
        if self.held > 0 && self.hold_checked.is_none_or(|t| now >= t + HOLD_POLL) {
            self.hold_checked = Some(now);
            return Some(Step::CheckHolds);
        }
        if !self.paused
            && let Some(call) = self.dispatch.next_call()
        {
            return Some(Step::Start(call));
        }
        None
    }

    /// Reading new entries (see the module docs, step 2).
    fn read_step(&mut self, now: Instant, ctx: Ctx) -> Step<E> {
        if std::mem::take(&mut self.lag_due) {
            self.lag_at = Some(now);
            return Step::ReadLag;
        }
        if std::mem::take(&mut self.check_drained) && ctx.draining {
            return Step::CheckDrained;
        }
        if let Some(l) = &self.lingering {
            if now < l.until {
                return self.wait_for_calls(now, Some(l.until));
            }
            let (_, max) = self.cfg.batch_linger.unwrap_or_default();
            let count = max
                .saturating_sub(l.entries.len())
                .min(self.dispatch.room())
                .max(1);
            let plan = ReadPlan {
                from: ">".to_owned(),
                count,
                acks: Arc::from([]),
                learn_last: false,
                block: None,
            };
            return self.read(plan, true, false);
        }
        if let Some(after) = self.wait_new.take() {
            return Step::WaitNew {
                after,
                block: self.block_for(),
            };
        }
        if self.paused || self.held >= MAX_HELD || !self.dispatch.wants_read() {
            return self.wait_for_calls(now, None);
        }
        if let Some(after) = self.waiting_after.clone()
            && let Some(step) = self.ring_wait(after, now, ctx)
        {
            return step;
        }
        let from = self.recovering.clone().unwrap_or_else(|| ">".to_owned());
        let new = from == ">";
        let may_linger = new
            && self.cfg.batch_linger.is_some_and(|(l, _)| !l.is_zero())
            && !ctx.guarded
            && !ctx.ordered;
        let plan = ReadPlan {
            count: self.cfg.read_count.min(self.dispatch.room()).max(1),
            acks: self.take_acks().into(),
            learn_last: new && !self.cfg.blocking && self.cursor.must_learn(),
            block: (new && self.cfg.blocking).then(|| self.block_for()),
            from,
        };
        self.read(plan, false, may_linger)
    }

    /// The last read of new entries found nothing: the wait on the doorbell for entries
    /// after `after` (the acknowledgements waiting go first), a draining shard's check after
    /// each quiet period; `None`: read again (entries are held, so that releases and reads
    /// interleave).
    fn ring_wait(&mut self, after: String, now: Instant, ctx: Ctx) -> Option<Step<E>> {
        if self.dispatch.has_acks() {
            return Some(self.ack_step());
        }
        let quiet = if self.held > 0 {
            HOLD_POLL
        } else {
            self.cfg.quiet
        };
        let since = *self.ring_since.get_or_insert(now);
        if now < since + quiet {
            return Some(Step::Wait {
                until: Some(since + quiet),
                ring: Some(after),
            });
        }
        if self.held > 0 {
            self.waiting_after = None;
            return None;
        }
        // A quiet period without a ring: a draining shard is checked, then the wait goes on
        // (an idle shard costs no command).
        self.ring_since = Some(now);
        if ctx.draining {
            return Some(Step::CheckDrained);
        }
        Some(Step::Wait {
            until: Some(now + quiet),
            ring: Some(after),
        })
    }

    /// The read of `plan`, remembered for the events of its reply.
    fn read(&mut self, plan: ReadPlan, linger_read: bool, may_linger: bool) -> Step<E> {
        self.reading = Some(Reading {
            from: plan.from.clone(),
            acks: Arc::clone(&plan.acks),
            linger_read,
            may_linger,
        });
        Step::Read(plan)
    }

    /// A blocked read's `BLOCK`: the listener's setting, [`HOLD_POLL`] while entries are
    /// held, [`BUSY_BLOCK`] while calls are in flight (their ends are taken between reads).
    fn block_for(&self) -> Duration {
        let mut block = self.cfg.quiet;
        if self.held > 0 {
            block = block.min(HOLD_POLL);
        }
        if self.dispatch.in_flight() > 0 {
            block = block.min(BUSY_BLOCK);
        }
        block.max(Duration::from_millis(1))
    }

    /// Waits for a call to end (or `until`, or the hold's next check), sending the
    /// acknowledgements waiting first when no call ended within [`ACK_LINGER`] (at once
    /// while paused, or once a read's worth is waiting): while calls end quickly the
    /// acknowledgements ride with the next read, one `XACK` for many entries, and a handled
    /// entry never stays pending for long behind a slow call.
    fn wait_for_calls(&mut self, now: Instant, until: Option<Instant>) -> Step<E> {
        let hold_check = (self.held > 0).then(|| self.hold_checked.map_or(now, |t| t + HOLD_POLL));
        let mut until = earliest(until, hold_check);
        if self.dispatch.has_acks() {
            let many = self.dispatch.acks_waiting() >= self.cfg.read_count;
            let since = *self.acks_since.get_or_insert(now);
            if self.paused || many || now >= since + ACK_LINGER {
                return self.ack_step();
            }
            until = earliest(until, Some(since + ACK_LINGER));
        }
        Step::Wait { until, ring: None }
    }

    fn ack_step(&mut self) -> Step<E> {
        Step::Ack(self.take_acks())
    }

    fn take_acks(&mut self) -> Vec<String> {
        self.acks_since = None;
        self.dispatch.take_acks()
    }

    fn retry_later(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff.next_delay());
    }

    fn read_entries(&mut self, ready: Vec<E>, last: String, held: usize, now: Instant) {
        let Some(r) = self.reading.take() else {
            return;
        };
        self.dispatch.acked(&r.acks);
        self.backoff.reset();
        self.held = held;
        self.waiting_after = None;
        self.ring_since = None;
        if r.from == ">" {
            // New entries: the group has delivered up to the last one (the doorbell's poll
            // looks for entries after it).
            self.cursor.read_entries(&last);
        } else {
            // Moving on through this member's own pending entries.
            self.recovering = Some(last.clone());
        }
        if self.lag_at.is_none_or(|t| now >= t + LAG_EVERY) {
            self.lag_due = true;
        }
        if r.linger_read {
            let mut entries = self.lingering.take().map(|l| l.entries).unwrap_or_default();
            entries.extend(ready);
            self.dispatch.offer(entries);
            return;
        }
        match self.cfg.batch_linger {
            Some((linger, max)) if r.may_linger && ready.len() < max => {
                self.lingering = Some(Lingering {
                    entries: ready,
                    last,
                    until: now + linger,
                });
            }
            _ => {
                self.dispatch.offer(ready);
            }
        }
    }

    fn read_nothing(&mut self, learned: Option<String>, now: Instant) {
        let Some(r) = self.reading.take() else {
            return;
        };
        self.dispatch.acked(&r.acks);
        self.backoff.reset();
        if r.linger_read {
            if let Some(l) = self.lingering.take() {
                self.dispatch.offer(l.entries);
            }
            return;
        }
        if r.from != ">" {
            // This member's own pending entries, re-read after a lost reply: none are left.
            self.recovering = None;
            return;
        }
        if self.cfg.blocking {
            match learned {
                // A blocked read has waited already: a draining shard may be drained.
                None => self.check_drained = true,
                Some(last) => self.wait_new = Some(last),
            }
        } else if let Next::WaitAfter(after) = self.cursor.read_nothing(learned) {
            self.waiting_after = Some(after);
            self.ring_since = Some(now);
        }
    }

    fn read_failed(&mut self, nogroup: bool, now: Instant) {
        let Some(r) = self.reading.take() else {
            return;
        };
        // The acknowledgements may not have landed: sent on their own first.
        self.dispatch.unsent(r.acks.to_vec());
        self.flush_first = true;
        if r.linger_read {
            // What the lost reply delivered is re-read from this member's pending entries.
            if let Some(l) = self.lingering.take() {
                self.recovering = Some(l.last);
                self.dispatch.offer(l.entries);
            }
            return;
        }
        if nogroup {
            self.recovering = None;
            self.phase = Phase::CreateGroup(Box::new(Phase::Read));
        } else {
            // The reply (entries now pending for this member) may be lost: this member's own
            // pending entries are read first once the backoff is over.
            self.recovering.get_or_insert_with(|| "0".to_owned());
            self.retry_later(now);
        }
    }

    /// The listener or the group was resumed: the group's position may have been moved
    /// meanwhile by a seek (PROTOCOL §18), which no producer announces and which may lie
    /// behind the last entry this worker saw. The worker forgets what it knew of its place in
    /// the shard and reads at once (one read per shard and resume), instead of waiting on the
    /// doorbell for entries after an id that may be ahead of the group.
    fn resumed(&mut self) {
        self.waiting_after = None;
        self.ring_since = None;
        self.wait_new = None;
        self.cursor.forget();
    }

    fn stop(&mut self) {
        if matches!(self.phase, Phase::Finish | Phase::Done) {
            return;
        }
        // Past this, nothing starts and nothing more is read: entries read and not started
        // (and a linger's) stay pending for the next owner.
        self.dispatch.stop();
        self.lingering = None;
        self.phase = Phase::Finish;
    }

    fn finish_step(&mut self) -> Step<E> {
        if !self.calls_settled && self.dispatch.in_flight() > 0 {
            return Step::DrainCalls;
        }
        if self.dispatch.has_acks() {
            return self.ack_step();
        }
        self.phase = Phase::Done;
        Step::Done
    }

    /// Whether the worker is stopping (or done).
    #[cfg(test)]
    pub(crate) fn is_stopping(&self) -> bool {
        matches!(self.phase, Phase::Finish | Phase::Done)
    }

    /// Whether the takeover is over (the worker reads new entries).
    #[cfg(test)]
    pub(crate) fn is_reading(&self) -> bool {
        self.phase == Phase::Read
    }

    /// Entries in the calls in flight.
    pub(crate) fn entries_in_flight(&self) -> usize {
        self.dispatch.entries_in_flight()
    }

    /// Entries queued for a call.
    pub(crate) fn queued(&self) -> usize {
        self.dispatch.queued()
    }

    /// Entries skipped as redriven for another group since the last call.
    pub(crate) fn take_skipped(&mut self) -> u64 {
        self.dispatch.take_skipped()
    }
}

/// The earlier of two optional instants.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
