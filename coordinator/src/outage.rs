//! Store outages must not expire members: while the metadata store is unreachable (a Redis
//! failover, a network cut), no heartbeat can be recorded, so every member's silence grows
//! through no fault of its own. Without care, the first sweep after the outage would expire
//! every member whose session ran out during it — a mass expiry and a full rebalance of every
//! group.
//!
//! [`StoreOutages`] is the pure record of what this coordinator saw: the last time a store
//! call succeeded, whether calls have been failing since, and after recovery the outage's
//! length. Expiry decisions then use a clock set back by that length
//! ([`StoreOutages::shift_ms`]) until every member has had a full session after the outage
//! to heartbeat again: a member's session is, in effect, extended by the outage. A member
//! that was silent before the outage still expires, late by at most the outage's length.
//!
//! The outage is measured conservatively, from the last success before the failures to the
//! first success after them (a failed call may have started well before it failed).
//!
//! A metadata rollback is treated the same way ([`StoreOutages::rolled_back`]): when the
//! store's documents go back in time (a Redis failover that lost writes, a demoted master
//! resynced from the real one), the liveness recorded beside them went back too, and members
//! that did heartbeat would look silent. The rollback's length (how far back the documents
//! went, see `DocCache::went_back`) becomes a credit like an outage's.

/// Outages closer together than this add up (a flapping store).
const MERGE_WINDOW_MS: u64 = 60_000;

/// The last outage's credit: its length and when it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutageCredit {
    /// How long the store was unreachable, in ms (several close outages summed).
    pub length_ms: u64,
    /// When this coordinator saw the store answer again.
    pub ended_ms: u64,
}

/// What this coordinator saw of the store's availability (see the module docs). No I/O, the
/// time is passed in.
#[derive(Debug, Default, Clone)]
pub(crate) struct StoreOutages {
    last_ok_ms: Option<u64>,
    failing: bool,
    credit: Option<OutageCredit>,
}

impl StoreOutages {
    /// A store call succeeded at `now_ms`. The first success after failures closes the
    /// outage; returns it when it did.
    pub(crate) fn ok(&mut self, now_ms: u64) -> Option<OutageCredit> {
        let mut closed = None;
        if self.failing {
            self.failing = false;
            if let Some(start) = self.last_ok_ms {
                let mut length_ms = now_ms.saturating_sub(start);
                if let Some(prev) = self.credit
                    && start <= prev.ended_ms + MERGE_WINDOW_MS
                {
                    length_ms += prev.length_ms;
                }
                let credit = OutageCredit {
                    length_ms,
                    ended_ms: now_ms,
                };
                self.credit = Some(credit);
                closed = Some(credit);
            }
        }
        self.last_ok_ms = Some(self.last_ok_ms.map_or(now_ms, |t| t.max(now_ms)));
        closed
    }

    /// At `now_ms` the store was found to hold documents `length_ms` older than ones this
    /// coordinator had seen (a rollback): a credit of that length, merged with a recent
    /// outage's (a failover usually causes both). Returns the credit.
    pub(crate) fn rolled_back(&mut self, now_ms: u64, length_ms: u64) -> OutageCredit {
        let mut length_ms = length_ms;
        if let Some(prev) = self.credit
            && now_ms <= prev.ended_ms + MERGE_WINDOW_MS
        {
            length_ms += prev.length_ms;
        }
        let credit = OutageCredit {
            length_ms,
            ended_ms: now_ms,
        };
        self.credit = Some(credit);
        credit
    }

    /// A store call that started at `started_ms` failed at `now_ms` (the store was
    /// unreachable, or did not answer in time).
    ///
    /// A call that was already in flight when the last outage was declared over (it started
    /// before the first success after it) was part of that outage: its caller — a member's
    /// heartbeat held on a frozen server until its deadline — could not be heard until
    /// `now_ms`, however well the store answered others meanwhile. That outage's credit is
    /// extended to `now_ms`, so the caller's retry is judged as if it had heartbeat then.
    pub(crate) fn failed(&mut self, started_ms: u64, now_ms: u64) {
        match &mut self.credit {
            Some(c) if !self.failing && started_ms < c.ended_ms => {
                if now_ms > c.ended_ms {
                    c.length_ms += now_ms - c.ended_ms;
                    c.ended_ms = now_ms;
                }
            }
            _ => self.failing = true,
        }
    }

    /// The last outage's credit, if any.
    #[cfg(test)]
    pub(crate) fn credit(&self) -> Option<OutageCredit> {
        self.credit
    }

    /// Whether calls have been failing since the last success.
    #[cfg(test)]
    pub(crate) fn failing(&self) -> bool {
        self.failing
    }

