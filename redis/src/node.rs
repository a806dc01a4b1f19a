//! [`NodeConn`]: a connection of its own to the one node that serves a key's slot.

use crate::conn::LazyRedis;
use crate::sentinel::is_failover_error;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};
use std::time::Duration;
use tracing::{debug, info};

impl LazyRedis {
    /// A connection of its own to one node (see [`NodeConn`]); `response_timeout` must
    /// exceed any `BLOCK` sent on it. (Defined beside [`NodeConn`], so that the routed
    /// connection's module does not depend on this one.)
    pub fn dedicated(&self, response_timeout: Duration) -> NodeConn {
        NodeConn::new(self.clone(), response_timeout)
    }
}

/// A connection of its own to the node that serves the keys it is used for (one shard's
/// stream and its owner key), made by [`LazyRedis::dedicated`].
///
/// A blocking read needs its own connection (a blocked command stalls whatever is queued
/// behind it), and a `WATCH` is connection state. It connects lazily, follows `MOVED`
/// redirections (slot migrations, failovers), falls back to the seed nodes when its node is
/// gone, and numbers its connections ([`NodeConn::generation`]) so that a caller knows when
/// a `WATCH` was lost with a connection. Behind Redis Sentinel it connects to the master the
/// sentinels name, and a connection error or a `READONLY` answer drops the connection and
/// makes the next command ask the sentinels again.
pub struct NodeConn {
    redis: LazyRedis,
    /// The node learned from a `MOVED` redirection; `None`: the current seed.
    node: Option<ConnectionInfo>,
    /// The seed tried when no node is known.
    seed: usize,
    conn: Option<MultiplexedConnection>,
    /// Incremented by every new connection.
    generation: u64,
    /// Behind sentinels: the master look-up the connection was made to.
    master: u64,
    response_timeout: Duration,
}

