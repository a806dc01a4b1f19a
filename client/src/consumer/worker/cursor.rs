//! What a shard worker knows of its place in the shard, for the doorbell (pure: reads' results
//! in, decisions out; no I/O). See [`crate::consumer::doorbell`].
//!
//! The doorbell's fallback poll wakes a worker when the shard holds an entry after the last
//! one the worker knows of. That id must never be ahead of the group (an entry between it and
//! the group's position would never wake anyone: it would be read only at the next ring) and
//! should not stay behind (every poll would then wake the worker for nothing). The rules:
//!
//! - after a read of new entries (`>`), the last of them is the group's position;
//! - after a read of new entries that found none, the position is known only if the read
//!   learned the stream's last id (an `XREVRANGE … COUNT 1` sent before it, in the same round
//!   trip); otherwise the one known before stays;
//! - a wake-up by the poll followed by a read that found nothing means the known id is
//!   behind (another consumer read the entries): it is forgotten, and the next read learns it;
//! - with no id known, the worker does not wait: it reads again, learning it;
//! - a seek moves the group's position without the worker (PROTOCOL §18): at the resume that
//!   follows it, the known id is forgotten.

use crate::consumer::doorbell::Woken;
use rsc_protocol::routing::parse_entry_id;

/// The worker's known position (see the module docs).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// The last entry id the shard is known to hold, at or behind the group's position.
    last_seen: Option<String>,
    /// The last wake-up came from the poll.
    polled: bool,
}

/// What the worker does after a read of new entries found none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait on the doorbell for entries after this id.
    WaitAfter(String),
    /// Read again at once, learning the stream's last id.
    ReadAgain,
}

impl Cursor {
    /// Whether the next read of new entries must learn the stream's last id.
    pub(crate) fn must_learn(&self) -> bool {
        self.last_seen.is_none()
    }

    /// A read of new entries returned these, the last being `last`.
    pub(crate) fn read_entries(&mut self, last: &str) {
        if parse_entry_id(last).is_some() {
            self.last_seen = Some(last.to_owned());
        }
        self.polled = false;
    }

    /// A read of new entries found none; `learned`: the stream's last id, when the read
    /// asked (`0-0` for an empty stream).
    pub(crate) fn read_nothing(&mut self, learned: Option<String>) -> Next {
        match learned.filter(|id| parse_entry_id(id).is_some()) {
            Some(id) => self.last_seen = Some(id),
            None if self.polled => self.last_seen = None,
            None => {}
        }
        self.polled = false;
        match &self.last_seen {
            Some(id) => Next::WaitAfter(id.clone()),
            None => Next::ReadAgain,
        }
    }

    /// The doorbell woke the worker.
    pub(crate) fn woken(&mut self, by: Woken) {
        self.polled = by == Woken::Poll;
    }

    /// The group's position may have moved without this worker (a seek, PROTOCOL §18): the
    /// known id may be ahead of it now. Forgotten: the next read that finds nothing learns
    /// the stream's last id again.
    pub(crate) fn forget(&mut self) {
        self.last_seen = None;
        self.polled = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_unknown_position_is_learned_before_waiting() {
        let mut c = Cursor::default();
        assert!(c.must_learn());
        assert_eq!(c.read_nothing(None), Next::ReadAgain);
        assert_eq!(
            c.read_nothing(Some("0-0".into())),
            Next::WaitAfter("0-0".into())
        );
        assert!(!c.must_learn());
    }

    #[test]
    fn new_entries_move_the_position_and_a_ring_keeps_it() {
        let mut c = Cursor::default();
        c.read_entries("5-0");
        c.woken(Woken::Ring);
        // A ring whose entry was read already (the permit kept while busy): wait again.
        assert_eq!(c.read_nothing(None), Next::WaitAfter("5-0".into()));
    }

    #[test]
    fn a_poll_for_nothing_forgets_the_position() {
        let mut c = Cursor::default();
        c.read_entries("5-0");
        c.woken(Woken::Poll);
        assert_eq!(c.read_nothing(None), Next::ReadAgain);
        assert!(c.must_learn());
        assert_eq!(
            c.read_nothing(Some("9-3".into())),
            Next::WaitAfter("9-3".into())
        );
    }

    #[test]
    fn a_poll_that_found_entries_is_not_held_against_the_next_empty_read() {
        let mut c = Cursor::default();
        c.read_entries("5-0");
        c.woken(Woken::Poll);
        c.read_entries("7-0");
        assert_eq!(c.read_nothing(None), Next::WaitAfter("7-0".into()));
    }

    /// A simulated shard: `written` entries (ids 1..=written), the group's position, and a
    /// foreign consumer that may read ahead. Whatever happens, a worker that waits waits after
    /// an id at or behind the group's position, so no entry the group has not read goes
    /// unnoticed by the poll.
    #[derive(Debug, Clone)]
    enum Step {
        Write(u8),
        ForeignRead,
        Read { learn_always: bool },
        Wake(bool),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u8..4).prop_map(Step::Write),
            Just(Step::ForeignRead),
            any::<bool>().prop_map(|learn_always| Step::Read { learn_always }),
            any::<bool>().prop_map(Step::Wake),
        ]
    }

    proptest! {
        #[test]
        fn the_known_position_is_never_ahead_of_the_group(steps in prop::collection::vec(step(), 1..60)) {
            let mut c = Cursor::default();
            let (mut written, mut delivered) = (0u64, 0u64);
            for s in steps {
                match s {
                    Step::Write(n) => written += u64::from(n),
                    Step::ForeignRead => delivered = written,
                    Step::Read { learn_always } => {
                        let learn = learn_always || c.must_learn();
                        let learned = learn.then(|| format!("{written}-0"));
                        if delivered < written {
                            delivered = written;
                            c.read_entries(&format!("{written}-0"));
                        } else if let Next::WaitAfter(id) = c.read_nothing(learned) {
                            let (ms, _) = parse_entry_id(&id).expect("an id");
                            prop_assert!(ms <= delivered, "waits after {id}, group at {delivered}");
                        }
                    }
                    Step::Wake(poll) => c.woken(if poll { Woken::Poll } else { Woken::Ring }),
                }
            }
        }
    }
}
