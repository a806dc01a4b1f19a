//! Strict fencing on the data path (PROTOCOL §5.6, docs/FENCING.md): reads, takeovers and acknowledgements are
//! made only while the member's owner token is the one in `{<shard key>}:owner:<group>`,
//! which the coordinator writes before it tells a member of a grant. A member whose shard
//! moved on (paused past its session, cut off from the coordinator) is refused by Redis
//! itself: its read returns no entry, its `XACK` does not land.
//!
//! - **Reads** are a `WATCH`ed transaction ([`Guard`]): `UNWATCH` + `WATCH owner` +
//!   `GET owner` to arm it, then per batch one round trip of `MULTI, XACK <previous batch>,
//!   XREADGROUP, XREVRANGE + - COUNT 1, EXEC, WATCH owner, GET owner`. The transaction runs
//!   only if the owner key was not written since the `GET` that showed our token; the
//!   trailing `WATCH` + `GET` arm the next one. Unlike a Lua script, Redis does not copy the
//!   entries into and out of a Lua interpreter, so a guarded read costs Redis about what a
//!   plain `XREADGROUP` does.
//! - **Where**: a `WATCH` is connection state, so a guarded read holds a connection for its
//!   round trip: one of the app's few guard connections ([`GuardConns`], shared by every
//!   strictly fenced shard of the process; per master on a Redis Cluster), or, with
//!   `shared_reader(false)`, the worker's own. Each
//!   connection records which guard armed it last ([`ArmedBy`]); a guard whose `WATCH` is not
//!   the last one armed there (another shard's read came in between, or the connection was
//!   replaced) arms again before its transaction, so a transaction never runs unwatched.
//! - **Takeovers and acknowledgements** outside a read are short Lua scripts (`EVALSHA`,
//!   loaded on `NOSCRIPT` by [`redis::Script`]).
//!
//! The owner key shares the shard key's cluster slot (hash tag), so each transaction or
//! script touches one slot.

mod guards;

pub(crate) use guards::GuardConns;

use super::reply::{OrderedClaim, OrderedId, OrderedRead};
use crate::data::NodeConn;
use crate::message::Origin;
use redis::aio::ConnectionLike;
use redis::streams::StreamRangeReply;
use redis::{RedisError, Script, Value};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

static ACK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/ack.lua")));
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/claim.lua")));

/// How many times a read is tried again when the owner key was written between the check
/// and the transaction and still holds our token (a repair writing the same token is not a
/// write: the coordinator's script leaves an equal token alone).
const WATCH_RETRIES: usize = 3;

/// What a guarded read found.
pub(crate) enum Read {
    /// The token is not the shard's any more.
    Fenced,
    /// Entries (pending for this member now), and the shard's seals read right after them
    /// when the read asked for them (ordered resharding, PROTOCOL §15).
    Entries(Vec<OrderedId>, Option<Seals>),
    /// Nothing; the stream's last entry id, to wake on (`XREAD BLOCK … <id>`).
    Idle(String),
}

/// The fields of a shard's seals hash (`HGETALL {<shard key>}:seals`).
pub(crate) type Seals = Vec<(String, String)>;

/// What a guarded read asks for: the acknowledgements sent first, then up to `count`
/// entries after `from`, and, with `seals`, the shard's seals read after the entries (so
/// they name every switch an entry read may follow: PROTOCOL §15).
#[derive(Clone, Copy)]
pub(crate) struct ReadAsk<'a> {
    pub(crate) acks: &'a [String],
    pub(crate) from: &'a str,
    pub(crate) count: usize,
    pub(crate) seals: bool,
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
        "unexpected guarded read reply",
        what.to_owned(),
    ))
}

fn server_error(v: &Value) -> Option<RedisError> {
    match v {
        Value::ServerError(e) => Some(e.clone().into()),
        _ => None,
    }
}

/// Which [`Guard`] armed the connection's `WATCH` last (`None`: none known, e.g. a new
/// connection or a round trip that did not complete). Kept beside the connection.
pub(crate) type ArmedBy = Option<u64>;

/// Names each [`Guard`] for [`ArmedBy`].
static GUARD_IDS: AtomicU64 = AtomicU64::new(1);

/// The guarded read of one shard worker: remembers on which connection a `WATCH` of the
/// owner key is armed with our token seen.
pub(crate) struct Guard {
    key: String,
    /// Unique in the process (see [`ArmedBy`]).
    id: u64,
    /// The [`NodeConn::generation`] whose `WATCH` saw our token last.
    armed: Option<u64>,
    /// The guard connection it used last ([`GuardConns`]), taken again when free.
    pub(crate) slot: Option<usize>,
}

