//! Property tests of the sticky assignor (PROTOCOL §5.5).

use proptest::prelude::*;
use rsc_coordinator::assignor::{Assignor, AssignorMember, StickyAssignor};
use std::collections::{BTreeMap, BTreeSet};

type Assignment = BTreeMap<String, BTreeSet<u32>>;

fn assign(prev: &Assignment, shards: &[u32]) -> Assignment {
    let members: Vec<AssignorMember<'_>> = prev
        .iter()
        .map(|(id, p)| AssignorMember { id, previous: p })
        .collect();
    let out = StickyAssignor.assign(&members, shards);
    prev.keys()
        .cloned()
        .zip(out.into_iter().map(|v| v.into_iter().collect()))
        .collect()
}

fn check_balanced(a: &Assignment, shards: &[u32]) -> Result<(), TestCaseError> {
    let counts: Vec<usize> = a.values().map(BTreeSet::len).collect();
    if let (Some(max), Some(min)) = (counts.iter().max(), counts.iter().min()) {
        prop_assert!(max - min <= 1, "unbalanced: {counts:?}");
    }
    let mut seen = BTreeSet::new();
    for set in a.values() {
        for s in set {
            prop_assert!(seen.insert(*s), "shard {s} assigned twice");
        }
    }
    if !a.is_empty() {
        prop_assert_eq!(seen, shards.iter().copied().collect::<BTreeSet<u32>>());
    }
    Ok(())
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("member-{i:04}")).collect()
}

/// Members with arbitrary (possibly overlapping, possibly vanished) previous targets.
fn arbitrary_previous() -> impl Strategy<Value = (Assignment, Vec<u32>)> {
    (1usize..40, 1u32..200).prop_flat_map(|(m, s)| {
        let prev =
            proptest::collection::vec(proptest::collection::btree_set(0u32..s + 20, 0..12), m);
        let shards = proptest::collection::btree_set(0u32..s, 1..=s as usize);
        (prev, shards).prop_map(|(prev, shards)| {
            let a = ids(prev.len()).into_iter().zip(prev).collect();
            (a, shards.into_iter().collect())
        })
    })
}

/// A balanced starting point: a fresh assignment of `s` shards over `m` members.
fn balanced() -> impl Strategy<Value = (Assignment, Vec<u32>)> {
    (1usize..60, 1u32..600).prop_map(|(m, s)| {
        let shards: Vec<u32> = (0..s).collect();
        let empty: Assignment = ids(m).into_iter().map(|id| (id, BTreeSet::new())).collect();
        (assign(&empty, &shards), shards)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn always_balanced_and_complete((prev, shards) in arbitrary_previous()) {
        let out = assign(&prev, &shards);
        check_balanced(&out, &shards)?;
    }

    #[test]
    fn deterministic((prev, shards) in arbitrary_previous()) {
        prop_assert_eq!(assign(&prev, &shards), assign(&prev, &shards));
    }

    #[test]
    fn vanished_shards_are_dropped((prev, shards) in arbitrary_previous()) {
        let exists: BTreeSet<u32> = shards.iter().copied().collect();
        for set in assign(&prev, &shards).values() {
            prop_assert!(set.is_subset(&exists));
        }
    }

    #[test]
    fn a_balanced_assignment_is_left_unchanged((a, shards) in balanced()) {
        prop_assert_eq!(assign(&a, &shards), a);
    }

    /// A join moves only the shards the newcomer gets, and it gets ⌊S/(M+1)⌋ of them: the
    /// fewest that reach balance.
    #[test]
    fn join_moves_the_minimum((a, shards) in balanced()) {
        let mut prev = a.clone();
        prev.insert("zz-newcomer".into(), BTreeSet::new());
        let out = assign(&prev, &shards);
        check_balanced(&out, &shards)?;
        for (id, before) in &a {
            prop_assert!(out[id].is_subset(before), "{id} gained a shard on a join");
        }
        let moved: usize = a.iter().map(|(id, before)| before.len() - out[id].len()).sum();
        prop_assert_eq!(moved, out["zz-newcomer"].len());
        prop_assert_eq!(moved, shards.len() / prev.len());
    }

    /// A leave moves only the leaver's shards: every other member keeps all of its own.
    #[test]
    fn leave_moves_only_the_leavers_shards((a, shards) in balanced(), pick in any::<prop::sample::Index>()) {
        prop_assume!(a.len() > 1);
        let leaver = a.keys().nth(pick.index(a.len())).unwrap().clone();
        let mut prev = a.clone();
        prev.remove(&leaver);
        let out = assign(&prev, &shards);
        check_balanced(&out, &shards)?;
        for (id, before) in &prev {
            prop_assert!(before.is_subset(&out[id]), "{id} lost a shard when {leaver} left");
        }
    }
}
