//! Per-key order through reshards (PROTOCOL §15): the hold-and-release logic of a shard worker.
//!
//! At every routing-epoch switch the coordinator seals each shard: `{<shard key>}:seals`
//! gets, under the new epoch, the last entry id written before the switch and the shard count
//! before it (see `rsc_protocol::routing::Seal`). Producers write through a fence on the
//! shard's epoch marker, so an entry with an id after shard S's seal of epoch `e` (and up to
//! its next seal) was written under epoch `e`. Its key's shard under epoch `e - 1` (the
//! parent) is `shard_for_key(key, from_count)`, computable here. When the parent is another
//! shard, the key moved at that switch: the entry may be handled only once the group has
//! handled and acknowledged every entry of the parent up to the parent's seal of epoch `e`
//! (parent first, per group). A key whose shard did not change is never held; entries of
//! other keys keep flowing while a moved key waits; one key's entries stay in order (an
//! entry of a held key waits behind it even when its own gate is open).
//!
//! The worker learns the parents' progress from the data Redis, not from the heartbeat
//! answer: the release condition is a fact about the parent's pending entries list and the
//! group's last-delivered id, which the data Redis knows exactly and at once (one script
//! call per waiting parent, `SEAL_PROGRESS_LUA`); going through the coordinator would add a
//! heartbeat interval of delay and coordinator load, and would stop releases during a
//! coordinator restart.

use rsc_protocol::routing::{Seal, parse_entry_id, shard_for_key};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// A parent a moved key waits for: shard `parent` must be drained by the group up to its
/// seal of the switch to routing epoch `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Gate {
    /// The key's shard before the switch.
    pub(crate) parent: u32,
    /// The routing epoch the switch started.
    pub(crate) epoch: u64,
}

/// The seals of one shard, by the epoch of the switch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SealBook {
    seals: BTreeMap<u64, ((u64, u64), u32)>,
}

impl SealBook {
    /// From the fields of a `{<shard key>}:seals` hash (unparsable fields are skipped).
    pub(crate) fn from_hash(fields: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut seals = BTreeMap::new();
        for (epoch, value) in fields {
            if let (Ok(epoch), Some(seal)) = (epoch.parse::<u64>(), Seal::parse(&value))
                && let Some(id) = parse_entry_id(&seal.id)
            {
                seals.insert(epoch, (id, seal.from_count));
            }
        }
        SealBook { seals }
    }

    /// The highest seal id known: entries up to it are classified for good; an entry after
    /// it may belong to a switch this book does not know yet (read the hash again).
    pub(crate) fn covers(&self, id: &str) -> bool {
        let Some(id) = parse_entry_id(id) else {
            return true;
        };
        self.seals.values().any(|(seal, _)| id <= *seal)
    }

    /// The gate of an entry of shard `shard` with this id and key: `None` when its key did
    /// not move at the switch it was written after (or it predates every known switch).
    pub(crate) fn gate_for(&self, shard: u32, id: &str, key: &[u8]) -> Option<Gate> {
        let id = parse_entry_id(id)?;
        // Written under the latest epoch whose seal it follows.
        let (&epoch, &(_, from_count)) = self.seals.iter().rev().find(|(_, (s, _))| *s < id)?;
        let parent = shard_for_key(key, from_count);
        (parent != shard).then_some(Gate { parent, epoch })
    }

    /// Whether the book knows no switch.
    pub(crate) fn is_empty(&self) -> bool {
        self.seals.is_empty()
    }
}

/// Entries held aside until their key's parent reached its seal, per key in stream order.
#[derive(Debug)]
pub(crate) struct HoldQueue<T> {
    held: HashMap<String, VecDeque<(String, T, Option<Gate>)>>,
    ids: HashSet<String>,
    released: HashSet<Gate>,
}

impl<T> Default for HoldQueue<T> {
    fn default() -> Self {
        HoldQueue {
            held: HashMap::new(),
            ids: HashSet::new(),
            released: HashSet::new(),
        }
    }
}

impl<T> HoldQueue<T> {
    /// An entry read in stream order: returned when it may be handled now; held (`None`)
    /// when its key waits for a parent, or an earlier entry of its key is held, or it is
    /// already held (a re-read of this member's pending entries).
    pub(crate) fn admit(
        &mut self,
        id: &str,
        key: Option<&str>,
        gate: Option<Gate>,
        entry: T,
    ) -> Option<T> {
        if self.ids.contains(id) {
            return None;
        }
        let Some(key) = key else {
            return Some(entry);
        };
        let gate = gate.filter(|g| !self.released.contains(g));
        match self.held.get_mut(key) {
            Some(q) => q.push_back((id.to_owned(), entry, gate)),
            None if gate.is_some() => {
                self.held.insert(
                    key.to_owned(),
                    VecDeque::from([(id.to_owned(), entry, gate)]),
                );
            }
            None => return Some(entry),
        }
        self.ids.insert(id.to_owned());
        None
    }

