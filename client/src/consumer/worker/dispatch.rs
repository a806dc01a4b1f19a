//! The shard worker's dispatch: which entries read from the shard go to the handler, when,
//! and which ids get acknowledged (pure: entries and verdicts in, calls and acks out; no
//! I/O, no clock). The driver ([`super::read`]) does the Redis reads and runs the calls.
//!
//! The rules (GUIDE "Key concurrency", PROTOCOL §16):
//!
//! - Entries are queued in the order they were read (stream order). At most `lanes` handler
//!   calls are in flight at once; a call holds one entry (a single-message listener) or up to
//!   `batch` entries (a batch listener).
//! - With one lane (the default) a call takes the queue's front: a shard is handled in stream
//!   order, one call at a time.
//! - With more lanes, a call never takes an entry whose key is in flight in another call, nor
//!   two entries of one key: one key's entries start in stream order, one at a time, while
//!   other keys flow past a slow (or retrying) key. An entry without a key is a lane of its
//!   own: it waits for nothing but a free lane.
//! - An entry is acknowledged only after its call gave it a verdict: handled (with automatic
//!   acknowledgement) or dead-lettered. An abandoned entry (the worker stopped) is never
//!   acknowledged: it stays pending for the shard's next owner.
//! - An id that is queued, in flight or waiting for its acknowledgement is not taken again (a
//!   re-read of this member's pending entries after a lost reply returns them).
//! - At most `bound` entries wait in the queue; the driver reads no more than [`Dispatch::room`]
//!   (a key parked in retries holds back at most that much memory; past it the shard stops
//!   reading until the queue drains).
//! - An entry redriven from another group's dead letters (PROTOCOL §18: its
//!   `rsc-redrive-group` header names a group, not this one) goes to no call: it is
//!   acknowledged at once, as that group's redrive is not this group's business.
//! - After [`Dispatch::stop`] no call starts; the queue is dropped (those entries stay
//!   pending in Redis); the calls in flight finish and their acknowledgements are still given.

use std::collections::{HashMap, HashSet, VecDeque};

/// What the dispatch needs of an entry: its id and its routing key.
pub(crate) trait Keyed {
    /// The entry id.
    fn id(&self) -> &str;
    /// The routing key, if the entry has one.
    fn key(&self) -> Option<&str>;
    /// The group a dead-letter redrive republished the entry for (PROTOCOL §18), if any.
    fn redriven_for(&self) -> Option<&str> {
        None
    }
}

impl Keyed for std::sync::Arc<crate::message::Entry> {
    fn id(&self) -> &str {
        &self.id
    }

    fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn redriven_for(&self) -> Option<&str> {
        self.headers
            .get(rsc_protocol::entry::REDRIVE_GROUP_HEADER)
            .map(String::as_str)
    }
}

/// What a call did with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The handler succeeded.
    Handled,
    /// Written to the dead-letter stream.
    DeadLettered,
    /// Moved to a retry stage, acknowledged on the shard by the same script (PROTOCOL §2.2
    /// "Retry stages").
    Staged,
    /// Stopped before the entry was settled: it stays pending.
    Abandoned,
}

/// One handler call the driver is to run.
#[derive(Debug)]
pub(crate) struct Call<E> {
    /// Names the call in [`Dispatch::finished`].
    pub(crate) id: CallId,
    /// Its entries, in stream order.
    pub(crate) entries: Vec<E>,
}

/// A call's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CallId(u64);

#[cfg(test)]
impl CallId {
    /// A call's name made up by a test.
    pub(crate) fn test(n: u64) -> Self {
        CallId(n)
    }
}

/// How a dispatch is shaped (from the listener's settings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Calls in flight at once (`key_concurrency`, at least 1).
    pub(crate) lanes: usize,
    /// Entries per call (1, or a batch listener's `max_batch`).
    pub(crate) batch: usize,
    /// Entries queued at most.
    pub(crate) bound: usize,
    /// Acknowledge handled entries (automatic acknowledgement); dead-lettered entries are
    /// always acknowledged.
    pub(crate) auto_ack: bool,
}

impl Shape {
    /// The queue bound for `lanes` lanes reading `read_count` entries at a time: room for a
    /// few reads, more with more lanes, at most 10,000 entries.
    pub(crate) fn bound_for(lanes: usize, batch: usize, read_count: usize) -> usize {
        (2 * read_count)
            .max(16 * lanes * batch.max(1))
            .clamp(1, 10_000)
    }
}

