//! A short history of each group's lag and handling rate, for the dashboard's chart and
//! `GET /v1/groups/{group}/history` (PROTOCOL §12; ARCHITECTURE "How lag is sampled").
//!
//! [`History::run`] ticks every interval (default 5 s, `--history-interval-ms`). Each group is
//! sampled by one coordinator: the live coordinators divide the streams by the expiry sweep's
//! rule (the stream's deadline-index bucket, [`crate::store::due_bucket`], among the buckets
//! of this coordinator's rank, [`crate::store::buckets_of`]). One `XINFO GROUPS` per shard key
//! answers for every group of the stream; [`super::sampler`] says which keys are due (an
//! idle one once a minute). Lag and pending entries are summed over the group's shards, from
//! the last reading of each; the handling rate is the change of `entries-read − pending`
//! (entries delivered and acknowledged) since the previous sample. The samples go to the
//! metadata store ([`MetadataStore::append_history`]), the last [`HISTORY_SPAN`] of them, so
//! every coordinator answers the same history and a restart loses none of it.

use super::lag::LagProbe;
use super::sampler::ShardMemos;
use crate::clock::Clock;
use crate::store::{HistoryBounds, HistoryRecord, MetadataStore, StoreError, due_bucket};
use futures::StreamExt;
use rsc_protocol::{GroupHistory, GroupView, HistorySample};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tracing::debug;

/// How far back the history goes.
pub(crate) const HISTORY_SPAN: Duration = Duration::from_secs(10 * 60);

/// How many groups' samples are written to the store at once.
const WRITE_CONCURRENCY: usize = 16;

/// Totals of one group at one time, over the shards that answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Lag summed over the shards.
    pub lag: Option<u64>,
    /// Pending entries summed over the shards.
    pub pending: Option<u64>,
    /// Entries handled so far (`entries-read − pending`, summed), when every shard that
    /// answered could tell.
    pub handled: Option<u64>,
    /// Shards that answered (a change means the sums are not comparable).
    pub shards: usize,
}

/// The sample of `totals` at `t_ms`, with the rate since `prev` (the group's newest sample).
pub(crate) fn next_record(
    prev: Option<&HistoryRecord>,
    t_ms: u64,
    totals: Totals,
) -> HistoryRecord {
    let handled_per_s = match (prev, totals.handled) {
        (Some(p), Some(now))
            if t_ms > p.sample.t_ms
                && p.shards == totals.shards
                && p.handled.is_some_and(|h| now >= h) =>
        {
            let before = p.handled.unwrap_or(now);
            Some((now - before) as f64 * 1000.0 / (t_ms - p.sample.t_ms) as f64)
        }
        _ => None,
    };
    HistoryRecord {
        sample: HistorySample {
            t_ms,
            lag: totals.lag,
            pending: totals.pending,
            handled_per_s,
        },
        handled: totals.handled,
        shards: totals.shards,
    }
}

/// How often the lag history is sampled by default.
pub(crate) const DEFAULT_HISTORY_INTERVAL: Duration = Duration::from_secs(5);

/// The sampling cadence and bounds of the history (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct History {
    interval: Duration,
    keep: usize,
}

/// What [`History::run`] works with besides the groups.
pub(crate) struct SampleDeps<'a> {
    /// Where the samples go.
    pub store: &'a dyn MetadataStore,
    /// The time samples are taken at.
    pub clock: &'a dyn Clock,
    /// The data Redis.
    pub probe: &'a LagProbe,
    /// The deadline-index buckets this coordinator sweeps (the expiry sweep's division).
    pub buckets: watch::Receiver<Vec<u32>>,
    /// Work done on what each tick read (the retention trimmer, PROTOCOL §18).
    pub after: Option<&'a dyn AfterTick>,
}

/// Work done after each sampling tick on what it read: the readings of the keys read at that
/// tick (those that moved, and idle ones once a minute) and the owned groups' views.
#[async_trait::async_trait]
pub(crate) trait AfterTick: Send + Sync {
    /// Called once per tick, after the readings were recorded.
    async fn after_tick(
        &self,
        groups: &[GroupView],
        fresh: &HashMap<String, super::lag::KeyReading>,
        now_ms: u64,
    );
}

/// One tick's work: the owned groups and the shard keys they cover, by stream.
struct Plan {
    groups: Vec<GroupView>,
    /// Every key with its phase.
    keys: Vec<(String, u64)>,
}

