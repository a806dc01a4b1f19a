//! Several publishes in flight on one lane (PROTOCOL §21 "Several publishes in flight"): the
//! order of a lane's publishes, the sequence chain of each shard, and who may send or retry
//! when. Pure state, no I/O: the producer keeps one [`Window`] per lane behind a mutex and
//! waits on its changes.
//!
//! Each publish takes a ticket, in call order. A ticket is sent first when it is fewer than
//! `max_in_flight` tickets after the oldest one not yet settled. Each write to a shard passes
//! `prev`, the last sequence the lane placed on that shard before it (the chain's tail): the
//! check refuses the write unless the shard's producer record ends exactly there, so a later
//! publish never lands on a shard before an earlier one that was refused, aborted or lost.
//! A publish sends again (after any error, abort or refusal) only once every earlier ticket
//! is settled, and then with `prev` = the last sequence known written on the shard: retries
//! go out in ticket order. A publish that fails (or is dropped) poisons its shards: a later
//! ticket that still has to write there fails instead of landing after it, and the lane
//! takes no new publishes (the producer starts a new lane).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// A publish's place in its lane's order.
pub(super) type Ticket = u64;

/// What a lane knows of one shard.
#[derive(Debug, Default, Clone)]
struct Chain {
    /// The newest ticket placed on the shard and the last sequence it placed there: the next
    /// placement's `prev`.
    tail: Option<(Ticket, u64)>,
    /// The newest ticket known written on the shard, its last sequence there (the producer
    /// record's `s`) and when the attempt that wrote it was sent.
    written: Option<(Ticket, u64, Instant)>,
    /// Tickets placed on the shard and not settled.
    open: usize,
}

/// The order and sequence chains of one lane.
#[derive(Debug)]
pub(super) struct Window {
    max: usize,
    next: Ticket,
    /// Tickets not settled, with the shard keys each placed records on.
    open: BTreeSet<Ticket>,
    /// Tickets not placed yet: placements (sequences, chains) are made in ticket order.
    unplaced: BTreeSet<Ticket>,
    /// Tickets not sent yet: first attempts go out in ticket order.
    unsent: BTreeSet<Ticket>,
    placed: HashMap<Ticket, Vec<String>>,
    chains: HashMap<String, Chain>,
    /// By shard key: the oldest ticket that failed there.
    failed: HashMap<String, Ticket>,
}

impl Window {
    /// A lane with at most `max_in_flight` publishes sent and not settled (at least 1).
    pub(super) fn new(max_in_flight: usize) -> Self {
        Window {
            max: max_in_flight.max(1),
            next: 0,
            open: BTreeSet::new(),
            unplaced: BTreeSet::new(),
            unsent: BTreeSet::new(),
            placed: HashMap::new(),
            chains: HashMap::new(),
            failed: HashMap::new(),
        }
    }

    /// A new publish: its ticket, after every ticket taken before.
    pub(super) fn open(&mut self) -> Ticket {
        let t = self.next;
        self.next += 1;
        self.open.insert(t);
        self.unplaced.insert(t);
        self.unsent.insert(t);
        t
    }

    /// `t` may be placed a first time: every earlier ticket was placed (or settled).
    pub(super) fn may_place(&self, t: Ticket) -> bool {
        self.unplaced.first().is_none_or(|&u| u >= t)
    }

    /// `t`'s first attempt goes out now: the next ticket may follow.
    pub(super) fn sent(&mut self, t: Ticket) {
        self.unsent.remove(&t);
    }

    /// A publish failed on this lane: the lane takes no new publishes.
    pub(super) fn retired(&self) -> bool {
        !self.failed.is_empty()
    }

    /// `t` may be sent a first time: every earlier ticket was sent, and `t` is fewer than
    /// `max_in_flight` tickets after the oldest one not settled.
    pub(super) fn may_send(&self, t: Ticket) -> bool {
        self.unsent.first().is_none_or(|&u| u >= t)
            && self.open.first().is_none_or(|&o| t < o + self.max as u64)
    }

    /// `t` may be sent again: every earlier ticket is settled.
    pub(super) fn may_retry(&self, t: Ticket) -> bool {
        self.open.first().is_none_or(|&o| o >= t)
    }

