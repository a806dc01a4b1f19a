//! Per-field limits of what a member writes (PROTOCOL §4.3): every free-form field of a
//! heartbeat has a largest size, so that what one member writes into its group's document,
//! and what the group view then shows, stays small whatever the member sends.
//!
//! The coordinator checks a heartbeat with [`HeartbeatRequest::check_limits`] where it
//! enters (the single route, and each item of a batch), before anything reaches the group
//! document; a field over its limit is `400 INVALID_REQUEST` whose message names the field
//! and the limit ([`LimitError`]). A client keeps its own facts within them with
//! [`ClientInfo::within_limits`].
//!
//! ```
//! use rsc_protocol::{ClientInfo, HeartbeatRequest};
//! use rsc_protocol::limits::MAX_CLIENT_FIELD_BYTES;
//!
//! let mut hb = HeartbeatRequest {
//!     protocol_version: 1,
//!     member_id: "m1".into(),
//!     member_epoch: 0,
//!     owned_shards: None,
//!     drained_shards: vec![],
//!     client: Some(ClientInfo { host: Some("x".repeat(64_000)), ..ClientInfo::default() }),
//!     incarnation: None,
//! };
//! let e = hb.check_limits().unwrap_err();
//! assert_eq!(e.to_string(), "client.host is 64000 bytes long; at most 256 are allowed (PROTOCOL §4.3)");
//! hb.client = hb.client.map(ClientInfo::within_limits);
//! assert_eq!(hb.client.as_ref().unwrap().host.as_ref().unwrap().len(), MAX_CLIENT_FIELD_BYTES);
//! assert!(hb.check_limits().is_ok());
//! ```

use crate::names::MAX_NAME_LEN;
use crate::{BatchedHeartbeat, ClientInfo, HeartbeatRequest};

/// The longest `client.pod_ip`, `client.host` and `client.version`, in bytes (UTF-8).
pub const MAX_CLIENT_FIELD_BYTES: usize = 256;

/// The most shards a stream has (`shard_count` is within `1..=MAX_SHARDS`): every shard index
/// is below it.
pub const MAX_SHARDS: u32 = 4096;

/// The most items of a heartbeat's `owned_shards` and of its `drained_shards`.
pub const MAX_SHARD_LIST_LEN: usize = MAX_SHARDS as usize;

/// A field of a request over its limit: the `400 INVALID_REQUEST` message names the field and
/// the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A string longer than its limit.
    #[error("{field} is {len} bytes long; at most {max} are allowed (PROTOCOL §4.3)")]
    TooLong {
        /// The field, as the JSON body names it (`client.host`).
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A list with more items than its limit.
    #[error("{field} has {len} items; at most {max} are allowed (PROTOCOL §4.3)")]
    TooManyItems {
        /// The field.
        field: &'static str,
        /// Its number of items.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A shard index no stream has.
    #[error("{field} holds shard {shard}; shard indexes are below {MAX_SHARDS} (PROTOCOL §4.3)")]
    ShardOutOfRange {
        /// The field.
        field: &'static str,
        /// The index.
        shard: u32,
    },
}

impl LimitError {
    /// The field over its limit.
    pub fn field(&self) -> &'static str {
        match self {
            LimitError::TooLong { field, .. }
            | LimitError::TooManyItems { field, .. }
            | LimitError::ShardOutOfRange { field, .. } => field,
        }
    }

    /// What is wrong, as a metric label: `field_too_long`, `too_many_items` or
    /// `shard_out_of_range`.
    pub fn reason(&self) -> &'static str {
        match self {
            LimitError::TooLong { .. } => "field_too_long",
            LimitError::TooManyItems { .. } => "too_many_items",
            LimitError::ShardOutOfRange { .. } => "shard_out_of_range",
        }
    }
}

/// Refuses `value` when it is longer than `max` bytes.
pub fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), LimitError> {
    if value.len() > max {
        return Err(LimitError::TooLong {
            field,
            len: value.len(),
            max,
        });
    }
    Ok(())
}

