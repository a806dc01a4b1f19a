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
    /// Standalone or Sentinel, with the [`crate::consumer::doorbell`]: every command on the
    /// app's shared connection (none of them blocks); strict fencing's guarded reads (a
    /// `WATCH` is connection state) on one of the app's few guard connections.
    Shared {
        /// The app's shared connection.
        shared: LazyRedis,
        /// The app's guard connections.
        guards: Arc<GuardConns>,
    },
    /// Redis Cluster, or an app with `shared_reader(false)`: the worker's own connection to
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