impl Guard {
    pub(crate) fn new(origin: &Origin) -> Self {
        Guard {
            key: owner_key(origin),
            id: GUARD_IDS.fetch_add(1, Ordering::Relaxed),
            armed: None,
            slot: None,
        }
    }

    /// Whether our `WATCH` is the one armed on `conn`, with our token seen.
    fn is_armed(&self, conn: &NodeConn, armed_by: ArmedBy) -> bool {
        self.armed == Some(conn.generation()) && armed_by == Some(self.id)
    }

    /// `UNWATCH` (another guard's `WATCH` may be armed here) + `WATCH owner` + `GET owner`;
    /// `true` when the token is ours (the watch is then armed).
    async fn arm(
        &mut self,
        conn: &mut NodeConn,
        armed_by: &mut ArmedBy,
        token: &str,
    ) -> Result<bool, RedisError> {
        self.armed = None;
        *armed_by = None;
        let mut pipe = redis::pipe();
        pipe.cmd("UNWATCH").ignore();
        pipe.cmd("WATCH").arg(&self.key).ignore();
        pipe.cmd("GET").arg(&self.key);
        let (current,): (Option<String>,) = pipe.query_async(conn).await?;
        *armed_by = Some(self.id);
        let ours = current.as_deref() == Some(token);
        if ours {
            self.armed = Some(conn.generation());
        }
        Ok(ours)
    }

    /// Acknowledges `acks`, then reads up to `count` entries after `from` (`>`: new ones;
    /// an id: this member's own pending ones), if `token` is the shard's. `armed_by` is the
    /// connection's (see [`ArmedBy`]).
    pub(crate) async fn read(
        &mut self,
        conn: &mut NodeConn,
        armed_by: &mut ArmedBy,
        origin: &Origin,
        token: &str,
        ask: ReadAsk<'_>,
    ) -> Result<Read, RedisError> {
        for _ in 0..WATCH_RETRIES {
            if !self.is_armed(conn, *armed_by) && !self.arm(conn, armed_by, token).await? {
                refused("read", origin);
                return Ok(Read::Fenced);
            }
            let generation = conn.generation();
            let pipe = self.transaction(origin, ask);
            self.armed = None;
            *armed_by = None;
            let Some(values) = conn.pipeline_on(generation, &pipe).await? else {
                continue; // the connection of the WATCH is gone: arm a new one
            };
            if values.len() != pipe.len() {
                return Err(unexpected("reply count"));
            }
            // The trailing `WATCH owner` is the connection's last one now.
            *armed_by = Some(self.id);
            match self.answer(values, generation, token, ask)? {
                Some(read) => return Ok(read),
                // The owner key was written since it was checked: check it again.
                None => continue,
            }
        }
        Err(unexpected("the owner key keeps changing"))
    }

    /// `MULTI, [XACK acks], XREADGROUP, XREVRANGE + - COUNT 1, [HGETALL seals], EXEC, WATCH
    /// owner, GET owner`.
    fn transaction(&self, origin: &Origin, ask: ReadAsk<'_>) -> redis::Pipeline {
        let ReadAsk {
            acks, from, count, ..
        } = ask;
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI");
        if !acks.is_empty() {
            pipe.cmd("XACK")
                .arg(&origin.shard_key)
                .arg(&origin.group)
                .arg(acks);
        }
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&origin.group)
            .arg(&origin.member_id)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&origin.shard_key)
            .arg(from);
        pipe.cmd("XREVRANGE")
            .arg(&origin.shard_key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
        if ask.seals {
            pipe.cmd("HGETALL")
                .arg(rsc_protocol::routing::seals_key(&origin.shard_key));
        }
        pipe.cmd("EXEC");
        pipe.cmd("WATCH").arg(&self.key);
        pipe.cmd("GET").arg(&self.key);
        pipe
    }

    /// The [`Self::transaction`]'s replies: arms the next read when the trailing `GET` shows
    /// `token`; `None` when the transaction did not run (the owner key was written).
    fn answer(
        &mut self,
        mut values: Vec<Value>,
        generation: u64,
        token: &str,
        ask: ReadAsk<'_>,
    ) -> Result<Option<Read>, RedisError> {
        let current = values.pop().and_then(|v| status(&v));
        if current.as_deref() == Some(token) {
            self.armed = Some(generation);
        }
        values.pop(); // WATCH
        let exec = values.pop().unwrap_or(Value::Nil);
        if let Some(e) = values.iter().find_map(server_error) {
            // MULTI or a queued command was refused (e.g. MOVED, after which the
            // connection follows the redirection).
            return Err(e);
        }
        match exec {
            Value::Nil => Ok(None),
            Value::Array(items) => exec_read(items, ask).map(Some),
            other => Err(server_error(&other).unwrap_or_else(|| unexpected("EXEC"))),
        }
    }
}

