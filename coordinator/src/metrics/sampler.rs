//! Which shard keys the lag sampler reads at a tick (ARCHITECTURE "How lag is sampled").
//!
//! The sampler remembers, per shard key, what its last `XINFO GROUPS` answered. A key is
//! **idle** when its last read answered exactly what the read before it did (every Redis
//! consumer group's `last-delivered-id`, `entries-read`, `pending` and `lag`) and every group
//! on it is caught up (lag 0, nothing pending), or the key did not exist either time. Redis
//! cannot tell whether a stream moved without being asked, so an idle key is still read,
//! once per [`IDLE_REREAD`], at its own phase of that period (the shards of a stream spread
//! evenly over it, so the reads do not come in bursts); every other key is read at every
//! tick. A group with a backlog or entries in flight is thus sampled every interval, and a
//! stream where nothing moves costs one command per shard per minute.
//!
//! No I/O and no clock here: the caller passes the time (from its [`crate::clock::Clock`]).

use super::lag::KeyReading;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How often an idle shard key is read (see the module docs).
pub(crate) const IDLE_REREAD: Duration = Duration::from_secs(60);

/// What the sampler knows of one key.
#[derive(Debug, Clone)]
struct Memo {
    reading: KeyReading,
    read_at_ms: u64,
    idle: bool,
}

/// The last reading of every key the sampler watches, and the rule that says which are due.
#[derive(Debug)]
pub(crate) struct ShardMemos {
    period_ms: u64,
    memos: HashMap<String, Memo>,
}

impl Default for ShardMemos {
    fn default() -> Self {
        ShardMemos::new(IDLE_REREAD)
    }
}

/// Whether every Redis consumer group of `reading` is caught up (nothing to deliver, nothing
/// in flight); a missing key has nothing to report either.
fn caught_up(reading: &KeyReading) -> bool {
    reading.as_ref().is_none_or(|groups| {
        groups
            .iter()
            .all(|g| g.stats.lag == Some(0) && g.stats.pending == Some(0))
    })
}

impl ShardMemos {
    /// Idle keys re-read once per `period` (at least 1 ms).
    pub(crate) fn new(period: Duration) -> Self {
        ShardMemos {
            period_ms: (period.as_millis() as u64).max(1),
            memos: HashMap::new(),
        }
    }

    /// The phase (ms within the idle period) of shard `shard` of a stream of `shards`
    /// shards: the stream's shards spread evenly over the period, from an offset of the
    /// stream's own (so that two streams are not read at the same instant).
    pub(crate) fn phase_ms(&self, stream: &str, shard: u32, shards: u32) -> u64 {
        let p = self.period_ms;
        let offset = rsc_protocol::routing::key_hash(stream.as_bytes()) % p;
        let spread = u64::from(shard) * p / u64::from(shards.max(1));
        (offset + spread) % p
    }

    /// Whether `key` (of phase `phase_ms`, see [`Self::phase_ms`]) is to be read at `now_ms`:
    /// a key never read, or not idle, always; an idle one when its phase came round since
    /// its last read.
    pub(crate) fn due(&self, key: &str, phase_ms: u64, now_ms: u64) -> bool {
        let Some(m) = self.memos.get(key) else {
            return true;
        };
        if !m.idle {
            return true;
        }
        // The number of phase instants (k·period + phase) up to a time.
        let p = self.period_ms;
        let rounds = |t: u64| (t + p - phase_ms % p) / p;
        rounds(now_ms) > rounds(m.read_at_ms)
    }

    /// Records what a read of `key` at `now_ms` answered.
    pub(crate) fn record(&mut self, key: &str, reading: KeyReading, now_ms: u64) {
        let idle = self
            .memos
            .get(key)
            .is_some_and(|m| m.reading == reading && caught_up(&reading));
        self.memos.insert(
            key.to_owned(),
            Memo {
                reading,
                read_at_ms: now_ms,
                idle,
            },
        );
    }

    /// What the last read of `key` told of `group` (`None`: never read, no such key, or no
    /// such group on it).
    pub(crate) fn stats(&self, key: &str, group: &str) -> Option<super::lag::ShardStats> {
        let groups = self.memos.get(key)?.reading.as_ref()?;
        groups.iter().find(|g| g.group == group).map(|g| g.stats)
    }

