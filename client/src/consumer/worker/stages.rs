//! Non-blocking retries (PROTOCOL §2.2 "Retry stages", GUIDE "Non-blocking retries"): the
//! pure part. A listener with retry stages does not retry a failed entry in place: one
//! script acknowledges it on its shard and appends it to the shard's stage-1 retry stream
//! `{<shard key>}:retry:<group>:1` (fenced like an acknowledgement), with the time it is due
//! again. The shard's owner also works its retry streams: it tries an entry again once it is
//! due; a failure moves it to the next stage (one script: delete here, append there), after
//! the last stage it is dead-lettered; a success deletes it.
//!
//! Each stage has one delay, so a stage's stream is in due order (append order): the owner
//! reads the head of each stage ([`Schedule`]) and waits for the earliest due entry, for an
//! entry appended by this process (a notification), or for the fallback poll.
//!
//! This module decides; the driver ([`super::retries`]) does the I/O: [`after_failure`] (where
//! a failed attempt goes), [`Retry`] (a retry stream entry, read and written),
//! [`Schedule`] (which stage to read, which entry to try, how long to wait).

use crate::handler::FailureAction;
use crate::message::Entry;
use rsc_protocol::entry as fields;
use std::collections::VecDeque;
use std::time::Duration;

/// How many entries of a stage one read fetches.
pub(crate) const PAGE: usize = 32;
/// The fallback poll of the retry streams is at least this long…
const POLL_MIN: Duration = Duration::from_secs(1);
/// …and at most this long (an entry appended by an earlier owner whose write landed after
/// this owner read the stage is found within it).
const POLL_MAX: Duration = Duration::from_secs(30);
/// After a failed read, the next one waits this long.
const READ_RETRY: Duration = Duration::from_secs(1);

/// Where a failed attempt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// Appended to this retry stage (from 1).
    Stage(u32),
    /// To `<stream>:dlq`.
    DeadLetter,
}

/// Where an entry whose attempt in `stage` (0: the shard itself) failed with `action` goes,
/// with `stages` retry stages; `None` for a [`FailureAction::Defer`], which is not a failure
/// (the same attempt again after its delay, where it is).
pub(crate) fn after_failure(stages: usize, stage: u32, action: FailureAction) -> Option<After> {
    match action {
        FailureAction::Defer(_) => None,
        FailureAction::DeadLetter => Some(After::DeadLetter),
        FailureAction::Retry | FailureAction::RetryAfter(_) if (stage as usize) < stages => {
            Some(After::Stage(stage + 1))
        }
        FailureAction::Retry | FailureAction::RetryAfter(_) => Some(After::DeadLetter),
    }
}

/// One entry of a retry stream: the original entry (its id on the shard, its fields) and how
/// it got there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Retry {
    /// Its id in the retry stream.
    pub(crate) id: String,
    /// When it is due (Unix ms).
    pub(crate) due_ms: u64,
    /// How many times the handler was tried.
    pub(crate) attempts: u32,
    /// Redis's delivery count of the last attempt.
    pub(crate) deliveries: u64,
    /// The last attempt's error.
    pub(crate) error: String,
    /// The entry's id on its shard.
    pub(crate) origin_id: String,
    /// The entry's own fields, in order.
    pub(crate) fields: Vec<(String, Vec<u8>)>,
}

impl Retry {
    /// The fields of a retry stream entry for `entry` after its attempt number `attempts`
    /// failed with `error`, due at `due_ms`: [`fields::RETRY_FIELDS`], then the entry's own.
    pub(crate) fn fields_of(
        entry: &Entry,
        attempts: u32,
        due_ms: u64,
        error: &str,
    ) -> Vec<(String, Vec<u8>)> {
        let head = [
            entry.id.as_bytes().to_vec(),
            attempts.to_string().into_bytes(),
            entry.delivery_count.to_string().into_bytes(),
            due_ms.to_string().into_bytes(),
            error.as_bytes().to_vec(),
        ];
        fields::RETRY_FIELDS
            .iter()
            .map(|n| (*n).to_owned())
            .zip(head)
            .chain(entry.fields.iter().cloned())
            .collect()
    }

    /// A retry stream entry as read; `Err` says what is wrong with one not written by
    /// [`Self::fields_of`].
    pub(crate) fn parse(id: String, mut read: Vec<(String, Vec<u8>)>) -> Result<Self, String> {
        let n = fields::RETRY_FIELDS.len();
        if read.len() < n
            || read
                .iter()
                .zip(fields::RETRY_FIELDS)
                .any(|((name, _), want)| name != want)
        {
            return Err(format!(
                "retry entry {id} does not start with {:?}",
                fields::RETRY_FIELDS
            ));
        }
        let own = read.split_off(n);
        let text = |i: usize| String::from_utf8_lossy(&read[i].1).into_owned();
        let number = |i: usize| {
            text(i)
                .parse::<u64>()
                .map_err(|_| format!("retry entry {id}: {} is not a number", read[i].0))
        };
        Ok(Retry {
            origin_id: text(0),
            attempts: u32::try_from(number(1)?).unwrap_or(u32::MAX),
            deliveries: number(2)?,
            due_ms: number(3)?,
            error: text(4),
            fields: own,
            id,
        })
    }