/// The dispatch state of one shard worker (see the module docs).
#[derive(Debug)]
pub(crate) struct Dispatch<E> {
    shape: Shape,
    queue: VecDeque<E>,
    /// The entries of the calls in flight (clones: an `Arc` each in the worker).
    calls: HashMap<CallId, Vec<E>>,
    /// Keys in flight, with how many of their entries (one lane: a batch may hold several).
    busy: HashMap<String, usize>,
    /// Ids queued, in flight, or waiting for their acknowledgement.
    known: HashSet<String>,
    acks: Vec<String>,
    next_call: u64,
    stopping: bool,
    /// The group this dispatch handles for (entries redriven for another are skipped).
    group: Option<String>,
    /// Entries skipped as redriven for another group, since [`Self::take_skipped`].
    skipped: u64,
}

impl<E: Keyed + Clone> Dispatch<E> {
    /// An empty dispatch.
    pub(crate) fn new(shape: Shape) -> Self {
        let shape = Shape {
            lanes: shape.lanes.max(1),
            batch: shape.batch.max(1),
            bound: shape.bound.max(1),
            ..shape
        };
        Dispatch {
            shape,
            queue: VecDeque::new(),
            calls: HashMap::new(),
            busy: HashMap::new(),
            known: HashSet::new(),
            acks: Vec::new(),
            next_call: 0,
            stopping: false,
            group: None,
            skipped: 0,
        }
    }

    /// The dispatch of `group`'s worker: entries redriven for another group are acknowledged
    /// without a call.
    pub(crate) fn for_group(mut self, group: &str) -> Self {
        self.group = Some(group.to_owned());
        self
    }

