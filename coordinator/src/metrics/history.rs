//! A short history of each group's lag and handling rate, for the dashboard's chart and
//! `GET /v1/groups/{group}/history`.
//!
//! [`History::run`] samples every group from the data Redis every interval (default 5 s,
//! `--history-interval-ms`) and keeps the last [`HISTORY_SPAN`]. Lag and pending entries are
//! summed over the group's shards (`XINFO GROUPS`); the handling rate is the change of
//! `entries-read − pending` (entries delivered and acknowledged) between two samples. Each
//! coordinator keeps its own history in memory: a restarted coordinator starts a new one.

use super::lag::LagProbe;
use rsc_protocol::{GroupHistory, GroupView, HistorySample};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

/// How far back the history goes.
pub(crate) const HISTORY_SPAN: Duration = Duration::from_secs(10 * 60);

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

#[derive(Debug, Default)]
struct Series {
    samples: VecDeque<HistorySample>,
    /// The previous sample's handled count, time and shard count.
    last: Option<(u64, u64, usize)>,
}

/// Per-group samples (see the module docs).
#[derive(Debug)]
pub(crate) struct History {
    interval: Duration,
    keep: usize,
    groups: Mutex<HashMap<String, Series>>,
}

impl History {
    /// An empty history sampled every `interval` (at least 100 ms).
    pub(crate) fn new(interval: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(100));
        let keep = (HISTORY_SPAN.as_millis() / interval.as_millis()).clamp(2, 6_000) as usize;
        History {
            interval,
            keep,
            groups: Mutex::default(),
        }
    }

    /// Records `totals` of `group` at `t_ms`; the rate comes from the previous sample.
    pub(crate) fn record(&self, group: &str, t_ms: u64, totals: Totals) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let series = groups.entry(group.to_owned()).or_default();
        let handled_per_s = match (series.last, totals.handled) {
            (Some((prev, prev_t, prev_shards)), Some(now))
                if t_ms > prev_t && now >= prev && prev_shards == totals.shards =>
            {
                Some((now - prev) as f64 * 1000.0 / (t_ms - prev_t) as f64)
            }
            _ => None,
        };
        series.last = totals.handled.map(|h| (h, t_ms, totals.shards));
        series.samples.push_back(HistorySample {
            t_ms,
            lag: totals.lag,
            pending: totals.pending,
            handled_per_s,
        });
        while series.samples.len() > self.keep {
            series.samples.pop_front();
        }
    }

    /// Drops the history of groups that no longer exist.
    pub(crate) fn retain(&self, live: &HashSet<String>) {
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|g, _| live.contains(g));
    }

    /// The samples of `group`, oldest first (none yet: empty).
    pub(crate) fn get(&self, group: &str) -> GroupHistory {
        let groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        GroupHistory {
            group: group.to_owned(),
            interval_ms: self.interval.as_millis() as u64,
            samples: groups
                .get(group)
                .map(|s| s.samples.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// Samples every group every interval, forever (spawn it). `list_groups` answers the
    /// groups' views (`None` when they cannot be read: that tick is skipped); `now_ms` tells
    /// the coordinator's time each sample is recorded at.
    pub(crate) async fn run<L, Fut>(
        &self,
        list_groups: L,
        now_ms: impl Fn() -> u64,
        probe: &LagProbe,
    ) where
        L: Fn() -> Fut,
        Fut: Future<Output = Option<Vec<GroupView>>>,
    {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(groups) = list_groups().await else {
                continue;
            };
            let live: HashSet<String> = groups.iter().map(|g| g.group.clone()).collect();
            for g in groups {
                let keys: Vec<(u32, String)> =
                    g.shards.iter().map(|s| (s.shard, s.key.clone())).collect();
                let stats = probe.group_stats(&g.group, &keys).await;
                let mut t = Totals {
                    shards: stats.len(),
                    ..Totals::default()
                };
                if !stats.is_empty() {
                    t.lag = Some(stats.values().filter_map(|s| s.lag).sum());
                    t.pending = Some(stats.values().filter_map(|s| s.pending).sum());
                    t.handled = stats
                        .values()
                        .map(|s| Some(s.entries_read?.saturating_sub(s.pending?)))
                        .sum();
                }
                self.record(&g.group, now_ms(), t);
            }
            self.retain(&live);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(lag: u64, handled: u64) -> Totals {
        Totals {
            lag: Some(lag),
            pending: Some(0),
            handled: Some(handled),
            shards: 2,
        }
    }

    #[test]
    fn rate_from_consecutive_samples_and_bounded_length() {
        let h = History::new(Duration::from_secs(60));
        h.record("g", 1_000, totals(100, 0));
        h.record("g", 3_000, totals(80, 50));
        h.record("g", 4_000, totals(80, 40)); // went back (reset): no rate
        let s = h.get("g").samples;
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].handled_per_s, None);
        assert_eq!(s[1].handled_per_s, Some(25.0));
        assert_eq!(s[2].handled_per_s, None);
        assert_eq!(h.get("g").interval_ms, 60_000);
        for i in 0..100 {
            h.record("g", 5_000 + i, totals(1, i));
        }
        assert_eq!(h.get("g").samples.len(), 10, "10 minutes at one a minute");
        h.retain(&HashSet::new());
        assert!(h.get("g").samples.is_empty());
    }

    #[test]
    fn a_shard_count_change_gives_no_rate() {
        let h = History::new(Duration::from_secs(1));
        h.record("g", 1_000, totals(0, 10));
        h.record(
            "g",
            2_000,
            Totals {
                shards: 3,
                ..totals(0, 20)
            },
        );
        assert_eq!(h.get("g").samples[1].handled_per_s, None);
    }
}
