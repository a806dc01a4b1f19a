//! Unit and property tests of the member's machine (no coordinator, no Redis, no runtime: the
//! clock is an instant the test moves).

use super::*;
use crate::consumer::backoff::Backoff;
use proptest::prelude::*;
use std::collections::BTreeSet;

const SESSION_MS: u64 = 1_000;

fn cfg() -> Config {
    Config {
        group: "g".into(),
        member_id: "m".into(),
        drain_grace: Duration::from_millis(500),
        data_redis_grace: Duration::from_secs(15),
        grid: None,
        backoff: Backoff::seeded(Duration::from_millis(10), Duration::from_millis(200), 7),
    }
}

fn answer(epoch: i64, assignment: &[u32]) -> HeartbeatResponse {
    HeartbeatResponse {
        member_id: "m".into(),
        member_epoch: epoch,
        heartbeat_interval_ms: 100,
        session_timeout_ms: SESSION_MS,
        assignment: assignment.to_vec(),
        stream: "s".into(),
        shard_count: 8,
        routing_epoch: 1,
        start: StartPosition::Earliest,
        owner_tokens: BTreeMap::new(),
        ordering: Default::default(),
        paused: false,
        rebalance_timeout_ms: 2_000,
    }
}

fn api_error(code: ErrorCode) -> CoordinatorError {
    CoordinatorError::Api {
        url: "http://coordinator".into(),
        status: 409,
        code,
        message: "no".into(),
        retry_after_ms: None,
    }
}

fn unavailable() -> CoordinatorError {
    CoordinatorError::Unexpected {
        url: "http://coordinator".into(),
        status: 503,
        body: "unavailable".into(),
    }
}

fn up() -> Event {
    Event::DataRedis(DataRedis::Up)
}

fn down(since: Instant) -> Event {
    let error = "unreachable".into();
    Event::DataRedis(DataRedis::Down { since, error })
}

fn beat(steps: &[Step]) -> Option<&Beat> {
    steps.iter().find_map(|s| match s {
        Step::Heartbeat(b) => Some(b),
        _ => None,
    })
}

fn started(steps: &[Step]) -> Vec<u32> {
    (steps.iter())
        .filter_map(|s| match s {
            Step::Start(Start { shard, .. }) => Some(*shard),
            _ => None,
        })
        .collect()
}

fn stopped(steps: &[Step]) -> Vec<u32> {
    (steps.iter())
        .filter_map(|s| match s {
            Step::Stop(shard) => Some(*shard),
            _ => None,
        })
        .collect()
}

/// A member that joined at `t0` and was given `assignment` (its workers started).
fn joined(t0: Instant, assignment: &[u32]) -> Member {
    let mut m = Member::new(cfg(), t0);
    let steps = m.handle(up(), t0);
    assert_eq!(beat(&steps).map(|b| b.epoch), Some(0), "joins at once");
    let result = Ok(answer(1, assignment));
    let steps = m.handle(Event::Answered(t0, 0, result), t0);
    assert_eq!(started(&steps), assignment);
    assert_eq!(
        beat(&steps).map(|b| b.owned.clone()),
        Some(assignment.to_vec())
    );
    m
}

fn answered(m: &mut Member, at: Instant, epoch: i64, assignment: &[u32]) -> Vec<Step> {
    let result = Ok(answer(epoch, assignment));
    m.handle(Event::Answered(at, epoch, result), at)
}

fn exited(m: &mut Member, shard: u32, at: Instant) -> Vec<Step> {
    let e = Event::WorkerExited(shard, None, false);
    m.handle(e, at)
}

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

#[test]
fn no_join_before_the_data_redis_answers() {
    let t0 = Instant::now();
    let mut m = Member::new(cfg(), t0);
    assert!(m.handle(Event::Tick, t0).is_empty());
    assert_eq!(m.deadline(), None);
    let steps = m.handle(up(), t0);
    assert!(matches!(
        &steps[..],
        [Step::Heartbeat(Beat { epoch: 0, .. })]
    ));
}

