//! KIP-848 scenarios against the pure engine (no I/O; time is a number).

use super::*;
use rsc_protocol::{HeartbeatRequest, HeartbeatResponse, MemberState as S};

const SESSION: u64 = 45_000;
const REBALANCE: u64 = 60_000;

struct World {
    stream: StreamDoc,
    group: GroupDoc,
    now: u64,
}

impl World {
    fn new(shards: u32) -> Self {
        let mut stream = StreamDoc::new("orders", shards, 0).unwrap();
        stream.add_group("billing");
        let group = GroupDoc::new("billing", GroupConfig::default(), &stream, 0);
        World {
            stream,
            group,
            now: 1_000,
        }
    }

    fn hb(
        &mut self,
        member: &str,
        epoch: i64,
        owned: &[u32],
    ) -> Result<HeartbeatResponse, EngineError> {
        self.hb_full(member, epoch, owned, &[])
    }

    fn hb_full(
        &mut self,
        member: &str,
        epoch: i64,
        owned: &[u32],
        drained: &[u32],
    ) -> Result<HeartbeatResponse, EngineError> {
        self.hb_as(member, epoch, owned, drained, None)
    }

    /// A heartbeat of a static member's process run `incarnation`.
    fn hb_static(
        &mut self,
        member: &str,
        epoch: i64,
        owned: &[u32],
        incarnation: &str,
    ) -> Result<HeartbeatResponse, EngineError> {
        self.hb_as(member, epoch, owned, &[], Some(incarnation))
    }

    fn hb_as(
        &mut self,
        member: &str,
        epoch: i64,
        owned: &[u32],
        drained: &[u32],
        incarnation: Option<&str>,
    ) -> Result<HeartbeatResponse, EngineError> {
        let before = self.group.clone();
        let req = HeartbeatRequest {
            protocol_version: 1,
            member_id: member.into(),
            member_epoch: epoch,
            owned_shards: Some(owned.to_vec()),
            drained_shards: drained.to_vec(),
            client: None,
            incarnation: incarnation.map(str::to_owned),
        };
        let r = self.group.heartbeat(&self.stream, &req, self.now);
        if r.is_err() {
            assert_eq!(
                self.group, before,
                "a refused heartbeat must not change the document"
            );
        }
        self.assert_exclusive();
        r.map(|o| o.response)
    }

    /// Joins and converges: the member reports what it was given.
    fn join(&mut self, member: &str) -> HeartbeatResponse {
        self.hb(member, 0, &[]).unwrap()
    }

    fn state(&self, member: &str) -> S {
        self.group.members[member].state
    }

    fn assert_exclusive(&self) {
        let mut seen = std::collections::BTreeMap::new();
        for (id, m) in &self.group.members {
            for s in m.assigned.iter().chain(&m.pending_revocation) {
                if let Some(other) = seen.insert(*s, id.clone()) {
                    panic!("shard {s} held by {other} and {id}");
                }
            }
        }
    }
}

#[test]
fn first_member_gets_everything_and_is_stable() {
    let mut w = World::new(4);
    let r = w.join("m1");
    assert_eq!(r.assignment, vec![0, 1, 2, 3]);
    assert_eq!(r.member_epoch, 1);
    assert_eq!((w.group.group_epoch, w.group.assignment_epoch), (1, 1));
    assert_eq!(w.state("m1"), S::Stable);
    assert_eq!(
        (r.shard_count, r.routing_epoch, r.stream.as_str()),
        (4, 1, "orders")
    );
}

#[test]
fn second_member_waits_for_the_first_to_revoke() {
    let mut w = World::new(4);
    w.join("m1");
    let r2 = w.join("m2");
    assert_eq!(r2.member_epoch, 2);
    assert!(r2.assignment.is_empty(), "m1 still holds 2 and 3");
    assert_eq!(w.state("m2"), S::Unreleased);

    // m1, at epoch 1, is asked to revoke 2 and 3: it moves to epoch 2 (only a report sent
    // after this answer can release them), no new shards.
    let r1 = w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    assert_eq!((r1.member_epoch, r1.assignment.clone()), (2, vec![0, 1]));
    assert_eq!(w.state("m1"), S::Unrevoked);
    assert_eq!(w.group.members["m1"].pending_revocation, [2, 3].into());

    // m2 keeps waiting while m1 still reports 2 and 3.
    assert!(w.hb("m2", 2, &[]).unwrap().assignment.is_empty());

    // m1 confirms at epoch 2: it is stable; then m2 gets 2 and 3.
    let r1 = w.hb("m1", 2, &[0, 1]).unwrap();
    assert_eq!((r1.member_epoch, r1.assignment), (2, vec![0, 1]));
    assert_eq!(w.state("m1"), S::Stable);
    let r2 = w.hb("m2", 2, &[]).unwrap();
    assert_eq!(r2.assignment, vec![2, 3]);
    assert_eq!(w.state("m2"), S::Stable);
    assert!(w.group.is_stable());
}

#[test]
fn partial_revocation_releases_what_is_no_longer_reported() {
    let mut w = World::new(4);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    // m1 stopped reading 2 but not 3 yet: 2 is released at once.
    let r = w.hb("m1", 2, &[0, 1, 3]).unwrap();
    assert_eq!(r.member_epoch, 2);
    assert_eq!(w.group.members["m1"].pending_revocation, [3].into());
    assert_eq!(w.hb("m2", 2, &[]).unwrap().assignment, vec![2]);
    assert_eq!(w.state("m2"), S::Unreleased);
}

