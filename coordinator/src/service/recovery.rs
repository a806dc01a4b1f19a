//! Restoring what a lost metadata store lost, from the recovery copy (PROTOCOL §2.3).
//!
//! A document is restored only when the store does not hold it and the copy does. The copy
//! of a group is removed before its document is deleted (`CopyLayer`), and every restore
//! reads the store first and the copy after, so a group deleted by an operator is never
//! restored: by the time the store misses it, its copy is gone. Restores are
//! compare-and-sets on an absent document, so two coordinators restoring at once restore it
//! once.

use super::{Coordinator, Result, ServiceError};
use crate::audit::Auditor;
use crate::engine::StreamDoc;
use crate::recovery::{GroupCopy, RecoveryCopy, RecoveryMode, StreamCopy};
use crate::revisions::Cause;
use crate::store::Versioned;
use rsc_protocol::{AuditEntry, AuditRequest, AuditResult, AuditTarget, RevisionChange};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

/// A boxed restore.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// How often a refusal to restore one document (manual mode) is logged.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// The recovery copy and what to do with it.
#[derive(Debug)]
pub(super) struct Recovery {
    copy: Arc<RecoveryCopy>,
    mode: RecoveryMode,
    /// When each refused restore was last logged (manual mode).
    refused: Mutex<HashMap<String, Instant>>,
    /// The store servers' run ids as last read (PROTOCOL §2.3), by server.
    run_ids: Mutex<BTreeMap<String, String>>,
}

/// What [`Coordinator::restore_missing`] restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Streams restored.
    pub streams: Vec<String>,
    /// Groups restored.
    pub groups: Vec<String>,
}

fn copy_error(e: crate::fencing::FencingError) -> ServiceError {
    ServiceError::fencing(e, " (the recovery copy could not be read)")
}

impl Coordinator {
    /// Restores documents the store lost from `copy`, by itself in `mode` auto (PROTOCOL
    /// §2.3); in `manual` only through [`Coordinator::restore_missing`] with `force`.
    pub fn with_recovery(mut self, copy: Arc<RecoveryCopy>, mode: RecoveryMode) -> Self {
        self.recovery = Some(Arc::new(Recovery {
            copy,
            mode,
            refused: Mutex::default(),
            run_ids: Mutex::default(),
        }));
        self
    }

