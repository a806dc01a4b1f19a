//! The member's pure core: every decision of one member of a group (PROTOCOL §5, client side)
//! as a state machine with no I/O and an injected clock (the same shape as the coordinator's
//! `engine/` and the shard worker's machine). The driver ([`super::driver`]) gives it what
//! happened as an [`Event`] with the time now, carries out the [`Step`]s it answers (send a
//! heartbeat, start or stop a shard worker, …) and wakes it at its [`Member::deadline`].
//! Unit- and property-tested without a coordinator or Redis (`machine/tests.rs`), and run
//! against the coordinator's engine in a simulation (`super::sim`).
//!
//! - **Reconcile** each answer: a shard it works that is missing from `assignment` is revoked
//!   (its worker stops reading, finishes the handler in flight and acknowledges; when it has
//!   exited the member heartbeats at once without it); a shard in `assignment` it does not
//!   work yet gets a worker (which claims the previous owner's pending entries first).
//! - **Self-fence**: once `session_timeout − margin` has passed since the *sending* of the
//!   last successful heartbeat, every worker is stopped; a later success resumes with what
//!   that answer assigns.
//! - **Rejoin** with epoch 0, owning nothing, after `UNKNOWN_MEMBER_ID` or
//!   `FENCED_MEMBER_EPOCH` (once its workers have stopped).
//! - **Coordinator errors** (transport, 5xx, 429): retried with jittered exponential backoff;
//!   owned shards keep being worked until the lease runs out.
//! - **Shutdown**: stop every worker (in-flight handlers finish and are acknowledged), keep
//!   heartbeating meanwhile, then leave with epoch −1 so the shards move on at once.

use super::phase::{Exit, Phase, StopReason};
use crate::consumer::health::DataRedis;
use crate::consumer::heartbeats::grid_point;
use crate::consumer::lease::Lease;
use crate::error::CoordinatorError;
use rsc_protocol::{ErrorCode, HeartbeatResponse, MemberEpoch, StartPosition};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// Before the first answer: how long to wait for a heartbeat response.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Forced rejoins within a minute after which a member stops (with an error) rather than
/// fence another process using its id in a loop.
const FENCE_LOOP_LIMIT: usize = 10;

/// Slack past the moment a refused static member's holder would expire, before the holder
/// is taken for a live duplicate (clock and network delays between coordinator and member).
const IN_USE_MARGIN: Duration = Duration::from_secs(1);

/// How long the workers of a member giving its shards back (its data Redis does not answer)
/// have to finish before they are abandoned (see `ShardFlags::abandon`).
const ABANDON_AFTER: Duration = Duration::from_secs(2);

/// How long after being asked a member waits for the handler calls of the shards it revokes:
/// the rebalance timeout less a margin for ending the workers and reporting (a tenth of it, at
/// least two heartbeat intervals, at most half of it; PROTOCOL §5.3).
fn revocation_budget(rebalance: Duration, interval: Duration) -> Duration {
    let margin = (rebalance / 10).max(interval * 2).min(rebalance / 2);
    rebalance - margin
}

/// What a member is set up with.
#[derive(Debug)]
pub(crate) struct Config {
    /// The group (logs and metrics).
    pub(crate) group: String,
    /// This member's id (logs).
    pub(crate) member_id: String,
    /// The listener's drain grace: how long a draining shard stays drained before it is
    /// reported (PROTOCOL §6).
    pub(crate) drain_grace: Duration,
    /// How long the data Redis may stay unreachable before the member gives its shards back.
    pub(crate) data_redis_grace: Duration,
    /// The process-wide grid of batched heartbeats (`None`: the single route).
    pub(crate) grid: Option<Instant>,
    /// The backoff of failed heartbeats.
    pub(crate) backoff: crate::consumer::backoff::Backoff,
}

/// A heartbeat to send (its answer comes back as [`Event::Answered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beat {
    /// The member epoch it carries (0: a join, with the incarnation).
    pub(crate) epoch: i64,
    /// Every shard with a worker, stopping or not.
    pub(crate) owned: Vec<u32>,
    /// Draining shards drained for longer than the grace, if their workers found them empty
    /// (the driver checks those again in Redis before reporting them).
    pub(crate) drain_candidates: Vec<u32>,
    /// How long to wait for the answer.
    pub(crate) timeout: Duration,
}