    /// How far back to set the clock for expiry decisions at `now_ms` in a group whose
    /// session timeout is `session_timeout_ms`: the outage's length until every member had a
    /// full session after it, then 0.
    pub(crate) fn shift_ms(&self, now_ms: u64, session_timeout_ms: u64) -> u64 {
        match self.credit {
            Some(c) if now_ms <= c.ended_ms + session_timeout_ms => c.length_ms,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_outage_no_shift() {
        let mut o = StoreOutages::default();
        assert_eq!(o.ok(1_000), None);
        assert_eq!(o.ok(2_000), None);
        assert_eq!(o.shift_ms(2_000, 10_000), 0);
    }

    #[test]
    fn an_outage_extends_sessions_by_its_length_for_one_session() {
        let mut o = StoreOutages::default();
        o.ok(1_000);
        o.failed(1_000, 3_500);
        o.failed(1_100, 3_600);
        assert!(o.failing());
        // Measured from the last success, not from the first failure.
        let credit = o.ok(9_000).unwrap();
        assert_eq!(credit.length_ms, 8_000);
        assert_eq!(o.shift_ms(9_000, 5_000), 8_000);
        assert_eq!(o.shift_ms(14_000, 5_000), 8_000);
        assert_eq!(
            o.shift_ms(14_001, 5_000),
            0,
            "every member had a session to come back"
        );
        // A member last heard at 500 with a 5 s session, seen at 9 000: silent 8 500 ms, but
        // 8 000 of them were the outage: it is judged at 1 000 and stays.
        let judged_at = 9_000 - o.shift_ms(9_000, 5_000);
        assert!(judged_at - 500 <= 5_000);
    }

    #[test]
    fn failures_before_any_success_give_no_credit() {
        // A coordinator started during the outage knows no start: members it has never seen
        // heartbeat are judged by their recorded heartbeats.
        let mut o = StoreOutages::default();
        o.failed(0, 100);
        assert_eq!(o.ok(5_000), None);
        assert_eq!(o.shift_ms(5_000, 10_000), 0);
    }

    #[test]
    fn a_rollback_extends_sessions_like_an_outage_and_adds_to_one() {
        let mut o = StoreOutages::default();
        o.ok(0);
        // Liveness went 10 s back; no outage before.
        let c = o.rolled_back(20_000, 10_000);
        assert_eq!(c.length_ms, 10_000);
        assert_eq!(o.shift_ms(20_000, 2_000), 10_000);
        assert_eq!(o.shift_ms(22_000, 2_000), 10_000);
        assert_eq!(o.shift_ms(22_001, 2_000), 0);
        // A member heard last at 9 000 (rolled back), seen at 20 000 with a 2 s session:
        // judged at 10 000, it stays.
        assert!(20_000 - o.shift_ms(20_000, 2_000) - 9_000 <= 2_000);
        // The failover's own outage, then the rollback it caused: both count.
        let mut o = StoreOutages::default();
        o.ok(0);
        o.failed(0, 1_000);
        o.ok(3_000);
        assert_eq!(o.rolled_back(3_500, 8_000).length_ms, 3_000 + 8_000);
    }

    #[test]
    fn close_outages_add_up_and_distant_ones_do_not() {
        let mut o = StoreOutages::default();
        o.ok(0);
        o.failed(0, 500);
        o.ok(2_000);
        o.failed(2_000, 2_500);
        assert_eq!(o.ok(5_000).unwrap().length_ms, 2_000 + 3_000);
        o.ok(200_000);
        o.failed(200_000, 200_500);
        assert_eq!(o.ok(201_000).unwrap().length_ms, 1_000);
    }

    #[test]
    fn a_call_held_across_the_recovery_extends_the_outage_to_its_failure() {
        let mut o = StoreOutages::default();
        o.ok(1_000);
        // Frozen from 1 000: a heartbeat's call starts at 2 000 and is held until its 2 s
        // deadline; another caller reaches the store again at 3 000 (a new master).
        o.failed(1_100, 2_100);
        assert_eq!(o.ok(3_000).unwrap().length_ms, 2_000);
        o.ok(3_500);
        o.failed(2_000, 4_000);
        assert!(!o.failing(), "the store answers the others");
        assert_eq!(
            o.credit(),
            Some(OutageCredit {
                length_ms: 3_000,
                ended_ms: 4_000
            })
        );
        // Its member retries at 4 400, last heard at 900, 2 s session: judged at 1 400.
        assert_eq!(o.shift_ms(4_400, 2_000), 3_000);
        assert!(4_400 - o.shift_ms(4_400, 2_000) - 900 <= 2_000);
        // It had a full session from 4 000 to come back in.
        assert_eq!(o.shift_ms(6_000, 2_000), 3_000);
        assert_eq!(o.shift_ms(6_001, 2_000), 0);
        // A call that started after the recovery and failed is a new outage, not this one.
        o.failed(5_000, 5_100);
        assert!(o.failing());
        assert_eq!(o.ok(5_200).unwrap().length_ms, 3_000 + 1_700);
    }
}