#[test]
fn future_and_older_epochs_are_fenced() {
    let mut w = World::new(2);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1]).unwrap(); // asked to revoke 1: epoch 2, previous 1
    w.hb("m1", 2, &[0]).unwrap(); // stable at epoch 2
    w.join("m3"); // group epoch 3
    w.hb("m1", 2, &[0]).unwrap(); // m1 keeps 0 (target of 2 members of 3: 1,1,0)
    let m1 = w.group.members["m1"].clone();
    assert_eq!((m1.member_epoch, m1.previous_epoch), (3, 2));
    for bad in [1, 4, 99] {
        let e = w.hb("m1", bad, &[0]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::FencedMemberEpoch, "epoch {bad}");
    }
}

#[test]
fn previous_epoch_is_tolerated_only_with_an_owned_subset() {
    let mut w = World::new(4);
    w.join("m1");
    w.join("m2");
    // The answer asking m1 to revoke 2 and 3 at epoch 2 is lost...
    w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    // ...so m1 sends epoch 1 again: what it reports is within what it holds: accepted, and
    // nothing is released (§5.4).
    let r = w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    assert_eq!((r.member_epoch, r.assignment), (2, vec![0, 1]));
    let r = w.hb("m1", 1, &[0, 1]).unwrap();
    assert_eq!(r.member_epoch, 2);
    assert_eq!(
        w.state("m1"),
        S::Unrevoked,
        "a previous-epoch report releases nothing"
    );
    // Its report at epoch 2 releases them; then the answer moving it on is lost too.
    w.hb("m1", 2, &[0, 1]).unwrap();
    assert_eq!(w.state("m1"), S::Stable);
    w.join("m3"); // epoch 3
    let r = w.hb("m1", 2, &[0, 1]).unwrap();
    let m1 = &w.group.members["m1"];
    assert_eq!((r.member_epoch, m1.previous_epoch), (3, 2));
    assert!(
        w.hb("m1", 2, &r.assignment).is_ok(),
        "previous epoch, a subset"
    );
    // With a shard outside what it holds: fenced.
    let e = w.hb("m1", 2, &[0, 1, 2]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::FencedMemberEpoch);
}

/// A group of three shards where "m1" is stable at epoch 2 with two shards, "m2" holds the
/// third, and "m3" has just joined (epoch 3), so that m1 must give up one shard. On the way,
/// while m1 revoked at epoch 2, its lease ran out and it reported owning nothing: that request
/// timed out and its retry got through (m1 then resumed its two shards), but the first one is
/// still on the network. Returns it, with the shard m1 keeps and the one it must give up.
fn late_report_world(w: &mut World) -> (HeartbeatRequest, u32, u32) {
    w.join("m1");
    w.join("m2");
    let r = w.hb("m1", 1, &[0, 1, 2]).unwrap(); // asked to revoke one shard: epoch 2
    assert_eq!(r.member_epoch, 2);
    let late = HeartbeatRequest {
        protocol_version: 1,
        member_id: "m1".into(),
        member_epoch: 2,
        owned_shards: Some(vec![]),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    };
    // The retry of the same report releases the revoked shard; m1 resumes the two others.
    let kept = w.hb("m1", 2, &[]).unwrap().assignment;
    assert_eq!(kept.len(), 2);
    assert_eq!(w.state("m1"), S::Stable);
    let m2 = w.hb("m2", 2, &[]).unwrap();
    w.hb("m2", 2, &m2.assignment).unwrap();
    assert_eq!(w.hb("m1", 2, &kept).unwrap().member_epoch, 2);
    w.join("m3");
    let target = &w.group.members["m1"].target;
    assert_eq!(
        target.len(),
        1,
        "m1 has two shards of three: it gives one to m3"
    );
    let keep = *target.first().unwrap();
    let give = kept.into_iter().find(|s| *s != keep).unwrap();
    (late, keep, give)
}

/// Delivers `late` to the engine (its sender gave up on it: the answer goes nowhere).
fn deliver(w: &mut World, late: &HeartbeatRequest) -> HeartbeatResponse {
    let out = w.group.heartbeat(&w.stream, late, w.now).unwrap();
    w.assert_exclusive();
    out.response
}

/// PROTOCOL §5.4: a heartbeat at the tolerated previous epoch never releases a shard. A
/// request can reach the coordinator after newer ones of its member (delayed past its
/// sender's timeout); what it reports owning says nothing of what the member owns now. (The
/// member simulation found it: seed 852.)
#[test]
fn a_late_heartbeat_at_the_previous_epoch_completes_no_revocation() {
    let mut w = World::new(3);
    let (late, keep, give) = late_report_world(&mut w);
    // m1 is asked to give up `give` (moving to epoch 3) and still works it.
    let r = w.hb("m1", 2, &[keep, give]).unwrap();
    assert_eq!((r.member_epoch, r.assignment), (3, vec![keep]));
    assert_eq!(w.state("m1"), S::Unrevoked);
    // The late request reports nothing at epoch 2, now the previous one: accepted, but it
    // releases nothing.
    let r = deliver(&mut w, &late);
    assert_eq!((r.member_epoch, r.assignment), (3, vec![keep]));
    assert_eq!(w.state("m1"), S::Unrevoked);
    assert_eq!(w.group.members["m1"].pending_revocation, [give].into());
    assert_eq!(w.group.members["m1"].reported, [keep, give].into());
    let r3 = w.hb("m3", 3, &[]).unwrap();
    assert!(r3.assignment.is_empty(), "m1 still works {give}");
    // Only a report at the current epoch completes the revocation.
    let r = w.hb("m1", 3, &[keep]).unwrap();
    assert_eq!((r.member_epoch, r.assignment), (3, vec![keep]));
    assert_eq!(w.hb("m3", 3, &[]).unwrap().assignment, vec![give]);
}