    /// Whether a restore may run now; in manual mode without `force`, logs (once a minute
    /// per document) and counts the refusal.
    fn may_restore(&self, r: &Recovery, kind: &'static str, name: &str, force: bool) -> bool {
        if force || r.mode == RecoveryMode::Auto {
            return true;
        }
        metrics::counter!("rsc_store_recoveries_refused_total", "kind" => kind).increment(1);
        let mut refused = r.refused.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!("{kind}:{name}");
        if refused
            .get(&key)
            .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_EVERY)
        {
            refused.insert(key, Instant::now());
            error!(
                kind,
                name,
                "the metadata store lost this document and its recovery copy holds it; \
                 --store-recovery manual: not restored. Run `rsc-coordinator store restore` \
                 to restore it (RUNBOOK: Recovering from a lost metadata Redis)"
            );
        }
        false
    }

    /// [`Self::recover_group`] without `force`, boxed: the paths that read documents (every
    /// request's) stay small futures.
    pub(super) fn recover_group_boxed<'a>(&'a self, group: &'a str) -> Boxed<'a, bool> {
        Box::pin(self.recover_group(group, false))
    }

    /// [`Self::recover_stream`] without `force`, boxed (as [`Self::recover_group_boxed`]).
    pub(super) fn recover_stream_boxed<'a>(
        &'a self,
        stream: &'a str,
    ) -> Boxed<'a, Option<Versioned<StreamDoc>>> {
        Box::pin(self.recover_stream(stream, false))
    }

    /// The highest epoch the recovery copy (outside the store, PROTOCOL §2.3) records for
    /// `group`, when there is a copy and it answers.
    pub(super) async fn copied_epoch(&self, group: &str) -> Option<u64> {
        let r = self.recovery.as_ref()?;
        match r.copy.group(group).await {
            Ok(copy) => copy.map(|c| c.epoch),
            Err(e) => {
                warn!(group, error = %e, "could not read the recovery copy");
                None
            }
        }
    }

    /// The store does not hold `stream`: restores it from the copy when there is one (and
    /// the mode allows); `None` otherwise.
    pub(super) async fn recover_stream(
        &self,
        stream: &str,
        force: bool,
    ) -> Result<Option<Versioned<StreamDoc>>> {
        let Some(r) = &self.recovery else {
            return Ok(None);
        };
        let Some(copy) = r.copy.stream(stream).await.map_err(copy_error)? else {
            return Ok(None);
        };
        if !self.may_restore(r, "stream", stream, force) {
            return Ok(None);
        }
        let note = self.note(Cause::Restore, None, &copy.doc);
        match self.store.put_stream(&copy.doc, 0, &note).await {
            Ok(revision) => {
                let body = serde_json::json!({
                    "shard_count": copy.doc.shard_count,
                    "routing_epoch": copy.doc.routing_epoch,
                    "copy_revision": copy.revision,
                });
                self.restored("stream", stream, revision, body).await;
                let v = Versioned {
                    revision,
                    doc: copy.doc,
                };
                self.cache.put_stream(v.clone());
                Ok(Some(v))
            }
            // Restored (or created) meanwhile by another request or coordinator.
            Err(e) if e.is_conflict() => Ok(self.store.load_stream(stream).await?),
            Err(e) => Err(e.into()),
        }
    }

    /// The store does not hold `group`: restores it (and its stream, if lost too) from the
    /// copy when there is one (and the mode allows). Returns whether the group may now be
    /// read again.
    pub(super) async fn recover_group(&self, group: &str, force: bool) -> Result<bool> {
        let Some(r) = &self.recovery else {
            return Ok(false);
        };
        let Some(copy) = r.copy.group(group).await.map_err(copy_error)? else {
            return Ok(false);
        };
        if !self.may_restore(r, "group", group, force) {
            return Ok(false);
        }
        let stream = match self.store.load_stream(&copy.stream).await? {
            Some(v) => v,
            None => match self.recover_stream(&copy.stream, force).await? {
                Some(v) => v,
                None => return Ok(false),
            },
        };
        self.restore_group(&copy, stream).await
    }

    async fn restore_group(&self, copy: &GroupCopy, stream: Versioned<StreamDoc>) -> Result<bool> {
        let group = copy.group.as_str();
        let Versioned {
            revision: stream_revision,
            doc: mut stream,
        } = stream;
        if !stream.groups.contains(group) {
            // The stream names the group before the group exists (as at creation).
            let before = stream.clone();
            stream.add_group(group);
            let note = self.note(Cause::Restore, Some(&before), &stream);
            self.store
                .put_stream(&stream, stream_revision, &note)
                .await?;
        }
        let doc = copy.restore(&stream);
        let note = self.note(Cause::Restore, None, &doc);
        match self.store.put_group(&doc, 0, &note).await {
            Ok(revision) => {
                self.cache.forget_group(group);
                let body = serde_json::json!({
                    "stream": copy.stream,
                    "copy_revision": copy.revision,
                    "copy_epoch": copy.epoch,
                    "group_epoch": doc.group_epoch,
                });
                self.restored("group", group, revision, body).await;
                Ok(true)
            }
            Err(e) if e.is_conflict() => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Logs, counts and audits one restore.
    async fn restored(
        &self,
        kind: &'static str,
        name: &str,
        revision: u64,
        body: serde_json::Value,
    ) {
        metrics::counter!("rsc_store_recoveries_total", "kind" => kind).increment(1);
        error!(
            kind,
            name,
            revision,
            details = %body,
            "the metadata store had lost this document: restored from the recovery copy \
             (members rejoin; check the store Redis's persistence)"
        );
        let (path, target) = match kind {
            "group" => (
                format!("/v1/groups/{name}"),
                AuditTarget {
                    group: Some(name.to_owned()),
                    ..AuditTarget::default()
                },
            ),
            _ => (
                format!("/v1/streams/{name}"),
                AuditTarget {
                    stream: Some(name.to_owned()),
                    ..AuditTarget::default()
                },
            ),
        };
        let entry = AuditEntry {
            time_ms: self.now(),
            principal: "rsc-coordinator".into(),
            credential: None,
            action: "store.restore".into(),
            target,
            request: AuditRequest {
                method: "INTERNAL".into(),
                path,
                query: None,
                body: Some(body),
            },
            result: AuditResult {
                status: 200,
                code: None,
            },
            revisions: vec![RevisionChange {
                document: format!("{kind}:{name}"),
                before: 0,
                after: revision,
            }],
            client_addr: None,
            count: None,
            since_ms: None,
        };
        Auditor::new(self.store.clone(), self.clock.clone())
            .record(entry)
            .await;
    }

    /// Restores every document the recovery copy holds and the store does not: streams
    /// first, then groups. Without `force` only in auto mode (manual: logged and counted);
    /// with it (`rsc-coordinator store restore`) in either. Also copies the documents the
    /// store holds and the copy lacks (a data Redis that lost its data). Without a recovery
    /// copy, does nothing.
    pub async fn restore_missing(&self, force: bool) -> Result<Restored> {
        let mut done = Restored::default();
        let Some(r) = self.recovery.clone() else {
            return Ok(done);
        };
        let copies = r.copy.streams().await.map_err(copy_error)?;
        let copied: HashSet<String> = copies.iter().map(|c| c.doc.stream.clone()).collect();
        let stored: HashSet<String> = self.store.list_streams().await?.into_iter().collect();
        for s in copied.difference(&stored) {
            if self.store.stream_revision(s).await?.is_none()
                && self.recover_stream(s, force).await?.is_some()
            {
                done.streams.push(s.clone());
            }
        }
        // A copy missing, or behind its document (a coordinator that stopped between the
        // commit and the copy, or a copy write that failed there): copied again.
        let behind = copies.iter().filter(|c| stored.contains(&c.doc.stream));
        let mut recopy: Vec<&String> = stored.difference(&copied).collect();
        for c in behind {
            if self
                .store
                .stream_revision(&c.doc.stream)
                .await?
                .is_some_and(|rev| rev != c.revision)
            {
                recopy.push(&c.doc.stream);
            }
        }
        for s in recopy {
            let _lock = self.lock_stream(s).await?;
            if let Some(v) = self.store.load_stream(s).await? {
                let copy = StreamCopy {
                    doc: v.doc,
                    revision: v.revision,
                };
                r.copy.write_stream(&copy).await.map_err(copy_error)?;
            }
        }
        let copied: HashSet<String> = r
            .copy
            .group_names()
            .await
            .map_err(copy_error)?
            .into_iter()
            .collect();
        let stored: HashSet<String> = self.store.list_groups().await?.into_iter().collect();
        for g in copied.difference(&stored) {
            if self.store.group_revision(g).await?.is_none() && self.recover_group(g, force).await?
            {
                done.groups.push(g.clone());
            }
        }
        for g in stored.difference(&copied) {
            // Under the group's lock, as a delete (which removes the copy first): a copy
            // written here never outlives a delete.
            let _lock = self.lock_group(g).await?;
            if let Some(v) = self.store.load_group(g).await? {
                let copy = GroupCopy::of(&v.doc, v.revision);
                r.copy.forget_written(g);
                r.copy.write_group(&copy).await.map_err(copy_error)?;
            }
        }
        done.streams.sort();
        done.groups.sort();
        Ok(done)
    }

    /// Runs [`Coordinator::restore_missing`] every `every`, for ever (a failure is logged and
    /// tried again next time), and at once when the store's run ids change (read every
    /// `probe`, `Coordinator::store_restarted`). While run ids that could be read before
    /// cannot be (the store is down or restarting) no check runs: the first one after the
    /// store is back follows the reading that tells whether it restarted.
    pub async fn run_recovery_check(self, every: Duration, probe: Duration) {
        let mut tick = tokio::time::interval(probe.min(every));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_check: Option<Instant> = None;
        loop {
            tick.tick().await;
            let Some(restarted) = self.store_restarted().await else {
                continue;
            };
            if !restarted.is_empty() || last_check.is_none_or(|t| t.elapsed() >= every) {
                last_check = Some(Instant::now());
                match self.restore_missing(false).await {
                    Ok(done) if !restarted.is_empty() => store_restarted_outcome(&restarted, &done),
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "the recovery check failed; trying again"),
                }
            }
        }
    }

    /// The store servers whose run id changed since the last reading (PROTOCOL §2.3): a
    /// server restarted, or another one took over (a failover). The first reading, and a
    /// server seen for the first time, only remember theirs. `None` when the reading failed
    /// after an earlier one succeeded; a store whose run ids were never read (`INFO` not
    /// permitted) answers no change.
    pub(super) async fn store_restarted(&self) -> Option<Vec<String>> {
        let Some(r) = &self.recovery else {
            return Some(Vec::new());
        };
        let read = self.store.run_ids().await;
        let mut known = r.run_ids.lock().unwrap_or_else(|p| p.into_inner());
        match read {
            Ok(now) => {
                let changed = run_ids_changed(&known, &now);
                known.extend(now);
                Some(changed)
            }
            Err(e) => {
                debug!(error = %e, "could not read the store's run ids");
                known.is_empty().then(Vec::new)
            }
        }
    }
}

