//! The depth of each group's dead letters and the age of its oldest (PROTOCOL §7:
//! `rsc_dlq_entries`, `rsc_dlq_oldest_age_seconds`; PROTOCOL §18), kept per stream by
//! counting `<stream>:dlq` once and then only what changed.
//!
//! One `XINFO STREAM` tells whether the dead-letter stream changed since the last count (its
//! length, first entry, entries ever added and last deletion): unchanged, nothing more is
//! read; only appended to (Redis 7: `entries-added` grew by exactly the length's growth, the
//! first entry and the last deletion unchanged), only the new dead letters are counted;
//! anything else (a purge, a redrive, a trim) counts it again from the start. Counting runs
//! on the server ([`TALLY_LUA`]: only the counts cross the network), [`CHUNK`] dead letters
//! per call, at most [`MAX_COUNTED`] per refresh (a larger backlog is finished by the next
//! refreshes). A stream is refreshed at most once per second (as the lag in views),
//! however many scrapes, dashboards and lists ask: while nothing changes, a stream costs the
//! data Redis one `XINFO STREAM` per second at most, and none when nobody asks.

use super::id_ms;
use redis::Value;
use rsc_protocol::{DlqGroupDepth, routing};
use rsc_redis::Conn;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// The server-side count of a range of a dead-letter stream (see the script's comment).
const TALLY_LUA: &str = include_str!("tally.lua");
/// Dead letters counted per script call.
const CHUNK: u64 = 5_000;
/// Dead letters counted per refresh at most.
const MAX_COUNTED: u64 = 1_000_000;

/// What `XINFO STREAM` tells of a dead-letter stream, enough to know how it changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Entries in it (0 also when the key does not exist).
    pub length: u64,
    /// Its first entry's id.
    pub first_id: Option<String>,
    /// Entries ever added (`entries-added`, Redis 7).
    pub entries_added: Option<u64>,
    /// The id of the last deleted entry (`max-deleted-entry-id`, Redis 7).
    pub max_deleted: Option<String>,
}

/// What to count at a refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing: the counts stand.
    Keep,
    /// The dead letters after this id, added to the counts.
    After(String),
    /// Everything, from the start.
    Full,
}

/// The counts of one dead-letter stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    stamp: Option<Stamp>,
    /// The last dead letter counted.
    tail: Option<String>,
    /// Whether the count reached the end at `stamp`.
    complete: bool,
    /// Per group: dead letters and the oldest one's id.
    groups: BTreeMap<String, (u64, String)>,
    read_at: Option<Instant>,
}

/// Whether `new` differs from `old` only by entries appended.
fn appended_only(old: &Stamp, new: &Stamp) -> bool {
    match (old.entries_added, new.entries_added) {
        (Some(a), Some(b)) => {
            old.first_id == new.first_id
                && old.max_deleted == new.max_deleted
                && b >= a
                && new.length >= old.length
                && new.length - old.length == b - a
        }
        _ => false,
    }
}

impl Tally {
    /// What to count now that the stream reads `new`.
    pub(crate) fn plan(&self, new: &Stamp) -> Plan {
        match (&self.stamp, &self.tail) {
            (Some(old), _) if old == new && self.complete => Plan::Keep,
            (Some(old), Some(tail)) if old == new || appended_only(old, new) => {
                Plan::After(tail.clone())
            }
            _ => Plan::Full,
        }
    }

    /// The counts start again (before a [`Plan::Full`]).
    pub(crate) fn reset(&mut self) {
        self.groups.clear();
        self.tail = None;
        self.complete = false;
    }

    /// `n` more dead letters of `group`, the first of them `first`.
    pub(crate) fn add(&mut self, group: &str, n: u64, first: &str) {
        let e = self
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| (0, first.to_owned()));
        e.0 += n;
    }

    /// The count reached `tail` (complete when it reached the end) for `stamp`.
    pub(crate) fn counted(&mut self, stamp: Stamp, tail: Option<String>, complete: bool) {
        self.stamp = Some(stamp);
        if tail.is_some() {
            self.tail = tail;
        }
        self.complete = complete;
    }

    /// Dead letters per group, with the oldest one's time.
    pub(crate) fn depths(&self) -> Vec<DlqGroupDepth> {
        self.groups
            .iter()
            .map(|(g, (n, first))| DlqGroupDepth {
                group: g.clone(),
                entries: *n,
                oldest_ms: id_ms(first),
            })
            .collect()
    }
}

/// The tallies of every dead-letter stream asked about, each refreshed at most once per
/// `max_age`.
#[derive(Debug)]
pub(crate) struct DepthCache {
    max_age: Duration,
    tallies: tokio::sync::Mutex<HashMap<String, Tally>>,
}

impl DepthCache {
    /// Tallies refreshed at most once per `max_age`.
    pub(crate) fn new(max_age: Duration) -> Self {
        DepthCache {
            max_age,
            tallies: tokio::sync::Mutex::default(),
        }
    }

    /// Dead letters per group of `stream`'s dead-letter stream (groups without any are
    /// absent), refreshed through `conn` when older than `max_age`.
    pub(crate) async fn depths(
        &self,
        conn: &mut Conn,
        stream: &str,
    ) -> redis::RedisResult<Vec<DlqGroupDepth>> {
        let mut tallies = self.tallies.lock().await;
        let tally = tallies.entry(stream.to_owned()).or_default();
        let now = Instant::now();
        if tally
            .read_at
            .is_none_or(|t| now.duration_since(t) >= self.max_age)
        {
            refresh(conn, &routing::dlq_key(stream), tally).await?;
            tally.read_at = Some(now);
        }
        Ok(tally.depths())
    }

