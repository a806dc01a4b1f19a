//! Which members a group change must wake (the wake-up channel, `POST /v1/wakeups`).
//!
//! A wake-up only tells a member "heartbeat now": the heartbeat stays the one authority, so
//! this choice affects speed, never safety. It is made by comparing the group document
//! before and after a write:
//!
//! - a member the write removed (left, expired, fenced out, removed by an operator) is woken:
//!   its next heartbeat learns `UNKNOWN_MEMBER_ID` and it rejoins;
//! - a member still present is woken when its next heartbeat would change something (it is
//!   not [`settled`]) **and** this write is why: the group has a new assignment epoch (every
//!   member must at least take it up), its own record changed (new target, pending
//!   revocation, removal of a shard it was assigned), or a shard
//!   its target wants was held by another member before the write and is free after it
//!   (the previous owner released it);
//! - on deletion (`after` is `None`) every member is woken (its heartbeat learns
//!   `GROUP_NOT_FOUND`);
//! - when an operator pauses or resumes the group, every member is woken (its next answer
//!   carries the new `paused`, PROTOCOL §14).
//!
//! A member that is not settled but whose situation this write did not change is not woken
//! again: it was woken by the write that unsettled it, or is waiting for a shard someone
//! else still holds.

use super::{GroupDoc, MemberDoc};
use rsc_protocol::MemberState;
use std::collections::BTreeSet;

/// Whether `m`'s next heartbeat in `doc` would leave its record as it is: stable at the
/// assignment epoch, owning its whole target, nothing to revoke.
pub fn settled(doc: &GroupDoc, m: &MemberDoc) -> bool {
    m.state == MemberState::Stable
        && rsc_protocol::MemberEpoch::new(m.member_epoch).is(doc.assignment_epoch)
        && m.pending_revocation.is_empty()
        && m.assigned == m.target
}

/// The part of a member's record whose change may call for its action.
fn same_record(a: &MemberDoc, b: &MemberDoc) -> bool {
    a.member_epoch == b.member_epoch
        && a.state == b.state
        && a.target == b.target
        && a.assigned == b.assigned
        && a.pending_revocation == b.pending_revocation
}

/// The members to wake after `before` became `after` (`None`: the group was deleted), in id
/// order. `before` is `None` for a group that did not exist (nobody to wake then but new
/// members that are not settled). The member whose own request made the change gets its
/// answer directly: the caller leaves it out.
pub fn members_to_wake(before: Option<&GroupDoc>, after: Option<&GroupDoc>) -> Vec<String> {
    let Some(after) = after else {
        return before
            .map(|b| b.members.keys().cloned().collect())
            .unwrap_or_default();
    };
    let mut wake = BTreeSet::new();
    if let Some(before) = before {
        wake.extend(
            before
                .members
                .keys()
                .filter(|id| !after.members.contains_key(*id))
                .cloned(),
        );
    }
    let new_epoch = before.is_none_or(|b| b.assignment_epoch != after.assignment_epoch);
    let pause_changed = before.is_some_and(|b| {
        b.config.paused_since_ms.is_some() != after.config.paused_since_ms.is_some()
    });
    for (id, m) in &after.members {
        if pause_changed {
            wake.insert(id.clone());
            continue;
        }
        if settled(after, m) {
            continue;
        }
        let prev = before.and_then(|b| b.members.get(id));
        let changed = new_epoch || prev.is_none_or(|p| !same_record(p, m));
        if changed || before.is_some_and(|b| released_for(b, after, id, m)) {
            wake.insert(id.clone());
        }
    }
    wake.into_iter().collect()
}