    /// The first shard key of `shards` on which an earlier ticket than `t` failed: `t`
    /// must not write there.
    pub(super) fn blocked<'a>(&self, t: Ticket, shards: &'a [String]) -> Option<&'a str> {
        (shards.iter())
            .find(|k| self.failed.get(*k).is_some_and(|&f| f < t))
            .map(String::as_str)
    }

    /// Places `t`'s records on `parts` (shard key, the last sequence written there by this
    /// placement), for an attempt sent `now`: per part, `(prev, known)`. `prev` is the
    /// sequence the shard's producer record must end at for the write to run (0: none
    /// asked: nothing of the lane on the shard within `window`); `known` the last sequence
    /// known written there (0: none within `window`; a record behind it is a loss).
    /// A first attempt chains on the tail; a retry (every earlier ticket settled) on what is
    /// known written.
    pub(super) fn place(
        &mut self,
        t: Ticket,
        parts: &[(String, u64)],
        retry: bool,
        now: Instant,
        window: Duration,
    ) -> Vec<(u64, u64)> {
        self.unplaced.remove(&t);
        let keys: Vec<String> = parts.iter().map(|(k, _)| k.clone()).collect();
        if let Some(old) = self.placed.insert(t, keys) {
            for k in old {
                if let Some(c) = self.chains.get_mut(&k) {
                    c.open = c.open.saturating_sub(1);
                }
            }
        }
        let mut out = Vec::with_capacity(parts.len());
        for (key, last) in parts {
            let c = self.chains.entry(key.clone()).or_default();
            let fresh = |w: &(Ticket, u64, Instant)| now.saturating_duration_since(w.2) < window;
            let known = c.written.as_ref().filter(|w| fresh(w)).map_or(0, |w| w.1);
            let prev = match c.tail {
                // An earlier ticket is still open on the shard: chain on its last sequence.
                Some((_, tail)) if !retry && c.open > 0 => tail,
                _ => known,
            };
            c.open += 1;
            if c.tail.is_none_or(|(tt, _)| tt <= t) {
                c.tail = Some((t, *last));
            }
            out.push((prev, known));
        }
        out
    }

    /// `t` wrote on `key` up to sequence `last`, in an attempt sent `at` (or an earlier
    /// attempt's write was found).
    pub(super) fn written(&mut self, t: Ticket, key: &str, last: u64, at: Instant) {
        let c = self.chains.entry(key.to_owned()).or_default();
        if c.written.is_none_or(|(wt, _, _)| wt <= t) {
            c.written = Some((t, last, at));
        }
    }

    /// `t` is settled: done (`ok`), or failed, in which case its shards are poisoned for the
    /// tickets after it and the lane retires. A ticket never sent wrote nothing: its end
    /// poisons nothing (the tickets chained on it are refused for order once and retried).
    pub(super) fn close(&mut self, t: Ticket, ok: bool) {
        self.unplaced.remove(&t);
        let ok = ok || self.unsent.remove(&t);
        if !self.open.remove(&t) {
            return;
        }
        for k in self.placed.remove(&t).unwrap_or_default() {
            if let Some(c) = self.chains.get_mut(&k) {
                c.open = c.open.saturating_sub(1);
            }
            if !ok {
                self.failed.entry(k).or_insert(t);
            }
        }
    }

    /// No ticket open.
    #[cfg(test)]
    fn idle(&self) -> bool {
        self.open.is_empty()
    }

    /// Forgets the shards not written within `window` and with nothing open (an idle
    /// lane's records expire; the chain starts again there with `prev` 0).
    pub(super) fn forget_idle(&mut self, now: Instant, window: Duration) {
        self.chains.retain(|_, c| {
            c.open > 0
                || c.written
                    .is_some_and(|w| now.saturating_duration_since(w.2) < window)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn part(k: &str, last: u64) -> (String, u64) {
        (k.to_owned(), last)
    }

    #[test]
    fn tickets_are_sent_within_the_window_and_retried_in_order() {
        let mut w = Window::new(3);
        let t: Vec<Ticket> = (0..5).map(|_| w.open()).collect();
        assert!(w.may_send(t[0]));
        assert!(!w.may_send(t[1]), "t0 goes out first");
        w.sent(t[0]);
        w.sent(t[1]);
        assert!(w.may_send(t[2]));
        w.sent(t[2]);
        assert!(!w.may_send(t[3]), "three in flight at most");
        assert!(w.may_retry(t[0]));
        assert!(!w.may_retry(t[1]), "t0 is not settled");
        // t1 settles first: the window still counts from t0.
        w.close(t[1], true);
        assert!(!w.may_send(t[3]));
        assert!(!w.may_retry(t[2]));
        w.close(t[0], true);
        assert!(w.may_send(t[3]) && !w.may_send(t[4]));
        w.sent(t[3]);
        assert!(w.may_send(t[4]));
        assert!(w.may_retry(t[2]));
        assert!(!w.may_retry(t[3]));
    }

    #[test]
    fn first_attempts_chain_on_the_shard_and_retries_on_what_is_written() {
        let now = Instant::now();
        let mut w = Window::new(5);
        let (a, b, c) = (w.open(), w.open(), w.open());
        // a: nothing known on s:0, no chain asked.
        assert_eq!(w.place(a, &[part("s:0", 3)], false, now, DAY), [(0, 0)]);
        // b chains on a's last sequence on s:0; s:1 is new.
        let got = w.place(b, &[part("s:0", 5), part("s:1", 6)], false, now, DAY);
        assert_eq!(got, [(3, 0), (0, 0)]);
        assert_eq!(w.place(c, &[part("s:1", 9)], false, now, DAY), [(6, 0)]);
        // a lands; b's attempt was lost (a reset): it retries once a is settled, chained
        // on what is known written, and c after it.
        w.written(a, "s:0", 3, now);
        w.close(a, true);
        assert!(w.may_retry(b));
        let got = w.place(b, &[part("s:0", 5), part("s:1", 6)], true, now, DAY);
        assert_eq!(got, [(3, 3), (0, 0)]);
        w.written(b, "s:0", 5, now);
        w.written(b, "s:1", 6, now);
        w.close(b, true);
        assert_eq!(w.place(c, &[part("s:1", 9)], true, now, DAY), [(6, 6)]);
        // A new publish after everything settled chains on what is written: prev == known.
        w.written(c, "s:1", 9, now);
        w.close(c, true);
        let d = w.open();
        assert_eq!(w.place(d, &[part("s:1", 12)], false, now, DAY), [(9, 9)]);
    }

    #[test]
    fn a_placement_moved_elsewhere_is_retried_past_in_ticket_order() {
        let now = Instant::now();
        let mut w = Window::new(5);
        let (a, b) = (w.open(), w.open());
        w.place(a, &[part("s:0", 2)], false, now, DAY);
        // a is refused (stale epoch) and placed on s:1 under the new routing.
        w.place(a, &[part("s:1", 2)], true, now, DAY);
        // b, first attempt on s:0 while a is open elsewhere: nothing open there, no chain.
        assert_eq!(w.place(b, &[part("s:0", 4)], false, now, DAY), [(0, 0)]);
        let c = w.open();
        // (c, placed while a is open elsewhere and b on s:0, chains on b.)
        assert_eq!(w.place(c, &[part("s:0", 5)], false, now, DAY), [(4, 0)]);
        w.written(a, "s:1", 2, now);
        w.close(a, true);
        assert_eq!(w.place(b, &[part("s:0", 4)], true, now, DAY), [(0, 0)]);
    }

    #[test]
    fn a_failed_ticket_blocks_later_ones_on_its_shards_only_and_retires_the_lane() {
        let now = Instant::now();
        let mut w = Window::new(5);
        let (a, b, c) = (w.open(), w.open(), w.open());
        w.place(a, &[part("s:0", 1)], false, now, DAY);
        w.place(b, &[part("s:0", 2)], false, now, DAY);
        w.place(c, &[part("s:1", 3)], false, now, DAY);
        for t in [a, b, c] {
            w.sent(t);
        }
        assert!(!w.retired());
        w.close(a, false);
        assert!(w.retired());
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(w.blocked(b, &keys(&["s:0"])), Some("s:0"));
        assert_eq!(w.blocked(c, &keys(&["s:1"])), None);
        assert_eq!(w.blocked(a, &keys(&["s:0"])), None, "not after itself");
        w.close(b, false);
        w.close(c, true);
        assert!(w.idle());
    }

    #[test]
    fn tickets_are_placed_in_order_whatever_order_their_routing_arrives_in() {
        let now = Instant::now();
        let mut w = Window::new(5);
        let (a, b) = (w.open(), w.open());
        assert!(w.may_place(a) && !w.may_place(b));
        w.place(a, &[part("s:0", 1)], false, now, DAY);
        assert!(w.may_place(b));
        let c = w.open();
        // b's routing never came (its publish failed before placing): c goes on.
        w.close(b, false);
        assert!(w.may_place(c) && !w.retired());
    }

    #[test]
    fn a_ticket_dropped_before_it_was_sent_poisons_nothing() {
        let now = Instant::now();
        let mut w = Window::new(5);
        let (a, b) = (w.open(), w.open());
        w.place(a, &[part("s:0", 1)], false, now, DAY);
        w.sent(a);
        w.place(b, &[part("s:0", 2)], false, now, DAY);
        w.close(b, false);
        assert!(!w.retired());
        let c = w.open();
        assert!(w.may_send(c), "the window moves past b");
        w.close(a, false);
        assert!(w.retired(), "a was sent: its failure poisons s:0");
    }

    #[test]
    fn a_shard_idle_past_the_window_is_not_chained_nor_compared() {
        let t0 = Instant::now();
        let window = Duration::from_secs(10);
        let mut w = Window::new(5);
        let a = w.open();
        w.place(a, &[part("s:0", 4)], false, t0, window);
        w.written(a, "s:0", 4, t0);
        w.close(a, true);
        let b = w.open();
        let later = t0 + window;
        assert_eq!(
            w.place(b, &[part("s:0", 6)], false, later, window),
            [(0, 0)]
        );
        w.written(b, "s:0", 6, later);
        w.close(b, true);
        w.forget_idle(later + window, window);
        assert!(w.chains.is_empty());
    }

    #[test]
    fn a_lower_ticket_found_written_late_does_not_move_the_chain_back() {
        let now = Instant::now();
        let mut w = Window::new(5);
        let (a, b) = (w.open(), w.open());
        w.place(a, &[part("s:0", 1)], false, now, DAY);
        w.place(b, &[part("s:0", 2)], false, now, DAY);
        w.written(b, "s:0", 2, now);
        w.written(a, "s:0", 1, now);
        w.close(a, true);
        w.close(b, true);
        let c = w.open();
        assert_eq!(w.place(c, &[part("s:0", 3)], false, now, DAY), [(2, 2)]);
    }
}
