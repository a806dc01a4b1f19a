//! Dead-letter redrive (PROTOCOL §18): the dead letters a group gave up on, read from
//! `<stream>:dlq`, republished to their shards under the stream's current routing and removed
//! from the dead-letter stream once the republish is confirmed.
//!
//! [`republish`] decides what one dead letter becomes (pure); [`scan`], [`write_shard`] and
//! [`remove`] are the Redis round trips. The write is the producer's fenced write (PROTOCOL
//! §15): `WATCH` the shard's epoch marker, the epoch check script, then `MULTI`, the
//! `XADD`s in dead-letter order and the doorbell ring, `EXEC`; a write under a stale routing
//! writes nothing (the caller reads the stream again and retries).

pub(crate) use crate::dlq::DeadLetter;
use crate::dlq::parse_range;
use redis::Value;
use rsc_protocol::{entry, routing};
use rsc_redis::Conn;
use std::collections::BTreeMap;

/// Dead letters read per `XRANGE` page.
const PAGE: usize = 500;

/// What a redrive writes for one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Republish {
    /// The dead letter's id (removed once the write is confirmed).
    pub(crate) dlq_id: String,
    /// Its routing key, when it has one.
    pub(crate) key: Option<String>,
    /// Why it was dead-lettered.
    pub(crate) error: String,
    /// The `rsc-redrive-count` header it is written with.
    pub(crate) redrive_count: u64,
    /// The entry's fields: the original ones in their order (without the dead-letter
    /// fields), `headers` carrying the redrive headers.
    pub(crate) fields: Vec<(String, Vec<u8>)>,
}

impl Republish {
    /// Its shard under a routing of `shard_count` shards: the key's shard (PROTOCOL §3), or
    /// `seq` round-robin for an entry without a key.
    pub(crate) fn shard(&self, shard_count: u32, seq: u64) -> u32 {
        match &self.key {
            Some(k) => routing::shard_for_key(k.as_bytes(), shard_count),
            None => (seq % u64::from(shard_count.max(1))) as u32,
        }
    }
}

/// What `dl` is republished as when it is a dead letter of `group`; `None` for another
/// group's, or for one whose `headers` field is not a JSON object of strings (left in place:
/// a redrive never rewrites what it cannot read).
pub(crate) fn republish(dl: &DeadLetter, group: &str) -> Option<Republish> {
    if dl.field(entry::GROUP)? != group.as_bytes() {
        return None;
    }
    let mut headers: BTreeMap<String, String> = match dl.field(entry::HEADERS) {
        Some(raw) => serde_json::from_slice(raw).ok()?,
        None => BTreeMap::new(),
    };
    let count = headers
        .get(entry::REDRIVE_COUNT_HEADER)
        .and_then(|c| c.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    headers.insert(entry::REDRIVE_COUNT_HEADER.into(), count.to_string());
    headers.insert(entry::REDRIVE_GROUP_HEADER.into(), group.to_owned());
    let encoded = serde_json::to_vec(&headers).unwrap_or_default();
    let mut fields: Vec<(String, Vec<u8>)> = dl
        .fields
        .iter()
        .filter(|(n, _)| !entry::DEAD_LETTER_FIELDS.contains(&n.as_str()))
        .cloned()
        .collect();
    if let Some(h) = fields.iter_mut().find(|(n, _)| n == entry::HEADERS) {
        h.1 = encoded;
    } else {
        // The producer's order: payload, key, content_type, headers, then the others.
        let at = fields
            .iter()
            .take_while(|(n, _)| {
                [entry::PAYLOAD, entry::KEY, entry::CONTENT_TYPE].contains(&n.as_str())
            })
            .count();
        fields.insert(at, (entry::HEADERS.into(), encoded));
    }
    Some(Republish {
        dlq_id: dl.id.clone(),
        key: dl.text(entry::KEY),
        error: dl.text(entry::ERROR).unwrap_or_default(),
        redrive_count: count,
        fields,
    })
}

/// The dead letters of `group` in `<stream>:dlq`, oldest first: those written at or after
/// `since_ms` (by their id), at most `limit`.
pub(crate) async fn scan(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    since_ms: Option<u64>,
    limit: usize,
) -> redis::RedisResult<Vec<Republish>> {
    let key = routing::dlq_key(stream);
    let mut start = since_ms.map_or_else(|| "-".to_owned(), |t| format!("{t}-0"));
    let mut out = Vec::new();
    while out.len() < limit {
        let reply: Value = redis::cmd("XRANGE")
            .arg(&key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(PAGE)
            .query_async(conn)
            .await?;
        let page = parse_range(reply)?;
        let n = page.len();
        for dl in page {
            start = format!("({}", dl.id);
            if out.len() < limit
                && let Some(r) = republish(&dl, group)
            {
                out.push(r);
            }
        }
        if n < PAGE {
            break;
        }
    }
    Ok(out)
}

/// Writes `entries` (all of shard `shard`, in order) with the producer's fenced write under
/// routing epoch `epoch`: their new ids, or `None` when the shard's epoch marker refused the
/// write (a reshard moved it: nothing was written). The shard's doorbell is rung (PROTOCOL
/// §16; `SPUBLISH` on a Redis Cluster, `cluster`).
pub(crate) async fn write_shard(
    conn: &mut Conn,
    shard_key: &str,
    epoch: u64,
    entries: &[&Republish],
    cluster: bool,
) -> redis::RedisResult<Option<Vec<String>>> {
    use redis::aio::ConnectionLike;
    let marker = routing::epoch_key(shard_key);
    let mut pipe = redis::pipe();
    pipe.cmd("WATCH").arg(&marker);
    pipe.cmd("EVAL")
        .arg(routing::EPOCH_CHECK_LUA)
        .arg(1)
        .arg(&marker)
        .arg(epoch);
    pipe.cmd("MULTI");
    for e in entries {
        pipe.cmd("XADD").arg(shard_key).arg("*");
        for (n, v) in &e.fields {
            pipe.arg(n).arg(v.as_slice());
        }
    }
    pipe.cmd(routing::ring_command(cluster))
        .arg(routing::ring_channel(shard_key))
        .arg("");
    pipe.cmd("EXEC");
    let values = conn.req_packed_commands(&pipe, 0, pipe.len()).await?;
    read_exec(values, entries.len())
}

/// The ids of a fenced write's `EXEC` (`None`: refused); any server error fails it.
fn read_exec(values: Vec<Value>, n: usize) -> redis::RedisResult<Option<Vec<String>>> {
    if let Some(Value::ServerError(e)) = values.iter().find(|v| matches!(v, Value::ServerError(_)))
    {
        return Err(e.clone().into());
    }
    match values.into_iter().last() {
        Some(Value::Nil) => Ok(None),
        Some(Value::Array(mut replies)) => {
            if let Some(Value::ServerError(e)) =
                replies.iter().find(|v| matches!(v, Value::ServerError(_)))
            {
                return Err(e.clone().into());
            }
            replies.truncate(n);
            let ids: Vec<String> = redis::from_redis_value(Value::Array(replies))?;
            Ok(Some(ids))
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "redrive: unexpected EXEC reply",
            format!("{other:?}"),
        ))),
    }
}