/// Whether a shard `m` (member `id` of `after`) wants but is not assigned was held by another
/// member in `before` and by no other member in `after`.
fn released_for(before: &GroupDoc, after: &GroupDoc, id: &str, m: &MemberDoc) -> bool {
    let wanted = m.target.difference(&m.assigned);
    let held_by_other = |doc: &GroupDoc, s: u32| {
        doc.members
            .iter()
            .any(|(other, o)| other != id && o.holds(s))
    };
    wanted
        .into_iter()
        .any(|&s| held_by_other(before, s) && !held_by_other(after, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{GroupConfig, StreamDoc};
    use rsc_protocol::{HeartbeatRequest, PROTOCOL_VERSION};

    const NOW: u64 = 1_000_000;

    fn hb(id: &str, epoch: i64, owned: &[u32]) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            member_id: id.into(),
            member_epoch: epoch,
            owned_shards: Some(owned.to_vec()),
            drained_shards: Vec::new(),
            client: None,
            incarnation: None,
        }
    }

    fn setup(shards: u32) -> (GroupDoc, StreamDoc) {
        let stream = StreamDoc::new("s", shards, NOW).unwrap();
        let doc = GroupDoc::new("g", GroupConfig::default(), &stream, NOW);
        (doc, stream)
    }

    /// Heartbeats `id` with what it was last given, until its answer stops changing.
    fn settle(doc: &mut GroupDoc, stream: &StreamDoc, id: &str) {
        for _ in 0..4 {
            let m = &doc.members[id];
            let owned: Vec<u32> = m.assigned.iter().copied().collect();
            let epoch = m.member_epoch;
            doc.heartbeat(stream, &hb(id, epoch, &owned), NOW).unwrap();
        }
    }

    fn two_stable_members() -> (GroupDoc, StreamDoc) {
        let (mut doc, stream) = setup(4);
        doc.heartbeat(&stream, &hb("a", 0, &[]), NOW).unwrap();
        settle(&mut doc, &stream, "a");
        doc.heartbeat(&stream, &hb("b", 0, &[]), NOW).unwrap();
        // a revokes two shards, then b gets them.
        settle(&mut doc, &stream, "a");
        settle(&mut doc, &stream, "b");
        assert!(doc.is_stable(), "{doc:#?}");
        (doc, stream)
    }

    #[test]
    fn a_join_wakes_the_members_that_must_revoke() {
        let (mut doc, stream) = two_stable_members();
        let before = doc.clone();
        doc.heartbeat(&stream, &hb("c", 0, &[]), NOW).unwrap();
        let wake = members_to_wake(Some(&before), Some(&doc));
        // a and b are behind the new assignment epoch (one of them must give a shard up);
        // c (the joiner, waiting for a shard) is answered directly but is listed too: the
        // caller leaves the requester out.
        assert!(wake.contains(&"a".to_owned()) && wake.contains(&"b".to_owned()));
    }

    #[test]
    fn a_release_wakes_the_member_waiting_for_the_shard() {
        let (mut doc, stream) = two_stable_members();
        doc.heartbeat(&stream, &hb("c", 0, &[]), NOW).unwrap();
        // a and b heartbeat: whoever gives up a shard is now revoking it.
        for id in ["a", "b"] {
            let m = &doc.members[id];
            let owned: Vec<u32> = m.assigned.iter().copied().collect();
            doc.heartbeat(&stream, &hb(id, m.member_epoch, &owned), NOW)
                .unwrap();
        }
        let c = doc.heartbeat(&stream, &hb("c", 1, &[]), NOW);
        let _ = c; // c is unreleased (its epoch may differ: not what this test checks)
        let revoker = ["a", "b"]
            .into_iter()
            .find(|id| !doc.members[*id].pending_revocation.is_empty())
            .expect("someone revokes");
        assert_ne!(doc.members["c"].state, MemberState::Stable);
        // The revoker reports it no longer owns the revoked shard.
        let before = doc.clone();
        let m = &doc.members[revoker];
        let owned: Vec<u32> = m.assigned.iter().copied().collect();
        doc.heartbeat(&stream, &hb(revoker, m.member_epoch, &owned), NOW)
            .unwrap();
        let wake = members_to_wake(Some(&before), Some(&doc));
        assert_eq!(wake, vec!["c".to_owned()], "{doc:#?}");
    }

    #[test]
    fn a_steady_heartbeat_wakes_nobody() {
        let (mut doc, stream) = two_stable_members();
        let before = doc.clone();
        settle(&mut doc, &stream, "a");
        assert!(members_to_wake(Some(&before), Some(&doc)).is_empty());
    }

    #[test]
    fn a_leave_wakes_the_survivors_and_an_expiry_wakes_the_expired() {
        let (mut doc, stream) = two_stable_members();
        let before = doc.clone();
        doc.leave(&stream, "a", -1).unwrap();
        assert_eq!(members_to_wake(Some(&before), Some(&doc)), vec!["a", "b"]);

        let (mut doc, stream) = two_stable_members();
        doc.members.get_mut("b").unwrap().last_heartbeat_ms = NOW + 10_000;
        let before = doc.clone();
        let events = doc.expire(&stream, NOW + doc.config.session_timeout_ms + 5_000);
        assert!(!events.is_empty());
        // a expired (its heartbeat learns UNKNOWN_MEMBER_ID); b takes over its shards.
        assert_eq!(members_to_wake(Some(&before), Some(&doc)), vec!["a", "b"]);
    }

    #[test]
    fn deletion_wakes_everyone_and_a_reshard_wakes_every_member() {
        let (doc, _) = two_stable_members();
        assert_eq!(members_to_wake(Some(&doc), None), vec!["a", "b"]);

        let (mut doc, mut stream) = two_stable_members();
        let before = doc.clone();
        stream.reshard(8, NOW).unwrap();
        assert!(doc.sync_layout(&stream));
        assert_eq!(members_to_wake(Some(&before), Some(&doc)), vec!["a", "b"]);
    }

    #[test]
    fn an_unsettled_member_whose_situation_did_not_change_is_not_woken_again() {
        let (mut doc, stream) = two_stable_members();
        doc.heartbeat(&stream, &hb("c", 0, &[]), NOW).unwrap();
        let before = doc.clone();
        // An unrelated change: a's client facts (the document changes, nobody's record does).
        doc.members.get_mut("a").unwrap().reported.clear();
        assert!(members_to_wake(Some(&before), Some(&doc)).is_empty());
    }

    #[test]
    fn a_pause_or_resume_wakes_every_member() {
        let (mut doc, _stream) = two_stable_members();
        let before = doc.clone();
        assert!(doc.set_paused(true, NOW));
        assert_eq!(members_to_wake(Some(&before), Some(&doc)), ["a", "b"]);
        let paused = doc.clone();
        assert!(!doc.set_paused(true, NOW + 1));
        assert!(members_to_wake(Some(&paused), Some(&doc)).is_empty());
        assert!(doc.set_paused(false, NOW + 2));
        assert_eq!(members_to_wake(Some(&paused), Some(&doc)), ["a", "b"]);
    }
}
