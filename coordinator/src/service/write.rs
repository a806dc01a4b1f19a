//! One write cycle of a group document, the only one: every mutation of a group (operators',
//! the expiry sweep's, a leave, a full heartbeat) runs through it.
//!
//! [`Coordinator::open_write`] takes the group lock, loads the document with its liveness
//! and the stream document, brings the target up to the stream's layout and runs expiry;
//! the caller lets the engine decide on [`GroupWrite::doc`]; [`Coordinator::commit_write`]
//! tracks convergence and, when the document [differs beyond
//! liveness](GroupDoc::differs_beyond_liveness) from the one read, compare-and-sets it with
//! its liveness change, lowers its deadline and wakes the members concerned; otherwise it
//! only touches the requester's liveness, on condition that the revision is still the one
//! read. [`Coordinator::close_write`] caches what was kept and releases the lock. A refused
//! decision ([`Coordinator::refuse_write`]) still commits what the layout and expiry
//! changed. A lost compare-and-set or touch is a conflict: the caller's
//! [`Coordinator::retrying`] runs the whole cycle again.

use super::{Coordinator, Result};
use crate::engine::{EngineError, GroupDoc, GroupEvent, StreamDoc};
use crate::revisions::{self, Actor, Cause};
use crate::store::{LivenessChange, LockGuard, StoreError, TouchOutcome, Versioned};
use std::collections::HashMap;
use tracing::debug;

/// A group document under its lock, between load and commit.
pub(super) struct GroupWrite<'a> {
    _lock: LockGuard,
    group: &'a str,
    /// The member the decision answers (not woken: it gets its answer directly).
    requester: Option<&'a str>,
    /// The revision read; after the commit, the revision left (written or not).
    pub(super) revision: u64,
    /// The document as read (liveness overlaid), for the change rule and the wake-ups.
    before: GroupDoc,
    /// The document being decided on.
    pub(super) doc: GroupDoc,
    /// The stream document, as read.
    pub(super) stream: Versioned<StreamDoc>,
    /// The time of the decision.
    pub(super) now: u64,
    /// What happened, expiry's events first.
    pub(super) events: Vec<GroupEvent>,
    /// Members removed for silence, with the liveness the decision was based on.
    expired: Vec<(String, u64)>,
    /// Whether the commit wrote the document or touched the liveness: the document left is
    /// then the stored one, and the cache keeps it.
    kept: bool,
    /// The cause the write is recorded with in the metadata history (PROTOCOL §22), when
    /// the caller names one; otherwise `admin` inside an admin request, `heartbeat` for a
    /// member's request, `sweep` for the coordinator's own.
    pub(super) cause: Option<Cause>,
}

/// What a write cycle left.
#[derive(Debug)]
pub(super) struct Mutated {
    pub(super) events: Vec<GroupEvent>,
    /// The group document's revision afterwards.
    pub(super) revision: u64,
    /// Its next deadline.
    pub(super) next_deadline_ms: Option<u64>,
}