/// PROTOCOL §5.2: the same late request arriving before the member's own heartbeat at the new
/// target is at the member's current epoch, yet it predates the member's latest start of the
/// shard. A shard is never released by the heartbeat that finds it revoked: the revocation
/// starts (the member moves to the assignment epoch), and only a report sent after that
/// answer can complete it. (The member simulation found it: seeds 4158, 4879.)
#[test]
fn a_late_heartbeat_at_the_current_epoch_releases_nothing_a_new_target_revokes() {
    let mut w = World::new(3);
    let (late, keep, give) = late_report_world(&mut w);
    let r = deliver(&mut w, &late);
    assert_eq!((r.member_epoch, r.assignment), (3, vec![keep]));
    assert_eq!(w.state("m1"), S::Unrevoked);
    assert_eq!(w.group.members["m1"].pending_revocation, [give].into());
    assert!(w.hb("m3", 3, &[]).unwrap().assignment.is_empty());
    // m1, unaware, heartbeats at epoch 2 (now the previous one), learns, revokes, reports.
    let r = w.hb("m1", 2, &[keep, give]).unwrap();
    assert_eq!((r.member_epoch, r.assignment), (3, vec![keep]));
    assert_eq!(w.state("m1"), S::Unrevoked);
    let r = w.hb("m1", 3, &[keep]).unwrap();
    assert_eq!((r.member_epoch, w.state("m1")), (3, S::Stable));
    assert_eq!(w.hb("m3", 3, &[]).unwrap().assignment, vec![give]);
}

/// PROTOCOL §5.1: a join of a live member may be a late copy of one it sent before it joined
/// and started shards; what it holds is released only once a report at its new epoch no
/// longer names it. (The member simulation found it: seeds 1134, 6394, 6587.)
#[test]
fn a_late_join_releases_nothing_the_member_works() {
    let mut w = World::new(2);
    let late = HeartbeatRequest {
        protocol_version: 1,
        member_id: "m1".into(),
        member_epoch: 0,
        owned_shards: Some(vec![]),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    };
    // m1's join timed out; its retry got through: m1 works both shards.
    let r = w.join("m1");
    w.hb("m1", r.member_epoch, &[0, 1]).unwrap();
    let r2 = w.join("m2"); // epoch 2: m1 is to give one shard up
    assert!(r2.assignment.is_empty());
    let mut m2 = r2.member_epoch;
    let mut m2_beat = |w: &mut World| {
        let r = w.hb("m2", m2, &[]).unwrap();
        m2 = r.member_epoch;
        r.assignment
    };
    // The late join arrives: m1 (the coordinator cannot tell) joins again, owning nothing.
    let r = deliver(&mut w, &late);
    assert_eq!(r.member_epoch, 3);
    let give = 1 - r.assignment[0];
    assert_eq!(w.group.members["m1"].pending_revocation, [give].into());
    assert!(m2_beat(&mut w).is_empty(), "m1 still works {give}");
    // m1, unaware, heartbeats at epoch 1: fenced (its epoch moved on), it stops its workers
    // and joins again, owning nothing; its report at the new epoch releases the shard.
    assert_eq!(
        w.hb("m1", 1, &[0, 1]).unwrap_err().code(),
        ErrorCode::FencedMemberEpoch
    );
    let r = w.join("m1");
    assert!(m2_beat(&mut w).is_empty());
    w.hb("m1", r.member_epoch, &[]).unwrap();
    assert_eq!(m2_beat(&mut w), vec![give]);
}

/// A join after the member's session is over releases what it held at once: its old process
/// run has stopped reading (its lease ran out first, PROTOCOL §5.3).
#[test]
fn a_join_after_the_session_releases_at_once() {
    let mut w = World::new(2);
    let r = w.join("m1");
    w.hb("m1", r.member_epoch, &[0, 1]).unwrap();
    w.join("m2");
    w.now += SESSION + 1;
    w.hb("m2", 2, &[]).unwrap();
    let r = w.join("m1");
    assert!(w.group.members["m1"].pending_revocation.is_empty());
    assert_eq!(w.state("m1"), S::Stable);
    assert_eq!(r.assignment.len(), 1);
    assert_eq!(w.hb("m2", 2, &[]).unwrap().assignment.len(), 1);
}

