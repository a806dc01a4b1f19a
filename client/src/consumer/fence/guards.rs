//! The app's guard connections for strict fencing's guarded reads (docs/FENCING.md): a
//! `WATCH` is connection state, so a guarded read holds a connection for its round trip.
//!
//! A process keeps [`GuardConns::SIZE`] of them per data node, whatever its number of
//! strictly fenced shards: one set on a standalone Redis or behind Sentinel, one per master
//! on a Redis Cluster (after the slot map, `rsc_redis::cluster`, read again after a failed
//! read), so that a connection stays on its node instead of following `MOVED` from shard to
//! shard. A shard whose node is not known (the map could not be read) uses a set of its own,
//! whose connections follow `MOVED`.

use super::{ArmedBy, Guard, Read, ReadAsk};
use crate::data::NodeConn;
use crate::message::Origin;
use redis::RedisError;
use rsc_redis::LazyRedis;
use rsc_redis::cluster::{Node, SlotMap};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Bound of reading the slot map before a guarded read.
const MAP_TIMEOUT: Duration = Duration::from_secs(2);

/// The app's guard connections (see the module docs). Made when first used.
pub(crate) struct GuardConns {
    redis: LazyRedis,
    /// Standalone or Sentinel: the one set (no look-up on the read path).
    single: Arc<GuardSet>,
    /// On a Redis Cluster: the sets by node (`None`: a node not known).
    sets: std::sync::Mutex<HashMap<Option<Node>, Arc<GuardSet>>>,
    /// On a Redis Cluster: the slot map (`None`: to be read).
    map: Mutex<Option<SlotMap>>,
}

/// The guard connections of one node.
struct GuardSet {
    slots: Vec<Arc<Mutex<GuardSlot>>>,
    next: AtomicUsize,
}

/// One guard connection and who armed it last.
#[derive(Default)]
struct GuardSlot {
    conn: Option<NodeConn>,
    armed_by: ArmedBy,
}

/// A guard connection taken for one read (given back when dropped).
struct TakenGuardConn {
    slot: OwnedMutexGuard<GuardSlot>,
    /// The slot's index in its set.
    index: usize,
}

impl GuardSet {
    fn new() -> Self {
        GuardSet {
            slots: (0..GuardConns::SIZE).map(|_| Arc::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A connection: `prefer` if it is free, else any free one, else the next in turn once
    /// it is free.
    async fn take(&self, prefer: Option<usize>) -> TakenGuardConn {
        let order = prefer
            .into_iter()
            .chain(0..self.slots.len())
            .filter(|i| *i < self.slots.len());
        for i in order {
            if let Ok(slot) = self.slots[i].clone().try_lock_owned() {
                return TakenGuardConn { slot, index: i };
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        TakenGuardConn {
            slot: self.slots[i].clone().lock_owned().await,
            index: i,
        }
    }
}

impl GuardConns {
    /// Connections per process and data node (with the shared one and the doorbell's
    /// subscriber: 4).
    pub(crate) const SIZE: usize = 2;

    pub(crate) fn new(redis: LazyRedis) -> Self {
        GuardConns {
            redis,
            single: Arc::new(GuardSet::new()),
            sets: std::sync::Mutex::default(),
            map: Mutex::new(None),
        }
    }

    /// The set of the node that serves `key` (see the module docs). A boxed future: the
    /// cluster look-up's type would otherwise nest into every worker's (past the compiler's
    /// recursion limit for `Send`).
    fn set_for<'a>(&'a self, key: &'a str) -> futures::future::BoxFuture<'a, Arc<GuardSet>> {
        if !self.redis.is_cluster() {
            return Box::pin(std::future::ready(self.single.clone()));
        }
        Box::pin(self.set_for_inner(key))
    }

    async fn set_for_inner(&self, key: &str) -> Arc<GuardSet> {
        let node = {
            let mut map = self.map.lock().await;
            if map.is_none() {
                *map = tokio::time::timeout(MAP_TIMEOUT, self.redis.slot_map())
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            map.as_ref()
                .and_then(|m| m.node_of(key.as_bytes()).cloned())
        };
        // A cache of sets: a panic while it was held leaves it whole (one insert).
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        sets.entry(node)
            .or_insert_with(|| Arc::new(GuardSet::new()))
            .clone()
    }

    /// A guarded read on a guard connection of the shard's node. The connection and its
    /// [`ArmedBy`] are taken out of the slot for the round trip and put back only when it
    /// completes: a read cancelled midway (the worker stopped) leaves no connection in an
    /// unknown state behind. A failed read on a cluster makes the next one read the slot
    /// map again (the shard may have moved).
    pub(crate) async fn read(
        &self,
        guard: &mut Guard,
        origin: &Origin,
        token: &str,
        ask: ReadAsk<'_>,
        timeout: Duration,
    ) -> Result<Read, RedisError> {
        let set = self.set_for(&origin.shard_key).await;
        let mut taken = set.take(guard.slot).await;
        guard.slot = Some(taken.index);
        let slot = &mut *taken.slot;
        let mut conn = slot
            .conn
            .take()
            .unwrap_or_else(|| self.redis.dedicated(timeout));
        let mut armed_by = slot.armed_by.take();
        let r = guard
            .read(&mut conn, &mut armed_by, origin, token, ask)
            .await;
        slot.conn = Some(conn);
        slot.armed_by = armed_by;
        if r.is_err() && self.redis.is_cluster() {
            *self.map.lock().await = None;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_standalone_redis_has_one_set_whose_free_connections_are_taken_first() {
        let redis = LazyRedis::open(
            &["redis://127.0.0.1:1".to_owned()],
            false,
            &rsc_redis::ConnSettings {
                connect_timeout: Duration::from_millis(50),
                response_timeout: Duration::from_millis(50),
                operation_timeout: Duration::from_millis(50),
                reconnect: rsc_redis::Reconnect::Quick,
            },
            &rsc_redis::Tls::default(),
        )
        .expect("handle");
        let guards = GuardConns::new(redis);
        let a = guards.set_for("s:0").await;
        let b = guards.set_for("s:1").await;
        assert!(Arc::ptr_eq(&a, &b));
        assert!(Arc::ptr_eq(&a, &guards.single));
        let first = a.take(Some(1)).await;
        assert_eq!(first.index, 1, "the preferred connection, free");
        let second = a.take(Some(1)).await;
        assert_eq!(second.index, 0, "taken: another free one");
        drop(first);
        assert_eq!(a.take(None).await.index, 1, "the only free one");
    }
}
