//! Unit and property tests of the dispatch (no Redis).

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
struct E {
    id: String,
    key: Option<String>,
    redriven_for: Option<String>,
}

impl Keyed for E {
    fn id(&self) -> &str {
        &self.id
    }

    fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn redriven_for(&self) -> Option<&str> {
        self.redriven_for.as_deref()
    }
}

fn e(seq: u64, key: Option<&str>) -> E {
    E {
        id: format!("{seq}-0"),
        key: key.map(str::to_owned),
        redriven_for: None,
    }
}

fn shape(lanes: usize, batch: usize) -> Shape {
    Shape {
        lanes,
        batch,
        bound: 100,
        auto_ack: true,
    }
}

fn ids(call: &Call<E>) -> Vec<&str> {
    call.entries.iter().map(|e| e.id.as_str()).collect()
}

#[test]
fn an_entry_redriven_for_another_group_is_acknowledged_without_a_call() {
    let mut d = Dispatch::new(shape(1, 1)).for_group("billing");
    let redriven = |seq, group: &str| E {
        redriven_for: Some(group.to_owned()),
        ..e(seq, Some("a"))
    };
    let queued = d.offer([redriven(1, "audit"), redriven(2, "billing"), e(3, None)]);
    assert_eq!(queued, 2, "another group's redrive is not queued");
    assert_eq!(d.take_skipped(), 1);
    assert_eq!(d.take_skipped(), 0, "counted once");
    assert_eq!(d.take_acks(), ["1-0"], "acknowledged at once");
    let c = d.next_call().expect("a call");
    assert_eq!(ids(&c), ["2-0"], "this group's own redrive is handled");
    d.acked(&["1-0".to_owned()]);
    assert_eq!(
        d.offer([redriven(1, "audit")]),
        0,
        "a re-read after the ack skips it again"
    );
    assert_eq!(d.take_acks(), ["1-0"]);

    let mut anonymous = Dispatch::new(shape(1, 1));
    assert_eq!(
        anonymous.offer([redriven(4, "audit")]),
        1,
        "no group: nothing skipped"
    );
}

#[test]
fn one_lane_handles_the_shard_in_stream_order_one_call_at_a_time() {
    let mut d = Dispatch::new(shape(1, 1));
    d.offer([e(1, Some("a")), e(2, Some("b")), e(3, None)]);
    let c = d.next_call().expect("a call");
    assert_eq!(ids(&c), ["1-0"]);
    assert!(d.next_call().is_none(), "one call in flight at most");
    assert!(!d.wants_read(), "the lane is busy: nothing to read for");
    d.finished(c.id, &[("1-0".into(), Verdict::Handled)]);
    assert_eq!(ids(&d.next_call().expect("a call")), ["2-0"]);
}

#[test]
fn lanes_run_distinct_keys_and_hold_a_key_behind_its_entry_in_flight() {
    let mut d = Dispatch::new(shape(4, 1));
    d.offer([
        e(1, Some("a")),
        e(2, Some("a")),
        e(3, Some("b")),
        e(4, None),
        e(5, None),
    ]);
    let started: Vec<Call<E>> = std::iter::from_fn(|| d.next_call()).collect();
    let first: Vec<&str> = started.iter().flat_map(ids).collect();
    // 2-0 waits for 1-0 (same key); keyless entries each take a lane.
    assert_eq!(first, ["1-0", "3-0", "4-0", "5-0"]);
    assert_eq!(d.waiting_keys(), 1);
    assert!(
        !d.wants_read(),
        "every lane is busy: no read until one frees"
    );
    d.finished(started[1].id, &[("3-0".into(), Verdict::Handled)]);
    assert!(d.next_call().is_none(), "2-0 still waits for 1-0");
    assert!(
        d.wants_read(),
        "a free lane and nothing that can take it: read more"
    );
    d.finished(started[0].id, &[("1-0".into(), Verdict::Handled)]);
    assert_eq!(ids(&d.next_call().expect("a call")), ["2-0"]);
}

#[test]
fn a_batch_call_holds_one_entry_per_key_with_several_lanes() {
    let mut d = Dispatch::new(shape(2, 10));
    d.offer([
        e(1, Some("a")),
        e(2, Some("a")),
        e(3, Some("b")),
        e(4, None),
    ]);
    let c = d.next_call().expect("a call");
    assert_eq!(ids(&c), ["1-0", "3-0", "4-0"]);
    assert!(d.next_call().is_none(), "2-0 waits for 1-0");
    // One lane: the batch is the queue's front, whatever the keys.
    let mut one = Dispatch::new(shape(1, 10));
    one.offer([e(1, Some("a")), e(2, Some("a")), e(3, Some("b"))]);
    assert_eq!(
        ids(&one.next_call().expect("a call")),
        ["1-0", "2-0", "3-0"]
    );
}

