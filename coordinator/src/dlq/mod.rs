//! Dead letters as a queue an operator can watch and clean (PROTOCOL §18): the depth and
//! oldest age per group ([`depth`]), a filtered, paged list and a filtered purge
//! ([`scan`]).
//!
//! A stream's dead letters live in one Redis stream, `<stream>:dlq`, shared by every group
//! of the stream; each dead letter names its group in its `group` field. [`Filter`] says
//! which dead letters a list or purge takes (pure); the Redis round trips are in [`scan`]
//! and [`depth`].

pub(crate) mod depth;
pub(crate) mod scan;

use redis::Value;
use rsc_protocol::{DeadLetterView, entry};

/// Bytes of a payload a view shows.
const PREVIEW_BYTES: usize = 256;

/// Which dead letters a list or purge takes: each filter given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// The `group` field equals this.
    pub group: Option<String>,
    /// The `key` field equals this.
    pub key: Option<String>,
    /// The `error` field contains this.
    pub error: Option<String>,
    /// Dead-lettered at or after this Unix ms (by the dead letter's id).
    pub since_ms: Option<u64>,
    /// Dead-lettered before this Unix ms (by the dead letter's id).
    pub until_ms: Option<u64>,
}

/// The milliseconds part of a stream entry id (`1767225600000-3`), if it has one.
pub(crate) fn id_ms(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

impl Filter {
    /// Whether `dl` is taken.
    pub(crate) fn matches(&self, dl: &DeadLetter) -> bool {
        let field_is = |name: &str, want: &Option<String>| {
            want.as_ref()
                .is_none_or(|w| dl.field(name) == Some(w.as_bytes()))
        };
        if !field_is(entry::GROUP, &self.group) || !field_is(entry::KEY, &self.key) {
            return false;
        }
        if let Some(e) = &self.error {
            let error = dl.text(entry::ERROR).unwrap_or_default();
            if !error.contains(e.as_str()) {
                return false;
            }
        }
        let ms = id_ms(&dl.id).unwrap_or(0);
        self.since_ms.is_none_or(|s| ms >= s) && self.until_ms.is_none_or(|u| ms < u)
    }

    /// The `XRANGE` bounds the time filters allow (`-`/`+` when open); the id filters stay
    /// checked by [`Self::matches`].
    pub(crate) fn range(&self) -> (String, String) {
        let start = self
            .since_ms
            .map_or_else(|| "-".to_owned(), |t| format!("{t}-0"));
        let end = match self.until_ms {
            Some(0) => "0-0".to_owned(),
            Some(u) => format!("{}-18446744073709551615", u - 1),
            None => "+".to_owned(),
        };
        (start, end)
    }
}

/// One entry of `<stream>:dlq`: its id and fields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetter {
    /// Its id in the dead-letter stream.
    pub(crate) id: String,
    /// Its fields, in the order the consumer wrote them.
    pub(crate) fields: Vec<(String, Vec<u8>)>,
}

impl DeadLetter {
    pub(crate) fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    pub(crate) fn text(&self, name: &str) -> Option<String> {
        self.field(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// The entries of an `XRANGE` reply: `[[id, [field, value, …]], …]`.
pub(crate) fn parse_range(reply: Value) -> redis::RedisResult<Vec<DeadLetter>> {
    let bad = || {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "dead letters: unexpected XRANGE reply",
        ))
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    items
        .into_iter()
        .map(|item| {
            let Value::Array(mut pair) = item else {
                return Err(bad());
            };
            if pair.len() != 2 {
                return Err(bad());
            }
            let flat: Vec<Vec<u8>> = redis::from_redis_value(pair.pop().ok_or_else(bad)?)?;
            let id: String = redis::from_redis_value(pair.pop().ok_or_else(bad)?)?;
            let fields = flat
                .chunks_exact(2)
                .map(|c| (String::from_utf8_lossy(&c[0]).into_owned(), c[1].clone()))
                .collect();
            Ok(DeadLetter { id, fields })
        })
        .collect()
}

/// What a list or purge answers of `dl`.
pub(crate) fn view(dl: &DeadLetter) -> DeadLetterView {
    let preview = dl.field(entry::PAYLOAD).map(|p| {
        let cut = &p[..p.len().min(PREVIEW_BYTES)];
        String::from_utf8_lossy(cut).into_owned()
    });
    DeadLetterView {
        dlq_id: dl.id.clone(),
        group: dl.text(entry::GROUP).unwrap_or_default(),
        key: dl.text(entry::KEY),
        error: dl.text(entry::ERROR).unwrap_or_default(),
        origin: dl.text(entry::ORIGIN),
        origin_id: dl.text(entry::ORIGIN_ID),
        member: dl.text(entry::MEMBER),
        attempts: dl.text(entry::ATTEMPTS).and_then(|a| a.parse().ok()),
        payload_preview: preview,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dl(id: &str, group: &str, key: &str, error: &str) -> DeadLetter {
        DeadLetter {
            id: id.into(),
            fields: vec![
                ("payload".into(), b"{\"n\":1}".to_vec()),
                ("key".into(), key.as_bytes().to_vec()),
                ("error".into(), error.as_bytes().to_vec()),
                ("group".into(), group.as_bytes().to_vec()),
                ("attempts".into(), b"3".to_vec()),
            ],
        }
    }

    #[test]
    fn every_given_filter_must_match() {
        let d = dl("1000-0", "billing", "k1", "timeout talking to bank");
        assert!(Filter::default().matches(&d));
        let f = |g: Option<&str>, k: Option<&str>, e: Option<&str>| Filter {
            group: g.map(Into::into),
            key: k.map(Into::into),
            error: e.map(Into::into),
            ..Filter::default()
        };
        assert!(f(Some("billing"), Some("k1"), Some("bank")).matches(&d));
        assert!(!f(Some("shipping"), None, None).matches(&d));
        assert!(
            !f(None, Some("k"), None).matches(&d),
            "a key is matched whole"
        );
        assert!(
            !f(None, None, Some("Bank")).matches(&d),
            "the error text is case-sensitive"
        );
        let t = |s: Option<u64>, u: Option<u64>| Filter {
            since_ms: s,
            until_ms: u,
            ..Filter::default()
        };
        assert!(t(Some(1000), Some(1001)).matches(&d));
        assert!(!t(Some(1001), None).matches(&d));
        assert!(!t(None, Some(1000)).matches(&d), "until is exclusive");
    }

    #[test]
    fn time_filters_bound_the_range() {
        let f = Filter {
            since_ms: Some(5),
            until_ms: Some(10),
            ..Filter::default()
        };
        assert_eq!(f.range(), ("5-0".into(), "9-18446744073709551615".into()));
        assert_eq!(Filter::default().range(), ("-".into(), "+".into()));
    }

    #[test]
    fn a_view_shows_the_fields_and_a_payload_preview() {
        let v = view(&dl("7-1", "g", "k", "boom"));
        assert_eq!((v.dlq_id.as_str(), v.group.as_str()), ("7-1", "g"));
        assert_eq!(v.key.as_deref(), Some("k"));
        assert_eq!(v.attempts, Some(3));
        assert_eq!(v.payload_preview.as_deref(), Some("{\"n\":1}"));
        assert_eq!(id_ms("1767225600000-3"), Some(1_767_225_600_000));
    }
}
