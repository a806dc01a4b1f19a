//! Consumer hygiene: a shard's Redis consumer group keeps every consumer that ever read it,
//! so after months of deploys (new pod ids each time) each shard would list thousands of
//! departed members, slowing every `XINFO` / `XPENDING` page and dashboard.
//!
//! The shard's new owner cleans up right after its takeover claim (`XAUTOCLAIM` of every
//! pending entry, see the worker): by then no other consumer should hold a pending entry,
//! and each other consumer with none is deleted. The check and the delete run in one script
//! ([`scripts/delete_consumer.lua`]), so a consumer that reads again in between keeps its
//! entries: `XGROUP DELCONSUMER` would drop a consumer's pending entries from the PEL, losing
//! them. A consumer that still has pending entries is kept and cleaned at a later takeover.
//! Deleting a live member's consumer is harmless (Redis re-creates it on its next read), so
//! the owner needs no list of live members; it works the same with several coordinators and
//! on Redis Cluster (one key per call).

use redis::aio::ConnectionLike;
use redis::streams::StreamInfoConsumersReply;
use redis::{RedisError, Script};
use std::sync::LazyLock;

static DELETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/delete_consumer.lua")));

/// What a cleanup of one shard did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Cleanup {
    /// Consumers deleted (no pending entry).
    pub(crate) deleted: Vec<String>,
    /// Other consumers kept because they still hold pending entries.
    pub(crate) kept: Vec<String>,
}

/// Deletes `consumer` from `group` on `key` if, atomically, it has no pending entry.
/// `Ok(true)` when deleted.
pub(crate) async fn delete_if_idle(
    conn: &mut impl ConnectionLike,
    key: &str,
    group: &str,
    consumer: &str,
) -> Result<bool, RedisError> {
    let r: i64 = DELETE
        .key(key)
        .arg(group)
        .arg(consumer)
        .invoke_async(conn)
        .await?;
    Ok(r == 1)
}

/// Deletes every consumer of `group` on `key` other than `me` that holds no pending entry.
pub(crate) async fn clean_shard(
    conn: &mut impl ConnectionLike,
    key: &str,
    group: &str,
    me: &str,
) -> Result<Cleanup, RedisError> {
    let info: StreamInfoConsumersReply = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(key)
        .arg(group)
        .query_async(conn)
        .await?;
    let mut out = Cleanup::default();
    for c in info.consumers {
        if c.name == me {
            continue;
        }
        if c.pending == 0 && delete_if_idle(conn, key, group, &c.name).await? {
            out.deleted.push(c.name);
        } else if c.pending > 0 {
            out.kept.push(c.name);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsc_testkit::RedisServer;

    async fn setup() -> (RedisServer, redis::aio::MultiplexedConnection) {
        let redis = RedisServer::start().expect("redis-server");
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("XGROUP")
            .arg(&["CREATE", "s:0", "g", "0", "MKSTREAM"][..])
            .query_async(&mut conn)
            .await
            .unwrap();
        for i in 0..3 {
            let _: String = redis::cmd("XADD")
                .arg(&["s:0", "*", "payload", &i.to_string()][..])
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        (redis, conn)
    }

    async fn read(conn: &mut redis::aio::MultiplexedConnection, consumer: &str, count: u32) {
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg(
                &[
                    "GROUP",
                    "g",
                    consumer,
                    "COUNT",
                    &count.to_string(),
                    "STREAMS",
                    "s:0",
                    ">",
                ][..],
            )
            .query_async(conn)
            .await
            .unwrap();
    }

    async fn consumers(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, usize)> {
        let info: StreamInfoConsumersReply = redis::cmd("XINFO")
            .arg(&["CONSUMERS", "s:0", "g"][..])
            .query_async(conn)
            .await
            .unwrap();
        let mut v: Vec<_> = info
            .consumers
            .into_iter()
            .map(|c| (c.name, c.pending))
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_consumer_with_pending_entries_is_never_deleted() {
        let (_redis, mut conn) = setup().await;
        read(&mut conn, "holder", 1).await;
        read(&mut conn, "idle", 10).await;
        let _: i64 = redis::cmd("XACK")
            .arg(&["s:0", "g"][..])
            .arg(pending_ids(&mut conn, "idle").await)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Straight at the script, bypassing the pending filter of `clean_shard`: the script's
        // own check must keep the holder.
        assert!(
            !delete_if_idle(&mut conn, "s:0", "g", "holder")
                .await
                .unwrap()
        );
        assert!(delete_if_idle(&mut conn, "s:0", "g", "idle").await.unwrap());
        assert!(
            !delete_if_idle(&mut conn, "s:0", "g", "nobody")
                .await
                .unwrap()
        );
        assert_eq!(consumers(&mut conn).await, vec![("holder".to_owned(), 1)]);
    }

    #[tokio::test]
    async fn the_owner_deletes_every_other_consumer_without_pending_entries() {
        let (_redis, mut conn) = setup().await;
        read(&mut conn, "gone-1", 1).await;
        read(&mut conn, "gone-2", 1).await;
        read(&mut conn, "me", 1).await;
        // The owner's takeover claim moves gone-1's entry to it; gone-2 keeps its entry.
        let _: redis::Value = redis::cmd("XAUTOCLAIM")
            .arg(&["s:0", "g", "me", "0", "0-0", "COUNT", "1"][..])
            .query_async(&mut conn)
            .await
            .unwrap();
        let out = clean_shard(&mut conn, "s:0", "g", "me").await.unwrap();
        assert_eq!(out.deleted, vec!["gone-1".to_owned()]);
        assert_eq!(out.kept, vec!["gone-2".to_owned()]);
        assert_eq!(
            consumers(&mut conn).await,
            vec![("gone-2".to_owned(), 1), ("me".to_owned(), 2)]
        );
    }

    async fn pending_ids(
        conn: &mut redis::aio::MultiplexedConnection,
        consumer: &str,
    ) -> Vec<String> {
        let r: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(&["s:0", "g", "-", "+", "10", consumer][..])
            .query_async(conn)
            .await
            .unwrap();
        r.ids.into_iter().map(|p| p.id).collect()
    }
}
