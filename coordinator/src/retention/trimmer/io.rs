//! The trimmer's Redis round trips: `XPENDING` summaries, the trims, and reading what they
//! removed.

use super::super::point::{EntryId, Position, ShardInput};
use super::{Candidate, Trimmer};
use crate::metrics::GroupReading;
use redis::{Cmd, RedisResult, Value};
use rsc_protocol::{AuditEntry, AuditRequest, AuditResult, AuditTarget, RetentionPolicy};
use rsc_redis::Conn;
use std::collections::HashMap;

/// What the trim of one key did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Outcome {
    /// Entries the `XTRIM`s removed.
    pub trimmed: u64,
    /// `(entries-added, length)` before the trims (keys under a hard cap only).
    pub before: Option<(u64, u64)>,
    /// The same, after them.
    pub after: Option<(u64, u64)>,
}

impl Outcome {
    /// Per group, the entries the trims removed that it had not been delivered yet: the
    /// removed entries' counters (`entries-added − length`) beyond its read counter
    /// (`entries-read`; 0 for a group with no consumer group on the shard).
    pub(super) fn undelivered_drops(
        &self,
        input: &ShardInput,
        readings: &[GroupReading],
    ) -> Vec<(String, u64)> {
        let (Some((ab, lb)), Some((aa, la))) = (self.before, self.after) else {
            return Vec::new();
        };
        let (removed_before, removed_after) = (ab.saturating_sub(lb), aa.saturating_sub(la));
        input
            .groups
            .iter()
            .filter_map(|g| {
                let read = match g.position {
                    Position::NoConsumerGroup => 0,
                    Position::Reading { .. } => {
                        readings
                            .iter()
                            .find(|r| r.group == g.group)?
                            .stats
                            .entries_read?
                    }
                };
                let n = removed_after.saturating_sub(removed_before.max(read));
                (n > 0).then(|| (g.group.clone(), n))
            })
            .collect()
    }
}

fn timed_out(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, what))
}

/// Runs each batch of commands (one batch per key, in order): one pipeline for all on a
/// standalone Redis; on a cluster, one pipeline per key (one slot), all in flight at once.
async fn run(conn: &mut Conn, batches: &[Vec<Cmd>]) -> RedisResult<Vec<Vec<RedisResult<Value>>>> {
    let pipe_of = |cmds: &mut dyn Iterator<Item = &Cmd>| {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for c in cmds {
            pipe.add_command(c.clone());
        }
        pipe
    };
    if conn.is_cluster() {
        let calls = batches.iter().map(|cmds| {
            let mut conn = conn.clone();
            let pipe = pipe_of(&mut cmds.iter());
            async move { pipe.query_async::<Vec<RedisResult<Value>>>(&mut conn).await }
        });
        return futures::future::join_all(calls).await.into_iter().collect();
    }
    let pipe = pipe_of(&mut batches.iter().flatten());
    let mut flat = pipe
        .query_async::<Vec<RedisResult<Value>>>(conn)
        .await?
        .into_iter();
    Ok(batches
        .iter()
        .map(|cmds| flat.by_ref().take(cmds.len()).collect())
        .collect())
}

/// `XINFO STREAM`'s `(entries-added, length)`.
fn added_and_length(v: &RedisResult<Value>) -> Option<(u64, u64)> {
    let map: HashMap<String, Value> = redis::from_redis_value(v.as_ref().ok()?.clone()).ok()?;
    let n = |k: &str| -> Option<u64> { redis::from_redis_value(map.get(k)?.clone()).ok() };
    Some((n("entries-added")?, n("length")?))
}

/// The smallest id of an `XPENDING <key> <group>` summary.
fn smallest_pending(reply: Option<RedisResult<Value>>) -> Option<EntryId> {
    match reply?.ok()? {
        Value::Array(items) if items.len() >= 2 => {
            let id: Option<String> = redis::from_redis_value(items[1].clone()).ok()?;
            EntryId::parse(&id?)
        }
        _ => None,
    }
}

/// The commands of one key's trim.
fn trim_commands(c: &Candidate<'_>, d: &super::TrimDecision) -> Vec<Cmd> {
    let capped = c.input.policy.has_hard_cap();
    let mut cmds = Vec::new();
    let info = || redis::cmd("XINFO").arg("STREAM").arg(c.key).clone();
    if capped {
        cmds.push(info());
    }
    if let Some(m) = d.minid {
        let mut x = redis::cmd("XTRIM");
        x.arg(c.key).arg("MINID").arg("~").arg(m.to_string());
        cmds.push(x);
    }
    if let Some(n) = d.maxlen {
        let mut x = redis::cmd("XTRIM");
        x.arg(c.key).arg("MAXLEN").arg("~").arg(n);
        cmds.push(x);
    }
    if capped {
        cmds.push(info());
    }
    cmds
}

