//! The routing hash of PROTOCOL §3: which shard a message key goes to.
//!
//! `shard = jump_consistent_hash(xxh3_64(key_bytes, seed 0), shard_count)`.
//!
//! Jump consistent hashing (Lamping & Veach, 2014) moves only about `1/(N+1)` of the keys when
//! a stream grows from `N` to `N+1` shards, and needs no table: every producer computes the
//! same answer from the key and the shard count alone.

use xxhash_rust::xxh3::xxh3_64;

/// The name of the routing hash, as published in routing metadata.
pub const HASH_NAME: &str = "xxh3_64-jump";

/// The 64-bit xxh3 hash (seed 0) of a key.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// Lamping & Veach's jump consistent hash: a bucket in `0..buckets` for a 64-bit key.
///
/// `buckets` of 0 is treated as 1 (there is always at least one shard).
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets.max(1));
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    // `b` is in 0..buckets, which fits a u32.
    b as u32
}

/// The shard index, in `0..shard_count`, that a message with this key is written to.
pub fn shard_for_key(key: &[u8], shard_count: u32) -> u32 {
    jump_consistent_hash(key_hash(key), shard_count)
}

/// The Redis Stream key of shard `index` of `stream`: `<stream>:<index>`.
pub fn shard_key(stream: &str, index: u32) -> String {
    format!("{stream}:{index}")
}

/// The dead-letter stream key of `stream`: `<stream>:dlq`.
pub fn dlq_key(stream: &str) -> String {
    format!("{stream}:dlq")
}

/// The owner-token key of `group` on a shard (strict fencing): `{<shard key>}:owner:<group>`.
/// The hash tag is the whole shard key, which has none of its own, so the token lives in the
/// shard's Redis Cluster slot and one script can check it and touch the stream.
pub fn owner_key(shard_key: &str, group: &str) -> String {
    format!("{{{shard_key}}}:owner:{group}")
}

/// The retry stream of stage `stage` (from 1) of `group` on a shard (non-blocking retries,
/// PROTOCOL §2.2): `{<shard key>}:retry:<group>:<stage>`, in the shard's Redis Cluster slot,
/// so that one script can acknowledge an entry on the shard and append it to its stage.
pub fn retry_key(shard_key: &str, group: &str, stage: u32) -> String {
    format!("{{{shard_key}}}:retry:{group}:{stage}")
}

/// The doorbell channel of a shard (PROTOCOL §16): `{<shard key>}:ring`, in the shard's Redis
/// Cluster slot. A producer publishes an empty message on it in the round trip of its `XADD`s
/// to the shard, so that consumers waiting on the shard read at once instead of at their
/// fallback poll.
pub fn ring_channel(shard_key: &str) -> String {
    format!("{{{shard_key}}}:ring")
}

/// The command that rings a doorbell channel ([`ring_channel`], PROTOCOL §16): `SPUBLISH` on a
/// Redis Cluster (sharded pub/sub: the ring goes to the shard's node only, where the
/// consumers subscribe with `SSUBSCRIBE`), else `PUBLISH`.
pub fn ring_command(cluster: bool) -> &'static str {
    if cluster { "SPUBLISH" } else { "PUBLISH" }
}

/// The shard key a doorbell channel ([`ring_channel`]) belongs to; `None` for another name.
pub fn ring_channel_key(channel: &str) -> Option<&str> {
    channel.strip_prefix('{')?.strip_suffix("}:ring")
}

/// The routing-epoch marker of a shard (ordered resharding, PROTOCOL §15):
/// `{<shard key>}:epoch`, in the shard's Redis Cluster slot. It holds the routing epoch the
/// shard was last fenced at; a guarded `XADD` made under another epoch is refused.
pub fn epoch_key(shard_key: &str) -> String {
    format!("{{{shard_key}}}:epoch")
}

/// The seal positions of a shard (ordered resharding, PROTOCOL §15): `{<shard key>}:seals`, a
/// hash in the shard's slot. Field: the routing epoch a switch started; value:
/// `<last entry id under the previous epoch>/<shard count of the previous epoch>`.
pub fn seals_key(shard_key: &str) -> String {
    format!("{{{shard_key}}}:seals")
}

/// The check of a producer's fenced write: sent between `WATCH <markers>` and
/// `MULTI … EXEC`, it aborts the transaction (and returns the highest marker) when a shard's
/// epoch marker is not the producer's routing epoch (see the script's header).
pub const EPOCH_CHECK_LUA: &str = include_str!("lua/epoch_check.lua");

/// The check of a producer's write (PROTOCOL §15, §21): sent between `WATCH <markers>
/// [<records>] <abort key>` and `MULTI`, it finds the records an earlier attempt of an
/// idempotent producer wrote and the epoch refusal, and aborts the transaction when either
/// applies, or when it fails (answering its error; see the script's header).
pub const PUBLISH_CHECK_LUA: &str = include_str!("lua/publish_check.lua");

