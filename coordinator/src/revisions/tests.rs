use super::*;
use proptest::prelude::*;
use serde_json::json;

fn actor() -> Actor {
    Actor {
        cause: Cause::Admin,
        principal: "ops".into(),
    }
}

/// Builds the history of `docs` (revision i+1 is docs[i]) as the stores would.
fn history(docs: &[Value]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut before: Option<&Value> = None;
    for (i, d) in docs.iter().enumerate() {
        if let Some(note) = Note::of(&actor(), 1_000 + i as u64, before, d) {
            let rec: Record = serde_json::from_str(&note.record_json(i as u64 + 1)).unwrap();
            out.push(rec);
        }
        before = Some(d);
    }
    out
}

/// A record is compact: only the changed leaf, with its old and new value.
#[test]
fn a_record_holds_only_the_changed_paths() {
    let a =
        json!({"group_epoch": 3, "members": {"m/1": {"member_epoch": 3, "last_heartbeat_ms": 5}}});
    let b =
        json!({"group_epoch": 4, "members": {"m/1": {"member_epoch": 4, "last_heartbeat_ms": 9}}});
    let note = Note::of(&actor(), 7, Some(&a), &b).unwrap();
    let rec = note.record_json(12);
    assert_eq!(
        rec,
        r#"{"t":7,"r":12,"c":"admin","d":[{"k":"/group_epoch","n":4,"o":3},{"k":"/members/m~11/member_epoch","n":4,"o":3}],"p":"ops"}"#
    );
    let parsed: Record = serde_json::from_str(&rec).unwrap();
    assert_eq!(parsed.revision, 12);
    assert_eq!(parsed.changes.len(), 2);
}

/// Liveness alone is no change: no record.
#[test]
fn liveness_alone_writes_no_record() {
    let a = json!({"members": {"m": {"last_heartbeat_ms": 5}}});
    let b = json!({"members": {"m": {"last_heartbeat_ms": 6}}});
    assert_eq!(Note::of(&actor(), 1, Some(&a), &b), None);
    assert!(
        Note::of(&actor(), 1, None, &b).is_some(),
        "a creation always is"
    );
}

/// Rewinding past the kept history is refused with what is kept.
#[test]
fn rewinding_past_the_kept_history_is_refused() {
    let docs = [json!({"a": 1}), json!({"a": 2}), json!({"a": 3})];
    let recs = history(&docs);
    let kept = &recs[1..];
    assert_eq!(rewind(&docs[2], 3, kept, 1).unwrap(), docs[0]);
    assert_eq!(
        rewind(&docs[2], 3, kept, 0),
        Err(RewindError::NotKept {
            revision: 0,
            oldest: 2,
            newest: 3
        })
    );
    assert!(rewind(&docs[2], 3, kept, 4).is_err());
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::from),
        "[a-z]{0,3}".prop_map(Value::from),
        prop::collection::vec(0u32..5, 0..3).prop_map(|v| json!(v)),
    ]
}

fn doc() -> impl Strategy<Value = Value> {
    leaf()
        .prop_recursive(3, 24, 4, |inner| {
            prop::collection::btree_map("[a-c/~]{1,2}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect()))
        })
        .prop_map(|v| match v {
            Value::Object(_) => v,
            other => json!({ "x": other }),
        })
}

proptest! {
    /// Every kept revision is rebuilt exactly from the newest document and the records,
    /// and a diff between two revisions turns one into the other.
    #[test]
    fn every_revision_is_rebuilt_from_the_newest_and_the_records(
        docs in prop::collection::vec(doc(), 1..8)
    ) {
        // Duplicates write no record (and no revision): keep each distinct step.
        let mut steps: Vec<Value> = Vec::new();
        for d in docs {
            if steps.last() != Some(&d) {
                steps.push(d);
            }
        }
        let recs = history(&steps);
        prop_assert_eq!(recs.len(), steps.len());
        let current = steps.len() as u64;
        let newest = steps.last().unwrap();
        for (i, d) in steps.iter().enumerate() {
            prop_assert_eq!(&rewind(newest, current, &recs, i as u64 + 1).unwrap(), d);
        }
        prop_assert_eq!(rewind(newest, current, &recs, 0).unwrap(), json!({}));
        let d = diff(newest, current, &recs, 1, current).unwrap();
        let mut first = steps[0].clone();
        for c in &d {
            set(&mut first, &c.path, c.new.clone()).unwrap();
        }
        prop_assert_eq!(&first, newest);
    }
}

/// The records of a group's life through the engine stay compact: a join, the rebalance it
/// causes and the revocation acknowledgements record only what changed (bounded here so that
/// a change to the document that bloats every record is noticed).
#[test]
fn heartbeat_records_are_compact() {
    use crate::engine::{GroupConfig, GroupDoc, StreamDoc};
    use rsc_protocol::HeartbeatRequest;
    let stream = StreamDoc::new("s", 16, 0).unwrap();
    let mut g = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
    let hb = |m: &str, epoch: i64, owned: Vec<u32>| HeartbeatRequest {
        protocol_version: 1,
        member_id: m.into(),
        member_epoch: epoch,
        owned_shards: Some(owned),
        drained_shards: vec![],
        client: None,
        incarnation: None,
    };
    let actor = Actor {
        cause: Cause::Heartbeat,
        principal: "m".into(),
    };
    let mut sizes = Vec::new();
    let mut owned: std::collections::HashMap<String, (i64, Vec<u32>)> = Default::default();
    for (i, m) in ["m1", "m2", "m3", "m4"].into_iter().enumerate() {
        owned.insert(m.into(), (0, vec![]));
        for round in 0..4u64 {
            for (id, (e, o)) in owned.iter_mut() {
                let before = serde_json::to_value(&g).unwrap();
                let now = 1_000 * (i as u64 * 10 + round + 1);
                let out = g.heartbeat(&stream, &hb(id, *e, o.clone()), now).unwrap();
                *e = out.response.member_epoch;
                *o = out.response.assignment.clone();
                let after = serde_json::to_value(&g).unwrap();
                if let Some(n) = Note::of(&actor, now, Some(&before), &after) {
                    sizes.push(n.record_json(1).len());
                }
            }
        }
    }
    let doc = serde_json::to_string(&g).unwrap().len();
    let max = *sizes.iter().max().unwrap();
    let mean = sizes.iter().sum::<usize>() / sizes.len();
    println!(
        "records {} mean {mean} B max {max} B; document {doc} B",
        sizes.len()
    );
    assert!(
        max < doc,
        "a record is smaller than the document ({max} vs {doc})"
    );
    assert!(mean < 600, "mean record {mean} B");
}