impl Trimmer {
    /// Fills in the oldest pending id of every group with pending entries
    /// (`XPENDING <key> <group>` summary).
    pub(super) async fn fill_oldest_pending(
        &self,
        conn: &mut Conn,
        cands: &mut [Candidate<'_>],
    ) -> RedisResult<()> {
        let mut asked: Vec<(usize, usize)> = Vec::new();
        let mut batches = Vec::new();
        for (ci, c) in cands.iter().enumerate() {
            for (gi, g) in c.input.groups.iter().enumerate() {
                if let Position::Reading { pending, .. } = g.position
                    && pending > 0
                {
                    let mut cmd = redis::cmd("XPENDING");
                    cmd.arg(c.key).arg(&g.group);
                    batches.push(vec![cmd]);
                    asked.push((ci, gi));
                }
            }
        }
        if batches.is_empty() {
            return Ok(());
        }
        let replies = tokio::time::timeout(self.timeout, run(conn, &batches))
            .await
            .map_err(|_| timed_out("XPENDING timed out"))??;
        for ((ci, gi), reply) in asked.into_iter().zip(replies) {
            let smallest = smallest_pending(reply.into_iter().next());
            if let Position::Reading { oldest_pending, .. } =
                &mut cands[ci].input.groups[gi].position
            {
                *oldest_pending = smallest;
            }
        }
        Ok(())
    }

    /// Runs the trims of `work`; answers one outcome per item.
    pub(super) async fn trim(
        &self,
        conn: &mut Conn,
        work: &[&(Candidate<'_>, super::TrimDecision)],
    ) -> RedisResult<Vec<Outcome>> {
        if work.is_empty() {
            return Ok(Vec::new());
        }
        let batches: Vec<Vec<Cmd>> = work.iter().map(|(c, d)| trim_commands(c, d)).collect();
        let replies = tokio::time::timeout(self.timeout, run(conn, &batches))
            .await
            .map_err(|_| timed_out("XTRIM timed out"))??;
        ::metrics::counter!("rsc_retention_trim_commands_total")
            .increment(batches.iter().map(Vec::len).sum::<usize>() as u64);
        Ok(work
            .iter()
            .zip(replies)
            .map(|((c, _), r)| {
                let capped = c.input.policy.has_hard_cap() && r.len() >= 2;
                let trims = if capped { &r[1..r.len() - 1] } else { &r[..] };
                let count = |t: &RedisResult<Value>| -> Option<u64> {
                    redis::from_redis_value(t.as_ref().ok()?.clone()).ok()
                };
                Outcome {
                    trimmed: trims.iter().filter_map(count).sum(),
                    before: capped.then(|| added_and_length(&r[0])).flatten(),
                    after: capped.then(|| added_and_length(&r[r.len() - 1])).flatten(),
                }
            })
            .collect())
    }
}

impl Trimmer {
    /// `XTRIM <stream>:dlq MINID ~ <now − max_age_ms>` and `MAXLEN ~ <max_entries_per_shard>`
    /// per stream, as its `dlq_retention` says; answers the entries removed per stream.
    pub(super) async fn trim_dlq(
        &self,
        conn: &mut Conn,
        streams: &[&crate::engine::StreamDoc],
        now_ms: u64,
    ) -> RedisResult<Vec<u64>> {
        let batches: Vec<Vec<Cmd>> = streams
            .iter()
            .map(|s| {
                let key = rsc_protocol::routing::dlq_key(&s.stream);
                let p = &s.dlq_retention;
                let mut cmds = Vec::new();
                if let Some(age) = p.max_age_ms {
                    let mut x = redis::cmd("XTRIM");
                    let point = EntryId::at_ms(now_ms.saturating_sub(age));
                    x.arg(&key).arg("MINID").arg("~").arg(point.to_string());
                    cmds.push(x);
                }
                if let Some(n) = p.max_entries_per_shard {
                    let mut x = redis::cmd("XTRIM");
                    x.arg(&key).arg("MAXLEN").arg("~").arg(n);
                    cmds.push(x);
                }
                cmds
            })
            .collect();
        let replies = tokio::time::timeout(self.timeout, run(conn, &batches))
            .await
            .map_err(|_| timed_out("dead-letter XTRIM timed out"))??;
        ::metrics::counter!("rsc_retention_trim_commands_total")
            .increment(batches.iter().map(Vec::len).sum::<usize>() as u64);
        Ok(replies
            .iter()
            .map(|r| {
                r.iter()
                    .filter_map(|t| redis::from_redis_value::<u64>(t.as_ref().ok()?.clone()).ok())
                    .sum()
            })
            .collect())
    }
}

/// The audit entry of a hard cap that trimmed undelivered entries.
pub(super) fn audit_entry(
    now_ms: u64,
    stream: &str,
    key: &str,
    drops: &[(String, u64)],
    policy: &RetentionPolicy,
) -> AuditEntry {
    let dropped: serde_json::Map<String, serde_json::Value> = drops
        .iter()
        .map(|(g, n)| (g.clone(), serde_json::json!(n)))
        .collect();
    AuditEntry {
        client_addr: None,
        count: None,
        since_ms: None,
        credential: None,
        time_ms: now_ms,
        principal: "rsc-coordinator".into(),
        action: "stream.retention_dropped_undelivered".into(),
        target: AuditTarget {
            stream: Some(stream.to_owned()),
            ..AuditTarget::default()
        },
        request: AuditRequest {
            method: "INTERNAL".into(),
            path: format!("/v1/streams/{stream}"),
            query: None,
            body: Some(serde_json::json!({
                "key": key,
                "dropped_undelivered": dropped,
                "retention": policy,
            })),
        },
        result: AuditResult {
            status: 200,
            code: None,
        },
        revisions: Vec::new(),
    }
}
