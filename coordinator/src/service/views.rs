//! Read-only views: describe and list groups and streams, producers' routing.

use super::{Coordinator, Result, ServiceError};
use crate::engine::{StreamDoc, group_view, routing_view, stream_view};
use rsc_protocol::{GroupId, StreamId};
use rsc_protocol::{GroupView, RoutingResponse, StreamView};
use std::collections::HashMap;
use tracing::debug;

impl Coordinator {
    /// The group view.
    pub async fn describe_group(&self, group: &GroupId) -> Result<GroupView> {
        self.view_group(group).await
    }

    /// [`Coordinator::describe_group`] of a group id read from the store, or checked by the
    /// caller.
    pub(super) async fn view_group(&self, group: &str) -> Result<GroupView> {
        let v = self.load_group(group).await?;
        let stream = self.load_stream(&v.doc.stream).await?;
        let mut view = group_view(&v.doc, &stream.doc, v.revision, self.now(), &HashMap::new());
        if v.doc.config.ordering == rsc_protocol::OrderingMode::Key {
            view.waiting_on_parents = self.parent_progress(group, &stream.doc).await;
        }
        Ok(view)
    }

    /// Ordered resharding (PROTOCOL §15): for the latest switch of `stream`, each parent shard
    /// the group has not yet drained up to its seal, with how far it is (from the data
    /// Redis; empty without one or when every parent reached its seal). Children are the
    /// shards the parent's moved keys can have gone to: the new shards of a scale-up, the
    /// remaining ones of a scale-down.
    async fn parent_progress(
        &self,
        group: &str,
        stream: &StreamDoc,
    ) -> Vec<rsc_protocol::ParentProgress> {
        let (Some(sealer), Some(r)) = (&self.sealer, &stream.last_reshard) else {
            return Vec::new();
        };
        let (parents, children): (Vec<u32>, Vec<u32>) = if r.to > r.from {
            ((0..r.from).collect(), (r.from..r.to).collect())
        } else {
            ((r.to..r.from).collect(), (0..r.to).collect())
        };
        let calls = parents.iter().filter_map(|&p| {
            let seal = r.seals.get(&p)?.clone();
            Some(async move {
                let progress = sealer
                    .progress(&stream.stream, p, group, &seal, 10_000)
                    .await;
                (p, seal, progress)
            })
        });
        let mut out = Vec::new();
        for (parent, seal, progress) in futures::future::join_all(calls).await {
            match progress {
                Ok(pr) if pr.reached() => {}
                Ok(pr) => out.push(rsc_protocol::ParentProgress {
                    parent,
                    routing_epoch: r.epoch,
                    seal,
                    children: children.clone(),
                    undelivered: pr.undelivered,
                    pending: pr.pending,
                }),
                Err(e) => debug!(group, parent, error = %e, "parent progress not read"),
            }
        }
        out
    }

    /// Every group's view.
    pub async fn list_groups(&self) -> Result<Vec<GroupView>> {
        let mut out = Vec::new();
        for g in self.store.list_groups().await? {
            match self.view_group(&g).await {
                Ok(v) => out.push(v),
                Err(ServiceError::GroupNotFound(_) | ServiceError::StreamNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The stream view.
    pub async fn describe_stream(&self, stream: &StreamId) -> Result<StreamView> {
        let stream = stream.as_str();
        let v = self.load_stream(stream).await?;
        Ok(stream_view(
            &v.doc,
            v.revision,
            self.config.rollback_window_ms,
            self.now(),
        ))
    }

    /// Every stream's view.
    pub async fn list_streams(&self) -> Result<Vec<StreamView>> {
        let mut out = Vec::new();
        for s in self.store.list_streams().await? {
            if let Some(v) = self.store.load_stream(&s).await? {
                out.push(stream_view(
                    &v.doc,
                    v.revision,
                    self.config.rollback_window_ms,
                    self.now(),
                ));
            }
        }
        Ok(out)
    }

    /// Producers' routing metadata.
    pub async fn routing(&self, stream: &StreamId) -> Result<RoutingResponse> {
        let stream = stream.as_str();
        Ok(routing_view(&self.load_stream(stream).await?.doc))
    }
}
