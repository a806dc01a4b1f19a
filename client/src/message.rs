//! The message a listener receives: its decoded payload and where it came from.

use crate::codec::Codec as _;
use crate::codec::CodecSpec;
use crate::error::BoxError;
use crate::error::ClientError;
use futures::future::BoxFuture;
use rsc_protocol::entry as fields;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The `headers` field of an entry: a JSON object of strings (e.g. a W3C `traceparent`).
/// Non-string values are kept as their JSON text.
pub type Headers = BTreeMap<String, String>;

/// How a payload type is made from the entry's `payload` field.
///
/// Every `serde::Deserialize` type is decoded with the listener's codec (JSON unless
/// [`crate::Listener::codec`] says otherwise); [`Raw`] takes the bytes as sent, whatever
/// their content type. A payload that does not decode is dead-lettered at once (retrying
/// cannot fix it).
#[diagnostic::on_unimplemented(
    message = "the payload type `{Self}` cannot be decoded: it does not implement `serde::Deserialize`",
    label = "not `serde::Deserialize`",
    note = "derive it (`#[derive(serde::Deserialize)]`), or take `Message<Raw>` for the bytes as sent"
)]
pub trait Payload: Sized + Send + 'static {
    /// Whether any content type is accepted (the bytes are not decoded): `true` for [`Raw`].
    const ANY_CONTENT_TYPE: bool = false;

    /// Decodes the `payload` field (as JSON, for a `serde::Deserialize` type).
    fn decode(bytes: &[u8]) -> Result<Self, BoxError>;

    /// Decodes the `payload` field with the listener's codec (by default: ignores it and
    /// calls [`Payload::decode`]).
    #[doc(hidden)]
    fn decode_with(bytes: &[u8], codec: &CodecSpec) -> Result<Self, BoxError> {
        let _ = codec;
        Self::decode(bytes)
    }
}

impl<T: DeserializeOwned + Send + 'static> Payload for T {
    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        serde_json::from_slice(bytes).map_err(Into::into)
    }

    fn decode_with(bytes: &[u8], codec: &CodecSpec) -> Result<Self, BoxError> {
        codec.decode(bytes)
    }
}

/// The `payload` field's bytes, undecoded: use `Message<Raw>` for non-JSON payloads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Raw(pub Vec<u8>);

impl Payload for Raw {
    const ANY_CONTENT_TYPE: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Raw(bytes.to_vec()))
    }
}

/// One Redis Stream entry as read (fields in the order Redis returned them).
#[derive(Debug, Clone, Default)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Vec<(String, Vec<u8>)>,
    pub(crate) key: Option<String>,
    pub(crate) headers: Headers,
    /// How many times Redis delivered it (1 for a first read).
    pub(crate) delivery_count: u64,
    /// Why the entry cannot be handled (a field value that is not a string): dead-lettered
    /// at once with this reason.
    pub(crate) malformed: Option<String>,
}

impl Entry {
    pub(crate) fn new(id: String, fields: Vec<(String, Vec<u8>)>, delivery_count: u64) -> Self {
        let mut key = None;
        let mut headers = Headers::new();
        for (name, value) in &fields {
            match name.as_str() {
                fields::KEY => key = Some(String::from_utf8_lossy(value).into_owned()),
                fields::HEADERS => headers = parse_headers(value),
                _ => {}
            }
        }
        Entry {
            id,
            fields,
            key,
            headers,
            delivery_count,
            malformed: None,
        }
    }