    /// How many entries were skipped as redriven for another group since the last call.
    pub(crate) fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }

    /// Whether `e` was redriven for a group other than this dispatch's.
    fn redriven_elsewhere(&self, e: &E) -> bool {
        match (e.redriven_for(), self.group.as_deref()) {
            (Some(for_group), Some(group)) => for_group != group,
            _ => false,
        }
    }

    /// Queues entries read in stream order; ids already known are skipped, and entries
    /// redriven for another group go straight to the acknowledgements. Returns how many were
    /// queued (none once stopping).
    pub(crate) fn offer(&mut self, entries: impl IntoIterator<Item = E>) -> usize {
        if self.stopping {
            return 0;
        }
        let mut n = 0;
        for e in entries {
            if !self.known.insert(e.id().to_owned()) {
                continue;
            }
            if self.redriven_elsewhere(&e) {
                self.acks.push(e.id().to_owned());
                self.skipped += 1;
            } else {
                self.queue.push_back(e);
                n += 1;
            }
        }
        n
    }

    /// The next call to start, if a lane is free and an entry may go.
    pub(crate) fn next_call(&mut self) -> Option<Call<E>> {
        if self.stopping || self.calls.len() >= self.shape.lanes || self.queue.is_empty() {
            return None;
        }
        let entries = if self.shape.lanes == 1 {
            let n = self.shape.batch.min(self.queue.len());
            self.queue.drain(..n).collect()
        } else {
            self.take_distinct_keys()
        };
        if entries.is_empty() {
            return None;
        }
        let id = CallId(self.next_call);
        self.next_call += 1;
        for k in entries.iter().filter_map(E::key) {
            match self.busy.get_mut(k) {
                Some(n) => *n += 1,
                None => {
                    self.busy.insert(k.to_owned(), 1);
                }
            }
        }
        self.calls.insert(id, entries.clone());
        Some(Call { id, entries })
    }

    /// Several lanes: up to `batch` queued entries, in queue order, whose keys are neither in
    /// flight nor taken twice. An entry is passed over only when its key is in flight or
    /// taken, so the first queued entry of a free key is always the one taken: a key's
    /// entries start in stream order.
    fn take_distinct_keys(&mut self) -> Vec<E> {
        if self.shape.batch == 1 {
            // One entry a call: the first queued entry whose key is free.
            let free = self
                .queue
                .iter()
                .position(|e| e.key().is_none_or(|k| !self.busy.contains_key(k)));
            return free
                .and_then(|i| self.queue.remove(i))
                .into_iter()
                .collect();
        }
        let mut taken_keys: HashSet<String> = HashSet::new();
        let mut picked = Vec::new();
        let mut i = 0;
        while i < self.queue.len() && picked.len() < self.shape.batch {
            let free = match self.queue[i].key() {
                None => true,
                Some(k) => !self.busy.contains_key(k) && !taken_keys.contains(k),
            };
            if free {
                if let Some(k) = self.queue[i].key() {
                    taken_keys.insert(k.to_owned());
                }
                if let Some(e) = self.queue.remove(i) {
                    picked.push(e);
                }
            } else {
                i += 1;
            }
        }
        picked
    }

    /// A call ended with these verdicts (by entry id; an entry of the call without one is
    /// abandoned). Handled entries are acknowledged (automatic acknowledgement) and
    /// dead-lettered ones always.
    pub(crate) fn finished(&mut self, call: CallId, verdicts: &[(String, Verdict)]) {
        let Some(held) = self.calls.remove(&call) else {
            return;
        };
        for (i, e) in held.into_iter().enumerate() {
            let id = e.id();
            if let Some(k) = e.key()
                && let Some(n) = self.busy.get_mut(k)
            {
                *n -= 1;
                if *n == 0 {
                    self.busy.remove(k);
                }
            }
            // Calls answer in the order of their entries, mostly: look there first.
            let verdict = match verdicts.get(i) {
                Some((v, verdict)) if *v == id => *verdict,
                _ => verdicts
                    .iter()
                    .find(|(v, _)| *v == id)
                    .map_or(Verdict::Abandoned, |(_, v)| *v),
            };
            let ack = match verdict {
                Verdict::Handled => self.shape.auto_ack,
                Verdict::DeadLettered => true,
                Verdict::Staged | Verdict::Abandoned => false,
            };
            if ack {
                self.acks.push(id.to_owned());
            } else {
                self.known.remove(id);
            }
        }
    }

    /// The acknowledgements to send (their ids stay known until [`Self::acked`]).
    pub(crate) fn take_acks(&mut self) -> Vec<String> {
        std::mem::take(&mut self.acks)
    }

    /// Acknowledgements taken with [`Self::take_acks`] were sent (or given up on).
    pub(crate) fn acked(&mut self, ids: &[String]) {
        for id in ids {
            self.known.remove(id);
        }
    }

    /// Acknowledgements taken with [`Self::take_acks`] could not be sent: give them again.
    pub(crate) fn unsent(&mut self, mut ids: Vec<String>) {
        ids.append(&mut self.acks);
        self.acks = ids;
    }

    /// How many acknowledgements are waiting to be sent.
    pub(crate) fn acks_waiting(&self) -> usize {
        self.acks.len()
    }

    /// Whether acknowledgements are waiting to be sent.
    pub(crate) fn has_acks(&self) -> bool {
        !self.acks.is_empty()
    }

    /// How many more entries a read may bring (0 once stopping).
    pub(crate) fn room(&self) -> usize {
        if self.stopping {
            return 0;
        }
        self.shape.bound.saturating_sub(self.queue.len())
    }

    /// Whether the worker should read the shard now: a lane is free, no queued entry can take
    /// it, and the queue has room.
    pub(crate) fn wants_read(&self) -> bool {
        !self.stopping
            && self.calls.len() < self.shape.lanes
            && self.room() > 0
            && !self.can_start()
    }

    /// Whether a queued entry could start now (a lane is free).
    pub(crate) fn can_start(&self) -> bool {
        if self.stopping || self.calls.len() >= self.shape.lanes {
            return false;
        }
        if self.shape.lanes == 1 {
            return !self.queue.is_empty();
        }
        self.queue
            .iter()
            .any(|e| e.key().is_none_or(|k| !self.busy.contains_key(k)))
    }

    /// Stops: no call starts any more, the queue is dropped (its entries stay pending).
    pub(crate) fn stop(&mut self) {
        self.stopping = true;
        for e in self.queue.drain(..) {
            self.known.remove(e.id());
        }
    }

    /// Whether [`Self::stop`] was called.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// Calls in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// The calls in flight were dropped (the worker stopped waiting for them): their entries
    /// get no verdict and stay pending for the next owner.
    pub(crate) fn abandon_in_flight(&mut self) {
        let calls: Vec<CallId> = self.calls.keys().copied().collect();
        for call in calls {
            self.finished(call, &[]);
        }
    }

    /// Entries in flight (in every call).
    pub(crate) fn entries_in_flight(&self) -> usize {
        self.calls.values().map(Vec::len).sum()
    }

    /// Entries queued.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Keys with entries waiting behind an entry of theirs in flight.
    #[cfg(test)]
    pub(crate) fn waiting_keys(&self) -> usize {
        let mut keys: HashSet<&str> = HashSet::new();
        for e in &self.queue {
            if let Some(k) = e.key()
                && self.busy.contains_key(k)
            {
                keys.insert(k);
            }
        }
        keys.len()
    }

    /// Nothing queued, nothing in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests;
