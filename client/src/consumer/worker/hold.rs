//! Ordered resharding in the shard worker (PROTOCOL §15): entries whose key moved to this shard
//! at a routing-epoch switch are held aside until the key's parent shard reached its seal.

use super::ShardWorker;
use super::machine::Event;
use crate::consumer::backoff::Backoff;
use crate::consumer::fence::Seals;
use crate::consumer::order::{Gate, HoldQueue, SealBook};
use crate::message::Entry;
use redis::RedisError;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Ordered resharding state of one shard worker (PROTOCOL §15).
pub(super) struct OrderState {
    /// This shard's seals.
    book: SealBook,
    /// Entries held until their key's parent reached its seal.
    hold: HoldQueue<Entry>,
    /// Seal ids of the parents waited for.
    parent_seals: HashMap<Gate, String>,
    /// When each gate first held an entry (for the hold-time histogram).
    held_since: HashMap<Gate, Instant>,
    progress: redis::Script,
    held_gauge: metrics::Gauge,
}

impl OrderState {
    pub(super) fn new(group: &str, stream: &str, shard: u32) -> Self {
        OrderState {
            book: SealBook::default(),
            hold: HoldQueue::default(),
            parent_seals: HashMap::new(),
            held_since: HashMap::new(),
            progress: redis::Script::new(rsc_protocol::routing::SEAL_PROGRESS_LUA),
            held_gauge: metrics::gauge!("rsc_client_order_held_entries",
                "group" => group.to_owned(), "stream" => stream.to_owned(),
                "shard" => shard.to_string()),
        }
    }
}

impl ShardWorker {
    /// How many entries are held for their parents.
    pub(super) fn held(&self) -> usize {
        self.order.hold.len()
    }

    /// Ordering `key`: sorts a batch read in stream order into entries to handle now and
    /// entries held for their key's parent. `seals`, when the read brought them, are the
    /// shard's seals read after the entries (they know every switch an entry may follow);
    /// without them the seals are read again first when an entry with a key lies past every
    /// known seal (a switch may have happened since). `None` when stopped.
    pub(super) async fn admit(
        &mut self,
        entries: Vec<Entry>,
        seals: Option<Seals>,
    ) -> Option<Vec<Entry>> {
        if !self.shared.ordered.load(Ordering::Relaxed) {
            return Some(entries);
        }
        let fresh = seals.is_some();
        if let Some(fields) = seals {
            self.order.book = SealBook::from_hash(fields);
        }
        let stale = !fresh
            && entries
                .iter()
                .any(|e| e.key.is_some() && !self.order.book.covers(&e.id));
        if stale {
            let key = rsc_protocol::routing::seals_key(&self.origin.shard_key);
            let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
            loop {
                let mut c = self.shared.ack_conn.clone();
                let r: Result<Vec<(String, String)>, RedisError> =
                    redis::cmd("HGETALL").arg(&key).query_async(&mut c).await;
                match r {
                    Ok(fields) => {
                        self.order.book = SealBook::from_hash(fields);
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, "could not read the shard's seals; retrying");
                        if !self.pause_for(backoff.next_delay()).await {
                            return None;
                        }
                    }
                }
            }
        }
        if self.order.book.is_empty() && self.order.hold.is_empty() {
            return Some(entries);
        }
        let shard = self.origin.shard;
        let mut ready = Vec::with_capacity(entries.len());
        for entry in entries {
            let gate = entry
                .key
                .as_deref()
                .and_then(|k| self.order.book.gate_for(shard, &entry.id, k.as_bytes()));
            let id = entry.id.clone();
            let key = entry.key.clone();
            if let Some(g) = gate.filter(|g| !self.order.hold.is_released(g)) {
                self.order.held_since.entry(g).or_insert_with(Instant::now);
            }
            if let Some(e) = self.order.hold.admit(&id, key.as_deref(), gate, entry) {
                ready.push(e);
            }
        }
        self.order.held_gauge.set(self.order.hold.len() as f64);
        Some(ready)
    }

    /// [`Step::CheckHolds`](super::machine::Step::CheckHolds): checks the parents the held
    /// keys wait for, and releases the entries of those that reached their seals, in stream
    /// order per key.
    pub(super) async fn check_holds(&mut self) -> Event<Arc<Entry>> {
        let ordered = self.shared.ordered.load(Ordering::Relaxed);
        let mut freed = Vec::new();
        for gate in self.order.hold.waiting_for() {
            if ordered && !self.parent_reached_seal(gate).await {
                continue;
            }
            if let Some(t) = self.order.held_since.remove(&gate) {
                metrics::histogram!("rsc_client_order_hold_seconds",
                "group" => self.origin.group.clone(), "stream" => self.origin.stream.clone())
                .record(t.elapsed().as_secs_f64());
                info!(
                    parent = gate.parent,
                    routing_epoch = gate.epoch,
                    held_ms = t.elapsed().as_millis() as u64,
                    "parent shard reached its seal: releasing its moved keys"
                );
            }
            freed.extend(self.order.hold.release(gate));
        }
        self.order.held_gauge.set(self.order.hold.len() as f64);
        Event::Released {
            ready: freed.into_iter().map(Arc::new).collect(),
            held: self.order.hold.len(),
        }
    }

    /// Whether the group handled and acknowledged every entry of `gate.parent` up to its
    /// seal of the switch to `gate.epoch` (exact: the group's last-delivered id and pending
    /// entries list on the parent, one script call). Errors count as "not yet".
    pub(super) async fn parent_reached_seal(&mut self, gate: Gate) -> bool {
        let parent_key = rsc_protocol::routing::shard_key(&self.origin.stream, gate.parent);
        let mut c = self.shared.ack_conn.clone();
        let seal = match self.order.parent_seals.get(&gate) {
            Some(s) => s.clone(),
            None => {
                let v: Result<Option<String>, RedisError> = redis::cmd("HGET")
                    .arg(rsc_protocol::routing::seals_key(&parent_key))
                    .arg(gate.epoch)
                    .query_async(&mut c)
                    .await;
                match v
                    .ok()
                    .flatten()
                    .as_deref()
                    .and_then(rsc_protocol::routing::Seal::parse)
                {
                    Some(seal) => {
                        self.order.parent_seals.insert(gate, seal.id.clone());
                        seal.id
                    }
                    None => return false,
                }
            }
        };
        let mut call = self.order.progress.key(&parent_key);
        call.arg(&self.origin.group).arg(&seal).arg(1);
        match call.invoke_async::<(i64, i64)>(&mut c).await {
            Ok((undelivered, pending)) => undelivered == 0 && pending == 0,
            Err(e) => {
                debug!(error = %e, parent = gate.parent, "parent progress check failed");
                false
            }
        }
    }
}
