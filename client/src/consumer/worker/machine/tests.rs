//! Unit and property tests of the shard worker's machine (no Redis, no runtime: the clock is
//! an instant the test moves).

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

#[derive(Debug, Clone, PartialEq, Eq)]
struct E {
    id: String,
    key: Option<String>,
}

impl Keyed for E {
    fn id(&self) -> &str {
        &self.id
    }

    fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

fn e(seq: u64) -> E {
    E {
        id: format!("{seq}-0"),
        key: Some(format!("k{}", seq % 3)),
    }
}

fn cfg(lanes: usize, blocking: bool) -> Config {
    Config {
        shape: Shape {
            lanes,
            // As the worker's shape: one lane takes a read's worth per call.
            batch: if lanes == 1 { 10 } else { 1 },
            bound: 100,
            auto_ack: true,
        },
        group: "g".into(),
        read_count: 10,
        quiet: Duration::from_secs(2),
        blocking,
        batch_linger: None,
        retry: (Duration::from_millis(100), Duration::from_secs(5)),
    }
}

const CTX: Ctx = Ctx {
    guarded: false,
    ordered: false,
    draining: false,
};

/// A machine taken through an empty takeover: it reads next.
fn reading(cfg: Config, now: Instant) -> Machine<E> {
    let mut m = Machine::new(cfg);
    assert!(matches!(m.next(now, CTX), Step::CreateGroup));
    m.on(Event::GroupReady, now);
    assert!(matches!(m.next(now, CTX), Step::Claim { cursor } if cursor == "0-0"));
    m.on(
        Event::Claimed {
            ready: vec![],
            next: "0-0".into(),
            held: 0,
        },
        now,
    );
    assert!(matches!(m.next(now, CTX), Step::Clean));
    m.on(Event::Cleaned, now);
    assert!(m.is_reading());
    m
}

/// A read that found these entries (by sequence), none held.
fn got(seqs: &[u64]) -> Event<E> {
    Event::ReadEntries {
        ready: seqs.iter().map(|s| e(*s)).collect(),
        last: format!("{}-0", seqs.last().expect("an entry")),
        held: 0,
    }
}

/// Reads entry 1, handles it, and checks that the next read carries its acknowledgement.
fn handle_one(m: &mut Machine<E>, now: Instant) {
    expect_read(m.next(now, CTX));
    m.on(got(&[1]), now);
    let call = expect_start(m.next(now, CTX));
    assert!(
        matches!(m.next(now, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    m.on(handled(&call), now);
    let plan = expect_read(m.next(now, CTX));
    assert_eq!(
        *plan.acks,
        ["1-0"],
        "the acknowledgement rides with the read"
    );
}

fn expect_read(step: Step<E>) -> ReadPlan {
    match step {
        Step::Read(plan) => plan,
        other => panic!("expected a read, got {other:?}"),
    }
}

fn expect_start(step: Step<E>) -> Call<E> {
    match step {
        Step::Start(call) => call,
        other => panic!("expected a call to start, got {other:?}"),
    }
}

fn handled(call: &Call<E>) -> Event<E> {
    Event::CallEnded(
        call.id,
        call.entries
            .iter()
            .map(|e| (e.id.clone(), Verdict::Handled))
            .collect(),
    )
}

#[test]
fn the_takeover_retries_the_group_claims_every_page_then_cleans_up() {
    let t0 = Instant::now();
    let mut m: Machine<E> = Machine::new(cfg(1, false));
    assert!(matches!(m.next(t0, CTX), Step::CreateGroup));
    m.on(Event::GroupFailed, t0);
    // The backoff: nothing but a wait until it is over.
    let Step::Wait {
        until: Some(retry), ..
    } = m.next(t0, CTX)
    else {
        panic!("a backoff wait")
    };
    assert!(retry > t0 && retry <= t0 + Duration::from_millis(200));
    assert!(matches!(m.next(retry, CTX), Step::CreateGroup));
    m.on(Event::GroupReady, retry);
    assert!(matches!(m.next(retry, CTX), Step::Claim { cursor } if cursor == "0-0"));
    m.on(
        Event::Claimed {
            ready: vec![e(1), e(2)],
            next: "7-0".into(),
            held: 0,
        },
        retry,
    );
    // The page is handled and acknowledged before the next claim.
    let call = expect_start(m.next(retry, CTX));
    assert_eq!(
        call.entries,
        vec![e(1), e(2)],
        "one lane: the queue's front"
    );
    assert!(matches!(m.next(retry, CTX), Step::Wait { ring: None, .. }));
    m.on(handled(&call), retry);
    let Step::Ack(ids) = m.next(retry, CTX) else {
        panic!("the page's acknowledgements")
    };
    assert_eq!(ids, ["1-0", "2-0"]);
    m.on(Event::Acked(ids), retry);
    assert!(matches!(m.next(retry, CTX), Step::Claim { cursor } if cursor == "7-0"));
    m.on(Event::ClaimFailed { nogroup: true }, retry);
    // The group vanished: created again, nothing is pending any more.
    assert!(matches!(m.next(retry, CTX), Step::CreateGroup));
    m.on(Event::GroupReady, retry);
    assert!(matches!(m.next(retry, CTX), Step::Clean));
    m.on(Event::Cleaned, retry);
    assert!(m.is_reading());
}

#[test]
fn a_paused_listener_claims_nothing_until_resumed() {
    let t0 = Instant::now();
    let mut m: Machine<E> = Machine::new(cfg(1, false));
    m.on(Event::Paused(true), t0);
    assert!(matches!(m.next(t0, CTX), Step::CreateGroup));
    m.on(Event::GroupReady, t0);
    assert!(matches!(
        m.next(t0, CTX),
        Step::Wait {
            until: None,
            ring: None
        }
    ));
    m.on(Event::Paused(false), t0);
    assert!(matches!(m.next(t0, CTX), Step::Claim { .. }));
}

#[test]
fn an_empty_read_waits_on_the_doorbell_after_the_stream_s_last_id() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(plan.from, ">");
    assert!(
        plan.learn_last,
        "the position is unknown: learned in the same round trip"
    );
    assert_eq!(plan.block, None, "a shared connection never blocks");
    m.on(
        Event::ReadNothing {
            learned: Some("5-0".into()),
        },
        t0,
    );
    let Step::Wait {
        until: Some(until),
        ring: Some(after),
    } = m.next(t0, CTX)
    else {
        panic!("a wait on the doorbell")
    };
    assert_eq!(after, "5-0");
    assert_eq!(until, t0 + Duration::from_secs(2));
    // Quiet past the period: an idle shard costs no command, the wait goes on.
    let later = until + Duration::from_millis(1);
    assert!(matches!(
        m.next(later, CTX),
        Step::Wait { ring: Some(_), .. }
    ));
    // A draining shard is checked after a quiet period.
    let drain = Ctx {
        draining: true,
        ..CTX
    };
    assert!(matches!(
        m.next(later + Duration::from_secs(2), drain),
        Step::CheckDrained
    ));
    m.on(Event::Woken(Woken::Ring), later);
    let plan = expect_read(m.next(later, CTX));
    assert!(!plan.learn_last, "the position is known");
    m.on(got(&[6]), later);
    expect_start(m.next(later, CTX));
    assert!(
        matches!(m.next(later, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
}

/// A seek (PROTOCOL §18) moves the group's position while the group is paused, behind the
/// last entry the worker saw, and no producer rings for it: at the resume the worker reads at
/// once (learning the stream's last id again) instead of waiting on the doorbell for entries
/// after that id, which the fallback poll would never find.
#[test]
fn a_resume_reads_at_once_whatever_the_worker_knew_of_the_shard() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(
        Event::ReadNothing {
            learned: Some("9-0".into()),
        },
        t0,
    );
    assert!(matches!(m.next(t0, CTX), Step::Wait { ring: Some(ref a), .. } if a == "9-0"));
    m.on(Event::Paused(true), t0);
    assert!(
        matches!(m.next(t0, CTX), Step::Wait { ring: None, .. }),
        "paused: no read, no doorbell"
    );
    // Still paused: nothing changes (the event is given at every step).
    m.on(Event::Paused(true), t0);
    assert!(matches!(m.next(t0, CTX), Step::Wait { ring: None, .. }));
    m.on(Event::Paused(false), t0);
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(plan.from, ">");
    assert!(
        plan.learn_last,
        "the position is forgotten: the read learns the stream's last id again"
    );
    // The seek moved the group back: the read finds the entries again.
    m.on(got(&[1, 2, 3]), t0);
    expect_start(m.next(t0, CTX));

    // A blocking connection under strict fencing waits with `XREAD BLOCK` after the last id:
    // a resume ends that wait too.
    let mut m = reading(cfg(1, true), t0);
    expect_read(m.next(t0, CTX));
    m.on(
        Event::ReadNothing {
            learned: Some("9-0".into()),
        },
        t0,
    );
    m.on(Event::Paused(true), t0);
    m.on(Event::Paused(false), t0);
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(plan.from, ">");
}

#[test]
fn acknowledgements_ride_with_the_next_read_or_go_alone_after_the_linger() {
    let t0 = Instant::now();
    let mut m = reading(cfg(2, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(got(&[1, 2]), t0);
    let a = expect_start(m.next(t0, CTX));
    let b = expect_start(m.next(t0, CTX));
    assert!(
        matches!(m.next(t0, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    // Both lanes busy: wait for a call.
    assert!(matches!(m.next(t0, CTX), Step::Wait { until: None, .. }));
    m.on(handled(&a), t0);
    // A lane is free: read, with the acknowledgement.
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(*plan.acks, ["1-0"]);
    m.on(got(&[3, 4]), t0);
    let c = expect_start(m.next(t0, CTX));
    m.on(handled(&b), t0);
    let d = expect_start(m.next(t0, CTX));
    m.on(handled(&c), t0);
    // A lane is free but the queue is empty and... it reads, with the acknowledgements.
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(*plan.acks, ["2-0", "3-0"]);
    m.on(got(&[5]), t0);
    let f = expect_start(m.next(t0, CTX));
    m.on(handled(&f), t0);
    // Busy with `d`, one acknowledgement waits: at most ACK_LINGER.
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(*plan.acks, ["5-0"]);
    m.on(Event::ReadNothing { learned: None }, t0);
    drop(d);
}

#[test]
fn acknowledgements_wait_at_most_the_linger_behind_a_slow_call() {
    let t0 = Instant::now();
    let mut m = reading(cfg(2, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(got(&[1, 2]), t0);
    let fast = expect_start(m.next(t0, CTX));
    let _slow = expect_start(m.next(t0, CTX));
    assert!(
        matches!(m.next(t0, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    m.on(handled(&fast), t0);
    // A lane is free: the next read takes the acknowledgement; it found nothing.
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(*plan.acks, ["1-0"]);
    m.on(
        Event::ReadNothing {
            learned: Some("2-0".into()),
        },
        t0,
    );
    // Now paused: acknowledgements go at once, and nothing is read.
    m.on(Event::Paused(true), t0);
    assert!(matches!(
        m.next(t0, CTX),
        Step::Wait {
            until: None,
            ring: None
        }
    ));
}

#[test]
fn a_lost_reply_re_reads_this_member_s_pending_entries_first() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    handle_one(&mut m, t0);
    m.on(Event::ReadFailed { nogroup: false }, t0);
    // The acknowledgements go on their own first, then the backoff.
    let Step::Ack(ids) = m.next(t0, CTX) else {
        panic!("the acknowledgements on their own")
    };
    assert_eq!(ids, ["1-0"]);
    m.on(Event::Acked(ids), t0);
    let Step::Wait {
        until: Some(retry), ..
    } = m.next(t0, CTX)
    else {
        panic!("the backoff")
    };
    let plan = expect_read(m.next(retry, CTX));
    assert_eq!(plan.from, "0", "own pending entries, from the start");
    m.on(got(&[2, 3]), retry);
    let call = expect_start(m.next(retry, CTX));
    m.on(handled(&call), retry);
    let plan = expect_read(m.next(retry, CTX));
    assert_eq!(plan.from, "3-0", "on through the pending entries");
    assert!(!plan.learn_last && plan.block.is_none());
    m.on(Event::ReadNothing { learned: None }, retry);
    assert_eq!(
        expect_read(m.next(retry, CTX)).from,
        ">",
        "then new entries"
    );
}

#[test]
fn a_vanished_group_is_created_again_and_reading_goes_on() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(Event::ReadFailed { nogroup: true }, t0);
    assert!(matches!(m.next(t0, CTX), Step::CreateGroup));
    m.on(Event::GroupReady, t0);
    assert_eq!(expect_read(m.next(t0, CTX)).from, ">");
}

#[test]
fn a_stop_lets_calls_end_acknowledges_what_they_settled_and_reads_nothing_more() {
    let t0 = Instant::now();
    let mut m = reading(cfg(2, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(got(&[1, 2, 4]), t0);
    let a = expect_start(m.next(t0, CTX));
    let b = expect_start(m.next(t0, CTX));
    assert!(
        matches!(m.next(t0, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    m.on(Event::Stop, t0);
    assert!(m.is_stopping());
    assert!(matches!(m.next(t0, CTX), Step::DrainCalls));
    m.on(handled(&a), t0);
    // `b` was dropped (a revocation past its deadline): no verdict, stays pending.
    m.on(Event::CallsSettled, t0);
    let Step::Ack(ids) = m.next(t0, CTX) else {
        panic!("the last acknowledgements")
    };
    assert_eq!(ids, [a.entries[0].id.clone()]);
    assert!(!ids.contains(&b.entries[0].id));
    m.on(Event::Acked(ids), t0);
    assert!(matches!(m.next(t0, CTX), Step::Done));
    assert!(matches!(m.next(t0, CTX), Step::Done));
}

#[test]
fn a_read_cut_by_the_stop_sends_its_acknowledgements_again() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    handle_one(&mut m, t0);
    m.on(Event::ReadCut, t0);
    m.on(Event::Stop, t0);
    let Step::Ack(ids) = m.next(t0, CTX) else {
        panic!("the acknowledgements again")
    };
    assert_eq!(ids, ["1-0"]);
}

#[test]
fn a_refused_owner_token_stops_the_worker() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(Event::Fenced, t0);
    assert!(matches!(m.next(t0, CTX), Step::Done));
}

#[test]
fn held_entries_are_checked_every_hold_poll_and_a_full_hold_stops_the_reads() {
    let t0 = Instant::now();
    let mut m = reading(cfg(1, false), t0);
    expect_read(m.next(t0, CTX));
    m.on(
        Event::ReadEntries {
            ready: vec![],
            last: "3-0".into(),
            held: 3,
        },
        t0,
    );
    assert!(matches!(m.next(t0, CTX), Step::CheckHolds));
    m.on(
        Event::Released {
            ready: vec![],
            held: 3,
        },
        t0,
    );
    assert!(
        matches!(m.next(t0, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    // Not due again before HOLD_POLL: the worker reads meanwhile.
    let plan = expect_read(m.next(t0, CTX));
    m.on(
        Event::ReadNothing {
            learned: Some("3-0".into()),
        },
        t0,
    );
    drop(plan);
    // Waiting on the doorbell while entries are held: at most until the next check.
    let Step::Wait { until, ring } = m.next(t0, CTX) else {
        panic!("a wait")
    };
    assert_eq!(
        (until, ring.as_deref()),
        (Some(t0 + HOLD_POLL), Some("3-0"))
    );
    let t1 = t0 + HOLD_POLL;
    assert!(matches!(m.next(t1, CTX), Step::CheckHolds));
    m.on(
        Event::Released {
            ready: vec![e(1), e(2)],
            held: 1,
        },
        t1,
    );
    // Something was released: checked again at once, and the released entries start.
    assert!(matches!(m.next(t1, CTX), Step::CheckHolds));
    m.on(
        Event::Released {
            ready: vec![],
            held: 1,
        },
        t1,
    );
    let call = expect_start(m.next(t1, CTX));
    assert_eq!(call.entries, vec![e(1), e(2)], "released in stream order");
    m.on(handled(&call), t1);
    // A full hold: no read, only the checks.
    m.on(
        Event::Released {
            ready: vec![],
            held: MAX_HELD,
        },
        t1,
    );
    let Step::Ack(_) = m.next(t1 + ACK_LINGER, CTX) else {
        panic!("the acknowledgements, as nothing is read")
    };
}

#[test]
fn a_blocking_connection_blocks_shorter_while_calls_run_and_checks_a_drained_shard() {
    let t0 = Instant::now();
    let mut m = reading(cfg(2, true), t0);
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(plan.block, Some(Duration::from_secs(2)));
    assert!(
        !plan.learn_last,
        "a blocked read waits in Redis, not on the doorbell"
    );
    m.on(got(&[1]), t0);
    let _call = expect_start(m.next(t0, CTX));
    assert!(
        matches!(m.next(t0, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(
        plan.block,
        Some(BUSY_BLOCK),
        "a call in flight: short blocks"
    );
    m.on(Event::ReadNothing { learned: None }, t0);
    let drain = Ctx {
        draining: true,
        ..CTX
    };
    assert!(matches!(m.next(t0, drain), Step::CheckDrained));
    // Strict fencing: the guarded read learned the last id; a plain XREAD BLOCK waits.
    expect_read(m.next(t0, CTX));
    m.on(
        Event::ReadNothing {
            learned: Some("1-0".into()),
        },
        t0,
    );
    assert!(matches!(m.next(t0, CTX), Step::WaitNew { after, .. } if after == "1-0"));
    m.on(Event::NoNew, t0);
    expect_read(m.next(t0, CTX));
}

#[test]
fn a_batch_listener_lingers_for_a_fuller_batch_unless_guarded_or_ordered() {
    let t0 = Instant::now();
    let linger = Duration::from_millis(50);
    let mut c = cfg(1, false);
    c.batch_linger = Some((linger, 10));
    c.shape.batch = 10;
    let mut m = reading(c, t0);
    let plan = expect_read(m.next(t0, CTX));
    assert_eq!(plan.count, 10);
    m.on(got(&[1, 2]), t0);
    assert!(
        matches!(m.next(t0, CTX), Step::ReadLag),
        "after the calls start: the lag"
    );
    assert!(matches!(m.next(t0, CTX), Step::Wait { until: Some(u), .. } if u == t0 + linger));
    let plan = expect_read(m.next(t0 + linger, CTX));
    assert_eq!((plan.from.as_str(), plan.count), (">", 8));
    m.on(got(&[3]), t0 + linger);
    let call = expect_start(m.next(t0 + linger, CTX));
    assert_eq!(call.entries, vec![e(1), e(2), e(3)]);
    m.on(handled(&call), t0 + linger);

    // Guarded: no linger.
    let guarded = Ctx {
        guarded: true,
        ..CTX
    };
    expect_read(m.next(t0 + linger, guarded));
    m.on(got(&[4]), t0 + linger);
    let call = expect_start(m.next(t0 + linger, CTX));
    assert_eq!(call.entries, vec![e(4)]);
}

// ---- The property test: the machine against a simulated shard and handler. ----

/// What the simulated world does at a step that gives it a choice.
#[derive(Debug, Clone)]
enum Choice {
    /// Redis fails the command; `landed`: the command ran all the same (its reply is lost).
    Fail { landed: bool },
    /// Redis answers.
    Ok,
}

#[derive(Debug, Clone)]
enum WaitOutcome {
    /// A call in flight ends (index modulo), a verdict per entry (0 handled, 1 dead letter,
    /// 2 no verdict).
    CallEnds(usize, Vec<u8>),
    /// A producer writes entries (and rings).
    Write(u8),
    /// The wait's deadline passes.
    Timeout,
    Pause(bool),
    /// An operator pauses the group (when it is not), moves its position `n` entries back
    /// (`XGROUP SETID`, PROTOCOL §18) and resumes it; the seek's ring is lost.
    Seek(u8),
    Stop,
}

fn choice() -> impl Strategy<Value = Choice> {
    prop_oneof![
        8 => Just(Choice::Ok),
        1 => any::<bool>().prop_map(|landed| Choice::Fail { landed }),
    ]
}

fn wait_outcome() -> impl Strategy<Value = WaitOutcome> {
    prop_oneof![
        6 => (any::<usize>(), prop::collection::vec(0u8..3, 1..4))
            .prop_map(|(i, v)| WaitOutcome::CallEnds(i, v)),
        3 => (1u8..5).prop_map(WaitOutcome::Write),
        2 => Just(WaitOutcome::Timeout),
        1 => any::<bool>().prop_map(WaitOutcome::Pause),
        1 => (1u8..6).prop_map(WaitOutcome::Seek),
        1 => Just(WaitOutcome::Stop),
    ]
}

/// The simulated shard: the stream, the group's last delivered entry, this member's pending
/// entries.
#[derive(Default)]
struct Shard {
    written: u64,
    delivered: u64,
    pending: BTreeSet<u64>,
}

impl Shard {
    fn write(&mut self, n: u64) {
        self.written += n;
    }

    /// `XREADGROUP … COUNT count STREAMS key from`.
    fn read(&mut self, from: &str, count: usize) -> Vec<u64> {
        if from == ">" {
            let end = self.written.min(self.delivered + count as u64);
            let new: Vec<u64> = (self.delivered + 1..=end).collect();
            self.delivered = end;
            self.pending.extend(new.iter().copied());
            new
        } else {
            let after = seq(from);
            self.pending
                .range(after + 1..)
                .take(count)
                .copied()
                .collect()
        }
    }

    fn ack(&mut self, ids: &[String]) {
        for id in ids {
            self.pending.remove(&seq(id));
        }
    }
}

fn seq(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What the test checks the machine against.
#[derive(Default)]
struct World {
    shard: Shard,
    calls: BTreeMap<u64, Call<E>>,
    next_call: u64,
    /// Entries given a verdict that asks for an acknowledgement.
    settled: HashSet<String>,
    /// Entries given such a verdict since they were last delivered (a seek delivers
    /// entries again).
    settled_since_delivery: HashSet<String>,
    handled_count: HashMap<String, usize>,
    stopped: bool,
    paused: bool,
    /// Ordered resharding: key `k0` moved here and waits for its parent; its entries are
    /// held (in order, each once) until a check finds the parent done.
    holds: bool,
    held: Vec<E>,
    /// Per key, the last entry started for the first time.
    first_starts: HashMap<String, u64>,
    started: HashSet<String>,
}

impl World {
    fn entries(ids: &[u64]) -> Vec<E> {
        ids.iter().map(|s| e(*s)).collect()
    }

    /// The hold's admission: `k0`'s entries are held (those held already are not again);
    /// the others are ready. Returns them and how many are held.
    fn admit(&mut self, ids: &[u64]) -> (Vec<E>, usize) {
        let mut ready = Vec::new();
        for entry in Self::entries(ids) {
            if self.holds && entry.key.as_deref() == Some("k0") {
                if !self.held.contains(&entry) {
                    self.held.push(entry);
                }
            } else {
                ready.push(entry);
            }
        }
        (ready, self.held.len())
    }

    /// A call starts: each key's entries start (the first time) in stream order.
    fn start(&mut self, call: &Call<E>) -> Result<(), TestCaseError> {
        for entry in &call.entries {
            if !self.started.insert(entry.id.clone()) {
                continue;
            }
            let key = entry.key.clone().unwrap_or_default();
            let s = seq(&entry.id);
            if let Some(last) = self.first_starts.insert(key.clone(), s) {
                prop_assert!(last < s, "key {key}: {s} started after {last}");
            }
        }
        Ok(())
    }

    /// A read delivered these entries (again, after a seek): each needs a new verdict.
    fn delivered(&mut self, ids: &[u64]) {
        for s in ids {
            self.settled_since_delivery.remove(&format!("{s}-0"));
        }
    }

    fn end_call(&mut self, i: usize, verdicts: &[u8]) -> Option<Event<E>> {
        let k = *self.calls.keys().nth(i % self.calls.len().max(1))?;
        let call = self.calls.remove(&k)?;
        let mut given = Vec::new();
        for (n, entry) in call.entries.iter().enumerate() {
            // No verdict only when stopped (a call's entries are abandoned only then).
            let v = verdicts.get(n).copied().unwrap_or(0);
            let v = if self.stopped { v } else { v % 2 };
            let verdict = [Verdict::Handled, Verdict::DeadLettered, Verdict::Abandoned][v as usize];
            if verdict != Verdict::Abandoned {
                self.settled.insert(entry.id.clone());
                self.settled_since_delivery.insert(entry.id.clone());
                *self.handled_count.entry(entry.id.clone()).or_default() += 1;
            }
            given.push((entry.id.clone(), verdict));
        }
        Some(Event::CallEnded(call.id, given))
    }
}

/// Drives `m` with the world's answers: the faulty part (`choices`, `outcomes`), then a calm
/// part (every command answers, every call succeeds) in which all written entries must get
/// handled and acknowledged, unless the worker was stopped.
fn simulate(
    mut m: Machine<E>,
    holds: bool,
    choices: &[Choice],
    outcomes: &[WaitOutcome],
    initially_pending: u64,
) -> Result<(), TestCaseError> {
    let mut w = World {
        holds,
        ..World::default()
    };
    let ctx = Ctx {
        ordered: holds,
        ..CTX
    };
    // The previous owner's pending entries: written, delivered, pending (for the claim).
    w.shard.write(initially_pending);
    w.shard.read(">", initially_pending as usize);
    let mut now = Instant::now();
    let (mut ci, mut oi) = (0usize, 0usize);
    let mut claimed_cursor_done = false;
    for round in 0..20_000 {
        let calm = round >= 2_000 || (ci >= choices.len() && oi >= outcomes.len());
        if calm && !w.stopped && w.paused {
            w.paused = false;
            m.on(Event::Paused(false), now);
        }
        if calm
            && !w.stopped
            && m.is_reading()
            && w.calls.is_empty()
            && w.shard.delivered == w.shard.written
            && w.shard.pending.is_empty()
        {
            // Everything written was read, handled and acknowledged.
            break;
        }
        let choice = if calm {
            Choice::Ok
        } else {
            ci += 1;
            choices.get(ci - 1).cloned().unwrap_or(Choice::Ok)
        };
        let step = m.next(now, ctx);
        match step {
            Step::Done => {
                prop_assert!(w.calls.is_empty(), "done with calls in flight");
                break;
            }
            Step::CreateGroup => {
                prop_assert!(!w.stopped);
                let ev = match choice {
                    Choice::Ok => Event::GroupReady,
                    Choice::Fail { .. } => Event::GroupFailed,
                };
                m.on(ev, now);
            }
            Step::Claim { cursor } => {
                prop_assert!(!w.stopped && !w.paused, "claim while stopped or paused");
                match choice {
                    Choice::Fail { .. } => m.on(Event::ClaimFailed { nogroup: false }, now),
                    Choice::Ok => {
                        // Pages of 2 pending entries.
                        let after = seq(&cursor);
                        let page: Vec<u64> = w
                            .shard
                            .pending
                            .range(after + 1..)
                            .take(2)
                            .copied()
                            .collect();
                        let next = match page.last() {
                            Some(l) if w.shard.pending.range(l + 1..).next().is_some() => {
                                format!("{l}-0")
                            }
                            _ => "0-0".to_owned(),
                        };
                        claimed_cursor_done |= next == "0-0";
                        let (ready, held) = w.admit(&page);
                        m.on(Event::Claimed { ready, next, held }, now);
                    }
                }
            }
            Step::Clean => {
                prop_assert!(claimed_cursor_done, "cleanup before the claim ended");
                m.on(Event::Cleaned, now);
            }
            Step::Start(call) => {
                prop_assert!(!w.stopped, "a call started after the stop");
                prop_assert!(!w.paused, "a call started while paused");
                for entry in &call.entries {
                    for other in w.calls.values() {
                        prop_assert!(
                            !other.entries.contains(entry),
                            "{} in two calls at once",
                            entry.id
                        );
                    }
                }
                w.start(&call)?;
                w.calls.insert(w.next_call, call);
                w.next_call += 1;
            }
            Step::Ack(ids) => {
                for id in &ids {
                    prop_assert!(
                        w.settled.contains(id),
                        "{id} acknowledged without a verdict"
                    );
                }
                w.shard.ack(&ids);
                m.on(Event::Acked(ids), now);
            }
            Step::Read(plan) => {
                prop_assert!(!w.stopped, "read after the stop");
                for id in plan.acks.iter() {
                    prop_assert!(
                        w.settled.contains(id),
                        "{id} acknowledged without a verdict"
                    );
                }
                match choice {
                    Choice::Fail { landed } => {
                        if landed {
                            w.shard.ack(&plan.acks);
                            let got = w.shard.read(&plan.from, plan.count);
                            w.delivered(&got);
                        }
                        m.on(Event::ReadFailed { nogroup: false }, now);
                    }
                    Choice::Ok => {
                        w.shard.ack(&plan.acks);
                        if plan.block.is_some() && w.shard.delivered == w.shard.written && !calm {
                            // A blocked read waits: a producer may write meanwhile.
                            oi += 1;
                            if let Some(WaitOutcome::Write(n)) = outcomes.get(oi - 1) {
                                w.shard.write(u64::from(*n));
                            }
                        }
                        let got = w.shard.read(&plan.from, plan.count);
                        w.delivered(&got);
                        let ev = match got.last() {
                            Some(l) => {
                                let (ready, held) = w.admit(&got);
                                Event::ReadEntries {
                                    ready,
                                    last: format!("{l}-0"),
                                    held,
                                }
                            }
                            None => {
                                // A blocked read that found nothing waited its block.
                                now += plan.block.unwrap_or_default();
                                Event::ReadNothing {
                                    learned: plan
                                        .learn_last
                                        .then(|| format!("{}-0", w.shard.written)),
                                }
                            }
                        };
                        m.on(ev, now);
                    }
                }
                if calm
                    && plan.block.is_some()
                    && let Some(ev) = w.end_call(0, &[0])
                {
                    // Calls run beside a blocked read: one ends while it blocks.
                    m.on(ev, now);
                }
            }
            Step::Wait { until, ring } => {
                let outcome = if calm {
                    if !w.calls.is_empty() {
                        WaitOutcome::CallEnds(0, vec![0])
                    } else {
                        WaitOutcome::Timeout
                    }
                } else {
                    oi += 1;
                    outcomes
                        .get(oi - 1)
                        .cloned()
                        .unwrap_or(WaitOutcome::Timeout)
                };
                match outcome {
                    WaitOutcome::CallEnds(i, v) => {
                        if let Some(ev) = w.end_call(i, &v) {
                            m.on(ev, now);
                        } else if let Some(u) = until {
                            now = now.max(u);
                        }
                    }
                    WaitOutcome::Write(n) => {
                        w.shard.write(u64::from(n));
                        if let Some(after) = ring
                            && w.shard.written > seq(&after)
                        {
                            m.on(Event::Woken(Woken::Ring), now);
                        }
                    }
                    WaitOutcome::Timeout => {
                        if let Some(after) = &ring
                            && w.shard.written > seq(after)
                        {
                            // The doorbell's fallback poll finds what no ring announced.
                            m.on(Event::Woken(Woken::Poll), now);
                        } else if let Some(u) = until {
                            now = now.max(u);
                        }
                    }
                    WaitOutcome::Pause(p) => {
                        w.paused = p;
                        m.on(Event::Paused(p), now);
                    }
                    // Handlers finish before the operator seeks (the pause lets the calls
                    // in flight end): a seek meanwhile is not modelled.
                    WaitOutcome::Seek(n) if w.calls.is_empty() => {
                        let resume = !w.paused;
                        if resume {
                            m.on(Event::Paused(true), now);
                        }
                        w.shard.delivered = w.shard.delivered.saturating_sub(u64::from(n));
                        // Else resumed by a later outcome, or at the start of the calm part.
                        if resume {
                            m.on(Event::Paused(false), now);
                        }
                    }
                    WaitOutcome::Seek(_) => {
                        if let Some(u) = until {
                            now = now.max(u);
                        }
                    }
                    WaitOutcome::Stop => {
                        w.stopped = true;
                        m.on(Event::Stop, now);
                    }
                }
            }
            Step::DrainCalls => {
                prop_assert!(w.stopped);
                while !w.calls.is_empty() {
                    if let Some(ev) = w.end_call(0, &[0]) {
                        m.on(ev, now);
                    }
                }
                m.on(Event::CallsSettled, now);
            }
            Step::CheckHolds => {
                prop_assert!(!w.held.is_empty(), "a hold check with nothing held");
                // The parent is done (or not yet): every held entry goes, in order.
                let ready = match choice {
                    Choice::Ok => std::mem::take(&mut w.held),
                    Choice::Fail { .. } => Vec::new(),
                };
                let held = w.held.len();
                m.on(Event::Released { ready, held }, now);
            }
            Step::ReadLag | Step::CheckDrained => {}
            Step::WaitNew { .. } => {
                let ev = if w.shard.written > w.shard.delivered {
                    Event::NewMaybe
                } else {
                    Event::NoNew
                };
                m.on(ev, now);
            }
        }
        prop_assert!(round < 19_999, "the worker never settled");
    }
    // Nothing handled twice at once; acknowledgements only after a verdict (checked above).
    if w.stopped {
        // A stopped worker acknowledged what it handled: nothing settled stays pending.
        for id in &w.settled_since_delivery {
            prop_assert!(
                !w.shard.pending.contains(&seq(id)),
                "{id} settled but left pending"
            );
        }
    } else {
        // Everything written was handled (at least once) and nothing is left pending.
        prop_assert_eq!(w.shard.delivered, w.shard.written);
        prop_assert!(
            w.shard.pending.is_empty(),
            "left pending: {:?}",
            w.shard.pending
        );
        for s in 1..=w.shard.written {
            prop_assert!(
                w.handled_count.contains_key(&format!("{s}-0")),
                "{s}-0 never handled"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Whatever Redis and the handler do (failures, lost replies whose command landed, calls
    /// ending in any order with any verdict, pauses, a stop), with or without a batch
    /// listener's linger and entries held for their parent (ordered resharding): no entry is
    /// in two calls at once, each key's entries start in stream order, an entry is
    /// acknowledged only after its verdict, nothing is read or started after the stop, a
    /// stopped worker acknowledges what it settled, and a worker that is not stopped handles
    /// every entry written and leaves nothing pending.
    #[test]
    fn the_worker_s_rules_hold_against_a_faulty_shard(
        lanes in 1usize..4,
        blocking in any::<bool>(),
        linger in any::<bool>(),
        holds in any::<bool>(),
        pending in 0u64..5,
        choices in prop::collection::vec(choice(), 0..60),
        outcomes in prop::collection::vec(wait_outcome(), 0..60),
    ) {
        let mut c = cfg(lanes, blocking);
        if linger {
            // A batch listener lingering for 4 entries a call.
            c.batch_linger = Some((Duration::from_millis(10), 4));
            c.shape.batch = 4;
        }
        simulate(Machine::new(c), holds, &choices, &outcomes, pending)?;
    }
}
