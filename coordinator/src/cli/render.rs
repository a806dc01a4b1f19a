//! Human tables for group and stream views (`--output table`).

use super::table::{Table, duration_ms, or_dash, rfc3339_ms, shard_ranges, wire_name};
use rsc_protocol::{
    ClientInfo, GroupView, ReshardState, ReshardingView, RetentionPolicy, StreamView,
};
use std::fmt::Write as _;

/// A group's state, with `(paused)` while an operator has paused it.
fn group_state(g: &GroupView) -> String {
    if g.paused {
        format!("{} (paused)", wire_name(&g.state))
    } else {
        wire_name(&g.state)
    }
}

/// `group describe`: a summary row, the reshard line, the shard table and the member table,
/// in the spirit of `kafka-consumer-groups --describe`.
pub(super) fn group(g: &GroupView) -> String {
    let mut out = summary(g);
    if let Some(r) = &g.resharding {
        let _ = writeln!(out, "\n{}", reshard_line(&g.stream, r));
    }
    if !g.waiting_on_parents.is_empty() {
        let _ = writeln!(
            out,
            "\nOrdering {}: moved keys wait for their parent shards",
            wire_name(&g.ordering)
        );
        out.push_str(&parents(g).to_string());
    }
    out.push('\n');
    out.push_str(&shards(g).to_string());
    out.push('\n');
    if g.members.is_empty() {
        let _ = writeln!(out, "Group {} has no members.", g.group);
        return out;
    }
    out.push_str(&members(g).to_string());
    out
}

/// The group's summary row and its `Config:` line.
fn summary(g: &GroupView) -> String {
    let mut out = String::new();
    let mut summary = Table::new([
        "GROUP",
        "STREAM",
        "STATE",
        "GROUP EPOCH",
        "ASSIGNMENT EPOCH",
        "MEMBERS",
        "SHARDS",
    ]);
    summary.row([
        g.group.clone(),
        g.stream.clone(),
        group_state(g),
        g.group_epoch.to_string(),
        g.assignment_epoch.to_string(),
        g.members.len().to_string(),
        g.shards.len().to_string(),
    ]);
    out.push_str(&summary.to_string());
    if let Some(s) = &g.last_seek {
        let _ = writeln!(
            out,
            "Last seek: to {} at {} on shards {} ({} entries to be delivered again)",
            s.to,
            rfc3339_ms(s.at_ms),
            shard_ranges(&s.shards),
            s.redelivered
        );
    }
    let _ = writeln!(
        out,
        "Config: start {}, session timeout {}, heartbeat interval {}, rebalance timeout {}, \
         max members {}, assignor {}",
        wire_name(&g.start),
        duration_ms(g.session_timeout_ms),
        duration_ms(g.heartbeat_interval_ms),
        duration_ms(g.rebalance_timeout_ms),
        g.max_members
            .map_or_else(|| "unlimited".into(), |n| n.to_string()),
        g.assignor
    );
    out
}

