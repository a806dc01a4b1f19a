//! The member's driver: the one task that owns a member's [`Member`] machine and does its
//! I/O. It never waits on a handler: it multiplexes the machine's deadline, the heartbeat in
//! flight, shard workers finishing, the data Redis' health, the wake-up channel and the
//! shutdown signal, and carries out each [`Step`] (heartbeats on the coordinator, shard
//! workers as tasks, the listener's callbacks, the leave). Handlers run in the workers' tasks.

use super::machine::{Beat, Config, Event, Member, Start, Step};
use super::phase::Exit;
use crate::consumer::MemberShared;
use crate::consumer::backoff::Backoff;
use crate::consumer::heartbeats::Heartbeats;
use crate::consumer::worker::{ShardFlags, ShardWorker};
use crate::error::ClientError;
use crate::listener::Rebalance;
use futures::future::{BoxFuture, Fuse, FusedFuture, FutureExt};
use rsc_api::CoordinatorClient;
use rsc_protocol::{ClientInfo, ErrorCode, HeartbeatRequest, MemberEpoch, OrderingMode};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// One member of a group: `<instance>-<listener>-<index>`.
pub(crate) struct MemberRuntime {
    shared: Arc<MemberShared>,
    coord: CoordinatorClient,
    heartbeats: Heartbeats,
    client_info: ClientInfo,
    /// Signalled by the app's wake-up channel: the coordinator changed what this member must
    /// do; heartbeat now rather than at the interval.
    wake: Option<Arc<tokio::sync::Notify>>,
    /// The running shard workers: their tasks, and each shard's stop signal and flags.
    tasks: JoinSet<u32>,
    task_shard: HashMap<Id, u32>,
    flags: BTreeMap<u32, Arc<ShardFlags>>,
}

impl MemberRuntime {
    /// A member that heartbeats at once whenever `wake` is notified (the wake-up channel).
    pub(crate) fn new(
        shared: Arc<MemberShared>,
        coord: CoordinatorClient,
        heartbeats: Heartbeats,
        client_info: ClientInfo,
        wake: Option<Arc<tokio::sync::Notify>>,
    ) -> Self {
        MemberRuntime {
            shared,
            coord,
            heartbeats,
            client_info,
            wake,
            tasks: JoinSet::new(),
            task_shard: HashMap::new(),
            flags: BTreeMap::new(),
        }
    }