#[test]
fn acks_follow_verdicts_and_abandoned_entries_stay_pending() {
    let mut d = Dispatch::new(shape(1, 3));
    d.offer([e(1, None), e(2, None), e(3, None)]);
    let c = d.next_call().expect("a call");
    d.finished(
        c.id,
        &[
            ("1-0".into(), Verdict::Handled),
            ("2-0".into(), Verdict::DeadLettered),
        ],
    );
    assert_eq!(d.take_acks(), ["1-0", "2-0"]);
    // 3-0 had no verdict: abandoned, not acknowledged, and may be read again.
    assert_eq!(d.offer([e(3, None)]), 1);
    let mut manual = Dispatch::new(Shape {
        auto_ack: false,
        ..shape(1, 1)
    });
    manual.offer([e(1, None)]);
    let c = manual.next_call().expect("a call");
    manual.finished(c.id, &[("1-0".into(), Verdict::Handled)]);
    assert!(manual.take_acks().is_empty(), "manual: the handler acks");
}

#[test]
fn a_staged_entry_frees_its_key_and_is_not_acknowledged_again() {
    let mut d = Dispatch::new(shape(2, 1));
    d.offer([e(1, Some("a")), e(2, Some("a"))]);
    let c = d.next_call().expect("a call");
    assert_eq!(ids(&c), ["1-0"]);
    assert!(d.next_call().is_none(), "2-0 waits for its key");
    // Moved to a retry stage: the stage script acknowledged it on the shard.
    d.finished(c.id, &[("1-0".into(), Verdict::Staged)]);
    assert!(d.take_acks().is_empty());
    let c = d.next_call().expect("the key's next entry starts at once");
    assert_eq!(ids(&c), ["2-0"]);
}

#[test]
fn a_re_read_of_known_entries_starts_nothing_twice() {
    let mut d = Dispatch::new(shape(2, 1));
    d.offer([e(1, Some("a")), e(2, Some("b"))]);
    let c = d.next_call().expect("a call");
    d.finished(c.id, &[("1-0".into(), Verdict::Handled)]);
    // A lost reply: this member's pending entries are read again (1-0 awaits its ack, 2-0
    // is queued).
    assert_eq!(d.offer([e(1, Some("a")), e(2, Some("b"))]), 0);
    let acks = d.take_acks();
    assert_eq!(d.offer([e(1, Some("a"))]), 0, "its ack is on the way");
    d.unsent(acks);
    assert_eq!(d.take_acks(), ["1-0"]);
    d.acked(&["1-0".to_owned()]);
    assert_eq!(d.offer([e(1, Some("a"))]), 1, "acked: a new delivery");
}

#[test]
fn stop_drops_the_queue_and_keeps_the_acks_of_calls_in_flight() {
    let mut d = Dispatch::new(shape(2, 1));
    d.offer([e(1, Some("a")), e(2, Some("b")), e(3, Some("c"))]);
    let c = d.next_call().expect("a call");
    d.stop();
    assert!(d.next_call().is_none());
    assert!(!d.wants_read());
    assert_eq!(d.room(), 0);
    assert_eq!(d.queued(), 0);
    assert_eq!(d.offer([e(4, None)]), 0);
    d.finished(c.id, &[("1-0".into(), Verdict::Handled)]);
    assert_eq!(d.take_acks(), ["1-0"]);
    assert!(d.is_idle());
}

#[test]
fn the_queue_is_bounded() {
    let mut d = Dispatch::new(Shape {
        bound: 3,
        ..shape(2, 1)
    });
    assert_eq!(d.room(), 3);
    d.offer([e(1, Some("a")), e(2, Some("a")), e(3, Some("a"))]);
    let _a = d.next_call().expect("a call");
    assert_eq!(d.room(), 1);
    d.offer([e(4, Some("a"))]);
    assert_eq!(d.room(), 0);
    assert!(!d.wants_read(), "full: no read until the parked key drains");
}

#[derive(Debug, Clone)]
enum Op {
    /// New entries with these keys (`None`: keyless).
    Read(Vec<Option<u8>>),
    /// A re-read of entries read before (by index modulo what was read).
    ReRead(Vec<usize>),
    Start,
    /// The call in flight at this index (modulo) finishes, a verdict per entry.
    Finish(usize, Vec<u8>),
    SendAcks(bool),
    Stop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(prop::option::weighted(0.8, 0u8..4), 1..5).prop_map(Op::Read),
        2 => prop::collection::vec(any::<usize>(), 1..4).prop_map(Op::ReRead),
        6 => Just(Op::Start),
        5 => (any::<usize>(), prop::collection::vec(0u8..3, 0..4)).prop_map(|(i, v)| Op::Finish(i, v)),
        2 => any::<bool>().prop_map(Op::SendAcks),
        1 => Just(Op::Stop),
    ]
}

