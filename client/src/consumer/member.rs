//! The member runtime: one logical member of a consumer group (PROTOCOL §5, client side).
//!
//! A single task owns the member's state and never waits on a handler: it multiplexes the
//! heartbeat timer, the heartbeat in flight, the lease deadline, shard workers finishing, and
//! the shutdown signal. Handlers run in the shard workers' tasks.
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
//! - **Coordinator errors** (transport, 5xx, 429): retried with jittered exponential backoff,
//!   on the next coordinator URL; owned shards keep being worked until the lease runs out.
//! - **Shutdown**: stop every worker (in-flight handlers finish and are acknowledged), keep
//!   heartbeating meanwhile, then leave with epoch −1 so the shards move on at once.

use super::MemberShared;
use super::backoff::Backoff;
use super::drain::drain_state;
use super::heartbeats::Heartbeats;
use super::lease::Lease;
use super::worker::{ShardFlags, ShardWorker};
use crate::error::{ClientError, CoordinatorError};
use crate::handler::panic_text;
use crate::listener::Rebalance;
use futures::future::BoxFuture;
use rsc_api::CoordinatorClient;
use rsc_protocol::{
    ClientInfo, ErrorCode, HeartbeatRequest, HeartbeatResponse, MemberEpoch, StartPosition,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

/// Before the first answer: how long to wait for a heartbeat response.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a worker was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// The coordinator no longer assigns the shard.
    Revoked,
    /// The lease ran out (self-fence).
    Fenced,
    /// The member was fenced or forgotten by the coordinator and must rejoin.
    Rejoin,
    /// The app is shutting down (or the member hit a fatal error).
    Shutdown,
    /// The data Redis has not answered for longer than the grace: the member gives its
    /// shards back.
    Aside,
}

/// Where a member is in its lifecycle. The heartbeat answers, the lease, the workers and the
/// app's shutdown move it on; each variant carries what is only true in it.
#[derive(Debug)]
enum Phase {
    /// No successful heartbeat yet: joins with epoch 0, owning nothing.
    Joining,
    /// A member of the group: works what the last answer assigned (revoking what it no longer
    /// assigns before starting what it newly assigns).
    Stable,
    /// Self-fenced: the lease ran out and every worker was stopped; a successful heartbeat
    /// resumes with what it assigns.
    Fenced,
    /// The coordinator no longer knows the member at its epoch (or its group): every worker
    /// stops, then it joins again with epoch 0, owning nothing.
    Rejoining,
    /// The data Redis has not answered for longer than the grace (see [`super::health`]):
    /// every worker stops, the member leaves the group (heartbeating meanwhile, unless
    /// `left`), then waits, out of the group, until the data Redis answers and joins again.
    Aside { left: bool },
    /// Shutting down (the app's signal, or a failure): every worker finishes, then the member
    /// leaves the group.
    Leaving {
        standing: Standing,
        /// A shard worker panicked (outside the handler): `run()` fails with it.
        panicked: Option<(u32, String)>,
    },
}

/// A leaving member's standing with the coordinator.
#[derive(Debug)]
enum Standing {
    /// Still a member: heartbeats go on while the workers finish (keeping the lease), then
    /// it leaves with epoch −1 (−2 for a static member).
    Member,
    /// The coordinator dropped the membership: no heartbeat (a join would report shards that
    /// are still stopping).
    Forgotten,
    /// The coordinator refused the member for good: no heartbeat, no leave; `run()` fails.
    Rejected(CoordinatorError),
}

impl Phase {
    fn leaving() -> Self {
        Phase::Leaving {
            standing: Standing::Member,
            panicked: None,
        }
    }

    fn is_leaving(&self) -> bool {
        matches!(self, Phase::Leaving { .. })
    }

    /// Whether the member works its assignment (starts and restarts workers).
    fn can_work(&self) -> bool {
        matches!(self, Phase::Stable)
    }

    /// Whether a heartbeat may go out now (none in flight), given whether every worker has
    /// stopped: a rejoin waits until they have, so that it reports owning nothing.
    fn may_heartbeat(&self, workers_stopped: bool) -> bool {
        match self {
            Phase::Joining | Phase::Stable | Phase::Fenced => true,
            Phase::Rejoining => workers_stopped,
            Phase::Aside { left } => !left,
            Phase::Leaving { standing, .. } => match standing {
                Standing::Member => true,
                Standing::Forgotten => workers_stopped,
                Standing::Rejected(_) => false,
            },
        }
    }

    /// A successful heartbeat answer: a member working its assignment (unless leaving).
    fn answered(&mut self) {
        if matches!(
            self,
            Phase::Joining | Phase::Stable | Phase::Fenced | Phase::Rejoining
        ) {
            *self = Phase::Stable;
        }
    }

    /// Whether the member is in the group with shards it may be working: the one that gives
    /// them back when the data Redis stays unreachable.
    fn may_step_aside(&self) -> bool {
        matches!(self, Phase::Stable | Phase::Fenced)
    }

    /// The data Redis stayed unreachable past the grace.
    fn step_aside(&mut self) {
        if self.may_step_aside() {
            *self = Phase::Aside { left: false };
        }
    }

    /// The lease ran out.
    fn lease_ran_out(&mut self) {
        if let Phase::Stable = self {
            *self = Phase::Fenced;
        }
    }

    /// The coordinator no longer knows the member at its epoch, or its group.
    fn membership_lost(&mut self) {
        match self {
            Phase::Leaving { standing, .. } => {
                if let Standing::Member = standing {
                    *standing = Standing::Forgotten;
                }
            }
            // Out of the group already, as it was going to be.
            Phase::Aside { .. } => *self = Phase::Aside { left: true },
            _ => *self = Phase::Rejoining,
        }
    }

    /// The app shuts down.
    fn shut_down(&mut self) {
        match self {
            Phase::Leaving { .. } => {}
            Phase::Rejoining | Phase::Aside { left: true } => {
                *self = Phase::Leaving {
                    standing: Standing::Forgotten,
                    panicked: None,
                }
            }
            _ => *self = Phase::leaving(),
        }
    }

