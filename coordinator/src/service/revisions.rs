//! The metadata history's reads and the restore of a group to a revision (PROTOCOL §22).

use super::write::GroupWrite;
use super::{Coordinator, Result, ServiceError, invalid};
use crate::engine::{EngineError, GroupDoc, GroupEvent};
use crate::recovery::GroupCopy;
use crate::revisions::{
    self, Actor, Cause, DiffView, Note, RestorePlan, RestoreRequest, RevisionsPage, RewindError,
};
use crate::store::{DocKind, RevisionRecord};
use rsc_protocol::{GroupId, StreamId};
use serde::Serialize;
use serde_json::Value;
use tracing::{error, warn};

/// Records answered per page when `?limit` is not given.
pub(crate) const DEFAULT_PAGE: usize = 50;
/// Records answered per page at most.
pub(crate) const MAX_PAGE: usize = 1000;

impl Coordinator {
    /// The history note of a write of `after` over `before` (`None`: created): inside an admin
    /// request, its principal with `cause`; otherwise the coordinator's own, with `cause`.
    pub(super) fn note<T: Serialize>(&self, cause: Cause, before: Option<&T>, after: &T) -> Note {
        let actor = revisions::actor(cause, || Actor::coordinator(cause));
        revisions::note_of(&actor, self.now(), before, after)
    }

    /// A page of `group`'s kept history, newest first, below revision `before`.
    pub async fn group_revisions(
        &self,
        group: &GroupId,
        before: Option<u64>,
        limit: Option<usize>,
    ) -> Result<RevisionsPage> {
        let current = self.load_group(group.as_str()).await?.revision;
        let records = self.store.read_revisions(DocKind::Group, group).await?;
        page(group.as_str(), current, records, before, limit)
    }

    /// A page of `stream`'s kept history, newest first, below revision `before`.
    pub async fn stream_revisions(
        &self,
        stream: &StreamId,
        before: Option<u64>,
        limit: Option<usize>,
    ) -> Result<RevisionsPage> {
        let current = self.load_stream(stream.as_str()).await?.revision;
        let records = self.store.read_revisions(DocKind::Stream, stream).await?;
        page(stream.as_str(), current, records, before, limit)
    }

    /// What changed in `group`'s document from revision `from` to revision `to`.
    pub async fn group_diff(&self, group: &GroupId, from: u64, to: u64) -> Result<DiffView> {
        let v = self.load_group(group.as_str()).await?;
        let records = self.store.read_revisions(DocKind::Group, group).await?;
        let doc = to_value(&v.doc);
        let changes =
            revisions::diff(&doc, v.revision, &records, from, to).map_err(rewind_error)?;
        Ok(DiffView {
            group: group.to_string(),
            from,
            to,
            changes,
        })
    }

    /// Restores `group`'s settings as they were at `req.revision` (admin; PROTOCOL §22):
    /// every member removed, group and assignment epochs [`crate::recovery::EPOCH_GAP`] above
    /// every epoch recorded, so no fenced member becomes valid again. Refused while members
    /// are live unless `req.force`; only planned with `req.dry_run`.
    #[tracing::instrument(skip(self, req), fields(group = %group, revision = req.revision))]
    pub async fn restore_revision(
        &self,
        group: &GroupId,
        req: &RestoreRequest,
    ) -> Result<RestorePlan> {
        self.retrying(|| async {
            let mut w = self.open_write(group.as_str(), None).await?;
            let from_revision = w.revision;
            if !w.doc.members.is_empty() && !req.force {
                return Err(ServiceError::GroupNotEmpty {
                    group: group.to_string(),
                    members: w.doc.members.len(),
                });
            }
            let records = self.store.read_revisions(DocKind::Group, group).await?;
            let restored = restored_doc(&w.doc, from_revision, &records, req.revision, &w.stream.doc)?;
            let plan = RestorePlan {
                group: group.to_string(),
                dry_run: req.dry_run,
                to_revision: req.revision,
                from_revision,
                revision: None,
                group_epoch: restored.group_epoch,
                members_removed: w.doc.members.keys().cloned().collect(),
                changes: revisions::changes(&to_value(&w.doc), &to_value(&restored)),
            };
            if req.dry_run {
                return Ok(plan);
            }
            let removed = plan.members_removed.iter().cloned().map(GroupEvent::Removed);
            w.events.extend(removed);
            w.doc = restored;
            w.cause = Some(Cause::Restore);
            self.commit_write(&mut w, None).await?;
            let m = self.close_write(w);
            warn!(group = %group, to_revision = req.revision, revision = m.revision,
                members = plan.members_removed.len(), "group restored to an earlier revision; members rejoin");
            Ok(RestorePlan {
                revision: Some(m.revision),
                ..plan
            })
        })
        .await
    }
}