    /// Forgets the counts of `stream` (its dead letters were deleted here): the next ask
    /// reads it again at once.
    pub(crate) async fn forget(&self, stream: &str) {
        self.tallies.lock().await.remove(stream);
    }
}

/// Reads `key`'s stamp and counts what [`Tally::plan`] says into `tally`.
async fn refresh(conn: &mut Conn, key: &str, tally: &mut Tally) -> redis::RedisResult<()> {
    let stamp = read_stamp(conn, key).await?;
    let mut start = match tally.plan(&stamp) {
        Plan::Keep => return Ok(()),
        Plan::After(id) => format!("({id}"),
        Plan::Full => {
            tally.reset();
            "-".to_owned()
        }
    };
    if stamp.length == 0 {
        tally.counted(stamp, None, true);
        return Ok(());
    }
    let script = redis::Script::new(TALLY_LUA);
    let (mut counted, mut tail) = (0, None);
    let complete = loop {
        let reply: Vec<Value> = script
            .key(key)
            .arg(&start)
            .arg(CHUNK)
            .invoke_async(conn)
            .await?;
        let (n, last) = apply(tally, &reply)?;
        counted += n;
        if n > 0 {
            start = format!("({last}");
            tail = Some(last);
        }
        if n < CHUNK {
            break true;
        }
        if counted >= MAX_COUNTED {
            break false;
        }
    };
    tally.counted(stamp, tail, complete);
    Ok(())
}

/// Adds one script reply to `tally`: how many it read and the last id.
fn apply(tally: &mut Tally, reply: &[Value]) -> redis::RedisResult<(u64, String)> {
    let bad = || {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "dead-letter tally: unexpected reply",
        ))
    };
    let [n, last, rest @ ..] = reply else {
        return Err(bad());
    };
    let n: u64 = redis::from_redis_value(n.clone())?;
    let last: String = redis::from_redis_value(last.clone())?;
    for g in rest.chunks(3) {
        let [group, count, first] = g else {
            return Err(bad());
        };
        let group: String = redis::from_redis_value(group.clone())?;
        let count: u64 = redis::from_redis_value(count.clone())?;
        let first: String = redis::from_redis_value(first.clone())?;
        tally.add(&group, count, &first);
    }
    Ok((n, last))
}

/// `XINFO STREAM key`: a missing key reads as empty.
async fn read_stamp(conn: &mut Conn, key: &str) -> redis::RedisResult<Stamp> {
    let reply: redis::RedisResult<Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query_async(conn)
        .await;
    let reply = match reply {
        Ok(v) => v,
        Err(e) if e.to_string().contains("no such key") => return Ok(Stamp::default()),
        Err(e) => return Err(e),
    };
    let pairs: Vec<(String, Value)> = match reply {
        Value::Map(m) => m
            .into_iter()
            .filter_map(|(k, v)| Some((redis::from_redis_value(k).ok()?, v)))
            .collect(),
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|c| Some((redis::from_redis_value(c[0].clone()).ok()?, c[1].clone())))
            .collect(),
        _ => Vec::new(),
    };
    let mut stamp = Stamp::default();
    for (name, v) in pairs {
        match name.as_str() {
            "length" => stamp.length = redis::from_redis_value(v).unwrap_or(0),
            "entries-added" => stamp.entries_added = redis::from_redis_value(v).ok(),
            "max-deleted-entry-id" => stamp.max_deleted = redis::from_redis_value(v).ok(),
            "first-entry" => {
                if let Value::Array(mut e) = v
                    && !e.is_empty()
                {
                    stamp.first_id = redis::from_redis_value(e.swap_remove(0)).ok();
                }
            }
            _ => {}
        }
    }
    Ok(stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(length: u64, first: &str, added: u64, deleted: &str) -> Stamp {
        Stamp {
            length,
            first_id: Some(first.into()),
            entries_added: Some(added),
            max_deleted: Some(deleted.into()),
        }
    }

    #[test]
    fn only_appends_are_counted_on_top_others_count_again() {
        let mut t = Tally::default();
        let s1 = stamp(2, "1-0", 2, "0-0");
        assert_eq!(t.plan(&s1), Plan::Full);
        t.reset();
        t.add("a", 1, "1-0");
        t.add("b", 1, "2-0");
        t.counted(s1.clone(), Some("2-0".into()), true);
        assert_eq!(t.plan(&s1), Plan::Keep, "unchanged: nothing read");
        let appended = stamp(3, "1-0", 3, "0-0");
        assert_eq!(t.plan(&appended), Plan::After("2-0".into()));
        t.add("a", 1, "3-0");
        t.counted(appended.clone(), Some("3-0".into()), true);
        let d = t.depths();
        assert_eq!(
            (d[0].group.as_str(), d[0].entries, d[0].oldest_ms),
            ("a", 2, Some(1))
        );
        assert_eq!((d[1].group.as_str(), d[1].entries), ("b", 1));
        // A deletion (purge, redrive), a trim of the head, or Redis 6 (no entries-added).
        assert_eq!(t.plan(&stamp(2, "1-0", 3, "2-0")), Plan::Full);
        assert_eq!(t.plan(&stamp(2, "2-0", 3, "0-0")), Plan::Full);
        let old_redis = Stamp {
            entries_added: None,
            max_deleted: None,
            ..appended.clone()
        };
        t.counted(old_redis.clone(), None, true);
        assert_eq!(
            t.plan(&Stamp {
                length: 4,
                ..old_redis
            }),
            Plan::Full
        );
    }

    #[test]
    fn an_unfinished_count_goes_on_from_where_it_stopped() {
        let mut t = Tally::default();
        let s = stamp(10, "1-0", 10, "0-0");
        t.add("a", 5, "1-0");
        t.counted(s.clone(), Some("5-0".into()), false);
        assert_eq!(t.plan(&s), Plan::After("5-0".into()));
    }
}
