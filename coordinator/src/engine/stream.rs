//! Stream operations: layout, resharding, draining, rollback (PROTOCOL §6).

use super::{EngineError, MAX_SHARDS};
use rsc_protocol::{RetentionPolicy, ShardState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One reshard (or rollback) of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReshardRecord {
    /// Shard count before.
    pub from: u32,
    /// Shard count after.
    pub to: u32,
    /// Whether it undoes the reshard before it.
    pub rollback: bool,
    /// When it started.
    pub started_ms: u64,
    /// When its last draining shard retired (at once for a scale-up).
    pub completed_ms: Option<u64>,
    /// The routing epoch it switched to (0 in documents written before ordered resharding, PROTOCOL §15).
    #[serde(default)]
    pub epoch: u64,
    /// Ordered resharding (PROTOCOL §15): per shard of the layout before the switch (and every
    /// shard sealed with them), the last entry id written under the previous epoch. Empty
    /// when the coordinator has no data Redis.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seals: BTreeMap<u32, String>,
}

/// The stream document: layout, routing epoch and reshard state (PROTOCOL §2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamDoc {
    /// Stream name.
    pub stream: String,
    /// Shards `0..shard_count` are active: producers route over them.
    pub shard_count: u32,
    /// Bumped on every change of `shard_count`.
    pub routing_epoch: u64,
    /// Bumped on every change of the assignable shard set (reshard, retirement).
    pub layout_version: u64,
    /// Groups reading the stream.
    pub groups: BTreeSet<String>,
    /// Shards `>= shard_count` still being drained, with the groups that drained each.
    pub draining: BTreeMap<u32, BTreeSet<String>>,
    /// The latest reshard, running or complete.
    pub last_reshard: Option<ReshardRecord>,
    /// Retired shards whose keys may still exist in the data Redis (deleted after the
    /// rollback window by the coordinator when it knows the data Redis).
    #[serde(default)]
    pub retired: BTreeSet<u32>,
    /// When the stream was first created.
    pub created_ms: u64,
    /// Retention of the shard keys (PROTOCOL §18); documents written before it read the
    /// default.
    #[serde(default)]
    pub retention: RetentionPolicy,
    /// Retention of the dead-letter stream `<stream>:dlq`.
    #[serde(default = "RetentionPolicy::dlq_default")]
    pub dlq_retention: RetentionPolicy,
}

/// Checks a shard count against `1..=4096`.
pub fn validate_shard_count(n: u32) -> Result<(), EngineError> {
    if (1..=MAX_SHARDS).contains(&n) {
        Ok(())
    } else {
        Err(EngineError::Invalid(format!(
            "shard_count is {n}; it must be within 1..={MAX_SHARDS}"
        )))
    }
}

impl StreamDoc {
    /// A new stream of `shard_count` shards.
    pub fn new(stream: &str, shard_count: u32, now_ms: u64) -> Result<Self, EngineError> {
        validate_shard_count(shard_count)?;
        Ok(StreamDoc {
            stream: stream.to_owned(),
            shard_count,
            routing_epoch: 1,
            layout_version: 1,
            groups: BTreeSet::new(),
            draining: BTreeMap::new(),
            last_reshard: None,
            retired: BTreeSet::new(),
            created_ms: now_ms,
            retention: RetentionPolicy::default(),
            dlq_retention: RetentionPolicy::dlq_default(),
        })
    }

    /// The shards groups are assigned: the active ones and those still draining, sorted.
    pub fn assignable_shards(&self) -> Vec<u32> {
        (0..self.shard_count)
            .chain(self.draining.keys().copied())
            .collect()
    }

    /// The state of shard `s`, or `None` when it is retired or never existed.
    pub fn shard_state(&self, s: u32) -> Option<ShardState> {
        if s < self.shard_count {
            Some(ShardState::Active)
        } else if self.draining.contains_key(&s) {
            Some(ShardState::Draining)
        } else {
            None
        }
    }

    /// The running reshard, if one runs.
    pub fn running_reshard(&self) -> Option<&ReshardRecord> {
        self.last_reshard
            .as_ref()
            .filter(|r| r.completed_ms.is_none())
    }

    /// Until when a rollback of the latest reshard is accepted, once it completed (while it
    /// runs a rollback is accepted, with no end yet).
    pub fn rollback_until_ms(&self, window_ms: u64) -> Option<u64> {
        match &self.last_reshard {
            Some(r) if !r.rollback => r.completed_ms.map(|done| done.saturating_add(window_ms)),
            _ => None,
        }
    }