    /// The coordinator refused the member for good.
    fn rejected(&mut self, e: CoordinatorError) {
        self.shut_down();
        if let Phase::Leaving { standing, .. } = self {
            *standing = Standing::Rejected(e);
        }
    }

    /// A shard worker panicked (the first panic is the one reported).
    fn panicked(&mut self, shard: u32, message: String) {
        self.shut_down();
        if let Phase::Leaving { panicked, .. } = self {
            panicked.get_or_insert((shard, message));
        }
    }
}

struct Slot {
    stop: CancellationToken,
    flags: Arc<ShardFlags>,
    stopping: Option<StopReason>,
    /// Since when this member knows the shard is draining.
    draining_since: Option<Instant>,
}

impl Slot {
    fn set_draining(&mut self, draining: bool, now: Instant) {
        self.flags.draining.store(draining, Ordering::Relaxed);
        if !draining {
            self.draining_since = None;
        } else if self.draining_since.is_none() {
            self.draining_since = Some(now);
        }
    }
}

type HeartbeatFuture =
    BoxFuture<'static, (Instant, i64, Result<HeartbeatResponse, CoordinatorError>)>;

/// Forced rejoins within a minute after which a member stops (with an error) rather than
/// fence another process using its id in a loop.
const FENCE_LOOP_LIMIT: usize = 10;

/// Slack past the moment a refused static member's holder would expire, before the holder
/// is taken for a live duplicate (clock and network delays between coordinator and member).
const IN_USE_MARGIN: Duration = Duration::from_secs(1);

/// How long the workers of a member giving its shards back (its data Redis does not answer)
/// have to finish before they are abandoned (see [`ShardFlags::abandon`]).
const ABANDON_AFTER: Duration = Duration::from_secs(2);

/// How long after being asked a member waits for the handler calls of the shards it revokes:
/// the rebalance timeout less a margin for ending the workers and reporting (a tenth of it, at
/// least two heartbeat intervals, at most half of it; PROTOCOL §5.3).
fn revocation_budget(rebalance: Duration, interval: Duration) -> Duration {
    let margin = (rebalance / 10).max(interval * 2).min(rebalance / 2);
    rebalance - margin
}

/// One member of a group: `<instance>-<listener>-<index>`.
pub(crate) struct MemberRuntime {
    shared: Arc<MemberShared>,
    coord: CoordinatorClient,
    heartbeats: Heartbeats,
    client_info: ClientInfo,

    phase: Phase,
    epoch: i64,
    assignment: BTreeSet<u32>,
    slots: BTreeMap<u32, Slot>,
    tasks: JoinSet<u32>,
    task_shard: HashMap<Id, u32>,
    lease: Lease,
    /// The group's session timeout, from the last answer (`None`: never joined in this run).
    session: Option<Duration>,
    interval: Duration,
    start: StartPosition,
    shard_count: u32,
    next_heartbeat: Instant,
    /// A revocation finished or shards were started: report it with the next heartbeat, at once.
    report_now: bool,
    /// Strict fencing: the owner token of each assigned shard (empty in lease mode).
    tokens: BTreeMap<u32, String>,
    /// Shards Redis refused our token for: not restarted before the next answer.
    refused: BTreeSet<u32>,
    backoff: Backoff,
    failures: u32,
    recent_fences: VecDeque<Instant>,
    /// Static membership: joins are refused because another process holds this member id;
    /// by this time its session would have run out had it stopped heartbeating (a crashed
    /// predecessor). Refused past it, the holder is alive: a duplicate id.
    in_use_until: Option<Instant>,
    /// Signalled by the app's wake-up channel: the coordinator changed what this member must
    /// do; heartbeat now rather than at the interval.
    wake: Option<Arc<tokio::sync::Notify>>,
    /// The group's rebalance timeout, from the last answer.
    rebalance: Duration,
    /// Since when (the sending of the heartbeat whose answer asked) this member revokes
    /// shards; `None` when it revokes none or the revocation was cut short.
    revoking_since: Option<Instant>,
}

impl MemberRuntime {
    pub(crate) fn new(
        shared: Arc<MemberShared>,
        coord: CoordinatorClient,
        heartbeats: Heartbeats,
        client_info: ClientInfo,
    ) -> Self {
        MemberRuntime {
            shared,
            coord,
            heartbeats,
            client_info,
            phase: Phase::Joining,
            epoch: MemberEpoch::JOIN.get(),
            assignment: BTreeSet::new(),
            slots: BTreeMap::new(),
            tasks: JoinSet::new(),
            task_shard: HashMap::new(),
            lease: Lease::new(),
            session: None,
            interval: Duration::from_secs(3),
            start: StartPosition::Earliest,
            shard_count: 0,
            next_heartbeat: Instant::now(),
            report_now: false,
            tokens: BTreeMap::new(),
            refused: BTreeSet::new(),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
            failures: 0,
            recent_fences: VecDeque::new(),
            in_use_until: None,
            wake: None,
            rebalance: Duration::from_secs(60),
            revoking_since: None,
        }
    }

    /// Heartbeats at once whenever `signal` is notified (the wake-up channel).
    pub(crate) fn with_wake(mut self, signal: Option<Arc<tokio::sync::Notify>>) -> Self {
        self.wake = signal;
        self
    }

    /// Runs until `shutdown` is cancelled (then leaves the group) or a fatal refusal.
    pub(crate) async fn run(self, shutdown: CancellationToken) -> Result<(), ClientError> {
        let span =
            info_span!("member", group = %self.shared.group, member = %self.shared.member_id);
        self.run_inner(shutdown).instrument(span).await
    }

