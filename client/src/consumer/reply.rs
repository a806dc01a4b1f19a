//! Stream replies parsed with each entry's fields in the order Redis returned them (the
//! stream types of redis-rs keep fields in a `HashMap`, which loses the order a producer
//! wrote them in: a dead-letter copy would reorder them).
//!
//! Shapes, RESP2 and RESP3 alike: an entry is `[id, [field, value, …]]` (RESP3 may give the
//! fields as a map; an entry deleted while pending has `nil` fields); `XREADGROUP` answers
//! `[[key, [entry, …]], …]` (RESP3: a map of key to entries) or nil; `XAUTOCLAIM` answers
//! `[next-cursor, [entry, …], [deleted-id, …]]`.

use redis::{FromRedisValue, ParsingError, Value};

/// One entry: its id and its fields, in order (values as Redis sent them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OrderedId {
    pub(crate) id: String,
    pub(crate) map: Vec<(String, Value)>,
}

/// One key of an `XREADGROUP` reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OrderedKey {
    pub(crate) ids: Vec<OrderedId>,
}

/// An `XREADGROUP` / `XREAD` reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OrderedRead {
    pub(crate) keys: Vec<OrderedKey>,
}

/// An `XAUTOCLAIM` reply (entries deleted from the stream are left out, as Redis drops them
/// from the pending list itself).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OrderedClaim {
    pub(crate) next_stream_id: String,
    pub(crate) claimed: Vec<OrderedId>,
}

/// An `XRANGE` reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OrderedRange {
    pub(crate) ids: Vec<OrderedId>,
}

fn invalid(what: &str, v: &Value) -> ParsingError {
    format!("unexpected {what} in a stream reply: {v:?}").into()
}

fn text(v: Value) -> Result<String, ParsingError> {
    String::from_redis_value(v)
}

fn fields(v: Value) -> Result<Vec<(String, Value)>, ParsingError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(flat) => {
            let mut out = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let Some(name) = it.next() {
                let value = it.next().ok_or_else(|| invalid("odd field list", &name))?;
                out.push((text(name)?, value));
            }
            Ok(out)
        }
        Value::Map(pairs) => pairs.into_iter().map(|(k, v)| Ok((text(k)?, v))).collect(),
        other => Err(invalid("field list", &other)),
    }
}

/// The entries of a list, skipping `nil` items (deleted entries in some claim replies).
fn entries(v: Value) -> Result<Vec<OrderedId>, ParsingError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items
            .into_iter()
            .filter(|i| !matches!(i, Value::Nil))
            .map(|item| {
                let Value::Array(parts) = item else {
                    return Err(invalid("entry", &item));
                };
                let mut parts = parts.into_iter();
                let id = text(parts.next().ok_or_else(|| invalid("entry", &Value::Nil))?)?;
                let map = fields(parts.next().unwrap_or(Value::Nil))?;
                Ok(OrderedId { id, map })
            })
            .collect(),
        other => Err(invalid("entry list", &other)),
    }
}

impl FromRedisValue for OrderedRead {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let rows: Vec<Value> = match v {
            Value::Nil => Vec::new(),
            Value::Array(rows) => rows
                .into_iter()
                .map(|row| match row {
                    Value::Array(mut kv) if kv.len() == 2 => Ok(kv.pop().expect("two items")),
                    other => Err(invalid("key row", &other)),
                })
                .collect::<Result<_, _>>()?,
            Value::Map(pairs) => pairs.into_iter().map(|(_, v)| v).collect(),
            other => return Err(invalid("read reply", &other)),
        };
        let keys = rows
            .into_iter()
            .map(|v| Ok(OrderedKey { ids: entries(v)? }))
            .collect::<Result<_, ParsingError>>()?;
        Ok(OrderedRead { keys })
    }
}

impl FromRedisValue for OrderedRange {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(OrderedRange { ids: entries(v)? })
    }
}

impl FromRedisValue for OrderedClaim {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = v else {
            return Err(invalid("claim reply", &v));
        };
        let mut it = items.into_iter();
        let next_stream_id = text(
            it.next()
                .ok_or_else(|| invalid("claim reply", &Value::Nil))?,
        )?;
        let claimed = entries(it.next().unwrap_or(Value::Nil))?;
        Ok(OrderedClaim {
            next_stream_id,
            claimed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, kv: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(kv.iter().map(|s| bulk(s)).collect()),
        ])
    }

    #[test]
    fn read_replies_keep_field_order_in_resp2_and_resp3() {
        let e = entry("1-1", &["z", "1", "a", "2", "m", "3"]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("s:0"),
            Value::Array(vec![e.clone()]),
        ])]);
        let resp3 = Value::Map(vec![(bulk("s:0"), Value::Array(vec![e]))]);
        for v in [resp2, resp3] {
            let r = OrderedRead::from_redis_value(v).unwrap();
            let names: Vec<&str> = r.keys[0].ids[0]
                .map
                .iter()
                .map(|(k, _)| k.as_str())
                .collect();
            assert_eq!(names, ["z", "a", "m"]);
        }
        assert!(
            OrderedRead::from_redis_value(Value::Nil)
                .unwrap()
                .keys
                .is_empty()
        );
    }

    #[test]
    fn claim_replies_skip_deleted_entries_and_keep_nil_fields_empty() {
        let v = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("1-1", &["b", "1", "a", "2"]), Value::Nil]),
            Value::Array(vec![bulk("1-2")]),
        ]);
        let c = OrderedClaim::from_redis_value(v).unwrap();
        assert_eq!(c.next_stream_id, "0-0");
        assert_eq!(c.claimed.len(), 1);
        assert_eq!(c.claimed[0].map[0].0, "b");
        let deleted = Value::Array(vec![bulk("1-3"), Value::Nil]);
        let e = entries(Value::Array(vec![deleted])).unwrap();
        assert!(e[0].map.is_empty());
    }
}
