//! The member's lease: how long it may keep handling messages without a successful heartbeat
//! (PROTOCOL §5.3 self-fencing). Pure: time is passed in.

use std::time::Duration;
use tokio::time::Instant;

/// The share of the session timeout kept as a safety margin: the member stops handling this
/// long before the coordinator could expire it (the protocol asks for at least 10%).
pub(crate) const SAFETY_MARGIN_PERCENT: u32 = 20;

/// Tracks when the last successful heartbeat was *sent* (monotonic clock), and whether the
/// member already self-fenced on this lease running out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    last_ok_sent: Option<Instant>,
    session: Duration,
    /// The member self-fenced when this lease ran out (until the next renewal).
    lapsed: bool,
}

impl Lease {
    pub(crate) fn new() -> Self {
        Lease {
            last_ok_sent: None,
            session: Duration::ZERO,
            lapsed: false,
        }
    }

    /// A heartbeat sent at `sent_at` succeeded; the group's session timeout is `session`.
    /// An older success (answers can arrive out of order) does not move the lease back.
    /// `true` when the member had self-fenced on the lease running out (it resumes now).
    pub(crate) fn renewed(&mut self, sent_at: Instant, session: Duration) -> bool {
        if self.last_ok_sent.is_none_or(|t| sent_at > t) {
            self.last_ok_sent = Some(sent_at);
        }
        self.session = session;
        std::mem::take(&mut self.lapsed)
    }

    /// The member self-fenced on the lease running out: [`Lease::fence_deadline`] is `None`
    /// until the next renewal.
    pub(crate) fn lapse(&mut self) {
        self.lapsed = true;
    }

    /// When the member must self-fence: the [`Lease::deadline`], unless it did already on
    /// this lease.
    pub(crate) fn fence_deadline(&self) -> Option<Instant> {
        if self.lapsed { None } else { self.deadline() }
    }

    /// When the member must stop handling: `session − margin` after the last successful send.
    /// `None` before the first success.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let margin = self.session * SAFETY_MARGIN_PERCENT / 100;
        self.last_ok_sent.map(|t| t + (self.session - margin))
    }

    /// Whether the lease ran out at `now`.
    #[cfg(test)]
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_before_the_coordinator_expires_the_member() {
        let t0 = Instant::now();
        let session = Duration::from_millis(3000);
        let mut lease = Lease::new();
        assert_eq!(lease.deadline(), None);
        assert!(!lease.expired(t0 + Duration::from_secs(3600)));
        lease.renewed(t0, session);
        let deadline = lease.deadline().unwrap();
        // At least 10% margin: well before the coordinator's session timeout.
        assert!(deadline <= t0 + session - session / 10);
        assert!(deadline > t0 + session / 2);
        assert!(!lease.expired(deadline - Duration::from_millis(1)));
        assert!(lease.expired(deadline));
    }

    #[test]
    fn a_lapsed_lease_fences_once_until_renewed() {
        let t0 = Instant::now();
        let s = Duration::from_millis(1000);
        let mut lease = Lease::new();
        assert!(!lease.renewed(t0, s));
        assert_eq!(lease.fence_deadline(), lease.deadline());
        lease.lapse();
        assert_eq!(lease.fence_deadline(), None);
        assert!(lease.deadline().is_some());
        // Even an older success resumes (as before: the deadline is checked again).
        assert!(lease.renewed(t0, s));
        assert_eq!(lease.fence_deadline(), lease.deadline());
        assert!(!lease.renewed(t0 + s, s));
    }

    #[test]
    fn an_older_success_does_not_shorten_the_lease() {
        let t0 = Instant::now();
        let s = Duration::from_millis(1000);
        let mut lease = Lease::new();
        lease.renewed(t0 + Duration::from_millis(500), s);
        let d = lease.deadline();
        lease.renewed(t0, s);
        assert_eq!(lease.deadline(), d);
        lease.renewed(t0 + Duration::from_millis(900), s);
        assert!(lease.deadline() > d);
    }
}
