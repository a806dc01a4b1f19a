//! The producer's guarded write (PROTOCOL §15, §21): one transaction per batch on a standalone
//! Redis, one per shard on a Redis Cluster, each sent as one pipeline
//! `WATCH <markers> [<records>] <abort>; EVAL <check> …; MULTI; XADD …; EVAL <tail> …; EXEC
//! [; WAIT]`.
//!
//! The check, before `MULTI`, refuses a stale routing epoch and finds the records that an
//! earlier attempt of an idempotent producer wrote; in either case it touches a watched key,
//! which aborts the transaction. The entry ids of such records are then read by another
//! script (`publish_landed.lua`), in that retry only. The `XADD`s
//! run natively inside `MULTI`. The tail, queued after them, records the last sequence
//! written in each producer record and rings the doorbells; queued with the check's keys, it
//! is refused at queueing time (and the whole transaction with it, `EXECABORT`) wherever an
//! ACL refuses the check, so a write never runs unchecked. `EVAL` rather than `EVALSHA` for
//! both: a `NOSCRIPT` of the check would let the transaction run unchecked.
//!
//! Fail closed: the check runs under `pcall`; on any error (a marker or producer record of
//! the wrong type, a write refused inside it, a Lua error) it sets and deletes the abort key
//! `{<first shard key>}:publish-abort` (watched, in the transaction's slot, never holding a
//! value; no user key is written), which aborts the transaction, and answers the error
//! naming the key: the publish fails with it and nothing is written ([`read`]).
//!
//! Order (PROTOCOL §21 "Several publishes in flight"): an idempotent write also passes, per
//! shard, `prev`, where the producer record must end for the write to follow the lane's
//! earlier ones; a record elsewhere, with an earlier publish of the lane still unsettled
//! there, refuses the write for order (the abort key is touched, nothing written; the shard
//! answers −2) and the publish goes again once the earlier ones settled.
//!
//! Losses (PROTOCOL §21 "Across a failover"): an idempotent write also passes, per shard, the
//! last sequence the lane knows it wrote there (0 when it wrote nothing there within the
//! records' idle expiry less a margin, so an expired record is not taken for a loss). A record
//! not at it, with nothing of the lane in flight before the write there, means writes reported published are gone (a failover without `WAIT` rolled them
//! back, or the record was deleted); the check then answers `{'behind', s…}` instead of nil,
//! touches no key, and the transaction runs; the producer reports the range. Not detected: a
//! loss on a shard the lane never writes again, one of an earlier producer id (a restarted
//! process), and one found by a write whose reply is lost in turn (its retry meets the record
//! the lost write set).
//!
//! Races: the markers are watched, so a reshard between the check and the `EXEC` aborts the
//! transaction; so is the producer record of an idempotent write, so two attempts of one
//! publish that overlap in Redis (a reply lost while the first attempt still travels) cannot
//! both pass the check: the first `EXEC` writes the record and aborts the other. Producers of
//! other ids watch other records and never abort each other. The publishes of one id in
//! flight are pipelined on one connection, each transaction written as one buffer (a redis-rs
//! pipeline), so each `WATCH … EXEC` runs whole before the next one's `WATCH`.

use super::routing::Routing;
use super::{LaneIds, Published, Record};
use redis::Value;
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// One shard's records of a write: the shard and the record indices, in order.
pub(super) type Part = (u32, Vec<usize>);

/// What became of the records of a write.
#[derive(Debug)]
pub(super) struct Outcome {
    /// Written now, or found written by an earlier attempt: where.
    pub(super) written: Vec<(usize, Published)>,
    /// Refused for a stale routing epoch (nothing written), with the marker that refused.
    pub(super) refused: Vec<(usize, u64)>,
    /// Not written: their transaction was aborted after its check passed (a watched key
    /// changed in between); sending them again is safe.
    pub(super) again: Vec<usize>,
    /// How many replicas confirmed (`WAIT`; the fewest, `u32::MAX` without it).
    pub(super) acked: u32,
    /// Shards whose producer record a transaction that ran found behind what the lane knows
    /// it wrote there: (shard, the record's `s`, the lane's highest sequence written there).
    pub(super) lost: Vec<(u32, u64, u64)>,
    /// When the attempt was sent (no later than its writes).
    pub(super) sent: Instant,
}

