//! Operators' mutations: groups, members, pause, reshard and rollback.

use super::{Coordinator, Result, ServiceError, invalid};
use crate::engine::{
    EngineError, GroupConfig, GroupDoc, GroupEvent, StreamDoc, group_view, stream_view,
};
use crate::revisions::Cause;
use crate::store::Versioned;
use rsc_protocol::{
    CreateGroupRequest, FencingMode, GroupView, PatchGroupRequest, PatchStreamRequest, StreamView,
};
use rsc_protocol::{GroupId, MemberId, StreamId};
use std::collections::HashMap;
use tracing::{info, warn};

impl Coordinator {
    /// Fences and removes a member (admin).
    #[tracing::instrument(skip(self))]
    pub async fn remove_member(&self, group: &GroupId, member: &MemberId) -> Result<()> {
        let group = group.as_str();
        let member = member.as_str();
        self.mutate_group(group, |doc, stream, _now| {
            doc.remove_member(stream, member)?;
            Ok(vec![GroupEvent::Removed(member.to_owned())])
        })
        .await
        .map(drop)
    }

    /// Changes a group's settings (admin).
    #[tracing::instrument(skip(self))]
    pub async fn patch_group(
        &self,
        group: &GroupId,
        patch: &PatchGroupRequest,
    ) -> Result<GroupView> {
        let group = group.as_str();
        self.check_fencing(patch.fencing)?;
        self.mutate_group(group, |doc, stream, _now| {
            doc.update_config(stream, patch)?;
            Ok(Vec::new())
        })
        .await?;
        self.view_group(group).await
    }

    /// Pauses or resumes a group (admin; PROTOCOL §14): durable in the group document, so it
    /// outlives rebalances, member restarts and coordinator restarts.
    #[tracing::instrument(skip(self))]
    pub async fn set_group_paused(&self, group: &GroupId, paused: bool) -> Result<GroupView> {
        let group = group.as_str();
        self.mutate_group(group, |doc, _stream, now| {
            if doc.set_paused(paused, now) {
                tracing::info!(group, paused, "group pause changed");
            }
            Ok(Vec::new())
        })
        .await?;
        crate::metrics::record_group_paused(group, paused);
        self.view_group(group).await
    }

    /// Creates a group, and its stream when new (admin).
    #[tracing::instrument(skip_all, fields(group = %req.group, stream = %req.stream))]
    pub async fn create_group(&self, req: &CreateGroupRequest) -> Result<GroupView> {
        let config = self.group_config(req);
        self.check_fencing(req.fencing)?;
        config.validate()?;
        if let Some(n) = req.shard_count {
            crate::engine::validate_shard_count(n)?;
        }
        if let Some(why) = req.retention.as_ref().and_then(|r| r.problem()) {
            return Err(invalid(why));
        }
        self.retrying(|| async {
            let _s = self.lock_stream(&req.stream).await?;
            let _g = self.lock_group(&req.group).await?;
            if self.store.load_group(&req.group).await?.is_some() {
                return Err(ServiceError::GroupAlreadyExists(req.group.to_string()));
            }
            let now = self.now();
            // A stream the store lost is restored from its recovery copy first, so that it
            // is never created again with another shard count (PROTOCOL §2.3).
            let existing = match self.store.load_stream(&req.stream).await? {
                Some(v) => Some(v),
                None => self.recover_stream_boxed(&req.stream).await?,
            };
            let (mut stream, revision) = match existing {
                Some(v) => {
                    if let Some(n) = req.shard_count
                        && n != v.doc.shard_count
                    {
                        return Err(ServiceError::ShardCountMismatch {
                            stream: req.stream.to_string(),
                            existing: v.doc.shard_count,
                            requested: n,
                        });
                    }
                    if let Some(r) = req.retention
                        && r != v.doc.retention
                    {
                        return Err(invalid(format!(
                            "stream {} exists with another retention policy: change it with \
                             rsc-coordinator stream retention {} (PATCH /v1/streams/{})",
                            req.stream, req.stream, req.stream
                        )));
                    }
                    (v.doc, v.revision)
                }
                None => {
                    let n = req.shard_count.ok_or_else(|| {
                        invalid(format!(
                            "stream {} is new: shard_count (1..=4096) is required",
                            req.stream
                        ))
                    })?;
                    let mut doc = StreamDoc::new(&req.stream, n, now)?;
                    doc.retention = req.retention.unwrap_or_default();
                    (doc, 0)
                }
            };
            // The stream names the group before the group exists: a crash in between leaves
            // a name the drain check prunes, never a group without its stream.
            let before = (revision > 0).then(|| stream.clone());
            stream.add_group(&req.group);
            let note = self.note(Cause::Admin, before.as_ref(), &stream);
            self.store.put_stream(&stream, revision, &note).await?;
            let doc = GroupDoc::new(&req.group, config.clone(), &stream, now);
            let note = self.note(Cause::Admin, None, &doc);
            let revision = self.store.put_group(&doc, 0, &note).await?;
            info!(group = %req.group, stream = %req.stream, shards = stream.shard_count, "group created");
            Ok(group_view(&doc, &stream, revision, now, &HashMap::new()))
        })
        .await
    }

