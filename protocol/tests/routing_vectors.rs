//! Known-answer tests for the routing hash (docs/PROTOCOL.md §3).
//!
//! `routing-vectors.json` beside this file was computed by an independent implementation
//! (Python's `xxhash.xxh3_64_intdigest` and a reference jump hash). It is the file another
//! language's producer should check itself against; it is the repository's copy of the
//! contract's vectors, and PROTOCOL §3 quotes some of its rows (checked by `tests/contract.rs`).

use rsc_protocol::routing::{HASH_NAME, jump_consistent_hash, key_hash, shard_for_key};
use serde_json::Value;

const VECTORS: &str = include_str!("routing-vectors.json");

#[test]
fn every_known_answer_is_reproduced() {
    let doc: Value = serde_json::from_str(VECTORS).unwrap();
    assert_eq!(doc["hash"], HASH_NAME);
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 5);
    let mut checked = 0;
    for v in vectors {
        let key = v["key"].as_str().unwrap();
        let hash: u64 = v["xxh3_64"].as_str().unwrap().parse().unwrap();
        assert_eq!(key_hash(key.as_bytes()), hash, "xxh3_64({key:?})");
        for (count, shard) in v["shards"].as_object().unwrap() {
            let count: u32 = count.parse().unwrap();
            let shard = shard.as_u64().unwrap() as u32;
            assert_eq!(
                shard_for_key(key.as_bytes(), count),
                shard,
                "{key:?} over {count}"
            );
            assert_eq!(jump_consistent_hash(hash, count), shard);
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} answers checked");
}
