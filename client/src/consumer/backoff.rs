//! Delays between retries: exponential with jitter, built on `backon`.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// An endless exponential backoff with jitter between `min` and about `max`.
#[derive(Debug)]
pub(crate) struct Backoff {
    builder: ExponentialBuilder,
    iter: backon::ExponentialBackoff,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Self::seeded(min, max, rand::random())
    }

    /// The same, its jitter drawn from `seed` (the same seed, the same delays).
    pub(crate) fn seeded(min: Duration, max: Duration, seed: u64) -> Self {
        let builder = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max.max(min))
            .with_factor(2.0)
            .with_jitter()
            .with_jitter_seed(seed)
            .without_max_times();
        Backoff {
            iter: builder.build(),
            builder,
        }
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.iter.next().unwrap_or(Duration::from_secs(1))
    }

    /// Back to the shortest delay (after a success).
    pub(crate) fn reset(&mut self) {
        self.iter = self.builder.build();
    }
}

/// The delay before retry number `attempt` (1-based) of a message: `min · 2^(attempt-1)`,
/// capped at `max`, then a random value in its upper half (so that many failing shards do not
/// retry in lock-step).
pub(crate) fn retry_delay(attempt: u32, min: Duration, max: Duration) -> Duration {
    let exp = min.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let d = exp.min(max);
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_and_stay_capped() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(1));
        for attempt in 1..40 {
            let d = retry_delay(attempt, min, max);
            let cap = (min * 2u32.pow(attempt.min(20) - 1)).min(max);
            assert!(d >= cap / 2 && d <= cap, "attempt {attempt}: {d:?}");
        }
    }

    #[test]
    fn backoff_is_bounded_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let delays: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert!(
            delays.iter().all(|d| *d <= Duration::from_millis(170)),
            "{delays:?}"
        );
        assert!(delays[9] >= Duration::from_millis(80));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(20));
    }
}