/// What happened, for the member.
#[derive(Debug)]
pub(crate) enum Event {
    /// The answer to the heartbeat sent at the instant with the member epoch.
    Answered(Instant, i64, Result<HeartbeatResponse, CoordinatorError>),
    /// A shard's worker ended: the shard, the worker's panic (outside the handler) if it
    /// panicked, and whether Redis refused its owner token.
    WorkerExited(u32, Option<String>, bool),
    /// The app shuts down.
    Shutdown,
    /// The coordinator changed what this member must do (the wake-up channel).
    Woken,
    /// The data Redis' health: whether it answers, and since when it has not.
    DataRedis(DataRedis),
    /// A [`Step::Leave`] ended (left or not).
    Left,
    /// A [`Member::deadline`] came.
    Tick,
}

/// What the driver does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Send this heartbeat.
    Heartbeat(Beat),
    /// Start a shard's worker.
    Start(Start),
    /// Stop a shard's worker (it finishes the handler calls in flight and acknowledges).
    Stop(u32),
    /// Whether the shard is being drained (the worker checks a quiet one for emptiness).
    Draining(u32, bool),
    /// Strict fencing: the owner token the worker presents.
    Token(u32, Option<String>),
    /// The revocation's deadline came: these workers drop the handler calls still running.
    CutShort(Vec<u32>),
    /// These workers end where they are (their data Redis does not answer).
    Abandon(Vec<u32>),
    /// The listener's `on_assigned` callback.
    Assigned(Vec<u32>),
    /// The listener's `on_revoked` callback (a worker ended).
    Released(u32),
    /// Leave the group for good (−1, static members too): the data Redis does not answer.
    /// [`Event::Left`] when done.
    Leave,
    /// Every worker stopped while leaving: the member ends.
    Exit(Exit),
}

/// A shard worker to start.
#[derive(Debug)]
pub(crate) struct Start {
    /// Its shard.
    pub(crate) shard: u32,
    /// Strict fencing: the owner token it presents.
    pub(crate) token: Option<String>,
    /// Where the group starts reading a shard it has no position in.
    pub(crate) start: StartPosition,
    /// Whether the shard is being drained.
    pub(crate) draining: bool,
}

/// What the member knows of one shard it has a worker for.
#[derive(Debug, Default)]
struct Slot {
    stopping: Option<StopReason>,
    /// Since when this member knows the shard is draining.
    draining_since: Option<Instant>,
    /// The revocation's deadline cut the worker's wait for its handler calls short.
    cut_short: bool,
}

/// One member of a group, without I/O.
#[derive(Debug)]
pub(crate) struct Member {
    cfg: Config,
    /// The time of the event being taken.
    now: Instant,
    /// The steps answered to it so far.
    out: Vec<Step>,
    phase: Phase,
    epoch: i64,
    /// What the last answer assigns, less the shards Redis refused our token for since (not
    /// restarted before the next answer).
    assignment: BTreeSet<u32>,
    slots: BTreeMap<u32, Slot>,
    lease: Lease,
    /// The group's session timeout, from the last answer (`None`: never joined in this run).
    session: Option<Duration>,
    interval: Duration,
    /// The group's rebalance timeout, from the last answer.
    rebalance: Duration,
    start: StartPosition,
    shard_count: u32,
    next_heartbeat: Instant,
    /// A revocation finished or shards were started: report it with the next heartbeat, at once.
    report_now: bool,
    /// Strict fencing: the owner token of each assigned shard (empty in lease mode).
    tokens: BTreeMap<u32, String>,
    failures: u32,
    recent_fences: VecDeque<Instant>,
    /// Static membership: joins are refused because another process holds this member id;
    /// by this time its session would have run out had it stopped heartbeating (a crashed
    /// predecessor). Refused past it, the holder is alive: a duplicate id.
    in_use_until: Option<Instant>,
    /// Since when (the sending of the heartbeat whose answer asked) this member revokes
    /// shards; `None` when it revokes none or the revocation was cut short.
    revoking_since: Option<Instant>,
    /// When the workers stopped on giving the shards back are abandoned.
    abandon_at: Option<Instant>,
    in_flight: bool,
    data: DataRedis,
    /// Nothing is due until [`Event::Left`] (a [`Step::Leave`] is under way), or ever again
    /// (the member ended).
    waiting: bool,
}