/// Refuses a list of shard indexes with more than [`MAX_SHARD_LIST_LEN`] items or an index of
/// [`MAX_SHARDS`] or more.
fn check_shards(field: &'static str, shards: &[u32]) -> Result<(), LimitError> {
    if shards.len() > MAX_SHARD_LIST_LEN {
        return Err(LimitError::TooManyItems {
            field,
            len: shards.len(),
            max: MAX_SHARD_LIST_LEN,
        });
    }
    match shards.iter().find(|&&s| s >= MAX_SHARDS) {
        Some(&shard) => Err(LimitError::ShardOutOfRange { field, shard }),
        None => Ok(()),
    }
}

impl ClientInfo {
    /// Refuses a `pod_ip`, `host` or `version` longer than [`MAX_CLIENT_FIELD_BYTES`].
    pub fn check_limits(&self) -> Result<(), LimitError> {
        let ClientInfo {
            pod_ip,
            host,
            version,
            concurrency: _,
        } = self;
        for (field, value) in [
            ("client.pod_ip", pod_ip),
            ("client.host", host),
            ("client.version", version),
        ] {
            if let Some(v) = value {
                check_len(field, v, MAX_CLIENT_FIELD_BYTES)?;
            }
        }
        Ok(())
    }

    /// The same facts with each string cut to [`MAX_CLIENT_FIELD_BYTES`] (at a character
    /// boundary): what a client sends, so that an unusually long host name never keeps it
    /// from joining.
    pub fn within_limits(self) -> Self {
        let cut = |v: Option<String>| v.map(|s| truncate(s, MAX_CLIENT_FIELD_BYTES));
        ClientInfo {
            pod_ip: cut(self.pod_ip),
            host: cut(self.host),
            version: cut(self.version),
            concurrency: self.concurrency,
        }
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

impl HeartbeatRequest {
    /// Checks every field against its limit (PROTOCOL §4.3): `member_id` and `incarnation`
    /// at most [`MAX_NAME_LEN`] bytes (their name rule is checked later, with the epoch),
    /// each `client` string at most [`MAX_CLIENT_FIELD_BYTES`], `owned_shards` and
    /// `drained_shards` at most [`MAX_SHARD_LIST_LEN`] items, each below [`MAX_SHARDS`].
    pub fn check_limits(&self) -> Result<(), LimitError> {
        let HeartbeatRequest {
            protocol_version: _,
            member_id,
            member_epoch: _,
            owned_shards,
            drained_shards,
            client,
            incarnation,
        } = self;
        check_len("member_id", member_id, MAX_NAME_LEN)?;
        if let Some(i) = incarnation {
            check_len("incarnation", i, MAX_NAME_LEN)?;
        }
        if let Some(c) = client {
            c.check_limits()?;
        }
        if let Some(owned) = owned_shards {
            check_shards("owned_shards", owned)?;
        }
        check_shards("drained_shards", drained_shards)
    }
}

impl BatchedHeartbeat {
    /// Checks the item's `group` (at most [`MAX_NAME_LEN`] bytes; its name rule is checked
    /// later) and its heartbeat ([`HeartbeatRequest::check_limits`]).
    pub fn check_limits(&self) -> Result<(), LimitError> {
        check_len("group", &self.group, MAX_NAME_LEN)?;
        self.heartbeat.check_limits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heartbeat() -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: 1,
            member_id: "m1".into(),
            member_epoch: 1,
            owned_shards: Some(vec![0, 1]),
            drained_shards: vec![],
            client: Some(ClientInfo {
                pod_ip: Some("10.0.0.1".into()),
                host: Some("pod-1".into()),
                version: Some("0.1.0".into()),
                concurrency: Some(4),
            }),
            incarnation: Some("dynamic:abc".into()),
        }
    }

    #[test]
    fn a_heartbeat_within_the_limits_passes_and_one_byte_more_is_refused() {
        assert_eq!(heartbeat().check_limits(), Ok(()));
        let at = "h".repeat(MAX_CLIENT_FIELD_BYTES);
        let over = "h".repeat(MAX_CLIENT_FIELD_BYTES + 1);
        type Set = fn(&mut ClientInfo, String);
        let fields: [(&str, Set); 3] = [
            ("client.pod_ip", |c, v| c.pod_ip = Some(v)),
            ("client.host", |c, v| c.host = Some(v)),
            ("client.version", |c, v| c.version = Some(v)),
        ];
        for (field, set) in fields {
            let mut hb = heartbeat();
            set(hb.client.as_mut().unwrap(), at.clone());
            assert_eq!(hb.check_limits(), Ok(()), "{field} at the limit");
            set(hb.client.as_mut().unwrap(), over.clone());
            let e = hb.check_limits().unwrap_err();
            assert_eq!(
                e,
                LimitError::TooLong {
                    field,
                    len: MAX_CLIENT_FIELD_BYTES + 1,
                    max: MAX_CLIENT_FIELD_BYTES
                }
            );
            assert_eq!((e.field(), e.reason()), (field, "field_too_long"));
            assert!(
                e.to_string()
                    .starts_with(&format!("{field} is 257 bytes long; at most 256")),
                "{e}"
            );
        }
    }

    #[test]
    fn ids_are_limited_to_the_name_length() {
        let mut hb = heartbeat();
        hb.member_id = "m".repeat(MAX_NAME_LEN);
        assert_eq!(hb.check_limits(), Ok(()));
        hb.member_id = "m".repeat(63_000);
        let e = hb.check_limits().unwrap_err();
        assert_eq!(e.field(), "member_id");
        assert!(
            e.to_string().contains("63000 bytes long; at most 200"),
            "{e}"
        );
        let mut hb = heartbeat();
        hb.incarnation = Some("i".repeat(MAX_NAME_LEN + 1));
        assert_eq!(hb.check_limits().unwrap_err().field(), "incarnation");
        let item = |group: String, heartbeat| BatchedHeartbeat { group, heartbeat };
        assert_eq!(
            item("g".repeat(MAX_NAME_LEN), heartbeat()).check_limits(),
            Ok(())
        );
        let e = item("g".repeat(MAX_NAME_LEN + 1), heartbeat())
            .check_limits()
            .unwrap_err();
        assert_eq!(e.field(), "group");
        assert_eq!(
            item("g".into(), hb).check_limits().unwrap_err().field(),
            "incarnation"
        );
    }

    #[test]
    fn shard_lists_are_limited_in_length_and_index() {
        let mut hb = heartbeat();
        hb.owned_shards = Some((0..MAX_SHARDS).collect());
        hb.drained_shards = (0..MAX_SHARDS).collect();
        assert_eq!(hb.check_limits(), Ok(()), "a 4096-shard stream fits");
        hb.owned_shards = Some(vec![0; MAX_SHARD_LIST_LEN + 1]);
        let e = hb.check_limits().unwrap_err();
        assert_eq!((e.field(), e.reason()), ("owned_shards", "too_many_items"));
        hb.owned_shards = Some(vec![1, MAX_SHARDS]);
        let e = hb.check_limits().unwrap_err();
        assert_eq!(
            e,
            LimitError::ShardOutOfRange {
                field: "owned_shards",
                shard: MAX_SHARDS
            }
        );
        assert_eq!(e.reason(), "shard_out_of_range");
        hb.owned_shards = None;
        hb.drained_shards = vec![u32::MAX];
        assert_eq!(hb.check_limits().unwrap_err().field(), "drained_shards");
    }

    #[test]
    fn within_limits_cuts_at_a_character_boundary() {
        // 'é' is two bytes: 200 of them are 400 bytes, cut to 256 (128 characters).
        let info = ClientInfo {
            host: Some("é".repeat(200)),
            version: Some("v1".into()),
            ..ClientInfo::default()
        }
        .within_limits();
        assert_eq!(info.host.as_deref(), Some("é".repeat(128).as_str()));
        assert_eq!(info.version.as_deref(), Some("v1"));
        // An odd limit falls back to the previous boundary.
        assert_eq!(truncate("aé".into(), 2), "a");
        assert!(info.check_limits().is_ok());
    }
}
