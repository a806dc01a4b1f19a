//! Apache Kafka's group-coordinator unit tests, ported to the pure engine: the transitions of
//! `CurrentAssignmentBuilderTest` (the reconciliation state machine) and the epoch, static
//! member and timeout cases of `GroupMetadataManagerTest` that have a counterpart here. Each
//! case names the Kafka test it comes from. Where PROTOCOL deliberately differs, the case
//! also carries Kafka's answer and the section that says why, and the test checks that the
//! engine gives its own answer and not Kafka's.
//!
//! Kafka's two topics become one stream: partition `p` of the first topic is shard `p`, of the
//! second topic shard `10 + p`. "Partition epoch ≠ -1" (the partition is owned elsewhere)
//! becomes a shard assigned to another member.
//!
//! No counterpart: `testUnknownState` (a member state this coordinator does not know cannot
//! be read from the document at all), subscription and regex changes (a group reads one
//! stream), the classic protocol and share groups.

use super::*;
use rsc_protocol::{HeartbeatRequest, MemberState as S};

const NOW: u64 = 1_000_000;
const SESSION: u64 = 45_000;
const REBALANCE: u64 = 60_000;

/// The member's reconciliation state, before or after a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    state: S,
    epoch: i64,
    previous: i64,
    assigned: Vec<u32>,
    pending: Vec<u32>,
}

fn member(state: S, epoch: i64, previous: i64, assigned: &[u32], pending: &[u32]) -> Member {
    Member {
        state,
        epoch,
        previous,
        assigned: assigned.to_vec(),
        pending: pending.to_vec(),
    }
}

