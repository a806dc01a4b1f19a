//! The trimming pass (PROTOCOL §18): after each lag sampling tick, for the shard keys that
//! tick read, works out each shard's trim point ([`super::point`]) and runs the `XTRIM`s.
//!
//! A key is trimmed only when what its `XINFO GROUPS` answered changed since its last trim,
//! or when its last point was bounded by the clock (`keep_acked_ms`, `max_age_ms`): an idle
//! shard whose entries every group handled costs nothing beyond the sampler's once-a-minute
//! read. Per pass: one `XPENDING` summary per group with pending entries on a changed key,
//! then one `XTRIM … MINID ~` per key whose point moved forward; keys under a hard cap also
//! get `XTRIM … MAXLEN ~` and an `XINFO STREAM` before and after, from which the entries a
//! group had not yet been delivered are counted (`rsc_retention_dropped_undelivered_total`)
//! and audited. Standalone Redis: one pipeline per round; Redis Cluster: each key's commands
//! on its own, all in flight at once (a pipeline stays within one slot).

use super::point::{
    EntryId, GroupInput, Position, ShardInput, ShardKind, TrimDecision, trim_point,
};
use crate::audit::Auditor;
use crate::engine::StreamDoc;
use crate::metrics::{AfterTick, GroupReading, KeyReading};
use crate::store::MetadataStore;
use async_trait::async_trait;
use rsc_protocol::{GroupView, ShardState};
use rsc_redis::{Conn, LazyRedis};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info, warn};

mod io;

/// What the last trim of a key was based on.
#[derive(Debug, Clone, PartialEq)]
struct Memo {
    reading: KeyReading,
    /// The decision's input, without the time (groups held, layout, seal, policy).
    input: ShardInput,
    minid: Option<EntryId>,
    time_bound: bool,
}

/// `input` without its time and the `XPENDING` answers, to compare with the input of
/// another pass (pending counts are in the reading).
fn timeless(input: &ShardInput) -> ShardInput {
    let mut t = ShardInput {
        now_ms: 0,
        ..input.clone()
    };
    for g in &mut t.groups {
        if let Position::Reading { oldest_pending, .. } = &mut g.position {
            *oldest_pending = None;
        }
    }
    t
}

/// Trims the shard keys of the streams this coordinator samples.
pub(crate) struct Trimmer {
    redis: LazyRedis,
    store: Arc<dyn MetadataStore>,
    auditor: Auditor,
    timeout: Duration,
    memos: Mutex<HashMap<String, Memo>>,
    /// When each stream's dead-letter stream was last trimmed (Unix ms).
    dlq_trimmed: Mutex<HashMap<String, u64>>,
}

/// How often a dead-letter stream `<stream>:dlq` is trimmed to its policy.
const DLQ_EVERY_MS: u64 = 60_000;

/// One key to decide on: its stream, shard, reading and the stream's groups on it.
struct Candidate<'a> {
    key: &'a str,
    stream: &'a StreamDoc,
    input: ShardInput,
    reading: KeyReading,
    readings: Vec<GroupReading>,
}

/// Whether any member of `g` is down: silent for over two heartbeat intervals, or away.
fn member_down(g: &GroupView) -> bool {
    g.members.iter().any(|m| {
        m.away_ms.is_some() || m.last_heartbeat_ms_ago > 2 * g.heartbeat_interval_ms.max(1)
    })
}

/// The input of shard `shard` of `stream`, from a reading of its key (oldest pending ids
/// are filled in later).
fn shard_input(
    stream: &StreamDoc,
    shard: u32,
    state: ShardState,
    views: &HashMap<&str, &GroupView>,
    readings: &[GroupReading],
    now_ms: u64,
) -> ShardInput {
    let groups = stream
        .groups
        .iter()
        .map(|name| {
            let position = readings
                .iter()
                .find(|r| &r.group == name)
                .and_then(|r| {
                    Some(Position::Reading {
                        last_delivered: EntryId::parse(&r.last_delivered)?,
                        pending: r.stats.pending?,
                        oldest_pending: None,
                    })
                })
                .unwrap_or(Position::NoConsumerGroup);
            // A group the views lack (created since they were read) holds the shard.
            let held = views
                .get(name.as_str())
                .is_none_or(|g| g.paused || member_down(g));
            GroupInput {
                group: name.clone(),
                position,
                held,
            }
        })
        .collect();
    let seal = stream
        .running_reshard()
        .and_then(|r| r.seals.get(&shard))
        .and_then(|s| EntryId::parse(s));
    ShardInput {
        groups,
        kind: match state {
            ShardState::Active => ShardKind::Active,
            _ => ShardKind::Draining,
        },
        seal,
        policy: stream.retention,
        now_ms,
    }
}

