//! The drain check of a draining shard (PROTOCOL §6), made when the member reports it.
//!
//! A shard is drained for a group when nothing is pending in the group (every delivered entry
//! was acknowledged) and nothing is undelivered (the group's last-delivered id has reached the
//! stream's last entry). The shard worker flags a draining shard after a read that found
//! nothing; the member checks again right before each heartbeat that reports it, because a
//! producer with stale routing may still have written to the shard in between. Until the
//! coordinator retires the shard, the worker keeps reading it.

use redis::RedisError;
use redis::aio::ConnectionLike;
use redis::streams::StreamInfoGroupsReply;

/// What the data Redis says about one shard for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainState {
    /// Entries delivered to the group and not acknowledged.
    pub(crate) pending: usize,
    /// The group's last-delivered id (`None`: the group does not exist on the key).
    pub(crate) last_delivered: Option<String>,
    /// The id of the stream's last entry (`None`: the stream is empty or missing).
    pub(crate) last_entry: Option<String>,
}

impl DrainState {
    /// Nothing pending and nothing undelivered.
    pub(crate) fn is_drained(&self) -> bool {
        let Some(last) = &self.last_entry else {
            // Empty: drained unless something is somehow pending.
            return self.pending == 0;
        };
        match &self.last_delivered {
            Some(delivered) => self.pending == 0 && !id_before(delivered, last),
            // Entries but no group: nothing of them was ever read.
            None => false,
        }
    }
}

/// `a < b` for stream ids `<ms>-<seq>`. An unparsable id compares as "before" (so a shard
/// is never called drained by mistake).
fn id_before(a: &str, b: &str) -> bool {
    match (parse_id(a), parse_id(b)) {
        (Some(a), Some(b)) => a < b,
        _ => true,
    }
}

fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// Reads the drain state of `key` for `group` in one round trip (`XINFO GROUPS`,
/// `XREVRANGE key + - COUNT 1`).
pub(crate) async fn drain_state(
    conn: &mut (impl ConnectionLike + Send),
    key: &str,
    group: &str,
) -> Result<DrainState, RedisError> {
    let mut pipe = redis::pipe();
    pipe.cmd("EXISTS").arg(key);
    pipe.cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1);
    let (exists, last): (bool, redis::streams::StreamRangeReply) = pipe.query_async(conn).await?;
    let last_entry = last.ids.into_iter().next().map(|e| e.id);
    if !exists {
        return Ok(DrainState {
            pending: 0,
            last_delivered: None,
            last_entry,
        });
    }
    let info: StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await?;
    let g = info.groups.into_iter().find(|g| g.name == group);
    Ok(DrainState {
        pending: g.as_ref().map_or(0, |g| g.pending),
        last_delivered: g.map(|g| g.last_delivered_id),
        last_entry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pending: usize, delivered: Option<&str>, last: Option<&str>) -> DrainState {
        DrainState {
            pending,
            last_delivered: delivered.map(str::to_owned),
            last_entry: last.map(str::to_owned),
        }
    }

    #[test]
    fn drained_only_when_nothing_pending_and_everything_delivered() {
        assert!(state(0, Some("0-0"), None).is_drained());
        assert!(state(0, None, None).is_drained());
        assert!(state(0, Some("5-1"), Some("5-1")).is_drained());
        assert!(!state(1, Some("5-1"), Some("5-1")).is_drained());
        // An entry written after the last delivery (e.g. by a producer with stale routing).
        assert!(!state(0, Some("5-1"), Some("5-2")).is_drained());
        assert!(!state(0, Some("5-1"), Some("10-0")).is_drained());
        assert!(!state(0, None, Some("1-0")).is_drained());
        // Ids compare numerically, not as text.
        assert!(!state(0, Some("9-0"), Some("10-0")).is_drained());
        assert!(state(0, Some("10-0"), Some("9-0")).is_drained());
        assert!(!state(0, Some("junk"), Some("1-0")).is_drained());
    }
}
