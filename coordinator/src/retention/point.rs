//! The safe trim point of one shard (PROTOCOL §18): pure, no I/O, no clock.
//!
//! `XTRIM <key> MINID ~ <id>` removes entries whose id is below `<id>`, so the point is the
//! oldest entry some group still needs: for each group its oldest pending entry, or else the
//! first entry after its last delivered one. A group with no Redis consumer group on the shard
//! yet needs everything; a held group (paused, or with a member that is down) holds the whole
//! shard; a draining shard is not trimmed until it retires, a retired one never (its key is
//! deleted with the reshard's rollback window); while a reshard runs, the point never passes
//! the shard's seal (PROTOCOL §15). `keep_acked_ms` keeps what every group acknowledged that
//! long; the hard caps (`max_age_ms`, `max_entries_per_shard`) trim past all of that.

use rsc_protocol::RetentionPolicy;
use std::fmt;

/// A Redis stream entry id `<ms>-<seq>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EntryId {
    /// Milliseconds part (the producer's clock, for ids Redis assigned).
    pub ms: u64,
    /// Sequence within the millisecond.
    pub seq: u64,
}

impl EntryId {
    /// `0-0`: before every entry.
    pub const ZERO: EntryId = EntryId { ms: 0, seq: 0 };

    /// The first id of millisecond `ms`.
    pub fn at_ms(ms: u64) -> Self {
        EntryId { ms, seq: 0 }
    }

    /// Parses `<ms>-<seq>` (or `<ms>`, sequence 0).
    pub fn parse(text: &str) -> Option<Self> {
        let (ms, seq) = text.split_once('-').unwrap_or((text, "0"));
        Some(EntryId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The smallest id after this one.
    pub fn next(self) -> Self {
        match self.seq.checked_add(1) {
            Some(seq) => EntryId { ms: self.ms, seq },
            None => EntryId {
                ms: self.ms.saturating_add(1),
                seq: 0,
            },
        }
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Where one group stands on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// No Redis consumer group for the group on the shard yet: it will read everything.
    NoConsumerGroup,
    /// Its Redis consumer group (`XINFO GROUPS`, `XPENDING` summary).
    Reading {
        /// `last-delivered-id`.
        last_delivered: EntryId,
        /// Entries delivered and not acknowledged.
        pending: u64,
        /// The smallest pending id (`XPENDING` summary), when known.
        oldest_pending: Option<EntryId>,
    },
}

impl Position {
    /// The oldest entry the group still needs (`ZERO`: everything).
    pub fn needs_from(&self) -> EntryId {
        match *self {
            Position::NoConsumerGroup => EntryId::ZERO,
            Position::Reading {
                pending: 0,
                last_delivered,
                ..
            } => last_delivered.next(),
            Position::Reading {
                oldest_pending: Some(p),
                last_delivered,
                ..
            } => p.min(last_delivered.next()),
            // Pending entries of unknown ids: hold everything up to them.
            Position::Reading { .. } => EntryId::ZERO,
        }
    }
}

/// One group of the stream, on the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInput {
    /// Group id.
    pub group: String,
    /// Its position on the shard.
    pub position: Position,
    /// Paused, or with a member that is down: holds the shard's soft trimming.
    pub held: bool,
}

/// How the stream's layout treats the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardKind {
    /// Producers route to it.
    Active,
    /// Being drained after a reshard: kept whole until it retires (hard caps still apply).
    Draining,
    /// Retired: never trimmed (its key is deleted after the rollback window).
    Retired,
}

/// Everything the trim point of one shard depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInput {
    /// Every group of the stream.
    pub groups: Vec<GroupInput>,
    /// The shard's place in the layout.
    pub kind: ShardKind,
    /// The shard's seal of the running reshard's switch, if a reshard runs.
    pub seal: Option<EntryId>,
    /// The stream's policy.
    pub policy: RetentionPolicy,
    /// Now (Unix ms).
    pub now_ms: u64,
}

/// What to trim from the shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrimDecision {
    /// `XTRIM <key> MINID ~ <minid>`: entries below it may go (`None`: nothing by id).
    pub minid: Option<EntryId>,
    /// `XTRIM <key> MAXLEN ~ <n>`: the entry cap.
    pub maxlen: Option<u64>,
    /// The point no group needs (before the hard caps).
    pub safe: EntryId,
    /// The group whose need is the oldest, when it (rather than `keep_acked_ms`) limits the
    /// safe point.
    pub blocked_by: Option<String>,
    /// Whether the time cutoff (`keep_acked_ms`, `max_age_ms`) bounds the point: it moves
    /// with the clock even when nothing is read.
    pub time_bound: bool,
    /// Groups whose needed entries a hard cap may trim.
    pub lossy: Vec<String>,
}

/// The safe point: the oldest need of any group, held to `ZERO` by held groups and a
/// draining shard, and never past a running reshard's seal.
fn safe_point(input: &ShardInput) -> (EntryId, Option<&GroupInput>) {
    let oldest = input
        .groups
        .iter()
        .map(|g| {
            (
                if g.held {
                    EntryId::ZERO
                } else {
                    g.position.needs_from()
                },
                g,
            )
        })
        .min_by_key(|(need, _)| *need);
    let mut point = oldest.map_or(
        EntryId {
            ms: u64::MAX,
            seq: u64::MAX,
        },
        |(n, _)| n,
    );
    if input.kind != ShardKind::Active {
        point = EntryId::ZERO;
    }
    if let Some(seal) = input.seal {
        point = point.min(seal.next());
    }
    (point, oldest.map(|(_, g)| g))
}

/// The trim decision for one shard (see the module docs).
pub fn trim_point(input: &ShardInput) -> TrimDecision {
    if input.kind == ShardKind::Retired {
        return TrimDecision::default();
    }
    let (safe, oldest) = safe_point(input);
    let p = &input.policy;
    let cutoff = EntryId::at_ms(input.now_ms.saturating_sub(p.keep_acked_ms));
    let soft = safe.min(cutoff);
    let blocked_by = oldest
        .filter(|g| safe < cutoff && (g.held || g.position.needs_from() == safe))
        .map(|g| g.group.clone());
    let age_cap = p
        .max_age_ms
        .map(|age| EntryId::at_ms(input.now_ms.saturating_sub(age)));
    let point = age_cap.map_or(soft, |cap| soft.max(cap));
    let lossy = if p.has_hard_cap() {
        input
            .groups
            .iter()
            .filter(|g| g.position.needs_from() < point)
            .map(|g| g.group.clone())
            .collect()
    } else {
        Vec::new()
    };
    TrimDecision {
        minid: (point > EntryId::ZERO).then_some(point),
        maxlen: p.max_entries_per_shard,
        safe,
        blocked_by,
        time_bound: cutoff < safe || age_cap.is_some_and(|c| c > soft),
        lossy,
    }
}

#[cfg(test)]
mod tests;
