//! Owner tokens of strict fencing (PROTOCOL §5.6).
//!
//! With `fencing: strict` the coordinator writes, for each shard it grants, an owner token to
//! [`crate::routing::owner_key`] in the data Redis, and hands the same token to the member in
//! its heartbeat answer (`owner_tokens`). The member's read and acknowledgement scripts
//! compare the two strings for equality only; the coordinator's [`ASSERT_OWNER_LUA`] script
//! parses the leading `<created_ms>:<grant_epoch>` pair to never replace a later grant's
//! token. [`OwnerToken`] is the one definition of that text.
//!
//! ```
//! use rsc_protocol::owner::OwnerToken;
//!
//! let token = OwnerToken::new(1_700_000_000_000, 7, "10.0.0.7-billing-0");
//! assert_eq!(token.to_string(), "1700000000000:7:10.0.0.7-billing-0");
//! assert_eq!("1700000000000:7:10.0.0.7-billing-0".parse(), Ok(token));
//! ```

use std::fmt;
use std::str::FromStr;

/// The script that writes owner tokens unless a later grant's token is in place.
///
/// `KEYS[i]`: [`crate::routing::owner_key`]s; `ARGV[i]`: their [`OwnerToken`]s as text, any
/// number of pairs (on a Redis Cluster, keys of one slot). Returns one code per key, in
/// order: 2 written, 1 already there, 0 refused. It reads the token's generation with the Lua
/// pattern `^(%d+):(%d+):` — [`OwnerToken::created_ms`] then [`OwnerToken::grant_epoch`],
/// the same fields in the same order as [`OwnerToken`]'s `Display` — and compares the pairs
/// numerically.
pub const ASSERT_OWNER_LUA: &str = include_str!("lua/assert_owner.lua");

/// The owner token of a shard: `<created_ms>:<grant_epoch>:<member>`.
///
/// It changes whenever the shard changes hands: a later grant has a higher epoch, a rejoin
/// is a later grant, and a group created again has a later `created_ms`. So the pair
/// `(created_ms, grant_epoch)` orders tokens ([`OwnerToken::generation`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken {
    /// When the group incarnation was created (Unix milliseconds).
    pub created_ms: u64,
    /// The member epoch at which the shard was granted (never negative on the wire: the
    /// script's pattern reads digits only).
    pub grant_epoch: i64,
    /// The member the shard was granted to (may contain `:`; it is the rest of the text).
    pub member: String,
}

impl OwnerToken {
    /// The token of a shard granted to `member` at `grant_epoch` in the group incarnation
    /// created at `created_ms`.
    pub fn new(created_ms: u64, grant_epoch: i64, member: impl Into<String>) -> Self {
        OwnerToken {
            created_ms,
            grant_epoch,
            member: member.into(),
        }
    }

    /// The pair that orders tokens: a token with a greater generation is a later grant.
    pub fn generation(&self) -> (u64, i64) {
        (self.created_ms, self.grant_epoch)
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.created_ms, self.grant_epoch, self.member
        )
    }
}

/// Why a text is not an [`OwnerToken`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseOwnerTokenError(String);

impl fmt::Display for ParseOwnerTokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "owner token {:?} is not <created_ms>:<grant_epoch>:<member>",
            self.0
        )
    }
}

impl std::error::Error for ParseOwnerTokenError {}

impl FromStr for OwnerToken {
    type Err = ParseOwnerTokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseOwnerTokenError(s.to_owned());
        let mut parts = s.splitn(3, ':');
        let (Some(created), Some(epoch), Some(member)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(created) || !digits(epoch) {
            return Err(bad());
        }
        Ok(OwnerToken {
            created_ms: created.parse().map_err(|_| bad())?,
            grant_epoch: epoch.parse().map_err(|_| bad())?,
            member: member.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Any member id the name rule allows.
    fn name() -> impl Strategy<Value = String> {
        let body = crate::names::NAME_PATTERN
            .trim_start_matches('^')
            .trim_end_matches('$');
        proptest::string::string_regex(body).expect("the name pattern is a regex")
    }

    proptest! {
        #[test]
        fn display_and_parse_round_trip(
            created_ms in any::<u64>(),
            grant_epoch in 0..=i64::MAX,
            member in name(),
        ) {
            let token = OwnerToken::new(created_ms, grant_epoch, member);
            prop_assert_eq!(token.to_string().parse::<OwnerToken>(), Ok(token));
        }
    }

    #[test]
    fn the_format_is_unchanged() {
        assert_eq!(OwnerToken::new(0, 1, "m1").to_string(), "0:1:m1");
        assert_eq!(OwnerToken::new(5, 2, "a:b").to_string(), "5:2:a:b");
    }

    #[test]
    fn rejects_what_the_script_cannot_order() {
        for bad in ["", "1", "1:2", "x:2:m", "1:-2:m", "1::m", ":1:m"] {
            assert!(bad.parse::<OwnerToken>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_script_reads_the_generation_in_display_order() {
        assert!(ASSERT_OWNER_LUA.contains("string.match(t, '^(%d+):(%d+):')"));
    }
}