    /// Forgets every key not in `keys` (no longer sampled by this coordinator).
    pub(crate) fn retain(&mut self, keys: &HashSet<&str>) {
        self.memos.retain(|k, _| keys.contains(k.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::metrics::lag::{GroupReading, ShardStats};

    fn reading(lag: u64, pending: u64, read: u64) -> KeyReading {
        Some(vec![GroupReading {
            group: "g".into(),
            last_delivered: format!("{read}-0"),
            stats: ShardStats {
                lag: Some(lag),
                pending: Some(pending),
                entries_read: Some(read),
                oldest_undelivered_ms: None,
            },
        }])
    }

    /// Ticks every `tick_ms` for `for_ms`, reading `key` whenever due with what `answer`
    /// says; returns the times it was read.
    fn run(
        memos: &mut ShardMemos,
        clock: &ManualClock,
        key: &str,
        phase: u64,
        tick_ms: u64,
        for_ms: u64,
        answer: impl Fn(u64) -> KeyReading,
    ) -> Vec<u64> {
        let mut reads = Vec::new();
        let end = clock.now_ms() + for_ms;
        while clock.now_ms() < end {
            let now = clock.now_ms();
            if memos.due(key, phase, now) {
                memos.record(key, answer(now), now);
                reads.push(now);
            }
            clock.advance(tick_ms);
        }
        reads
    }

    #[test]
    fn an_idle_shard_is_read_once_a_minute() {
        let clock = ManualClock::new(1_700_000_000_000);
        let mut memos = ShardMemos::default();
        let phase = memos.phase_ms("orders", 3, 16);
        // Two reads to see that nothing moved, then one per minute.
        let reads = run(
            &mut memos,
            &clock,
            "orders:3",
            phase,
            1_000,
            300_000,
            |_| reading(0, 0, 40),
        );
        assert_eq!(
            reads[1] - reads[0],
            1_000,
            "the second read follows at once"
        );
        assert!(
            reads.len() <= 2 + 5 && reads.len() >= 2 + 4,
            "{} reads in 5 minutes",
            reads.len()
        );
        for w in reads[2..].windows(2) {
            assert_eq!(
                w[1] - w[0],
                60_000,
                "idle re-reads a minute apart: {reads:?}"
            );
        }
        assert_eq!(memos.stats("orders:3", "g").and_then(|s| s.lag), Some(0));
    }

    #[test]
    fn a_shard_with_a_backlog_or_entries_in_flight_is_read_every_tick() {
        let clock = ManualClock::new(1_000_000);
        let mut memos = ShardMemos::default();
        let backlog = run(&mut memos, &clock, "k", 0, 1_000, 30_000, |_| {
            reading(200, 0, 0)
        });
        assert_eq!(
            backlog.len(),
            30,
            "lag 200, nothing moving: still every tick"
        );
        let mut memos = ShardMemos::default();
        let in_flight = run(&mut memos, &clock, "k", 0, 1_000, 30_000, |_| {
            reading(0, 5, 10)
        });
        assert_eq!(in_flight.len(), 30, "entries pending: every tick");
    }

    #[test]
    fn a_change_makes_an_idle_shard_active_again() {
        let clock = ManualClock::new(1_000_000);
        let mut memos = ShardMemos::default();
        let phase = memos.phase_ms("s", 0, 1);
        run(&mut memos, &clock, "k", phase, 1_000, 5_000, |_| {
            reading(0, 0, 7)
        });
        let now = clock.now_ms();
        assert!(!memos.due("k", phase, now), "idle after two equal reads");
        // The re-read at its phase sees new entries: read at every tick from then on, until
        // two reads agree again with everything handled.
        let mut t = now;
        while !memos.due("k", phase, t) {
            t += 1_000;
        }
        memos.record("k", reading(3, 0, 7), t);
        assert!(memos.due("k", phase, t + 1_000));
        memos.record("k", reading(0, 0, 10), t + 1_000);
        assert!(memos.due("k", phase, t + 2_000), "changed at its last read");
        memos.record("k", reading(0, 0, 10), t + 2_000);
        assert!(!memos.due("k", phase, t + 3_000));
    }

    #[test]
    fn a_missing_key_goes_idle_and_a_forgotten_one_is_read_again() {
        let clock = ManualClock::new(5_000_000);
        let mut memos = ShardMemos::default();
        let reads = run(&mut memos, &clock, "k", 0, 1_000, 10_000, |_| None);
        assert!(reads.len() <= 3, "{reads:?}");
        memos.retain(&HashSet::new());
        assert!(memos.due("k", 0, clock.now_ms()));
    }

    #[test]
    fn the_shards_of_a_stream_spread_over_the_minute() {
        let clock = ManualClock::new(1_700_000_000_000);
        let mut memos = ShardMemos::default();
        let n = 240;
        let phases: Vec<u64> = (0..n).map(|s| memos.phase_ms("orders", s, n)).collect();
        let keys: Vec<String> = (0..n).map(|s| format!("orders:{s}")).collect();
        // Warm up: everything read twice, then idle.
        for _ in 0..2 {
            for k in &keys {
                memos.record(k, reading(0, 0, 1), clock.now_ms());
            }
            clock.advance(1_000);
        }
        let mut per_tick = Vec::new();
        for _ in 0..120 {
            let now = clock.now_ms();
            let mut n_read = 0;
            for (k, &p) in keys.iter().zip(&phases) {
                if memos.due(k, p, now) {
                    memos.record(k, reading(0, 0, 1), now);
                    n_read += 1;
                }
            }
            per_tick.push(n_read);
            clock.advance(1_000);
        }
        let total: usize = per_tick.iter().sum();
        assert_eq!(
            total,
            2 * n as usize,
            "each shard once per minute over 2 minutes"
        );
        assert!(
            per_tick.iter().all(|&c| c <= 5),
            "240 shards over 60 one-second ticks: about 4 a tick, {per_tick:?}"
        );
    }
}