/// Revoke before assign, on the member's side: a revoked shard is stopped, reported as owned
/// until its worker ended, then reported gone at once.
#[test]
fn a_revoked_shard_is_reported_until_its_worker_ended() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[1, 2]);
    let t1 = t0 + Duration::from_millis(100);
    let steps = answered(&mut m, t1, 1, &[2]);
    assert_eq!(stopped(&steps), [1]);
    assert!(started(&steps).is_empty());
    let t2 = t1 + Duration::from_millis(100);
    let steps = answered(&mut m, t2, 1, &[2]);
    assert!(stopped(&steps).is_empty(), "stopped once");
    let steps = m.handle(Event::Tick, t2 + Duration::from_millis(100));
    assert_eq!(beat(&steps).map(|b| b.owned.clone()), Some(vec![1, 2]));
    let t3 = t2 + Duration::from_millis(150);
    answered(&mut m, t3, 1, &[2]);
    let steps = exited(&mut m, 1, t3);
    assert!(matches!(steps[0], Step::Released(1)));
    assert_eq!(
        beat(&steps).map(|b| b.owned.clone()),
        Some(vec![2]),
        "at once"
    );
}

#[test]
fn the_lease_running_out_without_an_answer_stops_every_worker() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[0, 3]);
    let deadline = m.lease_deadline().expect("a lease");
    assert_eq!(deadline, t0 + Duration::from_millis(SESSION_MS * 4 / 5));
    // The heartbeats go unanswered.
    let steps = m.handle(Event::Tick, deadline - Duration::from_millis(1));
    assert!(stopped(&steps).is_empty());
    let steps = m.handle(Event::Tick, deadline);
    assert_eq!(stopped(&steps), [0, 3]);
    assert!(!m.is_member());
    // A late success resumes with what it assigns, once the workers ended.
    let late = deadline + Duration::from_millis(50);
    m.handle(Event::Answered(late, 1, Err(unavailable())), late);
    exited(&mut m, 0, late);
    exited(&mut m, 3, late);
    let steps = answered(&mut m, late, 1, &[0]);
    assert_eq!(started(&steps), [0]);
    assert!(m.is_member());
}

/// A worker that exits by itself on seeing the lease run out (before the member's own timer
/// fires) still fences the member: its other workers stop and it says so.
#[test]
fn a_worker_that_saw_the_lease_run_out_fences_the_member() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[0, 1]);
    let deadline = m.lease_deadline().expect("a lease");
    // Before the deadline, a worker exiting on its own does not fence the member (it is
    // started again).
    let steps = exited(&mut m, 0, t0 + Duration::from_millis(1));
    assert_eq!(started(&steps), [0]);
    assert!(m.is_member());
    let steps = exited(&mut m, 1, deadline);
    assert_eq!(stopped(&steps), [0], "fenced when the lease ran out");
    assert!(!m.is_member() && started(&steps).is_empty());
    assert_eq!(m.fence_deadline(), None, "once per lease");
}

#[test]
fn a_revocation_is_cut_short_only_while_shards_are_revoked() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[1, 2]);
    assert_eq!(m.revocation_deadline(), None);
    let t1 = t0 + Duration::from_millis(50);
    answered(&mut m, t1, 1, &[2]);
    // 2 s rebalance, 100 ms heartbeats: a margin of 200 ms (a tenth).
    let cut = t1 + Duration::from_millis(1_800);
    assert_eq!(m.revocation_deadline(), Some(cut));
    // Heartbeats keep the lease while the handler runs.
    let (mut t, mut cuts) = (t1, Vec::new());
    while t < cut + Duration::from_millis(500) {
        t += Duration::from_millis(50);
        let steps = m.handle(Event::Tick, t);
        if beat(&steps).is_some() {
            answered(&mut m, t, 1, &[2]);
        }
        cuts.extend(steps.into_iter().filter_map(|s| match s {
            Step::CutShort(v) => Some((t, v)),
            _ => None,
        }));
    }
    assert_eq!(cuts, [(cut, vec![1])]);
    assert_eq!(m.revocation_deadline(), None, "cut short once");
}

