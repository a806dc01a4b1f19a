//! What the recovery copy holds, and how a lost document is rebuilt from it (pure: no I/O).
//!
//! A group's copy is its configuration and the highest epoch it handed out; never its members
//! or any per-heartbeat state, so a steady heartbeat changes nothing here. A stream's copy is
//! its whole document (shard count, routing epoch, reshard state, retention): it changes only
//! on an operator's request or a reshard's progress.

use crate::engine::{GroupConfig, GroupDoc, StreamDoc};
use serde::{Deserialize, Serialize};

/// How far above the highest epoch the copy recorded a restored group starts (PROTOCOL
/// §2.3). The copy is written after each commit that raised the epoch, so the gap only
/// covers the commits of the last instants before the loss whose copy did not land; every
/// member of the lost incarnation held an epoch below the restored one.
pub const EPOCH_GAP: u64 = 1_000;

/// A group's recovery copy (`P:recovery:groups`, field `<group>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCopy {
    /// Group id.
    pub group: String,
    /// Its stream.
    pub stream: String,
    /// Its settings (timeouts, fencing, ordering, member limit, assignor, start, pause).
    pub config: GroupConfig,
    /// When this incarnation of the group was created (Unix ms): owner tokens carry it
    /// (PROTOCOL §5.6), so a restored group keeps it.
    pub created_ms: u64,
    /// The highest group, assignment or member epoch the document held.
    pub epoch: u64,
    /// The revision of the document this copy was taken from.
    pub revision: u64,
}

impl GroupCopy {
    /// The copy of `doc`, stored at `revision`.
    pub fn of(doc: &GroupDoc, revision: u64) -> Self {
        let members = doc
            .members
            .values()
            .map(|m| u64::try_from(m.member_epoch).unwrap_or(0))
            .max()
            .unwrap_or(0);
        GroupCopy {
            group: doc.group.clone(),
            stream: doc.stream.clone(),
            config: doc.config.clone(),
            created_ms: doc.created_ms,
            epoch: doc.group_epoch.max(doc.assignment_epoch).max(members),
            revision,
        }
    }

    /// Whether `other` records the same thing (the revision aside): then it need not be
    /// written again.
    pub fn same_as(&self, other: &GroupCopy) -> bool {
        GroupCopy {
            revision: other.revision,
            ..self.clone()
        } == *other
    }

    /// The group document to restore: the recorded settings on `stream`'s layout, no
    /// members, and group and assignment epochs [`EPOCH_GAP`] above the recorded epoch, so
    /// that every member rejoins (its epoch is unknown) at an epoch above any it held, and
    /// owner tokens granted from now on order after every earlier one.
    pub fn restore(&self, stream: &StreamDoc) -> GroupDoc {
        let mut doc = GroupDoc::new(&self.group, self.config.clone(), stream, self.created_ms);
        let epoch = self.epoch.saturating_add(EPOCH_GAP);
        doc.group_epoch = epoch;
        doc.assignment_epoch = epoch;
        doc
    }
}

/// A stream's recovery copy (`P:recovery:streams`, field `<stream>`, JSON): the whole
/// document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCopy {
    /// The document as stored.
    pub doc: StreamDoc,
    /// Its revision.
    pub revision: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::MemberDoc;

    fn stream() -> StreamDoc {
        StreamDoc::new("s", 4, 1_000).unwrap()
    }

    fn group_with_member(epoch: i64) -> GroupDoc {
        let mut g = GroupDoc::new("g", GroupConfig::default(), &stream(), 5_000);
        g.group_epoch = 7;
        g.assignment_epoch = 6;
        let m: MemberDoc = serde_json::from_value(serde_json::json!({
            "member_epoch": epoch, "previous_epoch": 0, "state": "stable",
            "assigned": [], "pending_revocation": [], "target": [], "reported": [],
            "revoke_started_ms": null, "last_heartbeat_ms": 1, "joined_ms": 1, "client": null,
        }))
        .unwrap();
        g.members.insert("m".into(), m);
        g
    }

    /// The copy keeps the settings and the highest epoch, never members.
    #[test]
    fn the_copy_keeps_settings_and_the_highest_epoch() {
        let mut g = group_with_member(9);
        g.config.session_timeout_ms = 12_345;
        let c = GroupCopy::of(&g, 42);
        assert_eq!(c.epoch, 9, "a member epoch above the group epoch counts");
        assert_eq!(c.config.session_timeout_ms, 12_345);
        assert_eq!((c.created_ms, c.revision), (5_000, 42));
        assert_eq!(GroupCopy::of(&group_with_member(3), 1).epoch, 7);
        assert_eq!(GroupCopy::of(&group_with_member(-1), 1).epoch, 7);
    }

    /// A change of members' states alone (a heartbeat, a revocation) leaves the copy as it
    /// was, so nothing is written; a new epoch or a setting does not.
    #[test]
    fn only_settings_and_epochs_change_the_copy() {
        let g = group_with_member(5);
        let before = GroupCopy::of(&g, 10);
        let mut h = g.clone();
        h.members.get_mut("m").unwrap().last_heartbeat_ms = 99_999;
        h.reconciling_since_ms = Some(1);
        assert!(GroupCopy::of(&h, 11).same_as(&before), "revision aside");
        h.group_epoch = 8;
        assert!(!GroupCopy::of(&h, 12).same_as(&before));
        let mut p = g.clone();
        p.config.paused_since_ms = Some(3);
        assert!(!GroupCopy::of(&p, 11).same_as(&before));
    }

    /// The restored group has no members, its settings and creation time, and epochs above
    /// any the copy recorded: a member of the lost incarnation is unknown and rejoins at a
    /// higher epoch.
    #[test]
    fn a_restored_group_starts_above_every_recorded_epoch() {
        let mut g = group_with_member(9);
        g.config.fencing = rsc_protocol::FencingMode::Strict;
        let c = GroupCopy::of(&g, 42);
        let mut s = stream();
        s.layout_version = 3;
        let r = c.restore(&s);
        assert!(r.members.is_empty());
        assert_eq!(r.config, g.config);
        assert_eq!(r.created_ms, 5_000, "owner tokens keep their incarnation");
        assert_eq!(r.group_epoch, 9 + EPOCH_GAP);
        assert_eq!(r.assignment_epoch, 9 + EPOCH_GAP);
        assert_eq!(r.layout_version, 3);
        assert_eq!(r.stream, "s");
    }
}
