//! The checker: reads a history (what the pods recorded, what the driver did, what the
//! coordinator audited) and says what went wrong.
//!
//! Invariants (docs/CHAOS.md):
//! - **lost**: every produced seq `0..produced` was handled at least once;
//! - **duplicates**: a seq handled more than once is *explained* only when the span of its
//!   handlings meets a fault window (a kill, a SIGSTOP, a reshard or rollback, a coordinator
//!   or Redis restart, a partition, an outage); otherwise it is a violation;
//! - **overlaps**: no two members handle the same shard in intervals `[started_ms,
//!   finished_ms]` that intersect by more than [`CLOCK_MARGIN_MS`]. One kind is classified
//!   apart, as strict fencing (docs/FENCING.md) fixes: a member SIGSTOPped while a
//!   handler was in flight, whose handler finished after SIGCONT while the shard's new owner
//!   was already handling (`stale_inflight`). Every other overlap is a violation;
//! - **order**: per key, the first handlings of its seqs, in order of `started_ms`, have
//!   increasing seqs, except around a fault window that hands entries over outside the
//!   protocol (a SIGSTOPped member finishing late, a Redis restart). Reshards and rollbacks
//!   excuse nothing since ordered resharding (PROTOCOL §15: a moved key's new entries wait for
//!   its old shard up to the seal).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The clock margin of the overlap check. Every process runs on this one machine and reads
/// the same `CLOCK_REALTIME` (Unix ms, truncated to whole ms): two readings taken in real
/// order differ by less than 1 ms of truncation, plus the time between reading the clock and
/// the event it stands for (`started_ms` is read before the handler starts, `finished_ms`
/// after it returns and before the record is written). 5 ms leaves room for truncation on
/// both ends and scheduler delay on a loaded 2-core machine, and is far below any hand-over
/// the protocol can produce (a heartbeat interval, 250 ms here).
pub(crate) const CLOCK_MARGIN_MS: u64 = 5;

/// One entry of the record stream (PROTOCOL §8, `sample-consumer --record-stream`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handled {
    /// Redis id of the handled entry (in its shard stream).
    pub(crate) entry_id: String,
    /// Shard index.
    pub(crate) shard: u32,
    /// Member id (`<pod_ip>-<group>-<index>`).
    pub(crate) member: String,
    /// Routing key.
    pub(crate) key: String,
    /// Producer sequence number.
    pub(crate) seq: u64,
    /// Handler start (Unix ms).
    pub(crate) started_ms: u64,
    /// Handler end, before the record and the ack (Unix ms).
    pub(crate) finished_ms: u64,
}

/// What the driver (or the coordinator's audit log) says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum FaultKind {
    /// `kill -9` of a pod (restarted afterwards).
    KillPod,
    /// SIGTERM of a pod (graceful shutdown; restarted afterwards).
    TermPod,
    /// Pods stopped or started to change the pod count.
    Scale,
    /// SIGSTOP of a pod, SIGCONT after twice the session timeout.
    StopPod,
    /// A reshard (from the audit log).
    Reshard,
    /// A rollback (from the audit log).
    Rollback,
    /// `kill -9` of a coordinator, restarted on the same port.
    KillCoordinator,
    /// Redis killed (or stopped) and restarted with its AOF.
    RestartRedis,
    /// A pod cut off from the coordinator.
    Partition,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One fault: what, on what, from when to when (Unix ms; `end_ms` is when the driver undid
/// it: restart, SIGCONT, proxy restored; for an instant fault `end_ms == start_ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    /// Kind.
    pub(crate) kind: FaultKind,
    /// Pod IP, coordinator URL, stream…
    pub(crate) target: String,
    /// Start (Unix ms).
    pub(crate) start_ms: u64,
    /// End (Unix ms).
    pub(crate) end_ms: u64,
}

/// Checker settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckConfig {
    /// Seqs `0..produced` were published.
    pub(crate) produced: u64,
    /// How long after a fault ends its effects may still show (a dead member's session runs
    /// out, its pending entries are claimed, a draining shard empties).
    pub(crate) aftermath_ms: u64,
}

/// Two members handling one shard at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overlap {
    /// Shard index.
    pub(crate) shard: u32,
    /// The earlier handling.
    pub(crate) a: Handled,
    /// The later handling.
    pub(crate) b: Handled,
    /// How long they overlap (ms).
    pub(crate) overlap_ms: u64,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shard {}: {} seq {} [{}, {}] and {} seq {} [{}, {}] overlap {} ms",
            self.shard,
            self.a.member,
            self.a.seq,
            self.a.started_ms,
            self.a.finished_ms,
            self.b.member,
            self.b.seq,
            self.b.started_ms,
            self.b.finished_ms,
            self.overlap_ms
        )
    }
}