/// What the model remembers of a run, to check the dispatch against.
#[derive(Default)]
struct Model {
    read: Vec<E>,
    in_flight: BTreeMap<u64, (CallId, Vec<E>)>,
    next: u64,
    /// Per key, the seq of the entries started, in start order.
    starts: BTreeMap<String, Vec<u64>>,
    /// Ids whose verdict asks for an ack.
    ackable: HashSet<String>,
    acked: HashSet<String>,
}

fn seq(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn check_in_flight(m: &Model, lanes: usize) -> Result<(), TestCaseError> {
    prop_assert!(m.in_flight.len() <= lanes);
    let mut ids = HashSet::new();
    let mut keys = HashSet::new();
    for (_, entries) in m.in_flight.values() {
        for e in entries {
            prop_assert!(ids.insert(e.id.clone()), "{} in flight twice", e.id);
            if lanes > 1
                && let Some(k) = &e.key
            {
                prop_assert!(keys.insert(k.clone()), "key {k} in flight twice");
            }
        }
    }
    Ok(())
}

proptest! {
    /// Whatever is read, re-read, finished or stopped: at most `lanes` calls in flight, no
    /// entry in flight twice, never two entries of one key in flight (with several lanes), a
    /// key's entries start in stream order, only entries with a verdict that asks for it are
    /// acknowledged, and the queue stays within its bound when reads respect the room.
    #[test]
    fn dispatch_rules_hold(lanes in 1usize..5, batch in 1usize..4, ops in prop::collection::vec(op(), 1..80)) {
        let mut d = Dispatch::new(Shape { lanes, batch, bound: 8, auto_ack: true });
        let mut m = Model::default();
        let mut seq_no = 0u64;
        for op in ops {
            match op {
                Op::Read(keys) => {
                    let room = d.room();
                    let new: Vec<E> = keys.into_iter().take(room).map(|k| {
                        seq_no += 1;
                        E { id: format!("{seq_no}-0"), key: k.map(|k| format!("k{k}")), redriven_for: None }
                    }).collect();
                    m.read.extend(new.iter().cloned());
                    d.offer(new);
                }
                Op::ReRead(picks) => {
                    if !m.read.is_empty() {
                        let again: Vec<E> = picks.iter().map(|i| m.read[i % m.read.len()].clone())
                            .filter(|e| m.in_flight.values().any(|(_, es)| es.contains(e))
                                || (m.ackable.contains(&e.id) && !m.acked.contains(&e.id)))
                            .collect();
                        prop_assert_eq!(d.offer(again), 0, "a known entry was queued again");
                    }
                }
                Op::Start => {
                    while let Some(c) = d.next_call() {
                        prop_assert!(!c.entries.is_empty() && c.entries.len() <= batch);
                        for e in &c.entries {
                            if let Some(k) = &e.key {
                                m.starts.entry(k.clone()).or_default().push(seq(&e.id));
                            }
                        }
                        m.in_flight.insert(m.next, (c.id, c.entries));
                        m.next += 1;
                        check_in_flight(&m, lanes)?;
                    }
                    prop_assert!(d.is_stopping() || !d.can_start());
                }
                Op::Finish(i, verdicts) => {
                    if m.in_flight.is_empty() { continue; }
                    let k = *m.in_flight.keys().nth(i % m.in_flight.len()).expect("a call");
                    let (id, entries) = m.in_flight.remove(&k).expect("a call");
                    let given: Vec<(String, Verdict)> = entries.iter().zip(verdicts).map(|(e, v)| {
                        let v = [Verdict::Handled, Verdict::DeadLettered, Verdict::Abandoned][v as usize];
                        if v != Verdict::Abandoned { m.ackable.insert(e.id.clone()); }
                        (e.id.clone(), v)
                    }).collect();
                    d.finished(id, &given);
                }
                Op::SendAcks(ok) => {
                    let acks = d.take_acks();
                    for a in &acks {
                        prop_assert!(m.ackable.contains(a), "{a} acknowledged without a verdict");
                    }
                    if ok {
                        m.acked.extend(acks.iter().cloned());
                        d.acked(&acks);
                    } else {
                        d.unsent(acks);
                    }
                }
                Op::Stop => d.stop(),
            }
            prop_assert!(d.queued() <= 8);
            prop_assert_eq!(d.in_flight(), m.in_flight.len());
        }
        for (k, starts) in &m.starts {
            let mut first_seen = HashSet::new();
            let firsts: Vec<u64> = starts.iter().copied().filter(|s| first_seen.insert(*s)).collect();
            prop_assert!(firsts.windows(2).all(|w| w[0] < w[1]), "key {k} started out of order: {firsts:?}");
        }
    }
}