impl History {
    /// Sampled every `interval` (at least 100 ms).
    pub(crate) fn new(interval: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(100));
        let keep = (HISTORY_SPAN.as_millis() / interval.as_millis()).clamp(2, 6_000) as usize;
        History { interval, keep }
    }

    fn bounds(&self) -> HistoryBounds {
        HistoryBounds {
            keep: self.keep,
            // Two coordinators sampling the same group during a hand-over keep one sample
            // per interval between them.
            min_gap_ms: self.interval.as_millis() as u64 / 2,
            ttl_ms: 2 * HISTORY_SPAN.as_millis() as u64,
        }
    }

    /// The samples of `group`, oldest first (none yet: empty), as stored.
    pub(crate) async fn get(
        &self,
        store: &dyn MetadataStore,
        group: &str,
    ) -> Result<GroupHistory, StoreError> {
        let records = store.read_history(group, None).await?;
        Ok(GroupHistory {
            group: group.to_owned(),
            interval_ms: self.interval.as_millis() as u64,
            samples: records.into_iter().map(|r| r.sample).collect(),
        })
    }

    /// The groups of `groups` whose stream this coordinator samples, and their keys.
    fn plan(&self, groups: Vec<GroupView>, buckets: &[u32], memos: &ShardMemos) -> Plan {
        let groups: Vec<GroupView> = groups
            .into_iter()
            .filter(|g| buckets.contains(&due_bucket(&g.stream)))
            .collect();
        let mut shards: HashMap<&str, u32> = HashMap::new();
        for g in &groups {
            let n = g.shards.iter().map(|s| s.shard + 1).max().unwrap_or(0);
            let e = shards.entry(g.stream.as_str()).or_default();
            *e = (*e).max(n);
        }
        let mut seen = HashSet::new();
        let mut keys = Vec::new();
        for g in &groups {
            let n = shards.get(g.stream.as_str()).copied().unwrap_or(1);
            for s in &g.shards {
                if seen.insert(s.key.as_str()) {
                    keys.push((s.key.clone(), memos.phase_ms(&g.stream, s.shard, n)));
                }
            }
        }
        Plan { groups, keys }
    }

    /// Samples the owned groups every interval, forever (spawn it). `list_groups` answers the
    /// groups' views (`None` when they cannot be read: that tick is skipped).
    pub(crate) async fn run<L, Fut>(&self, list_groups: L, deps: SampleDeps<'_>)
    where
        L: Fn() -> Fut,
        Fut: Future<Output = Option<Vec<GroupView>>>,
    {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut memos = ShardMemos::default();
        // The newest sample of each owned group, for the next one's rate.
        let mut newest: HashMap<String, HistoryRecord> = HashMap::new();
        // The document revision of each owned group at the last tick.
        let mut revisions: HashMap<String, u64> = HashMap::new();
        loop {
            tick.tick().await;
            let Some(groups) = list_groups().await else {
                continue;
            };
            let buckets = deps.buckets.borrow().clone();
            let plan = self.plan(groups, &buckets, &memos);
            let now = deps.clock.now_ms();
            let moved = moved_keys(&plan.groups, &mut revisions);
            let due: Vec<String> = plan
                .keys
                .iter()
                .filter(|(k, phase)| moved.contains(k.as_str()) || memos.due(k, *phase, now))
                .map(|(k, _)| k.clone())
                .collect();
            ::metrics::counter!("rsc_lag_sample_reads_total").increment(due.len() as u64);
            let fresh = deps.probe.read_keys_fresh(&due).await;
            for (key, reading) in &fresh {
                memos.record(key, reading.clone(), now);
            }
            if let Some(after) = deps.after {
                after.after_tick(&plan.groups, &fresh, now).await;
            }
            memos.retain(&plan.keys.iter().map(|(k, _)| k.as_str()).collect());
            {
                let owned: HashSet<&str> = plan.groups.iter().map(|g| g.group.as_str()).collect();
                newest.retain(|g, _| owned.contains(g.as_str()));
            }
            let written = self
                .write(&plan.groups, &memos, &newest, now, deps.store)
                .await;
            newest.extend(written);
        }
    }

    /// Writes the sample at `now` of each of `groups` to the store; returns the ones written.
    async fn write(
        &self,
        groups: &[GroupView],
        memos: &ShardMemos,
        newest: &HashMap<String, HistoryRecord>,
        now: u64,
        store: &dyn MetadataStore,
    ) -> Vec<(String, HistoryRecord)> {
        let bounds = self.bounds();
        let samples: Vec<_> = groups
            .iter()
            .map(|g| async move {
                let t = totals(g, memos);
                // A group this coordinator has just taken over: its newest sample is stored.
                let prev = match newest.get(&g.group) {
                    Some(r) => Some(r.clone()),
                    None => match store.read_history(&g.group, Some(1)).await {
                        Ok(mut r) => r.pop(),
                        Err(e) => {
                            debug!(group = %g.group, error = %e, "lag history unreadable; sample skipped");
                            return None;
                        }
                    },
                };
                let record = next_record(prev.as_ref(), now, t);
                match store.append_history(&g.group, &record, bounds).await {
                    Ok(true) => Some((g.group.clone(), record)),
                    Ok(false) => prev.map(|p| (g.group.clone(), p)),
                    Err(e) => {
                        debug!(group = %g.group, error = %e, "lag sample not stored");
                        None
                    }
                }
            })
            .collect();
        futures::stream::iter(samples)
            .buffer_unordered(WRITE_CONCURRENCY)
            .filter_map(std::future::ready)
            .collect()
            .await
    }
}