/// The checker's findings.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Records read.
    pub(crate) records: usize,
    /// Produced seqs never handled.
    pub(crate) lost: Vec<u64>,
    /// Handlings beyond the first of a seq.
    pub(crate) duplicates: usize,
    /// Duplicates whose handlings meet a fault window, by the kind of the nearest fault.
    pub(crate) explained: BTreeMap<FaultKind, usize>,
    /// Seqs handled more than once with no fault around.
    pub(crate) unexplained: Vec<u64>,
    /// Overlaps of a SIGSTOPped member's in-flight handler (the finding behind strict fencing, docs/FENCING.md); `a` is the
    /// stale handling.
    pub(crate) stale_inflight: Vec<Overlap>,
    /// Every other overlap.
    pub(crate) overlaps: Vec<Overlap>,
    /// Per-key order inversions inside a fault window.
    pub(crate) order_explained: usize,
    /// Per-key order inversions outside any fault window: (key, earlier seq, later seq).
    pub(crate) order_violations: Vec<(String, u64, u64)>,
    /// Seqs recorded that were never produced.
    pub(crate) unknown: Vec<u64>,
}

impl Report {
    /// Whether any invariant is broken (stale in-flight overlaps are reported, not failed).
    pub(crate) fn failed(&self) -> bool {
        !self.lost.is_empty()
            || !self.unexplained.is_empty()
            || !self.overlaps.is_empty()
            || !self.order_violations.is_empty()
            || !self.unknown.is_empty()
    }

    /// Distinct handlings of SIGSTOPped members that overlapped the new owner.
    pub(crate) fn stale_handlings(&self) -> usize {
        let mut seen = std::collections::BTreeSet::new();
        for o in &self.stale_inflight {
            seen.insert((o.a.member.clone(), o.a.seq, o.a.started_ms));
        }
        seen.len()
    }

    /// A one-screen summary.
    pub(crate) fn summary(&self, label: &str) -> String {
        let mut s = format!(
            "{label}: records {} | lost {} | duplicates {} (explained {:?}, unexplained {}) | \
             overlaps {} (+ stale in-flight: {} handlings, {} overlapping pairs) | order: \
             explained {}, violations {}",
            self.records,
            self.lost.len(),
            self.duplicates,
            self.explained,
            self.unexplained.len(),
            self.overlaps.len(),
            self.stale_handlings(),
            self.stale_inflight.len(),
            self.order_explained,
            self.order_violations.len(),
        );
        let cap = 10;
        if !self.lost.is_empty() {
            s += &format!("\n  lost seqs (first {cap}): {:?}", first(&self.lost, cap));
        }
        if !self.unknown.is_empty() {
            s += &format!("\n  never produced: {:?}", first(&self.unknown, cap));
        }
        if !self.unexplained.is_empty() {
            s += &format!(
                "\n  unexplained duplicates: {:?}",
                first(&self.unexplained, cap)
            );
        }
        // One line per stale handling (it may overlap many of the new owner's handlings).
        let mut stale: BTreeMap<(String, u64, u64), (&Overlap, usize)> = BTreeMap::new();
        for o in &self.stale_inflight {
            stale
                .entry((o.a.member.clone(), o.a.seq, o.a.started_ms))
                .or_insert((o, 0))
                .1 += 1;
        }
        for (o, n) in stale.values().take(cap) {
            s += &format!(
                "\n  STALE OWNER finished an in-flight handler (PROTOCOL §5.6, docs/FENCING.md), overlapping {n} \
                 handling(s) of the new owner; first: {o}"
            );
        }
        for o in self.overlaps.iter().take(cap) {
            s += &format!("\n  OVERLAP: {o}");
        }
        for (k, a, b) in self.order_violations.iter().take(cap) {
            s += &format!("\n  ORDER: key {k}: seq {b} handled before seq {a}");
        }
        s
    }
}

fn first<T: Clone>(v: &[T], n: usize) -> Vec<T> {
    v.iter().take(n).cloned().collect()
}

/// The fault nearest to the span `[from, to]` whose window `[start, end + aftermath]` meets
/// it, if any.
fn explaining(faults: &[Fault], from: u64, to: u64, aftermath_ms: u64) -> Option<FaultKind> {
    faults
        .iter()
        .filter(|f| {
            f.start_ms.saturating_sub(CLOCK_MARGIN_MS) <= to
                && from <= f.end_ms + aftermath_ms + CLOCK_MARGIN_MS
        })
        .min_by_key(|f| f.start_ms.abs_diff(from))
        .map(|f| f.kind)
}

