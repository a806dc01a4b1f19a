//! The member epoch (PROTOCOL §5): a member's generation, with three special values a
//! heartbeat may send instead of the epoch it last received.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A member epoch as it travels in heartbeats and their answers (PROTOCOL §5, §5.1): a plain
/// JSON integer. `0` joins, `-1` leaves, `-2` steps away (a static member's restart, §11), and
/// a positive value is a generation the coordinator handed out: the group's assignment epoch
/// (a `u64`) when the member reached it.
///
/// ```
/// use rsc_protocol::MemberEpoch;
/// let e = MemberEpoch::of_assignment(7);
/// assert!(e.is(7) && !e.is(8));
/// assert!(MemberEpoch::JOIN.is_join() && !MemberEpoch::LEAVE.is(u64::MAX));
/// assert_eq!(serde_json::to_string(&MemberEpoch::LEAVE).unwrap(), "-1");
/// ```
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MemberEpoch(i64);

impl MemberEpoch {
    /// `0`: the member joins (or rejoins) the group (PROTOCOL §5.1).
    pub const JOIN: MemberEpoch = MemberEpoch(0);
    /// `-1`: the member leaves; its shards are free at once (PROTOCOL §5.1).
    pub const LEAVE: MemberEpoch = MemberEpoch(-1);
    /// `-2`: a static member leaves for a restart and keeps its shards (PROTOCOL §5.1, §11).
    pub const STEP_AWAY: MemberEpoch = MemberEpoch(-2);

    /// The epoch as sent on the wire.
    pub const fn new(epoch: i64) -> Self {
        MemberEpoch(epoch)
    }

    /// The member epoch that stands for the group's assignment epoch `epoch` (PROTOCOL §1);
    /// an assignment epoch beyond `i64::MAX` (never reached: one bump per change) saturates.
    pub fn of_assignment(epoch: u64) -> Self {
        MemberEpoch(i64::try_from(epoch).unwrap_or(i64::MAX))
    }

    /// The wire value.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// Whether this epoch equals the group's assignment epoch `epoch`; a negative value
    /// never does (no `as` cast: `-1` is not `u64::MAX`).
    pub fn is(self, epoch: u64) -> bool {
        i64::try_from(epoch) == Ok(self.0)
    }

    /// `0`: a join.
    pub const fn is_join(self) -> bool {
        self.0 == Self::JOIN.0
    }

    /// `-1` or `-2`: the member leaves (for good, or for a restart).
    pub const fn is_leave(self) -> bool {
        self.0 == Self::LEAVE.0 || self.0 == Self::STEP_AWAY.0
    }

    /// A generation the coordinator handed out (`> 0`), not a special value.
    pub const fn is_generation(self) -> bool {
        self.0 > 0
    }

    /// Below `-2`: no meaning, refused with `400 INVALID_REQUEST` (PROTOCOL §5).
    pub const fn is_invalid(self) -> bool {
        self.0 < Self::STEP_AWAY.0
    }
}

impl From<i64> for MemberEpoch {
    fn from(epoch: i64) -> Self {
        MemberEpoch(epoch)
    }
}

impl From<MemberEpoch> for i64 {
    fn from(epoch: MemberEpoch) -> i64 {
        epoch.0
    }
}

impl fmt::Display for MemberEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for MemberEpoch {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <i64 as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for MemberEpoch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_values_are_the_protocol_s() {
        assert_eq!(
            [
                MemberEpoch::JOIN,
                MemberEpoch::LEAVE,
                MemberEpoch::STEP_AWAY
            ]
            .map(MemberEpoch::get),
            [0, -1, -2]
        );
        assert!(MemberEpoch::JOIN.is_join() && !MemberEpoch::JOIN.is_leave());
        assert!(MemberEpoch::LEAVE.is_leave() && MemberEpoch::STEP_AWAY.is_leave());
        assert!(MemberEpoch::new(-3).is_invalid() && !MemberEpoch::STEP_AWAY.is_invalid());
        assert!(MemberEpoch::new(1).is_generation() && !MemberEpoch::JOIN.is_generation());
    }

    #[test]
    fn compares_with_assignment_epochs_without_wrapping() {
        assert!(MemberEpoch::new(5).is(5));
        assert!(!MemberEpoch::new(5).is(6));
        assert!(!MemberEpoch::LEAVE.is(u64::MAX), "-1 is not u64::MAX");
        assert!(!MemberEpoch::STEP_AWAY.is(u64::MAX - 1));
        assert_eq!(MemberEpoch::of_assignment(u64::MAX).get(), i64::MAX);
        assert!(MemberEpoch::of_assignment(42).is(42));
    }

    #[test]
    fn travels_as_a_plain_integer() {
        let e: MemberEpoch = serde_json::from_str("-2").unwrap();
        assert_eq!(e, MemberEpoch::STEP_AWAY);
        assert_eq!(serde_json::to_string(&MemberEpoch::new(9)).unwrap(), "9");
        assert!(serde_json::from_str::<MemberEpoch>("\"1\"").is_err());
    }
}