impl Outcome {
    /// Nothing written yet, for an attempt sent now.
    pub(super) fn new() -> Self {
        Outcome {
            written: Vec::new(),
            refused: Vec::new(),
            again: Vec::new(),
            acked: u32::MAX,
            lost: Vec::new(),
            sent: Instant::now(),
        }
    }
}

/// The answer of one transaction for one of its shards.
#[derive(Debug)]
pub(super) struct ShardAnswer {
    /// The epoch marker that refused the shard's records (0: none).
    pub(super) marker: u64,
    /// The shard's records were written by an earlier attempt (one that started at this
    /// sequence; their ids still to read, [`Writer::landed_pipeline`]).
    pub(super) landed: Option<u64>,
    /// Refused for order: the shard's producer record does not end where this write
    /// follows on (an earlier publish of the lane is missing there, PROTOCOL §21); nothing
    /// written.
    pub(super) order: bool,
    /// Each record's entry id, in order; `None`: not written (or not read yet).
    pub(super) ids: Vec<Option<String>>,
    /// The check passed but found the shard's producer record behind the sequence the lane
    /// knows it wrote there: the record's `s` (0: no record). Only in a transaction that ran.
    pub(super) behind: Option<u64>,
}

/// Builds and reads the transactions of one attempt.
pub(super) struct Writer<'a> {
    pub(super) routing: &'a Routing,
    pub(super) records: &'a [Record],
    /// The producer id and sequences of an idempotent producer.
    pub(super) lane: Option<&'a LaneIds>,
    /// The producer records' idle expiry (ms).
    pub(super) ttl_ms: u64,
    /// An idempotent producer also writes `producer_id` and `producer_seq` in every entry
    /// ([`super::ProducerBuilder::producer_fields`]); the duplicate check never needs them.
    pub(super) fields: bool,
    /// A Redis Cluster: the doorbells are rung with `SPUBLISH` (PROTOCOL §16).
    pub(super) cluster: bool,
    /// `WAIT` after the transaction: (replicas, timeout).
    pub(super) wait: Option<(u32, Duration)>,
    /// How many writes each producer record names (the producer's publishes in flight,
    /// PROTOCOL §21): a retry finds its write among them.
    pub(super) history: usize,
}

