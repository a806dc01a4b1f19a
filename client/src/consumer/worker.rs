//! The shard worker: reads one shard for one member until it is told to stop.
//!
//! Order of work on a shard it was just given: make sure the Redis consumer group exists
//! (`XGROUP CREATE … MKSTREAM`, `BUSYGROUP` is fine), take over every entry still pending in
//! the group (`XAUTOCLAIM` with min-idle 0, cursor loop until `0-0`; safe because the
//! coordinator gives a shard to one member at a time), then read new entries. After a failed
//! read whose reply may have been lost (a timeout, a dropped connection), the worker first
//! reads its own pending entries again (`XREADGROUP … STREAMS key 0`): entries Redis delivered
//! into a lost reply are not left pending until the next takeover.
//!
//! How it reads (ARCHITECTURE "Data plane"): on a standalone Redis or behind Sentinel, every
//! command goes on the app's shared connection and none blocks: a worker reads
//! (`XREADGROUP … COUNT n STREAMS key >`, non-blocking) until the shard has nothing new, then
//! waits on the app's [`super::doorbell`] (a ring from the producer, or the doorbell's
//! fallback poll), so an idle shard costs Redis no command and no connection. Strict fencing
//! keeps a connection of the worker's own for its `WATCH` (see [`super::fence`]). On a Redis
//! Cluster the worker waits in `XREADGROUP … BLOCK` on its own connection to the shard's node
//! (see [`crate::data::NodeConn`]).
//!
//! Entries are handled one at a time, in stream order, so the order of one key's messages is
//! kept within a shard. Through reshards (ordering `key`, PROTOCOL §15), an entry whose key moved
//! to this shard at a routing-epoch switch is held aside, with its key's later entries, until
//! the group handled and acknowledged the key's old shard up to its seal (see
//! [`super::order`]); at most [`hold::MAX_HELD`] entries are held, past which the worker stops
//! reading the shard until releases make room. A stop request (revocation, self-fence,
//! shutdown) lets the handler in flight finish; acknowledgements of what succeeded are sent;
//! entries fetched but not started stay pending for the next owner.
//!
//! Submodules by step: [`takeover`] (group, claim, cleanup), [`read`] (the read loop, lease or
//! guarded, and the wait for new entries), [`hold`] (ordered resharding), [`handle`]
//! (handler, retries, dead letters), [`batch`] (batch listeners), [`ack`]
//! (acknowledgements), [`conn`] (where the commands go), [`cursor`] (the position the
//! doorbell's poll looks after; pure, property-tested).

use super::MemberShared;
use super::backoff::Backoff;
use crate::message::{Entry, Origin};
use hold::OrderState;
use redis::Value;
use rsc_protocol::StartPosition;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

mod ack;
mod batch;
mod conn;
mod cursor;
mod handle;
mod hold;
mod read;
mod takeover;

/// Flags the member and its worker share for one shard.
#[derive(Debug, Default)]
pub(crate) struct ShardFlags {
    /// The shard is beyond the stream's shard count: it is being drained (PROTOCOL §6).
    pub(crate) draining: AtomicBool,
    /// The worker found the draining shard empty (nothing pending, nothing unread).
    pub(crate) drained: AtomicBool,
    /// Strict fencing: the owner token the coordinator gave for the shard (`None`: lease only).
    pub(crate) token: std::sync::Mutex<Option<String>>,
    /// Redis refused the token: the shard moved on; the worker stops and the member drops it.
    pub(crate) refused: AtomicBool,
    /// The worker's stop signal (cancelled on a refusal too).
    pub(crate) stop: CancellationToken,
}

impl ShardFlags {
    /// The owner token to present, with strict fencing.
    pub(crate) fn token(&self) -> Option<String> {
        self.token.lock().map_or(None, |t| t.clone())
    }

    /// Sets the owner token from a heartbeat answer.
    pub(crate) fn set_token(&self, token: Option<String>) {
        if let Ok(mut t) = self.token.lock() {
            *t = token;
        }
    }

    /// Redis refused the owner token: stop the worker; the member drops the shard.
    pub(crate) fn refuse(&self, op: &str) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            warn!(
                op,
                "owner token refused by Redis: the shard belongs to another member now; dropping it"
            );
        }
        self.stop.cancel();
    }
}