/// The keys of the groups whose document changed since the last tick (`revisions`, updated
/// to the groups' revisions now): a seek, a pause or resume, a rebalance may have moved what
/// their shards report without anything written to them (a seek's move is recorded in the
/// group document, PROTOCOL §18), so they are read at this tick even when idle.
fn moved_keys<'a>(
    groups: &'a [GroupView],
    revisions: &mut HashMap<String, u64>,
) -> HashSet<&'a str> {
    let mut moved = HashSet::new();
    for g in groups {
        if revisions.insert(g.group.clone(), g.revision) != Some(g.revision) {
            moved.extend(g.shards.iter().map(|s| s.key.as_str()));
        }
    }
    let owned: HashSet<&str> = groups.iter().map(|g| g.group.as_str()).collect();
    revisions.retain(|g, _| owned.contains(g.as_str()));
    moved
}

/// The totals of `g` from the last reading of each of its shards.
fn totals(g: &GroupView, memos: &ShardMemos) -> Totals {
    let stats: Vec<_> = g
        .shards
        .iter()
        .filter_map(|s| memos.stats(&s.key, &g.group))
        .collect();
    let mut t = Totals {
        shards: stats.len(),
        ..Totals::default()
    };
    if !stats.is_empty() {
        // A shard whose lag Redis cannot tell adds nothing; none known is no lag known, not
        // 0.
        t.lag = stats
            .iter()
            .filter_map(|s| s.lag)
            .fold(None, |sum, l| Some(sum.unwrap_or(0) + l));
        t.pending = Some(stats.iter().filter_map(|s| s.pending).sum());
        t.handled = stats
            .iter()
            .map(|s| Some(s.entries_read?.saturating_sub(s.pending?)))
            .sum();
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn totals(lag: u64, handled: u64) -> Totals {
        Totals {
            lag: Some(lag),
            pending: Some(0),
            handled: Some(handled),
            shards: 2,
        }
    }

    /// Appends the sample of `t` at `t_ms` after the stored newest one, as the sampler does.
    async fn record(h: &History, store: &MemoryStore, t_ms: u64, t: Totals) {
        let prev = store.read_history("g", Some(1)).await.unwrap().pop();
        let r = next_record(prev.as_ref(), t_ms, t);
        store.append_history("g", &r, h.bounds()).await.unwrap();
    }

    #[tokio::test]
    async fn rate_from_consecutive_samples_and_bounded_length() {
        let h = History::new(Duration::from_secs(60));
        let store = MemoryStore::new();
        record(&h, &store, 1_000, totals(100, 0)).await;
        record(&h, &store, 31_000, totals(80, 750)).await;
        record(&h, &store, 61_000, totals(80, 40)).await; // went back (reset): no rate
        let s = h.get(&store, "g").await.unwrap().samples;
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].handled_per_s, None);
        assert_eq!(s[1].handled_per_s, Some(25.0));
        assert_eq!(s[2].handled_per_s, None);
        assert_eq!(h.get(&store, "g").await.unwrap().interval_ms, 60_000);
        for i in 0..100 {
            record(&h, &store, 100_000 + i * 60_000, totals(1, i)).await;
        }
        assert_eq!(
            h.get(&store, "g").await.unwrap().samples.len(),
            10,
            "10 minutes at one a minute"
        );
    }

    /// A group whose document changed (a seek is recorded there) has its shards read at the
    /// next tick, idle or not; one that did not change, not; a group no longer owned is
    /// forgotten.
    #[test]
    fn the_shards_of_a_changed_group_are_read_at_the_next_tick() {
        let view = |group: &str, revision: u64, keys: &[&str]| -> GroupView {
            let mut v: GroupView = serde_json::from_value(serde_json::json!({
                "group": group, "stream": "s", "state": "stable", "start": "earliest",
                "session_timeout_ms": 1, "heartbeat_interval_ms": 1, "rebalance_timeout_ms": 1,
                "max_members": null, "assignor": "sticky", "fencing": "lease",
                "group_epoch": 1, "assignment_epoch": 1, "members": [], "shards": [],
                "resharding": null, "revision": revision
            }))
            .expect("a group view");
            v.shards = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    serde_json::from_value(serde_json::json!({
                        "shard": i, "key": k, "target_owner": null, "current_owner": null,
                        "state": "active"
                    }))
                    .expect("a shard view")
                })
                .collect();
            v
        };
        let mut revisions = HashMap::new();
        let first = [view("a", 1, &["s:0", "s:1"]), view("b", 7, &["s:0"])];
        assert_eq!(moved_keys(&first, &mut revisions).len(), 2, "first sight");
        assert!(
            moved_keys(&first, &mut revisions).is_empty(),
            "nothing changed"
        );
        let sought = [view("a", 2, &["s:0", "s:1"]), view("b", 7, &["s:0"])];
        let mut moved: Vec<&str> = moved_keys(&sought, &mut revisions).into_iter().collect();
        moved.sort_unstable();
        assert_eq!(moved, ["s:0", "s:1"]);
        let only_b = [view("b", 7, &["s:0"])];
        assert!(moved_keys(&only_b, &mut revisions).is_empty());
        assert!(
            !revisions.contains_key("a"),
            "a group no longer owned is forgotten"
        );
    }

    #[test]
    fn no_lag_known_is_no_lag_not_zero() {
        use crate::metrics::lag::{GroupReading, ShardStats};
        let mut memos = ShardMemos::default();
        let g: GroupView = serde_json::from_value(serde_json::json!({
            "group": "g", "stream": "s", "state": "stable", "start": "earliest",
            "session_timeout_ms": 1, "heartbeat_interval_ms": 1, "rebalance_timeout_ms": 1,
            "max_members": null, "assignor": "sticky", "fencing": "lease",
            "group_epoch": 1, "assignment_epoch": 1, "members": [],
            "shards": [{"shard": 0, "key": "s:0", "target_owner": null, "current_owner": null,
                "state": "active"}],
            "resharding": null, "revision": 1
        }))
        .expect("a group view");
        let reading = |lag: Option<u64>| {
            Some(vec![GroupReading {
                group: "g".into(),
                last_delivered: "5-0".into(),
                stats: ShardStats {
                    lag,
                    pending: Some(0),
                    entries_read: None,
                    oldest_undelivered_ms: None,
                },
            }])
        };
        memos.record("s:0", reading(None), 1);
        assert_eq!(super::totals(&g, &memos).lag, None);
        memos.record("s:0", reading(Some(4)), 2);
        assert_eq!(super::totals(&g, &memos).lag, Some(4));
    }

    #[tokio::test]
    async fn a_shard_count_change_gives_no_rate_and_a_second_sampler_is_ignored() {
        let h = History::new(Duration::from_secs(1));
        let store = MemoryStore::new();
        record(&h, &store, 1_000, totals(0, 10)).await;
        record(
            &h,
            &store,
            2_000,
            Totals {
                shards: 3,
                ..totals(0, 20)
            },
        )
        .await;
        // Another coordinator's sample of the same tick (during a hand-over) is not kept.
        record(&h, &store, 2_100, totals(0, 30)).await;
        let s = h.get(&store, "g").await.unwrap().samples;
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].handled_per_s, None);
    }
}