    /// The settings of a group `req` creates: the request's, else the defaults.
    fn group_config(&self, req: &CreateGroupRequest) -> GroupConfig {
        let defaults = GroupConfig::default();
        GroupConfig {
            start: req.start.unwrap_or(defaults.start),
            session_timeout_ms: req
                .session_timeout_ms
                .unwrap_or(defaults.session_timeout_ms),
            heartbeat_interval_ms: req
                .heartbeat_interval_ms
                .unwrap_or(defaults.heartbeat_interval_ms),
            rebalance_timeout_ms: req
                .rebalance_timeout_ms
                .unwrap_or(defaults.rebalance_timeout_ms),
            max_members: req.max_members,
            assignor: req.assignor.clone().unwrap_or(defaults.assignor),
            fencing: req.fencing.unwrap_or(if self.fencing.is_some() {
                FencingMode::Strict
            } else {
                FencingMode::Lease
            }),
            ordering: req.ordering.unwrap_or_default(),
            paused_since_ms: None,
        }
    }

    /// Deletes a group (admin). Without `force`, refuses while it has members.
    #[tracing::instrument(skip(self))]
    pub async fn delete_group(&self, group: &GroupId, force: bool) -> Result<()> {
        let group = group.as_str();
        let stream_name = self.load_group(group).await?.doc.stream;
        let stream = self
            .retrying(|| async {
                let _s = self.lock_stream(&stream_name).await?;
                let _g = self.lock_group(group).await?;
                let Versioned { revision, mut doc } = self.load_group(group).await?;
                let stream = self.load_stream(&doc.stream).await?;
                let now = self.now();
                doc.expire(&stream.doc, now);
                if !doc.members.is_empty() && !force {
                    return Err(ServiceError::GroupNotEmpty {
                        group: group.to_owned(),
                        members: doc.members.len(),
                    });
                }
                self.store.delete_group(group, revision).await?;
                self.cache.forget_group(group);
                self.wake(group, Some(&doc), None, None);
                let mut s = stream.doc.clone();
                let layout_changed = s.remove_group(group, now);
                let note = self.note(Cause::Admin, Some(&stream.doc), &s);
                self.store.put_stream(&s, stream.revision, &note).await?;
                info!(group, stream = %s.stream, force, "group deleted");
                Ok(layout_changed.then_some(s))
            })
            .await?;
        if let Some(s) = stream {
            self.fan_out(&s).await;
        }
        Ok(())
    }

    /// Starts a reshard of `stream` to `shard_count` shards (admin).
    #[tracing::instrument(skip(self))]
    pub async fn reshard(&self, stream: &StreamId, shard_count: u32) -> Result<StreamView> {
        let stream = stream.as_str();
        self.mutate_stream(stream, |s, now| s.reshard(shard_count, now))
            .await
    }

    /// Changes a stream's settings: its retention policies (admin; PROTOCOL §18). Nothing
    /// else of the stream changes (no new revision of its groups, no routing change).
    #[tracing::instrument(skip(self, patch), fields(stream))]
    pub async fn patch_stream(
        &self,
        stream: &StreamId,
        patch: &PatchStreamRequest,
    ) -> Result<StreamView> {
        let stream = stream.as_str();
        for p in [&patch.retention, &patch.dlq_retention]
            .into_iter()
            .flatten()
        {
            if let Some(why) = p.problem() {
                return Err(invalid(why));
            }
        }
        let (doc, revision) = self
            .retrying(|| async {
                let _s = self.lock_stream(stream).await?;
                let Versioned { revision, mut doc } = self.load_stream(stream).await?;
                let before = doc.clone();
                if let Some(r) = patch.retention {
                    doc.retention = r;
                }
                if let Some(r) = patch.dlq_retention {
                    doc.dlq_retention = r;
                }
                let note = self.note(Cause::Admin, Some(&before), &doc);
                let revision = self.store.put_stream(&doc, revision, &note).await?;
                info!(stream, retention = ?doc.retention, dlq_retention = ?doc.dlq_retention,
                    "stream retention changed");
                Ok((doc, revision))
            })
            .await?;
        Ok(stream_view(
            &doc,
            revision,
            self.config.rollback_window_ms,
            self.now(),
        ))
    }