    pub(crate) fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

fn parse_headers(value: &[u8]) -> Headers {
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(value) {
        Ok(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        Err(_) => Headers::new(),
    }
}

/// Where a message was read: shared by every message of one shard worker.
#[derive(Debug, Default)]
pub(crate) struct Origin {
    pub(crate) group: String,
    pub(crate) stream: String,
    pub(crate) shard: u32,
    pub(crate) shard_key: String,
    pub(crate) member_id: String,
    /// Where manual acknowledgements go (`None` in [`Message::test`] messages): the shard
    /// worker's data path.
    pub(crate) acks: Option<Arc<dyn AckPath>>,
}

/// How an [`Acker`] acknowledges an entry outside the shard worker's read loop. The shard
/// worker provides it (presenting its owner token under strict fencing), so a message does
/// not need to know the data path.
pub(crate) trait AckPath: Send + Sync + std::fmt::Debug {
    /// Acknowledges entry `id` of the shard `origin` names; acknowledging twice is harmless.
    fn ack<'a>(&'a self, origin: &'a Origin, id: &'a str)
    -> BoxFuture<'a, Result<(), ClientError>>;
}

/// A message handed to a listener: the decoded payload plus the entry's metadata.
///
/// A message is handed over once per attempt: [`Message::attempt`] counts the attempts in this
/// process, [`Message::delivery_count`] is Redis's count of deliveries to the group (it grows
/// when a shard changes owner before the entry was acknowledged).
#[derive(Debug)]
pub struct Message<T> {
    payload: T,
    entry: Arc<Entry>,
    origin: Arc<Origin>,
    attempt: u32,
}

impl<T> Message<T> {
    pub(crate) fn new(payload: T, entry: Arc<Entry>, origin: Arc<Origin>, attempt: u32) -> Self {
        Message {
            payload,
            entry,
            origin,
            attempt,
        }
    }

    /// A message outside any stream, for unit tests of handlers: shard 0 of stream `test`,
    /// group `test`, entry id `0-1`; [`Message::ack`] does nothing.
    pub fn test(payload: T) -> Self {
        Self::test_with_id(payload, "0-1".into())
    }

    fn test_with_id(payload: T, id: String) -> Self {
        Message {
            payload,
            entry: Arc::new(Entry {
                id,
                delivery_count: 1,
                ..Entry::default()
            }),
            origin: Arc::new(Origin {
                group: "test".into(),
                stream: "test".into(),
                shard_key: "test:0".into(),
                member_id: "test".into(),
                ..Origin::default()
            }),
            attempt: 1,
        }
    }

    /// The decoded payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// The decoded payload, by value.
    pub fn into_payload(self) -> T {
        self.payload
    }

    /// The Redis Stream entry id (e.g. `1700000000000-0`).
    pub fn id(&self) -> &str {
        &self.entry.id
    }

    /// The shard index the entry was read from.
    pub fn shard(&self) -> u32 {
        self.origin.shard
    }

    /// The shard's Redis key (`<stream>:<shard>`).
    pub fn shard_key(&self) -> &str {
        &self.origin.shard_key
    }

    /// The stream's base name.
    pub fn stream(&self) -> &str {
        &self.origin.stream
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.origin.group
    }

    /// The member handling it.
    pub fn member_id(&self) -> &str {
        &self.origin.member_id
    }

    /// The entry's routing `key`, if it has one.
    pub fn key(&self) -> Option<&str> {
        self.entry.key.as_deref()
    }

    /// The payload's content type: the entry's `content_type` field, or
    /// `application/json` when it has none (see [`crate::codec`]).
    pub fn content_type(&self) -> &str {
        self.entry
            .field(fields::CONTENT_TYPE)
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or(crate::codec::Json::CONTENT_TYPE)
    }

    /// The entry's `headers`.
    pub fn headers(&self) -> &Headers {
        &self.entry.headers
    }

    /// The idempotent producer's id and sequence number that wrote the entry (entry fields
    /// `producer_id`, `producer_seq`, PROTOCOL §21): one publish of one record, however many
    /// times the producer sent it. `None`: written without idempotence or without
    /// `ProducerBuilder::producer_fields(true)` (the default). A consumer that
    /// crashed before its acknowledgement is still given the entry again (same id, same
    /// pair): handling stays at-least-once.
    pub fn producer_seq(&self) -> Option<(&str, u64)> {
        let id = std::str::from_utf8(self.entry.field(fields::PRODUCER_ID)?).ok()?;
        let seq = std::str::from_utf8(self.entry.field(fields::PRODUCER_SEQ)?).ok()?;
        Some((id, seq.parse().ok()?))
    }

    /// Any field of the entry, raw (`payload`, `key`, `headers`, or one the producer added).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.entry.field(name)
    }

