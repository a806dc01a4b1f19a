//! Non-blocking retries, the driver's I/O (the decisions are [`super::stages`]'): the
//! script that moves an entry into or between retry stages (fenced like an acknowledgement,
//! in the shard's slot), and the loop that works the shard's retry streams beside the
//! worker's reads, for as long as the worker owns the shard.
//!
//! The loop tries one entry at a time. On a stop it tries nothing more; the attempt in
//! flight runs to its end (or is dropped when the revocation's wait is cut short) and what it
//! settled is written; an entry not settled stays in its retry stream for the next owner.

use super::call::Runner;
use super::stager::Stager;
use super::stages::{After, Event, PAGE, Retry, Schedule, Step, after_failure};
use crate::consumer::backoff::Backoff;
use crate::consumer::reply::OrderedRange;
use crate::handler::{FailureAction, HandlerError};
use crate::message::Entry;
use redis::{RedisError, Script};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{debug, warn};

static STAGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/stage.lua")));

/// Unix milliseconds now (the due times of retry entries).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An entry's fields as the stage script appends them.
type Fields = Vec<(String, Vec<u8>)>;

/// Where the stage script takes an entry from, and what it appends.
struct Move<'a> {
    /// The shard key (with the group: `XACK`) or a retry stream (without: `XDEL`).
    from: &'a str,
    group: &'a str,
    id: &'a str,
    /// The retry stream to append to, with the fields.
    to: Option<(String, Fields)>,
}

impl Stager {
    /// The stage loop of the shard (see the module docs).
    pub(super) fn stage_loop(&self, runner: Runner) -> StageLoop {
        StageLoop {
            schedule: Schedule::new(&self.delays),
            stager: self.clone(),
            runner,
        }
    }

