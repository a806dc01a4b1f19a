//! [`Recent`]: what the data Redis answered lately, kept for a short while so that views
//! asked often (dashboards, autoscalers, scrapes of several replicas) cost the data Redis at
//! most one read per key per `max_age`, however often they are asked (PROTOCOL §12,
//! "lag in views"). Pure: the time is passed in.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;
use tokio::time::Instant;

/// Values read at a known time, answered while younger than `max_age`.
#[derive(Debug)]
pub(crate) struct Recent<K, V> {
    max_age: Duration,
    entries: HashMap<K, (Instant, V)>,
    /// Size after the last sweep of stale entries: the next one runs when it doubled.
    swept_at: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Recent<K, V> {
    /// An empty cache answering values younger than `max_age`.
    pub(crate) fn new(max_age: Duration) -> Self {
        Recent {
            max_age,
            entries: HashMap::new(),
            swept_at: 0,
        }
    }

    /// The value of `key` read less than [`Self::max_age`] before `now`.
    pub(crate) fn get(&self, key: &K, now: Instant) -> Option<V> {
        let (at, v) = self.entries.get(key)?;
        (now.saturating_duration_since(*at) < self.max_age).then(|| v.clone())
    }

    /// Forgets every key `drop` says to (their next read goes to Redis).
    pub(crate) fn forget(&mut self, mut drop: impl FnMut(&K) -> bool) {
        self.entries.retain(|k, _| !drop(k));
    }

    /// `key` read as `value` at `at`. Stale entries are dropped whenever the cache doubled
    /// since the last sweep, so it holds about what was read within `max_age`.
    pub(crate) fn put(&mut self, key: K, value: V, at: Instant) {
        self.entries.insert(key, (at, value));
        if self.entries.len() > 2 * self.swept_at.max(64) {
            let max_age = self.max_age;
            self.entries
                .retain(|_, (t, _)| at.saturating_duration_since(*t) < max_age);
            self.swept_at = self.entries.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_answered_for_its_max_age_then_not() {
        let t0 = Instant::now();
        let mut r = Recent::new(Duration::from_millis(1_000));
        assert_eq!(r.get(&"k", t0), None);
        r.put("k", 7, t0);
        assert_eq!(r.get(&"k", t0), Some(7));
        assert_eq!(r.get(&"k", t0 + Duration::from_millis(999)), Some(7));
        assert_eq!(r.get(&"k", t0 + Duration::from_millis(1_000)), None);
        r.put("k", 8, t0 + Duration::from_millis(1_000));
        assert_eq!(r.get(&"k", t0 + Duration::from_millis(1_500)), Some(8));
        assert_eq!(r.get(&"other", t0), None);
    }

    #[test]
    fn stale_entries_do_not_pile_up() {
        let t0 = Instant::now();
        let mut r = Recent::new(Duration::from_millis(10));
        for i in 0..10_000u32 {
            // Each key read once, 1 ms apart: about 10 are fresh at any time.
            r.put(i, i, t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(
            r.entries.len() <= 2 * 64 + 1,
            "{} entries kept",
            r.entries.len()
        );
        assert_eq!(
            r.get(&9_999, t0 + Duration::from_millis(9_999)),
            Some(9_999)
        );
    }
}