    /// Every field of the entry, raw, in the order Redis returned them.
    pub(crate) fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entry
            .fields
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
    }

    /// Redis's delivery count for the entry in this group (1 on a first read).
    pub fn delivery_count(&self) -> u64 {
        self.entry.delivery_count
    }

    /// This attempt's number in this process, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A handle that acknowledges this entry later, e.g. from a task the handler spawned.
    /// Only needed with [`crate::AckMode::Manual`].
    pub fn acker(&self) -> Acker {
        Acker {
            origin: self.origin.clone(),
            id: self.entry.id.clone(),
        }
    }

    /// Acknowledges the entry now (`XACK`). With [`crate::AckMode::Auto`] the runtime does it
    /// after the handler succeeds; with [`crate::AckMode::Manual`] the handler must.
    pub async fn ack(&self) -> Result<(), ClientError> {
        self.acker().ack().await
    }
}

/// The messages a batch listener receives at once: up to its maximum batch size, from one
/// shard, in stream order.
///
/// Iterate over it (`for msg in &batch`), or take the messages with
/// [`Batch::into_messages`]. With [`crate::AckMode::Auto`] the runtime acknowledges every
/// message the handler did not name as failed, after it returns.
#[derive(Debug)]
pub struct Batch<T> {
    messages: Vec<Message<T>>,
}

impl<T> Batch<T> {
    pub(crate) fn new(messages: Vec<Message<T>>) -> Self {
        Batch { messages }
    }

    /// A batch outside any stream, for unit tests of batch handlers: the payloads as
    /// [`Message::test`] messages with entry ids `0-1`, `0-2`, ….
    pub fn test(payloads: Vec<T>) -> Self {
        Batch {
            messages: payloads
                .into_iter()
                .enumerate()
                .map(|(i, p)| Message::test_with_id(p, format!("0-{}", i + 1)))
                .collect(),
        }
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether the batch is empty (never, for a batch the runtime hands over).
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The messages.
    pub fn messages(&self) -> &[Message<T>] {
        &self.messages
    }

    /// The messages, by value.
    pub fn into_messages(self) -> Vec<Message<T>> {
        self.messages
    }

    /// The messages in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Message<T>> {
        self.messages.iter()
    }
}

impl<'a, T> IntoIterator for &'a Batch<T> {
    type Item = &'a Message<T>;
    type IntoIter = std::slice::Iter<'a, Message<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.iter()
    }
}

impl<T> IntoIterator for Batch<T> {
    type Item = Message<T>;
    type IntoIter = std::vec::IntoIter<Message<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.into_iter()
    }
}

/// Acknowledges one entry (`XACK <shard_key> <group> <id>`), see [`Message::acker`].
#[derive(Debug, Clone)]
pub struct Acker {
    origin: Arc<Origin>,
    id: String,
}

impl Acker {
    /// Sends the `XACK`. Acknowledging twice is harmless.
    pub async fn ack(&self) -> Result<(), ClientError> {
        match &self.origin.acks {
            Some(path) => path.ack(&self.origin, &self.id).await,
            None => Ok(()),
        }
    }

    /// The entry id it acknowledges.
    pub fn id(&self) -> &str {
        &self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Order {
        id: u32,
    }

    #[test]
    fn typed_and_raw_payloads() {
        assert_eq!(Order::decode(br#"{"id":7}"#).unwrap(), Order { id: 7 });
        assert!(Order::decode(b"not json").is_err());
        assert_eq!(Raw::decode(b"\xff\x00").unwrap(), Raw(vec![0xff, 0]));
    }

    #[test]
    fn entry_reads_key_and_headers() {
        let e = Entry::new(
            "1-0".into(),
            vec![
                ("payload".into(), b"{}".to_vec()),
                ("key".into(), b"k1".to_vec()),
                (
                    "headers".into(),
                    br#"{"traceparent":"00-ab-cd-01","n":3}"#.to_vec(),
                ),
            ],
            2,
        );
        assert_eq!(e.key.as_deref(), Some("k1"));
        assert_eq!(e.headers["traceparent"], "00-ab-cd-01");
        assert_eq!(e.headers["n"], "3");
        assert_eq!(e.field("payload"), Some(&b"{}"[..]));
        assert_eq!(e.field("nope"), None);
    }
}
