//! Operators' mutations: groups, members, pause, reshard and rollback.

use super::{Coordinator, Result, ServiceError, invalid};
use crate::engine::{
    EngineError, GroupConfig, GroupDoc, GroupEvent, StreamDoc, group_view, stream_view,
};
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
                             PATCH /v1/streams/{}",
                            req.stream, req.stream
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
            stream.add_group(&req.group);
            self.store.put_stream(&stream, revision).await?;
            let doc = GroupDoc::new(&req.group, config.clone(), &stream, now);
            let revision = self.store.put_group(&doc, 0).await?;
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
                let mut s = stream.doc;
                let layout_changed = s.remove_group(group, now);
                self.store.put_stream(&s, stream.revision).await?;
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
                if let Some(r) = patch.retention {
                    doc.retention = r;
                }
                if let Some(r) = patch.dlq_retention {
                    doc.dlq_retention = r;
                }
                let revision = self.store.put_stream(&doc, revision).await?;
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
                let revision = self.store.put_stream(&doc, revision).await?;
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

    /// Records drained shards of `group` in the stream; retires shards every group drained.
    pub(super) async fn record_drained(
        &self,
        stream: &str,
        group: &str,
        shards: &[u32],
    ) -> Result<()> {
        let changed = self
            .retrying(|| async {
                let _s = self.lock_stream(stream).await?;
                let Versioned { revision, mut doc } = self.load_stream(stream).await?;
                let now = self.now();
                // Prune names of groups that no longer exist (a create that crashed halfway).
                for g in doc.groups.clone() {
                    if g != group && self.store.load_group(&g).await?.is_none() {
                        warn!(stream, group = %g, "pruning a group the stream names but the store lacks");
                        doc.remove_group(&g, now);
                    }
                }
                let layout_changed = doc.mark_drained(group, shards, now);
                self.store.put_stream(&doc, revision).await?;
                info!(stream, group, ?shards, retired = layout_changed, "draining shards drained");
                Ok(layout_changed.then_some(doc))
            })
            .await?;
        if let Some(doc) = changed {
            self.fan_out(&doc).await;
        }
        Ok(())
    }

    /// Recomputes every group of the stream for its new layout, now rather than at the next
    /// heartbeat. A failure here is healed by the next heartbeat or sweep (`sync_layout`).
    async fn fan_out(&self, stream: &StreamDoc) {
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
    /// Moves every shard's Redis consumer group of `group` to `req.to` (admin; PROTOCOL
    /// §18): `XGROUP SETID` (`CREATE … MKSTREAM` where it does not exist yet). Only while the
    /// group is paused or has no live member (`409 GROUP_NOT_EMPTY` otherwise).
    #[tracing::instrument(skip(self))]
    pub async fn seek(
        &self,
        group: &GroupId,
        req: &rsc_protocol::SeekRequest,
    ) -> Result<rsc_protocol::SeekResponse> {
        let group = group.as_str();
        let Some(sealer) = self.sealer.clone() else {
            return Err(invalid(
                "seek needs the data Redis (--data-redis-url)".into(),
            ));
        };
        let _g = self.lock_group(group).await?;
        let Versioned { mut doc, .. } = self.load_group(group).await?;
        let stream = self.load_stream(&doc.stream).await?.doc;
        doc.expire(&stream, self.now());
        if !doc.members.is_empty() && doc.config.paused_since_ms.is_none() {
            return Err(ServiceError::SeekWhileLive {
                group: group.to_owned(),
                members: doc.members.len(),
            });
        }
        let id = req.to.setid_id();
        let keys: Vec<String> = stream
            .assignable_shards()
            .into_iter()
            .map(|s| rsc_protocol::routing::shard_key(&stream.stream, s))
            .collect();
        let mut conn = sealer
            .redis()
            .get()
            .await
            .map_err(|e| ServiceError::DataRedis(e.to_string()))?;
        let mut shards = std::collections::BTreeMap::new();
        for key in keys {
            let set: redis::RedisResult<()> = redis::cmd("XGROUP")
                .arg("SETID")
                .arg(&key)
                .arg(group)
                .arg(&id)
                .query_async(&mut conn)
                .await;
            if let Err(e) = set {
                // No group on the key (`NOGROUP`), or no key at all (a shard nothing was
                // written to yet: `ERR … requires the key to exist`): create both.
                let text = e.to_string();
                let missing = e.code() == Some("NOGROUP")
                    || text.contains("NOGROUP")
                    || text.contains("requires the key to exist");
                if !missing {
                    return Err(ServiceError::DataRedis(text));
                }
                let () = redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(&key)
                    .arg(group)
                    .arg(&id)
                    .arg("MKSTREAM")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| ServiceError::DataRedis(e.to_string()))?;
            }
            shards.insert(key, id.clone());
        }
        info!(group, to = %id, shards = shards.len(), "group moved (seek)");
        Ok(rsc_protocol::SeekResponse {
            group: group.to_owned(),
            shards,
        })
    }
}