    /// Whether a rollback would be accepted at `now_ms`: a reshard (not a rollback) runs, or
    /// completed within the window.
    pub fn rollback_allowed(&self, window_ms: u64, now_ms: u64) -> bool {
        match &self.last_reshard {
            Some(r) if !r.rollback => r
                .completed_ms
                .is_none_or(|done| now_ms <= done.saturating_add(window_ms)),
            _ => false,
        }
    }

    /// Starts a reshard to `to` shards.
    pub fn reshard(&mut self, to: u32, now_ms: u64) -> Result<(), EngineError> {
        validate_shard_count(to)?;
        if self.running_reshard().is_some() {
            return Err(EngineError::ReshardInProgress(self.stream.clone()));
        }
        if to == self.shard_count {
            return Err(EngineError::Invalid(format!(
                "stream {} already has {to} shards",
                self.stream
            )));
        }
        self.start(to, false, now_ms);
        Ok(())
    }

    /// Reshards back to the count before the latest reshard (PROTOCOL §6).
    pub fn rollback(&mut self, now_ms: u64, window_ms: u64) -> Result<(), EngineError> {
        let Some(last) = &self.last_reshard else {
            return Err(EngineError::NothingToRollback(format!(
                "stream {} has never been resharded",
                self.stream
            )));
        };
        if last.rollback {
            return Err(if last.completed_ms.is_none() {
                EngineError::ReshardInProgress(self.stream.clone())
            } else {
                EngineError::NothingToRollback(format!(
                    "the latest reshard of stream {} is a rollback, which cannot be rolled back",
                    self.stream
                ))
            });
        }
        if let Some(done) = last.completed_ms {
            let until_ms = done.saturating_add(window_ms);
            if now_ms > until_ms {
                return Err(EngineError::RollbackWindowExpired {
                    stream: self.stream.clone(),
                    until_ms,
                });
            }
        }
        let to = last.from;
        self.start(to, true, now_ms);
        Ok(())
    }

    /// The shards to seal at the switch this document just made from `before`: every shard
    /// of the old and the new layout and every draining one (a retired shard revived by the
    /// switch included), sorted.
    pub fn shards_to_seal(&self, before: &StreamDoc) -> Vec<u32> {
        let top = self.shard_count.max(before.shard_count);
        let mut out: BTreeSet<u32> = (0..top).collect();
        out.extend(before.draining.keys().copied());
        out.extend(self.draining.keys().copied());
        out.into_iter().collect()
    }

    /// Records that `group` drained `shards`; retires shards every group drained.
    /// Returns whether the layout changed.
    pub fn mark_drained(&mut self, group: &str, shards: &[u32], now_ms: u64) -> bool {
        for s in shards {
            if let Some(groups) = self.draining.get_mut(s) {
                groups.insert(group.to_owned());
            }
        }
        self.retire_drained(now_ms)
    }

    /// Retired shards whose keys may be deleted now: the latest reshard completed at least
    /// `delay_ms` ago (so no rollback can bring them back) and each is neither active nor
    /// draining. Empty while a reshard runs.
    pub fn deletable_retired(&self, now_ms: u64, delay_ms: u64) -> Vec<u32> {
        let Some(done) = self.last_reshard.as_ref().and_then(|r| r.completed_ms) else {
            return Vec::new();
        };
        if now_ms < done.saturating_add(delay_ms) {
            return Vec::new();
        }
        self.retired
            .iter()
            .copied()
            .filter(|&s| self.shard_state(s).is_none())
            .collect()
    }

    /// Forgets retired shards whose keys were deleted. Returns whether anything changed.
    pub fn forget_retired(&mut self, shards: &[u32]) -> bool {
        let before = self.retired.len();
        for s in shards {
            self.retired.remove(s);
        }
        self.retired.len() != before
    }

    /// Adds a group reading the stream.
    pub fn add_group(&mut self, group: &str) {
        self.groups.insert(group.to_owned());
    }

    /// Removes a group; shards only it was still draining retire. Returns whether the layout
    /// changed.
    pub fn remove_group(&mut self, group: &str, now_ms: u64) -> bool {
        self.groups.remove(group);
        for drained in self.draining.values_mut() {
            drained.remove(group);
        }
        self.retire_drained(now_ms)
    }