impl Coordinator {
    /// Opens a write cycle of `group` for a decision answering `requester` (if a member).
    pub(super) async fn open_write<'a>(
        &self,
        group: &'a str,
        requester: Option<&'a str>,
    ) -> Result<GroupWrite<'a>> {
        let lock = self.lock_group(group).await?;
        let Versioned { revision, mut doc } = self.load_group(group).await?;
        let stream = self.load_stream(&doc.stream).await?;
        let now = self.now();
        let before = doc.clone();
        if doc.sync_layout(&stream.doc) {
            crate::metrics::record_rebalance(group);
        }
        let judged = self.expiry_now(now, doc.config.session_timeout_ms);
        let (events, expired) = expire(&mut doc, &stream.doc, judged);
        Ok(GroupWrite {
            _lock: lock,
            group,
            requester,
            revision,
            before,
            doc,
            stream,
            now,
            events,
            expired,
            kept: false,
            cause: None,
        })
    }

    /// Commits the decision: writes the document if it changed beyond liveness (with the
    /// requester's liveness `touch`), else applies the `touch` alone while nobody else wrote
    /// the group. Logs the events.
    pub(super) async fn commit_write(
        &self,
        w: &mut GroupWrite<'_>,
        touch: Option<(String, u64)>,
    ) -> Result<()> {
        track_convergence(&mut w.doc, w.now);
        if w.doc.differs_beyond_liveness(&w.before) {
            let change = LivenessChange {
                forget: departed(&w.events),
                expired: std::mem::take(&mut w.expired),
                touch,
            };
            let actor = match w.cause {
                Some(c) => revisions::actor(c, || Actor::coordinator(c)),
                None => revisions::actor(Cause::Admin, || match w.requester {
                    Some(member) => Actor {
                        cause: Cause::Heartbeat,
                        principal: member.to_owned(),
                    },
                    None => Actor::coordinator(Cause::Sweep),
                }),
            };
            let note = revisions::note_of(&actor, w.now, Some(&w.before), &w.doc);
            w.revision = self
                .store
                .put_group_live(&w.doc, w.revision, &change, &note)
                .await?;
            if let Some((member, at)) = &change.touch {
                self.cache.touched(w.group, member, *at);
            }
            self.lower_deadline(&w.doc, w.revision).await;
            self.wake(w.group, Some(&w.before), Some(&w.doc), w.requester);
            w.kept = true;
        } else if let Some((member, at)) = &touch {
            let group = w.group;
            let touched = self
                .store
                .touch_if(group, w.revision, member, *at, None)
                .await?;
            if touched != TouchOutcome::Touched {
                return Err(StoreError::conflict(format!(
                    "group {group} changed while a heartbeat was answered"
                ))
                .into());
            }
            self.cache.touched(group, member, *at);
            w.kept = true;
        }
        log_events(w.group, &w.events);
        Ok(())
    }

    /// Ends the cycle (the lock is released): caches the documents, returns what was left.
    pub(super) fn close_write(&self, w: GroupWrite<'_>) -> Mutated {
        let next_deadline_ms = w.doc.next_deadline_ms();
        if w.kept {
            self.saw_revision(w.group, w.revision);
            self.cache.put_group(w.revision, w.doc);
        }
        self.cache.put_stream(w.stream);
        Mutated {
            events: w.events,
            revision: w.revision,
            next_deadline_ms,
        }
    }

    /// The engine refused the decision (and left the document as it was): what the layout
    /// and expiry changed is still committed, then the refusal is answered.
    pub(super) async fn refuse_write<T>(&self, mut w: GroupWrite<'_>, e: EngineError) -> Result<T> {
        self.commit_write(&mut w, None).await?;
        self.close_write(w);
        Err(e.into())
    }
}

/// Updates the document's convergence clock; observes the convergence time when the group
/// just became stable.
fn track_convergence(doc: &mut GroupDoc, now: u64) {
    if let Some(ms) = doc.track_convergence(now) {
        crate::metrics::record_convergence(&doc.group, ms);
        debug!(group = %doc.group, ms, "group converged");
    }
}

/// Runs the engine's expiry; returns its events and, for each member removed for silence,
/// the liveness the decision was based on (the write fails if it changed since).
fn expire(
    doc: &mut GroupDoc,
    stream: &StreamDoc,
    now: u64,
) -> (Vec<GroupEvent>, Vec<(String, u64)>) {
    if doc.next_deadline_ms().is_none_or(|t| t > now) {
        return (Vec::new(), Vec::new());
    }
    let seen: HashMap<String, u64> = doc
        .members
        .iter()
        .map(|(id, m)| (id.clone(), m.last_heartbeat_ms))
        .collect();
    let events = doc.expire(stream, now);
    let expired = events
        .iter()
        .filter_map(|e| match e {
            GroupEvent::SessionExpired(m) => seen.get(m).map(|t| (m.clone(), *t)),
            _ => None,
        })
        .collect();
    (events, expired)
}

/// Members an update removed: their liveness goes with them.
fn departed(events: &[GroupEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            GroupEvent::Left(m)
            | GroupEvent::SessionExpired(m)
            | GroupEvent::RebalanceTimedOut(m)
            | GroupEvent::Removed(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn log_events(group: &str, events: &[GroupEvent]) {
    crate::metrics::record_group_events(group, events);
    for e in events {
        match e {
            GroupEvent::Joined(m) => tracing::info!(group, member = %m, "member joined"),
            GroupEvent::Rejoined(m) => {
                tracing::info!(group, member = %m, "member rejoined with epoch 0")
            }
            GroupEvent::Left(m) => tracing::info!(group, member = %m, "member left"),
            GroupEvent::SteppedAway(m) => {
                tracing::info!(group, member = %m, "static member left for a restart: its shards wait for it")
            }
            GroupEvent::Resumed(m) => {
                tracing::info!(group, member = %m, "static member returned: resumes its shards, no rebalance")
            }
            GroupEvent::SessionExpired(m) => {
                tracing::warn!(group, member = %m, "member expired: no heartbeat within the session timeout")
            }
            GroupEvent::RebalanceTimedOut(m) => {
                tracing::warn!(group, member = %m, "member removed: did not revoke within the rebalance timeout")
            }
            GroupEvent::Removed(m) => {
                tracing::info!(group, member = %m, "member removed by an operator")
            }
            GroupEvent::Rebalanced(epoch) => {
                tracing::debug!(group, epoch, "target assignment recomputed")
            }
            GroupEvent::RevocationRequested(m, shards) => {
                tracing::info!(group, member = %m, ?shards, "revocation requested")
            }
        }
    }
}