/// What the `EXEC` of a guarded read returned: the `XREADGROUP` reply (after the `XACK`'s,
/// when the ask had some), the stream's last entry and, when asked, the seals.
fn exec_read(items: Vec<Value>, ask: ReadAsk<'_>) -> Result<Read, RedisError> {
    let mut items = items.into_iter().skip(usize::from(!ask.acks.is_empty()));
    let (Some(read), Some(last)) = (items.next(), items.next()) else {
        return Err(unexpected("EXEC reply count"));
    };
    let seals = match (ask.seals, items.next()) {
        (false, _) => None,
        (true, Some(v)) => Some(redis::from_redis_value::<Seals>(v)?),
        (true, None) => return Err(unexpected("EXEC reply count")),
    };
    if let Some(e) = server_error(&read) {
        return Err(e); // e.g. NOGROUP
    }
    let read: Option<OrderedRead> = redis::from_redis_value(read)?;
    let entries: Vec<OrderedId> = read
        .into_iter()
        .flat_map(|r| r.keys)
        .flat_map(|k| k.ids)
        .collect();
    if !entries.is_empty() {
        return Ok(Read::Entries(entries, seals));
    }
    let last: StreamRangeReply = redis::from_redis_value(last)?;
    Ok(Read::Idle(
        last.ids
            .into_iter()
            .next()
            .map_or_else(|| "0-0".to_owned(), |e| e.id),
    ))
}

/// Acknowledges `ids` if `token` is the shard's; `false` when refused.
pub(crate) async fn ack(
    conn: &mut (impl ConnectionLike + Send),
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
    conn: &mut (impl ConnectionLike + Send),
    origin: &Origin,
    token: &str,
    cursor: &str,
    count: usize,
) -> Result<Option<OrderedClaim>, RedisError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(s: &str) -> Value {
        redis::parse_redis_value(s.as_bytes()).expect("resp")
    }

    /// `XREADGROUP` reply: one entry `1-1` of `s:0`.
    const READ: &str =
        "*1\r\n*2\r\n$3\r\ns:0\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nk\r\n$1\r\nv\r\n";
    const LAST: &str = "*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nk\r\n$1\r\nv\r\n";
    const SEALS: &str = "*2\r\n$1\r\n7\r\n$5\r\n0-9/2\r\n";

    fn ask(acks: &[String], seals: bool) -> ReadAsk<'_> {
        ReadAsk {
            acks,
            from: ">",
            count: 64,
            seals,
        }
    }

    #[test]
    fn a_read_that_asked_for_the_seals_answers_them_with_its_entries() {
        let acks = ["1-0".to_owned()];
        let items = vec![resp(":1\r\n"), resp(READ), resp(LAST), resp(SEALS)];
        let Read::Entries(ids, seals) = exec_read(items, ask(&acks, true)).expect("read") else {
            panic!("entries expected");
        };
        assert_eq!(ids.len(), 1);
        assert_eq!(seals, Some(vec![("7".to_owned(), "0-9/2".to_owned())]));
    }

    #[test]
    fn a_read_without_the_seals_answers_none_and_a_missing_seals_reply_is_an_error() {
        let items = vec![resp(READ), resp(LAST)];
        let Read::Entries(_, seals) = exec_read(items.clone(), ask(&[], false)).expect("read")
        else {
            panic!("entries expected");
        };
        assert_eq!(seals, None);
        assert!(exec_read(items, ask(&[], true)).is_err());
    }

    #[test]
    fn an_empty_seals_hash_is_no_switch() {
        let items = vec![resp(READ), resp(LAST), resp("*0\r\n")];
        let Read::Entries(_, seals) = exec_read(items, ask(&[], true)).expect("read") else {
            panic!("entries expected");
        };
        assert_eq!(seals, Some(vec![]));
    }
}
