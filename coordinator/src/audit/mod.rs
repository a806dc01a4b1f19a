//! The audit trail (PROTOCOL §7): admin mutations, and refused requests.
//!
//! Every admin request the access checks admitted, whatever its outcome (2xx, 4xx, 5xx),
//! becomes one [`AuditEntry`]: time, principal, client address, action, target, request
//! (with its body), result and the revisions of the store documents it wrote. It is emitted
//! as a tracing event (target `rsc::audit`) and appended to the store's log of mutations
//! ([`MetadataStore::append_audit`] with [`AuditLog::Mutations`]; `rsc:audit` on Redis, a
//! bounded ring in memory).
//!
//! Refused requests of any protected route (401, 403, 413, 429) go to another log
//! ([`AuditLog::Refusals`], `rsc:audit:refusals`) with its own retention, so that no flood of
//! refusals pushes a mutation out: never with their bodies, and merged per client address,
//! principal, route and code per interval ([`refusals`]).
//!
//! Revisions are captured without threading them through the service: the access
//! middleware runs the handler inside a [`RevisionLog`] scope, and the
//! [`RevisionRecordingStore`] decorator reports every document write made inside that scope.

mod recorder;
pub(crate) mod refusals;

pub(crate) use recorder::{RevisionLog, RevisionRecordingStore};
pub(crate) use refusals::Refusal;

use crate::clock::Clock;
use crate::store::{AuditLog, MetadataStore};
use refusals::RefusalMerger;
use rsc_protocol::AuditEntry;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{error, info};

/// How many kinds of refusal one interval tells apart (PROTOCOL §7): past that, refusals of
/// new kinds are merged under the client address `*`.
pub(crate) const REFUSAL_KINDS_MAX: usize = 1_000;

/// Writes audit entries to the store and to the log.
#[derive(Debug, Clone)]
pub(crate) struct Auditor {
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    refusals: Arc<Mutex<RefusalMerger>>,
}

impl Auditor {
    /// An auditor writing to `store`, stamping entries with `clock`.
    pub(crate) fn new(store: Arc<dyn MetadataStore>, clock: Arc<dyn Clock>) -> Self {
        Auditor {
            store,
            clock,
            refusals: Arc::new(Mutex::new(RefusalMerger::new(REFUSAL_KINDS_MAX))),
        }
    }

    /// Records a refused request: written at once when it is the first of its kind in the
    /// current interval, else counted until [`Auditor::flush_refusals`].
    pub(crate) async fn refused(&self, refusal: Refusal) {
        metrics::counter!("rsc_audit_refusals_total", "code" => refusal.code.as_str()).increment(1);
        let now = self.now_ms();
        // A poisoned lock still holds counts only (no safety decision rests on them).
        let first = self
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(refusal, now);
        if let Some(entry) = first {
            self.write(AuditLog::Refusals, entry).await;
        }
    }

    /// Closes the refusal interval: writes one counted entry per kind of refusal that came
    /// again after its first.
    pub(crate) async fn flush_refusals(&self) {
        let entries = self
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .flush();
        for entry in entries {
            self.write(AuditLog::Refusals, entry).await;
        }
    }

    /// Every `every`: [`Auditor::flush_refusals`]; and `also` (the client limiter's pruning).
    pub(crate) async fn run_refusal_flush(self, every: Duration, also: impl Fn() + Send) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.flush_refusals().await;
            also();
        }
    }

    /// The current time for an entry (Unix ms).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Emits `entry` (a mutation, or an action of the coordinator's own) as a tracing event
    /// and appends it to the store's log of mutations. A store failure is logged and counted
    /// (`rsc_audit_write_errors_total`), never turned into an answer: the mutation it
    /// describes has already happened.
    pub(crate) async fn record(&self, entry: AuditEntry) {
        self.write(AuditLog::Mutations, entry).await;
    }

    async fn write(&self, log: AuditLog, entry: AuditEntry) {
        let code = entry.result.code.map(|c| c.as_str());
        info!(
            target: "rsc::audit",
            principal = %entry.principal,
            credential = entry.credential.as_deref(),
            action = %entry.action,
            group = entry.target.group.as_deref(),
            stream = entry.target.stream.as_deref(),
            member = entry.target.member.as_deref(),
            method = %entry.request.method,
            path = %entry.request.path,
            client = entry.client_addr.as_deref(),
            status = entry.result.status,
            code,
            count = entry.count,
            revisions = ?entry.revisions,
            "audit"
        );
        let outcome = match log {
            AuditLog::Refusals => "refused",
            AuditLog::Mutations if entry.result.status < 400 => "allowed",
            AuditLog::Mutations => "failed",
        };
        metrics::counter!("rsc_audit_entries_total", "outcome" => outcome).increment(1);
        if let Err(e) = self.store.append_audit(log, &entry).await {
            metrics::counter!("rsc_audit_write_errors_total").increment(1);
            error!(
                target: "rsc::audit",
                error = %e,
                principal = %entry.principal,
                action = %entry.action,
                "audit entry not stored"
            );
        }
    }
}
