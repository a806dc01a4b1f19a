//! The field names of a shard entry and of a dead-letter entry (PROTOCOL §2.2).
//!
//! A shard entry is a Redis Stream entry written by a producer: [`PAYLOAD`] always, then
//! [`KEY`], [`CONTENT_TYPE`] and [`HEADERS`] when set, then any fields of the application, then
//! [`PRODUCER_ID`] and [`PRODUCER_SEQ`] from an idempotent producer, in that order. A consumer that gives up on an entry copies its fields to `<stream>:dlq` and adds
//! the [`DEAD_LETTER_FIELDS`].
//!
//! ```
//! use rsc_protocol::entry;
//!
//! assert_eq!(entry::PAYLOAD, "payload");
//! assert!(entry::DEAD_LETTER_FIELDS.contains(&entry::ORIGIN_ID));
//! ```

/// The message body, encoded by the producer's codec (JSON unless [`CONTENT_TYPE`] says
/// otherwise).
pub const PAYLOAD: &str = "payload";

/// The routing key the producer hashed to choose the shard (absent: no key).
pub const KEY: &str = "key";

/// The payload's format, e.g. `application/msgpack` (absent: JSON).
pub const CONTENT_TYPE: &str = "content_type";

/// The message headers, as a JSON object of strings (absent: none).
pub const HEADERS: &str = "headers";

/// The idempotent producer that wrote the entry (PROTOCOL §21): 16 lowercase hex digits,
/// random per producer and concurrent publish (absent: written without idempotence).
pub const PRODUCER_ID: &str = "producer_id";

/// The entry's sequence number for its [`PRODUCER_ID`] (decimal, from 1, increasing per
/// publish of that producer id; unique per producer id): `(producer_id, producer_seq)`
/// names one publish of one record, whatever retries wrote it.
pub const PRODUCER_SEQ: &str = "producer_seq";

/// Dead letter: why the entry was given up on (the handler's error).
pub const ERROR: &str = "error";

/// Dead letter: the shard key the entry was read from.
pub const ORIGIN: &str = "origin";

/// Dead letter: the entry's id on its shard.
pub const ORIGIN_ID: &str = "origin_id";

/// Dead letter: the consumer group that gave up.
pub const GROUP: &str = "group";

/// Dead letter: the member that gave up.
pub const MEMBER: &str = "member";

/// Dead letter: how many times the handler was tried.
pub const ATTEMPTS: &str = "attempts";

/// Dead letter: when the entry was given up on (Unix milliseconds).
pub const FAILED_MS: &str = "failed_ms";

/// The fields a dead-letter entry adds to the original entry's, in the order they are
/// written. A field of the original entry with one of these names is replaced.
pub const DEAD_LETTER_FIELDS: [&str; 7] =
    [ERROR, ORIGIN, ORIGIN_ID, GROUP, MEMBER, ATTEMPTS, FAILED_MS];

/// Header of a dead letter republished by a redrive (PROTOCOL §18): how many times it was
/// redriven (`"1"` after the first).
pub const REDRIVE_COUNT_HEADER: &str = "rsc-redrive-count";

/// Header of a dead letter republished by a redrive: the group it was redriven for (every
/// group of the stream is delivered the republished entry).
pub const REDRIVE_GROUP_HEADER: &str = "rsc-redrive-group";

/// Retry stage entry (non-blocking retries, PROTOCOL §2.2): the entry's id on its shard.
pub const RETRY_ORIGIN_ID: &str = "retry_origin_id";

/// Retry stage entry: how many times the handler was tried so far.
pub const RETRY_ATTEMPTS: &str = "retry_attempts";

/// Retry stage entry: Redis's delivery count of the entry's last attempt.
pub const RETRY_DELIVERIES: &str = "retry_deliveries";

/// Retry stage entry: when the entry is due for its next attempt (Unix milliseconds).
pub const RETRY_DUE_MS: &str = "retry_due_ms";

/// Retry stage entry: the last attempt's error.
pub const RETRY_ERROR: &str = "retry_error";

/// The fields a retry stage entry starts with, in this order; the original entry's fields
/// follow, unchanged (any name, since the position tells them apart).
pub const RETRY_FIELDS: [&str; 5] = [
    RETRY_ORIGIN_ID,
    RETRY_ATTEMPTS,
    RETRY_DELIVERIES,
    RETRY_DUE_MS,
    RETRY_ERROR,
];