impl Trimmer {
    /// A trimmer of the data Redis `redis`, reading stream documents from `store`; each
    /// Redis round trip is abandoned past `timeout`.
    pub(crate) fn new(
        redis: LazyRedis,
        store: Arc<dyn MetadataStore>,
        auditor: Auditor,
        timeout: Duration,
    ) -> Self {
        Trimmer {
            redis,
            store,
            auditor,
            timeout,
            memos: Mutex::new(HashMap::new()),
            dlq_trimmed: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key`, read as `reading` (`fresh`: at this tick), is worth deciding on again:
    /// its reading or the rest of its input changed since its last decision, or (when read
    /// at this tick) that decision was bounded by time.
    fn changed(&self, key: &str, reading: &KeyReading, input: &ShardInput, fresh: bool) -> bool {
        let memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        memos.get(key).is_none_or(|m| {
            (fresh && m.time_bound) || &m.reading != reading || m.input != timeless(input)
        })
    }

    /// The reading of `key` its last decision was based on.
    fn last_reading(&self, key: &str) -> Option<KeyReading> {
        let memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        memos.get(key).map(|m| m.reading.clone())
    }

    /// The stream documents of `groups`' streams (those the store could not answer left out).
    async fn streams(&self, groups: &[GroupView]) -> HashMap<String, StreamDoc> {
        let mut out = HashMap::new();
        for g in groups {
            if out.contains_key(&g.stream) {
                continue;
            }
            match self.store.load_stream(&g.stream).await {
                Ok(Some(v)) => {
                    out.insert(g.stream.clone(), v.doc);
                }
                Ok(None) => {}
                Err(e) => {
                    debug!(stream = %g.stream, error = %e, "stream unreadable; not trimmed this pass")
                }
            }
        }
        out
    }

    async fn connection(&self) -> Option<Conn> {
        match tokio::time::timeout(self.timeout, self.redis.get()).await {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => {
                debug!(error = %e, "data Redis unreachable; nothing trimmed this pass");
                None
            }
            Err(_) => None,
        }
    }
}

/// The keys of `fresh` worth a decision, with their inputs.
fn candidates<'a>(
    trimmer: &Trimmer,
    groups: &'a [GroupView],
    streams: &'a HashMap<String, StreamDoc>,
    fresh: &'a HashMap<String, KeyReading>,
    now_ms: u64,
) -> Vec<Candidate<'a>> {
    let mut by_stream: HashMap<&str, HashMap<&str, &GroupView>> = HashMap::new();
    for g in groups {
        by_stream
            .entry(g.stream.as_str())
            .or_default()
            .insert(g.group.as_str(), g);
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for g in groups {
        let Some(stream) = streams.get(&g.stream) else {
            continue;
        };
        for s in &g.shards {
            if !seen.insert(s.key.as_str()) {
                continue;
            }
            // A key not read at this tick (idle) is decided on again from its last reading
            // when the rest of its input changed (a group resumed, the policy changed).
            let (reading, is_fresh) = match fresh.get(&s.key) {
                Some(r) => (r.clone(), true),
                None => match trimmer.last_reading(&s.key) {
                    Some(r) => (r, false),
                    None => continue,
                },
            };
            let Some(readings) = reading.clone() else {
                continue;
            };
            let views = &by_stream[g.stream.as_str()];
            let input = shard_input(stream, s.shard, s.state, views, &readings, now_ms);
            if !trimmer.changed(&s.key, &reading, &input, is_fresh) {
                continue;
            }
            out.push(Candidate {
                key: &s.key,
                stream,
                input,
                reading,
                readings,
            });
        }
    }
    out
}

#[async_trait]
impl AfterTick for Trimmer {
    async fn after_tick(
        &self,
        groups: &[GroupView],
        fresh: &HashMap<String, KeyReading>,
        now_ms: u64,
    ) {
        let streams = self.streams(groups).await;
        self.trim_dead_letters(&streams, now_ms).await;
        let mut cands = candidates(self, groups, &streams, fresh, now_ms);
        if cands.is_empty() {
            return;
        }
        let Some(mut conn) = self.connection().await else {
            return;
        };
        if let Err(e) = self.fill_oldest_pending(&mut conn, &mut cands).await {
            debug!(error = %e, "XPENDING failed; nothing trimmed this pass");
            return;
        }
        let decided: Vec<(Candidate<'_>, TrimDecision)> = cands
            .into_iter()
            .map(|c| {
                let d = trim_point(&c.input);
                debug!(key = c.key, minid = ?d.minid, safe = %d.safe, blocked_by = ?d.blocked_by,
                    groups = ?c.input.groups, "retention decision");
                (c, d)
            })
            .collect();
        let work: Vec<&(Candidate<'_>, TrimDecision)> = decided
            .iter()
            .filter(|(c, d)| self.worth_trimming(c.key, d))
            .collect();
        let outcomes = match self.trim(&mut conn, &work).await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "XTRIM failed; retried next pass");
                return;
            }
        };
        for ((c, d), o) in work.iter().zip(outcomes) {
            self.account(c, d, &o).await;
        }
        self.remember(&decided, groups);
    }
}

impl Trimmer {
    /// Whether `d` trims more than the last trim of `key` did.
    fn worth_trimming(&self, key: &str, d: &TrimDecision) -> bool {
        if d.maxlen.is_some() {
            return true;
        }
        let memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        let last = memos.get(key).and_then(|m| m.minid);
        d.minid.is_some_and(|m| last.is_none_or(|l| m > l))
    }

    /// Records what each decided key was based on.
    fn remember(&self, decided: &[(Candidate<'_>, TrimDecision)], groups: &[GroupView]) {
        let mut memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        for (c, d) in decided {
            let last = memos.get(c.key).and_then(|m| m.minid);
            memos.insert(
                c.key.to_owned(),
                Memo {
                    reading: c.reading.clone(),
                    input: timeless(&c.input),
                    minid: d.minid.max(last),
                    time_bound: d.time_bound,
                },
            );
        }
        // Forget the keys of streams this coordinator no longer samples.
        let live: std::collections::HashSet<&str> = groups
            .iter()
            .flat_map(|g| g.shards.iter().map(|s| s.key.as_str()))
            .collect();
        memos.retain(|k, _| live.contains(k.as_str()));
    }

    /// Counts, logs and audits what the trim of `c` did.
    async fn account(&self, c: &Candidate<'_>, d: &TrimDecision, o: &io::Outcome) {
        let stream = c.stream.stream.as_str();
        metrics::counter!("rsc_retention_trimmed_entries_total", "stream" => stream.to_owned())
            .increment(o.trimmed);
        if o.trimmed > 0 {
            debug!(stream, key = c.key, trimmed = o.trimmed, minid = ?d.minid, "shard trimmed");
        }
        let drops = o.undelivered_drops(&c.input, &c.readings);
        if drops.is_empty() {
            return;
        }
        for (group, n) in &drops {
            metrics::counter!("rsc_retention_dropped_undelivered_total",
                "stream" => stream.to_owned(), "group" => group.clone())
            .increment(*n);
        }
        warn!(stream, key = c.key, ?drops, policy = ?c.stream.retention,
            "a retention hard cap trimmed entries groups had not been delivered yet");
        self.auditor
            .record(io::audit_entry(
                self.auditor.now_ms(),
                stream,
                c.key,
                &drops,
                &c.stream.retention,
            ))
            .await;
    }
}

impl Trimmer {
    /// Trims the dead-letter stream of each of `streams` to its caps (`dlq_retention`), each
    /// once per [`DLQ_EVERY_MS`]: at most two commands per stream per minute.
    async fn trim_dead_letters(&self, streams: &HashMap<String, StreamDoc>, now_ms: u64) {
        let due: Vec<&StreamDoc> = {
            let mut last = self.dlq_trimmed.lock().unwrap_or_else(|e| e.into_inner());
            last.retain(|s, _| streams.contains_key(s));
            streams
                .values()
                .filter(|s| s.dlq_retention.has_hard_cap())
                .filter(|s| {
                    let at = last.entry(s.stream.clone()).or_insert(0);
                    let due = now_ms.saturating_sub(*at) >= DLQ_EVERY_MS;
                    if due {
                        *at = now_ms;
                    }
                    due
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let Some(mut conn) = self.connection().await else {
            return;
        };
        match self.trim_dlq(&mut conn, &due, now_ms).await {
            Ok(trimmed) => {
                for (s, n) in due.iter().zip(trimmed) {
                    metrics::counter!("rsc_retention_dlq_trimmed_entries_total", "stream" => s.stream.clone())
                        .increment(n);
                }
            }
            Err(e) => debug!(error = %e, "dead-letter XTRIM failed; retried in a minute"),
        }
    }
}

/// Logs the trimmer's start.
pub(crate) fn announce() {
    info!("retention: shard keys are trimmed to what every group has handled (PROTOCOL §18)");
}
