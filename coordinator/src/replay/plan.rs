//! The pure part of a seek (PROTOCOL §18): what a target means on one shard, given what was
//! read there, and how the entries the seek moves over are counted. No I/O and no clock (the
//! caller passes the time).

use rsc_protocol::routing::parse_entry_id;
use rsc_protocol::{MAX_SEEK_SHIFT, SeekTarget, StartPosition};

/// A stream entry id as its two numbers.
pub(crate) type Id = (u64, u64);

/// The id before every entry.
pub(crate) const ZERO: Id = (0, 0);

/// `<ms>-<seq>`.
pub(crate) fn fmt_id(id: Id) -> String {
    format!("{}-{}", id.0, id.1)
}

/// The Unix ms of an id (`None` for `0-0`, which names no time).
pub(crate) fn id_ms(id: Id) -> Option<u64> {
    (id != ZERO).then_some(id.0)
}

/// A seek target, checked and with the time resolved (see [`Target::from_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Before the first entry kept.
    Earliest,
    /// After the last entry written.
    Latest,
    /// After this id (a time `T` is `(T−1)-max`: entries at or after `T-0` come next),
    /// moved back to the shard's last entry id when that is earlier.
    After(Id),
    /// Exactly this id, which must not be past the shard's last entry id.
    Exactly(Id),
    /// This many entries back (negative) or forward from the group's position.
    Shift(i64),
}

impl Target {
    /// The target of a request at `now_ms` (coordinator time); why it is refused otherwise.
    pub(crate) fn from_request(to: &SeekTarget, now_ms: u64) -> Result<Target, String> {
        let at_time = |t: u64| {
            if t == 0 {
                Target::Earliest
            } else {
                Target::After((t - 1, u64::MAX))
            }
        };
        match to {
            SeekTarget::Position(StartPosition::Earliest) => Ok(Target::Earliest),
            SeekTarget::Position(StartPosition::Latest) => Ok(Target::Latest),
            SeekTarget::Time(t) if t.time_ms > now_ms => Err(format!(
                "time_ms {} is in the future (now is {now_ms}): seek to latest instead",
                t.time_ms
            )),
            SeekTarget::Time(t) => Ok(at_time(t.time_ms)),
            SeekTarget::Duration(d) => Ok(at_time(now_ms.saturating_sub(d.by_duration_ms))),
            SeekTarget::Shift(s) if s.shift_by == 0 || s.shift_by.abs() > MAX_SEEK_SHIFT => {
                Err(format!(
                    "shift_by {} is out of range: give 1..={MAX_SEEK_SHIFT} entries, \
                     negative to go back",
                    s.shift_by
                ))
            }
            SeekTarget::Shift(s) => Ok(Target::Shift(s.shift_by)),
            SeekTarget::Id(i) => parse_entry_id(&i.id)
                .map(Target::Exactly)
                .ok_or_else(|| format!("id {:?} is not a stream entry id (<ms>-<seq>)", i.id)),
        }
    }
}

/// What one read of a shard key told (`position.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShardRead {
    /// The key exists.
    pub(crate) exists: bool,
    /// Entries in it.
    pub(crate) length: u64,
    /// Entries ever added (`entries-added`).
    pub(crate) entries_added: u64,
    /// The last id generated (`$`).
    pub(crate) last_generated: Id,
    /// The first and last entries' ids (none when empty).
    pub(crate) first: Option<Id>,
    /// See `first`.
    pub(crate) last: Option<Id>,
    /// The group's Redis consumer group there, when it exists.
    pub(crate) group: Option<GroupRead>,
}

/// The group's Redis consumer group on a shard key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GroupRead {
    /// `last-delivered-id`.
    pub(crate) last_delivered: Id,
    /// `entries-read`, when Redis knows it.
    pub(crate) entries_read: Option<u64>,
    /// `lag`, when Redis can tell.
    pub(crate) lag: Option<u64>,
    /// Entries delivered and not acknowledged.
    pub(crate) pending: u64,
}

/// Where a target puts the group on one shard, before any entry is walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// At this id.
    At(Id),
    /// `by` entries from `from` (the group's position, or where a new consumer group of the
    /// group would start): back when negative, forward when positive.
    Shift {
        /// Where the group is.
        from: Id,
        /// Entries to move by.
        by: i64,
    },
}

/// Where `target` puts the group on a shard read as `read` (`start`: where the group's
/// consumer groups start, for a shift on a shard that has none yet); why not, for an id past
/// the shard's last one.
pub(crate) fn resolve(
    target: Target,
    read: &ShardRead,
    start: StartPosition,
    key: &str,
) -> Result<Resolved, String> {
    Ok(match target {
        Target::Earliest => Resolved::At(ZERO),
        Target::Latest => Resolved::At(read.last_generated),
        Target::After(id) => Resolved::At(id.min(read.last_generated)),
        Target::Exactly(id) if id > read.last_generated => {
            return Err(format!(
                "id {} is past the last entry id of {key} ({}): seek to latest instead",
                fmt_id(id),
                fmt_id(read.last_generated)
            ));
        }
        Target::Exactly(id) => Resolved::At(id),
        Target::Shift(by) => Resolved::Shift {
            from: match (&read.group, start) {
                (Some(g), _) => g.last_delivered,
                (None, StartPosition::Earliest) => ZERO,
                (None, StartPosition::Latest) => read.last_generated,
            },
            by,
        },
    })
}