    fn start(&mut self, to: u32, rollback: bool, now_ms: u64) {
        let from = self.shard_count;
        // Draining or retired shards inside the new layout become active again (their keys
        // must then never be deleted); shards leaving it drain.
        self.draining.retain(|&s, _| s >= to);
        self.retired.retain(|&s| s >= to);
        for s in to..from {
            self.draining.entry(s).or_default();
        }
        self.shard_count = to;
        self.routing_epoch += 1;
        self.layout_version += 1;
        self.last_reshard = Some(ReshardRecord {
            from,
            to,
            rollback,
            started_ms: now_ms,
            completed_ms: None,
            epoch: self.routing_epoch,
            seals: BTreeMap::new(),
        });
        self.retire_drained(now_ms);
        if self.draining.is_empty()
            && let Some(r) = self.last_reshard.as_mut()
        {
            r.completed_ms.get_or_insert(now_ms);
        }
    }

    fn retire_drained(&mut self, now_ms: u64) -> bool {
        let before = self.draining.len();
        let groups = &self.groups;
        let retired = &mut self.retired;
        self.draining.retain(|&s, drained| {
            let done = groups.is_subset(drained);
            if done {
                retired.insert(s);
            }
            !done
        });
        if self.draining.len() == before {
            return false;
        }
        self.layout_version += 1;
        if self.draining.is_empty()
            && let Some(r) = self.last_reshard.as_mut()
        {
            r.completed_ms.get_or_insert(now_ms);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_with_groups(n: u32, groups: &[&str]) -> StreamDoc {
        let mut s = StreamDoc::new("orders", n, 0).unwrap();
        for g in groups {
            s.add_group(g);
        }
        s
    }

    #[test]
    fn scale_up_completes_at_once() {
        let mut s = stream_with_groups(4, &["g"]);
        s.reshard(8, 10).unwrap();
        assert_eq!((s.shard_count, s.routing_epoch), (8, 2));
        assert_eq!(s.assignable_shards(), (0..8).collect::<Vec<_>>());
        assert_eq!(s.last_reshard.as_ref().unwrap().completed_ms, Some(10));
        assert!(s.running_reshard().is_none());
        assert_eq!(s.last_reshard.as_ref().unwrap().epoch, 2);
    }

    #[test]
    fn seals_cover_old_new_and_draining_shards() {
        let mut s = stream_with_groups(8, &["g"]);
        s.reshard(3, 0).unwrap();
        let before = s.clone();
        s.rollback(1, 1000).unwrap();
        assert_eq!(s.shards_to_seal(&before), (0..8).collect::<Vec<_>>());
        let mut s = stream_with_groups(8, &["g"]);
        s.reshard(2, 0).unwrap();
        s.mark_drained("g", &[2, 3, 4, 5, 6], 1);
        let before = s.clone();
        s.reshard(4, 2).ok();
        // Shard 7 still drains: a second reshard waits; a rollback seals it too.
        assert!(s.running_reshard().is_some());
        let mut r = before.clone();
        r.rollback(3, 1000).unwrap();
        assert_eq!(r.shards_to_seal(&before), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn scale_down_drains_until_every_group_reports() {
        let mut s = stream_with_groups(8, &["a", "b"]);
        s.reshard(4, 10).unwrap();
        assert_eq!(s.shard_count, 4);
        assert_eq!(s.assignable_shards(), (0..8).collect::<Vec<_>>());
        assert_eq!(s.shard_state(6), Some(ShardState::Draining));
        assert_eq!(
            s.reshard(2, 11),
            Err(EngineError::ReshardInProgress("orders".into()))
        );
        assert!(!s.mark_drained("a", &[4, 5, 6, 7], 12));
        assert!(s.mark_drained("b", &[4, 5], 13));
        assert_eq!(s.assignable_shards(), vec![0, 1, 2, 3, 6, 7]);
        assert!(s.running_reshard().is_some());
        assert!(s.mark_drained("b", &[6, 7], 14));
        assert_eq!(s.shard_state(6), None);
        assert_eq!(s.last_reshard.as_ref().unwrap().completed_ms, Some(14));
    }

    #[test]
    fn removing_the_last_draining_group_retires() {
        let mut s = stream_with_groups(4, &["a"]);
        s.reshard(2, 0).unwrap();
        assert!(s.remove_group("a", 5));
        assert!(s.draining.is_empty());
    }

    #[test]
    fn rollback_of_a_running_scale_down_restores_the_layout() {
        let mut s = stream_with_groups(8, &["a"]);
        s.reshard(4, 0).unwrap();
        s.mark_drained("a", &[7], 1);
        s.rollback(2, 1000).unwrap();
        assert_eq!(s.shard_count, 8);
        assert!(s.draining.is_empty());
        let r = s.last_reshard.clone().unwrap();
        assert_eq!(
            (r.from, r.to, r.rollback, r.completed_ms),
            (4, 8, true, Some(2))
        );
        assert!(matches!(
            s.rollback(3, 1000),
            Err(EngineError::NothingToRollback(_))
        ));
    }

    #[test]
    fn rollback_of_a_scale_up_drains_and_blocks_reshards() {
        let mut s = stream_with_groups(4, &["a"]);
        s.reshard(8, 0).unwrap();
        s.rollback(500, 1000).unwrap();
        assert_eq!(s.shard_count, 4);
        assert_eq!(s.draining.len(), 4);
        assert_eq!(
            s.reshard(6, 501),
            Err(EngineError::ReshardInProgress("orders".into()))
        );
        assert_eq!(
            s.rollback(501, 1000),
            Err(EngineError::ReshardInProgress("orders".into()))
        );
    }

    #[test]
    fn rollback_window() {
        let mut s = stream_with_groups(4, &["a"]);
        assert!(matches!(
            s.rollback(0, 10),
            Err(EngineError::NothingToRollback(_))
        ));
        assert!(!s.rollback_allowed(10, 0));
        s.reshard(5, 100).unwrap();
        assert_eq!(s.rollback_until_ms(10), Some(110));
        assert!(s.rollback_allowed(10, 110) && !s.rollback_allowed(10, 111));
        assert!(matches!(
            s.rollback(111, 10),
            Err(EngineError::RollbackWindowExpired { until_ms: 110, .. })
        ));
        s.rollback(110, 10).unwrap();
        // A running scale-down: allowed, with no end yet (no sentinel number on the wire).
        let mut s = stream_with_groups(4, &["a"]);
        s.reshard(2, 100).unwrap();
        assert!(s.running_reshard().is_some());
        assert_eq!(s.rollback_until_ms(10), None);
        assert!(s.rollback_allowed(10, u64::MAX));
    }

    #[test]
    fn retired_keys_become_deletable_after_the_delay_unless_active_again() {
        let mut s = stream_with_groups(16, &["g"]);
        s.reshard(4, 0).unwrap();
        assert!(s.deletable_retired(10_000, 100).is_empty(), "running");
        s.mark_drained("g", &(4..16).collect::<Vec<_>>(), 50);
        assert_eq!(s.retired, (4..16).collect());
        assert!(s.deletable_retired(149, 100).is_empty(), "within the delay");
        assert_eq!(s.deletable_retired(150, 100), (4..16).collect::<Vec<_>>());
        // A rollback makes them active again: never deletable.
        s.rollback(120, 1000).unwrap();
        assert!(s.retired.is_empty());
        assert!(s.deletable_retired(u64::MAX, 0).is_empty());
        // Scale down again, then up over part of the retired range.
        let mut s = stream_with_groups(8, &["g"]);
        s.reshard(2, 0).unwrap();
        s.mark_drained("g", &(2..8).collect::<Vec<_>>(), 1);
        s.reshard(4, 2).unwrap();
        assert_eq!(s.retired, (4..8).collect());
        assert_eq!(s.deletable_retired(3, 1), (4..8).collect::<Vec<_>>());
        assert!(s.forget_retired(&[4, 5]));
        assert!(!s.forget_retired(&[4]));
        assert_eq!(s.deletable_retired(3, 1), vec![6, 7]);
    }

    #[test]
    fn older_documents_without_retired_still_load() {
        let mut v = serde_json::to_value(stream_with_groups(4, &["g"])).unwrap();
        v.as_object_mut().unwrap().remove("retired");
        let s: StreamDoc = serde_json::from_value(v).unwrap();
        assert!(s.retired.is_empty());
    }

    #[test]
    fn bad_counts() {
        assert!(StreamDoc::new("s", 0, 0).is_err());
        assert!(StreamDoc::new("s", 4097, 0).is_err());
        let mut s = stream_with_groups(4, &[]);
        assert!(matches!(s.reshard(4, 0), Err(EngineError::Invalid(_))));
        assert!(matches!(s.reshard(0, 0), Err(EngineError::Invalid(_))));
    }
}