/// No join while the data Redis does not answer; a member in the group whose data Redis
/// stays unreachable past the grace stops its workers, leaves, and joins again (owning
/// nothing) once it answers.
#[test]
fn a_member_without_its_data_redis_stays_out_of_the_group_until_it_answers() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[4]);
    answered(&mut m, t0, 1, &[4]);
    m.cfg.data_redis_grace = Duration::from_millis(500);
    let grace = m.cfg.data_redis_grace;
    m.handle(down(t0), t0);
    assert_eq!(m.aside_deadline(), Some(t0 + grace));
    let at = t0 + grace;
    let steps = m.handle(Event::Tick, at);
    assert_eq!(stopped(&steps), [4]);
    assert!(!m.is_member() && m.aside_deadline().is_none());
    // Keeps its lease while the worker stops.
    let sent = beat(&steps).expect("heartbeats meanwhile").epoch;
    let steps = answered(&mut m, at, sent, &[4]);
    assert!(started(&steps).is_empty(), "an answer keeps it aside");
    let steps = exited(&mut m, 4, at);
    assert!(matches!(steps.last(), Some(Step::Leave)), "{steps:?}");
    assert_eq!(m.deadline(), None, "waits for the leave");
    let abandon = at + Duration::from_secs(2);
    assert!(
        m.handle(Event::Left, abandon)
            .iter()
            .all(|s| !matches!(s, Step::Heartbeat(_)))
    );
    assert_eq!(m.epoch, 0);
    let steps = m.handle(up(), abandon);
    assert!(
        matches!(&steps[..], [Step::Heartbeat(Beat { epoch: 0, owned, .. })] if owned.is_empty())
    );
}

#[test]
fn shutdown_finishes_the_workers_then_leaves() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[0]);
    let steps = m.handle(Event::Shutdown, t0);
    assert_eq!(stopped(&steps), [0]);
    answered(&mut m, t0, 1, &[0]);
    let steps = exited(&mut m, 0, t0);
    assert!(
        matches!(steps.last(), Some(Step::Exit(Exit::Leave))),
        "{steps:?}"
    );
    assert!(m.handle(Event::Tick, t0).is_empty() && m.deadline().is_none());
}

#[test]
fn a_fenced_member_rejoins_owning_nothing_once_its_workers_ended() {
    let t0 = Instant::now();
    let mut m = joined(t0, &[5]);
    m.handle(Event::Tick, t0 + Duration::from_millis(100));
    let result = Err(api_error(ErrorCode::FencedMemberEpoch));
    let steps = m.handle(Event::Answered(t0, 1, result), t0);
    assert_eq!(stopped(&steps), [5]);
    assert!(beat(&steps).is_none(), "not while its worker runs");
    let steps = exited(&mut m, 5, t0);
    assert!(matches!(beat(&steps), Some(Beat { epoch: 0, owned, .. }) if owned.is_empty()));
}

/// One choice of the property test's world.
#[derive(Debug, Clone)]
enum Choice {
    Wait(u64),
    Answer(Vec<u32>),
    Fail(u8),
    Exit(usize, bool),
    Shutdown,
    Woken,
    Health(bool),
}

fn choice() -> impl Strategy<Value = Choice> {
    prop_oneof![
        4 => (1u64..400).prop_map(Choice::Wait),
        4 => prop::collection::vec(0u32..6, 0..4).prop_map(Choice::Answer),
        2 => (0u8..6).prop_map(Choice::Fail),
        3 => (0usize..6, prop::bool::weighted(0.1)).prop_map(|(i, r)| Choice::Exit(i, r)),
        1 => Just(Choice::Woken),
        1 => any::<bool>().prop_map(Choice::Health),
        1 => Just(Choice::Shutdown),
    ]
}

/// What the test knows of the member's workers and the heartbeat in flight.
#[derive(Default)]
struct World {
    running: BTreeMap<u32, bool>,
    inflight: Option<(Instant, i64)>,
    leave: bool,
    assigned: BTreeSet<u32>,
    ended: bool,
}

