//! The read loop: `XREADGROUP` (lease fencing) or the guarded transaction (strict
//! fencing), the previous batch's acknowledgements in the same round trip, recovery after a
//! lost reply, the wait for new entries (the doorbell, or a blocked read on a cluster), the
//! drained check and the lag gauge.

use super::conn::WorkerConn;
use super::cursor::Next;
use super::{ShardWorker, entry_from};
use crate::consumer::backoff::Backoff;
use crate::consumer::fence::{self, Guard};
use crate::consumer::reply::OrderedRead;
use crate::message::Entry;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::{RedisError, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often, at most, the lag gauge of a shard that has entries is read from Redis (an idle
/// shard's lag is 0 and costs no command).
const LAG_EVERY: Duration = Duration::from_secs(5);

/// What one read of the shard found.
enum Found {
    /// Strict fencing: Redis refused the owner token (the shard moved on).
    Fenced,
    /// Entries, now pending for this member.
    Entries(Vec<Entry>),
    /// Nothing. The stream's last entry id when the read learned it (always with strict
    /// fencing's guarded read; a non-blocking read when asked to); `None` otherwise (a
    /// blocked read has waited already).
    Idle(Option<String>),
}

/// What a wait for new entries ended with.
enum Waited {
    /// Woken: read the shard.
    Woken,
    /// Stopped.
    Stopped,
}

impl ShardWorker {
    /// The next read's id: `>` (new entries), or this member's own pending entries after
    /// an id while recovering from a lost reply.
    fn read_from(&self) -> String {
        self.pending_from.clone().unwrap_or_else(|| ">".to_owned())
    }

    /// After a successful read of `entries` (their last id): moves on through this member's
    /// own pending entries, or back to new ones when none are left.
    fn advance(&mut self, last: Option<&str>) {
        if self.pending_from.is_some() {
            match last {
                Some(id) => self.pending_from = Some(id.to_owned()),
                None => {
                    info!("re-read this member's pending entries after a lost reply");
                    self.pending_from = None;
                }
            }
        }
    }

    /// Before a read: acknowledges what was handled while the listener is paused, then waits
    /// until it is resumed; `false` when stopped.
    async fn ready_to_read(&mut self, conn: &mut WorkerConn) -> bool {
        if *self.shared.paused.borrow() {
            self.flush_acks(conn).await;
        }
        if !self.wait_unpaused().await {
            self.flush_acks(conn).await;
            return false;
        }
        true
    }

    /// After a failed read: recreates a vanished consumer group; otherwise the reply
    /// (entries now pending for this member) may be lost, so this member's own pending
    /// entries are read first once the backoff is over. `false` when stopped.
    async fn read_failed(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
        e: &RedisError,
    ) -> bool {
        if e.code() == Some("NOGROUP") {
            warn!("the Redis consumer group is gone (Redis restarted?); recreating it");
            self.pending_from = None;
            return self.ensure_group(conn, backoff).await;
        }
        warn!(error = %e, "read failed; retrying");
        if self.pending_from.is_none() {
            self.pending_from = Some("0".to_owned());
        }
        self.pause_for(backoff.next_delay()).await
    }

    /// Reads and handles entries until stopped. Each read goes the way the shard is fenced
    /// at that moment: with an owner token (strict fencing) through the guarded transaction
    /// ([`fence::Guard`], non-blocking, `COUNT n`); without one (lease fencing) as a plain
    /// `XREADGROUP`. Either way the previous batch's acknowledgements travel in the same
    /// round trip as the next read. A shard with nothing new waits on the doorbell; on a
    /// Redis Cluster, in `XREADGROUP … BLOCK` (lease) or a plain `XREAD BLOCK … <last id>`
    /// (strict), on the worker's own connection.
    pub(super) async fn read_until_stopped(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
    ) {
        // The WATCH of the owner key: a new one each time the group switches to strict
        // fencing.
        let mut guard: Option<Guard> = None;
        loop {
            if !self.ready_to_read(conn).await || !self.make_room(conn).await {
                return;
            }
            let token = self.flags.token();
            if token.is_none() {
                guard = None;
            } else if guard.is_none() {
                guard = Some(Guard::new(&self.origin));
            }
            let acks = std::mem::take(&mut self.acks);
            let from = self.read_from();
            let guarded = guard.as_mut().zip(token.as_deref());
            let reply = tokio::select! {
                r = self.fetch(conn, guarded, &acks, &from) => r,
                // Entries this read may have fetched stay pending for the next owner; the
                // acknowledgements are sent again to be sure (XACK is idempotent).
                _ = self.stop.cancelled() => {
                    self.acks = acks;
                    self.flush_acks(conn).await;
                    return;
                }
            };
            if reply.is_err() {
                // The acknowledgements may not have landed: send them on their own.
                self.acks = acks;
                self.flush_acks(conn).await;
            }
            let go_on = match reply {
                Ok(found) => {
                    backoff.reset();
                    self.found(conn, backoff, found, &from).await
                }
                Err(e) => self.read_failed(conn, backoff, &e).await,
            };
            if !go_on {
                return;
            }
        }
    }

    /// Acknowledges `acks`, then reads up to `batch_size` entries after `from`: through the
    /// guard with its owner token under strict fencing, else `XREADGROUP` (blocking for new
    /// entries, with the `XACK` pipelined first).
    async fn fetch(
        &self,
        conn: &mut WorkerConn,
        guarded: Option<(&mut Guard, &str)>,
        acks: &[String],
        from: &str,
    ) -> Result<Found, RedisError> {
        let count = self.shared.listener.settings.batch_size;
        if let Some((guard, token)) = guarded {
            return Ok(
                match guard
                    .read(conn.node(), &self.origin, token, acks, from, count)
                    .await?
                {
                    fence::Read::Fenced => Found::Fenced,
                    fence::Read::Entries(ids) => Found::Entries(
                        ids.into_iter()
                            .map(|s| entry_from(s.id, s.map, 1))
                            .collect(),
                    ),
                    fence::Read::Idle(last) => Found::Idle(Some(last)),
                },
            );
        }
        self.lease_read(conn, acks, from, count).await
    }

    /// Lease fencing's read: `XREADGROUP` (blocking on a connection of its own) with the
    /// `XACK` of `acks` pipelined first, and, before a non-blocking read when the position
    /// is unknown, `XREVRANGE … COUNT 1` (the stream's last id, for the doorbell).
    async fn lease_read(
        &self,
        conn: &mut WorkerConn,
        acks: &[String],
        from: &str,
        count: usize,
    ) -> Result<Found, RedisError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.origin.group)
            .arg(&self.origin.member_id)
            .arg("COUNT")
            .arg(count);
        if from == ">" && conn.may_block() {
            cmd.arg("BLOCK").arg(self.block_ms());
        }
        cmd.arg("STREAMS").arg(&self.origin.shard_key).arg(from);
        // The doorbell waits for entries after the stream's last one: read its id first, in
        // the same round trip (before the read, so that an entry added in between is read,
        // not waited for).
        let learn_last = from == ">" && !conn.may_block() && self.cursor.must_learn();
        let (reply, last) = if acks.is_empty() && !learn_last {
            (cmd.query_async::<Option<OrderedRead>>(conn).await?, None)
        } else {
            let mut pipe = redis::pipe();
            if !acks.is_empty() {
                pipe.cmd("XACK")
                    .arg(&self.origin.shard_key)
                    .arg(&self.origin.group)
                    .arg(acks)
                    .ignore();
            }
            if learn_last {
                pipe.cmd("XREVRANGE")
                    .arg(&self.origin.shard_key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1);
            }
            pipe.add_command(cmd);
            if learn_last {
                let (last, reply) = pipe
                    .query_async::<(StreamRangeReply, Option<OrderedRead>)>(conn)
                    .await?;
                let last = last
                    .ids
                    .first()
                    .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
                (reply, Some(last))
            } else {
                let (reply,) = pipe.query_async::<(Option<OrderedRead>,)>(conn).await?;
                (reply, None)
            }
        };
        let entries: Vec<Entry> = reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .map(|s| entry_from(s.id, s.map, 1))
            .collect();
        Ok(if entries.is_empty() {
            Found::Idle(last)
        } else {
            Found::Entries(entries)
        })
    }

    /// Acts on what a read after `from` found; `false` when stopped.
    async fn found(
        &mut self,
        conn: &mut WorkerConn,
        backoff: &mut Backoff,
        found: Found,
        from: &str,
    ) -> bool {
        match found {
            Found::Fenced => {
                self.flags.refuse("read");
                false
            }
            Found::Entries(entries) => {
                self.advance(entries.last().map(|e| e.id.as_str()));
                // New entries: the group has delivered up to the last one (the doorbell's poll
                // looks for entries after it). A re-read of pending entries says nothing.
                if from == ">"
                    && let Some(last) = entries.last()
                {
                    self.cursor.read_entries(&last.id);
                }
                self.flags.drained.store(false, Ordering::Relaxed);
                if !self.handle_batch(conn, entries, false).await {
                    return false;
                }
                self.refresh_lag(conn).await;
                true
            }
            // This member's own pending entries, re-read after a lost reply: none are left.
            Found::Idle(_) if from != ">" => {
                self.advance(None);
                true
            }
            Found::Idle(last) => {
                // Nothing new was delivered: nothing is undelivered (no command needed).
                self.lag.set(0.0);
                if !conn.may_block() {
                    return match self.cursor.read_nothing(last) {
                        Next::ReadAgain => true,
                        Next::WaitAfter(after) => match self.wait_for_ring(conn, &after).await {
                            Waited::Woken => true,
                            Waited::Stopped => false,
                        },
                    };
                }
                match last {
                    None => {
                        self.idle(conn).await;
                        true
                    }
                    Some(last) => self.wait_for_new(conn, backoff, &last).await,
                }
            }
        }
    }

    /// Waits on the doorbell until the shard may have new entries (a ring, or the poll found
    /// one after `after`), or, while entries are held for their parents, until the hold's
    /// next check is due. A draining shard is checked each `block` of quiet (see
    /// [`ShardWorker::idle`]); an idle shard costs no command.
    async fn wait_for_ring(&mut self, conn: &mut WorkerConn, after: &str) -> Waited {
        let Some(bell) = &self.bell else {
            return Waited::Woken;
        };
        // Entries held for their parents (ordered resharding) are released between reads:
        // with some held, wait at most the hold's poll and read again.
        let held = self.holds_entries();
        let quiet = if held {
            super::hold::HOLD_POLL
        } else {
            self.shared.listener.settings.block
        };
        loop {
            let woken = tokio::select! {
                woken = bell.wait(after) => Some(woken),
                _ = tokio::time::sleep(quiet) => None,
                _ = self.stop.cancelled() => return Waited::Stopped,
            };
            match woken {
                Some(woken) => {
                    self.cursor.woken(woken);
                    return Waited::Woken;
                }
                None if held => return Waited::Woken,
                None => self.idle(conn).await,
            }
        }
    }

    /// Strict fencing, nothing to read: a plain `XREAD BLOCK … <last id>`, which only wakes
    /// the worker (it delivers nothing to the group), so idle shards do not poll. `false`
    /// when stopped.
    async fn wait_for_new(&self, conn: &mut WorkerConn, backoff: &mut Backoff, last: &str) -> bool {
        let mut wake = redis::cmd("XREAD");
        wake.arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(self.block_ms())
            .arg("STREAMS")
            .arg(&self.origin.shard_key)
            .arg(last);
        tokio::select! {
            r = wake.query_async::<Value>(conn) => match r {
                // Nothing new for a whole block: as in lease mode, only then is a draining
                // shard with nothing pending called drained (a shard that is merely empty
                // between a stale producer's writes is not).
                Ok(Value::Nil) => {
                    self.idle(conn).await;
                    true
                }
                Ok(_) => true,
                Err(e) => {
                    debug!(error = %e, "XREAD wake-up failed");
                    self.pause_for(backoff.next_delay()).await
                }
            },
            _ = self.stop.cancelled() => false,
        }
    }

    /// After a read found nothing: a draining shard with nothing pending is drained.
    async fn idle(&self, conn: &mut WorkerConn) {
        if !self.flags.draining.load(Ordering::Relaxed) {
            return;
        }
        let pending: Result<redis::streams::StreamPendingReply, RedisError> =
            redis::cmd("XPENDING")
                .arg(&self.origin.shard_key)
                .arg(&self.origin.group)
                .query_async(conn)
                .await;
        if let Ok(p) = pending
            && p.count() == 0
            && !self.flags.drained.swap(true, Ordering::Relaxed)
        {
            info!("draining shard is empty");
        }
    }

    async fn refresh_lag(&mut self, conn: &mut WorkerConn) {
        if self.lag_at.is_some_and(|t| t.elapsed() < LAG_EVERY) {
            return;
        }
        self.lag_at = Some(Instant::now());
        let info: Result<StreamInfoGroupsReply, RedisError> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.origin.shard_key)
            .query_async(conn)
            .await;
        if let Ok(info) = info
            && let Some(g) = info.groups.iter().find(|g| g.name == self.origin.group)
            && let Some(lag) = g.lag
        {
            self.lag.set(lag as f64);
        }
    }
}
