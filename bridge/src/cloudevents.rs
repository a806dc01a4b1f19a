//! An entry as a CloudEvent (CloudEvents 1.0, HTTP protocol binding): pure, no I/O.
//!
//! | attribute | value |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the entry id (`1700000000000-0`) |
//! | `source` | `/streams/<stream>/shards/<shard>` (an id is unique within its shard) |
//! | `type` | the listener's `event_type` (default `rsc.entry`) |
//! | `subject` | the entry's routing key, when it has one |
//! | `time` | the entry id's milliseconds, RFC 3339 |
//! | `datacontenttype` | the entry's `content_type` field, else `application/json` |
//! | `rscgroup`, `rscstream`, `rscshard` | the consumer group, the stream, the shard index |
//! | `rscdeliverycount` | Redis's delivery count of the entry in the group (1 on a first read) |
//! | `rscattempt` | the bridge's attempt number (from 1; a deferred delivery keeps its number) |
//! | `rscheaders` | the entry's headers, as their JSON object text (when it has any) |
//! | `traceparent`, `tracestate` | from the entry's headers (the distributed-tracing extension) |
//!
//! Binary mode puts each attribute in a `ce-<name>` header (values percent-encoded as the
//! binding says: space, `"`, `%` and anything outside printable ASCII) and the payload, as
//! written, in the body under its content type; W3C `traceparent`/`tracestate` headers are
//! sent too. Structured mode sends the event as one JSON document
//! (`application/cloudevents+json`): a JSON payload as `data`, a text one as a string, any
//! other as `data_base64`. A batch is a JSON array of structured events
//! (`application/cloudevents-batch+json`).

use base64::Engine as _;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The content type of a structured event.
pub(crate) const STRUCTURED: &str = "application/cloudevents+json";
/// The content type of a batch of structured events.
pub(crate) const BATCH: &str = "application/cloudevents-batch+json";

/// What an event is made of (borrowed from a message).
#[derive(Debug, Clone)]
pub(crate) struct Event<'a> {
    /// The entry id.
    pub(crate) id: &'a str,
    /// The consumer group.
    pub(crate) group: &'a str,
    /// The stream.
    pub(crate) stream: &'a str,
    /// The shard index.
    pub(crate) shard: u32,
    /// The `type` attribute.
    pub(crate) event_type: &'a str,
    /// The routing key.
    pub(crate) key: Option<&'a str>,
    /// The payload's content type.
    pub(crate) content_type: &'a str,
    /// The payload as written.
    pub(crate) data: &'a [u8],
    /// The entry's headers.
    pub(crate) headers: &'a BTreeMap<String, String>,
    /// Redis's delivery count.
    pub(crate) delivery_count: u64,
    /// The bridge's attempt number.
    pub(crate) attempt: u32,
}

impl Event<'_> {
    /// The `source` attribute.
    pub(crate) fn source(&self) -> String {
        format!("/streams/{}/shards/{}", self.stream, self.shard)
    }

    /// The `time` attribute: the entry id's milliseconds (`None` for an id without them).
    pub(crate) fn time(&self) -> Option<String> {
        let ms: i128 = self.id.split('-').next()?.parse().ok()?;
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000).ok()?;
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    }

    /// The attributes as (name, value) strings, `specversion` first.
    fn attributes(&self) -> Vec<(&'static str, String)> {
        let mut a = vec![
            ("specversion", "1.0".to_owned()),
            ("id", self.id.to_owned()),
            ("source", self.source()),
            ("type", self.event_type.to_owned()),
        ];
        if let Some(k) = self.key {
            a.push(("subject", k.to_owned()));
        }
        if let Some(t) = self.time() {
            a.push(("time", t));
        }
        a.push(("rscgroup", self.group.to_owned()));
        a.push(("rscstream", self.stream.to_owned()));
        a.push(("rscshard", self.shard.to_string()));
        a.push(("rscdeliverycount", self.delivery_count.to_string()));
        a.push(("rscattempt", self.attempt.to_string()));
        if !self.headers.is_empty() {
            a.push((
                "rscheaders",
                serde_json::to_string(self.headers).unwrap_or_default(),
            ));
        }
        for name in ["traceparent", "tracestate"] {
            if let Some(v) = self.headers.get(name) {
                a.push((name, v.clone()));
            }
        }
        a
    }

    /// Binary mode: the request's headers (the body is `Event::data` as it is).
    pub(crate) fn binary_headers(&self) -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = self
            .attributes()
            .into_iter()
            .map(|(n, v)| (format!("ce-{n}"), percent_encode(&v)))
            .collect();
        h.push(("content-type".to_owned(), self.content_type.to_owned()));
        for name in ["traceparent", "tracestate"] {
            if let Some(v) = self.headers.get(name).filter(|v| is_header_safe(v)) {
                h.push((name.to_owned(), v.clone()));
            }
        }
        h
    }

    /// Structured mode: the event as one JSON object.
    pub(crate) fn structured(&self) -> Value {
        let mut o = Map::new();
        for (n, v) in self.attributes() {
            let value = match n {
                "rscshard" => json!(self.shard),
                "rscdeliverycount" => json!(self.delivery_count),
                "rscattempt" => json!(self.attempt),
                _ => Value::String(v),
            };
            o.insert(n.to_owned(), value);
        }
        o.insert("datacontenttype".to_owned(), json!(self.content_type));
        match data_value(self.content_type, self.data) {
            Some(v) => o.insert("data".to_owned(), v),
            None => o.insert(
                "data_base64".to_owned(),
                json!(base64::engine::general_purpose::STANDARD.encode(self.data)),
            ),
        };
        Value::Object(o)
    }
}