impl World {
    /// Applies the steps, checking the member's rules.
    fn apply(&mut self, m: &Member, steps: Vec<Step>, now: Instant) -> Result<(), TestCaseError> {
        for step in steps {
            prop_assert!(!self.ended, "a step after the end: {step:?}");
            match step {
                Step::Heartbeat(b) => {
                    prop_assert!(self.inflight.is_none(), "two heartbeats in flight");
                    let running: Vec<u32> = self.running.keys().copied().collect();
                    prop_assert_eq!(b.owned, running, "reports exactly what it works");
                    self.inflight = Some((now, b.epoch));
                }
                Step::Start(Start { shard, .. }) => {
                    prop_assert!(self.assigned.contains(&shard), "{shard} not assigned");
                    prop_assert!(m.is_member(), "started while not a member");
                    let before = self.running.insert(shard, false);
                    prop_assert!(before.is_none(), "{shard} started twice");
                }
                Step::Stop(shard) => {
                    let stopping = self.running.get_mut(&shard);
                    prop_assert!(stopping.as_deref() == Some(&false), "stop {shard}");
                    *stopping.expect("checked") = true;
                }
                Step::Leave => self.leave = true,
                Step::Exit(_) => {
                    prop_assert!(self.running.is_empty() && self.inflight.is_none());
                    self.ended = true;
                }
                _ => {}
            }
        }
        // Self-fencing: past the lease, every worker is stopping.
        if m.lease_deadline().is_some_and(|d| now >= d) {
            prop_assert!(self.running.values().all(|s| *s), "working past the lease");
        }
        Ok(())
    }

    fn event(&mut self, c: Choice, now: &mut Instant) -> Option<Event> {
        if self.leave {
            self.leave = false;
            return Some(Event::Left);
        }
        Some(match c {
            Choice::Wait(ms) => {
                *now += Duration::from_millis(ms);
                Event::Tick
            }
            Choice::Answer(shards) => {
                let (sent_at, epoch) = self.inflight.take()?;
                self.assigned = shards.iter().copied().collect();
                let result = Ok(answer(epoch.max(0) + 1, &shards));
                Event::Answered(sent_at, epoch, result)
            }
            Choice::Fail(kind) => {
                let (sent_at, epoch) = self.inflight.take()?;
                let e = match kind {
                    0 => api_error(ErrorCode::FencedMemberEpoch),
                    1 => api_error(ErrorCode::UnknownMemberId),
                    2 => api_error(ErrorCode::GroupMaxSizeReached),
                    _ => unavailable(),
                };
                let result = Err(e);
                Event::Answered(sent_at, epoch, result)
            }
            Choice::Exit(i, refused) => {
                let shard = *self.running.keys().nth(i % self.running.len().max(1))?;
                self.running.remove(&shard);
                Event::WorkerExited(shard, None, refused)
            }
            Choice::Shutdown => Event::Shutdown,
            Choice::Woken => Event::Woken,
            Choice::Health(true) => up(),
            Choice::Health(false) => down(*now),
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Whatever the coordinator answers and whenever workers end: a shard is started only
    /// when the last answer assigns it and no worker of it runs; every heartbeat reports
    /// exactly the workers still running (so a revoked shard is acknowledged only once its
    /// worker stopped); past the lease every worker is stopping; at most one heartbeat is in
    /// flight; the member ends only with every worker stopped.
    #[test]
    fn the_member_s_rules_hold_whatever_happens(
        choices in prop::collection::vec(choice(), 0..120),
    ) {
        let mut now = Instant::now();
        let mut m = Member::new(cfg(), now);
        let mut w = World::default();
        let steps = m.handle(up(), now);
        w.apply(&m, steps, now)?;
        for c in choices {
            if let Some(e) = w.event(c, &mut now) {
                let steps = m.handle(e, now);
                w.apply(&m, steps, now)?;
            }
        }
    }
}