/// The end of a producer's write, queued inside its `MULTI` after the `XADD`s: updates the
/// producer records and rings the doorbells; queued with the check's keys, it makes the
/// transaction abort where the check may not run (see the script's header).
pub const PUBLISH_TAIL_LUA: &str = include_str!("lua/publish_tail.lua");

/// The entry ids of the records an idempotent producer's earlier attempt wrote to a shard,
/// read only in that retry (PROTOCOL §21; see the script's header).
pub const PUBLISH_LANDED_LUA: &str = include_str!("lua/publish_landed.lua");

/// The record of an idempotent producer on a shard (PROTOCOL §21):
/// `{<shard key>}:producer:<producer id>`, a hash in the shard's slot holding the highest
/// sequence the producer wrote there (`s`); it expires after the producer's idle time (so
/// its expiry, less that time, is the time of its last write).
pub fn producer_key(shard_key: &str, producer_id: &str) -> String {
    format!("{{{shard_key}}}:producer:{producer_id}")
}

/// The abort key of a producer's write (PROTOCOL §15): `{<shard key>}:publish-abort`, in the
/// slot of the transaction's first shard. It never holds a value: the write `WATCH`es it, and
/// the check sets and deletes it when it fails, which aborts the transaction (fail closed).
pub fn publish_abort_key(shard_key: &str) -> String {
    format!("{{{shard_key}}}:publish-abort")
}

/// The script measuring how far a group is from a seal on one shard: `{undelivered,
/// pending}` entries up to the seal (see the script's header).
pub const SEAL_PROGRESS_LUA: &str = include_str!("lua/seal_progress.lua");

/// One seal: the last entry id a shard received under the epoch before a switch, and that
/// epoch's shard count (so anyone can compute a key's shard before the switch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal {
    /// The last entry id of the shard written before the switch (`0-0`: none).
    pub id: String,
    /// The stream's shard count before the switch.
    pub from_count: u32,
}

impl Seal {
    /// Parses the `<id>/<count>` value of a seals hash field.
    pub fn parse(value: &str) -> Option<Seal> {
        let (id, count) = value.split_once('/')?;
        Some(Seal {
            id: id.to_owned(),
            from_count: count.parse().ok()?,
        })
    }

    /// The `<id>/<count>` form stored in the seals hash.
    pub fn encode(&self) -> String {
        format!("{}/{}", self.id, self.from_count)
    }
}

/// A stream entry id `<ms>-<seq>` as a comparable pair (`<ms>` alone means `<ms>-0`).
pub fn parse_entry_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_channel_round_trips() {
        let ch = ring_channel("orders:3");
        assert_eq!(ch, "{orders:3}:ring");
        assert_eq!(ring_channel_key(&ch), Some("orders:3"));
        assert_eq!(ring_channel_key("orders:3"), None);
        assert_eq!(ring_channel_key("{orders:3}:owner:g"), None);
    }

    #[test]
    fn jump_stays_in_range_and_moves_little() {
        let keys: Vec<u64> = (0..10_000u64).map(|i| key_hash(&i.to_le_bytes())).collect();
        for n in [1u32, 2, 7, 16, 100] {
            let moved = keys
                .iter()
                .filter(|&&k| {
                    let a = jump_consistent_hash(k, n);
                    let b = jump_consistent_hash(k, n + 1);
                    assert!(a < n && b < n + 1);
                    a != b
                })
                .count();
            // About 1/(n+1) of the keys move; allow generous noise.
            let expected = 10_000.0 / f64::from(n + 1);
            assert!(
                (moved as f64) < expected * 1.3 + 50.0,
                "n={n} moved={moved}"
            );
        }
    }

    #[test]
    fn zero_buckets_is_one() {
        assert_eq!(jump_consistent_hash(42, 0), 0);
    }

    #[test]
    fn owner_key_shares_the_shard_slot() {
        assert_eq!(owner_key("orders:3", "billing"), "{orders:3}:owner:billing");
        assert_eq!(
            retry_key("orders:3", "billing", 2),
            "{orders:3}:retry:billing:2"
        );
        assert_eq!(epoch_key("orders:3"), "{orders:3}:epoch");
        assert_eq!(seals_key("orders:3"), "{orders:3}:seals");
        assert_eq!(publish_abort_key("orders:3"), "{orders:3}:publish-abort");
    }

    #[test]
    fn seals_round_trip() {
        let s = Seal::parse("1700-3/4").unwrap();
        assert_eq!((s.id.as_str(), s.from_count), ("1700-3", 4));
        assert_eq!(s.encode(), "1700-3/4");
        assert!(Seal::parse("1700-3").is_none());
        assert_eq!(parse_entry_id("10-2"), Some((10, 2)));
        assert_eq!(parse_entry_id("10"), Some((10, 0)));
        assert!(parse_entry_id("x-1").is_none());
        assert!(parse_entry_id("10-0") > parse_entry_id("9-5"));
    }
}