impl Writer<'_> {
    /// The keys of the check and the tail over `parts`: the markers, then, for an idempotent
    /// producer, the producer records, then the abort key in the first shard's slot (one
    /// transaction has all its keys in one slot on a Redis Cluster).
    fn keys(&self, parts: &[Part]) -> Vec<String> {
        let shard_key = |s: u32| &self.routing.shard_keys[s as usize];
        let mut keys: Vec<String> = (parts.iter())
            .map(|(s, _)| rsc_protocol::routing::epoch_key(shard_key(*s)))
            .collect();
        if let Some(lane) = self.lane {
            keys.extend(
                (parts.iter())
                    .map(|(s, _)| rsc_protocol::routing::producer_key(shard_key(*s), &lane.id)),
            );
        }
        if let Some((s, _)) = parts.first() {
            keys.push(rsc_protocol::routing::publish_abort_key(shard_key(*s)));
        }
        keys
    }

    /// `EVAL <landed> 2 <shard key> <record> <producer id> <ttl> <seq>…` for each part
    /// `(shard, record indices)`: the entry ids of records an earlier attempt wrote.
    pub(super) fn landed_pipeline<'p>(
        &self,
        parts: impl IntoIterator<Item = (u32, &'p [usize])>,
    ) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        let Some(lane) = self.lane else {
            return pipe;
        };
        for (shard, idx) in parts {
            let shard_key = &self.routing.shard_keys[shard as usize];
            let cmd = pipe.cmd("EVAL").arg(landed_body()).arg(2).arg(shard_key);
            cmd.arg(rsc_protocol::routing::producer_key(shard_key, &lane.id))
                .arg(&lane.id)
                .arg(self.ttl_ms);
            for &i in idx {
                cmd.arg(lane.seqs[i]);
            }
        }
        pipe
    }

    /// The pipeline of one transaction writing `parts`.
    pub(super) fn pipeline(&self, parts: &[Part]) -> redis::Pipeline {
        let keys = self.keys(parts);
        let mut pipe = redis::pipe();
        pipe.cmd("WATCH").arg(&keys);
        let check = pipe
            .cmd("EVAL")
            .arg(check_body())
            .arg(keys.len())
            .arg(&keys);
        check
            .arg(self.routing.routing_epoch)
            .arg(self.lane.map_or("", |l| l.id.as_str()));
        if let Some(lane) = self.lane {
            for (_, idx) in parts {
                check.arg(idx.first().map_or(0, |&i| lane.seqs[i]));
            }
            for (shard, _) in parts {
                check.arg(lane.known_on(&self.routing.shard_keys[*shard as usize]));
            }
            for (shard, _) in parts {
                check.arg(lane.prev_on(&self.routing.shard_keys[*shard as usize]));
            }
        }
        pipe.cmd("MULTI");
        for (shard, idx) in parts {
            let shard_key = &self.routing.shard_keys[*shard as usize];
            for &i in idx {
                let idem = (self.lane.filter(|_| self.fields)).map(|l| (l.id.as_str(), l.seqs[i]));
                self.records[i].xadd(&mut pipe, shard_key, idem);
            }
        }
        let shard_keys = (parts.iter()).map(|(s, _)| &self.routing.shard_keys[*s as usize]);
        let tail_keys = keys.len() + self.lane.map_or(0, |_| parts.len());
        let tail = pipe.cmd("EVAL").arg(tail_body()).arg(tail_keys).arg(&keys);
        if self.lane.is_some() {
            for key in shard_keys {
                tail.arg(key);
            }
        }
        tail.arg(self.ttl_ms)
            .arg(parts.len())
            .arg(rsc_protocol::routing::ring_command(self.cluster));
        if let Some(lane) = self.lane {
            for (_, idx) in parts {
                tail.arg(idx.last().map_or(0, |&i| lane.seqs[i]))
                    .arg(idx.first().map_or(0, |&i| lane.seqs[i]))
                    .arg(idx.len());
            }
            tail.arg(self.history.max(1));
        }
        for (shard, _) in parts {
            let shard_key = &self.routing.shard_keys[*shard as usize];
            tail.arg(rsc_protocol::routing::ring_channel(shard_key));
        }
        pipe.cmd("EXEC");
        if let Some((replicas, timeout)) = self.wait {
            pipe.cmd("WAIT")
                .arg(replicas)
                .arg(timeout.as_millis() as u64);
        }
        pipe
    }
}

/// Reads the replies of [`Writer::pipeline`] over `parts`: `OK, <check>, OK, QUEUED × (n + 1),
/// <EXEC> [, <WAIT>]`. Each part's answer, and how many replicas confirmed (`u32::MAX`
/// without `WAIT`). A server error anywhere fails the write: the check's first (its own
/// failure, which aborted the transaction; an ACL refusal names itself there), else the first
/// of the `WATCH`, the queueing or the `EXEC`.
pub(super) fn read(
    mut values: Vec<Value>,
    parts: &[Part],
    wait: bool,
) -> redis::RedisResult<(Vec<ShardAnswer>, u32)> {
    let acked = if wait {
        match values.pop() {
            Some(Value::Int(k)) => k.max(0) as u32,
            _ => 0,
        }
    } else {
        u32::MAX
    };
    let n: usize = parts.iter().map(|(_, idx)| idx.len()).sum();
    if values.len() != n + 5 {
        return Err(unexpected("publish: unexpected number of replies", &values));
    }
    let exec = values.pop().unwrap_or(Value::Nil);
    if let Value::ServerError(e) = &values[1] {
        // A check that ran and failed aborted the transaction (`EXEC` nil); one refused before
        // it ran (ACL, `BUSY`, `LOADING`) has its `XADD`s refused too (`EXECABORT`). Only a
        // refusal whose cause ended between the check and the `XADD`s (a busy script that
        // finished, a load that completed, within one pipeline) lets them run: still an error.
        if matches!(exec, Value::Array(_)) {
            warn!(error = ?e, "the publish check was refused before it ran, the XADDs ran: written unchecked");
        }
        return Err(e.clone().into());
    }
    if let Some(Value::ServerError(e)) = values.iter().find(|v| matches!(v, Value::ServerError(_)))
    {
        return Err(e.clone().into());
    }
    let answers = match (exec, passed(&values[1], parts.len())?) {
        (Value::Array(replies), Some(behind)) => executed(replies, parts, behind)?,
        (Value::Nil, Some(_)) => aborted(&Value::Nil, parts)?,
        (Value::Nil, None) => aborted(&values[1], parts)?,
        (Value::ServerError(e), _) => return Err(e.into()),
        (other, _) => return Err(unexpected("publish: unexpected EXEC reply", &other)),
    };
    Ok((answers, acked))
}