    /// Rolls back the latest reshard of `stream` (admin).
    #[tracing::instrument(skip(self))]
    pub async fn rollback(&self, stream: &StreamId) -> Result<StreamView> {
        let stream = stream.as_str();
        let window = self.config.rollback_window_ms;
        self.mutate_stream(stream, |s, now| s.rollback(now, window))
            .await
    }

    async fn mutate_stream<F>(&self, stream: &str, f: F) -> Result<StreamView>
    where
        F: Fn(&mut StreamDoc, u64) -> std::result::Result<(), EngineError>,
    {
        let (doc, revision) = self
            .retrying(|| async {
                let _s = self.lock_stream(stream).await?;
                let Versioned { revision, mut doc } = self.load_stream(stream).await?;
                let before = doc.clone();
                f(&mut doc, self.now())?;
                self.seal_switch(&before, &mut doc).await?;
                let note = self.note(Cause::Reshard, Some(&before), &doc);
                let revision = self.store.put_stream(&doc, revision, &note).await?;
                info!(
                    stream,
                    shard_count = doc.shard_count,
                    routing_epoch = doc.routing_epoch,
                    "stream layout changed"
                );
                Ok((doc, revision))
            })
            .await?;
        self.fan_out(&doc).await;
        Ok(stream_view(
            &doc,
            revision,
            self.config.rollback_window_ms,
            self.now(),
        ))
    }

    /// Ordered resharding (PROTOCOL §15): when `doc` switched the routing epoch from `before`,
    /// moves every affected shard's epoch marker in the data Redis and records the seals in
    /// the reshard record. Called under the stream lock, before the document is written and
    /// the request answered. A failure undoes the markers and fails the request (503).
    async fn seal_switch(&self, before: &StreamDoc, doc: &mut StreamDoc) -> Result<()> {
        let Some(sealer) = &self.sealer else {
            return Ok(());
        };
        if doc.routing_epoch == before.routing_epoch {
            return Ok(());
        }
        let shards = doc.shards_to_seal(before);
        let started = std::time::Instant::now();
        match sealer
            .seal(&doc.stream, doc.routing_epoch, before.shard_count, &shards)
            .await
        {
            Ok(seals) => {
                metrics::histogram!("rsc_seal_seconds").record(started.elapsed().as_secs_f64());
                info!(stream = %doc.stream, routing_epoch = doc.routing_epoch, shards = shards.len(),
                    "shards sealed: stale producers are refused from now on");
                if let Some(r) = doc.last_reshard.as_mut() {
                    r.seals = seals;
                }
                Ok(())
            }
            Err(e) => {
                warn!(stream = %doc.stream, error = %e, "could not seal the shards; the reshard is not made");
                sealer.unseal(&doc.stream, doc.routing_epoch, &shards).await;
                Err(ServiceError::fencing(
                    e,
                    " (the reshard was not made; retry it)",
                ))
            }
        }
    }

    /// Recomputes every group of the stream for its new layout, now rather than at the next
    /// heartbeat. A failure here is healed by the next heartbeat or sweep (`sync_layout`).
    pub(super) async fn fan_out(&self, stream: &StreamDoc) {
        for group in &stream.groups {
            let r = self
                .mutate_group(group, |_doc, _stream, _now| Ok(Vec::new()))
                .await;
            if let Err(e) = r {
                warn!(stream = %stream.stream, group, error = %e, "layout change not yet applied to group; the sweep retries");
                // Due now: the sweep applies it (as would the group's next heartbeat).
                self.schedule(group, 0, self.now()).await;
            }
        }
    }
}

impl Coordinator {
    /// Moves `group`'s position on its shards (every shard it reads, or those `req.shards`
    /// names) to `req.to` (admin; PROTOCOL §18): plans each shard's move and, unless
    /// `req.dry_run`, carries it out (`XGROUP SETID … ENTRIESREAD`, the doorbell rung) and
    /// records it in the group document. Only while the group is paused or has no live
    /// member (`409 GROUP_NOT_EMPTY` otherwise), dry runs included.
    #[tracing::instrument(skip(self))]
    pub async fn seek(
        &self,
        group: &GroupId,
        req: &rsc_protocol::SeekRequest,
    ) -> Result<rsc_protocol::SeekResponse> {
        let group = group.as_str();
        let result = self.seek_inner(group, req).await;
        let outcome = match &result {
            Ok(r) if r.dry_run => "dry_run",
            Ok(_) => "executed",
            Err(ServiceError::SeekWhileLive { .. }) => "refused_live",
            Err(ServiceError::DataRedis(_) | ServiceError::Store(_)) => "failed",
            Err(_) => "invalid",
        };
        metrics::counter!("rsc_group_seeks_total", "group" => group.to_owned(), "result" => outcome)
            .increment(1);
        result
    }

