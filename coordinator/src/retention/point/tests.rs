use super::*;
use proptest::prelude::*;

const NOW: u64 = 1_700_000_000_000;

fn id(ms: u64, seq: u64) -> EntryId {
    EntryId { ms, seq }
}

fn reading(group: &str, last: EntryId, pending: u64, oldest: Option<EntryId>) -> GroupInput {
    GroupInput {
        group: group.into(),
        position: Position::Reading {
            last_delivered: last,
            pending,
            oldest_pending: oldest,
        },
        held: false,
    }
}

fn shard(groups: Vec<GroupInput>, keep_acked_ms: u64) -> ShardInput {
    ShardInput {
        groups,
        kind: ShardKind::Active,
        seal: None,
        policy: RetentionPolicy {
            keep_acked_ms,
            ..RetentionPolicy::default()
        },
        now_ms: NOW,
    }
}

#[test]
fn ids_parse_order_and_step() {
    assert_eq!(EntryId::parse("5-3"), Some(id(5, 3)));
    assert_eq!(EntryId::parse("7"), Some(id(7, 0)));
    assert_eq!(EntryId::parse("x-1"), None);
    assert!(id(5, 9) < id(6, 0));
    assert_eq!(id(5, 3).next(), id(5, 4));
    assert_eq!(id(5, u64::MAX).next(), id(6, 0));
    assert_eq!(id(12, 4).to_string(), "12-4");
}

#[test]
fn every_group_acked_trims_up_to_the_slowest() {
    let s = shard(
        vec![
            reading("a", id(NOW - 10, 0), 0, None),
            reading("b", id(NOW - 50, 2), 0, None),
        ],
        0,
    );
    let d = trim_point(&s);
    assert_eq!(
        d.minid,
        Some(id(NOW - 50, 3)),
        "entries up to b's last delivered go"
    );
    assert_eq!(d.blocked_by.as_deref(), Some("b"));
    assert!(!d.time_bound);
    assert!(d.lossy.is_empty());
}

#[test]
fn pending_entries_and_keep_acked_hold_the_point() {
    let s = shard(
        vec![
            reading("a", id(NOW - 10, 0), 3, Some(id(NOW - 900, 1))),
            reading("b", id(NOW - 5, 0), 0, None),
        ],
        0,
    );
    assert_eq!(
        trim_point(&s).minid,
        Some(id(NOW - 900, 1)),
        "the oldest pending stays"
    );
    let unknown = shard(vec![reading("a", id(NOW - 10, 0), 3, None)], 0);
    assert_eq!(
        trim_point(&unknown).minid,
        None,
        "pending of unknown ids: nothing"
    );
    let s = shard(vec![reading("a", id(NOW - 10, 0), 0, None)], 60_000);
    let d = trim_point(&s);
    assert_eq!(
        d.minid,
        Some(id(NOW - 60_000, 0)),
        "acked but younger than keep_acked"
    );
    assert!(d.time_bound);
    assert_eq!(d.blocked_by, None, "time, not a group, limits it");
}

#[test]
fn absent_held_draining_retired_and_sealed_shards_hold_back() {
    let mut s = shard(vec![reading("a", id(NOW - 10, 0), 0, None)], 0);
    s.groups.push(GroupInput {
        group: "new".into(),
        position: Position::NoConsumerGroup,
        held: false,
    });
    assert_eq!(trim_point(&s).minid, None);
    assert_eq!(trim_point(&s).blocked_by.as_deref(), Some("new"));
    let mut s = shard(vec![reading("a", id(NOW - 10, 0), 0, None)], 0);
    s.groups[0].held = true;
    assert_eq!(trim_point(&s).minid, None, "a paused group holds the shard");
    assert_eq!(trim_point(&s).blocked_by.as_deref(), Some("a"));
    let mut s = shard(vec![reading("a", id(NOW - 10, 0), 0, None)], 0);
    s.kind = ShardKind::Draining;
    assert_eq!(trim_point(&s).minid, None);
    s.kind = ShardKind::Retired;
    assert_eq!(trim_point(&s), TrimDecision::default());
    let mut s = shard(vec![reading("a", id(NOW - 10, 0), 0, None)], 0);
    s.seal = Some(id(NOW - 100, 4));
    assert_eq!(
        trim_point(&s).minid,
        Some(id(NOW - 100, 5)),
        "not past the seal"
    );
}