/// The servers of `now` whose run id differs from the one `known` records for them.
pub(crate) fn run_ids_changed(
    known: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    now.iter()
        .filter(|(server, id)| known.get(*server).is_some_and(|k| k != *id))
        .map(|(server, _)| server.clone())
        .collect()
}

/// Logs and counts what the check that followed a run id change found.
fn store_restarted_outcome(servers: &[String], done: &Restored) {
    let lost = !done.streams.is_empty() || !done.groups.is_empty();
    let outcome = if lost { "restored" } else { "intact" };
    metrics::counter!("rsc_store_run_id_changes_total", "outcome" => outcome).increment(1);
    if lost {
        error!(
            ?servers,
            streams = ?done.streams,
            groups = ?done.groups,
            "the metadata store restarted or failed over (run id changed) and lost documents: \
             restored from the recovery copy"
        );
    } else {
        warn!(
            ?servers,
            "the metadata store restarted or failed over (run id changed); its documents are \
             there (an older snapshot is caught by the epoch check, PROTOCOL §22)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(s, id)| (s.to_string(), id.to_string()))
            .collect()
    }

    /// Only a server known before with another id counts: the first reading, a new server
    /// (a cluster that grew) and a server gone (no answer) do not.
    #[test]
    fn a_run_id_change_is_a_known_server_with_another_id() {
        let known = ids(&[("a:1", "x"), ("b:2", "y")]);
        assert!(run_ids_changed(&BTreeMap::new(), &known).is_empty());
        assert!(run_ids_changed(&known, &known).is_empty());
        assert!(run_ids_changed(&known, &ids(&[("a:1", "x"), ("c:3", "z")])).is_empty());
        assert_eq!(
            run_ids_changed(&known, &ids(&[("a:1", "x"), ("b:2", "w")])),
            ["b:2"]
        );
    }
}