#[test]
fn unknown_member_and_bad_requests() {
    let mut w = World::new(2);
    assert_eq!(
        w.hb("ghost", 3, &[]).unwrap_err().code(),
        ErrorCode::UnknownMemberId
    );
    assert_eq!(
        w.hb("ghost", -1, &[]).unwrap_err().code(),
        ErrorCode::UnknownMemberId
    );
    assert_eq!(
        w.hb("m1", -3, &[]).unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        w.hb("bad id", 0, &[]).unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    let req = HeartbeatRequest {
        protocol_version: 2,
        member_id: "m1".into(),
        member_epoch: 0,
        owned_shards: Some(vec![]),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    };
    assert_eq!(
        w.group.heartbeat(&w.stream, &req, 0).unwrap_err().code(),
        ErrorCode::UnsupportedProtocolVersion
    );
}

#[test]
fn leave_frees_shards_at_once() {
    let mut w = World::new(4);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    // m1 leaves while still holding 2 and 3 pending revocation.
    let r = w.hb("m1", -1, &[]).unwrap();
    assert_eq!((r.member_epoch, r.assignment.len()), (-1, 0));
    assert!(!w.group.members.contains_key("m1"));
    let r = w.hb("m2", 2, &[]).unwrap();
    assert_eq!(r.assignment, vec![0, 1, 2, 3]);
    assert_eq!(r.member_epoch, 3);
    // POST leave of a known member with a stale epoch is fenced; of an unknown one, unknown.
    w.join("m3");
    let stale = w.group.members["m3"].member_epoch - 1;
    let e = w
        .group
        .leave(&w.stream.clone(), "m3", stale - 5)
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::FencedMemberEpoch);
    let e = w.group.leave(&w.stream.clone(), "nobody", 1).unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownMemberId);
}

#[test]
fn session_expiry_removes_and_frees() {
    let mut w = World::new(2);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1]).unwrap();
    w.hb("m1", 2, &[0]).unwrap();
    w.hb("m2", 2, &[]).unwrap();
    // m2 keeps heartbeating; m1 goes silent.
    w.now += SESSION;
    w.hb("m2", 2, &[1]).unwrap();
    assert!(
        w.group.expire(&w.stream, w.now).is_empty(),
        "exactly at the timeout it is kept"
    );
    assert_eq!(w.group.next_deadline_ms(), Some(1_000 + SESSION + 1));
    w.now += 1;
    let events = w.group.expire(&w.stream, w.now);
    assert!(events.contains(&GroupEvent::SessionExpired("m1".into())));
    assert_eq!(
        w.hb("m1", 2, &[0]).unwrap_err().code(),
        ErrorCode::UnknownMemberId
    );
    let r = w.hb("m2", 2, &[1]).unwrap();
    assert_eq!(r.assignment, vec![0, 1]);
}

#[test]
fn rebalance_timeout_removes_a_member_that_never_revokes_but_not_one_that_did() {
    let mut w = World::new(6);
    w.join("slow");
    w.join("quick");
    w.hb("slow", 1, &[0, 1, 2, 3, 4, 5]).unwrap(); // asked to revoke 3,4,5: epoch 2
    w.hb("slow", 2, &[0, 1, 2]).unwrap(); // revokes
    w.hb("quick", 2, &[]).unwrap();
    w.join("late"); // both slow and quick must give one shard up
    w.hb("slow", 2, &[0, 1, 2]).unwrap();
    w.hb("quick", 2, &[3, 4, 5]).unwrap();
    assert_eq!(w.state("slow"), S::Unrevoked);
    assert_eq!(w.state("quick"), S::Unrevoked);
    let asked_at = w.now;
    w.now += 1_000;
    // quick revokes; slow never does, but keeps heartbeating (so no session expiry).
    w.hb("quick", 3, &[3, 4]).unwrap();
    while w.now + 10_000 < asked_at + REBALANCE {
        w.now += 10_000;
        w.hb("slow", 3, &[0, 1, 2]).unwrap();
        w.hb("quick", 3, &[3, 4]).unwrap();
        w.hb("late", 3, &[]).unwrap();
        assert!(w.group.expire(&w.stream, w.now).is_empty());
    }
    w.now = asked_at + REBALANCE;
    assert!(w.group.expire(&w.stream, w.now).is_empty());
    w.now += 1;
    let events = w.group.expire(&w.stream, w.now);
    assert_eq!(events[0], GroupEvent::RebalanceTimedOut("slow".into()));
    assert!(w.group.members.contains_key("quick"));
    assert_eq!(
        w.hb("slow", 2, &[0, 1, 2]).unwrap_err().code(),
        ErrorCode::UnknownMemberId
    );
}

/// A member removed for the rebalance timeout while its lease runs may still be reading (it is
/// not told until its next heartbeat, and a worker it restarts is not stopped under `lease`
/// fencing): what it held stays held until its lease would have ended, as for a silent
/// member, then is free (PROTOCOL §5.3). Its next heartbeat is `UNKNOWN_MEMBER_ID`.
#[test]
fn a_member_removed_for_the_rebalance_timeout_holds_its_shards_until_its_lease_ends() {
    let mut w = World::new(2);
    w.join("slow");
    w.hb("slow", 1, &[0, 1]).unwrap();
    w.join("quick"); // epoch 2: slow keeps 0, must revoke 1
    w.hb("slow", 1, &[0, 1]).unwrap();
    w.hb("quick", 2, &[]).unwrap();
    assert_eq!(w.state("slow"), S::Unrevoked);
    let asked_at = w.now;
    while w.now + 10_000 <= asked_at + REBALANCE {
        w.now += 10_000;
        w.hb("slow", 2, &[0, 1]).unwrap(); // never revokes
        w.hb("quick", 2, &[]).unwrap();
    }
    let last_heard = w.now;
    w.now = asked_at + REBALANCE + 1;
    let events = w.group.expire(&w.stream, w.now);
    assert_eq!(events[0], GroupEvent::RebalanceTimedOut("slow".into()));
    assert!(w.group.members["slow"].is_removed());
    assert!(w.group.members["slow"].target.is_empty());
    assert_eq!(w.group.members["quick"].target, BTreeSet::from([0, 1]));
    // Within slow's lease, quick gets nothing slow held, and the group is not stable.
    let epoch = w.group.members["quick"].member_epoch;
    let r = w.hb("quick", epoch, &[]).unwrap();
    assert!(r.assignment.is_empty(), "{r:?}");
    assert_eq!(w.state("quick"), S::Unreleased);
    assert!(!w.group.is_stable());
    let e = w.hb("slow", 2, &[0, 1]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownMemberId);
    let e = w.hb("slow", 3, &[0, 1]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownMemberId);
    assert_eq!(w.group.next_deadline_ms(), Some(last_heard + SESSION + 1));
    w.now = last_heard + SESSION;
    assert!(w.group.expire(&w.stream, w.now).is_empty());
    // At the end of its lease it is expired like any silent member: quick gets both.
    w.now += 1;
    let events = w.group.expire(&w.stream, w.now);
    assert_eq!(events[0], GroupEvent::SessionExpired("slow".into()));
    assert!(!w.group.members.contains_key("slow"));
    let epoch = w.group.members["quick"].member_epoch;
    let r = w.hb("quick", epoch, &[]).unwrap();
    assert_eq!(r.assignment, vec![0, 1]);
}

