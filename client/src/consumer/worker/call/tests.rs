//! Paused-time tests of one handler call: retries wait the listener's backoff, a stop cuts a
//! retry's wait short, panics are failed attempts, a batch retries only its failed messages.
//! No Redis: nothing here dead-letters.

use super::super::dispatch::{Dispatch, Shape};
use super::*;
use crate::Listener;
use crate::handler::BatchError;
use crate::message::{Batch, Message, Raw};
use std::sync::Mutex;
use tokio::time::Instant;

fn entry(id: &str) -> Arc<Entry> {
    Arc::new(Entry::new(
        id.to_owned(),
        vec![("payload".to_owned(), b"x".to_vec())],
        1,
    ))
}

fn runner(listener: Listener, stop: &CancellationToken) -> Runner {
    let shared = MemberShared::for_tests(listener);
    let origin = Arc::new(Origin {
        group: shared.group.clone(),
        stream: shared.stream.clone(),
        shard: 0,
        shard_key: rsc_protocol::routing::shard_key(&shared.stream, 0),
        member_id: shared.member_id.clone(),
        acks: None,
    });
    Runner {
        shared,
        origin,
        stop: stop.clone(),
        parked: metrics::gauge!("rsc_test_parked"),
        stager: None,
    }
}

/// A dispatch holding `ids`, and the call it starts with them.
fn call_of(ids: &[&str], batch: usize) -> (Dispatch<Arc<Entry>>, Call<Arc<Entry>>) {
    let mut d = Dispatch::new(Shape {
        lanes: 1,
        batch,
        bound: 100,
        auto_ack: true,
    });
    d.offer(ids.iter().map(|id| entry(id)));
    let call = d.next_call().expect("a call");
    (d, call)
}

#[tokio::test(start_paused = true)]
async fn retries_wait_the_listener_backoff() {
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = times.clone();
    let listener = Listener::new("g", "s", move |msg: Message<Raw>| {
        let seen = seen.clone();
        async move {
            seen.lock().expect("lock").push(Instant::now());
            if msg.attempt() < 3 {
                Err(HandlerError::retry("not yet"))
            } else {
                Ok(())
            }
        }
    })
    .retry_backoff(Duration::from_secs(1), Duration::from_secs(10));
    let stop = CancellationToken::new();
    let (mut d, call) = call_of(&["1-0"], 1);
    let (id, verdicts) = runner(listener, &stop).run(call).await;
    assert_eq!(verdicts, [("1-0".to_owned(), Verdict::Handled)]);
    let t = times.lock().expect("lock").clone();
    assert_eq!(t.len(), 3, "two failed attempts, then a success");
    // retry_delay: `min · 2^(attempt-1)`, a random value in its upper half.
    let (first, second) = (t[1] - t[0], t[2] - t[1]);
    assert!(
        first >= Duration::from_millis(500) && first <= Duration::from_secs(1),
        "{first:?}"
    );
    assert!(
        second >= Duration::from_secs(1) && second <= Duration::from_secs(2),
        "{second:?}"
    );
    d.finished(id, &verdicts);
    assert_eq!(d.take_acks(), ["1-0"], "acknowledged after its verdict");
}

#[tokio::test(start_paused = true)]
async fn a_stop_cuts_a_retry_wait_short_and_leaves_the_entry_pending() {
    let listener = Listener::new("g", "s", |_msg: Message<Raw>| async {
        Err::<(), _>(HandlerError::retry_after(
            Duration::from_secs(3600),
            "come back in an hour",
        ))
    });
    let stop = CancellationToken::new();
    let (mut d, call) = call_of(&["1-0"], 1);
    let started = Instant::now();
    let stopper = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        stopper.cancel();
    });
    let (id, verdicts) = runner(listener, &stop).run(call).await;
    assert!(verdicts.is_empty(), "abandoned: {verdicts:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    d.finished(id, &verdicts);
    assert!(
        d.take_acks().is_empty(),
        "an abandoned entry is never acknowledged"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deferred_attempt_is_not_counted_against_the_retries() {
    let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let seen = attempts.clone();
    // No retry at all: a counted failure would dead-letter (and, without Redis, hang).
    let listener = Listener::new("g", "s", move |msg: Message<Raw>| {
        let seen = seen.clone();
        async move {
            let mut seen = seen.lock().expect("lock");
            seen.push(msg.attempt());
            if seen.len() < 5 {
                Err(HandlerError::defer(Duration::from_secs(2), "busy"))
            } else {
                Ok(())
            }
        }
    })
    .max_retries(0);
    let stop = CancellationToken::new();
    let (_d, call) = call_of(&["3-0"], 1);
    let started = Instant::now();
    let (_, verdicts) = runner(listener, &stop).run(call).await;
    assert_eq!(verdicts, [("3-0".to_owned(), Verdict::Handled)]);
    assert_eq!(*attempts.lock().expect("lock"), [1, 1, 1, 1, 1]);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(8),
        "four waits of 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_is_a_failed_attempt() {
    let listener = Listener::new("g", "s", |msg: Message<Raw>| async move {
        assert!(msg.attempt() > 1, "the first attempt panics");
        Ok::<(), HandlerError>(())
    })
    .retry_backoff(Duration::from_millis(10), Duration::from_millis(10));
    let stop = CancellationToken::new();
    let (_d, call) = call_of(&["7-1"], 1);
    let (_, verdicts) = runner(listener, &stop).run(call).await;
    assert_eq!(verdicts, [("7-1".to_owned(), Verdict::Handled)]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_retries_only_its_failed_messages() {
    let calls: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = calls.clone();
    let listener = Listener::batch("g", "s", move |batch: Batch<Raw>| {
        let seen = seen.clone();
        async move {
            let ids: Vec<String> = batch.iter().map(|m| m.id().to_owned()).collect();
            let first = seen.lock().expect("lock").is_empty();
            seen.lock().expect("lock").push(ids);
            if first {
                return Err(BatchError::new().entry("2-0", HandlerError::retry("later")));
            }
            Ok(())
        }
    })
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(100));
    let stop = CancellationToken::new();
    let (mut d, call) = call_of(&["1-0", "2-0", "3-0"], 10);
    let (id, verdicts) = runner(listener, &stop).run(call).await;
    assert_eq!(
        *calls.lock().expect("lock"),
        [vec!["1-0", "2-0", "3-0"], vec!["2-0"]]
    );
    assert_eq!(verdicts.len(), 3);
    assert!(verdicts.iter().all(|(_, v)| *v == Verdict::Handled));
    d.finished(id, &verdicts);
    let mut acks = d.take_acks();
    acks.sort();
    assert_eq!(acks, ["1-0", "2-0", "3-0"]);
}
