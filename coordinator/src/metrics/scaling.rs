//! The autoscaling signal of a group (pure): total lag and pending entries, shards, members,
//! and the most consumer processes worth running. Served as JSON at
//! `GET /v1/groups/{group}/scaling` and as the `rsc_group_*` scaling gauges of `/metrics`,
//! both from [`scaling`], so they agree.
//!
//! A shard is read by one member at a time: a group gains nothing from more members than it
//! has active shards, so an autoscaler's maximum is `ceil(active_shards / concurrency)`
//! processes (`concurrency` members each). Past that, add shards (reshard) instead.

use rsc_protocol::{GroupView, ScalingView, ShardState};
use std::collections::BTreeSet;

/// The scaling signal of `view` (with lag and pending filled where known); `concurrency`
/// overrides the members per process the members report.
pub(crate) fn scaling(view: &GroupView, concurrency: Option<u32>) -> ScalingView {
    let reporting: Vec<_> = view.shards.iter().filter(|s| s.lag.is_some()).collect();
    let sum = |f: fn(&rsc_protocol::ShardView) -> Option<u64>| -> Option<u64> {
        (!reporting.is_empty()).then(|| reporting.iter().filter_map(|s| f(s)).sum())
    };
    let lag = sum(|s| s.lag);
    let pending = sum(|s| s.pending);
    let active_shards = view
        .shards
        .iter()
        .filter(|s| s.state == ShardState::Active)
        .count() as u32;
    let reported = view
        .members
        .iter()
        .filter_map(|m| m.client.as_ref()?.concurrency)
        .max();
    let concurrency = concurrency.or(reported).unwrap_or(1).max(1);
    let processes: BTreeSet<&str> = view
        .members
        .iter()
        .map(|m| {
            m.client
                .as_ref()
                .and_then(|c| c.pod_ip.as_deref().or(c.host.as_deref()))
                .unwrap_or(m.member_id.as_str())
        })
        .collect();
    ScalingView {
        group: view.group.clone(),
        stream: view.stream.clone(),
        lag,
        pending,
        backlog: lag.map(|l| l + pending.unwrap_or(0)),
        time_lag_ms: view.shards.iter().filter_map(|s| s.time_lag_ms).max(),
        shards: view.shards.len() as u32,
        shards_reporting: reporting.len() as u32,
        active_shards,
        members: view.members.len() as u32,
        idle_members: view
            .members
            .iter()
            .filter(|m| m.target_shards.is_empty())
            .count() as u32,
        concurrency,
        processes: processes.len() as u32,
        max_replicas: active_shards.div_ceil(concurrency).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsc_protocol::{ClientInfo, MemberView, ShardView};

    fn shard(i: u32, lag: Option<u64>, pending: Option<u64>, state: ShardState) -> ShardView {
        ShardView {
            shard: i,
            key: format!("s:{i}"),
            target_owner: None,
            current_owner: None,
            state,
            lag,
            pending,
            time_lag_ms: None,
            last_delivered_id: None,
            last_delivered_ms: None,
            oldest_pending_id: None,
            oldest_pending_age_ms: None,
            stale_consumers: vec![],
        }
    }

    fn member(id: &str, ip: &str, concurrency: u32, target: &[u32]) -> MemberView {
        MemberView {
            member_id: id.into(),
            member_epoch: 1,
            state: rsc_protocol::MemberState::Stable,
            client: Some(ClientInfo {
                pod_ip: Some(ip.into()),
                host: None,
                version: None,
                concurrency: Some(concurrency),
            }),
            last_heartbeat_ms_ago: 0,
            target_shards: target.to_vec(),
            owned_shards: target.to_vec(),
            assigned_shards: target.to_vec(),
            pending_revocation: vec![],
            is_static: false,
            away_ms: None,
        }
    }

    fn view(shards: Vec<ShardView>, members: Vec<MemberView>) -> GroupView {
        let mut v: GroupView = serde_json::from_value(serde_json::json!({
            "group": "g", "stream": "s", "state": "stable", "start": "earliest",
            "session_timeout_ms": 1, "heartbeat_interval_ms": 1, "rebalance_timeout_ms": 1,
            "max_members": null, "assignor": "sticky", "fencing": "lease",
            "group_epoch": 1, "assignment_epoch": 1, "members": [], "shards": [],
            "resharding": null, "revision": 1
        }))
        .expect("a group view");
        v.shards = shards;
        v.members = members;
        v
    }

    #[test]
    fn sums_lag_and_caps_replicas_at_shards_per_concurrency() {
        let v = view(
            vec![
                shard(0, Some(10), Some(1), ShardState::Active),
                shard(1, Some(5), Some(0), ShardState::Active),
                shard(2, None, None, ShardState::Active),
                shard(3, Some(2), Some(2), ShardState::Draining),
            ],
            vec![
                member("a-0", "10.0.0.1", 2, &[0, 1]),
                member("a-1", "10.0.0.1", 2, &[2]),
                member("b-0", "10.0.0.2", 2, &[]),
            ],
        );
        let s = scaling(&v, None);
        assert_eq!((s.lag, s.pending, s.backlog), (Some(17), Some(3), Some(20)));
        assert_eq!((s.shards, s.shards_reporting, s.active_shards), (4, 3, 3));
        assert_eq!((s.members, s.idle_members, s.processes), (3, 1, 2));
        assert_eq!((s.concurrency, s.max_replicas), (2, 2));
        assert_eq!(scaling(&v, Some(1)).max_replicas, 3);
        assert_eq!(scaling(&v, Some(0)).concurrency, 1, "never divides by zero");
    }

    #[test]
    fn unknown_lag_is_null_not_zero() {
        let v = view(vec![shard(0, None, None, ShardState::Active)], vec![]);
        let s = scaling(&v, None);
        assert_eq!((s.lag, s.backlog), (None, None));
        assert_eq!((s.concurrency, s.max_replicas, s.processes), (1, 1, 0));
    }
}
