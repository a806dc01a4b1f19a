//! Group, stream and member ids (PROTOCOL §1): the name rule, and types that hold only valid
//! ids, so that an id is checked once where it enters (a JSON body, a URL path, a CLI
//! argument, a `#[stream_listener]` attribute) and carried typed from there on.

use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

/// The pattern every id matches (the OpenAPI document's `pattern`).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$";

/// The longest id allowed, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Why a string is not a valid id (PROTOCOL §1); `kind` names what it was meant to be
/// (`group`, `stream`, `member`, `incarnation`, …). The message is the explanation a
/// `400 INVALID_REQUEST` carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is empty.
    #[error("{kind} id must not be empty")]
    Empty {
        /// What the id names.
        kind: String,
    },
    /// The id is longer than [`MAX_NAME_LEN`] bytes.
    #[error("{kind} id is {len} bytes long; at most {MAX_NAME_LEN} are allowed")]
    TooLong {
        /// What the id names.
        kind: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The id does not start with an ASCII letter or digit.
    #[error("{kind} id {id:?} must start with a letter or a digit")]
    BadStart {
        /// What the id names.
        kind: String,
        /// The id.
        id: String,
    },
    /// The id contains a character outside `[A-Za-z0-9._:-]`.
    #[error("{kind} id {id:?} contains {bad:?}; allowed are letters, digits and . _ : -")]
    BadChar {
        /// What the id names.
        kind: String,
        /// The id.
        id: String,
        /// The first character not allowed.
        bad: char,
    },
}

/// Checks an id against [`NAME_PATTERN`] (`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`).
///
/// The typed ids ([`GroupId`], [`StreamId`], [`MemberId`]) are built through this check;
/// use it directly only for an id that has no type of its own (an `incarnation`).
///
/// ```
/// use rsc_protocol::names::validate_name;
/// assert!(validate_name("group", "billing-v2").is_ok());
/// assert_eq!(
///     validate_name("group", "-bad").unwrap_err().to_string(),
///     r#"group id "-bad" must start with a letter or a digit"#
/// );
/// ```
pub fn validate_name(kind: &str, name: &str) -> Result<(), IdError> {
    let bytes = name.as_bytes();
    let Some(first) = bytes.first() else {
        return Err(IdError::Empty { kind: kind.into() });
    };
    if bytes.len() > MAX_NAME_LEN {
        return Err(IdError::TooLong {
            kind: kind.into(),
            len: bytes.len(),
        });
    }
    if !first.is_ascii_alphanumeric() {
        return Err(IdError::BadStart {
            kind: kind.into(),
            id: name.into(),
        });
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(IdError::BadChar {
            kind: kind.into(),
            id: name.into(),
            bad,
        });
    }
    Ok(())
}

/// The OpenAPI schema of every id: a string matching [`NAME_PATTERN`].
#[cfg(feature = "openapi")]
fn id_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(NAME_PATTERN))
        .into()
}

/// Declares an id type: a `String` that can only be built valid.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(String);

        impl $name {
            /// What this id names, as error messages say it.
            pub const KIND: &'static str = $kind;

            /// The id, if `id` follows the name rule (PROTOCOL §1).
            pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
                let id = id.into();
                validate_name($kind, &id)?;
                Ok(Self(id))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as an owned string.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        /// Shown as the plain string (as logs and `tracing` fields showed it before).
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                id_schema()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}
    };
}

id_type!(
    /// A group id (PROTOCOL §1): also the name of the group's Redis consumer group on each
    /// shard key.
    ///
    /// ```
    /// use rsc_protocol::names::GroupId;
    /// let g: GroupId = "billing".parse().unwrap();
    /// assert_eq!(g, "billing");
    /// assert!("bad name".parse::<GroupId>().is_err());
    /// ```
    GroupId,
    "group"
);

id_type!(
    /// A stream's base name (PROTOCOL §1): its shards are the keys `<stream>:<n>`.
    StreamId,
    "stream"
);

id_type!(
    /// A member id (PROTOCOL §1): also the Redis consumer name the member reads as.
    MemberId,
    "member"
);

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: [&str; 5] = ["a", "0", "orders", "127.0.0.11-billing-0", "a:b_c.d-e"];
    const INVALID: [&str; 9] = ["", "-a", ".a", "_a", ":a", "a b", "a/b", "a{b}", "ü"];

    #[test]
    fn accepts_the_spec_alphabet() {
        let long = "x".repeat(200);
        for ok in VALID.iter().copied().chain([long.as_str()]) {
            assert!(validate_name("group", ok).is_ok(), "{ok}");
            assert_eq!(GroupId::new(ok).unwrap().as_str(), ok);
            assert_eq!(ok.parse::<MemberId>().unwrap(), ok);
        }
    }

    #[test]
    fn rejects_everything_else() {
        let long = "x".repeat(201);
        for bad in INVALID.iter().copied().chain([long.as_str()]) {
            assert!(validate_name("group", bad).is_err(), "{bad}");
            assert!(StreamId::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_kind_and_the_reason() {
        let msg = |r: Result<MemberId, IdError>| r.unwrap_err().to_string();
        assert_eq!(msg(MemberId::new("")), "member id must not be empty");
        assert_eq!(
            msg(MemberId::new("x".repeat(201))),
            "member id is 201 bytes long; at most 200 are allowed"
        );
        assert_eq!(
            StreamId::new("-s").unwrap_err().to_string(),
            r#"stream id "-s" must start with a letter or a digit"#
        );
        assert_eq!(
            GroupId::new("a b").unwrap_err().to_string(),
            r#"group id "a b" contains ' '; allowed are letters, digits and . _ : -"#
        );
    }

    #[test]
    fn json_is_a_plain_string_and_a_bad_id_is_refused_at_parse_time() {
        let g: GroupId = serde_json::from_str(r#""billing""#).unwrap();
        assert_eq!(serde_json::to_string(&g).unwrap(), r#""billing""#);
        let e = serde_json::from_str::<GroupId>(r#""bad name""#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(r#"group id "bad name" contains ' '"#),
            "{e}"
        );
        assert!(serde_json::from_str::<GroupId>("7").is_err());
    }

    #[test]
    fn maps_keyed_by_ids_are_looked_up_by_str() {
        let mut m = std::collections::BTreeMap::new();
        m.insert(GroupId::new("g").unwrap(), 1);
        assert_eq!(m.get("g"), Some(&1));
        assert_eq!(m.get("h"), None);
    }
}
