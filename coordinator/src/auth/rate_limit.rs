//! Per-principal token bucket for admin mutations (PROTOCOL §7), on `governor`'s GCRA.
//!
//! The key is the principal's name, so the set of buckets is bounded by the ACL (plus
//! `anonymous`). Heartbeats and reads never pass through here.

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::time::Duration;

/// Admin mutation rate per principal.
pub(crate) struct AdminRateLimiter<C: Clock = DefaultClock> {
    limiter: RateLimiter<String, DefaultKeyedStateStore<String>, C, NoOpMiddleware<C::Instant>>,
    rate: NonZeroU32,
    burst: NonZeroU32,
}

impl<C: Clock> std::fmt::Debug for AdminRateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminRateLimiter")
            .field("rate_per_s", &self.rate)
            .field("burst", &self.burst)
            .finish()
    }
}

impl AdminRateLimiter {
    /// `rate` mutations per second per principal, bursts of up to `burst`.
    pub(crate) fn new(rate: NonZeroU32, burst: NonZeroU32) -> Self {
        Self::with_clock(rate, burst, DefaultClock::default())
    }
}

impl<C: Clock> AdminRateLimiter<C> {
    /// The same with an explicit clock (tests use `governor::clock::FakeRelativeClock`).
    pub(crate) fn with_clock(rate: NonZeroU32, burst: NonZeroU32, clock: C) -> Self {
        let quota = Quota::per_second(rate).allow_burst(burst);
        AdminRateLimiter {
            limiter: RateLimiter::new(quota, DefaultKeyedStateStore::default(), clock),
            rate,
            burst,
        }
    }

    /// Takes one token from `principal`'s bucket, or says how long until one is free.
    pub(crate) fn check(&self, principal: &str) -> Result<(), Duration> {
        self.limiter
            .check_key(&principal.to_owned())
            .map(|_| ())
            .map_err(|not_until| not_until.wait_time_from(self.limiter.clock().now()))
    }
}

/// The `Retry-After` value for a wait: whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    s.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    #[test]
    fn bucket_per_principal_with_refill() {
        let clock = FakeRelativeClock::default();
        let nz = |n| NonZeroU32::new(n).unwrap();
        let l = AdminRateLimiter::with_clock(nz(2), nz(3), clock.clone());
        for _ in 0..3 {
            assert_eq!(l.check("ops"), Ok(()));
        }
        let wait = l.check("ops").unwrap_err();
        assert_eq!(
            wait,
            Duration::from_millis(500),
            "2/s: one token per 500 ms"
        );
        assert_eq!(l.check("other"), Ok(()), "buckets are per principal");
        clock.advance(Duration::from_millis(500));
        assert_eq!(l.check("ops"), Ok(()));
        assert!(l.check("ops").is_err());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