/// `member` belongs to the pod `pod_ip` (member ids are `<pod_ip>-<group>-<index>`).
fn of_pod(member: &str, pod_ip: &str) -> bool {
    member
        .strip_prefix(pod_ip)
        .is_some_and(|rest| rest.starts_with('-'))
}

/// The handling was in flight across a SIGSTOP of its pod: started before the stop, finished
/// after the SIGCONT.
fn straddles_stop(h: &Handled, faults: &[Fault]) -> bool {
    faults.iter().any(|f| {
        f.kind == FaultKind::StopPod
            && of_pod(&h.member, &f.target)
            && h.started_ms <= f.start_ms + CLOCK_MARGIN_MS
            && h.finished_ms + CLOCK_MARGIN_MS >= f.end_ms
    })
}

/// Checks a history.
pub(crate) fn check(records: &[Handled], faults: &[Fault], cfg: CheckConfig) -> Report {
    let mut report = Report {
        records: records.len(),
        ..Report::default()
    };

    // Lost and duplicates.
    let mut by_seq: HashMap<u64, Vec<&Handled>> = HashMap::new();
    for h in records {
        by_seq.entry(h.seq).or_default().push(h);
    }
    report.lost = (0..cfg.produced)
        .filter(|s| !by_seq.contains_key(s))
        .collect();
    report.unknown = by_seq
        .keys()
        .copied()
        .filter(|s| *s >= cfg.produced)
        .collect();
    report.unknown.sort_unstable();
    let mut seqs: Vec<_> = by_seq.iter().filter(|(_, hs)| hs.len() > 1).collect();
    seqs.sort_by_key(|(s, _)| **s);
    for (seq, hs) in seqs {
        report.duplicates += hs.len() - 1;
        let from = hs.iter().map(|h| h.started_ms).min().unwrap_or(0);
        let to = hs.iter().map(|h| h.finished_ms).max().unwrap_or(0);
        match explaining(faults, from, to, cfg.aftermath_ms) {
            Some(kind) => *report.explained.entry(kind).or_default() += hs.len() - 1,
            None => report.unexplained.push(*seq),
        }
    }

    // Overlaps, per shard.
    let mut by_shard: BTreeMap<u32, Vec<&Handled>> = BTreeMap::new();
    for h in records {
        by_shard.entry(h.shard).or_default().push(h);
    }
    for (shard, mut hs) in by_shard {
        hs.sort_by_key(|h| (h.started_ms, h.finished_ms));
        for (i, a) in hs.iter().enumerate() {
            for b in &hs[i + 1..] {
                if b.started_ms + CLOCK_MARGIN_MS >= a.finished_ms {
                    break;
                }
                if a.member == b.member {
                    continue;
                }
                let overlap_ms = a.finished_ms.min(b.finished_ms) - b.started_ms;
                if overlap_ms <= CLOCK_MARGIN_MS {
                    continue;
                }
                let o = Overlap {
                    shard,
                    a: (*a).clone(),
                    b: (*b).clone(),
                    overlap_ms,
                };
                if straddles_stop(a, faults) {
                    report.stale_inflight.push(o);
                } else if straddles_stop(b, faults) {
                    // `a` of a stale overlap is the stale handling.
                    report.stale_inflight.push(Overlap {
                        a: o.b,
                        b: o.a,
                        ..o
                    });
                } else {
                    report.overlaps.push(o);
                }
            }
        }
    }

    // Per-key order of first handlings; reshards and rollbacks keep per-key order (PROTOCOL §15).
    let order_faults: Vec<Fault> = faults
        .iter()
        .filter(|f| !matches!(f.kind, FaultKind::Reshard | FaultKind::Rollback))
        .cloned()
        .collect();
    let mut firsts: HashMap<&str, Vec<&Handled>> = HashMap::new();
    for hs in by_seq.values() {
        if let Some(h) = hs.iter().min_by_key(|h| (h.started_ms, h.finished_ms)) {
            firsts.entry(h.key.as_str()).or_default().push(h);
        }
    }
    let mut keys: Vec<_> = firsts.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    for (key, mut hs) in keys {
        hs.sort_by_key(|h| (h.started_ms, h.seq));
        let mut max: Option<&Handled> = None;
        for h in hs {
            match max {
                Some(m) if h.seq < m.seq => {
                    if explaining(&order_faults, m.started_ms, h.finished_ms, cfg.aftermath_ms)
                        .is_some()
                    {
                        report.order_explained += 1;
                    } else {
                        report.order_violations.push((key.to_owned(), h.seq, m.seq));
                    }
                }
                _ => max = Some(h),
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(seq: u64, shard: u32, member: &str, started: u64, finished: u64) -> Handled {
        Handled {
            entry_id: format!("{seq}-0"),
            shard,
            member: member.into(),
            key: format!("k{}", seq % 2),
            seq,
            started_ms: started,
            finished_ms: finished,
        }
    }

    fn cfg(produced: u64) -> CheckConfig {
        CheckConfig {
            produced,
            aftermath_ms: 1_000,
        }
    }

    fn fault(kind: FaultKind, target: &str, start: u64, end: u64) -> Fault {
        Fault {
            kind,
            target: target.into(),
            start_ms: start,
            end_ms: end,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let r = check(
            &[
                h(0, 0, "127.0.0.21-g-0", 100, 110),
                h(1, 0, "127.0.0.21-g-0", 110, 120),
                h(2, 0, "127.0.0.22-g-0", 120, 130),
            ],
            &[],
            cfg(3),
        );
        assert!(!r.failed(), "{}", r.summary("clean"));
        assert_eq!(r.duplicates, 0);
    }

    #[test]
    fn lost_and_unexplained_duplicates_fail() {
        let r = check(
            &[h(0, 0, "a-g-0", 100, 110), h(0, 0, "a-g-0", 5_000, 5_010)],
            &[],
            cfg(2),
        );
        assert_eq!(r.lost, vec![1]);
        assert_eq!(r.unexplained, vec![0]);
        assert!(r.failed());
        // The same duplicate around a kill is explained.
        let r = check(
            &[h(0, 0, "a-g-0", 100, 110), h(0, 0, "b-g-0", 2_000, 2_010)],
            &[fault(FaultKind::KillPod, "a", 105, 300)],
            cfg(1),
        );
        assert!(!r.failed(), "{}", r.summary("kill"));
        assert_eq!(r.explained.get(&FaultKind::KillPod), Some(&1));
    }

    #[test]
    fn overlaps_beyond_the_margin_fail_and_stale_inflight_is_classified() {
        let shared = [
            h(0, 3, "127.0.0.21-g-0", 100, 200),
            h(1, 3, "127.0.0.22-g-0", 150, 160),
        ];
        let r = check(&shared, &[], cfg(2));
        assert_eq!(r.overlaps.len(), 1, "{}", r.summary("overlap"));
        assert!(r.failed());
        // Within the clock margin: not an overlap.
        let r = check(
            &[
                h(0, 3, "127.0.0.21-g-0", 100, 200),
                h(1, 3, "127.0.0.22-g-0", 196, 260),
            ],
            &[],
            cfg(2),
        );
        assert!(r.overlaps.is_empty());
        // The earlier handler straddled a SIGSTOP of its pod: the finding behind strict fencing (docs/FENCING.md).
        let stop = fault(FaultKind::StopPod, "127.0.0.21", 120, 190);
        let r = check(&shared, std::slice::from_ref(&stop), cfg(2));
        assert_eq!(r.stale_inflight.len(), 1);
        assert!(r.overlaps.is_empty());
        assert!(!r.failed(), "{}", r.summary("stale"));
        // A handler the stopped pod STARTED after SIGCONT is no excuse.
        let r = check(
            &[
                h(0, 3, "127.0.0.22-g-0", 100, 400),
                h(1, 3, "127.0.0.21-g-0", 200, 210),
            ],
            &[stop],
            cfg(2),
        );
        assert_eq!(r.overlaps.len(), 1);
        // Another pod's IP that merely starts with the stopped one's is not that pod.
        assert!(!of_pod("127.0.0.210-g-0", "127.0.0.21"));
    }

    #[test]
    fn order_inversions_fail_outside_fault_windows() {
        let inverted = [h(2, 0, "a-g-0", 100, 110), h(0, 1, "b-g-0", 5_000, 5_010)];
        let r = check(&inverted, &[], cfg(3));
        assert_eq!(r.order_violations, vec![("k0".into(), 0, 2)]);
        let r = check(
            &inverted,
            &[fault(FaultKind::KillPod, "127.0.0.1", 50, 50)],
            cfg(3),
        );
        assert!(r.order_violations.is_empty());
        assert_eq!(r.order_explained, 1);
    }

    /// Ordered resharding (PROTOCOL §15): a reshard or a rollback no longer excuses an inversion.
    #[test]
    fn reshards_and_rollbacks_do_not_excuse_order_inversions() {
        let inverted = [h(2, 0, "a-g-0", 100, 110), h(0, 1, "b-g-0", 150, 160)];
        for kind in [FaultKind::Reshard, FaultKind::Rollback] {
            let r = check(&inverted, &[fault(kind, "s", 50, 50)], cfg(3));
            assert_eq!(r.order_violations, vec![("k0".into(), 0, 2)], "{kind}");
            assert_eq!(r.order_explained, 0);
        }
    }
}