    async fn run_inner(mut self, shutdown: CancellationToken) -> Result<(), ClientError> {
        let mut inflight: Option<HeartbeatFuture> = None;
        let wake = self.wake.clone();
        let mut health = self.shared.data_health.clone();
        let mut health_watched = true;
        loop {
            // Readiness: a member in good standing (not joining, fenced, aside or leaving).
            (self.shared.joined).store(matches!(self.phase, Phase::Stable), Ordering::Relaxed);
            let leaving = self.phase.is_leaving();
            let idle = self.slots.is_empty() && inflight.is_none();
            if leaving && idle {
                break;
            }
            if idle {
                self.aside_progress().await;
            }
            let can_send = inflight.is_none()
                && self.phase.may_heartbeat(self.slots.is_empty())
                && self.may_join();
            let fence_at = if self.slots.is_empty() {
                None
            } else {
                self.lease.fence_deadline()
            };
            let aside_at = self.aside_deadline();
            let cut_at = self.revocation_deadline();
            tokio::select! {
                _ = shutdown.cancelled(), if !leaving => {
                    info!(shards = ?self.slots.keys().collect::<Vec<_>>(), "shutting down: finishing in-flight messages");
                    self.phase.shut_down();
                    self.stop_all(StopReason::Shutdown);
                }
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    let (id, panic) = match joined {
                        Ok((id, _)) => (id, None),
                        Err(e) => {
                            let id = e.id();
                            (id, e.try_into_panic().ok().map(|p| panic_text(p.as_ref())))
                        }
                    };
                    self.worker_exited(id, panic);
                }
                (sent_at, sent_epoch, result) = async { inflight.as_mut().expect("guarded").await }, if inflight.is_some() => {
                    inflight = None;
                    self.answered(sent_at, sent_epoch, result);
                }
                _ = tokio::time::sleep_until(self.next_heartbeat), if can_send => {
                    inflight = Some(self.send_heartbeat());
                }
                _ = tokio::time::sleep_until(fence_at.unwrap_or_else(Instant::now)), if fence_at.is_some() => {
                    self.self_fence();
                }
                _ = tokio::time::sleep_until(aside_at.unwrap_or_else(Instant::now)), if aside_at.is_some() => {
                    self.give_shards_back();
                }
                _ = tokio::time::sleep_until(cut_at.unwrap_or_else(Instant::now)), if cut_at.is_some() => {
                    self.cut_revocation_short();
                }
                // The data Redis' health changed: the loop looks again (join, step aside, return).
                changed = health.changed(), if health_watched => health_watched = changed.is_ok(),
                _ = async { wake.as_ref().expect("guarded").notified().await }, if wake.is_some() && self.session.is_some() && !leaving => {
                    debug!("woken by the coordinator: heartbeat now");
                    if inflight.is_some() {
                        // The answer in flight may predate the change: ask again after it.
                        self.report_now = true;
                    } else {
                        self.next_heartbeat = Instant::now();
                    }
                }
            }
        }
        (self.shared.joined).store(false, Ordering::Relaxed);
        self.finish().await
    }

    /// Once every worker stopped while leaving: leaves the group, or reports why not.
    async fn finish(mut self) -> Result<(), ClientError> {
        let phase = std::mem::replace(&mut self.phase, Phase::leaving());
        let Phase::Leaving { standing, panicked } = phase else {
            unreachable!("the member loop ends only while leaving")
        };
        let group = self.shared.group.clone();
        let member = self.shared.member_id.clone();
        if let Some((shard, message)) = panicked {
            return Err(ClientError::Panicked {
                group,
                member,
                shard: Some(shard),
                message,
            });
        }
        if let Standing::Rejected(source) = standing {
            return Err(ClientError::MemberRejected {
                group,
                member,
                source,
            });
        }
        self.leave(false).await;
        Ok(())
    }

    /// Whether a join (epoch 0) may go out: only once the data Redis answers, so that a
    /// member that cannot read never takes shards a healthy member could work.
    fn may_join(&self) -> bool {
        !matches!(self.phase, Phase::Joining | Phase::Rejoining)
            || self.shared.data_health.borrow().is_up()
    }

    /// When the member gives its shards back, if the data Redis keeps not answering: the
    /// grace after its first unanswered probe.
    fn aside_deadline(&self) -> Option<Instant> {
        if !self.phase.may_step_aside() {
            return None;
        }
        let since = self.shared.data_health.borrow().down_since()?;
        Some(since + self.shared.data_redis_grace)
    }

    /// The data Redis has not answered within the grace: stop every worker, then leave the
    /// group (see [`Self::aside_progress`]), so that members that can read take the shards.
    fn give_shards_back(&mut self) {
        warn!(grace_ms = self.shared.data_redis_grace.as_millis() as u64,
            shards = ?self.slots.keys().collect::<Vec<_>>(),
            "the data Redis has not answered within the grace: giving the shards back \
             (leaving the group) until it answers again");
        metrics::counter!("rsc_client_stepped_aside_total", "group" => self.shared.group.clone())
            .increment(1);
        self.phase.step_aside();
        self.stop_all(StopReason::Aside);
        // The workers' Redis calls could only time out (each after seconds, with retries):
        // past a short bound for the handlers in flight, the workers end where they are.
        let abandon: Vec<CancellationToken> = self
            .slots
            .values()
            .map(|s| s.flags.abandon.clone())
            .collect();
        tokio::spawn(async move {
            tokio::time::sleep(ABANDON_AFTER).await;
            abandon.iter().for_each(CancellationToken::cancel);
        });
    }

    /// Out of the group while the data Redis does not answer, once every worker stopped and
    /// no heartbeat is in flight: leaves the group (−1, static members too: the shards must
    /// move now); once the data Redis answers again, joins again owning nothing.
    async fn aside_progress(&mut self) {
        match self.phase {
            Phase::Aside { left: false } => {
                self.leave(true).await;
                self.phase = Phase::Aside { left: true };
                self.epoch = MemberEpoch::JOIN.get();
                self.assignment.clear();
                self.tokens.clear();
            }
            Phase::Aside { left: true } if self.shared.data_health.borrow().is_up() => {
                info!("the data Redis answers again: joining the group again");
                self.phase = Phase::Joining;
                self.next_heartbeat = Instant::now();
            }
            _ => {}
        }
    }

    fn send_heartbeat(&mut self) -> HeartbeatFuture {
        self.report_now = false;
        let owned: Vec<u32> = self.slots.keys().copied().collect();
        // Draining shards the worker found empty, drained for longer than the grace: checked
        // again in Redis right before the heartbeat goes out (see `drain`).
        let grace = self.shared.listener.settings.drain_grace;
        let candidates: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.stopping.is_none()
                    && s.flags.draining.load(Ordering::Relaxed)
                    && s.flags.drained.load(Ordering::Relaxed)
                    && s.draining_since.is_some_and(|t| t.elapsed() >= grace)
            })
            .map(|(k, _)| *k)
            .collect();
        let mut req = HeartbeatRequest {
            protocol_version: rsc_protocol::PROTOCOL_VERSION,
            member_id: self.shared.member_id.clone(),
            member_epoch: self.epoch,
            owned_shards: Some(owned),
            drained_shards: Vec::new(),
            client: Some(self.client_info.clone()),
            incarnation: if MemberEpoch::new(self.epoch).is_join() {
                self.shared.incarnation.clone()
            } else {
                None
            },
        };
        let timeout = match self.session {
            Some(session) => {
                (session / 3).clamp(Duration::from_millis(500), Duration::from_secs(10))
            }
            None => JOIN_TIMEOUT,
        };
        let heartbeats = self.heartbeats.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            if !candidates.is_empty() {
                req.drained_shards = confirm_drained(&shared, &candidates, timeout).await;
            }
            let epoch = req.member_epoch;
            // `sent_at`: when the request carrying it (alone or batched) was sent.
            let (sent_at, r) = heartbeats.heartbeat(&shared.group, req, timeout).await;
            (sent_at, epoch, r)
        })
    }

    fn answered(
        &mut self,
        sent_at: Instant,
        sent_epoch: i64,
        result: Result<HeartbeatResponse, CoordinatorError>,
    ) {
        let now = Instant::now();
        match result {
            Ok(resp) => self.accepted(sent_at, sent_epoch, resp, now),
            Err(e) => self.failed(e, now),
        }
        metrics::gauge!("rsc_client_owned_shards", "group" => self.shared.group.clone(),
            "member" => self.shared.member_id.clone())
        .set(self.slots.len() as f64);
    }

    /// A successful heartbeat: the member's epoch, the group's terms and the lease, the
    /// operator's pause, then the assignment (revoke before assign) and the next heartbeat.
    fn accepted(
        &mut self,
        sent_at: Instant,
        sent_epoch: i64,
        resp: HeartbeatResponse,
        now: Instant,
    ) {
        metrics::counter!("rsc_client_heartbeats_total", "group" => self.shared.group.clone(), "result" => "ok").increment(1);
        if self.failures > 0 {
            info!(failures = self.failures, url = %self.coord.current_url(), "coordinator reachable again");
        }
        self.failures = 0;
        self.in_use_until = None;
        self.backoff.reset();
        if MemberEpoch::new(sent_epoch).is_join() {
            info!(epoch = resp.member_epoch, assignment = ?resp.assignment, "joined the group");
        }
        self.phase.answered();
        self.renew(sent_at, &resp);
        if self.shared.pause.set_by_group(resp.paused) {
            info!(
                paused = resp.paused,
                "group {} by an operator",
                if resp.paused { "paused" } else { "resumed" }
            );
        }
        self.assignment = resp.assignment.into_iter().collect();
        self.tokens = resp.owner_tokens;
        self.shared.ordered.store(
            resp.ordering == rsc_protocol::OrderingMode::Key,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.hand_out_tokens();
        self.refused.clear();
        if self.reconcile() && self.revoking_since.is_none() {
            self.revoking_since = Some(sent_at);
        }
        self.next_heartbeat = if self.report_now {
            // A revocation finished while this heartbeat was in flight.
            now
        } else {
            // Batched: on the process-wide grid, with the other members.
            self.heartbeats
                .next_periodic(sent_at, self.interval)
                .max(now)
        };
    }

    /// Takes the group's terms from an answer, and renews the lease from the sending of the
    /// heartbeat it answers.
    fn renew(&mut self, sent_at: Instant, resp: &HeartbeatResponse) {
        self.epoch = resp.member_epoch;
        let session = Duration::from_millis(resp.session_timeout_ms);
        self.session = Some(session);
        self.interval = Duration::from_millis(resp.heartbeat_interval_ms.max(10));
        self.rebalance = Duration::from_millis(resp.rebalance_timeout_ms);
        self.start = resp.start;
        self.shard_count = resp.shard_count;
        let resumed = self.lease.renewed(sent_at, session);
        *self
            .shared
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = self.lease.deadline();
        if resumed {
            info!("heartbeat succeeded again: resuming");
        }
    }

    /// Strict fencing: gives each worker its shard's owner token from the last answer.
    fn hand_out_tokens(&self) {
        for (shard, slot) in &self.slots {
            // No tokens at all: lease fencing. A shard being revoked is not in the answer:
            // it keeps its token (still its own) while it finishes.
            if self.tokens.is_empty() || self.tokens.contains_key(shard) {
                slot.flags.set_token(self.tokens.get(shard).cloned());
            }
        }
    }

    fn failed(&mut self, e: CoordinatorError, now: Instant) {
        let result = e.code().map_or("transport", ErrorCode::as_str);
        metrics::counter!("rsc_client_heartbeats_total", "group" => self.shared.group.clone(), "result" => result).increment(1);
        match e.code() {
            Some(ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch) => {
                warn!(error = %e, "the coordinator no longer knows this member at this epoch: rejoining owning nothing");
                metrics::counter!("rsc_client_rejoins_total", "group" => self.shared.group.clone())
                    .increment(1);
                if self.fenced_too_often(now) {
                    error!(error = %e, member = %self.shared.member_id, fences = FENCE_LOOP_LIMIT,
                        "fenced {FENCE_LOOP_LIMIT} times within a minute: stopping rather than \
                         fence another process in a loop. Is another process using the same member id? \
                         (member ids are <instance>-<listener>-<index>; give each process its own \
                         POD_IP or POD_NAME, or ConsumerApp::builder().instance_id(..))");
                    self.phase.rejected(e);
                    self.stop_all(StopReason::Shutdown);
                    return;
                }
                self.start_rejoin();
                self.next_heartbeat = now;
            }
            Some(ErrorCode::GroupNotFound) => {
                error!(error = %e, "the group does not exist (create it with `rsc-coordinator group create`); retrying");
                self.start_rejoin();
                self.next_heartbeat = now + self.backoff.next_delay().max(self.interval);
            }
            Some(ErrorCode::MemberIdInUse) => self.id_in_use(e, now),
            Some(ErrorCode::GroupMaxSizeReached) => {
                warn!(error = %e, "the group is full; retrying");
                self.next_heartbeat = now + self.backoff.next_delay().max(self.interval);
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
                self.next_heartbeat = now + self.backoff.next_delay().min(self.interval);
            }
            _ => {
                error!(error = %e, "the coordinator refused this member; stopping it");
                self.phase.rejected(e);
                self.stop_all(StopReason::Shutdown);
            }
        }
    }

    /// A rejoin forced by the coordinator: several within a minute hint at a member id
    /// shared by two processes (one that names no incarnation, e.g. an older client, since
    /// the join of a second live process run is refused). `true` at [`FENCE_LOOP_LIMIT`].
    fn fenced_too_often(&mut self, now: Instant) -> bool {
        self.recent_fences.push_back(now);
        while self
            .recent_fences
            .front()
            .is_some_and(|t| now - *t > Duration::from_secs(60))
        {
            self.recent_fences.pop_front();
        }
        if self.recent_fences.len() >= 3 {
            warn!(member = %self.shared.member_id, fences = self.recent_fences.len(),
                "fenced again within a minute: is another process using the same member id?");
        }
        self.recent_fences.len() >= FENCE_LOOP_LIMIT
    }

    /// `MEMBER_ID_IN_USE`: another process run holds this member id. Either this pod came
    /// back after a crash (the old run's session has to run out first: the coordinator says
    /// when) or two live processes share an id (the holder keeps heartbeating, so the
    /// refusals outlast the first session end): then stop loudly, saying how to fix it.
    fn id_in_use(&mut self, e: CoordinatorError, now: Instant) {
        let wait = e.retry_after().unwrap_or(self.interval);
        let until = *self.in_use_until.get_or_insert(now + wait + IN_USE_MARGIN);
        if now > until {
            error!(error = %e, member = %self.shared.member_id,
                "another live process uses this member id; stopping. Member ids are \
                 <instance>-<listener>-<index>: give each process its own instance id \
                 (POD_IP or POD_NAME, or ConsumerApp::builder().instance_id(..))");
            self.phase.rejected(e);
            self.stop_all(StopReason::Shutdown);
            return;
        }
        warn!(error = %e, retry_in_ms = wait.as_millis() as u64,
            "member id held by another process run: retrying when its session runs out");
        self.next_heartbeat = now
            + (wait + Duration::from_millis(20))
                .clamp(Duration::from_millis(100), Duration::from_secs(5));
    }

    /// Forget the membership: stop every worker; the next heartbeat (once they stopped) joins
    /// with epoch 0 owning nothing.
    fn start_rejoin(&mut self) {
        self.phase.membership_lost();
        self.epoch = MemberEpoch::JOIN.get();
        self.assignment.clear();
        self.stop_all(StopReason::Rejoin);
    }

    /// Whether the lease ran out at `now` and the member has not fenced on it yet.
    fn lease_ran_out(&self, now: Instant) -> bool {
        self.lease.fence_deadline().is_some_and(|d| now >= d)
    }

    fn self_fence(&mut self) {
        warn!(
            session_timeout_ms = self.session.unwrap_or_default().as_millis() as u64,
            "no successful heartbeat within the lease: stopping every shard (self-fence)"
        );
        metrics::counter!("rsc_client_self_fenced_total", "group" => self.shared.group.clone())
            .increment(1);
        self.lease.lapse();
        self.phase.lease_ran_out();
        self.stop_all(StopReason::Fenced);
    }

    fn stop_all(&mut self, why: StopReason) {
        for slot in self.slots.values_mut() {
            if slot.stopping.is_none() {
                slot.stopping = Some(why);
                slot.stop.cancel();
            }
        }
    }

    /// Revoke what is no longer assigned, start what is newly assigned; `true` when it
    /// started revoking shards.
    fn reconcile(&mut self) -> bool {
        if !self.phase.can_work() {
            return false;
        }
        let mut revoked = Vec::new();
        let now = Instant::now();
        for (shard, slot) in &mut self.slots {
            slot.set_draining(*shard >= self.shard_count, now);
            if slot.stopping.is_none() && !self.assignment.contains(shard) {
                slot.stopping = Some(StopReason::Revoked);
                slot.stop.cancel();
                revoked.push(*shard);
            }
        }
        if !revoked.is_empty() {
            info!(shards = ?revoked, "revoking shards: finishing in-flight messages");
        }
        let revoking = !revoked.is_empty();
        let new: Vec<u32> = self
            .assignment
            .iter()
            .copied()
            .filter(|s| !self.slots.contains_key(s) && !self.refused.contains(s))
            .collect();
        for &shard in &new {
            self.spawn_worker(shard);
        }
        if !new.is_empty() {
            info!(shards = ?new, "starting shards");
            self.callback(true, new);
            // Report the shards as owned at once (as KIP-848 members acknowledge a new
            // assignment), so the group is stable a heartbeat interval sooner.
            self.next_heartbeat = Instant::now();
            self.report_now = true;
        }
        revoking
    }

    /// When this member stops waiting for the handler calls of the shards it revokes: the
    /// group's rebalance timeout, less a margin, after it was asked (PROTOCOL §5.3).
    fn revocation_deadline(&self) -> Option<Instant> {
        let since = self.revoking_since?;
        let waiting = self
            .slots
            .values()
            .any(|s| s.stopping == Some(StopReason::Revoked) && !s.flags.cut_short.is_cancelled());
        waiting.then(|| since + revocation_budget(self.rebalance, self.interval))
    }

    /// The revocation's deadline came: the workers of the revoked shards drop the handler
    /// calls still running (their entries stay pending for the next owner) and end, so that
    /// the member is not removed with every shard it owns.
    fn cut_revocation_short(&mut self) {
        self.revoking_since = None;
        let shards: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, s)| s.stopping == Some(StopReason::Revoked))
            .map(|(k, s)| {
                s.flags.cut_short.cancel();
                *k
            })
            .collect();
        warn!(
            ?shards,
            rebalance_timeout_ms = self.rebalance.as_millis() as u64,
            "revocation deadline: handlers still running on revoked shards are dropped \
             (their entries stay pending for the next owner) so that the member is not removed"
        );
        metrics::counter!("rsc_client_revocations_cut_short_total",
            "group" => self.shared.group.clone())
        .increment(1);
    }

    fn spawn_worker(&mut self, shard: u32) {
        let stop = CancellationToken::new();
        let flags = Arc::new(ShardFlags {
            stop: stop.clone(),
            token: std::sync::Mutex::new(self.tokens.get(&shard).cloned()),
            ..ShardFlags::default()
        });
        let worker = ShardWorker::new(
            self.shared.clone(),
            shard,
            self.start,
            stop.clone(),
            flags.clone(),
        );
        let handle = self.tasks.spawn(worker.run());
        self.task_shard.insert(handle.id(), shard);
        let mut slot = Slot {
            stop,
            flags,
            stopping: None,
            draining_since: None,
        };
        slot.set_draining(shard >= self.shard_count, Instant::now());
        self.slots.insert(shard, slot);
    }

    fn worker_exited(&mut self, id: Id, panic: Option<String>) {
        let Some(shard) = self.task_shard.remove(&id) else {
            return;
        };
        let Some(mut slot) = self.slots.remove(&shard) else {
            return;
        };
        if slot.stopping.is_none() && self.lease_ran_out(Instant::now()) {
            // The worker saw the lease run out (PROTOCOL §5.3) before the member's timer
            // fired: the member fences now, as it would have a moment later. Otherwise, with
            // its last worker gone, it would own nothing to fence and never say it stopped.
            self.self_fence();
            slot.stopping = Some(StopReason::Fenced);
        }
        self.callback(false, vec![shard]);
        if let Some(message) = panic {
            // A bug outside the handler (whose panics are failed attempts): stop loudly
            // rather than run on with a worker that may do it again.
            error!(shard, panic = %message, "shard worker panicked; stopping the member");
            self.phase.panicked(shard, message);
            self.stop_all(StopReason::Shutdown);
            return;
        }
        if slot.flags.refused.load(Ordering::Relaxed) {
            // Redis refused our owner token: the shard moved on. Report owning it no more, at
            // once; start it again only if the next answer still assigns it.
            warn!(shard, "shard dropped: fenced on the data path");
            metrics::counter!("rsc_client_fenced_shards_total", "group" => self.shared.group.clone())
                .increment(1);
            self.refused.insert(shard);
            self.next_heartbeat = Instant::now();
            self.report_now = true;
            return;
        }
        if !self
            .slots
            .values()
            .any(|s| s.stopping == Some(StopReason::Revoked))
        {
            self.revoking_since = None;
        }
        match slot.stopping {
            Some(StopReason::Revoked) => {
                info!(shard, "shard released");
                // Report the revocation at once rather than at the next interval.
                self.next_heartbeat = Instant::now();
                self.report_now = true;
            }
            Some(_) => {}
            None => warn!(shard, "shard worker exited on its own"),
        }
        // A shard given back while it was being revoked, or a worker that died: start again.
        if self.phase.can_work() && self.assignment.contains(&shard) && !self.shared.lease_expired()
        {
            self.spawn_worker(shard);
            self.callback(true, vec![shard]);
        }
    }

    fn callback(&self, assigned: bool, shards: Vec<u32>) {
        let l = &self.shared.listener;
        let cb = if assigned {
            &l.on_assigned
        } else {
            &l.on_revoked
        };
        if let Some(cb) = cb {
            cb(&Rebalance {
                group: self.shared.group.clone(),
                member_id: self.shared.member_id.clone(),
                stream: self.shared.stream.clone(),
                shards,
            });
        }
    }

    /// Leaves with epoch −1, or −2 for a static member unless `for_good` (a few attempts, on
    /// each coordinator URL in turn).
    async fn leave(&mut self, for_good: bool) {
        let Some(session) = self.session else {
            return;
        };
        let timeout = (session / 3).clamp(Duration::from_millis(500), Duration::from_secs(5));
        let (group, member) = (&self.shared.group, &self.shared.member_id);
        let incarnation = self.shared.incarnation.as_deref();
        for attempt in 1..=3 {
            let left = match incarnation {
                Some(inc) if self.shared.static_member && !for_good => {
                    self.coord.step_away(group, member, inc, timeout).await
                }
                _ => self.coord.leave(group, member, incarnation, timeout).await,
            };
            match left {
                Ok(()) if self.shared.static_member && !for_good => {
                    info!(
                        "left the group for a restart (static member): the shards wait for this id"
                    );
                    return;
                }
                Ok(()) => {
                    info!("left the group");
                    return;
                }
                Err(e) if e.code() == Some(ErrorCode::UnknownMemberId) => return,
                Err(e) if e.is_retriable() && attempt < 3 => {
                    warn!(error = %e, "leave failed; retrying");
                    tokio::time::sleep(self.backoff.next_delay()).await;
                }
                Err(e) => {
                    warn!(error = %e, "could not leave the group: it will expire the member after the session timeout");
                    return;
                }
            }
        }
    }
}