/// One shard worker.
pub(crate) struct ShardWorker {
    shared: Arc<MemberShared>,
    origin: Arc<Origin>,
    start: StartPosition,
    stop: CancellationToken,
    flags: Arc<ShardFlags>,
    lag: metrics::Gauge,
    lag_at: Option<Instant>,
    /// Entries handled (or dead-lettered) and not yet acknowledged.
    acks: Vec<String>,
    /// Read this member's own pending entries after this id before new ones (set after a
    /// read whose reply may have been lost).
    pending_from: Option<String>,
    /// Ordered resharding: held entries and seals.
    order: OrderState,
    /// The shard's registration with the app's doorbell (`None`: a Redis Cluster or the
    /// per-shard reader, where the worker waits in a blocked read).
    bell: Option<super::doorbell::Bell>,
    /// Where the worker is in the shard, for the doorbell's poll.
    cursor: cursor::Cursor,
}

enum Outcome {
    /// The handler succeeded.
    Handled,
    /// Written to the dead-letter stream.
    DeadLettered,
    /// Stopped before the entry was finished: it stays pending.
    Abandoned,
}

impl ShardWorker {
    pub(crate) fn new(
        shared: Arc<MemberShared>,
        shard: u32,
        start: StartPosition,
        stop: CancellationToken,
        flags: Arc<ShardFlags>,
    ) -> Self {
        let origin = Arc::new(Origin {
            group: shared.group.clone(),
            stream: shared.stream.clone(),
            shard,
            shard_key: rsc_protocol::routing::shard_key(&shared.stream, shard),
            member_id: shared.member_id.clone(),
            acks: Some(Arc::new(ack::ManualAcks::new(
                shared.ack_conn.clone(),
                flags.clone(),
            ))),
        });
        let lag = super::WorkerMetrics::lag(&shared.group, &shared.stream, shard);
        let order = OrderState::new(&shared.group, &shared.stream, shard);
        let bell = shared.doorbell.as_ref().map(|d| d.bell(&origin.shard_key));
        ShardWorker {
            shared,
            origin,
            start,
            stop,
            flags,
            lag,
            lag_at: None,
            acks: Vec::new(),
            pending_from: None,
            order,
            bell,
            cursor: cursor::Cursor::default(),
        }
    }

    /// Runs until stopped; returns the shard index.
    pub(crate) async fn run(self) -> u32 {
        let shard = self.origin.shard;
        let span = info_span!("shard", group = %self.origin.group,
            member = %self.origin.member_id, shard, key = %self.origin.shard_key);
        self.work().instrument(span).await;
        shard
    }

    async fn work(mut self) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut conn = if self.bell.is_some() {
            conn::WorkerConn::Shared {
                shared: self.shared.ack_conn.clone(),
                node: None,
            }
        } else {
            // A blocked XREADGROUP would stall any command queued behind it: its own
            // connection, whose response timeout exceeds BLOCK.
            let block = self.shared.listener.settings.block;
            conn::WorkerConn::Dedicated(self.shared.redis.dedicated(block + Duration::from_secs(5)))
        };
        info!(
            shared_connection = !conn.may_block(),
            "shard worker started"
        );
        if !self.ensure_group(&mut conn, &mut backoff).await {
            return;
        }
        if !self.claim_pending(&mut conn, &mut backoff).await {
            return;
        }
        self.clean_consumers(&mut conn).await;
        self.read_until_stopped(&mut conn, &mut backoff).await;
        debug!("shard worker stopped");
    }

    /// Sleeps unless stopped first; `false` when stopped.
    async fn pause_for(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.stop.cancelled() => false,
        }
    }

    /// Waits while the listener is paused; `false` when stopped.
    async fn wait_unpaused(&self) -> bool {
        if !*self.shared.paused.borrow() {
            return !self.stop.is_cancelled();
        }
        let mut paused = self.shared.paused.clone();
        loop {
            if self.stop.is_cancelled() {
                return false;
            }
            if !*paused.borrow_and_update() {
                return true;
            }
            tokio::select! {
                changed = paused.changed() => if changed.is_err() { return !self.stop.is_cancelled() },
                _ = self.stop.cancelled() => return false,
            }
        }
    }
}

/// An entry as read, fields in Redis's order. A value that is not a string (Redis stream
/// values always are; anything else means a broken reply or proxy) makes the entry malformed:
/// it is dead-lettered with the reason rather than handled with an empty value.
fn entry_from(id: String, map: Vec<(String, Value)>, delivery_count: u64) -> Entry {
    let mut malformed = None;
    let fields = map
        .into_iter()
        .map(|(k, v)| {
            let bytes = match v {
                Value::BulkString(b) => b,
                Value::SimpleString(s) => s.into_bytes(),
                other => {
                    malformed.get_or_insert_with(|| {
                        format!("field {k:?} is not a string but {other:?}")
                    });
                    Vec::new()
                }
            };
            (k, bytes)
        })
        .collect();
    let mut entry = Entry::new(id, fields, delivery_count);
    entry.malformed = malformed;
    entry
}