impl Coordinator {
    /// A member's heartbeat named an epoch above every epoch `w`'s document records, and the
    /// recovery copy confirms the group held `epoch` (at least that one): the store went back
    /// in time (brought back from an older snapshot, or a document rewritten by hand;
    /// PROTOCOL §22). Nothing the document says about members is trusted: it is
    /// rewritten as a restore would — its own settings, no members, epochs 1000 above the
    /// highest of its own and `epoch` — and the member is answered `UNKNOWN_MEMBER_ID`, so
    /// every member rejoins at an epoch above any it held.
    pub(super) async fn refence_older_store<T>(
        &self,
        mut w: GroupWrite<'_>,
        member: &str,
        epoch: u64,
    ) -> Result<T> {
        let copy = GroupCopy::of(&w.doc, w.revision);
        let found = copy.epoch;
        let doc = GroupCopy {
            epoch: found.max(epoch),
            ..copy
        }
        .restore(&w.stream.doc);
        let removed: Vec<String> = w.doc.members.keys().cloned().collect();
        w.events
            .extend(removed.iter().cloned().map(GroupEvent::Removed));
        w.doc = doc;
        w.cause = Some(Cause::Restore);
        self.commit_write(&mut w, None).await?;
        let group = w.doc.group.clone();
        let m = self.close_write(w);
        metrics::counter!("rsc_store_rewinds_total").increment(1);
        error!(
            group = %group, member, member_epoch = epoch, store_epoch = found,
            revision = m.revision, members = removed.len(),
            "a member holds an epoch above every epoch the stored group records: the store \
             went back in time (an older snapshot?); every member is fenced and rejoins higher"
        );
        Err(EngineError::UnknownMember(member.to_owned()).into())
    }
}

/// Whether `epoch` (a member's, > 0) is above every epoch `doc` records: a consistent
/// document holds every epoch it handed out (they only grow), so the store went back.
pub(super) fn older_than_member(doc: &GroupDoc, epoch: i64) -> Option<u64> {
    let epoch = u64::try_from(epoch).ok().filter(|&e| e > 0)?;
    (epoch > GroupCopy::of(doc, 0).epoch).then_some(epoch)
}

/// The document a restore writes: the settings at `revision` (rebuilt from `current`, at
/// `at`, and the records), on the stream's layout, no members, epochs above every one held.
fn restored_doc(
    current: &GroupDoc,
    at: u64,
    records: &[RevisionRecord],
    revision: u64,
    stream: &crate::engine::StreamDoc,
) -> Result<GroupDoc> {
    if revision == 0 || revision >= at {
        return Err(invalid(format!(
            "revision {revision} is not an earlier revision of the group (it is at {at})"
        )));
    }
    let old = revisions::rewind(&to_value(current), at, records, revision).map_err(rewind_error)?;
    let old: GroupDoc = serde_json::from_value(old).map_err(|e| {
        invalid(format!(
            "revision {revision} cannot be rebuilt into a group document: {e}"
        ))
    })?;
    let held = GroupCopy::of(current, at)
        .epoch
        .max(GroupCopy::of(&old, revision).epoch);
    let copy = GroupCopy {
        group: current.group.clone(),
        stream: current.stream.clone(),
        config: old.config,
        created_ms: current.created_ms,
        epoch: held,
        revision,
    };
    Ok(copy.restore(stream))
}

fn to_value<T: Serialize>(doc: &T) -> Value {
    serde_json::to_value(doc).unwrap_or(Value::Null)
}

fn rewind_error(e: RewindError) -> ServiceError {
    invalid(e.to_string())
}

/// The records below `before`, newest first, at most `limit`.
fn page(
    name: &str,
    current: u64,
    records: Vec<RevisionRecord>,
    before: Option<u64>,
    limit: Option<usize>,
) -> Result<RevisionsPage> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(invalid(format!(
            "limit must be 1..={MAX_PAGE}, not {limit}"
        )));
    }
    let mut newer_first: Vec<RevisionRecord> = records
        .into_iter()
        .rev()
        .filter(|r| before.is_none_or(|b| r.revision < b))
        .collect();
    let more = newer_first.len() > limit;
    newer_first.truncate(limit);
    let next_before = more
        .then(|| newer_first.last().map(|r| r.revision))
        .flatten();
    Ok(RevisionsPage {
        name: name.to_owned(),
        revision: current,
        revisions: newer_first,
        next_before,
    })
}