/// A check's reply that let the transaction run: per shard, the producer record's `s` when it
/// is behind what the lane knows it wrote there (`nil`: none is; `{'behind', b…}`, −1 for a
/// shard that is not). `None`: the check asked for an abort (or answered something else).
fn passed(check: &Value, k: usize) -> redis::RedisResult<Option<Vec<Option<u64>>>> {
    let items = match check {
        Value::Nil => return Ok(Some(vec![None; k])),
        Value::Array(items) => items,
        _ => return Ok(None),
    };
    match items.first() {
        Some(Value::BulkString(b)) if b == b"behind" => {}
        Some(Value::SimpleString(b)) if b == "behind" => {}
        _ => return Ok(None),
    }
    if items.len() != k + 1 {
        return Err(unexpected("publish check: unexpected reply", check));
    }
    let behind = items[1..].iter().map(|v| match v {
        Value::Int(s) => Ok(u64::try_from(*s).ok()),
        _ => Err(unexpected("publish check: unexpected reply", check)),
    });
    behind.collect::<Result<_, _>>().map(Some)
}

/// The answers of a transaction that ran: the `XADD`s' ids, then the tail's reply; `behind`
/// per shard from its check ([`passed`]).
fn executed(
    replies: Vec<Value>,
    parts: &[Part],
    behind: Vec<Option<u64>>,
) -> redis::RedisResult<Vec<ShardAnswer>> {
    if let Some(Value::ServerError(e)) = replies.iter().find(|v| matches!(v, Value::ServerError(_)))
    {
        return Err(e.clone().into());
    }
    let mut ids = replies.into_iter();
    let mut out = Vec::with_capacity(parts.len());
    for ((_, idx), behind) in parts.iter().zip(behind) {
        let mut part = Vec::with_capacity(idx.len());
        for _ in idx {
            let id: String = match ids.next() {
                Some(v) => redis::from_redis_value(v)?,
                None => return Err(unexpected("publish: EXEC returned too few replies", &())),
            };
            part.push(Some(id));
        }
        out.push(ShardAnswer {
            marker: 0,
            landed: None,
            order: false,
            ids: part,
            behind,
        });
    }
    Ok(out)
}

/// The answers of an aborted transaction: from the check's reply (`nil`: it passed, a watched
/// key changed before the `EXEC`, nothing was written), per shard `{marker, w}`: `w` the
/// first sequence of a write found landed, −2 refused for order, −1 neither.
fn aborted(check: &Value, parts: &[Part]) -> redis::RedisResult<Vec<ShardAnswer>> {
    let passed = vec![Value::Array(vec![Value::Int(0), Value::Int(-1)]); parts.len()];
    let shards = match check {
        Value::Nil => &passed,
        Value::Array(shards) if shards.len() == parts.len() => shards,
        _ => return Err(unexpected("publish check: unexpected reply", check)),
    };
    let mut out = Vec::with_capacity(parts.len());
    for ((_, idx), shard) in parts.iter().zip(shards) {
        let (marker, hw) = match shard {
            Value::Array(items) => match items[..] {
                [Value::Int(m), Value::Int(s)] => (m, s),
                _ => return Err(unexpected("publish check: unexpected reply", shard)),
            },
            _ => return Err(unexpected("publish check: unexpected reply", shard)),
        };
        out.push(ShardAnswer {
            marker: marker.max(0) as u64,
            landed: u64::try_from(hw).ok().filter(|&w| w > 0),
            order: hw == -2,
            ids: vec![None; idx.len()],
            behind: None,
        });
    }
    Ok(out)
}

/// Reads one reply of [`Writer::landed_pipeline`]: `n` entry ids (empty when the script did
/// not find one: written, id unknown).
pub(super) fn read_landed(v: Value, n: usize) -> redis::RedisResult<Vec<String>> {
    if let Value::ServerError(e) = v {
        return Err(e.into());
    }
    let ids: Vec<String> = redis::from_redis_value(v)?;
    if ids.len() != n {
        return Err(unexpected("publish landed: unexpected number of ids", &ids));
    }
    if ids.iter().any(String::is_empty) {
        warn!("a retried record had been written, its entry id is unknown");
    }
    Ok(ids)
}

