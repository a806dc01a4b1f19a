//! The sticky assignor: balanced, and moving the fewest shards that reach balance.

use super::{Assignor, AssignorMember};

/// Balanced sticky assignment (PROTOCOL §5.5).
///
/// With `S` shards and `M` members every member gets `⌊S/M⌋` shards and `S mod M` of them one
/// more. The members allowed the extra shard are those that already keep the most shards
/// (ties by id), so the number of shards taken away from their previous owner is the least
/// possible; a member keeps its lowest-numbered shards when it must give some up. Shards of
/// the previous target that no longer exist are dropped first. Free shards go, in index
/// order, to the members short of their quota, in id order. The result depends on the input
/// only. Cost: `O(S + M log M)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct StickyAssignor;

impl Assignor for StickyAssignor {
    fn name(&self) -> &'static str {
        "sticky"
    }

    fn assign(&self, members: &[AssignorMember<'_>], shards: &[u32]) -> Vec<Vec<u32>> {
        let m = members.len();
        if m == 0 {
            return Vec::new();
        }
        let Some(&max) = shards.last() else {
            return vec![Vec::new(); m];
        };
        const FREE: u32 = u32::MAX;
        const ABSENT: u32 = u32::MAX - 1;
        // owner[s]: ABSENT (not assignable), FREE, or the member index keeping it.
        let mut owner = vec![ABSENT; max as usize + 1];
        for &s in shards {
            owner[s as usize] = FREE;
        }
        // Keep what still exists of each previous target; a shard named twice goes to the
        // first member (by id) that names it.
        let mut kept: Vec<Vec<u32>> = Vec::with_capacity(m);
        for (i, member) in members.iter().enumerate() {
            let mut mine = Vec::with_capacity(member.previous.len());
            for &s in member.previous {
                if let Some(o) = owner.get_mut(s as usize)
                    && *o == FREE
                {
                    *o = i as u32;
                    mine.push(s);
                }
            }
            kept.push(mine);
        }
        let s_total = shards.len();
        let base = s_total / m;
        let extra = s_total % m;
        // Quotas: the `extra` members keeping the most get base + 1.
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&a, &b| kept[b].len().cmp(&kept[a].len()).then(a.cmp(&b)));
        let mut quota = vec![base; m];
        for &i in order.iter().take(extra) {
            quota[i] = base + 1;
        }
        // Members over quota give up their highest-numbered shards.
        for (i, mine) in kept.iter_mut().enumerate() {
            if mine.len() > quota[i] {
                for &s in &mine[quota[i]..] {
                    owner[s as usize] = FREE;
                }
                mine.truncate(quota[i]);
            }
        }
        // Free shards, in index order, fill the members short of their quota, in id order.
        let mut free = shards
            .iter()
            .copied()
            .filter(|&s| owner[s as usize] == FREE);
        for (i, mine) in kept.iter_mut().enumerate() {
            while mine.len() < quota[i] {
                match free.next() {
                    Some(s) => mine.push(s),
                    None => break,
                }
            }
            mine.sort_unstable();
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn run(prev: &[(&str, &[u32])], shards: &[u32]) -> Vec<Vec<u32>> {
        let sets: Vec<BTreeSet<u32>> = prev
            .iter()
            .map(|(_, p)| p.iter().copied().collect())
            .collect();
        let members: Vec<AssignorMember<'_>> = prev
            .iter()
            .zip(&sets)
            .map(|((id, _), previous)| AssignorMember { id, previous })
            .collect();
        StickyAssignor.assign(&members, shards)
    }

    #[test]
    fn fresh_assignment_is_balanced() {
        let all: Vec<u32> = (0..10).collect();
        let out = run(&[("a", &[]), ("b", &[]), ("c", &[])], &all);
        assert_eq!(out, vec![vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);
    }

    #[test]
    fn join_moves_only_the_surplus() {
        let all: Vec<u32> = (0..4).collect();
        let out = run(&[("a", &[0, 1]), ("b", &[2, 3]), ("c", &[])], &all);
        assert_eq!(out, vec![vec![0, 1], vec![2], vec![3]]);
    }

    #[test]
    fn vanished_shards_and_duplicates_are_dropped() {
        let out = run(&[("a", &[0, 1, 7]), ("b", &[1, 2])], &[0, 1, 2, 3]);
        assert_eq!(out, vec![vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn no_members_or_no_shards() {
        assert!(run(&[], &[0, 1]).is_empty());
        assert_eq!(run(&[("a", &[3])], &[]), vec![Vec::<u32>::new()]);
    }
}