    /// Runs until `shutdown` is cancelled (then leaves the group) or a fatal refusal.
    #[tracing::instrument(name = "member", skip_all, fields(group = %self.shared.group, member = %self.shared.member_id))]
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), ClientError> {
        let cfg = Config {
            group: self.shared.group.clone(),
            member_id: self.shared.member_id.clone(),
            drain_grace: self.shared.listener.settings.drain_grace,
            data_redis_grace: self.shared.data_redis_grace,
            grid: self.heartbeats.grid(),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
        };
        let mut m = Member::new(cfg, Instant::now());
        let wake = self.wake.clone();
        // The heartbeat in flight: its answer, for the machine.
        let mut inflight: Fuse<BoxFuture<'static, Event>> = Fuse::terminated();
        let mut health = self.shared.data_health.clone();
        let mut health_watched = true;
        let first = Event::DataRedis(health.borrow().clone());
        let mut steps: VecDeque<Step> = m.handle(first, Instant::now()).into();
        loop {
            while let Some(step) = steps.pop_front() {
                match step {
                    Step::Heartbeat(beat) => inflight = self.send_heartbeat(beat).fuse(),
                    Step::Leave => {
                        self.leave(true, m.session()).await;
                        steps.extend(m.handle(Event::Left, Instant::now()));
                    }
                    Step::Exit(exit) => return self.finish(exit, m.session()).await,
                    step => self.carry_out(step),
                }
            }
            // Readiness: a member in good standing (not joining, fenced, aside or leaving).
            (self.shared.joined).store(m.is_member(), Relaxed);
            let deadline = m.deadline();
            let event = tokio::select! {
                _ = shutdown.cancelled(), if !m.is_leaving() => Some(Event::Shutdown),
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => self.worker_exited(joined),
                answered = &mut inflight, if !inflight.is_terminated() => Some(answered),
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => Some(Event::Tick),
                // The data Redis' health changed: the machine looks again (join, step aside, return).
                changed = health.changed(), if health_watched => {
                    health_watched = changed.is_ok();
                    Some(Event::DataRedis(health.borrow().clone()))
                }
                _ = async { wake.as_ref().expect("guarded").notified().await }, if wake.is_some() && m.wakeable() => Some(Event::Woken),
            };
            if let Some(event) = event {
                steps.extend(m.handle(event, Instant::now()));
            }
            // Workers start no entry past the lease, even before the member's timer fires.
            *(self.shared.lease_until.lock()).unwrap_or_else(std::sync::PoisonError::into_inner) =
                m.lease_deadline();
        }
    }

    /// Does what a step asks of the workers and the listener.
    fn carry_out(&mut self, step: Step) {
        let (l, map) = (&self.shared.listener, &self.flags);
        // The flags of these shards' workers.
        let of = |shards: Vec<u32>| shards.into_iter().filter_map(move |s| map.get(&s));
        match step {
            Step::Start(start) => self.spawn_worker(start),
            Step::Stop(s) => of(vec![s]).for_each(|f| f.stop.cancel()),
            Step::Draining(s, on) => of(vec![s]).for_each(|f| f.draining.store(on, Relaxed)),
            Step::Token(s, token) => of(vec![s]).for_each(|f| f.set_token(token.clone())),
            Step::CutShort(shards) => of(shards).for_each(|f| f.cut_short.cancel()),
            Step::Abandon(shards) => of(shards).for_each(|f| f.abandon.cancel()),
            Step::Assigned(shards) => self.callback(l.on_assigned.as_deref(), shards),
            Step::Released(shard) => self.callback(l.on_revoked.as_deref(), vec![shard]),
            Step::Heartbeat(_) | Step::Leave | Step::Exit(_) => unreachable!("done by the loop"),
        }
    }

    /// Once every worker stopped while leaving: leaves the group, or reports why not.
    async fn finish(self, exit: Exit, session: Option<Duration>) -> Result<(), ClientError> {
        (self.shared.joined).store(false, Relaxed);
        let (group, member) = (self.shared.group.clone(), self.shared.member_id.clone());
        Err(match exit {
            Exit::Leave => {
                self.leave(false, session).await;
                return Ok(());
            }
            Exit::Panicked(shard, message) => ClientError::Panicked {
                group,
                member,
                shard: Some(shard),
                message,
            },
            Exit::Rejected(source) => ClientError::MemberRejected {
                group,
                member,
                source,
            },
        })
    }

    fn send_heartbeat(&self, beat: Beat) -> BoxFuture<'static, Event> {
        // Draining shards the worker found empty, drained for longer than the grace: checked
        // again in Redis right before the heartbeat goes out (see `drain`).
        let mut candidates = beat.drain_candidates;
        candidates.retain(|s| (self.flags.get(s)).is_some_and(|f| f.drained.load(Relaxed)));
        let mut req = HeartbeatRequest {
            protocol_version: rsc_protocol::PROTOCOL_VERSION,
            member_id: self.shared.member_id.clone(),
            member_epoch: beat.epoch,
            owned_shards: Some(beat.owned),
            drained_shards: Vec::new(),
            client: Some(self.client_info.clone()),
            // A join names the process run.
            incarnation: (self.shared.incarnation.clone())
                .filter(|_| MemberEpoch::new(beat.epoch).is_join()),
        };
        let (heartbeats, shared) = (self.heartbeats.clone(), self.shared.clone());
        let (epoch, timeout) = (beat.epoch, beat.timeout);
        Box::pin(async move {
            if !candidates.is_empty() {
                req.drained_shards = confirm_drained(&shared, &candidates, timeout).await;
            }
            // `sent_at`: when the request carrying it (alone or batched) was sent.
            let (sent_at, r) = heartbeats.heartbeat(&shared.group, req, timeout).await;
            // What every worker of the group needs from an answer before the machine starts
            // any: the operator's pause and the group's ordering.
            if let Ok(resp) = &r {
                if shared.pause.set_by_group(resp.paused) {
                    let what = if resp.paused { "paused" } else { "resumed" };
                    info!(paused = resp.paused, "group {what} by an operator");
                }
                (shared.ordered).store(resp.ordering == OrderingMode::Key, Relaxed);
            }
            Event::Answered(sent_at, epoch, r)
        })
    }

    fn spawn_worker(&mut self, s: Start) {
        let stop = CancellationToken::new();
        let flags = Arc::new(ShardFlags {
            stop: stop.clone(),
            token: std::sync::Mutex::new(s.token),
            draining: s.draining.into(),
            ..ShardFlags::default()
        });
        let worker = ShardWorker::new(self.shared.clone(), s.shard, s.start, stop, flags.clone());
        let handle = self.tasks.spawn(worker.run());
        self.task_shard.insert(handle.id(), s.shard);
        self.flags.insert(s.shard, flags);
    }

    /// A worker's task ended: what the machine is told (nothing for a task it never knew).
    fn worker_exited(&mut self, joined: Result<(Id, u32), JoinError>) -> Option<Event> {
        let id = joined.as_ref().map_or_else(JoinError::id, |(id, _)| *id);
        let panic = joined.err().and_then(|e| e.try_into_panic().ok());
        let shard = self.task_shard.remove(&id)?;
        let refused = self.flags.remove(&shard)?.refused.load(Relaxed);
        let panic = panic.map(|p| crate::handler::panic_text(p.as_ref()));
        Some(Event::WorkerExited(shard, panic, refused))
    }

    /// Calls the listener's callback `cb`, if it has one, with `shards`.
    fn callback<F: Fn(&Rebalance) + ?Sized>(&self, cb: Option<&F>, shards: Vec<u32>) {
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
    /// each coordinator URL in turn). Nothing to leave before the first answer (`session`).
    async fn leave(&self, for_good: bool, session: Option<Duration>) {
        let Some(session) = session else { return };
        let timeout = (session / 3).clamp(Duration::from_millis(500), Duration::from_secs(5));
        let (group, member) = (&self.shared.group, &self.shared.member_id);
        let incarnation = self.shared.incarnation.as_deref();
        let step_away = self.shared.static_member && !for_good;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for attempt in 1..=3 {
            let left = match incarnation {
                Some(inc) if step_away => self.coord.step_away(group, member, inc, timeout).await,
                _ => self.coord.leave(group, member, incarnation, timeout).await,
            };
            match left {
                Ok(()) if step_away => info!(
                    "left the group for a restart (static member): \
                     the shards wait for this id"
                ),
                Ok(()) => info!("left the group"),
                Err(e) if e.code() == Some(ErrorCode::UnknownMemberId) => {}
                Err(e) if e.is_retriable() && attempt < 3 => {
                    warn!(error = %e, "leave failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, "could not leave the group: it will expire the member after the session timeout")
                }
            }
            return;
        }
    }
}

/// The candidates that are still drained now, per the data Redis (see [`crate::consumer::drain`]).
/// A shard that cannot be checked in time is not reported: it is checked again next time.
async fn confirm_drained(shared: &MemberShared, candidates: &[u32], timeout: Duration) -> Vec<u32> {
    let mut conn = shared.ack_conn.clone();
    let check = async {
        let mut drained = Vec::new();
        for &shard in candidates {
            let key = rsc_protocol::routing::shard_key(&shared.stream, shard);
            match crate::consumer::drain::drain_state(&mut conn, &key, &shared.group).await {
                Ok(state) if state.is_drained() => drained.push(shard),
                Ok(state) => debug!(
                    shard,
                    ?state,
                    "draining shard got new entries: keeps reading it"
                ),
                Err(e) => {
                    warn!(shard, error = %e, "cannot check whether the draining shard is drained")
                }
            }
        }
        drained
    };
    let Ok(drained) = tokio::time::timeout(timeout, check).await else {
        warn!("drain check timed out: not reporting drained shards this time");
        return Vec::new();
    };
    if !drained.is_empty() {
        info!(shards = ?drained, "reporting drained shards");
    }
    drained
}
