//! The member protocol: heartbeats (single and batched, steady and full) and leave.
//!
//! A heartbeat's path, in the order of this file: [`Coordinator::heartbeat`] tries the steady
//! path (cached documents, one conditional liveness touch beside the owner tokens'
//! re-assertion), else takes the full one: a write cycle ([`super::write`]) deciding with
//! [`crate::engine::GroupDoc::heartbeat`], then the drained shards it reported recorded in
//! the stream. A batch runs the same steps for many members at once; a leave ends the file.

use super::{Coordinator, Result, ServiceError, check_name, invalid};
use crate::engine::{GroupDoc, GroupEvent, StreamDoc};
use crate::revisions::Cause;
use crate::store::{SteadyTouch, StoreError, TouchOutcome, Versioned};
use rsc_protocol::{GroupId, MemberEpoch};
use rsc_protocol::{HeartbeatRequest, HeartbeatResponse, LeaveRequest, LeaveResponse};
use std::collections::HashMap;
use std::sync::Arc;
use tracing::{debug, info, warn};

impl Coordinator {
    /// Handles a heartbeat (PROTOCOL §5).
    pub async fn heartbeat(
        &self,
        group: &GroupId,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse> {
        self.heartbeat_valid(group, req).await
    }

    /// [`Coordinator::heartbeat`] for a group id already checked (a batch item's).
    async fn heartbeat_valid(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse> {
        if let Some(response) = self.steady_heartbeat(group, req).await? {
            return Ok(response);
        }
        // Boxed: the full path's future (the write cycle's) is many times the steady one's,
        // and every heartbeat future is allocated and moved at its size, steady ones too.
        Box::pin(self.full_heartbeat(group, req)).await
    }

    /// Answers a steady-state heartbeat from the cached documents: no lock, no document
    /// write, one conditional liveness touch.
    /// `None` when the heartbeat needs the full path (anything to change, a cache miss, a
    /// newer revision, a member whose session is over).
    async fn steady_heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<Option<HeartbeatResponse>> {
        let Some((basis, mut response)) = self.steady_basis(group, req) else {
            return Ok(None);
        };
        let touch = basis.touch(group, &req.member_id);
        // Strict fencing: every heartbeat re-asserts the member's owner tokens, repairing a
        // lost write once the coordinator knows of it (PROTOCOL §5.6), at the same time as
        // the touch (in parallel, to the data Redis unless its tracked keys answer). Without
        // the group lock, and even when the touch finds the cached document stale, this
        // cannot hand a shard back: the token script never replaces a later grant's token
        // with an earlier one, and a grant's token is written before the grant is answered.
        let (touched, asserted) = tokio::join!(
            self.store.touch_steady(&touch),
            self.assert_tokens(&basis.group.doc, &mut response, true)
        );
        self.steady_answered(&touch, touched, asserted, response)
    }

    /// What a steady heartbeat is answered from, and its answer, when the cached documents
    /// say it is one.
    fn steady_basis(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Option<(SteadyBasis, HeartbeatResponse)> {
        let g = self.cache.group(group)?;
        let s = self.cache.stream(&g.doc.stream)?;
        let response = g.doc.steady_heartbeat(&s.doc, req)?;
        let now_ms = self.now();
        let max_silence_ms = g.doc.config.session_timeout_ms
            + self
                .outages
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .shift_ms(now_ms, g.doc.config.session_timeout_ms);
        let basis = SteadyBasis {
            group: g,
            stream: s,
            now_ms,
            max_silence_ms,
        };
        Some((basis, response))
    }

    /// With strict fencing, writes the owner tokens of the answer's assignment before the
    /// answer leaves (and repairs lost ones); without a data Redis, strips them (lease only).
    /// A `steady` heartbeat's re-assertion may be answered from the owner keys the data
    /// Redis tracks for this coordinator (PROTOCOL §5.6); any other reads them.
    async fn assert_tokens(
        &self,
        doc: &GroupDoc,
        response: &mut HeartbeatResponse,
        steady: bool,
    ) -> Result<()> {
        if response.owner_tokens.is_empty()
            || rsc_protocol::MemberEpoch::new(response.member_epoch).is_leave()
        {
            return Ok(());
        }
        let Some(fencing) = &self.fencing else {
            warn!(group = %doc.group, "group is set to strict fencing but this coordinator has no --data-redis-url: members fall back to their lease");
            response.owner_tokens.clear();
            return Ok(());
        };
        let (group, stream, tokens) = (&doc.group, &doc.stream, &response.owner_tokens);
        let asserted = if steady {
            fencing.reassert(group, stream, tokens).await
        } else {
            fencing.assert(group, stream, tokens).await
        };
        asserted.map_err(|e| ServiceError::fencing(e, ""))?;
        Ok(())
    }

    /// A steady heartbeat's answer once its touch and its tokens' re-assertion are done:
    /// `None` when the touch found the cached documents stale or the member not live.
    fn steady_answered(
        &self,
        touch: &SteadyTouch<'_>,
        touched: std::result::Result<TouchOutcome, StoreError>,
        asserted: Result<()>,
        response: HeartbeatResponse,
    ) -> Result<Option<HeartbeatResponse>> {
        let steady = touched? == TouchOutcome::Touched;
        debug!(steady, revision = touch.revision, "steady-state heartbeat");
        if !steady {
            return Ok(None);
        }
        self.cache.touched(touch.group, touch.member, touch.now_ms);
        asserted?;
        Ok(Some(response))
    }

    /// The full heartbeat: lock, load, engine, write. (The span is here rather than on
    /// [`Coordinator::heartbeat`]: the steady path logs nothing, and an info span per steady
    /// heartbeat costs a third of its throughput.)
    #[tracing::instrument(skip_all, fields(group = %group, member = %req.member_id, epoch = req.member_epoch))]
    async fn full_heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse> {
        let (response, drained, stream) = self
            .retrying(|| self.full_heartbeat_once(group, req))
            .await?;
        if !drained.is_empty()
            && let Err(e) = self.record_drained(&stream, group, &drained).await
        {
            // The member reports drained shards on every heartbeat: the next one retries.
            warn!(%stream, ?drained, error = %e, "could not record drained shards yet");
        }
        Ok(response)
    }

    /// One attempt of the full heartbeat: one write cycle ([`super::write`]) deciding with
    /// [`crate::engine::GroupDoc::heartbeat`]. Returns the answer, the drained shards to record in the
    /// stream, and the stream's name.
    async fn full_heartbeat_once(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<(HeartbeatResponse, Vec<u32>, String)> {
        let mut w = self.open_write(group, Some(&req.member_id)).await?;
        if let Some(epoch) = super::revisions::older_than_member(&w.doc, req.member_epoch)
            && let Some(copied) = self.copied_epoch(group).await
            && copied >= epoch
        {
            // The member's word alone is never enough: the copy outside the store confirms
            // that the store held the epoch and went back (PROTOCOL §22).
            return self.refence_older_store(w, &req.member_id, copied).await;
        }
        let outcome = match w.doc.heartbeat(&w.stream.doc, req, w.now) {
            Ok(out) => out,
            Err(e) => return self.refuse_write(w, e).await,
        };
        w.events.extend(outcome.events);
        let touch = (!MemberEpoch::new(outcome.response.member_epoch).is_leave())
            .then(|| (req.member_id.clone(), w.now));
        self.commit_write(&mut w, touch).await?;
        // Under the group lock, after the document write, before the answer leaves:
        // the member cannot learn of a grant whose owner token is not in place.
        let mut response = outcome.response;
        self.assert_tokens(&w.doc, &mut response, false).await?;
        let stream_name = w.doc.stream.clone();
        self.close_write(w);
        Ok((response, outcome.drained, stream_name))
    }

    /// Records drained shards of `group` in the stream; retires shards every group drained.
    async fn record_drained(&self, stream: &str, group: &str, shards: &[u32]) -> Result<()> {
        let changed = self
            .retrying(|| async {
                let _s = self.lock_stream(stream).await?;
                let Versioned { revision, mut doc } = self.load_stream(stream).await?;
                let before = doc.clone();
                let now = self.now();
                // Prune names of groups that no longer exist (a create that crashed halfway).
                for g in doc.groups.clone() {
                    if g != group && self.store.load_group(&g).await?.is_none() {
                        warn!(stream, group = %g, "pruning a group the stream names but the store lacks");
                        doc.remove_group(&g, now);
                    }
                }
                let layout_changed = doc.mark_drained(group, shards, now);
                let note = self.note(Cause::Reshard, Some(&before), &doc);
                self.store.put_stream(&doc, revision, &note).await?;
                info!(stream, group, ?shards, retired = layout_changed, "draining shards drained");
                Ok(layout_changed.then_some(doc))
            })
            .await?;
        if let Some(doc) = changed {
            self.fan_out(&doc).await;
        }
        Ok(())
    }

    /// Handles a batch of heartbeats (`POST /v1/heartbeats`): each `(group, request)` is
    /// answered as [`Coordinator::heartbeat`] answers it, results in the order given, as if
    /// the heartbeats of each group ran one after another in that order. First every item
    /// tries the steady path, concurrently, so that their liveness touches share round
    /// trips; then, per group, the items from the first one that was not steady onwards run
    /// one after another through [`Coordinator::heartbeat`] (queueing on the group lock in
    /// order, not contending for it), concurrently across groups. The items before it
    /// changed nothing, so their steady answers are what the same order would have given;
    /// a steady pass answer that is thrown away only touched liveness and re-asserted
    /// tokens, which the second pass does again.
    pub async fn heartbeat_batch(
        &self,
        items: &[(&str, &HeartbeatRequest)],
    ) -> Vec<Result<HeartbeatResponse>> {
        let steady = self.steady_heartbeats(items).await;
        let mut results: Vec<Option<Result<HeartbeatResponse>>> = Vec::with_capacity(items.len());
        let mut again: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, r) in steady.into_iter().enumerate() {
            let group = items[i].0;
            match again.get_mut(group) {
                Some(tail) => tail.push(i),
                None if matches!(r, Ok(None)) => {
                    again.insert(group, vec![i]);
                }
                None => {
                    results.push(r.transpose());
                    continue;
                }
            }
            results.push(None);
        }
        let answered = futures::future::join_all(again.into_values().map(|indices| async move {
            let mut out = Vec::with_capacity(indices.len());
            for i in indices {
                let (group, req) = items[i];
                out.push((i, self.heartbeat_valid(group, req).await));
            }
            out
        }))
        .await;
        for (i, r) in answered.into_iter().flatten() {
            results[i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| {
                // Unreachable: every item without an answer went through the second pass.
                r.unwrap_or_else(|| Err(ServiceError::unanswered()))
            })
            .collect()
    }

    /// [`Coordinator::steady_heartbeat`] for every item of a batch at once: one touch call
    /// for all the items answered from the cache (their touches share script calls, and
    /// the store's layers run once per batch rather than once per item), beside their
    /// owner tokens' re-assertion. Results in the order given.
    async fn steady_heartbeats(
        &self,
        items: &[(&str, &HeartbeatRequest)],
    ) -> Vec<Result<Option<HeartbeatResponse>>> {
        let mut bases: Vec<Result<Option<SteadyBasis>>> = Vec::with_capacity(items.len());
        let mut responses = Vec::new();
        for &(group, req) in items {
            let basis = check_name("group", group).map(|()| {
                self.steady_basis(group, req).map(|(basis, response)| {
                    responses.push(response);
                    basis
                })
            });
            bases.push(basis);
        }
        let touches: Vec<SteadyTouch<'_>> = bases
            .iter()
            .zip(items)
            .filter_map(|(basis, &(group, req))| match basis {
                Ok(Some(b)) => Some(b.touch(group, &req.member_id)),
                _ => None,
            })
            .collect();
        let fenced = responses.iter().any(|r| !r.owner_tokens.is_empty());
        let touching = self.store.touch_steady_batch(&touches);
        let (touched, asserted) = if fenced {
            let docs = bases.iter().filter_map(|b| match b {
                Ok(Some(b)) => Some(&b.group.doc),
                _ => None,
            });
            let asserting = futures::future::join_all(
                docs.zip(responses.iter_mut())
                    .map(|(doc, response)| self.assert_tokens(doc, response, true)),
            );
            tokio::join!(touching, asserting)
        } else {
            let touched = touching.await;
            let asserted = (0..touched.len()).map(|_| Ok(())).collect();
            (touched, asserted)
        };
        let answered: Vec<Result<Option<HeartbeatResponse>>> = touches
            .iter()
            .zip(touched)
            .zip(asserted)
            .zip(responses)
            .map(|(((touch, touched), asserted), response)| {
                self.steady_answered(touch, touched, asserted, response)
            })
            .collect();
        let mut answered = answered.into_iter();
        bases
            .into_iter()
            .map(|basis| match basis {
                Ok(Some(_)) => answered.next().unwrap_or_else(|| {
                    Err(StoreError::unavailable("a steady touch went unanswered".into()).into())
                }),
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Handles `POST leave`.
    #[tracing::instrument(skip_all, fields(group = %group, member = %req.member_id))]
    pub async fn leave(&self, group: &GroupId, req: &LeaveRequest) -> Result<LeaveResponse> {
        let group = group.as_str();
        // `POST leave` takes a generation or -1; -2 (step away) is a heartbeat's (PROTOCOL §5.1).
        if req.member_epoch < MemberEpoch::LEAVE.get() {
            return Err(invalid(format!(
                "member_epoch {} is invalid",
                req.member_epoch
            )));
        }
        self.mutate_group(group, |doc, stream, _now| {
            doc.leave(stream, &req.member_id, req.member_epoch)?;
            Ok(vec![GroupEvent::Left(req.member_id.to_string())])
        })
        .await?;
        Ok(LeaveResponse {
            member_id: req.member_id.to_string(),
            member_epoch: MemberEpoch::LEAVE.get(),
        })
    }
}

/// The cached documents a steady heartbeat is answered from.
struct SteadyBasis {
    group: Arc<Versioned<GroupDoc>>,
    stream: Arc<Versioned<StreamDoc>>,
    now_ms: u64,
    max_silence_ms: u64,
}

impl SteadyBasis {
    /// The conditional touch: liveness moves only while both documents are still at the
    /// revisions the answer was computed from.
    fn touch<'a>(&'a self, group: &'a str, member: &'a str) -> SteadyTouch<'a> {
        SteadyTouch {
            group,
            revision: self.group.revision,
            stream: &self.stream.doc.stream,
            stream_revision: self.stream.revision,
            member,
            now_ms: self.now_ms,
            max_silence_ms: self.max_silence_ms,
        }
    }
}