/// A member removed for the rebalance timeout that joins again within its lease starts over
/// as any rejoin does (PROTOCOL §5.1): what it held is released by its first report at its new
/// epoch that leaves it out, not before.
#[test]
fn a_member_removed_for_the_rebalance_timeout_rejoins_holding_until_it_reports() {
    let mut w = World::new(2);
    w.join("slow");
    w.hb("slow", 1, &[0, 1]).unwrap();
    w.join("quick");
    w.hb("slow", 1, &[0, 1]).unwrap();
    w.now += REBALANCE - 5_000;
    w.hb("slow", 2, &[0, 1]).unwrap();
    w.hb("quick", 2, &[]).unwrap();
    w.now += 5_001;
    let events = w.group.expire(&w.stream, w.now);
    assert_eq!(events[0], GroupEvent::RebalanceTimedOut("slow".into()));
    let r = w.hb("slow", 0, &[]).unwrap(); // rejoins: keeps what its new target has
    assert_eq!(r.assignment.len(), 1);
    assert!(!w.group.members["slow"].is_removed());
    assert_eq!(w.group.members["slow"].pending_revocation.len(), 1);
    let quick = w.group.members["quick"].member_epoch;
    assert!(w.hb("quick", quick, &[]).unwrap().assignment.is_empty());
    // Its report at the new epoch without the shards it no longer gets releases them.
    let epoch = r.member_epoch;
    let r = w.hb("slow", epoch, &[]).unwrap();
    let quick = w.group.members["quick"].member_epoch;
    let q = w.hb("quick", quick, &[]).unwrap();
    assert_eq!(r.assignment.len() + q.assignment.len(), 2);
}

#[test]
fn a_new_target_while_revoking_applies_at_once() {
    let mut w = World::new(6);
    w.join("m1");
    w.hb("m1", 1, &[0, 1, 2, 3, 4, 5]).unwrap();
    w.join("m2"); // epoch 2: m1 keeps 0,1,2
    w.hb("m1", 1, &[0, 1, 2, 3, 4, 5]).unwrap();
    assert_eq!(w.state("m1"), S::Unrevoked);
    w.join("m3"); // epoch 3: target of m1 shrinks to 0,1
    let r = w.hb("m1", 2, &[0, 1, 2, 3, 4, 5]).unwrap();
    assert_eq!(r.member_epoch, 3, "asked to revoke more: the newest epoch");
    assert_eq!(r.assignment, vec![0, 1]);
    assert_eq!(w.state("m1"), S::Unrevoked);
    // Confirms: stable at the newest assignment epoch.
    let r = w.hb("m1", 3, &[0, 1]).unwrap();
    assert_eq!((r.member_epoch, r.assignment), (3, vec![0, 1]));
    let r2 = w.hb("m2", 2, &[]).unwrap();
    let r3 = w.hb("m3", 3, &[]).unwrap();
    assert_eq!(r2.assignment.len() + r3.assignment.len(), 4);
    assert!(w.group.is_stable());
}

#[test]
fn a_shard_returning_to_its_revoker_is_kept() {
    let mut w = World::new(4);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1, 2, 3]).unwrap(); // asked to revoke 2, 3: epoch 2
    w.hb("m2", 2, &[]).unwrap();
    // m2 leaves before m1 let go: the target gives everything back to m1.
    w.hb("m2", -1, &[]).unwrap();
    let r = w.hb("m1", 2, &[0, 1, 2, 3]).unwrap();
    assert_eq!(r.assignment, vec![0, 1, 2, 3]);
    assert!(rsc_protocol::MemberEpoch::new(r.member_epoch).is(w.group.assignment_epoch));
    assert_eq!(w.state("m1"), S::Stable);
}

#[test]
fn rejoin_with_epoch_zero_releases_the_old_incarnation_once_reported() {
    let mut w = World::new(2);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1]).unwrap();
    // m1 restarts and rejoins while the coordinator thinks it holds 0 and 1 pending 1.
    let r = w.hb("m1", 0, &[0, 1]).unwrap();
    assert_eq!(r.member_epoch, 3);
    assert_eq!(r.assignment, vec![0], "its target shard is its own again");
    // Within the old run's session, 1 is released by m1's first report at its new epoch.
    assert!(w.hb("m2", 2, &[]).unwrap().assignment.is_empty());
    w.hb("m1", 3, &[0]).unwrap();
    assert_eq!(w.hb("m2", 2, &[]).unwrap().assignment, vec![1]);
    // Its old epoch is fenced.
    assert_eq!(
        w.hb("m1", 1, &[0]).unwrap_err().code(),
        ErrorCode::FencedMemberEpoch
    );
}

