//! The shard worker: reads one shard for one member until it is told to stop.
//!
//! Its shape is the coordinator engine's: a pure core, [`machine`] (events in — entries read,
//! a call's verdicts, an acknowledgement sent, a ring, the pause, the stop, the time now —
//! steps out — create the group, claim, read from an id, start a call, acknowledge these
//! ids, wait until), unit- and property-tested without Redis, and a thin driver, [`read`],
//! that does the Redis I/O and the waits. The rules below are the machine's.
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
//! fallback poll), so an idle shard costs Redis no command and no connection; on a Redis
//! Cluster the shared connection routes each read to the shard's node. Strict fencing's
//! guarded reads take one of the app's guard connections for their `WATCH` (see
//! [`super::fence`]). With `shared_reader(false)` the worker waits in `XREADGROUP … BLOCK` on
//! its own connection to the shard's node instead (see [`crate::data::NodeConn`]).
//!
//! Entries go to the handler through the worker's [`dispatch`] (pure; unit- and
//! property-tested): with `key_concurrency` 1 (the default) a shard is handled one call at a
//! time in stream order; with more, up to that many calls run at once, never two of one key,
//! each key's entries in stream order, while the worker keeps reading (at most the
//! dispatch's bound of entries queued). Through reshards (ordering `key`, PROTOCOL §15), an
//! entry whose key moved to this shard at a routing-epoch switch is held aside, with its
//! key's later entries, until the group handled and acknowledged the key's old shard up to
//! its seal (see [`super::order`]); at most [`machine::MAX_HELD`] entries are held, past which
//! the worker stops reading the shard until releases make room. A stop request (revocation,
//! self-fence, shutdown) lets the calls in flight finish (a retry's wait is cut short);
//! acknowledgements of what succeeded are sent; entries fetched but not started stay pending
//! for the next owner.
//!
//! Submodules: [`machine`] (every decision; pure, unit- and property-tested), [`dispatch`]
//! (the machine's part that says which entries go to the handler and which get
//! acknowledged; pure) and [`cursor`] (the position the doorbell's poll looks after; pure);
//! the driver's I/O: [`read`] (the loop around the machine, reads lease or guarded, and the
//! waits), [`takeover`] (group, claim, cleanup), [`hold`] (ordered resharding's seals and
//! parents), [`ack`] (acknowledgements), [`conn`] (where the commands go); [`call`] and
//! [`calls`] (one handler call with its retries and dead letters, through the listener's
//! layers; the calls in flight); [`stages`] (non-blocking retries' decisions; pure) and
//! [`retries`] (their I/O: the retry streams of the shard, worked beside its reads).

use super::MemberShared;
use crate::message::{Entry, Origin};
use hold::OrderState;
use machine::Machine;
use redis::Value;
use rsc_protocol::StartPosition;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

mod ack;
mod call;
mod calls;
mod conn;
mod cursor;
mod dispatch;
mod hold;
mod machine;
mod read;
mod retries;
mod stager;
mod stages;
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
    /// Ends the worker where it is, after `stop`: handler calls and acknowledgements in
    /// flight are dropped (their entries stay pending, for the next owner to claim). For a
    /// member whose data Redis does not answer, whose Redis calls could only time out.
    pub(crate) abandon: CancellationToken,
    /// After `stop`, stops waiting for the handler calls in flight: they are dropped (their
    /// entries stay pending, for the next owner to claim); what other calls settled is still
    /// acknowledged. A revocation past its deadline (PROTOCOL §5.3).
    pub(crate) cut_short: CancellationToken,
}

