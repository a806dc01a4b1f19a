//! The decisions of non-blocking retries, without Redis: where a failure goes, the retry
//! entry's layout, and the schedule of the retry streams.

use super::*;

const S: u64 = 1_000;

fn delays() -> Vec<Duration> {
    vec![Duration::from_secs(10), Duration::from_secs(60)]
}

fn retry(id: &str, due_ms: u64) -> Retry {
    Retry {
        id: id.to_owned(),
        due_ms,
        attempts: 1,
        deliveries: 1,
        error: "boom".to_owned(),
        origin_id: format!("shard-{id}"),
        fields: vec![("payload".to_owned(), b"x".to_vec())],
    }
}

#[test]
fn a_failure_goes_to_the_next_stage_then_to_the_dead_letters() {
    use FailureAction::*;
    // From the shard (stage 0) to stage 1, from 1 to 2, from the last to the dead letters.
    assert_eq!(after_failure(2, 0, Retry), Some(After::Stage(1)));
    assert_eq!(after_failure(2, 1, Retry), Some(After::Stage(2)));
    assert_eq!(after_failure(2, 2, Retry), Some(After::DeadLetter));
    // A retry_after is a failure like any: its stage's delay applies.
    let later = RetryAfter(Duration::from_secs(1));
    assert_eq!(after_failure(2, 0, later), Some(After::Stage(1)));
    // A dead-letter verdict skips the stages; a defer stays where it is.
    assert_eq!(after_failure(2, 0, DeadLetter), Some(After::DeadLetter));
    assert_eq!(after_failure(2, 1, Defer(Duration::from_secs(1))), None);
}

#[test]
fn a_retry_entry_keeps_the_entrys_own_fields_whatever_their_names() {
    let own = vec![
        ("payload".to_owned(), b"{}".to_vec()),
        ("key".to_owned(), b"k1".to_vec()),
        // Named like a retry field: the position tells them apart.
        (fields::RETRY_ERROR.to_owned(), b"mine".to_vec()),
    ];
    let entry = Entry::new("5-0".to_owned(), own.clone(), 3);
    let written = Retry::fields_of(&entry, 2, 42_000, "timeout");
    assert_eq!(written.len(), fields::RETRY_FIELDS.len() + own.len());
    let read = Retry::parse("9-1".to_owned(), written).expect("parses");
    assert_eq!(
        (read.origin_id.as_str(), read.attempts, read.deliveries),
        ("5-0", 2, 3)
    );
    assert_eq!((read.due_ms, read.error.as_str()), (42_000, "timeout"));
    assert_eq!(read.fields, own);
    let again = read.entry();
    assert_eq!(again.id, "5-0", "the handler sees the shard's id");
    assert_eq!(again.key.as_deref(), Some("k1"));
    assert_eq!(again.delivery_count, 4, "delivered once more");

    assert!(
        Retry::parse("1-0".to_owned(), own).is_err(),
        "not a retry entry"
    );
}

#[test]
fn reads_every_stage_first_then_tries_what_is_due_earliest_first() {
    // A 30 s first stage: the fallback poll (30 s) comes after every due time below.
    let mut s = Schedule::new(&[Duration::from_secs(30), Duration::from_secs(60)]);
    assert_eq!(s.next(0), Step::Read(vec![1, 2]));
    s.on(
        Event::Read(1, vec![retry("1-0", 12 * S), retry("2-0", 15 * S)]),
        0,
    );
    s.on(Event::Read(2, vec![retry("3-0", 11 * S)]), 0);
    // Nothing due: wait for the earliest (stage 2's head).
    assert_eq!(s.next(S), Step::Wait(11 * S));
    assert_eq!(s.next(11 * S), Step::Try(2, retry("3-0", 11 * S)));
    s.on(
        Event::Settled {
            stage: 2,
            moved_to: None,
        },
        11 * S,
    );
    assert_eq!(s.next(11 * S), Step::Wait(12 * S));
    // Late: both of stage 1 are due; in stream order.
    assert_eq!(s.next(20 * S), Step::Try(1, retry("1-0", 12 * S)));
    s.on(
        Event::Settled {
            stage: 1,
            moved_to: Some(2),
        },
        20 * S,
    );
    // Moved to stage 2: that stage is read again before anything else.
    assert_eq!(s.next(20 * S), Step::Read(vec![2]));
    s.on(Event::Read(2, vec![retry("4-0", 80 * S)]), 20 * S);
    assert_eq!(s.next(20 * S), Step::Try(1, retry("2-0", 15 * S)));
}

#[test]
fn an_append_of_this_process_is_read_at_once_and_the_poll_finds_the_rest() {
    let mut s = Schedule::new(&delays());
    assert_eq!(s.next(0), Step::Read(vec![1, 2]));
    s.on(Event::Read(1, vec![]), 0);
    s.on(Event::Read(2, vec![]), 0);
    // Both empty: the fallback poll, the first stage's delay (within 1 s..30 s).
    assert_eq!(s.next(0), Step::Wait(10 * S));
    s.on(Event::Appended, 2 * S);
    assert_eq!(s.next(2 * S), Step::Read(vec![1]));
    s.on(Event::Read(1, vec![retry("1-0", 12 * S)]), 2 * S);
    // The poll is still the one of the last full read.
    assert_eq!(s.next(2 * S), Step::Wait(10 * S));
    assert_eq!(s.next(10 * S), Step::Read(vec![1, 2]));
}

#[test]
fn a_full_page_is_read_again_once_tried() {
    let mut s = Schedule::new(&[Duration::from_secs(1)]);
    assert_eq!(s.next(0), Step::Read(vec![1]));
    let page: Vec<Retry> = (0..PAGE).map(|i| retry(&format!("{i}-0"), 0)).collect();
    s.on(Event::Read(1, page), 0);
    for i in 0..PAGE {
        assert!(matches!(s.next(0), Step::Try(1, r) if r.id == format!("{i}-0")));
        s.on(
            Event::Settled {
                stage: 1,
                moved_to: None,
            },
            0,
        );
    }
    assert_eq!(s.next(0), Step::Read(vec![1]), "more may follow the page");
}

#[test]
fn a_failed_read_waits_and_a_stop_ends_it() {
    let mut s = Schedule::new(&delays());
    assert_eq!(s.next(0), Step::Read(vec![1, 2]));
    s.on(Event::ReadFailed, 0);
    assert_eq!(s.next(0), Step::Wait(S));
    assert_eq!(s.next(S), Step::Read(vec![1, 2]));
    s.on(Event::Read(1, vec![retry("1-0", 0)]), S);
    s.on(Event::Read(2, vec![]), S);
    s.on(Event::Stop, S);
    assert_eq!(s.next(S), Step::Done, "nothing is tried after a stop");
    assert_eq!(Schedule::new(&[]).next(0), Step::Done, "no stage");
}