    /// Runs the stage script until Redis answers: `Some(true)` when the entry moved,
    /// `Some(false)` when it was not there any more, `None` when stopped first or when the
    /// owner token was refused (the worker then stops).
    async fn run_script(&self, runner: &Runner, m: Move<'_>) -> Option<bool> {
        let origin = &runner.origin;
        let owner = rsc_protocol::routing::owner_key(&origin.shard_key, &origin.group);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let token = self.flags.token().unwrap_or_default();
            let mut inv = STAGE.prepare_invoke();
            inv.key(&owner).key(m.from);
            if let Some((to, _)) = &m.to {
                inv.key(to);
            }
            inv.arg(&token).arg(m.group).arg(m.id);
            for (name, value) in m.to.iter().flat_map(|(_, f)| f) {
                inv.arg(name).arg(value);
            }
            let mut conn = runner.shared.ack_conn.clone();
            let r: Result<i64, RedisError> = inv.invoke_async(&mut conn).await;
            match r {
                Ok(-1) => {
                    self.flags.refuse("retry stage");
                    return None;
                }
                Ok(n) => return Some(n > 0),
                Err(e) => {
                    warn!(error = %e, "cannot move the entry to its retry stage; retrying");
                    if !runner.pause_for(backoff.next_delay()).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Appends `entry`, whose attempt number `attempts` failed with `err` in `stage` (0: on
    /// the shard), to stage `to`, taking it out of where it is in the same script.
    async fn move_to(
        &self,
        runner: &Runner,
        entry: &Entry,
        err: &HandlerError,
        attempts: u32,
        (stage, from_id): (u32, &str),
        to: u32,
    ) -> Option<bool> {
        let origin = &runner.origin;
        let delay = self.delays[to as usize - 1];
        let due = now_ms().saturating_add(delay.as_millis() as u64);
        let fields = Retry::fields_of(entry, attempts, due, &err.to_string());
        let (from, group) = if stage == 0 {
            (origin.shard_key.clone(), origin.group.as_str())
        } else {
            (self.key(runner, stage), "")
        };
        let moved = self
            .run_script(
                runner,
                Move {
                    from: &from,
                    group,
                    id: from_id,
                    to: Some((self.key(runner, to), fields)),
                },
            )
            .await?;
        if moved {
            self.staged[to as usize - 1].increment(1);
            debug!(entry_id = %entry.id, attempts, stage = to, ?delay, error = %err,
                "to a retry stage");
        }
        Some(moved)
    }

    fn key(&self, runner: &Runner, stage: u32) -> String {
        rsc_protocol::routing::retry_key(&runner.origin.shard_key, &runner.origin.group, stage)
    }
}

impl Runner {
    /// An entry that failed on the shard with stages configured: to stage 1 (acknowledged on
    /// the shard in the same script), or dead-lettered when the handler said so. `false`
    /// when stopped first (the entry stays pending on the shard).
    pub(super) async fn stage_or_dead_letter(
        &self,
        stager: &Stager,
        entry: &Arc<Entry>,
        err: &HandlerError,
        attempt: u32,
    ) -> bool {
        match after_failure(stager.delays.len(), 0, err.action()) {
            Some(After::Stage(to)) => {
                let from = (0, entry.id.as_str());
                let moved = stager.move_to(self, entry, err, attempt, from, to).await;
                if moved.is_some() {
                    stager.appended.notify_one();
                }
                moved.is_some()
            }
            _ => self.dead_letter(entry, err, attempt).await,
        }
    }
}

/// The loop that works a shard's retry streams (see the module docs).
pub(super) struct StageLoop {
    schedule: Schedule,
    stager: Stager,
    runner: Runner,
}

impl StageLoop {
    /// Runs until the worker stops.
    pub(super) async fn run(mut self) {
        loop {
            if self.runner.stop.is_cancelled() || self.runner.shared.lease_expired() {
                self.schedule.on(Event::Stop, now_ms());
            }
            match self.schedule.next(now_ms()) {
                Step::Done => return,
                Step::Read(stages) => {
                    let events = self.read(&stages).await;
                    let now = now_ms();
                    events.into_iter().for_each(|e| self.schedule.on(e, now));
                }
                Step::Wait(until) => self.wait(until).await,
                Step::Try(stage, retry) => {
                    if !super::wait_unpaused(&self.runner.shared.paused, &self.runner.stop).await
                        || self.runner.shared.lease_expired()
                    {
                        continue; // stopped: the entry stays in its stream
                    }
                    // A revocation past its deadline drops the attempt (PROTOCOL §5.3).
                    let cut = self.stager.flags.cut_short.clone();
                    let settled = tokio::select! {
                        s = self.try_once(stage, retry) => s,
                        () = cut.cancelled() => None,
                    };
                    let event = match settled {
                        Some(moved_to) => Event::Settled { stage, moved_to },
                        None => Event::Stop,
                    };
                    self.schedule.on(event, now_ms());
                }
            }
        }
    }

    /// Waits until `until` (Unix ms), an append to stage 1, or the stop.
    async fn wait(&mut self, until: u64) {
        let d = Duration::from_millis(until.saturating_sub(now_ms()));
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.stager.appended.notified() => self.schedule.on(Event::Appended, now_ms()),
            () = self.runner.stop.cancelled() => {}
        }
    }

    /// The head of each of `stages`, in one round trip (every retry stream of the shard is
    /// in its slot).
    async fn read(&self, stages: &[u32]) -> Vec<Event> {
        let mut pipe = redis::pipe();
        for &stage in stages {
            pipe.cmd("XRANGE")
                .arg(self.stager.key(&self.runner, stage))
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(PAGE);
        }
        let mut conn = self.runner.shared.ack_conn.clone();
        let pages: Result<Vec<OrderedRange>, RedisError> = pipe.query_async(&mut conn).await;
        let pages = match pages {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "cannot read the retry stages");
                return vec![Event::ReadFailed];
            }
        };
        stages
            .iter()
            .zip(pages)
            .map(|(&stage, page)| Event::Read(stage, self.parse(stage, page)))
            .collect()
    }

    /// The entries of a page; one that is not a retry entry is left where it is, with a
    /// warning (it is not ours to delete).
    fn parse(&self, stage: u32, page: OrderedRange) -> Vec<Retry> {
        page.ids
            .into_iter()
            .filter_map(|e| {
                let fields = super::entry_from(e.id.clone(), e.map, 0).fields;
                Retry::parse(e.id, fields)
                    .inspect_err(|why| warn!(stage, why, "skipping a retry stream entry"))
                    .ok()
            })
            .collect()
    }

    /// Tries `retry` of `stage` again until settled: `Some(the stage it moved to)` when it
    /// left the stage, `None` when stopped first (it stays in its stream).
    async fn try_once(&self, stage: u32, retry: Retry) -> Option<Option<u32>> {
        let entry = Arc::new(retry.entry());
        let attempt = retry.attempts.saturating_add(1);
        let runner = &self.runner;
        let m = &runner.shared.metrics;
        let err = loop {
            let result = runner.attempt(&[(entry.clone(), attempt)]).await;
            let Some(err) = result.into_iter().next().flatten() else {
                m.handled.increment(1);
                self.drop_entry(stage, &retry.id).await?;
                return Some(None);
            };
            match err.action() {
                FailureAction::Defer(d) => {
                    debug!(entry_id = %entry.id, attempt, reason = %err, "deferred");
                    if !runner.pause_for(d).await {
                        return None;
                    }
                }
                _ => break err,
            }
        };
        m.failed.increment(1);
        match after_failure(self.stager.delays.len(), stage, err.action()) {
            Some(After::Stage(to)) => {
                let from = (stage, retry.id.as_str());
                let moved = self
                    .stager
                    .move_to(runner, &entry, &err, attempt, from, to)
                    .await?;
                Some(moved.then_some(to))
            }
            _ => {
                if !runner.dead_letter(&entry, &err, attempt).await {
                    return None;
                }
                self.drop_entry(stage, &retry.id).await?;
                Some(None)
            }
        }
    }

    /// Deletes a settled entry from its stage (fenced).
    async fn drop_entry(&self, stage: u32, id: &str) -> Option<bool> {
        let key = self.stager.key(&self.runner, stage);
        let m = Move {
            from: &key,
            group: "",
            id,
            to: None,
        };
        self.stager.run_script(&self.runner, m).await
    }
}