impl ShardFlags {
    /// The owner token to present, with strict fencing. A poisoned lock still yields the
    /// token it holds (an `Option` has no invariant a panic could break): a panic elsewhere
    /// never makes the worker read unguarded.
    pub(crate) fn token(&self) -> Option<String> {
        self.token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether the shard has an owner token (strict fencing), without copying it.
    pub(crate) fn has_token(&self) -> bool {
        self.token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// Sets the owner token from a heartbeat answer.
    pub(crate) fn set_token(&self, token: Option<String>) {
        *self
            .token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = token;
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
    /// Every decision: what to read, start, acknowledge, wait for (pure; see [`machine`]).
    machine: Machine<Arc<Entry>>,
    /// The handler calls in flight.
    calls: calls::Calls,
    /// What a call needs (cloned into each).
    runner: call::Runner,
    /// Gauges of the dispatch: entries in flight, entries queued.
    in_flight_gauge: metrics::Gauge,
    queued_gauge: metrics::Gauge,
    /// Entries redriven for another group, acknowledged unhandled (PROTOCOL §18).
    skipped: metrics::Counter,
    /// Ordered resharding: held entries and seals.
    order: OrderState,
    /// The shard's registration with the app's doorbell (`None`: the per-shard reader, where
    /// the worker waits in a blocked read).
    bell: Option<super::doorbell::Bell>,
    /// Entries taken over from the previous owner so far (for the takeover's log line).
    claimed: usize,
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
        let labels = [
            ("group", shared.group.clone()),
            ("stream", shared.stream.clone()),
            ("shard", shard.to_string()),
        ];
        let stager = stager::Stager::new(
            &shared.listener.settings.retry_stages,
            flags.clone(),
            &shared.group,
            &shared.stream,
        );
        let runner = call::Runner {
            shared: shared.clone(),
            origin: origin.clone(),
            stop: stop.clone(),
            parked: metrics::gauge!("rsc_client_shard_parked_entries", &labels),
            stager,
        };
        let machine = Machine::new(machine_config(&shared, bell.is_none()));
        ShardWorker {
            machine,
            skipped: metrics::counter!("rsc_client_redriven_skipped_total",
                "group" => shared.group.clone(), "stream" => shared.stream.clone()),
            calls: calls::Calls::default(),
            runner,
            in_flight_gauge: metrics::gauge!("rsc_client_shard_in_flight_entries", &labels),
            queued_gauge: metrics::gauge!("rsc_client_shard_queued_entries", &labels),
            shared,
            origin,
            start,
            stop,
            flags,
            lag,
            order,
            bell,
            claimed: 0,
        }
    }

    /// Runs until stopped; returns the shard index.
    pub(crate) async fn run(self) -> u32 {
        let shard = self.origin.shard;
        let span = info_span!("shard", group = %self.origin.group,
            member = %self.origin.member_id, shard, key = %self.origin.shard_key);
        let abandon = self.flags.abandon.clone();
        let origin = self.origin.clone();
        async {
            tokio::select! {
                () = self.work() => {}
                () = abandon.cancelled() => {
                    warn!("shard abandoned: what was in flight stays pending for the next owner");
                }
            }
        }
        .instrument(span)
        .await;
        // The process no longer works the shard (revoked, abandoned, fenced, stepping aside or
        // shutting down): e.g. its per-shard series go from the ops recorder's `/metrics`.
        super::hooks::shard_released(&origin.group, &origin.stream, shard);
        shard
    }

    async fn work(mut self) {
        let mut conn = if self.bell.is_some() {
            conn::WorkerConn::Shared {
                shared: self.shared.ack_conn.clone(),
                guards: self.shared.guards.clone(),
                left: conn::masters_left(&self.shared.ack_conn),
            }
        } else {
            // A blocked XREADGROUP would stall any command queued behind it: its own
            // connection, whose response timeout exceeds BLOCK.
            let block = self.shared.listener.settings.block;
            conn::WorkerConn::Dedicated {
                node: Box::new(self.shared.redis.dedicated(block + Duration::from_secs(5))),
                armed_by: None,
            }
        };
        info!(
            shared_connection = !conn.may_block(),
            "shard worker started"
        );
        // Non-blocking retries: the shard's retry streams are worked beside its reads, for as
        // long as the worker owns the shard (see [`retries`]).
        let stage_loop = (self.runner.stager.as_ref()).map(|s| s.stage_loop(self.runner.clone()));
        let stages = async {
            if let Some(l) = stage_loop {
                l.run().await;
            }
        };
        tokio::join!(self.drive(&mut conn), stages);
        debug!("shard worker stopped");
    }

    /// Sleeps unless stopped first; `false` when stopped.
    async fn pause_for(&self, d: Duration) -> bool {
        sleep_unless_stopped(&self.stop, d).await
    }
}

/// Sleeps `d` unless `stop` comes first; `false` when stopped.
async fn sleep_unless_stopped(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stop.cancelled() => false,
    }
}

/// Waits while `paused` says the listener is paused; `false` when stopped first.
async fn wait_unpaused(
    paused: &tokio::sync::watch::Receiver<bool>,
    stop: &CancellationToken,
) -> bool {
    let mut paused = paused.clone();
    loop {
        if stop.is_cancelled() {
            return false;
        }
        if !*paused.borrow_and_update() {
            return true;
        }
        tokio::select! {
            changed = paused.changed() => if changed.is_err() { return !stop.is_cancelled() },
            _ = stop.cancelled() => return false,
        }
    }
}

/// The machine of a worker of `shared`'s listener; `blocking`: on a connection of its own,
/// where reads of new entries block (the per-shard reader).
fn machine_config(shared: &MemberShared, blocking: bool) -> machine::Config {
    let listener = &shared.listener;
    let settings = &listener.settings;
    machine::Config {
        shape: dispatch_shape(listener),
        group: shared.group.clone(),
        read_count: settings.batch_size,
        quiet: settings.block,
        blocking,
        batch_linger: (listener.is_batch() && !settings.linger.is_zero())
            .then_some((settings.linger, settings.max_batch)),
        retry: (Duration::from_millis(100), Duration::from_secs(5)),
    }
}

/// The dispatch's shape for a listener: `key_concurrency` lanes, the entries of a call (a
/// batch listener: `max_batch`), room for a few reads.
fn dispatch_shape(listener: &crate::listener::Listener) -> dispatch::Shape {
    let settings = &listener.settings;
    let lanes = settings.key_concurrency.max(1);
    // One lane: a call takes the queue's front, up to a read's worth (a single-message
    // listener's call handles them one after the other; one call per read, as cheap as a
    // loop). More lanes: one entry per call of a single-message listener.
    let batch = if listener.is_batch() {
        settings.max_batch
    } else if lanes == 1 {
        settings.batch_size
    } else {
        1
    };
    dispatch::Shape {
        lanes,
        batch,
        bound: dispatch::Shape::bound_for(lanes, batch, settings.batch_size),
        auto_ack: settings.ack_mode == crate::listener::AckMode::Auto,
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
