//! The connection a shard worker sends its commands on (ARCHITECTURE "Data plane").

use crate::data::NodeConn;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use rsc_redis::LazyRedis;
use std::time::Duration;

/// Bound of one guarded read's round trip on a worker's own connection (it never blocks).
const GUARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a worker's commands go.
pub(crate) enum WorkerConn {
    /// Standalone or Sentinel, with the [`crate::consumer::doorbell`]: every command on the
    /// app's shared connection (none of them blocks); a connection of the worker's own only
    /// for strict fencing's `WATCH` (connection state), made when first needed.
    Shared {
        /// The app's shared connection.
        shared: LazyRedis,
        /// Strict fencing's own connection, once needed.
        node: Option<NodeConn>,
    },
    /// Redis Cluster, or an app with `shared_reader(false)`: the worker's own connection to
    /// the node that serves the shard's slot, on which it waits in a blocked read
    /// (`response_timeout` above the `BLOCK`).
    Dedicated(NodeConn),
}

impl WorkerConn {
    /// The worker's own connection (strict fencing's guarded read), opened when first needed.
    pub(crate) fn node(&mut self) -> &mut NodeConn {
        match self {
            WorkerConn::Dedicated(n) => n,
            WorkerConn::Shared { shared, node } => {
                node.get_or_insert_with(|| shared.dedicated(GUARD_TIMEOUT))
            }
        }
    }

    /// Whether reads may block on this connection (the worker then waits in `XREADGROUP …
    /// BLOCK` instead of on the doorbell).
    pub(crate) fn may_block(&self) -> bool {
        matches!(self, WorkerConn::Dedicated(_))
    }
}

impl ConnectionLike for WorkerConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            WorkerConn::Shared { shared, .. } => shared.req_packed_command(cmd),
            WorkerConn::Dedicated(n) => n.req_packed_command(cmd),
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
            WorkerConn::Dedicated(n) => n.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            WorkerConn::Shared { shared, .. } => shared.get_db(),
            WorkerConn::Dedicated(n) => n.get_db(),
        }
    }
}
