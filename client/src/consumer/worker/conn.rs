//! The connection a shard worker sends its commands on (ARCHITECTURE "Data plane").

use crate::consumer::fence::{ArmedBy, GuardConns};
use crate::data::NodeConn;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use rsc_redis::LazyRedis;
use std::sync::Arc;
use std::time::Duration;

/// Bound of one guarded read's round trip on a guard connection (it never blocks).
pub(crate) const GUARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a worker's commands go.
pub(crate) enum WorkerConn {
    /// With the [`crate::consumer::doorbell`]: every command on the app's shared connection
    /// (none of them blocks; on a Redis Cluster routed to the shard's node); strict
    /// fencing's guarded reads (a `WATCH` is connection state) on one of the app's few guard
    /// connections.
    Shared {
        /// The app's shared connection.
        shared: LazyRedis,
        /// The app's guard connections.
        guards: Arc<GuardConns>,
        /// Behind Sentinel: [`rsc_redis::sentinel::SentinelRedis::masters_left`] when the
        /// worker last read (or started); see [`WorkerConn::master_left`].
        left: Option<u64>,
    },
    /// An app with `shared_reader(false)`: the worker's own connection to
    /// the node that serves the shard's slot, on which it waits in a blocked read
    /// (`response_timeout` above the `BLOCK`), and reads guarded under strict fencing.
    Dedicated {
        /// The connection (boxed: the shared variant is two pointers).
        node: Box<NodeConn>,
        /// Which guard armed its `WATCH` last.
        armed_by: ArmedBy,
    },
}

impl WorkerConn {
    /// Whether reads may block on this connection (the worker then waits in `XREADGROUP …
    /// BLOCK` instead of on the doorbell).
    pub(crate) fn may_block(&self) -> bool {
        matches!(self, WorkerConn::Dedicated { .. })
    }
}

/// [`SentinelRedis::masters_left`](rsc_redis::sentinel::SentinelRedis::masters_left) of
/// `shared` now (for a new [`WorkerConn::Shared`]).
pub(crate) fn masters_left(shared: &LazyRedis) -> Option<u64> {
    shared.sentinel().map(|s| s.masters_left())
}

impl WorkerConn {
    /// Behind Sentinel, on the shared connection: whether its master was left (lost,
    /// demoted or switched) since the last call. The worker's next read then fails as if
    /// its connection was lost, which it is to the worker: what it wrote on the old master
    /// (acknowledgements, claims) may be gone, so it reads its own pending entries again
    /// before new ones. (A dedicated connection fails its next command by itself.)
    pub(crate) fn master_left(&mut self) -> bool {
        let WorkerConn::Shared { shared, left, .. } = self else {
            return false;
        };
        let now = masters_left(shared);
        let changed = left.is_some() && now != *left;
        *left = now;
        changed
    }
}

impl ConnectionLike for WorkerConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            WorkerConn::Shared { shared, .. } => shared.req_packed_command(cmd),
            WorkerConn::Dedicated { node, .. } => node.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            WorkerConn::Shared { shared, .. } => {
                shared.req_packed_commands(pipeline, offset, count)
            }
            WorkerConn::Dedicated { node, .. } => node.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            WorkerConn::Shared { shared, .. } => shared.get_db(),
            WorkerConn::Dedicated { node, .. } => node.get_db(),
        }
    }
}