#[test]
fn reporting_a_shard_never_given_is_ignored() {
    let mut w = World::new(2);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1]).unwrap();
    w.hb("m1", 2, &[0]).unwrap();
    let r = w.hb("m2", 2, &[0, 1, 7]).unwrap();
    assert_eq!(r.assignment, vec![1]);
    assert!(w.group.members["m1"].holds(0));
}

#[test]
fn max_members_is_enforced() {
    let mut w = World::new(2);
    w.group.config.max_members = Some(1);
    w.join("m1");
    assert_eq!(
        w.hb("m2", 0, &[]).unwrap_err().code(),
        ErrorCode::GroupMaxSizeReached
    );
    // A known member may rejoin at the limit.
    w.hb("m1", 0, &[]).unwrap();
}

#[test]
fn config_change_bumps_the_group_epoch_and_keeps_the_target() {
    let mut w = World::new(4);
    w.join("m1");
    let before = w.group.members["m1"].target.clone();
    let patch = rsc_protocol::PatchGroupRequest {
        session_timeout_ms: Some(10_000),
        ..Default::default()
    };
    assert!(w.group.update_config(&w.stream, &patch).unwrap());
    assert_eq!(w.group.group_epoch, 2);
    assert_eq!(w.group.members["m1"].target, before);
    assert!(
        !w.group.update_config(&w.stream, &patch).unwrap(),
        "no change, no bump"
    );
    let bad = rsc_protocol::PatchGroupRequest {
        heartbeat_interval_ms: Some(10_000),
        ..Default::default()
    };
    assert_eq!(
        w.group.update_config(&w.stream, &bad).unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    // The member catches up to the new epoch on its next heartbeat.
    let r = w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    assert_eq!(r.member_epoch, 2);
    assert_eq!(r.session_timeout_ms, 10_000);
}

#[test]
fn scale_down_drains_then_retires() {
    let mut w = World::new(4);
    w.join("m1");
    w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    w.stream.reshard(2, w.now).unwrap();
    assert!(w.group.sync_layout(&w.stream));
    // Draining shards stay assigned; the heartbeat already says 2 shards.
    let r = w.hb("m1", 1, &[0, 1, 2, 3]).unwrap();
    assert_eq!(r.shard_count, 2);
    assert_eq!(r.routing_epoch, 2);
    assert_eq!(r.assignment, vec![0, 1, 2, 3]);
    // Reporting drained shards hands them to the service to record in the stream.
    let req = HeartbeatRequest {
        protocol_version: 1,
        member_id: "m1".into(),
        member_epoch: r.member_epoch,
        owned_shards: Some(vec![0, 1, 2, 3]),
        drained_shards: vec![2, 3, 9],
        client: None,
        incarnation: None,
    };
    let out = w.group.heartbeat(&w.stream, &req, w.now).unwrap();
    assert_eq!(out.drained, vec![2, 3]);
    assert!(w.stream.mark_drained("billing", &out.drained, w.now));
    assert!(w.group.sync_layout(&w.stream));
    // Retired shards are revoked like any other.
    let r = w
        .hb("m1", out.response.member_epoch, &[0, 1, 2, 3])
        .unwrap();
    assert_eq!(r.assignment, vec![0, 1]);
    assert_eq!(w.state("m1"), S::Unrevoked);
    let r = w.hb("m1", r.member_epoch, &[0, 1]).unwrap();
    assert_eq!(r.assignment, vec![0, 1]);
    assert_eq!(w.state("m1"), S::Stable);
}

#[test]
fn scale_up_assigns_new_shards_with_the_layout() {
    let mut w = World::new(2);
    w.join("m1");
    w.join("m2");
    w.hb("m1", 1, &[0, 1]).unwrap();
    w.hb("m1", 1, &[0]).unwrap();
    w.hb("m2", 2, &[]).unwrap();
    w.stream.reshard(4, w.now).unwrap();
    w.group.sync_layout(&w.stream);
    let r1 = w.hb("m1", 2, &[0]).unwrap();
    let r2 = w.hb("m2", 2, &[1]).unwrap();
    assert_eq!(r1.assignment.len() + r2.assignment.len(), 4);
    assert!(
        r1.assignment.contains(&0) && r2.assignment.contains(&1),
        "sticky"
    );
}

#[test]
fn lease_groups_send_no_owner_tokens() {
    let mut w = World::new(2);
    assert!(w.join("m1").owner_tokens.is_empty());
}

#[test]
fn owner_tokens_change_whenever_a_shard_changes_hands() {
    let mut w = World::new(2);
    w.group.config.fencing = rsc_protocol::FencingMode::Strict;
    let r = w.join("m1");
    assert_eq!(r.assignment, vec![0, 1]);
    let first = r.owner_tokens.clone();
    assert_eq!(first.len(), 2);
    assert_eq!(
        first[&0],
        rsc_protocol::owner::OwnerToken::new(0, r.member_epoch, "m1").to_string()
    );
    // m2 joins: m1 revokes one shard, keeps the other with the same token.
    let r2 = w.join("m2");
    assert!(
        r2.owner_tokens.is_empty(),
        "nothing granted before the revocation"
    );
    let r = w.hb("m1", r.member_epoch, &[0, 1]).unwrap();
    assert_eq!(r.assignment.len(), 1);
    let kept = r.assignment[0];
    let moved = 1 - kept;
    assert_eq!(
        r.owner_tokens[&kept], first[&kept],
        "a kept shard keeps its token"
    );
    let r = w.hb("m1", r.member_epoch, &[kept]).unwrap();
    assert_eq!(r.owner_tokens[&kept], first[&kept]);
    let r2 = w.hb("m2", r2.member_epoch, &[]).unwrap();
    assert_eq!(r2.assignment, vec![moved]);
    assert_ne!(r2.owner_tokens[&moved], first[&moved]);
    // m2 rejoins under the same id: a new grant, a new token.
    w.hb("m2", 0, &[]).unwrap();
    let again = w.hb("m2", w.group.members["m2"].member_epoch, &[]).unwrap();
    if let Some(t) = again.owner_tokens.get(&moved) {
        assert_ne!(*t, r2.owner_tokens[&moved], "a rejoin is a new grant");
    }
}

#[test]
fn static_member_restart_keeps_its_shards_without_a_rebalance() {
    let mut w = World::new(4);
    let r = w.hb_static("s1", 0, &[], "run-1").unwrap();
    assert_eq!(r.assignment, vec![0, 1, 2, 3]);
    w.join("d2");
    let e1 = w.group.members["s1"].member_epoch;
    let r = w.hb_static("s1", e1, &[0, 1, 2, 3], "run-1").unwrap();
    let r = w.hb_static("s1", r.member_epoch, &[0, 1], "run-1").unwrap();
    let d2 = w.hb("d2", w.group.members["d2"].member_epoch, &[]).unwrap();
    assert_eq!(
        (r.assignment.clone(), d2.assignment),
        (vec![0, 1], vec![2, 3])
    );
    let group_epoch = w.group.group_epoch;
    let epoch = r.member_epoch;

    // A graceful restart: -2 keeps the shards (unread), the group does not rebalance.
    let away = w.hb_static("s1", -2, &[], "run-1").unwrap();
    assert_eq!((away.member_epoch, away.assignment.len()), (-2, 0));
    assert_eq!(w.group.group_epoch, group_epoch);
    assert_eq!(w.group.members["s1"].assigned, [0, 1].into());
    assert!(
        w.group.is_stable(),
        "an away member does not hold the group unstable"
    );
    // A heartbeat of the old run after -2 is fenced: only a join brings it back.
    assert_eq!(
        w.hb_static("s1", epoch, &[], "run-1").unwrap_err().code(),
        ErrorCode::FencedMemberEpoch
    );
    // The other member keeps exactly its shards meanwhile.
    w.now += 5_000;
    let d2 = w
        .hb("d2", w.group.members["d2"].member_epoch, &[2, 3])
        .unwrap();
    assert_eq!(d2.assignment, vec![2, 3]);

    // The new run joins under the same id: same shards, same epoch, no rebalance.
    let back = w.hb_static("s1", 0, &[], "run-2").unwrap();
    assert_eq!((back.member_epoch, back.assignment), (epoch, vec![0, 1]));
    assert_eq!(w.group.group_epoch, group_epoch);
    assert_eq!(w.group.members["s1"].away_since_ms, None);
    assert_eq!(w.group.members["s1"].incarnation.as_deref(), Some("run-2"));
    assert!(w.group.is_stable());
}

#[test]
fn a_static_id_held_by_a_live_process_is_refused() {
    let mut w = World::new(2);
    w.hb_static("s1", 0, &[], "run-1").unwrap();
    let e = w.hb_static("s1", 0, &[], "run-2").unwrap_err();
    assert_eq!(e.code(), ErrorCode::MemberIdInUse);
    // -2 from another run than the one that holds the id is refused too.
    let e = w.hb_static("s1", -2, &[], "run-2").unwrap_err();
    assert_eq!(e.code(), ErrorCode::MemberIdInUse);
    // The same run rejoining (e.g. after a fence) is a plain rejoin.
    w.hb_static("s1", 0, &[], "run-1").unwrap();
    // Once the holder's session is over (crashed, not yet swept), the new run may join.
    w.now += SESSION + 1;
    let r = w.hb_static("s1", 0, &[], "run-2").unwrap();
    assert_eq!(r.assignment, vec![0, 1]);
    // A dynamic member cannot step away.
    w.join("d1");
    assert_eq!(
        w.hb("d1", -2, &[]).unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
}

/// A dynamic member naming its process run (PROTOCOL §17): a second live process with the
/// same id is refused at join, and the holder keeps its shards and its epoch; it is not a
/// static member (no -2, not `is_static` in the view).
#[test]
fn a_dynamic_id_held_by_a_live_process_is_refused_and_cannot_step_away() {
    let mut w = World::new(2);
    let (run1, run2) = ("dynamic:1-a", "dynamic:2-b");
    let r = w.hb_static("d1", 0, &[], run1).unwrap();
    let r = w
        .hb_static("d1", r.member_epoch, &r.assignment, run1)
        .unwrap();
    let (epoch, group_epoch) = (r.member_epoch, w.group.group_epoch);
    let e = w.hb_static("d1", 0, &[], run2).unwrap_err();
    assert_eq!(e.code(), ErrorCode::MemberIdInUse);
    assert_eq!(
        w.group.members["d1"].member_epoch, epoch,
        "the holder is not fenced"
    );
    assert_eq!(w.group.group_epoch, group_epoch);
    assert_eq!(
        w.hb_static("d1", -2, &[], run1).unwrap_err().code(),
        ErrorCode::InvalidRequest,
        "a dynamic member cannot step away"
    );
    let view = crate::engine::view::member_view("d1", &w.group.members["d1"], w.now);
    assert!(!view.is_static);
    // Its own leave (-1) with its incarnation is accepted; another run's is not.
    assert_eq!(
        w.hb_static("d1", -1, &[], run2).unwrap_err().code(),
        ErrorCode::MemberIdInUse
    );
    w.hb_static("d1", -1, &[], run1).unwrap();
    assert!(!w.group.members.contains_key("d1"));
    w.hb_static("d1", 0, &[], run2).unwrap();
}

#[test]
fn an_away_static_member_expires_after_its_session_and_its_shards_move() {
    let mut w = World::new(2);
    w.hb_static("s1", 0, &[], "run-1").unwrap();
    w.join("d2");
    let epoch = w.group.members["s1"].member_epoch;
    w.hb_static("s1", epoch, &[0, 1], "run-1").unwrap();
    w.hb_static("s1", -2, &[], "run-1").unwrap();
    // A rebalance while it is away (a third member joins) frees what it no longer gets.
    w.join("d3");
    let s1 = &w.group.members["s1"];
    assert!(s1.assigned.is_subset(&s1.target));
    w.now += SESSION / 2;
    w.hb("d2", w.group.members["d2"].member_epoch, &[]).unwrap();
    w.hb("d3", w.group.members["d3"].member_epoch, &[]).unwrap();
    let at = w.group.next_deadline_ms().unwrap();
    assert!(w.group.expire(&w.stream.clone(), at - 1).is_empty());
    let events = w.group.expire(&w.stream.clone(), at);
    assert!(events.contains(&GroupEvent::SessionExpired("s1".into())));
    // A return after the session is a fresh join.
    assert!(!w.group.members.contains_key("s1"));
    w.hb_static("s1", 0, &[], "run-2").unwrap();
    let s1 = &w.group.members["s1"];
    assert_eq!(
        (s1.incarnation.as_deref(), s1.away_since_ms),
        (Some("run-2"), None)
    );
}

#[test]
fn a_paused_group_says_so_in_every_answer_and_keeps_its_assignment() {
    let mut w = World::new(4);
    let r = w.join("m1");
    assert!(!r.paused);
    let r = w.hb("m1", r.member_epoch, &r.assignment).unwrap();
    let epoch = w.group.group_epoch;
    assert!(w.group.set_paused(true, 5_000));
    assert!(
        !w.group.set_paused(true, 6_000),
        "pausing twice changes nothing"
    );
    assert_eq!(w.group.config.paused_since_ms, Some(5_000));
    assert_eq!(w.group.group_epoch, epoch, "a pause is no rebalance");
    // The steady fast path and the full path both carry it.
    let req = HeartbeatRequest {
        protocol_version: 1,
        member_id: "m1".into(),
        member_epoch: r.member_epoch,
        owned_shards: Some(r.assignment.clone()),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    };
    assert!(w.group.steady_heartbeat(&w.stream, &req).unwrap().paused);
    let same = w.hb("m1", r.member_epoch, &r.assignment).unwrap();
    assert!(same.paused);
    assert_eq!(same.assignment, r.assignment);
    // Through a rebalance: the joining member is told at once.
    let r2 = w.join("m2");
    assert!(r2.paused);
    assert!(
        w.hb("m1", same.member_epoch, &same.assignment)
            .unwrap()
            .paused
    );
    assert!(w.group.set_paused(false, 7_000));
    assert_eq!(w.group.config.paused_since_ms, None);
    assert!(!w.hb("m2", r2.member_epoch, &r2.assignment).unwrap().paused);
    // Documents written before pausing existed read as not paused.
    let mut json = serde_json::to_value(&w.group).unwrap();
    json["config"]
        .as_object_mut()
        .unwrap()
        .remove("paused_since_ms");
    let old: GroupDoc = serde_json::from_value(json).unwrap();
    assert_eq!(old.config.paused_since_ms, None);
}

/// The service's one rule for "the document changed": anything but a member's heartbeat
/// time. A steady heartbeat changes only that; a join, a reported release, a pause do not.
#[test]
fn only_heartbeat_times_are_not_a_change() {
    let mut w = World::new(4);
    let a = w.hb("a", 0, &[]).unwrap();
    let owned = a.assignment.clone();
    w.hb("a", a.member_epoch, &owned).unwrap();
    let read = w.group.clone();
    assert!(!read.differs_beyond_liveness(&w.group));

    w.now += 1_000;
    w.hb("a", a.member_epoch, &owned).unwrap();
    assert_ne!(w.group, read, "the heartbeat time moved");
    assert!(
        !w.group.differs_beyond_liveness(&read),
        "steady: liveness only"
    );

    let mut paused = read.clone();
    paused.set_paused(true, w.now);
    assert!(paused.differs_beyond_liveness(&read));

    let mut released = read.clone();
    released.members.get_mut("a").unwrap().reported.clear();
    assert!(released.differs_beyond_liveness(&read));

    w.hb("b", 0, &[]).unwrap();
    assert!(w.group.differs_beyond_liveness(&read), "a member joined");
    let mut gone = w.group.clone();
    gone.members.remove("b");
    gone.members
        .insert("c".into(), w.group.members["b"].clone());
    assert!(gone.differs_beyond_liveness(&w.group), "another member id");
}
