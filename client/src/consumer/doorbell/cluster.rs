//! The doorbell on a Redis Cluster (PROTOCOL §16): sharded pub/sub and a poll per node.
//!
//! - **Rings**: producers `SPUBLISH` on the shard's channel, which lives in the shard's slot,
//!   so a ring travels to the node that serves the shard and no further (a plain `PUBLISH`
//!   on a cluster is copied to every node). The subscriber is one RESP3 cluster connection
//!   per process (a connection to each node) that `SSUBSCRIBE`s each channel on the node
//!   serving it; redis-rs subscribes again by itself after a reconnection or a slot
//!   migration, and a server's `SUNSUBSCRIBE` of a channel still wanted (its slot moved) is
//!   answered with a new `SSUBSCRIBE` and a ring.
//! - **Poll**: one script per master ([`POLL_NODE`]) over the waiting shards that master
//!   serves, after the slot map (`CLUSTER SLOTS`, read again after any failure); a shard the
//!   node could not read there, or whose node failed, is rung instead, so its worker reads
//!   it itself.

use super::{CONNECT_TIMEOUT, POLL_CHUNK, Shared};
use futures::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisError, Value};
use rsc_redis::LazyRedis;
use rsc_redis::cluster::{Node, SlotMap};
use std::collections::BTreeMap;
use std::sync::LazyLock;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tracing::debug;

/// The poll of one node (see the module docs); sent with `EVAL` (its body cached by Redis).
static POLL_NODE: LazyLock<String> =
    LazyLock::new(|| include_str!("../scripts/poll_node.lua").to_owned());

/// The sharded subscriber: its cluster connection and the pushes it receives.
pub(super) struct Sharded {
    conn: ClusterConnection,
    pushes: UnboundedReceiver<PushInfo>,
}

/// What a push of the subscriber connection means to the doorbell.
pub(super) enum Push {
    /// A ring on this channel.
    Ring(String),
    /// The server dropped the subscription of this channel (its slot moved).
    Dropped(String),
    /// A node connection dropped: rings may be lost (redis-rs subscribes again).
    Disconnected,
    /// Nothing to act on (a confirmation).
    Other,
}

/// Opens the sharded subscriber (a connection to each node).
pub(super) async fn connect(redis: &LazyRedis) -> Result<Sharded, RedisError> {
    let (tx, pushes) = unbounded_channel();
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, redis.cluster_pubsub(tx))
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    Ok(Sharded { conn, pushes })
}

impl Sharded {
    /// `SSUBSCRIBE`s (`on`) or `SUNSUBSCRIBE`s the channels, one command per channel (the
    /// channels of one command must share a slot), all at once.
    pub(super) async fn change(&mut self, channels: &[String], on: bool) -> Result<(), RedisError> {
        let calls = channels.iter().map(|ch| {
            let mut conn = self.conn.clone();
            async move {
                if on {
                    conn.ssubscribe(ch).await
                } else {
                    conn.sunsubscribe(ch).await
                }
            }
        });
        join_all(calls).await.into_iter().collect()
    }

    /// The next push; `None` when the connection is gone for good.
    pub(super) async fn next(&mut self) -> Option<Push> {
        let push = self.pushes.recv().await?;
        let channel = || match push.data.first() {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        };
        Some(match push.kind {
            PushKind::SMessage => channel().map_or(Push::Other, Push::Ring),
            PushKind::SUnsubscribe => channel().map_or(Push::Other, Push::Dropped),
            PushKind::Disconnection => Push::Disconnected,
            _ => Push::Other,
        })
    }
}

/// One fallback poll on a Redis Cluster (see the module docs): the number of shards woken.
/// `map` is the slot map, read when `None` and forgotten after any failure.
pub(super) async fn poll_once(
    shared: &Shared,
    redis: &LazyRedis,
    map: &mut Option<SlotMap>,
) -> u64 {
    let waiting = shared.waiting();
    if waiting.is_empty() {
        return 0;
    }
    if map.is_none() {
        match redis.slot_map().await {
            Ok(m) => *map = Some(m),
            Err(e) => {
                debug!(error = %e, "doorbell poll: cannot read the slot map");
                return 0;
            }
        }
    }
    let Some(m) = map.as_ref() else { return 0 };
    let mut by_node: BTreeMap<Node, Vec<(String, String)>> = BTreeMap::new();
    let mut stale = false;
    for (key, id) in waiting {
        match m.node_of(key.as_bytes()) {
            Some(node) => by_node.entry(node.clone()).or_default().push((key, id)),
            None => {
                // No master serves the slot in the map: a ring lets the worker read.
                shared.ring(&key, false);
                stale = true;
            }
        }
    }
    let polls = by_node.iter().flat_map(|(node, keys)| {
        keys.chunks(POLL_CHUNK)
            .map(move |chunk| poll_node(shared, redis, node, chunk))
    });
    let mut woken = 0;
    for (found, failed) in join_all(polls).await {
        woken += found;
        stale |= failed;
    }
    if stale {
        *map = None;
    }
    woken
}

/// Polls `keys` (with their ids) on `node`: (shards woken by what it found, whether some
/// could not be read there). A failed command rings every shard of the chunk.
async fn poll_node(
    shared: &Shared,
    redis: &LazyRedis,
    node: &Node,
    keys: &[(String, String)],
) -> (u64, bool) {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(POLL_NODE.as_str()).arg(0);
    for (key, id) in keys {
        cmd.arg(key).arg(id);
    }
    let reply = redis.query_node(cmd, node).await.and_then(|v| {
        redis::from_redis_value::<(Vec<usize>, Vec<usize>)>(v).map_err(RedisError::from)
    });
    match reply {
        Ok((found, failed)) => {
            let mut woken = 0;
            for n in found {
                if let Some((key, _)) = n.checked_sub(1).and_then(|i| keys.get(i))
                    && shared.ring(key, true)
                {
                    woken += 1;
                }
            }
            for n in &failed {
                if let Some((key, _)) = n.checked_sub(1).and_then(|i| keys.get(i)) {
                    shared.ring(key, false);
                }
            }
            (woken, !failed.is_empty())
        }
        Err(e) => {
            debug!(error = %e, %node, "doorbell poll of a node failed; its shards read themselves");
            for (key, _) in keys {
                shared.ring(key, false);
            }
            (0, true)
        }
    }
}
