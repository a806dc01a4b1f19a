//! Strict fencing on the data path (issue 10): reads, takeovers and acknowledgements go
//! through Lua scripts that first compare the member's owner token with
//! `{<shard key>}:owner:<group>`, which the coordinator writes before it tells a member of a
//! grant. A member whose shard moved on (paused past its session, cut off from the
//! coordinator) is refused by Redis itself: its read returns no entry, its `XACK` does not land.
//!
//! Scripts run with `EVALSHA` and are loaded on `NOSCRIPT` ([`redis::Script`]). The owner key
//! shares the shard key's cluster slot (hash tag), so each script touches one slot.

use crate::message::Origin;
use redis::aio::ConnectionManager;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::{RedisError, Script, Value};
use std::sync::LazyLock;

static READ: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/read.lua")));
static ACK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/ack.lua")));
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/claim.lua")));

/// What a guarded read found.
pub(crate) enum Read {
    /// The token is not the shard's any more.
    Fenced,
    /// New entries (now pending for this member).
    Entries(Vec<StreamId>),
    /// Nothing new; the stream's last entry id, to wake on (`XREAD BLOCK … <id>`).
    Idle(String),
}

fn owner_key(origin: &Origin) -> String {
    rsc_protocol::routing::owner_key(&origin.shard_key, &origin.group)
}

fn refused(op: &'static str, origin: &Origin) {
    metrics::counter!("rsc_client_fencing_refusals_total", "group" => origin.group.clone(),
        "op" => op)
    .increment(1);
}

fn status(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn unexpected(what: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Client,
        "unexpected guarded script reply",
        what.to_owned(),
    ))
}

/// Acknowledges `acks`, then reads up to `count` new entries, if `token` is the shard's.
pub(crate) async fn read(
    conn: &mut ConnectionManager,
    origin: &Origin,
    token: &str,
    acks: &[String],
    count: usize,
) -> Result<Read, RedisError> {
    let mut inv = READ.prepare_invoke();
    inv.key(owner_key(origin))
        .key(&origin.shard_key)
        .arg(token)
        .arg(&origin.group)
        .arg(&origin.member_id)
        .arg(count);
    for id in acks {
        inv.arg(id);
    }
    let reply: Vec<Value> = inv.invoke_async(conn).await?;
    let mut it = reply.into_iter();
    let head = it.next().as_ref().and_then(status);
    match head.as_deref() {
        Some("fenced") => {
            refused("read", origin);
            Ok(Read::Fenced)
        }
        Some("entries") => {
            let v = it
                .next()
                .ok_or_else(|| unexpected("entries without a body"))?;
            let r: StreamReadReply = redis::from_redis_value(v)?;
            Ok(Read::Entries(
                r.keys.into_iter().flat_map(|k| k.ids).collect(),
            ))
        }
        Some("idle") => Ok(Read::Idle(
            it.next()
                .as_ref()
                .and_then(status)
                .unwrap_or_else(|| "0-0".to_owned()),
        )),
        _ => Err(unexpected("unknown status")),
    }
}

/// Acknowledges `ids` if `token` is the shard's; `false` when refused.
pub(crate) async fn ack(
    conn: &mut ConnectionManager,
    origin: &Origin,
    token: &str,
    ids: &[String],
) -> Result<bool, RedisError> {
    let mut inv = ACK.prepare_invoke();
    inv.key(owner_key(origin))
        .key(&origin.shard_key)
        .arg(token)
        .arg(&origin.group);
    for id in ids {
        inv.arg(id);
    }
    let n: i64 = inv.invoke_async(conn).await?;
    if n < 0 {
        refused("ack", origin);
    }
    Ok(n >= 0)
}

/// `XAUTOCLAIM … 0 <cursor> COUNT <count>` if `token` is the shard's; `None` when refused.
pub(crate) async fn claim(
    conn: &mut ConnectionManager,
    origin: &Origin,
    token: &str,
    cursor: &str,
    count: usize,
) -> Result<Option<StreamAutoClaimReply>, RedisError> {
    let reply: Vec<Value> = CLAIM
        .key(owner_key(origin))
        .key(&origin.shard_key)
        .arg(token)
        .arg(&origin.group)
        .arg(&origin.member_id)
        .arg(cursor)
        .arg(count)
        .invoke_async(conn)
        .await?;
    let mut it = reply.into_iter();
    match it.next().as_ref().and_then(status).as_deref() {
        Some("fenced") => {
            refused("claim", origin);
            Ok(None)
        }
        Some("claimed") => {
            let v = it
                .next()
                .ok_or_else(|| unexpected("claim without a body"))?;
            Ok(Some(redis::from_redis_value(v)?))
        }
        _ => Err(unexpected("unknown status")),
    }
}
