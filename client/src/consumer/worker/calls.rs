//! The handler calls a shard worker has in flight, polled beside whatever the worker waits
//! for (a read, the doorbell, a backoff), so that handlers never stall while the worker reads.

use super::call::Done;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use std::future::Future;
use std::sync::Mutex;

/// Calls in flight, and the results of those that ended and were not taken yet.
#[derive(Default)]
pub(super) struct Calls {
    /// In a mutex only to be `Sync` (the worker is borrowed across awaits); reached through
    /// `get_mut`, never locked.
    running: Mutex<FuturesUnordered<BoxFuture<'static, Done>>>,
    /// How many are running.
    count: usize,
    done: Vec<Done>,
}

impl Calls {
    /// Starts a call: polls it once, so a call that ends at once (a handler that did not
    /// wait) gives its end back here and is never kept; one that waits is kept and polled
    /// from then on beside the worker's waits.
    pub(super) fn start(&mut self, mut call: BoxFuture<'static, Done>) -> Option<Done> {
        // Polled with a no-op waker: a call pushed is queued to be polled again (with the
        // set's own waker) the next time the worker polls its calls, which it does next.
        let done = (&mut call).now_or_never();
        if done.is_none() {
            self.running().push(call);
            self.count += 1;
        }
        done
    }

    /// Whether no call is running.
    pub(super) fn is_idle(&self) -> bool {
        self.count == 0
    }

    fn running(&mut self) -> &mut FuturesUnordered<BoxFuture<'static, Done>> {
        self.running
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A call ended; so did any other that is ready now (taken without waiting, so that a
    /// worker whose handlers return at once takes their ends in one turn, not one each).
    fn ended(&mut self, done: Done) {
        self.count -= 1;
        self.done.push(done);
        while self.count > 0 {
            match self.running().next().now_or_never() {
                Some(Some(done)) => {
                    self.count -= 1;
                    self.done.push(done);
                }
                _ => break,
            }
        }
    }

    /// The results of the calls that ended since the last take.
    pub(super) fn take_done(&mut self) -> Vec<Done> {
        std::mem::take(&mut self.done)
    }

    /// Runs `fut` to its end while the calls go on (their results are kept).
    pub(super) async fn beside<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        loop {
            let busy = !self.is_idle();
            tokio::select! {
                biased;
                out = &mut fut => return out,
                Some(done) = self.running().next(), if busy => self.ended(done),
            }
        }
    }

    /// Waits for `fut` or for a call to end, whichever comes first (`None`: a call ended, or
    /// one had ended already; `fut` is dropped, so it must be cancel-safe).
    pub(super) async fn race<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        if !self.done.is_empty() {
            return None;
        }
        let busy = !self.is_idle();
        tokio::select! {
            out = fut => Some(out),
            Some(done) = self.running().next(), if busy => {
                self.ended(done);
                None
            }
        }
    }

    /// Drops the calls still running (their entries get no verdict: they stay pending);
    /// returns how many there were.
    pub(super) fn drop_running(&mut self) -> usize {
        let dropped = self.count;
        self.running().clear();
        self.count = 0;
        dropped
    }

    /// Waits until every call has ended.
    pub(super) async fn all_done(&mut self) {
        while let Some(done) = self.running().next().await {
            self.ended(done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::dispatch::CallId;
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_ends_at_once_is_given_back_and_one_that_waits_is_kept() {
        let mut calls = Calls::default();
        let done = calls.start(async { (CallId::test(1), vec![]) }.boxed());
        assert_eq!(done.map(|(id, _)| id), Some(CallId::test(1)));
        assert!(calls.is_idle(), "an ended call is not kept");

        let waits = async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            (CallId::test(2), vec![])
        };
        assert!(calls.start(waits.boxed()).is_none());
        assert!(!calls.is_idle(), "a waiting call is kept");
        // Polled from then on with the set's own waker: it ends while the worker waits.
        calls
            .beside(tokio::time::sleep(std::time::Duration::from_millis(10)))
            .await;
        let ended: Vec<CallId> = calls.take_done().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ended, vec![CallId::test(2)]);
        assert!(calls.is_idle());
    }
}
