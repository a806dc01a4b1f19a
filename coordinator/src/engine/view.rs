//! Read models: the JSON views of groups, streams and routing (PROTOCOL §4).

use super::{GroupDoc, MemberDoc, ReshardRecord, StreamDoc};
use rsc_protocol::routing::{HASH_NAME, shard_key};
use rsc_protocol::{
    DrainingShardView, GroupState, GroupView, MemberView, ReshardState, ReshardingView,
    RoutingResponse, ShardView, StreamView,
};
use std::collections::HashMap;

fn reshard_view(stream: &StreamDoc, r: &ReshardRecord) -> ReshardingView {
    let running = r.completed_ms.is_none();
    ReshardingView {
        from: r.from,
        to: r.to,
        state: if running {
            ReshardState::Draining
        } else {
            ReshardState::Complete
        },
        rollback: r.rollback,
        started_ms: r.started_ms,
        completed_ms: r.completed_ms,
        draining: stream
            .draining
            .iter()
            .map(|(&shard, drained)| DrainingShardView {
                shard,
                drained_groups: drained.iter().cloned().collect(),
                waiting_groups: stream.groups.difference(drained).cloned().collect(),
            })
            .collect(),
        routing_epoch: (r.epoch > 0).then_some(r.epoch),
        seals: r.seals.clone(),
    }
}

fn running_view(stream: &StreamDoc) -> Option<ReshardingView> {
    stream.running_reshard().map(|r| reshard_view(stream, r))
}

/// The routing metadata producers use.
pub fn routing_view(stream: &StreamDoc) -> RoutingResponse {
    RoutingResponse {
        stream: stream.stream.clone(),
        shard_count: stream.shard_count,
        routing_epoch: stream.routing_epoch,
        hash: HASH_NAME.to_owned(),
        shard_keys: (0..stream.shard_count)
            .map(|i| shard_key(&stream.stream, i))
            .collect(),
        resharding: running_view(stream),
    }
}

/// The stream view.
pub fn stream_view(
    stream: &StreamDoc,
    revision: u64,
    rollback_window_ms: u64,
    now_ms: u64,
) -> StreamView {
    StreamView {
        stream: stream.stream.clone(),
        shard_count: stream.shard_count,
        routing_epoch: stream.routing_epoch,
        groups: stream.groups.iter().cloned().collect(),
        shard_keys: (0..stream.shard_count)
            .map(|i| shard_key(&stream.stream, i))
            .collect(),
        resharding: running_view(stream),
        last_reshard: stream
            .last_reshard
            .as_ref()
            .map(|r| reshard_view(stream, r)),
        rollback_until_ms: stream.rollback_until_ms(rollback_window_ms),
        rollback_allowed: stream.rollback_allowed(rollback_window_ms, now_ms),
        retired_shards: stream.retired.iter().copied().collect(),
        retention: stream.retention,
        dlq_retention: stream.dlq_retention,
        retention_blocked_by: None,
        revision,
    }
}

/// The group view. `lag` maps a shard to its `(lag, pending)` when the data Redis was asked.
pub fn group_view(
    group: &GroupDoc,
    stream: &StreamDoc,
    revision: u64,
    now_ms: u64,
    lag: &HashMap<u32, (Option<u64>, Option<u64>)>,
) -> GroupView {
    let members = group
        .members
        .iter()
        .map(|(id, m)| member_view(id, m, now_ms))
        .collect();
    let shards = shard_views(group, stream, lag);
    let state = if group.members.is_empty() {
        GroupState::Empty
    } else if group.is_stable() && group.layout_version == stream.layout_version {
        GroupState::Stable
    } else {
        GroupState::Reconciling
    };
    GroupView {
        group: group.group.clone(),
        stream: group.stream.clone(),
        state,
        start: group.config.start,
        session_timeout_ms: group.config.session_timeout_ms,
        heartbeat_interval_ms: group.config.heartbeat_interval_ms,
        rebalance_timeout_ms: group.config.rebalance_timeout_ms,
        max_members: group.config.max_members,
        assignor: group.config.assignor.clone(),
        fencing: group.config.fencing,
        ordering: group.config.ordering,
        waiting_on_parents: Vec::new(),
        paused: group.config.paused_since_ms.is_some(),
        paused_since_ms: group.config.paused_since_ms,
        last_seek: group.last_seek.clone(),
        group_epoch: group.group_epoch,
        assignment_epoch: group.assignment_epoch,
        members,
        shards,
        resharding: running_view(stream),
        revision,
    }
}

/// One member as the group view shows it.
pub(crate) fn member_view(id: &str, m: &MemberDoc, now_ms: u64) -> MemberView {
    MemberView {
        member_id: id.to_owned(),
        member_epoch: m.member_epoch,
        state: m.state,
        client: m.client.clone(),
        last_heartbeat_ms_ago: now_ms.saturating_sub(m.last_heartbeat_ms),
        target_shards: m.target.iter().copied().collect(),
        owned_shards: m.reported.iter().copied().collect(),
        assigned_shards: m.assigned.iter().copied().collect(),
        pending_revocation: m.pending_revocation.iter().copied().collect(),
        is_static: m
            .incarnation
            .as_deref()
            .is_some_and(rsc_protocol::is_static_incarnation),
        away_ms: m.away_since_ms.map(|t| now_ms.saturating_sub(t)),
    }
}

/// The group's assignable shards with their target and current owners (a shard being revoked
/// is still its holder's), state and, when read, lag.
fn shard_views(
    group: &GroupDoc,
    stream: &StreamDoc,
    lag: &HashMap<u32, (Option<u64>, Option<u64>)>,
) -> Vec<ShardView> {
    let mut target_owner: HashMap<u32, &str> = HashMap::new();
    let mut current_owner: HashMap<u32, &str> = HashMap::new();
    for (id, m) in &group.members {
        for &s in &m.target {
            target_owner.insert(s, id);
        }
        for &s in m.assigned.iter().chain(&m.pending_revocation) {
            current_owner.insert(s, id);
        }
    }
    stream
        .assignable_shards()
        .into_iter()
        .filter_map(|s| {
            let state = stream.shard_state(s)?;
            let (lag, pending) = lag.get(&s).copied().unwrap_or((None, None));
            Some(ShardView {
                shard: s,
                key: shard_key(&stream.stream, s),
                target_owner: target_owner.get(&s).map(|m| (*m).to_owned()),
                current_owner: current_owner.get(&s).map(|m| (*m).to_owned()),
                state,
                lag,
                pending,
                time_lag_ms: None,
                last_delivered_id: None,
                last_delivered_ms: None,
                oldest_pending_id: None,
                oldest_pending_age_ms: None,
                stale_consumers: Vec::new(),
            })
        })
        .collect()
}