    /// The gates the held keys wait for now (those at the head of a key's queue).
    pub(crate) fn waiting_for(&self) -> Vec<Gate> {
        let mut out: Vec<Gate> = self
            .held
            .values()
            .filter_map(|q| q.front().and_then(|(_, _, g)| *g))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Whether `gate` is known open.
    pub(crate) fn is_released(&self, gate: &Gate) -> bool {
        self.released.contains(gate)
    }

    /// Records that `gate`'s parent reached its seal; returns the entries now free to go, in
    /// stream order per key (and in the order of their first id across keys).
    pub(crate) fn release(&mut self, gate: Gate) -> Vec<T> {
        self.released.insert(gate);
        let mut freed: Vec<(String, T)> = Vec::new();
        let released = &self.released;
        self.held.retain(|_, q| {
            while let Some((_, _, g)) = q.front() {
                if g.is_some_and(|g| !released.contains(&g)) {
                    break;
                }
                if let Some((id, e, _)) = q.pop_front() {
                    freed.push((id, e));
                }
            }
            !q.is_empty()
        });
        freed.sort_by_key(|(id, _)| parse_entry_id(id));
        freed
            .into_iter()
            .map(|(id, e)| {
                self.ids.remove(&id);
                e
            })
            .collect()
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(seals: &[(u64, &str, u32)]) -> SealBook {
        SealBook::from_hash(
            seals
                .iter()
                .map(|(e, id, n)| (e.to_string(), format!("{id}/{n}"))),
        )
    }

    /// A key whose shard is the same under both counts is never held; one that moved waits
    /// for its parent, only after the seal.
    #[test]
    fn only_moved_keys_get_a_gate() {
        let b = book(&[(2, "100-0", 4)]);
        let (mut stayed, mut moved) = (None, None);
        for i in 0..1000 {
            let k = format!("k{i}");
            let (s4, s8) = (
                shard_for_key(k.as_bytes(), 4),
                shard_for_key(k.as_bytes(), 8),
            );
            if s4 == s8 && stayed.is_none() {
                stayed = Some((k, s8));
            } else if s4 != s8 && moved.is_none() {
                moved = Some((k, s4, s8));
            }
        }
        let (k, s) = stayed.unwrap();
        assert_eq!(b.gate_for(s, "200-0", k.as_bytes()), None);
        let (k, parent, s) = moved.unwrap();
        assert_eq!(
            b.gate_for(s, "200-0", k.as_bytes()),
            Some(Gate { parent, epoch: 2 })
        );
        // Up to the seal: written before the switch, no gate.
        assert_eq!(b.gate_for(s, "100-0", k.as_bytes()), None);
        assert!(b.covers("100-0") && !b.covers("100-1"));
    }

    /// Every key of every shard, over random reshard chains: the gate is set exactly when the
    /// key's shard under the previous count differs.
    #[test]
    fn gate_matches_the_routing_history() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..50 {
            let counts: Vec<u32> = (0..4).map(|_| 1 + (next() % 12) as u32).collect();
            // Switch e (2..) from counts[e-2] to counts[e-1], seal ids 100*e.
            let seals: Vec<(u64, String, u32)> = (1..counts.len())
                .map(|i| (i as u64 + 1, format!("{}-0", 100 * (i + 1)), counts[i - 1]))
                .collect();
            let b = SealBook::from_hash(
                seals
                    .iter()
                    .map(|(e, id, n)| (e.to_string(), format!("{id}/{n}"))),
            );
            for i in 0..200 {
                let k = format!("key-{i}");
                for (e, count) in counts.iter().enumerate().skip(1) {
                    let shard = shard_for_key(k.as_bytes(), *count);
                    let id = format!("{}-5", 100 * (e + 1));
                    let before = shard_for_key(k.as_bytes(), counts[e - 1]);
                    let want = (before != shard).then_some(Gate {
                        parent: before,
                        epoch: e as u64 + 1,
                    });
                    assert_eq!(
                        b.gate_for(shard, &id, k.as_bytes()),
                        want,
                        "{k} {counts:?} {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn held_keys_keep_their_order_and_others_flow() {
        let g = Gate {
            parent: 1,
            epoch: 2,
        };
        let mut q: HoldQueue<&str> = HoldQueue::default();
        assert_eq!(q.admit("1-0", Some("a"), Some(g), "a1"), None);
        // An entry of the same key without a gate (or an open one) still waits behind.
        assert_eq!(q.admit("2-0", Some("a"), None, "a2"), None);
        assert_eq!(q.admit("3-0", Some("b"), None, "b1"), Some("b1"));
        assert_eq!(q.admit("4-0", None, Some(g), "nokey"), Some("nokey"));
        assert_eq!(q.admit("5-0", Some("c"), Some(g), "c1"), None);
        // A re-read of a held entry is not held twice.
        assert_eq!(q.admit("1-0", Some("a"), Some(g), "a1 again"), None);
        assert_eq!((q.len(), q.waiting_for()), (3, vec![g]));
        assert_eq!(
            q.release(Gate {
                parent: 2,
                epoch: 2
            }),
            Vec::<&str>::new()
        );
        assert_eq!(q.release(g), vec!["a1", "a2", "c1"]);
        assert!(q.is_empty());
        // Once open, the gate lets the key's later entries through at once.
        assert!(q.is_released(&g));
        assert_eq!(q.admit("6-0", Some("a"), Some(g), "a3"), Some("a3"));
    }

    #[test]
    fn a_key_behind_two_gates_waits_for_both_in_turn() {
        let (g1, g2) = (
            Gate {
                parent: 1,
                epoch: 2,
            },
            Gate {
                parent: 5,
                epoch: 3,
            },
        );
        let mut q: HoldQueue<u32> = HoldQueue::default();
        assert_eq!(q.admit("1-0", Some("k"), Some(g1), 1), None);
        assert_eq!(q.admit("2-0", Some("k"), Some(g2), 2), None);
        assert_eq!(q.waiting_for(), vec![g1]);
        assert_eq!(
            q.release(g2),
            Vec::<u32>::new(),
            "the head still waits for g1"
        );
        assert_eq!(q.release(g1), vec![1, 2]);
    }
}
