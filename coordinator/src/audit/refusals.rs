//! Refused requests merged into counted audit entries (PROTOCOL §7, "Refusals").
//!
//! A refusal is known by its client address, principal, credential, route and answer; never
//! by its body, its concrete path or its query, which the client chooses freely. The first
//! refusal of a kind in an interval is written at once, as an entry of `count` 1; the ones
//! alike that follow in the same interval are counted and written as one entry when the
//! interval closes. So an audit log takes at most two entries per kind and interval, whatever
//! a client sends; and at most `kinds_max` kinds are told apart per interval — past that, the
//! refusals of new kinds are merged under `*` for client address, principal, method and
//! action (only the route, status and code are kept, and those are bounded by the route
//! table).
//!
//! Pure: events in (a refusal and the time), entries out; the driver is
//! [`super::Auditor::refused`] and the flush task of the server.

use rsc_protocol::{AuditEntry, AuditRequest, AuditResult, AuditTarget, ErrorCode};
use std::collections::HashMap;

/// The client address under which refusals past the interval's `kinds_max` are merged.
pub(crate) const OTHER_CLIENTS: &str = "*";

/// One refused request, as the refusal log tells refusals apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Refusal {
    /// The client address ([`crate::auth::ClientAddr`]'s text).
    pub client_addr: String,
    /// The principal when the credential was valid, else `anonymous`.
    pub principal: String,
    /// How it was authenticated (`None`: no valid credential).
    pub credential: Option<&'static str>,
    /// The admin action of the route, or `METHOD template` for other routes.
    pub action: String,
    /// HTTP method.
    pub method: String,
    /// The route's path template (`/v1/groups/{group}`), not the concrete path.
    pub route: String,
    /// The answer's status.
    pub status: u16,
    /// The answer's error code.
    pub code: ErrorCode,
}

impl Refusal {
    fn entry(&self, time_ms: u64, count: u64, since_ms: u64) -> AuditEntry {
        AuditEntry {
            time_ms,
            principal: self.principal.clone(),
            credential: self.credential.map(str::to_owned),
            action: self.action.clone(),
            target: AuditTarget::default(),
            request: AuditRequest {
                method: self.method.clone(),
                path: self.route.clone(),
                query: None,
                body: None,
            },
            result: AuditResult {
                status: self.status,
                code: Some(self.code),
            },
            revisions: Vec::new(),
            client_addr: Some(self.client_addr.clone()),
            count: Some(count),
            since_ms: Some(since_ms),
        }
    }
}

/// The refusals after the first of one kind in the current interval.
#[derive(Debug, Clone, Copy)]
struct Tally {
    /// How many came after the first.
    more: u64,
    /// When the second came (Unix ms).
    since_ms: u64,
    /// When the last came (Unix ms).
    last_ms: u64,
}

/// The refusals of the current interval, by kind (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct RefusalMerger {
    kinds_max: usize,
    open: HashMap<Refusal, Tally>,
}

impl RefusalMerger {
    /// A merger telling at most `kinds_max` kinds apart per interval (at least 1).
    pub(crate) fn new(kinds_max: usize) -> Self {
        RefusalMerger {
            kinds_max: kinds_max.max(1),
            open: HashMap::new(),
        }
    }

    /// A refusal at `now_ms`: the entry to write at once when it is the first of its kind in
    /// this interval, else `None` (it is counted).
    pub(crate) fn note(&mut self, mut refusal: Refusal, now_ms: u64) -> Option<AuditEntry> {
        if !self.open.contains_key(&refusal) && self.open.len() >= self.kinds_max {
            // Only what the route table bounds is kept: the route, status and code. The
            // method is the client's word too (any extension method reaches a known path).
            refusal.client_addr = OTHER_CLIENTS.to_owned();
            refusal.principal = OTHER_CLIENTS.to_owned();
            refusal.credential = None;
            refusal.method = OTHER_CLIENTS.to_owned();
            refusal.action = OTHER_CLIENTS.to_owned();
        }
        match self.open.get_mut(&refusal) {
            Some(t) => {
                if t.more == 0 {
                    t.since_ms = now_ms;
                }
                t.more += 1;
                t.last_ms = now_ms;
                None
            }
            None => {
                let entry = refusal.entry(now_ms, 1, now_ms);
                let tally = Tally {
                    more: 0,
                    since_ms: now_ms,
                    last_ms: now_ms,
                };
                self.open.insert(refusal, tally);
                Some(entry)
            }
        }
    }

