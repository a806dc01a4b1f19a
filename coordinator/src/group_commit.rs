//! Group commit: requests that arrive while a call to Redis is in flight wait and go out
//! together in the next call, so that under load one call answers many requests.
//!
//! Used by the steady-heartbeat touches of the Redis store and by the owner-token
//! re-assertion of strict fencing (docs/FENCING.md), which both send one small script call
//! per heartbeat otherwise. [`Queues`] holds only the policy: when a flusher must start, and
//! what it sends next; the caller spawns the flushers and sends the calls.
//!
//! The policy: a queue with no flusher starts one. While the queue is short, one call is in
//! flight at a time. Once [`PIPELINE_AT`] requests wait, another flusher starts, up to
//! [`MAX_FLUSHES`], so that Redis executes one call while the next is on its way. A call's
//! fixed cost in Redis (`EVALSHA`, the script's set-up) is about that of one item (measured
//! on Redis 7.0: 6.9 µs for a call of one touch, 3.8 µs per further touch), so a batch of
//! 16 already spends at most ~5 % of its Redis time on it; waiting for more only leaves the
//! requests, and the cores, idle (docs/benchmarks/HISTORY.md, "touch pipelining").

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// Requests waiting that start another call beside the one in flight (up to
/// [`MAX_FLUSHES`]).
pub(crate) const PIPELINE_AT: usize = 16;

/// Most calls of one queue in flight at once.
pub(crate) const MAX_FLUSHES: usize = 4;

/// Waiting requests, by queue key (one queue per group of requests that one call can serve:
/// on a Redis Cluster, the requests of one slot).
pub(crate) struct Queues<K, T> {
    queues: Mutex<HashMap<K, Queue<T>>>,
}

struct Queue<T> {
    /// Flushers running for this queue.
    flushing: usize,
    waiting: Vec<T>,
}

impl<K, T> Default for Queues<K, T> {
    fn default() -> Self {
        Queues {
            queues: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone, T> Queues<K, T> {
    /// Queues every `(key, request)` under one lock; returns the key of each flusher to start
    /// (a key may appear more than once: one entry per flusher).
    pub(crate) fn push(&self, requests: impl IntoIterator<Item = (K, T)>) -> Vec<K> {
        let mut start = Vec::new();
        // A poisoned lock only means a panic elsewhere while the map was consistent (every
        // change below is one push or one drain): the queues stay usable.
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for (key, request) in requests {
            let queue = match queues.get_mut(&key) {
                Some(queue) => queue,
                None => queues.entry(key.clone()).or_insert_with(|| Queue {
                    flushing: 0,
                    waiting: Vec::new(),
                }),
            };
            queue.waiting.push(request);
            if queue.flushing == 0
                || (queue.flushing < MAX_FLUSHES && queue.waiting.len() >= PIPELINE_AT)
            {
                queue.flushing += 1;
                start.push(key);
            }
        }
        start
    }

    /// The next batch for a flusher of `key`: the oldest waiting requests, as many as fit in
    /// `budget` by `weight` (at least one). `None` when nothing waits: the flusher must end
    /// (it is no longer counted).
    pub(crate) fn next_batch(
        &self,
        key: &K,
        budget: usize,
        weight: impl Fn(&T) -> usize,
    ) -> Option<Vec<T>> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queue = queues.get_mut(key)?;
        if queue.waiting.is_empty() {
            queue.flushing = queue.flushing.saturating_sub(1);
            if queue.flushing == 0 {
                queues.remove(key);
            }
            return None;
        }
        let mut used = 0;
        let n = queue
            .waiting
            .iter()
            .take_while(|r| {
                let first = used == 0;
                used += weight(r);
                first || used <= budget
            })
            .count();
        Some(queue.waiting.drain(..n).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_starts_a_flusher_and_later_ones_ride_along() {
        let q: Queues<&str, u32> = Queues::default();
        assert_eq!(q.push([("a", 1)]), vec!["a"]);
        assert!(q.push([("a", 2), ("a", 3)]).is_empty());
        assert_eq!(
            q.push([("b", 4)]),
            vec!["b"],
            "each queue has its own flusher"
        );
        assert_eq!(q.next_batch(&"a", 10, |_| 1), Some(vec![1, 2, 3]));
        assert_eq!(
            q.next_batch(&"a", 10, |_| 1),
            None,
            "drained: the flusher ends"
        );
        assert_eq!(
            q.push([("a", 5)]),
            vec!["a"],
            "and the next request starts one"
        );
    }

    #[test]
    fn a_long_queue_starts_more_flushers_up_to_the_limit() {
        let q: Queues<u8, usize> = Queues::default();
        let started = q.push((0..PIPELINE_AT * (MAX_FLUSHES + 2)).map(|i| (0, i)));
        assert_eq!(started.len(), MAX_FLUSHES);
    }

    #[test]
    fn a_batch_fits_its_budget_but_always_takes_one() {
        let q: Queues<u8, usize> = Queues::default();
        q.push([(0, 300), (0, 1), (0, 2), (0, 250)]);
        let w = |n: &usize| *n;
        assert_eq!(
            q.next_batch(&0, 256, w),
            Some(vec![300]),
            "oversized, alone"
        );
        assert_eq!(q.next_batch(&0, 256, w), Some(vec![1, 2, 250]));
        assert_eq!(q.next_batch(&0, 256, w), None);
    }

    #[test]
    fn only_the_last_flusher_to_end_removes_the_queue() {
        let q: Queues<u8, usize> = Queues::default();
        let started = q.push((0..PIPELINE_AT).map(|i| (0, i)));
        assert_eq!(started.len(), 2);
        assert_eq!(q.next_batch(&0, 1000, |_| 1).map(|b| b.len()), Some(16));
        assert_eq!(q.next_batch(&0, 1000, |_| 1), None, "first flusher ends");
        assert!(q.push([(0, 99)]).is_empty(), "the second one still runs");
        assert_eq!(q.next_batch(&0, 1000, |_| 1), Some(vec![99]));
        assert_eq!(q.next_batch(&0, 1000, |_| 1), None);
        assert_eq!(q.push([(0, 7)]), vec![0]);
    }
}
