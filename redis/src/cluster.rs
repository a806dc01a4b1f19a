//! Redis Cluster for callers that address nodes, not keys: the slot map ([`SlotMap`], from
//! `CLUSTER SLOTS`), one command sent to one node ([`LazyRedis::query_node`]), and a RESP3
//! connection whose server pushes (sharded pub/sub) reach a channel
//! ([`LazyRedis::cluster_pubsub`]).
//!
//! The data plane's doorbell (ARCHITECTURE "Data plane") uses them: one `SSUBSCRIBE`
//! connection per node for all the shards a process reads, and one poll command per node.

use crate::conn::{Backend, LazyRedis, cluster_builder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, PushInfo, RedisError, Value};
use tokio::sync::mpsc::UnboundedSender;

/// How many hash slots a Redis Cluster has.
const SLOTS: u16 = 16_384;

/// A cluster node's address, as the cluster names it (`CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// Host name or IP address.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Which master serves each hash slot, as the cluster said when asked; it goes stale when
/// slots move, which a command sent on it learns from a `MOVED` error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMap {
    /// `(first slot, last slot, master)`, sorted by first slot.
    ranges: Vec<(u16, u16, Node)>,
}

/// The hash slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key, modulo 16,384),
/// as the Redis Cluster specification defines it.
///
/// ```
/// assert_eq!(rsc_redis::cluster::key_slot(b"foo"), 12_182);
/// assert_eq!(rsc_redis::cluster::key_slot(b"{s:3}:ring"), rsc_redis::cluster::key_slot(b"s:3"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply: `[[first, last, [host, port, …], replicas…], …]`.
    pub fn parse(reply: &Value) -> Result<Self, RedisError> {
        let bad = || RedisError::from((ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"));
        let Value::Array(rows) = reply else {
            return Err(bad());
        };
        let mut ranges = Vec::with_capacity(rows.len());
        for row in rows {
            let Value::Array(row) = row else {
                return Err(bad());
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
                (row.first(), row.get(1), row.get(2))
            else {
                return Err(bad());
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return Err(bad()),
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return Err(bad());
            };
            let (Ok(first), Ok(last), Ok(port)) = (
                u16::try_from(*first),
                u16::try_from(*last),
                u16::try_from(*port),
            ) else {
                return Err(bad());
            };
            ranges.push((first, last, Node { host, port }));
        }
        ranges.sort_by_key(|r| r.0);
        Ok(SlotMap { ranges })
    }

    /// The master that serves `key`'s slot; `None` when no range covers it (a cluster with
    /// unassigned slots).
    pub fn node_of(&self, key: &[u8]) -> Option<&Node> {
        let slot = key_slot(key);
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        let (first, last, node) = self.ranges.get(i.checked_sub(1)?)?;
        (*first <= slot && slot <= *last).then_some(node)
    }

    /// The masters, each once.
    pub fn masters(&self) -> Vec<&Node> {
        let mut nodes: Vec<&Node> = self.ranges.iter().map(|r| &r.2).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }
}

fn not_cluster() -> RedisError {
    RedisError::from((ErrorKind::Client, "not a Redis Cluster"))
}

impl LazyRedis {
    /// On a Redis Cluster: which master serves each slot (`CLUSTER SLOTS` on any node).
    pub async fn slot_map(&self) -> Result<SlotMap, RedisError> {
        let reply = self
            .route(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                SingleNodeRoutingInfo::Random,
            )
            .await?;
        SlotMap::parse(&reply)
    }

    /// On a Redis Cluster: `cmd` sent to `node` (whatever keys it names; the node answers
    /// `MOVED` for a key it does not serve).
    pub async fn query_node(&self, cmd: Cmd, node: &Node) -> Result<Value, RedisError> {
        let at = SingleNodeRoutingInfo::ByAddress {
            host: node.host.clone(),
            port: node.port,
        };
        self.route(cmd, at).await
    }

    async fn route(&self, cmd: Cmd, at: SingleNodeRoutingInfo) -> Result<Value, RedisError> {
        match self.get().await? {
            crate::Conn::Cluster(mut c) => c.route_command(cmd, RoutingInfo::SingleNode(at)).await,
            _ => Err(not_cluster()),
        }
    }

    /// On a Redis Cluster: a connection of its own (one per node, RESP3) whose server pushes
    /// (`SSUBSCRIBE` messages, the library's disconnection notices) go to `pushes`. It
    /// subscribes again by itself after a reconnection or a slot migration. Connects now.
    pub async fn cluster_pubsub(
        &self,
        pushes: UnboundedSender<PushInfo>,
    ) -> Result<ClusterConnection, RedisError> {
        let Backend::Cluster { tls, .. } = &self.0.backend else {
            return Err(not_cluster());
        };
        let client = cluster_builder(&self.0.seeds, &self.0.settings, tls)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes)
            .build()?;
        client.get_async_connection().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(first: i64, last: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn slots_of_keys_follow_the_specification() {
        // The specification's example, and hash tags.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 12_739);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(
            key_slot(b"foo{}{bar}"),
            key_slot(b"bar"),
            "an empty tag is no tag"
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn the_map_finds_each_slots_master() {
        let map = SlotMap::parse(&Value::Array(vec![
            row(10_923, 16_383, 7002),
            row(0, 5_460, 7000),
            row(5_461, 10_922, 7001),
        ]))
        .expect("parses");
        assert_eq!(map.masters().len(), 3);
        let port = |key: &[u8]| map.node_of(key).map(|n| n.port);
        assert_eq!(port(b"123456789"), Some(7002), "slot 12,739");
        assert_eq!(port(b"foo"), Some(7002), "slot 12,182");
        assert_eq!(port(b"{bar}:x"), Some(7000), "slot 5,061");
        assert_eq!(key_slot(b"{bar}:x"), 5_061);
        assert_eq!(port(b"user1000"), Some(7000), "slot 3,443");
        let partial = SlotMap::parse(&Value::Array(vec![row(0, 100, 7000)])).expect("parses");
        assert_eq!(partial.node_of(b"foo").map(|n| n.port), None);
        assert!(SlotMap::parse(&Value::Int(1)).is_err());
        assert!(SlotMap::parse(&Value::Array(vec![Value::Array(vec![])])).is_err());
    }
}