/// How the entries after a position are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// Known from the stream's counters: `after` entries follow the position, whose read
    /// counter (`ENTRIESREAD`) is `read`.
    Known {
        /// Entries after the position.
        after: u64,
        /// The read counter of the position.
        read: u64,
    },
    /// Walk forward from the position to the end: the entries walked follow it.
    Forward,
    /// Walk back from the position (included) to the start: the entries walked are at or
    /// before it.
    Backward,
}

/// How to count the entries after `at` on a shard read as `read`: from the counters when the
/// position is before the first entry or at or past the last, else by walking the shorter
/// side (judged by the ids' times).
pub(crate) fn count_after(read: &ShardRead, at: Id) -> Count {
    let (Some(first), Some(last)) = (read.first, read.last) else {
        // Empty (or missing): nothing follows any position.
        return Count::Known {
            after: 0,
            read: read.entries_added,
        };
    };
    if at < first {
        return Count::Known {
            after: read.length,
            read: read.entries_added.saturating_sub(read.length),
        };
    }
    if at >= last {
        return Count::Known {
            after: 0,
            read: read.entries_added,
        };
    }
    if at.0.saturating_sub(first.0) <= last.0.saturating_sub(at.0) {
        Count::Backward
    } else {
        Count::Forward
    }
}

/// What a walk answered (`walk.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Walked {
    /// Entries walked.
    pub(crate) walked: u64,
    /// The last id walked.
    pub(crate) last: Option<Id>,
    /// `entries-added` when the walk ended.
    pub(crate) entries_added: u64,
    /// The stream's length when the walk ended.
    pub(crate) length: u64,
}

/// `(after, read counter)` from a walk of [`Count::Forward`] (`walked` entries after the
/// position, in all) or [`Count::Backward`] (`walked` at or before it); `end` is the last
/// page's answer.
pub(crate) fn counted(count: Count, walked: u64, end: &Walked) -> (u64, u64) {
    match count {
        Count::Known { after, read } => (after, read),
        Count::Forward => (walked, end.entries_added.saturating_sub(walked)),
        Count::Backward => {
            let after = end.length.saturating_sub(walked);
            (after, end.entries_added.saturating_sub(after))
        }
    }
}

