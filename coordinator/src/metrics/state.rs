//! Gauges computed from the stored documents at scrape time (Prometheus text format).

use super::lag::LagProbe;
use crate::engine::{GroupDoc, StreamDoc, group_view};

/// The dead letters per group of each stream (by stream name), as
/// [`crate::service::Coordinator::dlq_depths`] counts them; a stream that could not be counted
/// is absent.
pub(crate) type DlqDepths = HashMap<String, Vec<rsc_protocol::DlqGroupDepth>>;
use crate::store::MetadataStore;
use rsc_protocol::{GroupView, MemberState, ShardState};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// Collects samples per metric family, then writes them with one `# HELP`/`# TYPE` each.
#[derive(Default)]
struct Families {
    order: Vec<&'static str>,
    by_name: HashMap<&'static str, (&'static str, Vec<String>)>,
}

impl Families {
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &[(&str, &str)], v: f64) {
        let entry = self.by_name.entry(name).or_insert_with(|| {
            self.order.push(name);
            (help, Vec::new())
        });
        let mut line = String::from(name);
        if !labels.is_empty() {
            line.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{k}=\"{}\"", escape(val));
            }
            line.push('}');
        }
        let _ = write!(line, " {v}");
        entry.1.push(line);
    }

    fn render(self) -> String {
        let mut out = String::new();
        for name in self.order {
            let (help, lines) = &self.by_name[name];
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for l in lines {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the state gauges of every group and stream in `store`, with lag and pending per
/// shard when `lag` is given. A store failure is reported as `rsc_state_scrape_ok 0` with
/// whatever was read before it.
pub(crate) async fn render(
    store: &dyn MetadataStore,
    now_ms: u64,
    lag: Option<&LagProbe>,
    dlq: Option<&DlqDepths>,
) -> String {
    let mut f = Families::default();
    let ok = match collect(&mut f, store, now_ms, lag).await {
        Ok(groups_by_stream) => {
            if let Some(d) = dlq {
                dlq_gauges(&mut f, d, &groups_by_stream, now_ms);
            }
            true
        }
        Err(_) => false,
    };
    f.gauge(
        "rsc_state_scrape_ok",
        "1 if the store answered every read of this scrape, else 0.",
        &[],
        if ok { 1.0 } else { 0.0 },
    );
    f.render()
}

/// Reads every stream and group from `store` and adds their gauges to `f`; answers the
/// groups of each stream.
async fn collect(
    f: &mut Families,
    store: &dyn MetadataStore,
    now_ms: u64,
    lag: Option<&LagProbe>,
) -> Result<BTreeMap<String, Vec<String>>, crate::store::StoreError> {
    let mut by_stream: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let streams = store.list_streams().await?;
    let mut stream_docs = HashMap::new();
    f.gauge(
        "rsc_streams",
        "Streams known to the coordinator.",
        &[],
        streams.len() as f64,
    );
    for name in &streams {
        let Some(v) = store.load_stream(name).await? else {
            continue;
        };
        stream_gauges(f, name, &v.doc);
        stream_docs.insert(name.clone(), v);
    }

    let groups = store.list_groups().await?;
    f.gauge(
        "rsc_groups",
        "Consumer groups known to the coordinator.",
        &[],
        groups.len() as f64,
    );
    for name in &groups {
        let Some(g) = store.load_group(name).await? else {
            continue;
        };
        let Some(stream) = stream_docs.get(&g.doc.stream) else {
            continue;
        };
        let doc = &g.doc;
        by_stream
            .entry(doc.stream.clone())
            .or_default()
            .push(name.clone());
        let mut view = group_view(doc, &stream.doc, g.revision, now_ms, &HashMap::new());
        let group = name.as_str();
        member_gauges(f, group, doc, &view);
        group_gauges(f, group, doc, now_ms);
        if let Some(probe) = lag {
            shard_lag_gauges(f, group, doc, &mut view, probe, now_ms).await;
        }
        scaling_gauges(f, &super::scaling::scaling(&view, None));
    }
    Ok(by_stream)
}

/// The dead letters of each group (`rsc_dlq_entries`) and its oldest one's age
/// (`rsc_dlq_oldest_age_seconds`), from the counts of each stream's `<stream>:dlq`
/// (`crate::dlq::depth`); a group without any reads 0. A stream whose dead letters could
/// not be counted (no data Redis, or it did not answer) has no series.
fn dlq_gauges(
    f: &mut Families,
    dlq: &DlqDepths,
    groups_by_stream: &BTreeMap<String, Vec<String>>,
    now_ms: u64,
) {
    for (stream, groups) in groups_by_stream {
        let Some(depths) = dlq.get(stream) else {
            continue;
        };
        for group in groups {
            let d = depths.iter().find(|d| &d.group == group);
            let labels = [("stream", stream.as_str()), ("group", group.as_str())];
            f.gauge(
                "rsc_dlq_entries",
                "Dead letters of a group in its stream's dead-letter stream <stream>:dlq.",
                &labels,
                d.map_or(0, |d| d.entries) as f64,
            );
            let age = d
                .and_then(|d| d.oldest_ms)
                .map_or(0, |t| now_ms.saturating_sub(t));
            f.gauge(
                "rsc_dlq_oldest_age_seconds",
                "Age of a group's oldest dead letter (0 when it has none).",
                &labels,
                age as f64 / 1000.0,
            );
        }
    }
}

/// The layout and reshard gauges of one stream.
fn stream_gauges(f: &mut Families, name: &str, s: &StreamDoc) {
    let draining = s.draining.len() as f64;
    f.gauge(
        "rsc_stream_shards",
        "Shards of a stream by lifecycle state (active: in the routing layout; draining: being emptied after a scale-down).",
        &[("stream", name), ("state", "active")],
        f64::from(s.shard_count),
    );
    f.gauge(
        "rsc_stream_shards",
        "Shards of a stream by lifecycle state (active: in the routing layout; draining: being emptied after a scale-down).",
        &[("stream", name), ("state", "draining")],
        draining,
    );
    f.gauge(
        "rsc_stream_retired_keys_kept",
        "Retired shards whose keys are still in the data Redis, waiting for the end of the rollback window.",
        &[("stream", name)],
        s.retired.len() as f64,
    );
    f.gauge(
        "rsc_stream_routing_epoch",
        "Routing epoch of a stream (bumped on every layout change).",
        &[("stream", name)],
        s.routing_epoch as f64,
    );
    let current = match s.running_reshard() {
        Some(_) => "draining",
        None if s.last_reshard.is_some() => "complete",
        None => "none",
    };
    for state in ["none", "draining", "complete"] {
        f.gauge(
            "rsc_reshard_state",
            "Reshard state of a stream: 1 for the current state (none, draining, complete).",
            &[("stream", name), ("state", state)],
            if state == current { 1.0 } else { 0.0 },
        );
    }
}

/// Members by reconciliation state and shards by ownership, of one group.
fn member_gauges(f: &mut Families, group: &str, doc: &GroupDoc, view: &GroupView) {
    for (state, label) in [
        (MemberState::Stable, "stable"),
        (MemberState::Unrevoked, "unrevoked"),
        (MemberState::Unreleased, "unreleased"),
    ] {
        let n = doc.members.values().filter(|m| m.state == state).count();
        f.gauge(
            "rsc_group_members",
            "Members of a group by reconciliation state.",
            &[("group", group), ("state", label)],
            n as f64,
        );
    }
    let mut by_state: [(&str, usize); 4] =
        [("owned", 0), ("moving", 0), ("free", 0), ("unassigned", 0)];
    for s in &view.shards {
        let i = match (&s.target_owner, &s.current_owner) {
            (None, _) => 3,
            (Some(_), None) => 2,
            (Some(t), Some(c)) if t == c => 0,
            (Some(_), Some(_)) => 1,
        };
        by_state[i].1 += 1;
    }
    for (state, n) in by_state {
        f.gauge(
            "rsc_group_shards",
            "Shards of a group by ownership: owned (held by its target owner), moving (held by another member, revocation pending), free (target owner set, held by nobody yet), unassigned (no target owner).",
            &[("group", group), ("state", state)],
            n as f64,
        );
    }
}

/// Pause, epochs, revocations and reconciliation time of one group.
fn group_gauges(f: &mut Families, group: &str, doc: &GroupDoc, now_ms: u64) {
    f.gauge(
        "rsc_group_paused",
        "1 while an operator has paused the group (its members fetch nothing new), else 0.",
        &[("group", group)],
        if doc.config.paused_since_ms.is_some() {
            1.0
        } else {
            0.0
        },
    );
    f.gauge(
        "rsc_group_epoch",
        "Group epoch (bumped on every membership, layout or config change).",
        &[("group", group)],
        doc.group_epoch as f64,
    );
    f.gauge(
        "rsc_group_assignment_epoch",
        "Group epoch the target assignment was computed for.",
        &[("group", group)],
        doc.assignment_epoch as f64,
    );
    let pending: usize = doc
        .members
        .values()
        .map(|m| m.pending_revocation.len())
        .sum();
    f.gauge(
        "rsc_group_pending_revocations",
        "Shards members were asked to revoke and still report owning.",
        &[("group", group)],
        pending as f64,
    );
    let oldest = doc
        .members
        .values()
        .filter(|m| m.state == MemberState::Unrevoked)
        .filter_map(|m| m.revoke_started_ms)
        .min()
        .map_or(0, |t| now_ms.saturating_sub(t));
    f.gauge(
        "rsc_group_pending_revocation_age_seconds",
        "Age of the oldest unanswered revocation request in a group (0 when none).",
        &[("group", group)],
        oldest as f64 / 1000.0,
    );
    let reconciling = doc
        .reconciling_since_ms
        .map_or(0, |t| now_ms.saturating_sub(t));
    f.gauge(
        "rsc_group_reconciling_seconds",
        "How long a group has been reconciling towards its target assignment (0 when stable).",
        &[("group", group)],
        reconciling as f64 / 1000.0,
    );
}

/// Lag and pending entries per shard of one group, from the data Redis; also fills them in
/// `view` (for the scaling gauges).
async fn shard_lag_gauges(
    f: &mut Families,
    group: &str,
    doc: &GroupDoc,
    view: &mut GroupView,
    probe: &LagProbe,
    now_ms: u64,
) {
    let keys: Vec<(u32, String)> = view
        .shards
        .iter()
        .map(|s| (s.shard, s.key.clone()))
        .collect();
    let stats = probe.group_stats(group, &keys).await;
    for s in &mut view.shards {
        if let Some(st) = stats.get(&s.shard) {
            s.lag = st.lag;
            s.pending = st.pending;
            s.time_lag_ms = st.time_lag_ms(now_ms);
        }
    }
    for s in &view.shards {
        let Some(st) = stats.get(&s.shard) else {
            continue;
        };
        let shard = s.shard.to_string();
        let state = match s.state {
            ShardState::Active => "active",
            ShardState::Draining => "draining",
        };
        let labels = [
            ("group", group),
            ("stream", doc.stream.as_str()),
            ("shard", shard.as_str()),
            ("state", state),
        ];
        if let Some(l) = st.lag {
            f.gauge(
                "rsc_shard_lag_entries",
                "Entries of a shard not yet delivered to the group (XINFO GROUPS lag).",
                &labels,
                l as f64,
            );
        }
        if let Some(p) = st.pending {
            f.gauge(
                "rsc_shard_pending_entries",
                "Entries of a shard delivered to the group and not yet acknowledged.",
                &labels,
                p as f64,
            );
        }
    }
}

/// The autoscaling signal of one group (the same numbers as `GET /v1/groups/{group}/scaling`
/// without a `concurrency` parameter).
fn scaling_gauges(f: &mut Families, s: &rsc_protocol::ScalingView) {
    let labels = [("group", s.group.as_str()), ("stream", s.stream.as_str())];
    if let Some(lag) = s.lag {
        f.gauge(
            "rsc_group_lag_entries",
            "Entries not yet delivered to a group, summed over its shards (the autoscaling signal).",
            &labels,
            lag as f64,
        );
    }
    if let Some(p) = s.pending {
        f.gauge(
            "rsc_group_pending_entries",
            "Entries delivered to a group and not yet acknowledged, summed over its shards.",
            &labels,
            p as f64,
        );
    }
    if let Some(b) = s.backlog {
        f.gauge(
            "rsc_group_backlog_entries",
            "Lag plus pending entries of a group: the work waiting for it.",
            &labels,
            b as f64,
        );
    }
    if let Some(t) = s.time_lag_ms {
        f.gauge(
            "rsc_group_time_lag_seconds",
            "Age of the oldest entry not yet delivered to a group, the largest over its shards (0: nothing waits).",
            &labels,
            t as f64 / 1000.0,
        );
    }
    f.gauge(
        "rsc_group_shards_reporting",
        "Shards of a group whose lag was read from the data Redis (below the shard count the sums are partial).",
        &labels,
        f64::from(s.shards_reporting),
    );
    f.gauge(
        "rsc_group_active_shards",
        "Active shards of the stream a group reads: the most members that can do work.",
        &labels,
        f64::from(s.active_shards),
    );
    f.gauge(
        "rsc_group_member_count",
        "Members of a group.",
        &labels,
        f64::from(s.members),
    );
    f.gauge(
        "rsc_group_idle_members",
        "Members of a group with no shard in the target assignment (beyond the shard count).",
        &labels,
        f64::from(s.idle_members),
    );
    f.gauge(
        "rsc_group_processes",
        "Consumer processes (distinct pods) with a member in a group.",
        &labels,
        f64::from(s.processes),
    );
    f.gauge(
        "rsc_group_max_replicas",
        "Most consumer processes worth running for a group: ceil(active shards / members per process); reshard to go further.",
        &labels,
        f64::from(s.max_replicas),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_once_with_escaped_labels() {
        let mut f = Families::default();
        f.gauge("rsc_a", "A.", &[("group", "x\"y")], 1.0);
        f.gauge("rsc_b", "B.", &[], 2.5);
        f.gauge("rsc_a", "A.", &[("group", "z")], 3.0);
        assert_eq!(
            f.render(),
            "# HELP rsc_a A.\n# TYPE rsc_a gauge\nrsc_a{group=\"x\\\"y\"} 1\nrsc_a{group=\"z\"} 3\n\
             # HELP rsc_b B.\n# TYPE rsc_b gauge\nrsc_b 2.5\n"
        );
    }
}