impl std::fmt::Debug for NodeConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConn")
            .field("generation", &self.generation)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl NodeConn {
    pub(crate) fn new(redis: LazyRedis, response_timeout: Duration) -> Self {
        NodeConn {
            redis,
            node: None,
            seed: 0,
            conn: None,
            generation: 0,
            master: 0,
            response_timeout,
        }
    }

    /// The number of the current connection (0 before the first). A `WATCH` made on
    /// connection `n` holds only while this is still `n`.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn target(&self) -> ConnectionInfo {
        match &self.node {
            Some(n) => n.clone(),
            None => self.redis.0.seeds[self.seed % self.redis.0.seeds.len()].clone(),
        }
    }

    /// Behind sentinels: drops the connection once its master was lost, demoted or switched
    /// (nothing more may be sent to it); `true` when it did.
    fn drop_if_left(&mut self) -> bool {
        if let Some(s) = self.redis.sentinel()
            && self.conn.is_some()
            && !s.is_live(self.master)
        {
            debug!("the sentinels named a new master: dropping the dedicated connection");
            self.conn = None;
            return true;
        }
        false
    }

    async fn connection(&mut self) -> RedisResult<&mut MultiplexedConnection> {
        if self.drop_if_left() {
            // Said as an error once, like a lost connection: what the caller read or wrote
            // on the old master may be gone (a worker then reads its pending entries again).
            return Err(crate::sentinel::switched_error());
        }
        if self.conn.is_none() {
            let target = match self.redis.sentinel() {
                Some(s) => {
                    let (master, info) = s.master().await?;
                    self.master = master;
                    info
                }
                None => self.target(),
            };
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.redis.0.settings.connect_timeout))
                .set_response_timeout(Some(self.response_timeout));
            let made = async {
                redis::Client::open(target)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            };
            match made.await {
                Ok(c) => {
                    self.generation += 1;
                    self.conn = Some(c);
                }
                Err(e) => {
                    if let Some(s) = self.redis.sentinel() {
                        s.report(self.master, &e);
                    }
                    // The node may be gone (failover): start again from the next seed, which
                    // redirects to the slot's new owner.
                    self.node = None;
                    self.seed = self.seed.wrapping_add(1);
                    return Err(e);
                }
            }
        }
        self.conn
            .as_mut()
            .ok_or_else(|| RedisError::from((ErrorKind::Client, "not connected")))
    }

    /// After an error: follow a `MOVED`; drop the connection on anything that is not a
    /// server's error reply (its state, e.g. a `WATCH`, and any reply in flight are unknown).
    fn after_error(&mut self, e: &RedisError) {
        if let Some(s) = self.redis.sentinel() {
            s.report(self.master, e);
            if is_failover_error(e) {
                self.conn = None;
                return;
            }
        }
        if let Some((addr, slot)) = moved(e) {
            self.redirect(addr, slot);
        } else if !matches!(e.kind(), ErrorKind::Server(_)) {
            self.conn = None;
        }
    }

    fn redirect(&mut self, addr: &str, slot: u16) {
        let Some((host, port)) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        else {
            self.conn = None;
            return;
        };
        info!(
            node = addr,
            slot, "the shard's slot is served by another node: following"
        );
        // The node gets the seeds' TLS settings (a cluster uses TLS on every node or none).
        self.node = Some(crate::tls::same_tls_at(&self.redis.0.seeds[0], host, port));
        self.conn = None;
    }

    /// Sends `pipeline` on connection `generation` only, never on a newer one (a
    /// transaction guarded by a `WATCH` made there); `None` when that connection is gone.
    /// Replies come back as they are, errors included as [`Value::ServerError`]; a `MOVED`
    /// among them is followed for next time.
    pub async fn pipeline_on(
        &mut self,
        generation: u64,
        pipeline: &Pipeline,
    ) -> RedisResult<Option<Vec<Value>>> {
        self.drop_if_left();
        let conn = match self.conn.as_mut() {
            Some(c) if self.generation == generation => c,
            _ => return Ok(None),
        };
        let n = pipeline.len();
        let r = conn.req_packed_commands(pipeline, 0, n).await;
        self.after_pipeline(&r);
        r.map(Some)
    }

    /// Follows a `MOVED` among a pipeline's replies, or handles its error.
    fn after_pipeline(&mut self, r: &RedisResult<Vec<Value>>) {
        match r {
            Ok(values) => {
                let redirect = values.iter().find_map(|v| match v {
                    Value::ServerError(se)
                        if matches!(
                            se.kind(),
                            Some(ServerErrorKind::Moved) | Some(ServerErrorKind::ReadOnly)
                        ) =>
                    {
                        Some(RedisError::from(se.clone()))
                    }
                    _ => None,
                });
                if let Some(e) = redirect {
                    self.after_error(&e);
                }
            }
            Err(e) => self.after_error(e),
        }
    }
}

fn moved(e: &RedisError) -> Option<(&str, u16)> {
    (e.kind() == ErrorKind::Server(ServerErrorKind::Moved))
        .then(|| e.redirect_node())
        .flatten()
}

impl ConnectionLike for NodeConn {
    /// Sends one command; a `MOVED` answer is followed and the command sent again (a
    /// redirected command was not executed).
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut attempt = 0;
            loop {
                attempt += 1;
                // A server's error reply comes back as a value (redis-rs turns it into an
                // error later): a MOVED is one too.
                let r = match self.connection().await?.req_packed_command(cmd).await {
                    Ok(Value::ServerError(se))
                        if matches!(
                            se.kind(),
                            Some(ServerErrorKind::Moved) | Some(ServerErrorKind::ReadOnly)
                        ) =>
                    {
                        Err(RedisError::from(se))
                    }
                    r => r,
                };
                match r {
                    Ok(v) => return Ok(v),
                    Err(e) => {
                        self.after_error(&e);
                        if moved(&e).is_none() || attempt >= 3 {
                            return Err(e);
                        }
                        debug!(attempt, "resending after a MOVED redirection");
                    }
                }
            }
        })
    }

    /// Sends a pipeline (once: some of its commands may have run).
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let r = self
                .connection()
                .await?
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after_pipeline(&r);
            r
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