impl Member {
    /// A member that has not joined yet; its first heartbeat is due at `now`.
    pub(crate) fn new(cfg: Config, now: Instant) -> Self {
        Member {
            cfg,
            now,
            out: Vec::new(),
            phase: Phase::Joining,
            epoch: MemberEpoch::JOIN.get(),
            assignment: BTreeSet::new(),
            slots: BTreeMap::new(),
            lease: Lease::new(),
            session: None,
            interval: Duration::from_secs(3),
            rebalance: Duration::from_secs(60),
            start: StartPosition::Earliest,
            shard_count: 0,
            next_heartbeat: now,
            report_now: false,
            tokens: BTreeMap::new(),
            failures: 0,
            recent_fences: VecDeque::new(),
            in_use_until: None,
            revoking_since: None,
            abandon_at: None,
            in_flight: false,
            data: DataRedis::Unknown,
            waiting: false,
        }
    }

    /// Takes `event` at `now`; answers what to do, in order.
    pub(crate) fn handle(&mut self, event: Event, now: Instant) -> Vec<Step> {
        self.now = now;
        match event {
            Event::Answered(sent_at, epoch, result) => {
                self.in_flight = false;
                match result {
                    Ok(resp) => self.accepted(sent_at, epoch, resp),
                    Err(e) => self.failed(e),
                }
                metrics::gauge!("rsc_client_owned_shards", "group" => self.cfg.group.clone(),
                    "member" => self.cfg.member_id.clone())
                .set(self.slots.len() as f64);
            }
            Event::WorkerExited(shard, panic, refused) => self.worker_exited(shard, panic, refused),
            Event::Shutdown if !self.is_leaving() => {
                info!(shards = ?self.slots.keys().collect::<Vec<_>>(),
                    "shutting down: finishing in-flight messages");
                self.end(Exit::Leave);
            }
            Event::Woken if self.wakeable() => {
                debug!("woken by the coordinator: heartbeat now");
                if self.in_flight {
                    // The answer in flight may predate the change: ask again after it.
                    self.report_now = true;
                } else {
                    self.next_heartbeat = now;
                }
            }
            Event::Shutdown | Event::Woken | Event::Tick => {}
            Event::DataRedis(data) => self.data = data,
            Event::Left => {
                (self.waiting, self.phase) = (false, Phase::Aside { left: true });
                self.epoch = MemberEpoch::JOIN.get();
                self.assignment.clear();
                self.tokens.clear();
            }
        }
        self.poll();
        std::mem::take(&mut self.out)
    }

    /// What is due now once an event was taken: the end, the steps of a member out of the
    /// group, the deadlines that passed, the next heartbeat.
    ///
    /// Out of the group while the data Redis does not answer, once every worker stopped and
    /// no heartbeat is in flight, the member leaves the group (−1, static members too: the
    /// shards must move now); once the data Redis answers again, it joins again owning
    /// nothing.
    fn poll(&mut self) {
        if self.waiting {
            return;
        }
        if self.slots.is_empty() && !self.in_flight {
            let last = match &mut self.phase {
                Phase::Leaving { exit, .. } => Some(Step::Exit(std::mem::take(exit))),
                Phase::Aside { left: false } => Some(Step::Leave),
                Phase::Aside { left: true } if self.data.is_up() => {
                    info!("the data Redis answers again: joining the group again");
                    (self.phase, self.next_heartbeat) = (Phase::Joining, self.now);
                    None
                }
                _ => None,
            };
            if let Some(last) = last {
                self.waiting = true;
                return self.out.push(last);
            }
        }
        if self.due(self.fence_deadline()) {
            self.self_fence();
        }
        if self.due(self.aside_deadline()) {
            // The data Redis has not answered within the grace: stop every worker, then leave
            // the group (above), so that members that can read take the shards.
            warn!(grace_ms = self.cfg.data_redis_grace.as_millis() as u64,
                shards = ?self.slots.keys().collect::<Vec<_>>(),
                "the data Redis has not answered within the grace: giving the shards back \
                 (leaving the group) until it answers again");
            self.count("rsc_client_stepped_aside_total");
            self.phase.step_aside();
            self.stop_all(StopReason::Aside);
            // The workers' Redis calls could only time out (each after seconds, with retries):
            // past a short bound for the handlers in flight, the workers end where they are.
            self.abandon_at = Some(self.now + ABANDON_AFTER);
        }
        if self.due(self.revocation_deadline()) {
            self.cut_revocation_short();
        }
        if self.abandon_at.take_if(|at| self.now >= *at).is_some() {
            let stopping = self.slots.iter().filter(|(_, s)| s.stopping.is_some());
            (self.out).push(Step::Abandon(stopping.map(|(k, _)| *k).collect()));
        }
        if self.may_send() && self.now >= self.next_heartbeat {
            self.send_heartbeat();
        }
    }

