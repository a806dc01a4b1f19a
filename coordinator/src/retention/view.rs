//! `retention_blocked_by` of the stream view (PROTOCOL §18), read when the view is asked.

use super::point::{EntryId, GroupInput, Position, ShardInput, ShardKind, trim_point};
use crate::metrics::LagProbe;
use rsc_protocol::StreamView;

/// The group holding the stream's retention back the most: on the shard whose safe point is
/// the oldest, the group whose position limits it, when older than `keep_acked_ms`. Judged
/// from one `XINFO GROUPS` per active shard (positions by last-delivered id); `None` when no
/// group holds it back or the data Redis does not answer.
pub(crate) async fn blocked_by(probe: &LagProbe, view: &StreamView, now_ms: u64) -> Option<String> {
    let readings = probe.read_keys(&view.shard_keys).await;
    let mut worst: Option<(EntryId, String)> = None;
    for key in &view.shard_keys {
        let Some(Some(groups)) = readings.get(key) else {
            continue;
        };
        let input = ShardInput {
            groups: view
                .groups
                .iter()
                .map(|g| GroupInput {
                    group: g.clone(),
                    position: groups
                        .iter()
                        .find(|r| &r.group == g)
                        .and_then(|r| EntryId::parse(&r.last_delivered))
                        .map_or(Position::NoConsumerGroup, |last| Position::Reading {
                            last_delivered: last,
                            pending: 0,
                            oldest_pending: None,
                        }),
                    held: false,
                })
                .collect(),
            kind: ShardKind::Active,
            seal: None,
            policy: view.retention,
            now_ms,
        };
        let d = trim_point(&input);
        if let Some(g) = d.blocked_by
            && worst.as_ref().is_none_or(|(w, _)| d.safe < *w)
        {
            worst = Some((d.safe, g));
        }
    }
    worst.map(|(_, g)| g)
}