/// The parent shards moved keys wait for (ordered resharding).
fn parents(g: &GroupView) -> Table {
    let mut w = Table::new([
        "PARENT",
        "EPOCH",
        "SEAL",
        "UNDELIVERED",
        "PENDING",
        "CHILDREN",
    ]);
    for p in &g.waiting_on_parents {
        w.row([
            p.parent.to_string(),
            p.routing_epoch.to_string(),
            p.seal.clone(),
            p.undelivered.to_string(),
            p.pending.to_string(),
            p.children
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    w
}

/// The shard table: owners, state (with `revoking` or `moving`), position (the last
/// delivered entry and its time), lag, pending entries and the oldest one's age.
fn shards(g: &GroupView) -> Table {
    let mut shards = Table::new([
        "SHARD",
        "KEY",
        "CURRENT OWNER",
        "TARGET OWNER",
        "STATE",
        "LAST DELIVERED",
        "DELIVERED AT",
        "LAG",
        "PENDING",
        "OLDEST PENDING",
        "STALE CONSUMERS",
    ]);
    for s in &g.shards {
        let moving = s.target_owner != s.current_owner && s.current_owner.is_some();
        let revoking = g
            .members
            .iter()
            .any(|m| m.pending_revocation.contains(&s.shard));
        let mut state = wire_name(&s.state);
        if revoking {
            state.push_str(", revoking");
        } else if moving {
            state.push_str(", moving");
        }
        shards.row([
            s.shard.to_string(),
            s.key.clone(),
            or_dash(s.current_owner.as_deref()),
            or_dash(s.target_owner.as_deref()),
            state,
            or_dash(s.last_delivered_id.as_deref()),
            or_dash(s.last_delivered_ms.map(rfc3339_ms)),
            or_dash(s.lag),
            or_dash(s.pending),
            or_dash(
                s.oldest_pending_age_ms
                    .map(|a| format!("{} old", duration_ms(a))),
            ),
            stale_consumers(&s.stale_consumers),
        ]);
    }
    shards
}

/// The member table.
fn members(g: &GroupView) -> Table {
    let mut members = Table::new([
        "MEMBER",
        "EPOCH",
        "STATE",
        "SHARDS",
        "TARGET",
        "PENDING REVOCATION",
        "LAST HEARTBEAT",
        "CLIENT",
    ]);
    for m in &g.members {
        members.row([
            m.member_id.clone(),
            m.member_epoch.to_string(),
            match (m.away_ms, m.is_static) {
                (Some(away), _) => format!("away:{}", duration_ms(away)),
                (None, true) => format!("{}:static", wire_name(&m.state)),
                (None, false) => wire_name(&m.state),
            },
            shard_ranges(&m.assigned_shards),
            shard_ranges(&m.target_shards),
            shard_ranges(&m.pending_revocation),
            format!("{} ago", duration_ms(m.last_heartbeat_ms_ago)),
            client(m.client.as_ref()),
        ]);
    }
    members
}

/// `2 (5 pending)`: departed members' consumers still in a shard's Redis consumer group.
fn stale_consumers(list: &[rsc_protocol::StaleConsumer]) -> String {
    if list.is_empty() {
        return "-".into();
    }
    let pending: u64 = list.iter().map(|c| c.pending).sum();
    format!("{}({pending}-pending)", list.len())
}

/// `group seek`: the plan per shard, and what was done (`paused`: whether the group is still
/// paused after a move, when known).
pub(super) fn seek(
    r: &rsc_protocol::SeekResponse,
    to: &rsc_protocol::SeekTarget,
    paused: Option<bool>,
) -> String {
    let mut out = String::new();
    let what = format!(
        "group {} to {to} on {} shard{}: {} entries to be delivered again, {} skipped; {} to \
         deliver after it",
        r.group,
        r.plan.len(),
        if r.plan.len() == 1 { "" } else { "s" },
        r.redelivered,
        r.skipped,
        r.lag_after
    );
    if r.dry_run {
        let _ = writeln!(out, "Dry run: seek of {what}.");
    } else {
        let _ = writeln!(out, "Moved {what}.");
    }
    let mut t = Table::new([
        "SHARD",
        "KEY",
        "CURRENT",
        "CURRENT AT",
        "NEW",
        "NEW AT",
        "LAG NOW",
        "LAG AFTER",
        "DELIVERED AGAIN",
        "SKIPPED",
        "PENDING",
    ]);
    for p in &r.plan {
        t.row([
            p.shard.to_string(),
            p.key.clone(),
            p.current_id
                .clone()
                .unwrap_or_else(|| "(no consumer group)".into()),
            or_dash(p.current_ms.map(rfc3339_ms)),
            p.new_id.clone(),
            or_dash(p.new_ms.map(rfc3339_ms)),
            or_dash(p.lag_before),
            p.lag_after.to_string(),
            p.redelivered.to_string(),
            p.skipped.to_string(),
            p.pending.to_string(),
        ]);
    }
    out.push('\n');
    out.push_str(&t.to_string());
    out.push('\n');
    if r.dry_run {
        let _ = writeln!(
            out,
            "Nothing was moved. To apply it, run the same command with --execute."
        );
    } else if paused == Some(true) {
        let _ = writeln!(
            out,
            "The group is still paused: resume it with `rsc-coordinator group resume {}`; its \
             members then read from the new positions at once.",
            r.group
        );
    }
    if r.plan.iter().any(|p| p.pending > 0) {
        let _ = writeln!(
            out,
            "Entries pending (delivered, not acknowledged) stay pending: the seek does not \
             change them."
        );
    }
    out
}

/// `group list`: one row per group.
pub(super) fn group_list(groups: &[GroupView]) -> String {
    if groups.is_empty() {
        return "No groups.\n".into();
    }
    let mut t = Table::new([
        "GROUP",
        "STREAM",
        "STATE",
        "MEMBERS",
        "SHARDS",
        "GROUP EPOCH",
        "RESHARDING",
    ]);
    for g in groups {
        t.row([
            g.group.clone(),
            g.stream.clone(),
            group_state(g),
            g.members.len().to_string(),
            g.shards.len().to_string(),
            g.group_epoch.to_string(),
            g.resharding
                .as_ref()
                .map_or_else(|| "-".into(), |r| format!("{} -> {}", r.from, r.to)),
        ]);
    }
    t.to_string()
}

/// `dlq redrive`: what was redriven (or would be, in a dry run), one row per dead letter.
pub(super) fn redrive(r: &rsc_protocol::RedriveResponse) -> String {
    let head = if r.dry_run {
        format!(
            "Dry run: {} dead letters of group {} in {}:dlq would be redriven (nothing written or removed).",
            r.redriven, r.group, r.stream
        )
    } else {
        format!(
            "Redrove {} dead letters of group {} from {}:dlq to their shards.",
            r.redriven, r.group, r.stream
        )
    };
    if r.entries.is_empty() {
        return format!(
            "{head}
"
        );
    }
    let mut t = Table::new(["DLQ ID", "KEY", "SHARD", "NEW ID", "REDRIVES", "ERROR"]);
    for e in &r.entries {
        t.row([
            e.dlq_id.clone(),
            e.key.clone().unwrap_or_else(|| "-".into()),
            e.shard.to_string(),
            e.id.clone().unwrap_or_else(|| "-".into()),
            e.redrive_count.to_string(),
            e.error.chars().take(60).collect(),
        ]);
    }
    format!(
        "{head}

{t}"
    )
}

/// The table of dead letters a list or purge answers.
fn dead_letters(entries: &[rsc_protocol::DeadLetterView]) -> Table {
    let mut t = Table::new(["DLQ ID", "TIME", "GROUP", "KEY", "ATTEMPTS", "ERROR"]);
    for e in entries {
        let time = e
            .dlq_id
            .split('-')
            .next()
            .and_then(|m| m.parse().ok())
            .map_or_else(|| "-".into(), rfc3339_ms);
        t.row([
            e.dlq_id.clone(),
            time,
            e.group.clone(),
            e.key.clone().unwrap_or_else(|| "-".into()),
            or_dash(e.attempts),
            e.error.chars().take(60).collect(),
        ]);
    }
    t
}

/// `dlq list`: the depth per group, then the page of dead letters and how to get the next.
pub(super) fn dlq_list(l: &rsc_protocol::DlqList, now_ms: u64) -> String {
    let mut out = String::new();
    let mut d = Table::new(["GROUP", "DEAD LETTERS", "OLDEST"]);
    for g in &l.depth {
        let oldest = g.oldest_ms.map_or_else(
            || "-".into(),
            |t| format!("{} ago", duration_ms(now_ms.saturating_sub(t))),
        );
        d.row([g.group.clone(), g.entries.to_string(), oldest]);
    }
    if l.depth.is_empty() {
        let _ = writeln!(out, "{}:dlq holds no dead letters.", l.stream);
    } else {
        let _ = writeln!(out, "{}:dlq\n\n{d}", l.stream);
    }
    if l.entries.is_empty() {
        let _ = writeln!(out, "No dead letter matches.");
    } else {
        let _ = write!(out, "\n{}", dead_letters(&l.entries));
    }
    if let Some(next) = &l.next_after {
        let _ = writeln!(
            out,
            "\nMore may match: add --after {next} for the next page."
        );
    }
    out
}

/// `dlq purge`: what was (or would be) deleted.
pub(super) fn dlq_purge(r: &rsc_protocol::DlqPurgeResponse) -> String {
    let mut out = if r.dry_run {
        format!(
            "Dry run: {} dead letters of {}:dlq would be deleted (nothing deleted; add --execute).\n",
            r.purged, r.stream
        )
    } else {
        format!("Deleted {} dead letters from {}:dlq.\n", r.purged, r.stream)
    };
    if !r.entries.is_empty() {
        let _ = write!(out, "\n{}", dead_letters(&r.entries));
    }
    if r.more {
        let _ = writeln!(out, "\nMore match beyond --limit: purge again for them.");
    }
    out
}

/// `stream describe`: layout, groups, reshard progress and rollback window.
pub(super) fn stream(s: &StreamView, now_ms: u64) -> String {
    let mut out = String::new();
    let mut t = Table::new([
        "STREAM",
        "SHARDS",
        "ROUTING EPOCH",
        "GROUPS",
        "RESHARDING",
        "ROLLBACK",
    ]);
    t.row([
        s.stream.clone(),
        s.shard_count.to_string(),
        s.routing_epoch.to_string(),
        if s.groups.is_empty() {
            "-".into()
        } else {
            s.groups.join(",")
        },
        s.resharding
            .as_ref()
            .map_or_else(|| "-".into(), |r| format!("{} -> {}", r.from, r.to)),
        rollback_window(s, now_ms),
    ]);
    out.push_str(&t.to_string());
    if let Some(r) = s.resharding.as_ref().or(s.last_reshard.as_ref()) {
        let _ = writeln!(out, "\n{}", reshard_line(&s.stream, r));
        if !r.draining.is_empty() {
            let mut d = Table::new(["DRAINING SHARD", "DRAINED BY", "WAITING FOR"]);
            for shard in &r.draining {
                d.row([
                    format!("{}:{}", s.stream, shard.shard),
                    join_or_dash(&shard.drained_groups),
                    join_or_dash(&shard.waiting_groups),
                ]);
            }
            out.push('\n');
            out.push_str(&d.to_string());
        }
    }
    let _ = writeln!(out, "\nRetention: {}", retention(&s.retention, true));
    let _ = writeln!(
        out,
        "Dead letters ({}:dlq): {}",
        s.stream,
        retention(&s.dlq_retention, false)
    );
    if let Some(g) = &s.retention_blocked_by {
        let _ = writeln!(
            out,
            "Retention held back by group {g} (it still needs the oldest entries)"
        );
    }
    if !s.retired_shards.is_empty() {
        let _ = writeln!(
            out,
            "\nRetired shards whose keys are kept until the rollback window closes: {}",
            s.retired_shards
                .iter()
                .map(|n| format!("{}:{n}", s.stream))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out
}

/// `stream list`: one row per stream.
pub(super) fn stream_list(streams: &[StreamView]) -> String {
    if streams.is_empty() {
        return "No streams.\n".into();
    }
    let mut t = Table::new(["STREAM", "SHARDS", "ROUTING EPOCH", "GROUPS", "RESHARDING"]);
    for s in streams {
        t.row([
            s.stream.clone(),
            s.shard_count.to_string(),
            s.routing_epoch.to_string(),
            s.groups.len().to_string(),
            s.resharding.as_ref().map_or_else(
                || "-".into(),
                |r| format!("{} -> {} ({} draining)", r.from, r.to, r.draining.len()),
            ),
        ]);
    }
    t.to_string()
}

/// One line about a reshard: `Reshard of orders 8 -> 4: draining, 2 of 4 shards retired`.
pub(super) fn reshard_line(stream: &str, r: &ReshardingView) -> String {
    let kind = if r.rollback { "Rollback" } else { "Reshard" };
    let (done, total) = reshard_progress(r);
    match r.state {
        ReshardState::Complete => format!("{kind} of {stream} {} -> {}: complete", r.from, r.to),
        ReshardState::Draining => format!(
            "{kind} of {stream} {} -> {}: draining, {done} of {total} shards retired",
            r.from, r.to
        ),
    }
}

/// `(retired, to retire)` shards of a reshard.
pub(super) fn reshard_progress(r: &ReshardingView) -> (u64, u64) {
    let left = r.draining.len() as u64;
    let total = u64::from(r.from.saturating_sub(r.to)).max(left);
    (total - left, total)
}

/// A retention policy in words (`acked`: whether `keep_acked_ms` applies).
fn retention(r: &RetentionPolicy, acked: bool) -> String {
    let mut parts = Vec::new();
    if acked {
        parts.push(match r.keep_acked_ms {
            0 => "acknowledged entries trimmed at once".to_owned(),
            ms => format!("acknowledged entries kept {}", duration_ms(ms)),
        });
    }
    parts.push(format!(
        "max age {}",
        r.max_age_ms.map_or_else(|| "none".into(), duration_ms)
    ));
    parts.push(format!(
        "max entries per shard {}",
        r.max_entries_per_shard
            .map_or_else(|| "none".into(), |n| n.to_string())
    ));
    parts.join(", ")
}

fn rollback_window(s: &StreamView, now_ms: u64) -> String {
    match (s.rollback_until_ms, s.rollback_allowed) {
        (None, true) => "allowed (reshard running)".into(),
        (None, false) => "-".into(),
        (Some(until), _) if until < now_ms => "window closed".into(),
        (Some(until), _) => format!("allowed for {}", duration_ms(until - now_ms)),
    }
}

fn join_or_dash(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

fn client(c: Option<&ClientInfo>) -> String {
    let Some(c) = c else { return "-".into() };
    match (c.host.as_deref(), c.pod_ip.as_deref()) {
        (Some(h), Some(ip)) => format!("{h}/{ip}"),
        (Some(x), None) | (None, Some(x)) => x.to_owned(),
        (None, None) => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsc_protocol::{
        DrainingShardView, GroupState, MemberState, MemberView, ShardState, ShardView,
        StartPosition,
    };

    fn view() -> GroupView {
        GroupView {
            group: "billing".into(),
            stream: "orders".into(),
            state: GroupState::Reconciling,
            start: StartPosition::Earliest,
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 3_000,
            rebalance_timeout_ms: 60_000,
            max_members: None,
            assignor: "sticky".into(),
            fencing: rsc_protocol::FencingMode::Lease,
            ordering: rsc_protocol::OrderingMode::Key,
            waiting_on_parents: Vec::new(),
            paused: false,
            paused_since_ms: None,
            last_seek: None,
            group_epoch: 4,
            assignment_epoch: 4,
            members: vec![MemberView {
                member_id: "m1".into(),
                member_epoch: 3,
                state: MemberState::Unrevoked,
                client: Some(ClientInfo {
                    pod_ip: Some("10.0.0.7".into()),
                    host: Some("pod-a".into()),
                    ..ClientInfo::default()
                }),
                last_heartbeat_ms_ago: 1_200,
                target_shards: vec![0],
                owned_shards: vec![0, 1],
                assigned_shards: vec![0],
                pending_revocation: vec![1],
                is_static: false,
                away_ms: None,
            }],
            shards: vec![
                ShardView {
                    shard: 0,
                    key: "orders:0".into(),
                    target_owner: Some("m1".into()),
                    current_owner: Some("m1".into()),
                    state: ShardState::Active,
                    lag: Some(12),
                    pending: Some(3),
                    time_lag_ms: Some(4_000),
                    last_delivered_id: Some("1767225600000-3".into()),
                    last_delivered_ms: Some(1_767_225_600_000),
                    oldest_pending_id: Some("1767225599000-0".into()),
                    oldest_pending_age_ms: Some(65_000),
                    stale_consumers: vec![rsc_protocol::StaleConsumer {
                        name: "gone-0".into(),
                        pending: 2,
                    }],
                },
                ShardView {
                    shard: 1,
                    key: "orders:1".into(),
                    target_owner: Some("m2".into()),
                    current_owner: Some("m1".into()),
                    state: ShardState::Draining,
                    lag: None,
                    pending: None,
                    time_lag_ms: None,
                    last_delivered_id: None,
                    last_delivered_ms: None,
                    oldest_pending_id: None,
                    oldest_pending_age_ms: None,
                    stale_consumers: Vec::new(),
                },
            ],
            resharding: Some(ReshardingView {
                from: 2,
                to: 1,
                state: ReshardState::Draining,
                rollback: false,
                started_ms: 0,
                completed_ms: None,
                draining: vec![DrainingShardView {
                    shard: 1,
                    drained_groups: vec![],
                    waiting_groups: vec!["billing".into()],
                }],
                routing_epoch: Some(3),
                seals: Default::default(),
            }),
            revision: 9,
        }
    }

    #[test]
    fn describe_shows_owners_states_and_members() {
        let text = group(&view());
        assert!(text.contains("Reshard of orders 2 -> 1: draining, 0 of 1 shards retired"));
        let shard_0 = text.lines().find(|l| l.starts_with("0 ")).unwrap();
        assert!(shard_0.ends_with("1(2-pending)"), "{shard_0}");
        let cells: Vec<_> = shard_0.split_whitespace().collect();
        assert_eq!(
            cells[5..10],
            [
                "1767225600000-3",
                "2026-01-01T00:00:00.000Z",
                "12",
                "3",
                "1m05s"
            ],
            "the position, its time, lag, pending and the oldest pending's age: {shard_0}"
        );
        let shard_line = text.lines().find(|l| l.starts_with("1 ")).unwrap();
        let cells: Vec<_> = shard_line.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "1",
                "orders:1",
                "m1",
                "m2",
                "draining,",
                "revoking",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            ]
        );
        let member = text.lines().find(|l| l.starts_with("m1 ")).unwrap();
        let cells: Vec<_> = member.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "m1",
                "3",
                "unrevoked",
                "0",
                "0",
                "1",
                "1.2s",
                "ago",
                "pod-a/10.0.0.7"
            ]
        );
    }

    #[test]
    fn reshard_progress_counts_retired_shards() {
        let mut r = view().resharding.unwrap();
        assert_eq!(reshard_progress(&r), (0, 1));
        r.draining.clear();
        r.state = ReshardState::Complete;
        assert_eq!(reshard_progress(&r), (1, 1));
        assert_eq!(
            reshard_line("orders", &r),
            "Reshard of orders 2 -> 1: complete"
        );
    }

    #[test]
    fn redrive_lists_each_dead_letter_and_says_a_dry_run() {
        let mut r = rsc_protocol::RedriveResponse {
            stream: "orders".into(),
            group: "billing".into(),
            dry_run: true,
            redriven: 1,
            entries: vec![rsc_protocol::RedrivenEntry {
                dlq_id: "7-0".into(),
                key: Some("k3".into()),
                shard: 2,
                id: None,
                error: "boom".into(),
                redrive_count: 1,
            }],
        };
        let text = redrive(&r);
        assert!(
            text.starts_with("Dry run: 1 dead letters of group billing in orders:dlq"),
            "{text}"
        );
        let row: Vec<&str> = text.lines().last().unwrap().split_whitespace().collect();
        assert_eq!(row, ["7-0", "k3", "2", "-", "1", "boom"], "{text}");
        r.dry_run = false;
        r.entries[0].id = Some("9-0".into());
        assert!(redrive(&r).starts_with("Redrove 1 dead letters"));
        assert!(redrive(&r).contains("9-0"));
    }
}