/// The candidates that are still drained now, per the data Redis (see [`super::drain`]).
/// A shard that cannot be checked in time is not reported: it is checked again next time.
async fn confirm_drained(shared: &MemberShared, candidates: &[u32], timeout: Duration) -> Vec<u32> {
    let mut conn = shared.ack_conn.clone();
    let check = async {
        let mut drained = Vec::new();
        for &shard in candidates {
            let key = rsc_protocol::routing::shard_key(&shared.stream, shard);
            match drain_state(&mut conn, &key, &shared.group).await {
                Ok(state) if state.is_drained() => drained.push(shard),
                Ok(state) => {
                    debug!(
                        shard,
                        ?state,
                        "draining shard got new entries: keeps reading it"
                    );
                }
                Err(e) => {
                    warn!(shard, error = %e, "cannot check whether the draining shard is drained")
                }
            }
        }
        drained
    };
    match tokio::time::timeout(timeout, check).await {
        Ok(drained) => {
            if !drained.is_empty() {
                info!(shards = ?drained, "reporting drained shards");
            }
            drained
        }
        Err(_) => {
            warn!("drain check timed out: not reporting drained shards this time");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revocation_deadline_leaves_a_margin_before_the_rebalance_timeout() {
        let ms = Duration::from_millis;
        // Defaults: 60 s rebalance, 3 s heartbeats → a tenth of it (6 s) as margin.
        assert_eq!(revocation_budget(ms(60_000), ms(3_000)), ms(54_000));
        // Short timeouts: at least two heartbeat intervals.
        assert_eq!(revocation_budget(ms(3_000), ms(300)), ms(2_400));
        // Never more than half of the timeout.
        assert_eq!(revocation_budget(ms(1_000), ms(1_000)), ms(500));
        assert_eq!(revocation_budget(ms(0), ms(300)), ms(0));
    }

    #[tokio::test]
    async fn a_revocation_is_cut_short_only_while_shards_are_revoked() {
        let mut m = member();
        assert_eq!(m.revocation_deadline(), None);
        let since = Instant::now();
        m.revoking_since = Some(since);
        assert_eq!(m.revocation_deadline(), None, "nothing being revoked");
        let flags = Arc::new(ShardFlags::default());
        m.slots.insert(
            3,
            Slot {
                stop: CancellationToken::new(),
                flags: flags.clone(),
                stopping: Some(StopReason::Revoked),
                draining_since: None,
            },
        );
        assert_eq!(
            m.revocation_deadline(),
            Some(since + revocation_budget(m.rebalance, m.interval))
        );
        m.cut_revocation_short();
        assert!(flags.cut_short.is_cancelled());
        assert_eq!(m.revoking_since, None);
        assert_eq!(m.revocation_deadline(), None, "cut short once");
    }

    fn rejection() -> CoordinatorError {
        CoordinatorError::Unexpected {
            url: "http://coordinator".into(),
            status: 400,
            body: "refused".into(),
        }
    }

    fn standing(phase: &Phase) -> Option<&Standing> {
        match phase {
            Phase::Leaving { standing, .. } => Some(standing),
            _ => None,
        }
    }

    fn member() -> MemberRuntime {
        let listener = crate::Listener::new("g", "s", |_msg: crate::Message<crate::Raw>| async {
            Ok::<_, std::convert::Infallible>(())
        });
        let coord = CoordinatorClient::builder(["http://127.0.0.1:1"])
            .build()
            .expect("a valid URL");
        let heartbeats = Heartbeats::single(coord.clone());
        MemberRuntime::new(
            MemberShared::for_tests(listener),
            coord,
            heartbeats,
            ClientInfo::default(),
        )
    }

    /// A worker that exits by itself on seeing the lease run out (before the member's own
    /// timer fires) still fences the member: its other workers stop and it says so.
    #[tokio::test(start_paused = true)]
    async fn a_worker_that_saw_the_lease_run_out_fences_the_member() {
        let mut m = member();
        m.phase = Phase::Stable;
        let session = Duration::from_millis(1_000);
        m.lease.renewed(Instant::now(), session);
        let fake_worker = |m: &mut MemberRuntime, shard: u32| {
            let handle = m.tasks.spawn(async move { shard });
            m.task_shard.insert(handle.id(), shard);
            let stop = CancellationToken::new();
            let flags = Arc::new(ShardFlags::default());
            let slot = Slot {
                stop,
                flags,
                stopping: None,
                draining_since: None,
            };
            m.slots.insert(shard, slot);
            handle.id()
        };
        let (first, second) = (fake_worker(&mut m, 0), fake_worker(&mut m, 1));

        // Before the deadline, a worker exiting on its own does not fence the member.
        m.worker_exited(first, None);
        assert!(matches!(m.phase, Phase::Stable));
        assert!(m.lease_ran_out(Instant::now() + session));

        tokio::time::advance(session).await;
        m.worker_exited(second, None);
        assert!(
            matches!(m.phase, Phase::Fenced),
            "fenced when the lease ran out"
        );
        assert!(!m.lease_ran_out(Instant::now()), "once per lease");
    }

    fn member_with_health(
        health: tokio::sync::watch::Receiver<super::super::health::DataRedis>,
    ) -> MemberRuntime {
        let listener = crate::Listener::new("g", "s", |_msg: crate::Message<crate::Raw>| async {
            Ok::<_, std::convert::Infallible>(())
        });
        let coord = CoordinatorClient::builder(["http://127.0.0.1:1"])
            .build()
            .expect("a valid URL");
        MemberRuntime::new(
            MemberShared::for_tests_with_health(listener, health),
            coord.clone(),
            Heartbeats::single(coord),
            ClientInfo::default(),
        )
    }

    /// No join while the data Redis does not answer; a member in the group whose data Redis
    /// stays unreachable past the grace stops its workers, leaves, and joins again (owning
    /// nothing) once it answers.
    #[tokio::test(start_paused = true)]
    async fn a_member_without_its_data_redis_stays_out_of_the_group_until_it_answers() {
        use super::super::health::DataRedis;
        let down = || DataRedis::Down {
            since: Instant::now(),
            error: "refused".into(),
        };
        let (tx, rx) = tokio::sync::watch::channel(DataRedis::Unknown);
        let mut m = member_with_health(rx);
        assert!(!m.may_join(), "not before the first answer");
        tx.send_replace(down());
        assert!(
            !m.may_join() && m.aside_deadline().is_none(),
            "not a member yet"
        );
        tx.send_replace(DataRedis::Up);
        assert!(m.may_join());

        m.phase = Phase::Stable;
        m.epoch = 4;
        let grace = m.shared.data_redis_grace;
        tx.send_replace(down());
        assert_eq!(m.aside_deadline(), Some(Instant::now() + grace));
        assert!(m.may_join(), "a member heartbeats on through the grace");
        tokio::time::advance(grace).await;
        m.give_shards_back();
        assert!(matches!(m.phase, Phase::Aside { left: false }));
        assert!(
            m.phase.may_heartbeat(false),
            "keeps its lease while workers stop"
        );
        assert!(!m.phase.can_work() && m.aside_deadline().is_none());
        m.phase.answered();
        assert!(
            matches!(m.phase, Phase::Aside { left: false }),
            "an answer keeps it aside"
        );

        m.aside_progress().await; // every worker stopped: leaves
        assert!(matches!(m.phase, Phase::Aside { left: true }) && m.epoch == 0);
        assert!(!m.phase.may_heartbeat(true));
        m.aside_progress().await;
        assert!(
            matches!(m.phase, Phase::Aside { left: true }),
            "still down: stays out"
        );
        tx.send_replace(DataRedis::Up);
        m.aside_progress().await;
        assert!(matches!(m.phase, Phase::Joining) && m.may_join());
    }

    #[test]
    fn an_aside_member_forgotten_or_shut_down_does_not_heartbeat_for_its_old_membership() {
        let mut p = Phase::Stable;
        p.step_aside();
        p.membership_lost();
        assert!(matches!(p, Phase::Aside { left: true }));
        p.shut_down();
        assert!(matches!(standing(&p), Some(Standing::Forgotten)));
        let mut p = Phase::Fenced;
        p.step_aside();
        p.shut_down();
        assert!(
            matches!(standing(&p), Some(Standing::Member)),
            "leaves as it would have"
        );
        let mut p = Phase::Joining;
        p.step_aside();
        assert!(
            matches!(p, Phase::Joining),
            "owns nothing: nothing to give back"
        );
    }

    #[test]
    fn a_member_works_only_once_an_answer_made_it_stable() {
        let mut p = Phase::Joining;
        assert!(!p.can_work() && p.may_heartbeat(true));
        p.lease_ran_out(); // nothing owned yet: nothing to fence
        assert!(matches!(p, Phase::Joining));
        p.answered();
        assert!(matches!(p, Phase::Stable) && p.can_work() && p.may_heartbeat(false));
    }

    #[test]
    fn self_fence_stops_work_until_an_answer_resumes_it() {
        let mut p = Phase::Stable;
        p.lease_ran_out();
        assert!(matches!(p, Phase::Fenced));
        // Fenced, it keeps heartbeating (with its workers stopping) to get the lease back.
        assert!(!p.can_work() && p.may_heartbeat(false));
        p.answered();
        assert!(matches!(p, Phase::Stable));
    }

    #[test]
    fn a_rejoin_waits_for_every_worker_then_joins_owning_nothing() {
        for mut p in [Phase::Joining, Phase::Stable, Phase::Fenced] {
            p.membership_lost();
            assert!(matches!(p, Phase::Rejoining));
            assert!(!p.can_work());
            assert!(!p.may_heartbeat(false), "not while workers still stop");
            assert!(p.may_heartbeat(true));
            p.lease_ran_out();
            assert!(matches!(p, Phase::Rejoining));
            p.answered();
            assert!(matches!(p, Phase::Stable));
        }
    }

    #[test]
    fn leaving_heartbeats_until_the_workers_stopped_and_nothing_brings_it_back() {
        let mut p = Phase::Fenced;
        p.shut_down();
        assert!(matches!(standing(&p), Some(Standing::Member)));
        assert!(!p.can_work() && p.may_heartbeat(false));
        p.answered();
        p.lease_ran_out();
        p.shut_down();
        assert!(matches!(standing(&p), Some(Standing::Member)));
        // Forgotten while leaving: no join (it would report shards still stopping).
        p.membership_lost();
        assert!(matches!(standing(&p), Some(Standing::Forgotten)));
        assert!(!p.may_heartbeat(false));
        p.answered();
        assert!(p.is_leaving());
        let mut rejoining = Phase::Rejoining;
        rejoining.shut_down();
        assert!(matches!(standing(&rejoining), Some(Standing::Forgotten)));
    }

    #[test]
    fn a_rejected_member_stops_heartbeating_and_the_first_panic_is_reported() {
        let mut p = Phase::Stable;
        p.rejected(rejection());
        assert!(matches!(standing(&p), Some(Standing::Rejected(_))));
        assert!(!p.may_heartbeat(true));
        p.panicked(3, "first".into());
        p.panicked(4, "second".into());
        assert!(matches!(standing(&p), Some(Standing::Rejected(_))));
        let Phase::Leaving { panicked, .. } = &p else {
            panic!("leaving")
        };
        assert_eq!(panicked.as_ref(), Some(&(3, "first".to_owned())));
        let mut p = Phase::Joining;
        p.panicked(1, "boom".into());
        assert!(matches!(standing(&p), Some(Standing::Member)) && p.may_heartbeat(false));
    }
}