/// Where a shift lands: back by `|by|` (the walk took up to `|by| + 1` entries at or before
/// the position; fewer means the shift passes the first entry) or forward by `by` (the walk
/// took up to `by` entries after it).
pub(crate) fn shifted(from: Id, by: i64, walk: &Walked) -> Id {
    if by < 0 {
        if walk.walked > by.unsigned_abs() {
            walk.last.unwrap_or(ZERO)
        } else {
            ZERO
        }
    } else {
        walk.last.unwrap_or(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rsc_protocol::{SeekDuration, SeekId, SeekShift, SeekTime};

    /// A stream of entries `1-0 ..= n-0` with the first `trimmed` trimmed away.
    fn stream(n: u64, trimmed: u64) -> ShardRead {
        let length = n - trimmed;
        ShardRead {
            exists: true,
            length,
            entries_added: n,
            last_generated: (n, 0),
            first: (length > 0).then_some((trimmed + 1, 0)),
            last: (length > 0).then_some((n, 0)),
            group: None,
        }
    }

    #[test]
    fn requests_become_targets_or_refusals() {
        let now = 10_000;
        let t = |to| Target::from_request(&to, now);
        assert_eq!(
            t(SeekTarget::Position(StartPosition::Earliest)),
            Ok(Target::Earliest)
        );
        assert_eq!(
            t(SeekTarget::Time(SeekTime { time_ms: 5_000 })),
            Ok(Target::After((4_999, u64::MAX)))
        );
        assert_eq!(
            t(SeekTarget::Time(SeekTime { time_ms: 0 })),
            Ok(Target::Earliest)
        );
        assert!(t(SeekTarget::Time(SeekTime { time_ms: 10_001 })).is_err());
        assert_eq!(
            t(SeekTarget::Duration(SeekDuration {
                by_duration_ms: 600
            })),
            Ok(Target::After((9_399, u64::MAX)))
        );
        assert_eq!(
            t(SeekTarget::Duration(SeekDuration {
                by_duration_ms: 60_000
            })),
            Ok(Target::Earliest)
        );
        assert_eq!(
            t(SeekTarget::Shift(SeekShift { shift_by: -3 })),
            Ok(Target::Shift(-3))
        );
        for bad in [0, MAX_SEEK_SHIFT + 1, -MAX_SEEK_SHIFT - 1] {
            assert!(t(SeekTarget::Shift(SeekShift { shift_by: bad })).is_err());
        }
        assert_eq!(
            t(SeekTarget::Id(SeekId { id: "7-2".into() })),
            Ok(Target::Exactly((7, 2)))
        );
        assert_eq!(
            t(SeekTarget::Id(SeekId { id: "7".into() })),
            Ok(Target::Exactly((7, 0))),
            "as Redis reads an id without its sequence"
        );
        for bad in ["x-1", "7-", "-", ""] {
            assert!(
                t(SeekTarget::Id(SeekId { id: bad.into() })).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn targets_resolve_on_a_shard() {
        let mut s = stream(10, 2);
        let r = |t, s: &ShardRead| resolve(t, s, StartPosition::Earliest, "k");
        assert_eq!(r(Target::Earliest, &s), Ok(Resolved::At(ZERO)));
        assert_eq!(r(Target::Latest, &s), Ok(Resolved::At((10, 0))));
        assert_eq!(
            r(Target::After((99, u64::MAX)), &s),
            Ok(Resolved::At((10, 0))),
            "a time after the last entry is the latest"
        );
        assert_eq!(r(Target::Exactly((4, 0)), &s), Ok(Resolved::At((4, 0))));
        assert!(r(Target::Exactly((11, 0)), &s).is_err());
        assert_eq!(
            r(Target::Shift(-2), &s),
            Ok(Resolved::Shift { from: ZERO, by: -2 }),
            "no consumer group: from where it would start"
        );
        assert_eq!(
            resolve(Target::Shift(-2), &s, StartPosition::Latest, "k"),
            Ok(Resolved::Shift {
                from: (10, 0),
                by: -2
            })
        );
        s.group = Some(GroupRead {
            last_delivered: (6, 0),
            ..GroupRead::default()
        });
        assert_eq!(
            r(Target::Shift(3), &s),
            Ok(Resolved::Shift {
                from: (6, 0),
                by: 3
            })
        );
    }

    /// The walks of [`count_after`] and [`shifted`] simulated on entries `first..=n`.
    fn walk_fwd(s: &ShardRead, after: Id, max: u64) -> Walked {
        let ids: Vec<Id> = entries(s)
            .filter(|id| *id > after)
            .take(max as usize)
            .collect();
        Walked {
            walked: ids.len() as u64,
            last: ids.last().copied(),
            entries_added: s.entries_added,
            length: s.length,
        }
    }

    fn walk_rev(s: &ShardRead, at_or_before: Id, max: u64) -> Walked {
        let mut ids: Vec<Id> = entries(s).filter(|id| *id <= at_or_before).collect();
        ids.reverse();
        ids.truncate(max as usize);
        Walked {
            walked: ids.len() as u64,
            last: ids.last().copied(),
            entries_added: s.entries_added,
            length: s.length,
        }
    }

    fn entries(s: &ShardRead) -> impl Iterator<Item = Id> {
        let first = s.first.map_or(1, |f| f.0);
        let last = s.last.map_or(0, |l| l.0);
        (first..=last).map(|ms| (ms, 0))
    }

    fn count(s: &ShardRead, at: Id) -> (u64, u64) {
        let c = count_after(s, at);
        let end = match c {
            Count::Known { .. } => Walked::default(),
            Count::Forward => walk_fwd(s, at, u64::MAX),
            Count::Backward => walk_rev(s, at, u64::MAX),
        };
        counted(c, end.walked, &end)
    }

    proptest! {
        /// Whatever the stream (trimmed or not) and the position (before, inside, between
        /// entries, after), the count is the number of entries after the position, and the
        /// read counter is that of the position (Redis' `entries-read` had the group read up
        /// to it): `entries_added − after`.
        #[test]
        fn counts_are_exact(n in 0u64..200, trimmed in 0u64..200, ms in 0u64..250, seq in 0u64..3) {
            let trimmed = trimmed.min(n);
            let s = stream(n, trimmed);
            let at = (ms, seq);
            let after = entries(&s).filter(|id| *id > at).count() as u64;
            let (counted_after, read) = count(&s, at);
            prop_assert_eq!(counted_after, after);
            prop_assert_eq!(read, n - after);
        }

        /// A shift back by `k` puts exactly `k` more entries after the position (fewer when
        /// it reaches the first entry), a shift forward `k` fewer (fewer when it reaches the
        /// last).
        #[test]
        fn shifts_move_by_that_many_entries(n in 1u64..100, trimmed in 0u64..50, pos in 0u64..120, by in -150i64..150) {
            prop_assume!(by != 0);
            let trimmed = trimmed.min(n - 1);
            let s = stream(n, trimmed);
            let from = (pos.min(n), 0);
            let walk = if by < 0 {
                walk_rev(&s, from, by.unsigned_abs() + 1)
            } else {
                walk_fwd(&s, from, by as u64)
            };
            let to = shifted(from, by, &walk);
            let (before, _) = count(&s, from);
            let (after, _) = count(&s, to);
            if by < 0 {
                prop_assert_eq!(after, (before + by.unsigned_abs()).min(s.length));
            } else {
                prop_assert_eq!(after, before.saturating_sub(by as u64));
            }
        }
    }
}