/// The payload as a JSON `data` value: JSON as itself, text as a string; `None`: bytes
/// (`data_base64`).
fn data_value(content_type: &str, data: &[u8]) -> Option<Value> {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if (essence == "application/json" || essence.ends_with("+json"))
        && let Ok(v) = serde_json::from_slice(data)
    {
        return Some(v);
    }
    if essence.starts_with("text/") {
        return std::str::from_utf8(data)
            .ok()
            .map(|s| Value::String(s.to_owned()));
    }
    None
}

/// Whether `v` can go in an HTTP header as it is (printable ASCII).
fn is_header_safe(v: &str) -> bool {
    v.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A `ce-*` header value as the HTTP binding writes it (§3.1.3.2): space, `"`, `%` and every
/// byte outside printable ASCII percent-encoded (of its UTF-8 form).
pub(crate) fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event<'a>(headers: &'a BTreeMap<String, String>, ct: &'a str, data: &'a [u8]) -> Event<'a> {
        Event {
            id: "1700000000000-3",
            group: "billing",
            stream: "orders",
            shard: 2,
            event_type: "rsc.entry",
            key: Some("customer 42"),
            content_type: ct,
            data,
            headers,
            delivery_count: 2,
            attempt: 1,
        }
    }

    #[test]
    fn binary_mode_puts_the_attributes_in_ce_headers() {
        let headers = BTreeMap::from([
            (
                "traceparent".to_owned(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
            ),
            ("tenant".to_owned(), "ü".to_owned()),
        ]);
        let h = event(&headers, "application/json", b"{}").binary_headers();
        let get = |n: &str| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("ce-specversion"), Some("1.0"));
        assert_eq!(get("ce-id"), Some("1700000000000-3"));
        assert_eq!(get("ce-source"), Some("/streams/orders/shards/2"));
        assert_eq!(get("ce-subject"), Some("customer%2042"));
        assert_eq!(get("ce-time"), Some("2023-11-14T22:13:20Z"));
        assert_eq!(get("ce-rscshard"), Some("2"));
        assert_eq!(get("ce-rscdeliverycount"), Some("2"));
        assert_eq!(get("content-type"), Some("application/json"));
        assert_eq!(
            get("ce-rscheaders"),
            Some(
                "{%22tenant%22:%22%C3%BC%22,%22traceparent%22:%2200-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01%22}"
            )
        );
        assert_eq!(get("traceparent"), get("ce-traceparent"));
        assert!(h.iter().all(|(_, v)| is_header_safe(v)), "{h:?}");
    }

    #[test]
    fn structured_mode_carries_json_as_data_and_bytes_as_base64() {
        let none = BTreeMap::new();
        let e = event(&none, "application/json", br#"{"total":10}"#).structured();
        assert_eq!(e["data"], json!({"total": 10}));
        assert_eq!(e["rscshard"], json!(2));
        assert_eq!(e["subject"], json!("customer 42"));
        assert!(e.get("rscheaders").is_none());
        let e = event(&none, "text/plain", b"hello").structured();
        assert_eq!(e["data"], json!("hello"));
        let e = event(&none, "application/octet-stream", b"\xff\x00").structured();
        assert_eq!(e["data_base64"], json!("/wA="));
        assert!(e.get("data").is_none());
        // JSON that does not parse is still delivered, as bytes.
        let e = event(&none, "application/json", b"{oops").structured();
        assert_eq!(e["data_base64"], json!("e29vcHM="));
    }

    #[test]
    fn an_id_without_milliseconds_has_no_time() {
        let none = BTreeMap::new();
        let mut e = event(&none, "application/json", b"{}");
        e.id = "x";
        assert_eq!(e.time(), None);
    }
}