/// One `CurrentAssignmentBuilderTest` case.
struct Transition {
    kafka: &'static str,
    before: Member,
    target_epoch: u64,
    target: &'static [u32],
    /// Shards another member holds ("current partition epoch" not -1).
    held_elsewhere: &'static [u32],
    /// `owned_shards` of the heartbeat: `None` is a heartbeat without the field (Kafka's
    /// `null` owned partitions: "unchanged").
    owned: Option<&'static [u32]>,
    expect: Member,
    /// Kafka's result where PROTOCOL deliberately differs, with the section that says why.
    kafka_differs: Option<(Member, &'static str)>,
}

/// A group at `target_epoch` whose member "m" is in `before` with `target`, and whose member
/// "other" holds `held_elsewhere`.
fn world(t: &Transition) -> (StreamDoc, GroupDoc) {
    let stream = StreamDoc::new("orders", 20, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    g.group_epoch = t.target_epoch;
    g.assignment_epoch = t.target_epoch;
    let mut m = MemberDoc::new(NOW);
    m.state = t.before.state;
    m.member_epoch = t.before.epoch;
    m.previous_epoch = t.before.previous;
    m.assigned = t.before.assigned.iter().copied().collect();
    m.pending_revocation = t.before.pending.iter().copied().collect();
    m.reported = m.assigned.union(&m.pending_revocation).copied().collect();
    m.target = t.target.iter().copied().collect();
    m.revoke_started_ms = (t.before.state == S::Unrevoked).then_some(NOW - 1);
    g.members.insert("m".into(), m);
    if !t.held_elsewhere.is_empty() {
        let mut other = MemberDoc::new(NOW);
        other.member_epoch = t.before.epoch;
        other.assigned = t.held_elsewhere.iter().copied().collect();
        other.target = other.assigned.clone();
        g.members.insert("other".into(), other);
    }
    (stream, g)
}

fn request(
    id: &str,
    epoch: i64,
    owned: Option<&[u32]>,
    incarnation: Option<&str>,
) -> HeartbeatRequest {
    HeartbeatRequest {
        protocol_version: 1,
        member_id: id.into(),
        member_epoch: epoch,
        owned_shards: owned.map(<[u32]>::to_vec),
        drained_shards: vec![],
        client: None,
        incarnation: incarnation.map(str::to_owned),
    }
}

fn observe(g: &GroupDoc, id: &str) -> Member {
    let m = &g.members[id];
    Member {
        state: m.state,
        epoch: m.member_epoch,
        previous: m.previous_epoch,
        assigned: m.assigned.iter().copied().collect(),
        pending: m.pending_revocation.iter().copied().collect(),
    }
}

/// Every row: from a stable member, then from the other states.
fn transitions() -> Vec<Transition> {
    let mut rows = transitions_from_stable();
    rows.extend(transitions_from_unrevoked_or_unreleased());
    rows
}

#[rustfmt::skip]
fn transitions_from_stable() -> Vec<Transition> {
    vec![
        Transition {
            kafka: "testStableToStable",
            before: member(S::Stable, 10, 10, &[1, 2, 3, 14, 15, 16], &[]),
            target_epoch: 11, target: &[1, 2, 3, 14, 15, 16], held_elsewhere: &[], owned: None,
            expect: member(S::Stable, 11, 10, &[1, 2, 3, 14, 15, 16], &[]),
            kafka_differs: None,
        },
        Transition {
            kafka: "testStableToStableWithNewPartitions",
            before: member(S::Stable, 10, 10, &[1, 2, 3, 14, 15, 16], &[]),
            target_epoch: 11, target: &[1, 2, 3, 4, 14, 15, 16, 17], held_elsewhere: &[], owned: None,
            expect: member(S::Stable, 11, 10, &[1, 2, 3, 4, 14, 15, 16, 17], &[]),
            kafka_differs: None,
        },
        // The omission case: a heartbeat without owned_shards keeps what it must revoke.
        Transition {
            kafka: "testStableToUnrevokedPartitions",
            before: member(S::Stable, 10, 10, &[1, 2, 3, 14, 15, 16], &[]),
            target_epoch: 11, target: &[2, 3, 4, 15, 16, 17], held_elsewhere: &[], owned: None,
            expect: member(S::Unrevoked, 11, 10, &[2, 3, 15, 16], &[1, 14]),
            kafka_differs: Some((member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
                "§5.2: asked to revoke, the member moves to the assignment epoch: only a report sent after that answer releases")),
        },
        Transition {
            kafka: "testStableToUnrevokedPartitions (owned [] instead of null)",
            before: member(S::Stable, 10, 10, &[1, 2, 3, 14, 15, 16], &[]),
            target_epoch: 11, target: &[2, 3, 4, 15, 16, 17], held_elsewhere: &[], owned: Some(&[]),
            expect: member(S::Unrevoked, 11, 10, &[2, 3, 15, 16], &[1, 14]),
            kafka_differs: Some((member(S::Stable, 11, 10, &[2, 3, 4, 15, 16, 17], &[]),
                "§5.2: the heartbeat that finds a shard revoked never releases it (its report may predate a restart of the shard)")),
        },
        Transition {
            kafka: "testStableToUnreleasedPartitions",
            before: member(S::Stable, 10, 10, &[1, 2, 3, 14, 15, 16], &[]),
            target_epoch: 11, target: &[1, 2, 3, 4, 14, 15, 16, 17], held_elsewhere: &[4, 17], owned: None,
            expect: member(S::Unreleased, 11, 10, &[1, 2, 3, 14, 15, 16], &[]),
            kafka_differs: None,
        },
        Transition {
            kafka: "testStableToUnreleasedPartitionsWithOwnedPartitionsNotHavingRevokedPartitions",
            before: member(S::Stable, 10, 10, &[1, 2, 3, 14, 15, 16], &[]),
            target_epoch: 11, target: &[1, 2, 3, 14, 15, 17], held_elsewhere: &[17], owned: Some(&[]),
            expect: member(S::Unrevoked, 11, 10, &[1, 2, 3, 14, 15], &[16]),
            kafka_differs: Some((member(S::Unreleased, 11, 10, &[1, 2, 3, 14, 15], &[]),
                "§5.2: the heartbeat that finds a shard revoked never releases it (its report may predate a restart of the shard)")),
        },
    ]
}

#[rustfmt::skip]
fn transitions_from_unrevoked_or_unreleased() -> Vec<Transition> {
    vec![
        Transition {
            kafka: "testUnrevokedPartitionsToStable",
            before: member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
            target_epoch: 11, target: &[2, 3, 15, 16], held_elsewhere: &[], owned: Some(&[2, 3, 15, 16]),
            expect: member(S::Stable, 11, 10, &[2, 3, 15, 16], &[]),
            kafka_differs: None,
        },
        Transition {
            kafka: "testRemainsInUnrevokedPartitions (owned null)",
            before: member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
            target_epoch: 12, target: &[3, 16], held_elsewhere: &[], owned: None,
            expect: member(S::Unrevoked, 12, 10, &[3, 16], &[1, 2, 14, 15]),
            kafka_differs: Some((member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
                "§5.2: the newest target applies at once, also while revoking, at its epoch")),
        },
        Transition {
            kafka: "testRemainsInUnrevokedPartitions (still owns 1)",
            before: member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
            target_epoch: 12, target: &[3, 16], held_elsewhere: &[], owned: Some(&[1, 2, 3, 15, 16]),
            expect: member(S::Unrevoked, 12, 10, &[3, 16], &[1, 2, 15]),
            kafka_differs: Some((member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
                "§5.2: what it no longer reports (14) is released at once; the newest target applies, at its epoch")),
        },
        Transition {
            kafka: "testRemainsInUnrevokedPartitions (still owns 14)",
            before: member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
            target_epoch: 12, target: &[3, 16], held_elsewhere: &[], owned: Some(&[2, 3, 14, 15, 16]),
            expect: member(S::Unrevoked, 12, 10, &[3, 16], &[2, 14, 15]),
            kafka_differs: Some((member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
                "§5.2: what it no longer reports (1) is released at once; the newest target applies, at its epoch")),
        },
        Transition {
            kafka: "testUnrevokedPartitionsToUnrevokedPartitions",
            before: member(S::Unrevoked, 10, 10, &[2, 3, 15, 16], &[1, 14]),
            target_epoch: 12, target: &[3, 16], held_elsewhere: &[], owned: Some(&[2, 3, 15, 16]),
            expect: member(S::Unrevoked, 12, 10, &[3, 16], &[2, 15]),
            kafka_differs: Some((member(S::Unrevoked, 11, 10, &[3, 16], &[2, 15]),
                "§5.2: asked to revoke, the member moves to the assignment epoch: only a report sent after that answer releases")),
        },
        Transition {
            kafka: "testUnrevokedPartitionsToUnreleasedPartitions",
            before: member(S::Unrevoked, 11, 10, &[2, 3, 15, 16], &[]),
            target_epoch: 11, target: &[2, 3, 4, 15, 16, 17], held_elsewhere: &[4, 17], owned: Some(&[2, 3, 15, 16]),
            expect: member(S::Unreleased, 11, 10, &[2, 3, 15, 16], &[]),
            kafka_differs: Some((member(S::Unreleased, 11, 11, &[2, 3, 15, 16], &[]),
                "§5.4: the previous epoch is the one before the last epoch change")),
        },
        Transition {
            kafka: "testUnreleasedPartitionsToStable",
            before: member(S::Unreleased, 11, 11, &[2, 3, 15, 16], &[]),
            target_epoch: 12, target: &[2, 3, 15, 16], held_elsewhere: &[], owned: None,
            expect: member(S::Stable, 12, 11, &[2, 3, 15, 16], &[]),
            kafka_differs: None,
        },
        Transition {
            kafka: "testUnreleasedPartitionsToStableWithNewPartitions",
            before: member(S::Unreleased, 11, 11, &[2, 3, 15, 16], &[]),
            target_epoch: 11, target: &[2, 3, 4, 15, 16, 17], held_elsewhere: &[], owned: None,
            expect: member(S::Stable, 11, 11, &[2, 3, 4, 15, 16, 17], &[]),
            kafka_differs: None,
        },
        Transition {
            kafka: "testUnreleasedPartitionsToUnreleasedPartitions",
            before: member(S::Unreleased, 11, 11, &[2, 3, 15, 16], &[]),
            target_epoch: 11, target: &[2, 3, 4, 15, 16, 17], held_elsewhere: &[4, 17], owned: None,
            expect: member(S::Unreleased, 11, 11, &[2, 3, 15, 16], &[]),
            kafka_differs: None,
        },
        Transition {
            kafka: "testUnreleasedPartitionsToUnrevokedPartitions",
            before: member(S::Unreleased, 11, 11, &[2, 3, 15, 16], &[]),
            target_epoch: 12, target: &[3, 16], held_elsewhere: &[], owned: None,
            expect: member(S::Unrevoked, 12, 11, &[3, 16], &[2, 15]),
            kafka_differs: Some((member(S::Unrevoked, 11, 11, &[3, 16], &[2, 15]),
                "§5.2: asked to revoke, the member moves to the assignment epoch: only a report sent after that answer releases")),
        },
    ]
}

#[test]
fn current_assignment_builder_transitions() {
    for t in transitions() {
        let (stream, mut g) = world(&t);
        let req = request("m", t.before.epoch, t.owned, None);
        let out = g
            .heartbeat(&stream, &req, NOW)
            .unwrap_or_else(|e| panic!("{}: refused: {e}", t.kafka));
        let got = observe(&g, "m");
        assert_eq!(got, t.expect, "{}", t.kafka);
        assert_eq!(out.response.member_epoch, got.epoch, "{}", t.kafka);
        assert_eq!(
            out.response.assignment, got.assigned,
            "{}: the answer",
            t.kafka
        );
        if let Some((kafka, why)) = &t.kafka_differs {
            assert_ne!(
                &got, kafka,
                "{}: said to differ from Kafka ({why})",
                t.kafka
            );
        }
        // Never two holders of a shard.
        if let Some(other) = g.members.get("other") {
            assert!(
                other.assigned.iter().all(|s| !g.members["m"].holds(*s)),
                "{}",
                t.kafka
            );
        }
    }
}

/// The same transitions through the steady fast path: a heartbeat it answers must be one
/// that the full path would answer the same way without a change.
#[test]
fn current_assignment_builder_transitions_are_never_answered_by_the_fast_path_when_they_change() {
    for t in transitions() {
        let (stream, g) = world(&t);
        let req = request("m", t.before.epoch, t.owned, None);
        if let Some(fast) = g.steady_heartbeat(&stream, &req) {
            let mut full = g.clone();
            let out = full.heartbeat(&stream, &req, NOW).unwrap();
            assert!(!full.differs_beyond_liveness(&g), "{}", t.kafka);
            assert_eq!(out.response, fast, "{}", t.kafka);
        }
    }
}

/// What a heartbeat is answered in the epoch and static-identity cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// 200 at this epoch.
    Ok(i64),
    /// Refused with this code.
    Err(ErrorCode),
}

/// One epoch-validation case against [`epoch_world`].
struct EpochCase {
    kafka: &'static str,
    member: &'static str,
    epoch: i64,
    owned: Option<&'static [u32]>,
    incarnation: Option<&'static str>,
    expect: Answer,
    /// Kafka's error code where PROTOCOL deliberately differs, with the section that says why.
    kafka_differs: Option<(&'static str, &'static str)>,
}

/// Kafka's setup of `testConsumerGroupMemberEpochValidation`: member "m" stable at epoch 100
/// (previous 99), owning shards 1, 2, 3 of its target; static (incarnation "run-1") when
/// `incarnation` is given.
fn epoch_world(incarnation: Option<&str>) -> (StreamDoc, GroupDoc) {
    let stream = StreamDoc::new("orders", 6, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    g.group_epoch = 100;
    g.assignment_epoch = 100;
    let mut m = MemberDoc::new(NOW);
    m.member_epoch = 100;
    m.previous_epoch = 99;
    m.assigned = [1, 2, 3].into();
    m.target = m.assigned.clone();
    m.reported = m.assigned.clone();
    m.granted_at = m.assigned.iter().map(|&s| (s, 100)).collect();
    m.incarnation = incarnation.map(str::to_owned);
    g.members.insert("m".into(), m);
    (stream, g)
}

fn run_epoch_cases(static_member: bool, cases: &[EpochCase]) {
    for c in cases {
        let (stream, mut g) = epoch_world(static_member.then_some("run-1"));
        let before = g.clone();
        let req = request(c.member, c.epoch, c.owned, c.incarnation);
        let got = match g.heartbeat(&stream, &req, NOW + 10) {
            Ok(out) => Answer::Ok(out.response.member_epoch),
            Err(e) => {
                assert_eq!(g, before, "{}: a refusal changes nothing", c.kafka);
                Answer::Err(e.code())
            }
        };
        assert_eq!(got, c.expect, "{}", c.kafka);
        if let Some((kafka, why)) = c.kafka_differs {
            // Kafka's code does not exist here: the engine answers its own instead.
            assert!(
                ErrorCode::ALL.iter().all(|code| code.as_str() != kafka),
                "{}: said to differ from Kafka's {kafka} ({why})",
                c.kafka
            );
        }
        if matches!(got, Answer::Ok(e) if e > 0) && c.member == "m" {
            assert_eq!(
                g.members["m"].assigned,
                [1, 2, 3].into(),
                "{}: nothing released",
                c.kafka
            );
        }
    }
}

#[rustfmt::skip]
#[test]
fn member_epoch_validation() {
    use ErrorCode::*;
    run_epoch_cases(false, &[
        EpochCase { kafka: "testConsumerGroupMemberEpochValidation: greater epoch",
            member: "m", epoch: 200, owned: None, incarnation: None,
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidation: smaller epoch",
            member: "m", epoch: 50, owned: None, incarnation: None,
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidation: previous epoch without owned partitions",
            member: "m", epoch: 99, owned: None, incarnation: None,
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidation: previous epoch with a subset",
            member: "m", epoch: 99, owned: Some(&[1, 2]), incarnation: None,
            expect: Answer::Ok(100), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidation: previous epoch, not a subset (derived)",
            member: "m", epoch: 99, owned: Some(&[1, 2, 4]), incarnation: None,
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidation: current epoch without owned partitions (derived)",
            member: "m", epoch: 100, owned: None, incarnation: None,
            expect: Answer::Ok(100), kafka_differs: None },
        EpochCase { kafka: "testUnknownMemberIdJoinsConsumerGroup",
            member: "stranger", epoch: 1, owned: Some(&[]), incarnation: None,
            expect: Answer::Err(UnknownMemberId), kafka_differs: None },
    ]);
}

#[rustfmt::skip]
#[test]
fn static_member_epoch_and_identity_validation() {
    use ErrorCode::*;
    run_epoch_cases(true, &[
        EpochCase { kafka: "testConsumerGroupMemberEpochValidationForStaticMember: greater epoch",
            member: "m", epoch: 200, owned: None, incarnation: Some("run-1"),
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidationForStaticMember: smaller epoch",
            member: "m", epoch: 50, owned: None, incarnation: Some("run-1"),
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidationForStaticMember: previous epoch without owned partitions",
            member: "m", epoch: 99, owned: None, incarnation: Some("run-1"),
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testConsumerGroupMemberEpochValidationForStaticMember: previous epoch with a subset",
            member: "m", epoch: 99, owned: Some(&[1, 2]), incarnation: Some("run-1"),
            expect: Answer::Ok(100), kafka_differs: None },
        // Our client names its incarnation only in the join and the -2 leave (PROTOCOL §11).
        EpochCase { kafka: "testConsumerGroupMemberEpochValidationForStaticMember: current epoch, no incarnation (derived)",
            member: "m", epoch: 100, owned: Some(&[1, 2, 3]), incarnation: None,
            expect: Answer::Ok(100), kafka_differs: None },
        EpochCase { kafka: "testShouldThrowFencedInstanceIdExceptionWhenStaticMemberWithDifferentMemberIdJoins",
            member: "m", epoch: 101, owned: Some(&[]), incarnation: Some("run-2"),
            expect: Answer::Err(FencedMemberEpoch),
            kafka_differs: Some(("FENCED_INSTANCE_ID", "§11: no FENCED_INSTANCE_ID code; FENCED_MEMBER_EPOCH stops the run, whose rejoin is then MEMBER_ID_IN_USE")) },
        EpochCase { kafka: "testShouldThrowFencedInstanceIdExceptionWhenStaticMemberWithDifferentMemberIdJoins (current epoch)",
            member: "m", epoch: 100, owned: Some(&[1, 2, 3]), incarnation: Some("run-2"),
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testShouldThrowFencedInstanceIdExceptionWhenStaticMemberWithDifferentMemberIdJoins (previous epoch)",
            member: "m", epoch: 99, owned: Some(&[1]), incarnation: Some("run-2"),
            expect: Answer::Err(FencedMemberEpoch), kafka_differs: None },
        EpochCase { kafka: "testShouldThrowFencedInstanceIdExceptionWhenStaticMemberWithDifferentMemberIdLeaves",
            member: "m", epoch: -2, owned: Some(&[]), incarnation: Some("run-2"),
            expect: Answer::Err(MemberIdInUse),
            kafka_differs: Some(("FENCED_INSTANCE_ID", "§11: a leave of another run is MEMBER_ID_IN_USE, as its join is")) },
        EpochCase { kafka: "testShouldThrowFencedInstanceIdExceptionWhenStaticMemberWithDifferentMemberIdLeaves (epoch -1)",
            member: "m", epoch: -1, owned: Some(&[]), incarnation: Some("run-2"),
            expect: Answer::Err(MemberIdInUse), kafka_differs: None },
        EpochCase { kafka: "testShouldThrownUnreleasedInstanceIdExceptionWhenNewMemberJoinsWithInUseInstanceId",
            member: "m", epoch: 0, owned: Some(&[]), incarnation: Some("run-2"),
            expect: Answer::Err(MemberIdInUse), kafka_differs: None },
        EpochCase { kafka: "testShouldThrownUnknownMemberIdExceptionWhenUnknownStaticMemberJoins",
            member: "m2", epoch: 10, owned: Some(&[]), incarnation: Some("run-1"),
            expect: Answer::Err(UnknownMemberId), kafka_differs: None },
        EpochCase { kafka: "testShouldThrowUnknownMemberIdExceptionWhenUnknownStaticMemberLeaves",
            member: "m2", epoch: -2, owned: Some(&[]), incarnation: Some("run-1"),
            expect: Answer::Err(UnknownMemberId), kafka_differs: None },
        EpochCase { kafka: "testLeavingStaticMemberBumpsGroupEpoch",
            member: "m", epoch: -1, owned: None, incarnation: Some("run-1"),
            expect: Answer::Ok(-1), kafka_differs: None },
        EpochCase { kafka: "testNoGroupEpochBumpWhenStaticMemberTemporarilyLeaves",
            member: "m", epoch: -2, owned: None, incarnation: Some("run-1"),
            expect: Answer::Ok(-2), kafka_differs: None },
    ]);
}

/// The scenario of the omission: a member being asked to revoke 3, 4, 5 heartbeats without
/// `owned_shards`. Nothing is released; the member stays `unrevoked` at the epoch it was asked
/// at and the other member is not given 3, 4, 5 until a heartbeat no longer reports them.
#[test]
fn a_heartbeat_without_owned_shards_releases_nothing() {
    let stream = StreamDoc::new("orders", 6, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    let a = g
        .heartbeat(&stream, &request("a", 0, None, None), NOW)
        .unwrap();
    assert_eq!(
        (a.response.member_epoch, a.response.assignment.len()),
        (1, 6)
    );
    g.heartbeat(
        &stream,
        &request("a", 1, Some(&[0, 1, 2, 3, 4, 5]), None),
        NOW,
    )
    .unwrap();
    let b = g
        .heartbeat(&stream, &request("b", 0, None, None), NOW)
        .unwrap();
    assert!(b.response.assignment.is_empty());
    g.heartbeat(
        &stream,
        &request("a", 1, Some(&[0, 1, 2, 3, 4, 5]), None),
        NOW,
    )
    .unwrap();
    assert_eq!(g.members["a"].state, S::Unrevoked);
    let pending: BTreeSet<u32> = g.members["a"].pending_revocation.clone();
    assert_eq!(pending, [3, 4, 5].into());

    let out = g
        .heartbeat(&stream, &request("a", 2, None, None), NOW + 1)
        .unwrap();
    assert_eq!(
        (out.response.member_epoch, out.response.assignment),
        (2, vec![0, 1, 2])
    );
    assert_eq!(g.members["a"].state, S::Unrevoked);
    assert_eq!(g.members["a"].pending_revocation, pending);
    assert_eq!(
        g.members["a"].reported,
        [0, 1, 2, 3, 4, 5].into(),
        "the view keeps what it last reported"
    );
    let b = g
        .heartbeat(&stream, &request("b", 2, None, None), NOW + 2)
        .unwrap();
    assert!(
        b.response.assignment.is_empty(),
        "3, 4, 5 are still held by a"
    );

    // The tolerated previous epoch without the list cannot be checked: fenced (§5.4).
    g.heartbeat(&stream, &request("a", 2, Some(&[0, 1, 2]), None), NOW + 3)
        .unwrap();
    assert_eq!(g.members["a"].member_epoch, 2);
    assert_eq!(g.members["a"].previous_epoch, 1);
    let e = g
        .heartbeat(&stream, &request("a", 1, None, None), NOW + 4)
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::FencedMemberEpoch);
    let b = g
        .heartbeat(&stream, &request("b", 2, Some(&[]), None), NOW + 5)
        .unwrap();
    assert_eq!(b.response.assignment, vec![3, 4, 5]);
}

/// `testMemberJoinsEmptyConsumerGroup`, `testNewJoiningMemberTriggersNewTargetAssignment`,
/// `testLeavingMemberBumpsGroupEpoch`: every membership change bumps the group epoch and
/// recomputes the target at once; a joining member gets only what nobody holds.
#[test]
fn membership_changes_bump_the_group_epoch_and_the_target() {
    let stream = StreamDoc::new("orders", 6, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    let a = g
        .heartbeat(&stream, &request("a", 0, Some(&[]), None), NOW)
        .unwrap();
    assert_eq!((g.group_epoch, g.assignment_epoch), (1, 1));
    assert_eq!(
        (a.response.member_epoch, a.response.assignment),
        (1, vec![0, 1, 2, 3, 4, 5])
    );
    assert_eq!(g.members["a"].state, S::Stable);

    let b = g
        .heartbeat(&stream, &request("b", 0, Some(&[]), None), NOW)
        .unwrap();
    assert_eq!((g.group_epoch, g.assignment_epoch), (2, 2));
    assert_eq!(g.members["a"].target.len() + g.members["b"].target.len(), 6);
    assert_eq!(b.response.member_epoch, 2);
    assert!(b.response.assignment.is_empty(), "everything is still a's");
    assert_eq!(g.members["b"].state, S::Unreleased);

    let left = g
        .heartbeat(&stream, &request("a", -1, None, None), NOW)
        .unwrap();
    assert_eq!(left.response.member_epoch, -1);
    assert_eq!(g.group_epoch, 3);
    let b = g
        .heartbeat(&stream, &request("b", 2, Some(&[]), None), NOW)
        .unwrap();
    assert_eq!(
        (b.response.member_epoch, b.response.assignment.len()),
        (3, 6)
    );
}

/// `testGroupEpochBumpWhenNewStaticMemberJoins`, `testNoGroupEpochBumpWhenStaticMemberTemporarilyLeaves`,
/// `testStaticMemberGetsBackAssignmentUponRejoin`: a static member's join bumps the epoch; its
/// -2 does not; the next run gets its shards back without a rebalance.
#[test]
fn static_member_leaves_temporarily_and_gets_its_assignment_back() {
    let stream = StreamDoc::new("orders", 4, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    g.heartbeat(&stream, &request("d", 0, Some(&[]), None), NOW)
        .unwrap();
    g.heartbeat(&stream, &request("d", 1, Some(&[0, 1, 2, 3]), None), NOW)
        .unwrap();
    let s = g
        .heartbeat(&stream, &request("s", 0, Some(&[]), Some("run-1")), NOW)
        .unwrap();
    assert_eq!(g.group_epoch, 2, "a static join bumps the group epoch");
    let d = g
        .heartbeat(&stream, &request("d", 1, Some(&[0, 1, 2, 3]), None), NOW)
        .unwrap();
    let d = g
        .heartbeat(
            &stream,
            &request(
                "d",
                d.response.member_epoch,
                Some(&d.response.assignment),
                None,
            ),
            NOW,
        )
        .unwrap();
    let s = g
        .heartbeat(
            &stream,
            &request("s", s.response.member_epoch, Some(&[]), None),
            NOW,
        )
        .unwrap();
    assert_eq!(s.response.assignment.len() + d.response.assignment.len(), 4);
    let (epoch, shards) = (s.response.member_epoch, s.response.assignment.clone());

    g.heartbeat(&stream, &request("s", -2, None, Some("run-1")), NOW + 1)
        .unwrap();
    assert_eq!(g.group_epoch, 2, "-2 is no rebalance");
    let back = g
        .heartbeat(&stream, &request("s", 0, None, Some("run-2")), NOW + 2)
        .unwrap();
    assert_eq!(
        (back.response.member_epoch, back.response.assignment),
        (epoch, shards)
    );
    assert_eq!(g.group_epoch, 2);
    // The replaced run is fenced, even at the epoch the new run shares (Kafka's
    // FENCED_INSTANCE_ID at the current epoch).
    let e = g
        .heartbeat(
            &stream,
            &request("s", epoch, Some(&[]), Some("run-1")),
            NOW + 3,
        )
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::FencedMemberEpoch);
    assert!(
        g.steady_heartbeat(&stream, &request("s", epoch, None, Some("run-1")))
            .is_none()
    );
    assert!(
        g.steady_heartbeat(&stream, &request("s", epoch, None, Some("run-2")))
            .is_some()
    );
}

/// `testSessionTimeoutLifecycle`, `testSessionTimeoutExpiration`: each heartbeat moves the
/// session deadline; a member silent past it is removed and the group rebalances.
#[test]
fn session_timeout_lifecycle_and_expiration() {
    let stream = StreamDoc::new("orders", 2, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    g.heartbeat(&stream, &request("a", 0, Some(&[]), None), NOW)
        .unwrap();
    assert_eq!(g.next_deadline_ms(), Some(NOW + SESSION + 1));
    g.heartbeat(&stream, &request("a", 1, None, None), NOW + 10_000)
        .unwrap();
    assert_eq!(
        g.next_deadline_ms(),
        Some(NOW + 10_000 + SESSION + 1),
        "a heartbeat without owned_shards still counts"
    );
    assert!(g.expire(&stream, NOW + 10_000 + SESSION).is_empty());
    let events = g.expire(&stream, NOW + 10_000 + SESSION + 1);
    assert_eq!(
        events,
        vec![
            GroupEvent::SessionExpired("a".into()),
            GroupEvent::Rebalanced(2)
        ]
    );
    let e = g
        .heartbeat(
            &stream,
            &request("a", 1, None, None),
            NOW + 10_000 + SESSION + 2,
        )
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownMemberId);
}

/// `testSessionTimeoutExpirationStaticMember`: a static member away after -2 expires when its
/// session runs out, and its shards move.
#[test]
fn session_timeout_expiration_of_an_away_static_member() {
    let stream = StreamDoc::new("orders", 2, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    g.heartbeat(&stream, &request("s", 0, None, Some("run-1")), NOW)
        .unwrap();
    g.heartbeat(&stream, &request("s", -2, None, Some("run-1")), NOW + 5)
        .unwrap();
    assert!(g.expire(&stream, NOW + 5 + SESSION).is_empty());
    let events = g.expire(&stream, NOW + 5 + SESSION + 1);
    assert!(events.contains(&GroupEvent::SessionExpired("s".into())));
    assert!(g.members.is_empty());
}

/// `testRebalanceTimeoutLifecycle`, `testRebalanceTimeoutExpiration`: the revocation clock
/// starts with the answer that asks to revoke, stops when the member revoked, and a member
/// that never revokes is removed once it runs out — also one that heartbeats without
/// `owned_shards`, which is not a revocation.
#[test]
fn rebalance_timeout_lifecycle_and_expiration() {
    for revokes in [true, false] {
        let stream = StreamDoc::new("orders", 2, 0).unwrap();
        let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
        g.heartbeat(&stream, &request("a", 0, None, None), NOW)
            .unwrap();
        g.heartbeat(&stream, &request("b", 0, None, None), NOW)
            .unwrap();
        g.heartbeat(&stream, &request("a", 1, Some(&[0, 1]), None), NOW)
            .unwrap();
        assert_eq!(g.members["a"].revoke_started_ms, Some(NOW));
        let mut now = NOW;
        while now + 10_000 <= NOW + REBALANCE {
            now += 10_000;
            g.heartbeat(&stream, &request("b", 2, Some(&[]), None), now)
                .unwrap();
            // Revoking: report what it was left; not revoking: omit the list.
            let kept = g.members["a"].assigned.iter().copied().collect::<Vec<_>>();
            let owned = revokes.then_some(kept.as_slice());
            let epoch = g.members["a"].member_epoch;
            g.heartbeat(&stream, &request("a", epoch, owned, None), now)
                .unwrap();
        }
        let events = g.expire(&stream, NOW + REBALANCE + 1);
        if revokes {
            assert!(events.is_empty(), "revoked in time: {events:?}");
            assert_eq!(g.members["a"].revoke_started_ms, None);
        } else {
            assert_eq!(events[0], GroupEvent::RebalanceTimedOut("a".into()));
            // Removed (out of the assignment, as in Kafka), but its lease still runs: it
            // holds what it held until then (PROTOCOL §5.3).
            assert!(g.members["a"].is_removed());
            assert!(g.members["a"].target.is_empty());
        }
    }
}

/// `testNewMemberIsRejectedWithMaximumMembersIsReached`.
#[test]
fn a_new_member_beyond_max_members_is_refused() {
    let stream = StreamDoc::new("orders", 2, 0).unwrap();
    let mut g = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
    g.config.max_members = Some(1);
    g.heartbeat(&stream, &request("a", 0, None, None), NOW)
        .unwrap();
    let before = g.clone();
    let e = g
        .heartbeat(&stream, &request("b", 0, None, None), NOW)
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::GroupMaxSizeReached);
    assert_eq!(g, before);
}