    /// The entry for its next attempt: its shard id and own fields, delivered once more.
    pub(crate) fn entry(&self) -> Entry {
        Entry::new(
            self.origin_id.clone(),
            self.fields.clone(),
            self.deliveries.saturating_add(1),
        )
    }
}

/// What the driver does next.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Read the head of these stages (from 1; `XRANGE <retry key> - + COUNT PAGE`):
    /// [`Event::Read`] per stage, or [`Event::ReadFailed`].
    Read(Vec<u32>),
    /// Try this entry of this stage again: [`Event::Settled`] (or stop).
    Try(u32, Retry),
    /// Wait until this time (Unix ms), a notification ([`Event::Appended`]) or the stop.
    Wait(u64),
    /// Stopped: the worker is done with the retry streams.
    Done,
}

/// What happened.
#[derive(Debug)]
pub(crate) enum Event {
    /// The head of a stage, in stream order.
    Read(u32, Vec<Retry>),
    /// A read failed: tried again after a pause.
    ReadFailed,
    /// The entry tried last left its stage (handled, moved to `moved_to`, dead-lettered, or
    /// found gone).
    Settled {
        /// The stage it left.
        stage: u32,
        /// The stage it was appended to, if any.
        moved_to: Option<u32>,
    },
    /// This process appended to stage 1 (a failure on the shard).
    Appended,
    /// Stop (revocation, self-fence, shutdown): no further entry is tried.
    Stop,
}

/// The head of one stage as last read.
#[derive(Debug, Default)]
struct Head {
    queue: VecDeque<Retry>,
    /// Read it (again) before trying anything.
    stale: bool,
    /// The last read filled a page: more may follow.
    more: bool,
}

/// Which stage to read, which entry to try, how long to wait (see the module docs).
#[derive(Debug)]
pub(crate) struct Schedule {
    heads: Vec<Head>,
    poll_ms: u64,
    /// When every stage is read again (the fallback poll).
    poll_at: Option<u64>,
    /// After a failed read: nothing until then.
    retry_at: Option<u64>,
    stopped: bool,
}

impl Schedule {
    /// A schedule for `delays` (each stage's), every stage to be read first.
    pub(crate) fn new(delays: &[Duration]) -> Self {
        let first = delays.first().copied().unwrap_or(POLL_MAX);
        Schedule {
            heads: delays
                .iter()
                .map(|_| Head {
                    stale: true,
                    ..Head::default()
                })
                .collect(),
            poll_ms: first.clamp(POLL_MIN, POLL_MAX).as_millis() as u64,
            poll_at: None,
            retry_at: None,
            stopped: false,
        }
    }

    /// The next step at `now_ms` (Unix ms).
    pub(crate) fn next(&mut self, now_ms: u64) -> Step {
        if self.stopped || self.heads.is_empty() {
            return Step::Done;
        }
        if let Some(t) = self.retry_at {
            if now_ms < t {
                return Step::Wait(t);
            }
            self.retry_at = None;
        }
        if self.poll_at.is_some_and(|t| now_ms >= t) {
            self.heads.iter_mut().for_each(|h| h.stale = true);
        }
        let stale: Vec<u32> = (1..)
            .zip(&self.heads)
            .filter(|(_, h)| h.stale)
            .map(|(s, _)| s)
            .collect();
        if !stale.is_empty() {
            if stale.len() == self.heads.len() {
                self.poll_at = Some(now_ms + self.poll_ms);
            }
            return Step::Read(stale);
        }
        // The earliest due head (a tie: the lower stage).
        let due = (1..)
            .zip(&self.heads)
            .filter_map(|(s, h)| h.queue.front().map(|r| (r.due_ms, s)))
            .min();
        match due {
            Some((at, stage)) if at <= now_ms => {
                let head = &mut self.heads[stage as usize - 1];
                let retry = head.queue.pop_front().expect("a head");
                Step::Try(stage, retry)
            }
            Some((at, _)) => Step::Wait(at.min(self.poll_at.unwrap_or(at))),
            None => Step::Wait(self.poll_at.unwrap_or(now_ms + self.poll_ms)),
        }
    }

    /// What happened at `now_ms`.
    pub(crate) fn on(&mut self, event: Event, now_ms: u64) {
        match event {
            Event::Read(stage, entries) => {
                if let Some(h) = self.head(stage) {
                    h.more = entries.len() >= PAGE;
                    h.queue = entries.into();
                    h.stale = false;
                }
            }
            Event::ReadFailed => self.retry_at = Some(now_ms + READ_RETRY.as_millis() as u64),
            Event::Settled { stage, moved_to } => {
                if let Some(h) = self.head(stage)
                    && h.queue.is_empty()
                    && h.more
                {
                    h.stale = true;
                }
                if let Some(h) = moved_to.and_then(|s| self.head(s)) {
                    // Appended behind what was read.
                    h.stale = true;
                }
            }
            Event::Appended => {
                if let Some(h) = self.head(1) {
                    h.stale = true;
                }
            }
            Event::Stop => self.stopped = true,
        }
    }

    fn head(&mut self, stage: u32) -> Option<&mut Head> {
        (stage as usize)
            .checked_sub(1)
            .and_then(|i| self.heads.get_mut(i))
    }
}

#[cfg(test)]
mod tests;
