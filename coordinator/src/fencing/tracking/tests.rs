//! The tracked keys' rules, without Redis: what a read may record, and what forgets it.

use super::{State, lock};
use std::sync::Mutex;

const K1: &str = "{s:0}:owner:g";
const K2: &str = "{s:1}:owner:g";

fn held(state: &State, pairs: &[(&str, &str)]) -> bool {
    state.holds(pairs.iter().copied())
}

#[test]
fn nothing_is_held_before_a_connection_or_a_read() {
    let mut s = State::default();
    assert!(s.stamp().is_none(), "no connection: no stamp");
    assert!(!held(&s, &[(K1, "t1")]));
    s.connected(1, 0);
    assert!(!held(&s, &[(K1, "t1")]), "connected, nothing read yet");
    // An empty assertion is trivially held on an open connection (the caller never asks).
    assert!(held(&s, &[]));
}

#[test]
fn a_read_is_kept_for_its_token_only() {
    let mut s = State::default();
    s.connected(1, 0);
    let stamp = s.stamp().expect("open");
    assert!(s.record(stamp, [(K1, "t1"), (K2, "t2")]));
    assert!(held(&s, &[(K1, "t1"), (K2, "t2")]));
    assert!(held(&s, &[(K2, "t2")]));
    assert!(!held(&s, &[(K1, "t1-later")]), "another token: a new grant");
    assert!(
        !held(&s, &[(K1, "t1"), ("{s:2}:owner:g", "t3")]),
        "one key not read"
    );
}

#[test]
fn an_invalidation_forgets_its_keys_and_a_flush_forgets_all() {
    let mut s = State::default();
    s.connected(1, 0);
    let stamp = s.stamp().unwrap();
    s.record(stamp, [(K1, "t1"), (K2, "t2")]);
    s.invalidated(1, Some(&[K1.as_bytes().to_vec()]));
    assert!(!held(&s, &[(K1, "t1")]), "deleted or rewritten");
    assert!(held(&s, &[(K2, "t2")]), "another key stays");
    s.invalidated(1, None);
    assert!(!held(&s, &[(K2, "t2")]), "FLUSHDB / FLUSHALL");
}

#[test]
fn a_read_sent_before_an_invalidation_is_not_recorded() {
    // Redis writes the invalidation after the read's reply, but the reader may record after
    // the push was handled: the read may have seen the value the push says is gone.
    let mut s = State::default();
    s.connected(1, 0);
    let stamp = s.stamp().unwrap();
    s.invalidated(1, Some(&[K1.as_bytes().to_vec()]));
    assert!(!s.record(stamp, [(K1, "t1")]));
    assert!(!held(&s, &[(K1, "t1")]));
    // Any push counts, whatever its keys: a read sent after it is recorded.
    let stamp = s.stamp().unwrap();
    assert!(s.record(stamp, [(K1, "t1")]));
    assert!(held(&s, &[(K1, "t1")]));
}

#[test]
fn a_lost_connection_forgets_everything_and_old_connections_are_ignored() {
    let mut s = State::default();
    s.connected(1, 0);
    let old = s.stamp().unwrap();
    s.record(old, [(K1, "t1")]);
    assert!(s.lost(1), "the current connection");
    assert!(!held(&s, &[(K1, "t1")]));
    assert!(s.stamp().is_none(), "no open connection");
    assert!(
        !s.record(old, [(K1, "t1")]),
        "a read of the lost connection"
    );
    s.connected(2, 0);
    assert!(!held(&s, &[(K1, "t1")]), "a new connection starts empty");
    assert!(!s.record(old, [(K1, "t1")]), "a read of the old connection");
    let stamp = s.stamp().unwrap();
    s.record(stamp, [(K1, "t1")]);
    // Pushes and losses of the old connection change nothing now.
    s.invalidated(1, None);
    assert!(!s.lost(1), "an old connection");
    assert!(held(&s, &[(K1, "t1")]));
    assert_eq!(s.stamp(), Some(stamp), "nothing counted");
}

#[test]
fn a_poisoned_lock_fails_closed() {
    let state = Mutex::new(State::default());
    {
        let mut s = lock(&state);
        s.connected(1, 0);
        let stamp = s.stamp().unwrap();
        s.record(stamp, [(K1, "t1")]);
    }
    let _ = std::panic::catch_unwind(|| {
        let _g = state.lock().unwrap();
        panic!("a panic while the state is locked");
    });
    assert!(state.is_poisoned());
    let s = lock(&state);
    assert!(
        !held(&s, &[(K1, "t1")]),
        "nothing answered from a poisoned state"
    );
    assert!(s.stamp().is_none(), "the connection counts as lost");
    drop(s);
    assert!(!state.is_poisoned(), "taken over");
}