    /// When the member must be woken (a [`Event::Tick`]) if nothing else happens first.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let timers = [
            self.may_send().then_some(self.next_heartbeat),
            self.fence_deadline(),
            self.aside_deadline(),
            self.revocation_deadline(),
            self.abandon_at,
        ];
        // None while waiting.
        timers.into_iter().flatten().min().filter(|_| !self.waiting)
    }

    /// Whether the member is in its group in good standing (readiness).
    pub(crate) fn is_member(&self) -> bool {
        matches!(self.phase, Phase::Stable)
    }

    /// Whether the member is shutting down.
    pub(crate) fn is_leaving(&self) -> bool {
        matches!(self.phase, Phase::Leaving { .. })
    }

    /// Whether a wake-up would make it heartbeat sooner.
    pub(crate) fn wakeable(&self) -> bool {
        self.session.is_some() && !self.is_leaving()
    }

    /// The group's session timeout, once an answer told it.
    pub(crate) fn session(&self) -> Option<Duration> {
        self.session
    }

    /// When the lease runs out: no worker starts an entry past it.
    pub(crate) fn lease_deadline(&self) -> Option<Instant> {
        self.lease.deadline()
    }

    /// Whether `deadline` has come.
    fn due(&self, deadline: Option<Instant>) -> bool {
        deadline.is_some_and(|d| self.now >= d)
    }

    fn may_send(&self) -> bool {
        !self.in_flight && (self.phase).may_heartbeat(self.slots.is_empty(), self.data.is_up())
    }

    fn fence_deadline(&self) -> Option<Instant> {
        (self.lease.fence_deadline()).filter(|_| !self.slots.is_empty())
    }

    /// When the member gives its shards back, if the data Redis keeps not answering: the
    /// grace after its first unanswered probe.
    fn aside_deadline(&self) -> Option<Instant> {
        let down_since = (self.data.down_since()).filter(|_| self.phase.may_step_aside());
        down_since.map(|t| t + self.cfg.data_redis_grace)
    }

    /// Counts one event of the group in the counter `name`.
    fn count(&self, name: &'static str) {
        metrics::counter!(name, "group" => self.cfg.group.clone()).increment(1);
    }

    fn send_heartbeat(&mut self) {
        (self.report_now, self.in_flight) = (false, true);
        let drained = |t: Instant| self.now - t >= self.cfg.drain_grace;
        self.out.push(Step::Heartbeat(Beat {
            epoch: self.epoch,
            owned: self.slots.keys().copied().collect(),
            drain_candidates: (self.slots.iter())
                .filter(|(_, s)| s.stopping.is_none() && s.draining_since.is_some_and(drained))
                .map(|(k, _)| *k)
                .collect(),
            timeout: (self.session).map_or(JOIN_TIMEOUT, |s| {
                (s / 3).clamp(Duration::from_millis(500), Duration::from_secs(10))
            }),
        }));
    }

    /// A successful heartbeat: the member's epoch, the group's terms and the lease (renewed
    /// from the sending of the heartbeat it answers), then the assignment (revoke before
    /// assign) and the next heartbeat.
    fn accepted(&mut self, sent_at: Instant, sent_epoch: i64, resp: HeartbeatResponse) {
        metrics::counter!("rsc_client_heartbeats_total", "group" => self.cfg.group.clone(), "result" => "ok").increment(1);
        if self.failures > 0 {
            info!(failures = self.failures, "coordinator reachable again");
        }
        (self.failures, self.in_use_until) = (0, None);
        self.cfg.backoff.reset();
        if MemberEpoch::new(sent_epoch).is_join() {
            info!(epoch = resp.member_epoch, assignment = ?resp.assignment, "joined the group");
        }
        self.phase.answered();
        self.epoch = resp.member_epoch;
        let session = *(self.session).insert(Duration::from_millis(resp.session_timeout_ms));
        self.interval = Duration::from_millis(resp.heartbeat_interval_ms.max(10));
        self.rebalance = Duration::from_millis(resp.rebalance_timeout_ms);
        self.start = resp.start;
        self.shard_count = resp.shard_count;
        if self.lease.renewed(sent_at, session) {
            info!("heartbeat succeeded again: resuming");
        }
        self.assignment = resp.assignment.into_iter().collect();
        self.tokens = resp.owner_tokens;
        // Strict fencing: each worker gets its shard's owner token from this answer. No tokens
        // at all: lease fencing. A shard being revoked is not in the answer: it keeps its
        // token (still its own) while it finishes.
        let lease_only = self.tokens.is_empty();
        let shards = (self.slots.keys()).filter(|s| lease_only || self.tokens.contains_key(s));
        (self.out).extend(shards.map(|s| Step::Token(*s, self.tokens.get(s).cloned())));
        self.reconcile(sent_at);
        // At once if a revocation finished while this heartbeat was in flight; else batched:
        // on the process-wide grid, with the other members.
        let grid = (self.cfg.grid).map(|base| grid_point(base, self.interval, sent_at));
        let periodic = grid.unwrap_or(sent_at + self.interval).max(self.now);
        self.next_heartbeat = if self.report_now { self.now } else { periodic };
    }

    fn failed(&mut self, e: CoordinatorError) {
        let result = e.code().map_or("transport", ErrorCode::as_str);
        metrics::counter!("rsc_client_heartbeats_total", "group" => self.cfg.group.clone(), "result" => result).increment(1);
        match e.code() {
            Some(ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch) => {
                warn!(error = %e, "the coordinator no longer knows this member at this epoch: rejoining owning nothing");
                self.count("rsc_client_rejoins_total");
                // Several forced rejoins within a minute hint at a member id shared by two
                // processes (one that names no incarnation, e.g. an older client, since the
                // join of a second live process run is refused).
                self.recent_fences.push_back(self.now);
                (self.recent_fences).retain(|t| self.now - *t <= Duration::from_secs(60));
                if self.recent_fences.len() >= 3 {
                    warn!(member = %self.cfg.member_id, fences = self.recent_fences.len(),
                        "fenced again within a minute: is another process using the same member id?");
                }
                if self.recent_fences.len() >= FENCE_LOOP_LIMIT {
                    error!(error = %e, member = %self.cfg.member_id, fences = FENCE_LOOP_LIMIT,
                        "fenced {FENCE_LOOP_LIMIT} times within a minute: stopping rather than \
                         fence another process in a loop. Is another process using the same member id? \
                         (member ids are <instance>-<listener>-<index>; give each process its own \
                         POD_IP or POD_NAME, or ConsumerApp::builder().instance_id(..))");
                    return self.end(Exit::Rejected(e));
                }
                self.start_rejoin();
                self.next_heartbeat = self.now;
            }
            Some(ErrorCode::GroupNotFound) => {
                error!(error = %e, "the group does not exist (create it with `rsc-coordinator group create`); retrying");
                self.start_rejoin();
                self.next_heartbeat = self.now + self.cfg.backoff.next_delay().max(self.interval);
            }
            Some(ErrorCode::MemberIdInUse) => self.id_in_use(e),
            Some(ErrorCode::GroupMaxSizeReached) => {
                warn!(error = %e, "the group is full; retrying");
                self.next_heartbeat = self.now + self.cfg.backoff.next_delay().max(self.interval);
            }
            _ if e.is_retriable() => {
                self.failures += 1;
                if self.failures == 1 || self.failures.is_multiple_of(10) {
                    warn!(error = %e, failures = self.failures, "heartbeat failed; retrying with backoff");
                } else {
                    debug!(error = %e, failures = self.failures, "heartbeat failed");
                }
                // Jittered backoff, but never less often than the heartbeat interval: the
                // lease only lasts as long as a heartbeat gets through.
                self.next_heartbeat = self.now + self.cfg.backoff.next_delay().min(self.interval);
            }
            _ => {
                error!(error = %e, "the coordinator refused this member; stopping it");
                self.end(Exit::Rejected(e));
            }
        }
    }

    /// The member ends as `how` says (see [`Phase::end`]): every worker stops.
    fn end(&mut self, how: Exit) {
        self.phase.end(how);
        self.stop_all(StopReason::Shutdown);
    }

    /// `MEMBER_ID_IN_USE`: another process run holds this member id. Either this pod came
    /// back after a crash (the old run's session has to run out first: the coordinator says
    /// when) or two live processes share an id (the holder keeps heartbeating, so the
    /// refusals outlast the first session end): then stop loudly, saying how to fix it.
    fn id_in_use(&mut self, e: CoordinatorError) {
        let wait = e.retry_after().unwrap_or(self.interval);
        let until = *(self.in_use_until).get_or_insert(self.now + wait + IN_USE_MARGIN);
        if self.now > until {
            error!(error = %e, member = %self.cfg.member_id,
                "another live process uses this member id; stopping. Member ids are \
                 <instance>-<listener>-<index>: give each process its own instance id \
                 (POD_IP or POD_NAME, or ConsumerApp::builder().instance_id(..))");
            return self.end(Exit::Rejected(e));
        }
        warn!(error = %e, retry_in_ms = wait.as_millis() as u64,
            "member id held by another process run: retrying when its session runs out");
        let ms = Duration::from_millis;
        self.next_heartbeat = self.now + (wait + ms(20)).clamp(ms(100), Duration::from_secs(5));
    }

    /// Forget the membership: stop every worker; the next heartbeat (once they stopped) joins
    /// with epoch 0 owning nothing.
    fn start_rejoin(&mut self) {
        self.phase.membership_lost();
        self.epoch = MemberEpoch::JOIN.get();
        self.assignment.clear();
        self.stop_all(StopReason::Rejoin);
    }

    fn self_fence(&mut self) {
        warn!(
            session_timeout_ms = self.session.unwrap_or_default().as_millis() as u64,
            "no successful heartbeat within the lease: stopping every shard (self-fence)"
        );
        self.count("rsc_client_self_fenced_total");
        self.lease.lapse();
        self.phase.lease_ran_out();
        self.stop_all(StopReason::Fenced);
    }

    fn stop_all(&mut self, why: StopReason) {
        for (shard, slot) in self.slots.iter_mut().filter(|(_, s)| s.stopping.is_none()) {
            slot.stopping = Some(why);
            self.out.push(Step::Stop(*shard));
        }
    }

    /// Revoke what is no longer assigned (a revocation asked by the answer to the heartbeat
    /// sent at `sent_at`), start what is newly assigned.
    fn reconcile(&mut self, sent_at: Instant) {
        if !self.is_member() {
            return;
        }
        let mut revoked = Vec::new();
        for (shard, slot) in &mut self.slots {
            let draining = *shard >= self.shard_count;
            if draining != slot.draining_since.is_some() {
                slot.draining_since = draining.then_some(self.now);
                self.out.push(Step::Draining(*shard, draining));
            }
            if slot.stopping.is_none() && !self.assignment.contains(shard) {
                slot.stopping = Some(StopReason::Revoked);
                self.out.push(Step::Stop(*shard));
                revoked.push(*shard);
            }
        }
        if !revoked.is_empty() {
            info!(shards = ?revoked, "revoking shards: finishing in-flight messages");
            self.revoking_since = self.revoking_since.or(Some(sent_at));
        }
        // An answer that comes back after its own lease ran out starts nothing.
        let leased = self.lease.deadline().is_some_and(|d| self.now < d);
        let new: Vec<u32> = (self.assignment.iter().copied())
            .filter(|s| leased && !self.slots.contains_key(s))
            .collect();
        new.iter().for_each(|&shard| self.start_worker(shard));
        if !new.is_empty() {
            info!(shards = ?new, "starting shards");
            self.out.push(Step::Assigned(new));
            // Report the shards as owned at once (as KIP-848 members acknowledge a new
            // assignment), so the group is stable a heartbeat interval sooner.
            (self.next_heartbeat, self.report_now) = (self.now, true);
        }
    }

    /// When this member stops waiting for the handler calls of the shards it revokes: the
    /// group's rebalance timeout, less a margin, after it was asked (PROTOCOL §5.3).
    fn revocation_deadline(&self) -> Option<Instant> {
        let waiting = |s: &Slot| s.stopping == Some(StopReason::Revoked) && !s.cut_short;
        let since = (self.revoking_since).filter(|_| self.slots.values().any(waiting))?;
        Some(since + revocation_budget(self.rebalance, self.interval))
    }

    /// The revocation's deadline came: the workers of the revoked shards drop the handler
    /// calls still running (their entries stay pending for the next owner) and end, so that
    /// the member is not removed with every shard it owns.
    fn cut_revocation_short(&mut self) {
        self.revoking_since = None;
        let mut shards = Vec::new();
        for (shard, slot) in &mut self.slots {
            if slot.stopping == Some(StopReason::Revoked) {
                slot.cut_short = true;
                shards.push(*shard);
            }
        }
        warn!(
            ?shards,
            rebalance_timeout_ms = self.rebalance.as_millis() as u64,
            "revocation deadline: handlers still running on revoked shards are dropped \
             (their entries stay pending for the next owner) so that the member is not removed"
        );
        self.count("rsc_client_revocations_cut_short_total");
        self.out.push(Step::CutShort(shards));
    }

    fn start_worker(&mut self, shard: u32) {
        let draining = shard >= self.shard_count;
        self.out.push(Step::Start(Start {
            shard,
            token: self.tokens.get(&shard).cloned(),
            start: self.start,
            draining,
        }));
        let slot = Slot {
            draining_since: draining.then_some(self.now),
            ..Slot::default()
        };
        self.slots.insert(shard, slot);
    }

    fn worker_exited(&mut self, shard: u32, panic: Option<String>, refused: bool) {
        let Some(mut slot) = self.slots.remove(&shard) else {
            return;
        };
        if slot.stopping.is_none() && self.due(self.lease.fence_deadline()) {
            // The worker saw the lease run out (PROTOCOL §5.3) before the member's timer
            // fired: the member fences now, as it would have a moment later. Otherwise, with
            // its last worker gone, it would own nothing to fence and never say it stopped.
            self.self_fence();
            slot.stopping = Some(StopReason::Fenced);
        }
        self.out.push(Step::Released(shard));
        if let Some(message) = panic {
            // A bug outside the handler (whose panics are failed attempts): stop loudly
            // rather than run on with a worker that may do it again.
            error!(shard, panic = %message, "shard worker panicked; stopping the member");
            return self.end(Exit::Panicked(shard, message));
        }
        if refused {
            // Redis refused our owner token: the shard moved on. Report owning it no more, at
            // once; start it again only if the next answer still assigns it.
            warn!(shard, "shard dropped: fenced on the data path");
            self.count("rsc_client_fenced_shards_total");
            self.assignment.remove(&shard);
            (self.next_heartbeat, self.report_now) = (self.now, true);
            return;
        }
        let revoking = (self.slots.values()).any(|s| s.stopping == Some(StopReason::Revoked));
        self.revoking_since = self.revoking_since.filter(|_| revoking);
        match slot.stopping {
            Some(StopReason::Revoked) => {
                info!(shard, "shard released");
                // Report the revocation at once rather than at the next interval.
                (self.next_heartbeat, self.report_now) = (self.now, true);
            }
            Some(_) => {}
            None => warn!(shard, "shard worker exited on its own"),
        }
        // A shard given back while it was being revoked, or a worker that died: start again.
        let lease_expired = self.due(self.lease.deadline());
        if self.is_member() && self.assignment.contains(&shard) && !lease_expired {
            self.start_worker(shard);
            self.out.push(Step::Assigned(vec![shard]));
        }
    }
}

#[cfg(test)]
mod tests;