/// Removes the dead letters `ids` from `<stream>:dlq` (`XDEL`: nothing reads the dead-letter
/// stream through a consumer group). Returns how many were removed.
pub(crate) async fn remove(conn: &mut Conn, stream: &str, ids: &[&str]) -> redis::RedisResult<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    redis::cmd("XDEL")
        .arg(routing::dlq_key(stream))
        .arg(ids)
        .query_async(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dl(fields: &[(&str, &str)]) -> DeadLetter {
        DeadLetter {
            id: "5-0".into(),
            fields: fields
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    fn names(r: &Republish) -> Vec<&str> {
        r.fields.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn headers(r: &Republish) -> BTreeMap<String, String> {
        let h = &r.fields.iter().find(|(n, _)| n == "headers").unwrap().1;
        serde_json::from_slice(h).unwrap()
    }

    const DL_FIELDS: [(&str, &str); 7] = [
        ("error", "boom"),
        ("origin", "s:1"),
        ("origin_id", "4-0"),
        ("group", "g"),
        ("member", "m"),
        ("attempts", "4"),
        ("failed_ms", "5"),
    ];

    #[test]
    fn a_first_redrive_keeps_the_fields_in_order_and_adds_the_headers() {
        let mut f = vec![("payload", "{}"), ("key", "k1"), ("app", "x")];
        f.extend(DL_FIELDS);
        let r = republish(&dl(&f), "g").unwrap();
        assert_eq!(names(&r), ["payload", "key", "headers", "app"]);
        assert_eq!(r.key.as_deref(), Some("k1"));
        assert_eq!(r.error, "boom");
        assert_eq!(r.redrive_count, 1);
        let h = headers(&r);
        assert_eq!(h["rsc-redrive-count"], "1");
        assert_eq!(h["rsc-redrive-group"], "g");
        assert_eq!(r.shard(8, 0), routing::shard_for_key(b"k1", 8));
    }

    #[test]
    fn a_second_redrive_counts_on_and_keeps_other_headers() {
        let mut f = vec![
            ("payload", "{}"),
            ("headers", r#"{"traceparent":"t","rsc-redrive-count":"2"}"#),
        ];
        f.extend(DL_FIELDS);
        let r = republish(&dl(&f), "g").unwrap();
        assert_eq!(names(&r), ["payload", "headers"]);
        assert_eq!(r.redrive_count, 3);
        let h = headers(&r);
        assert_eq!(
            (h["rsc-redrive-count"].as_str(), h["traceparent"].as_str()),
            ("3", "t")
        );
        assert_eq!(r.key, None);
        assert_eq!(r.shard(4, 6), 2, "round-robin without a key");
    }

    #[test]
    fn other_groups_and_unreadable_headers_are_not_redriven() {
        let mut f = vec![("payload", "{}")];
        f.extend(DL_FIELDS);
        assert!(republish(&dl(&f), "other").is_none());
        let mut bad = vec![("payload", "{}"), ("headers", "not json")];
        bad.extend(DL_FIELDS);
        assert!(republish(&dl(&bad), "g").is_none());
        assert!(
            republish(&dl(&[("payload", "{}")]), "g").is_none(),
            "no group field"
        );
    }

    #[test]
    fn exec_and_range_replies_are_read() {
        let ok = vec![
            Value::Okay,
            Value::Nil,
            Value::Okay,
            Value::SimpleString("QUEUED".into()),
            Value::Array(vec![Value::BulkString(b"1-0".to_vec()), Value::Int(0)]),
        ];
        assert_eq!(read_exec(ok, 1).unwrap(), Some(vec!["1-0".to_owned()]));
        let refused = vec![Value::Okay, Value::Int(3), Value::Okay, Value::Nil];
        assert_eq!(read_exec(refused, 1).unwrap(), None);
        let range = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"7-1".to_vec()),
            Value::Array(vec![
                Value::BulkString(b"payload".to_vec()),
                Value::BulkString(b"{}".to_vec()),
            ]),
        ])]);
        let page = parse_range(range).unwrap();
        assert_eq!(page[0].id, "7-1");
        assert_eq!(page[0].fields, [("payload".to_owned(), b"{}".to_vec())]);
    }
}
