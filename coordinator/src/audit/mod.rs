//! The audit trail of admin mutations (PROTOCOL §7).
//!
//! Every admin request, allowed or refused (401, 403, 429, 4xx, 5xx), becomes one
//! [`AuditEntry`]: time, principal, action, target, request, result and the revisions of
//! the store documents it wrote. The entry is emitted as a tracing event (target
//! `rsc::audit`) and appended to the store's audit log ([`MetadataStore::append_audit`];
//! `rsc:audit` on Redis, a bounded ring in memory).
//!
//! Revisions are captured without threading them through the service: the access
//! middleware runs the handler inside a [`RevisionLog`] scope, and the
//! [`RevisionRecordingStore`] decorator reports every document write made inside that scope.

mod recorder;

pub(crate) use recorder::{RevisionLog, RevisionRecordingStore};

use crate::clock::Clock;
use crate::store::MetadataStore;
use rsc_protocol::AuditEntry;
use std::sync::Arc;
use tracing::{error, info};

/// Writes audit entries to the store and to the log.
#[derive(Debug, Clone)]
pub(crate) struct Auditor {
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
}

impl Auditor {
    /// An auditor writing to `store`, stamping entries with `clock`.
    pub(crate) fn new(store: Arc<dyn MetadataStore>, clock: Arc<dyn Clock>) -> Self {
        Auditor { store, clock }
    }

    /// The current time for an entry (Unix ms).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Emits `entry` as a tracing event and appends it to the store. A store failure is
    /// logged and counted (`rsc_audit_write_errors_total`), never turned into an answer: the
    /// mutation it describes has already happened.
    pub(crate) async fn record(&self, entry: AuditEntry) {
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
            status = entry.result.status,
            code,
            revisions = ?entry.revisions,
            "audit"
        );
        let outcome = if entry.result.status < 400 {
            "allowed"
        } else {
            "refused"
        };
        metrics::counter!("rsc_audit_entries_total", "outcome" => outcome).increment(1);
        if let Err(e) = self.store.append_audit(&entry).await {
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