    /// Closes the interval: one entry per kind that came again after its first, counting
    /// those, oldest first. The next refusal of any kind is a first again.
    pub(crate) fn flush(&mut self) -> Vec<AuditEntry> {
        let mut out: Vec<AuditEntry> = self
            .open
            .drain()
            .filter(|(_, t)| t.more > 0)
            .map(|(r, t)| r.entry(t.last_ms, t.more, t.since_ms))
            .collect();
        out.sort_by_key(|e| e.time_ms);
        out
    }

    /// How many kinds the current interval holds.
    #[cfg(test)]
    pub(crate) fn kinds(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refusal(client: &str, code: ErrorCode) -> Refusal {
        Refusal {
            client_addr: client.into(),
            principal: "anonymous".into(),
            credential: None,
            action: "group.create".into(),
            method: "POST".into(),
            route: "/v1/groups".into(),
            status: code.http_status(),
            code,
        }
    }

    #[test]
    fn the_first_is_written_and_the_rest_counted() {
        let mut m = RefusalMerger::new(10);
        let first = m
            .note(refusal("127.0.0.2", ErrorCode::Unauthenticated), 1_000)
            .expect("the first of its kind is written at once");
        assert_eq!(
            (first.count, first.since_ms, first.time_ms),
            (Some(1), Some(1_000), 1_000)
        );
        assert_eq!(first.client_addr.as_deref(), Some("127.0.0.2"));
        assert_eq!(first.request.body, None);
        for t in 0..99 {
            assert!(
                m.note(refusal("127.0.0.2", ErrorCode::Unauthenticated), 1_001 + t)
                    .is_none()
            );
        }
        // Another address, another code: other kinds.
        assert!(
            m.note(refusal("127.0.0.3", ErrorCode::Unauthenticated), 1_200)
                .is_some()
        );
        assert!(
            m.note(refusal("127.0.0.2", ErrorCode::Forbidden), 1_200)
                .is_some()
        );
        let flushed = m.flush();
        assert_eq!(
            flushed.len(),
            1,
            "only the kind that came again: {flushed:?}"
        );
        let e = &flushed[0];
        assert_eq!(
            (e.count, e.since_ms, e.time_ms),
            (Some(99), Some(1_001), 1_099)
        );
        assert_eq!(m.kinds(), 0);
        // A new interval: a first again.
        assert!(
            m.note(refusal("127.0.0.2", ErrorCode::Unauthenticated), 2_000)
                .is_some()
        );
    }

    #[test]
    fn kinds_past_the_bound_merge_under_other_clients() {
        let mut m = RefusalMerger::new(2);
        assert!(
            m.note(refusal("a", ErrorCode::Unauthenticated), 1)
                .is_some()
        );
        assert!(
            m.note(refusal("b", ErrorCode::Unauthenticated), 2)
                .is_some()
        );
        let e = m
            .note(refusal("c", ErrorCode::Unauthenticated), 3)
            .expect("the first merged one is written");
        assert_eq!(e.client_addr.as_deref(), Some(OTHER_CLIENTS));
        assert!(
            m.note(refusal("d", ErrorCode::Unauthenticated), 4)
                .is_none()
        );
        let f = m.flush();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].client_addr.as_deref(), Some(OTHER_CLIENTS));
        assert_eq!(f[0].count, Some(1));
    }

    proptest! {
        /// Whatever arrives, every refusal is counted exactly once, and an interval writes
        /// at most two entries per kind and at most `2 × (kinds_max + kinds merged)`.
        #[test]
        fn every_refusal_is_counted_once(
            clients in proptest::collection::vec(0u8..20, 1..400),
            kinds_max in 1usize..8,
        ) {
            let mut m = RefusalMerger::new(kinds_max);
            let mut written = Vec::new();
            for (t, c) in clients.iter().enumerate() {
                written.extend(m.note(refusal(&c.to_string(), ErrorCode::Unauthenticated), t as u64));
            }
            written.extend(m.flush());
            let total: u64 = written.iter().map(|e| e.count.unwrap()).sum();
            prop_assert_eq!(total, clients.len() as u64);
            prop_assert!(written.len() <= 2 * (kinds_max + 1));
        }
    }
}