#[test]
fn hard_caps_pass_what_groups_need_and_name_them() {
    let mut s = shard(
        vec![
            reading("fast", id(NOW - 10, 0), 0, None),
            reading("slow", id(NOW - 7_200_000, 0), 0, None),
        ],
        0,
    );
    s.policy.max_age_ms = Some(3_600_000);
    let d = trim_point(&s);
    assert_eq!(d.minid, Some(id(NOW - 3_600_000, 0)));
    assert_eq!(d.safe, id(NOW - 7_200_000, 1));
    assert_eq!(d.lossy, vec!["slow".to_owned()]);
    assert_eq!(d.blocked_by.as_deref(), Some("slow"));
    assert!(d.time_bound);
    s.kind = ShardKind::Draining;
    assert_eq!(
        trim_point(&s).minid,
        Some(id(NOW - 3_600_000, 0)),
        "caps bind draining shards"
    );
    s.policy.max_age_ms = None;
    s.policy.max_entries_per_shard = Some(100);
    assert_eq!(trim_point(&s).maxlen, Some(100));
}

fn arb_id() -> impl Strategy<Value = EntryId> {
    (0u64..2_000, 0u64..4).prop_map(|(ms, seq)| id(NOW - 2_000 + ms, seq))
}

fn arb_group() -> impl Strategy<Value = GroupInput> {
    let position = prop_oneof![
        1 => Just(Position::NoConsumerGroup),
        6 => (arb_id(), 0u64..5, proptest::option::of(arb_id())).prop_map(|(last, pending, oldest)| {
            Position::Reading {
                last_delivered: last,
                pending,
                // A pending entry was delivered: its id is not after the last delivered one.
                oldest_pending: oldest.map(|o| o.min(last)).filter(|_| pending > 0),
            }
        }),
    ];
    (position, any::<bool>(), 0u8..4).prop_map(|(position, held, n)| GroupInput {
        group: format!("g{n}"),
        position,
        held,
    })
}

fn arb_shard() -> impl Strategy<Value = ShardInput> {
    (
        proptest::collection::vec(arb_group(), 0..5),
        prop_oneof![
            Just(ShardKind::Active),
            Just(ShardKind::Draining),
            Just(ShardKind::Retired)
        ],
        proptest::option::of(arb_id()),
        0u64..3_000,
    )
        .prop_map(|(mut groups, kind, seal, keep)| ShardInput {
            groups: {
                // One input per group of the stream.
                for (i, g) in groups.iter_mut().enumerate() {
                    g.group = format!("g{i}");
                }
                groups
            },
            kind,
            seal,
            policy: RetentionPolicy {
                keep_acked_ms: keep,
                max_age_ms: None,
                max_entries_per_shard: None,
            },
            now_ms: NOW,
        })
}

proptest! {
    /// Without hard caps, no group loses an entry it still needs: the point never passes any
    /// group's oldest pending entry nor its first undelivered one; a group with no consumer
    /// group, a held group, a draining or retired shard stops trimming; a seal is not passed.
    #[test]
    fn never_passes_what_a_group_needs(s in arb_shard()) {
        let d = trim_point(&s);
        prop_assert_eq!(d.maxlen, None);
        prop_assert!(d.lossy.is_empty());
        let Some(minid) = d.minid else { return Ok(()) };
        prop_assert_eq!(s.kind, ShardKind::Active);
        prop_assert!(minid <= EntryId::at_ms(NOW - s.policy.keep_acked_ms));
        if let Some(seal) = s.seal {
            prop_assert!(minid <= seal.next());
        }
        for g in &s.groups {
            prop_assert!(!g.held);
            match g.position {
                Position::NoConsumerGroup => prop_assert!(false, "trimmed before {} read", g.group),
                Position::Reading { last_delivered, pending, oldest_pending } => {
                    prop_assert!(minid <= last_delivered.next());
                    if pending > 0 {
                        let oldest = oldest_pending.expect("trimmed with unknown pending ids");
                        prop_assert!(minid <= oldest);
                    }
                }
            }
        }
    }

    /// A hard age cap trims at least up to its age, and only groups it passes are lossy.
    #[test]
    fn the_age_cap_binds(mut s in arb_shard(), age in 1u64..3_000) {
        s.policy.max_age_ms = Some(age.max(s.policy.keep_acked_ms));
        let d = trim_point(&s);
        if s.kind == ShardKind::Retired {
            prop_assert_eq!(d.minid, None);
        } else {
            let cap = EntryId::at_ms(NOW - s.policy.max_age_ms.unwrap());
            prop_assert!(d.minid.is_some_and(|m| m >= cap) || cap == EntryId::ZERO);
            for g in &s.groups {
                let passed = d.minid.is_some_and(|m| g.position.needs_from() < m);
                prop_assert_eq!(passed, d.lossy.contains(&g.group));
            }
        }
    }
}
