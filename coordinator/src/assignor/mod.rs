//! Shard assignors: who should own which shard (the target assignment, PROTOCOL §5.5).
//!
//! An assignor is a pure function of the member list, the assignable shards and the previous
//! target. [`StickyAssignor`] is the default; others can be added behind the [`Assignor`]
//! trait and selected per group by name.

mod sticky;

pub use sticky::StickyAssignor;

use std::collections::BTreeSet;

/// One member as the assignor sees it.
#[derive(Debug, Clone, Copy)]
pub struct AssignorMember<'a> {
    /// The member id.
    pub id: &'a str,
    /// Its previous target (may name shards that no longer exist).
    pub previous: &'a BTreeSet<u32>,
}

/// Computes a target assignment.
pub trait Assignor: Send + Sync + std::fmt::Debug {
    /// The name groups select it by.
    fn name(&self) -> &'static str;

    /// Assigns every shard of `shards` (sorted, distinct) to exactly one of `members`
    /// (sorted by id, distinct). Returns one sorted shard list per member, in `members` order.
    /// With no members, returns an empty list.
    fn assign(&self, members: &[AssignorMember<'_>], shards: &[u32]) -> Vec<Vec<u32>>;
}

/// The assignor a group names, if this coordinator knows it.
pub fn by_name(name: &str) -> Option<&'static dyn Assignor> {
    static STICKY: StickyAssignor = StickyAssignor;
    match name {
        "sticky" => Some(&STICKY),
        _ => None,
    }
}

/// The names of every known assignor.
pub const KNOWN: &[&str] = &["sticky"];

/// The default assignor's name.
pub const DEFAULT: &str = "sticky";