fn unexpected(what: &'static str, got: &dyn std::fmt::Debug) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        what,
        format!("{got:?}"),
    ))
}

/// A script without its comment lines and indentation (`EVAL` sends it with every write,
/// and Redis hashes what it is sent).
fn compact(lua: &str) -> String {
    (lua.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The check script (`protocol/src/lua/publish_check.lua`), compacted.
fn check_body() -> &'static str {
    static BODY: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| compact(rsc_protocol::routing::PUBLISH_CHECK_LUA));
    &BODY
}

/// The landed-ids script (`protocol/src/lua/publish_landed.lua`), compacted.
fn landed_body() -> &'static str {
    static BODY: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| compact(rsc_protocol::routing::PUBLISH_LANDED_LUA));
    &BODY
}

/// The tail script (`protocol/src/lua/publish_tail.lua`), compacted.
fn tail_body() -> &'static str {
    static BODY: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| compact(rsc_protocol::routing::PUBLISH_TAIL_LUA));
    &BODY
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<Part> {
        vec![(0, vec![0, 2]), (1, vec![1])]
    }

    fn ok() -> Value {
        Value::Okay
    }

    /// The routing of stream `s` over 2 shards at `epoch`.
    fn two_shards(epoch: u64) -> Routing {
        Routing {
            stream: "s".into(),
            shard_count: 2,
            routing_epoch: epoch,
            shard_keys: vec!["s:0".into(), "s:1".into()],
        }
    }

    /// A standalone writer of `records` for `lane`, without `WAIT`.
    fn writer<'a>(
        routing: &'a Routing,
        records: &'a [Record],
        lane: Option<&'a LaneIds>,
    ) -> Writer<'a> {
        Writer {
            routing,
            records,
            lane,
            ttl_ms: 1,
            fields: false,
            cluster: false,
            wait: None,
            history: 5,
        }
    }

    fn queued(n: usize) -> Vec<Value> {
        vec![Value::SimpleString("QUEUED".into()); n]
    }

    fn id(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_transaction_that_ran_answers_its_ids() {
        let mut v = vec![ok(), Value::Nil, ok()];
        v.extend(queued(4));
        v.push(Value::Array(vec![
            id("1-0"),
            id("1-1"),
            id("2-0"),
            Value::Int(0),
        ]));
        let (answers, acked) = read(v, &parts(), false).expect("read");
        assert_eq!(acked, u32::MAX);
        assert_eq!(answers[0].ids, [Some("1-0".into()), Some("1-1".into())]);
        assert_eq!(answers[1].ids, [Some("2-0".into())]);
    }

    #[test]
    fn an_abort_reports_landed_refused_and_again() {
        let check = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(12)]),
            Value::Array(vec![Value::Int(7), Value::Int(-1)]),
        ]);
        let mut v = vec![ok(), check, ok()];
        v.extend(queued(4));
        v.push(Value::Nil);
        v.push(Value::Int(1));
        let (answers, acked) = read(v, &parts(), true).expect("read");
        assert_eq!(acked, 1);
        assert_eq!((answers[0].marker, answers[0].landed), (0, Some(12)));
        assert_eq!(answers[0].ids, [None, None]);
        assert_eq!((answers[1].marker, answers[1].landed), (7, None));
        assert_eq!(answers[1].ids, [None]);
    }

    #[test]
    fn an_abort_for_order_is_reported_per_shard_and_writes_nothing() {
        let check = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(-2)]),
            Value::Array(vec![Value::Int(0), Value::Int(-1)]),
        ]);
        let mut v = vec![ok(), check, ok()];
        v.extend(queued(4));
        v.push(Value::Nil);
        let (answers, _) = read(v, &parts(), false).expect("read");
        assert!(answers[0].order && answers[0].landed.is_none());
        assert!(!answers[1].order && answers[1].landed.is_none());
        assert!(answers.iter().all(|a| a.ids.iter().all(Option::is_none)));
    }

    #[test]
    fn the_check_gets_where_each_shard_must_end_for_the_write_to_follow() {
        let routing = two_shards(4);
        let lane = LaneIds {
            id: "p".into(),
            seqs: vec![10, 11, 12],
            known: [("s:1".to_owned(), 3)].into(),
            prev: [("s:0".to_owned(), 7), ("s:1".to_owned(), 9)].into(),
        };
        let records = [Record::raw("a"), Record::raw("b"), Record::raw("c")];
        let w = writer(&routing, &records, Some(&lane));
        let args = args_of(&w.pipeline(&parts()), 1);
        // <lowest seq ×2> <known ×2> <prev ×2>
        assert_eq!(args[10..], ["10", "11", "0", "3", "7", "9"]);
    }

    #[test]
    fn an_abort_after_a_passed_check_writes_nothing() {
        let mut v = vec![ok(), Value::Nil, ok()];
        v.extend(queued(4));
        v.push(Value::Nil);
        let (answers, _) = read(v, &parts(), false).expect("read");
        assert!(
            answers
                .iter()
                .all(|a| a.marker == 0 && a.landed.is_none() && a.ids.iter().all(Option::is_none))
        );
    }

    #[test]
    fn a_refused_check_is_the_error() {
        let noperm = redis::parse_redis_value(b"-NOPERM no scripts\r\n").expect("parse");
        let mut v = vec![ok(), noperm, ok()];
        v.extend(queued(3));
        v.push(redis::parse_redis_value(b"-NOPERM no scripts\r\n").expect("parse"));
        v.push(redis::parse_redis_value(b"-EXECABORT discarded\r\n").expect("parse"));
        let err = read(v, &parts(), false).expect_err("refused");
        assert_eq!(err.code(), Some("NOPERM"), "{err}");
    }

    #[test]
    fn a_failed_check_is_the_error_and_its_abort_writes_nothing() {
        let failed = redis::parse_redis_value(
            b"-WRONGTYPE Operation against a key holding the wrong kind of value \
              (publish check, key {s:0}:epoch: nothing written)\r\n",
        )
        .expect("parse");
        let mut v = vec![ok(), failed, ok()];
        v.extend(queued(4));
        v.push(Value::Nil);
        let err = read(v, &parts(), false).expect_err("failed check");
        assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
        assert!(err.to_string().contains("{s:0}:epoch"), "{err}");
    }

    #[test]
    fn the_keys_end_with_the_abort_key_of_the_first_shard() {
        let routing = two_shards(1);
        let lane = LaneIds {
            id: "p".into(),
            seqs: vec![1, 2, 3],
            ..LaneIds::default()
        };
        let mut w = writer(&routing, &[], Some(&lane));
        let idem = [
            "{s:0}:epoch",
            "{s:1}:epoch",
            "{s:0}:producer:p",
            "{s:1}:producer:p",
        ];
        let mut want: Vec<&str> = idem.to_vec();
        want.push("{s:0}:publish-abort");
        assert_eq!(w.keys(&parts()), want);
        w.lane = None;
        assert_eq!(
            w.keys(&parts()[1..]),
            ["{s:1}:epoch", "{s:1}:publish-abort"]
        );
    }

    #[test]
    fn an_abort_the_check_asked_for_that_ran_anyway_is_an_error() {
        let stale = Value::Array(vec![Value::Int(7), Value::Int(-1)]);
        let check = Value::Array(vec![stale.clone(), stale]);
        let mut v = vec![ok(), check, ok()];
        v.extend(queued(4));
        v.push(Value::Array(vec![
            id("1-0"),
            id("1-1"),
            id("2-0"),
            Value::Int(0),
        ]));
        assert!(read(v, &parts(), false).is_err());
    }

    fn behind(b: &[i64]) -> Value {
        let mut v = vec![id("behind")];
        v.extend(b.iter().map(|&s| Value::Int(s)));
        Value::Array(v)
    }

    #[test]
    fn a_transaction_that_ran_reports_the_shards_whose_record_is_behind() {
        let mut v = vec![ok(), behind(&[-1, 0]), ok()];
        v.extend(queued(4));
        v.push(Value::Array(vec![
            id("1-0"),
            id("1-1"),
            id("2-0"),
            Value::Int(0),
        ]));
        let (answers, _) = read(v, &parts(), false).expect("read");
        assert_eq!((answers[0].behind, answers[1].behind), (None, Some(0)));
        assert_eq!(answers[1].ids, [Some("2-0".into())]);
        let mut v = vec![ok(), behind(&[7, -1]), ok()];
        v.extend(queued(4));
        v.push(Value::Array(vec![
            id("1-0"),
            id("1-1"),
            id("2-0"),
            Value::Int(0),
        ]));
        let (answers, _) = read(v, &parts(), false).expect("read");
        assert_eq!((answers[0].behind, answers[1].behind), (Some(7), None));
    }

    #[test]
    fn a_behind_check_whose_transaction_aborted_wrote_nothing_and_reports_nothing() {
        let mut v = vec![ok(), behind(&[3, -1]), ok()];
        v.extend(queued(4));
        v.push(Value::Nil);
        let (answers, _) = read(v, &parts(), false).expect("read");
        assert!(answers.iter().all(|a| a.behind.is_none()
            && a.marker == 0
            && a.landed.is_none()
            && a.ids.iter().all(Option::is_none)));
    }

    #[test]
    fn a_behind_reply_of_the_wrong_shape_is_an_error() {
        for bad in [
            behind(&[1]),
            Value::Array(vec![id("behind"), Value::Int(1), id("x")]),
        ] {
            let mut v = vec![ok(), bad, ok()];
            v.extend(queued(4));
            v.push(Value::Array(vec![
                id("1-0"),
                id("1-1"),
                id("2-0"),
                Value::Int(0),
            ]));
            assert!(read(v, &parts(), false).is_err());
        }
    }

    #[test]
    fn the_check_gets_what_the_lane_knows_it_wrote_per_shard() {
        let routing = two_shards(4);
        let lane = LaneIds {
            id: "p".into(),
            seqs: vec![10, 11, 12],
            known: [("s:1".to_owned(), 9)].into(),
            ..LaneIds::default()
        };
        let records = [Record::raw("a"), Record::raw("b"), Record::raw("c")];
        let w = writer(&routing, &records, Some(&lane));
        let pipe = w.pipeline(&parts());
        let check = pipe.cmd_iter().nth(1).expect("the check");
        let args: Vec<String> = (check.args_iter())
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect();
        // EVAL body 5 <5 keys> epoch id <lowest seq ×2> <known ×2> <prev ×2>
        assert_eq!(args[8..], ["4", "p", "10", "11", "0", "9", "0", "9"]);
    }

    /// The arguments of the `n`th command of `pipe`, as text.
    fn args_of(pipe: &redis::Pipeline, n: usize) -> Vec<String> {
        let cmd = pipe.cmd_iter().nth(n).expect("the command");
        (cmd.args_iter())
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn an_idempotent_write_records_its_last_write_per_shard_and_no_entry_fields() {
        let routing = two_shards(4);
        let lane = LaneIds {
            id: "p".into(),
            seqs: vec![10, 11, 12],
            ..LaneIds::default()
        };
        let records = [Record::raw("a"), Record::raw("b"), Record::raw("c")];
        let mut w = writer(&routing, &records, Some(&lane));
        let pipe = w.pipeline(&parts());
        // WATCH, check, MULTI, 3 XADDs, tail, EXEC.
        let xadd = args_of(&pipe, 3);
        assert_eq!(xadd, ["XADD", "s:0", "*", "payload", "a"]);
        let tail = args_of(&pipe, 6);
        // EVAL body 7 <markers ×2> <records ×2> <abort> <shard keys ×2> ttl k ring
        // (s f n) ×2 H <channels ×2>
        assert_eq!(tail[2], "7");
        assert_eq!(tail[8..10], ["s:0", "s:1"]);
        assert_eq!(tail[13..20], ["12", "10", "2", "11", "11", "1", "5"]);
        // With the entry fields asked for, each XADD ends with them.
        w.fields = true;
        let pipe = w.pipeline(&parts());
        let xadd = args_of(&pipe, 4);
        assert_eq!(xadd[5..], ["producer_id", "p", "producer_seq", "12"]);
        // Without idempotence, the tail has the check's keys only.
        w.lane = None;
        let pipe = w.pipeline(&parts());
        assert_eq!(args_of(&pipe, 6)[2], "3");
    }

    #[test]
    fn the_scripts_lose_their_comments() {
        assert!(!check_body().contains("--"));
        assert!(landed_body().contains("PEXPIRETIME"));
        assert!(tail_body().lines().all(|l| l == l.trim()));
    }
}