    async fn seek_inner(
        &self,
        group: &str,
        req: &rsc_protocol::SeekRequest,
    ) -> Result<rsc_protocol::SeekResponse> {
        let Some(sealer) = self.sealer.clone() else {
            return Err(invalid(
                "seek needs the data Redis (serve --data-redis-url)".into(),
            ));
        };
        let target =
            crate::replay::plan::Target::from_request(&req.to, self.now()).map_err(invalid)?;
        // Planned without the group's lock (a walk over a long stream may outlast it): the
        // id a shard moves to, and its read counter, do not depend on when they are applied.
        // The refusal is checked again under the lock, right before the move.
        let (start, shards) = self.seek_shards(group, req).await?;
        let replayer = crate::replay::Replayer::new(sealer.redis().clone(), SEEK_REDIS_TIMEOUT);
        let moves = replayer
            .plan(group, start, &shards, target)
            .await
            .map_err(replay_error)?;
        let plan: Vec<rsc_protocol::SeekShardPlan> = moves.iter().map(|m| m.to_wire()).collect();
        let response = rsc_protocol::SeekResponse {
            group: group.to_owned(),
            dry_run: req.dry_run,
            shards: plan
                .iter()
                .map(|p| (p.key.clone(), p.new_id.clone()))
                .collect(),
            redelivered: plan.iter().map(|p| p.redelivered).sum(),
            skipped: plan.iter().map(|p| p.skipped).sum(),
            lag_after: plan.iter().map(|p| p.lag_after).sum(),
            plan,
        };
        if req.dry_run {
            return Ok(response);
        }
        let lock = self.lock_group(group).await?;
        if self.seek_shards(group, req).await?.1 != shards {
            return Err(invalid(format!(
                "the shards of group {group}'s stream changed during the seek (a reshard): \
                 run it again"
            )));
        }
        replayer.apply(group, &moves).await.map_err(replay_error)?;
        drop(lock);
        info!(
            group,
            to = %req.to,
            shards = moves.len(),
            redelivered = response.redelivered,
            skipped = response.skipped,
            lag_after = response.lag_after,
            "group moved (seek)"
        );
        let record = rsc_protocol::SeekRecord {
            at_ms: self.now(),
            to: req.to.to_string(),
            shards: moves.iter().map(|m| m.shard).collect(),
            redelivered: response.redelivered,
        };
        // The record bumps the document's revision, by which the lag sampler of whichever
        // coordinator samples the group reads its shards again at once (ARCHITECTURE "How
        // lag is sampled"). The move itself is done: a failure here is only logged.
        let recorded = self
            .mutate_group(group, |doc, _stream, _now| {
                doc.last_seek = Some(record.clone());
                Ok(Vec::new())
            })
            .await;
        if let Err(e) = recorded {
            warn!(group, error = %e, "seek done, but not recorded in the group document");
        }
        Ok(response)
    }
}

impl Coordinator {
    /// The shards (index, key) a seek of `group` moves, and where the group's consumer groups
    /// start; `409 GROUP_NOT_EMPTY` while it has live members and is not paused, `400` for a
    /// shard it does not read.
    async fn seek_shards(
        &self,
        group: &str,
        req: &rsc_protocol::SeekRequest,
    ) -> Result<(rsc_protocol::StartPosition, Vec<(u32, String)>)> {
        let Versioned { mut doc, .. } = self.load_group(group).await?;
        let stream = self.load_stream(&doc.stream).await?.doc;
        doc.expire(&stream, self.now());
        if !doc.members.is_empty() && doc.config.paused_since_ms.is_none() {
            info!(
                group,
                members = doc.members.len(),
                "seek refused: the group runs"
            );
            return Err(ServiceError::SeekWhileLive {
                group: group.to_owned(),
                members: doc.members.len(),
            });
        }
        let readable = stream.assignable_shards();
        if let Some(bad) = req.shards.iter().find(|s| !readable.contains(s)) {
            return Err(invalid(format!(
                "shard {bad} is not a shard group {group} reads (it reads {} shards of stream {})",
                readable.len(),
                stream.stream
            )));
        }
        let shards = readable
            .into_iter()
            .filter(|s| req.shards.is_empty() || req.shards.contains(s))
            .map(|s| (s, rsc_protocol::routing::shard_key(&stream.stream, s)))
            .collect();
        Ok((doc.config.start, shards))
    }
}

/// The bound of each data-Redis call of a seek (a walk pages through at most 20,000 entries
/// a call).
const SEEK_REDIS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn replay_error(e: crate::replay::ReplayError) -> ServiceError {
    match e {
        crate::replay::ReplayError::Invalid(m) => invalid(m),
        crate::replay::ReplayError::Redis(m) => ServiceError::DataRedis(m),
    }
}
