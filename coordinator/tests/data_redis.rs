//! The coordinator's data-Redis side on a real standalone `redis-server` and a real 3-node
//! Redis Cluster.
//!
//! Owner tokens of strict fencing (PROTOCOL §5.6, docs/FENCING.md): on standalone Redis one script call,
//! shared by the heartbeats in flight;
//! on a cluster the owner keys of one assignment live in different slots, on different
//! nodes. Both must behave the same: write, unchanged, refused by a later grant's token,
//! repaired after a loss. On standalone Redis the owner keys read in place are tracked
//! (`CLIENT TRACKING`): steady assertions need no command until Redis says a key changed or
//! the connection is lost. And the retired-key cleaner's one multi-key `UNLINK` deletes keys
//! of several slots on a cluster.

use redis::Commands;
use rsc_coordinator::fencing::{Asserted, OwnerTokens};
use rsc_protocol::routing::{owner_key, shard_key};
use rsc_redis::{ConnSettings, LazyRedis, Reconnect, Tls};
use rsc_testkit::{RedisCluster, RedisServer};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const SHARDS: u32 = 8;
const TIMEOUT: Duration = Duration::from_secs(2);

fn settings() -> ConnSettings {
    ConnSettings {
        connect_timeout: TIMEOUT,
        response_timeout: TIMEOUT,
        operation_timeout: TIMEOUT,
        reconnect: Reconnect::Quick,
    }
}

/// Reads and writes keys the way an operator would, on either kind of Redis.
trait Keys {
    fn get(&mut self, key: &str) -> Option<String>;
    fn set(&mut self, key: &str, value: &str);
    fn del(&mut self, key: &str);
}

impl<C: redis::ConnectionLike> Keys for C {
    fn get(&mut self, key: &str) -> Option<String> {
        Commands::get(self, key).expect("GET")
    }
    fn set(&mut self, key: &str, value: &str) {
        let () = Commands::set(self, key, value).expect("SET");
    }
    fn del(&mut self, key: &str) {
        let _: i64 = Commands::del(self, key).expect("DEL");
    }
}

fn tokens(created_ms: u64, epoch: u64, member: &str) -> BTreeMap<u32, String> {
    (0..SHARDS)
        .map(|s| (s, format!("{created_ms}:{epoch}:{member}")))
        .collect()
}

fn key(group: &str, stream: &str, shard: u32) -> String {
    owner_key(&shard_key(stream, shard), group)
}

/// The same scenario on any data Redis.
async fn scenario(tokens_writer: &OwnerTokens, keys: &mut dyn Keys, stream: &str) {
    let group = "billing";
    let first = tokens(1_000, 3, "m1");
    // Written, every key.
    let a = tokens_writer.assert(group, stream, &first).await.unwrap();
    assert_eq!(
        a,
        Asserted {
            written: SHARDS as usize,
            unchanged: 0,
            refused: 0
        }
    );
    for (&s, t) in &first {
        assert_eq!(
            keys.get(&key(group, stream, s)).as_deref(),
            Some(t.as_str())
        );
    }
    // Asserted again: unchanged.
    let a = tokens_writer.assert(group, stream, &first).await.unwrap();
    assert_eq!((a.written, a.unchanged, a.refused), (0, SHARDS as usize, 0));
    // A later grant on shard 1 (same created_ms, higher epoch) and a later group
    // incarnation on shard 2 (higher created_ms): both refuse the earlier token.
    let later_epoch = "1000:4:m2";
    let later_group = "2000:1:m3";
    keys.set(&key(group, stream, 1), later_epoch);
    keys.set(&key(group, stream, 2), later_group);
    // Lost tokens (shards 0 and 5): repaired.
    keys.del(&key(group, stream, 0));
    keys.del(&key(group, stream, 5));
    let a = tokens_writer.assert(group, stream, &first).await.unwrap();
    assert_eq!(
        (a.written, a.unchanged, a.refused),
        (2, SHARDS as usize - 4, 2),
        "{a:?}"
    );
    assert_eq!(
        keys.get(&key(group, stream, 1)).as_deref(),
        Some(later_epoch)
    );
    assert_eq!(
        keys.get(&key(group, stream, 2)).as_deref(),
        Some(later_group)
    );
    for s in [0, 5] {
        assert_eq!(
            keys.get(&key(group, stream, s)).as_deref(),
            first.get(&s).map(String::as_str),
            "shard {s} repaired"
        );
    }
    // A later grant replaces an earlier token.
    let next = tokens(1_000, 9, "m4");
    let a = tokens_writer.assert(group, stream, &next).await.unwrap();
    assert_eq!(
        (a.written, a.unchanged, a.refused),
        (SHARDS as usize - 1, 0, 1)
    );
    assert_eq!(
        keys.get(&key(group, stream, 2)).as_deref(),
        Some(later_group)
    );
}

#[tokio::test]
async fn standalone_redis() {
    let redis = RedisServer::start().expect("redis-server starts");
    let lazy = LazyRedis::open(&[redis.url()], false, &settings(), &Tls::default()).unwrap();
    let writer = OwnerTokens::new(lazy, TIMEOUT);
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        scenario(&writer, &mut con, "orders"),
    )
    .await
    .expect("bounded");
    // The script is loaded again after a SCRIPT FLUSH (NOSCRIPT, load, retry).
    let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    let a = writer
        .assert("billing", "orders", &tokens(5_000, 1, "m9"))
        .await
        .unwrap();
    assert_eq!(a.written, SHARDS as usize);
}

/// A `redis-server`, a token writer to it, and a connection for the test's own commands.
fn standalone() -> (RedisServer, OwnerTokens, redis::Connection) {
    let redis = RedisServer::start().expect("redis-server starts");
    let lazy = LazyRedis::open(&[redis.url()], false, &settings(), &Tls::default()).unwrap();
    let writer = OwnerTokens::new(lazy, TIMEOUT);
    let con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    (redis, writer, con)
}

/// The `MGET`, `EVAL` and `EVALSHA` calls Redis counted since its last `CONFIG RESETSTAT`.
fn reads_and_scripts(con: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let calls = rsc_testkit::command_calls(&info);
    let n = |c: &str| calls.get(c).copied().unwrap_or(0);
    (n("mget"), n("eval") + n("evalsha"))
}

/// The id of the coordinator's tracking connection in `CLIENT LIST` (`None`: not connected),
/// after checking that Redis tracks for it.
fn tracking_client(con: &mut redis::Connection) -> Option<u64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    let name = format!(
        "name={}",
        rsc_coordinator::fencing::TRACKING_CONNECTION_NAME
    );
    let line = list.lines().find(|l| l.split(' ').any(|f| f == name))?;
    let field = |f: &str| {
        line.split(' ')
            .find_map(|x| x.strip_prefix(f))
            .unwrap_or("")
    };
    assert!(field("flags=").contains('t'), "tracking on: {line}");
    assert_eq!(field("resp="), "3", "{line}");
    field("id=").parse().ok()
}

/// Re-asserts `tokens` until `done` says what it answered is right, within 10 s (a change's
/// invalidation, or the closed connection, reaches the writer asynchronously).
async fn until(
    writer: &OwnerTokens,
    tokens: &BTreeMap<u32, String>,
    what: &str,
    done: impl Fn(&Asserted) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = writer.reassert("billing", "orders", tokens).await.unwrap();
        if done(&a) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {a:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Standalone Redis: the owner keys read holding their tokens are tracked, so steady
/// assertions send nothing; a key changed by another client, a flushed database and a lost
/// connection each make the next assertions read (and repair) again.
#[tokio::test]
async fn owner_keys_read_in_place_are_tracked_on_a_standalone_redis() {
    let (_redis, writer, mut con) = standalone();
    let (group, stream) = ("billing", "orders");
    let m1 = tokens(1_000, 1, "m1");
    let all = SHARDS as usize;
    let a = writer.assert(group, stream, &m1).await.unwrap();
    assert_eq!(a.written, all);
    // The write is pushed as an invalidation of the keys the first read saw empty; a read
    // sent before that push was handled is not kept, so wait for it.
    writer.sync_tracking().await;
    let a = writer.reassert(group, stream, &m1).await.unwrap();
    assert_eq!(a.unchanged, all, "read in place, and so tracked");
    assert!(writer.tracking_live());
    let first = tracking_client(&mut con).expect("the tracking connection");
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    for _ in 0..3 {
        let a = writer.reassert(group, stream, &m1).await.unwrap();
        assert_eq!(a.unchanged, all);
    }
    assert_eq!(
        reads_and_scripts(&mut con),
        (0, 0),
        "answered from the tracked keys"
    );
    // A heartbeat that changes anything (`assert`) reads all the same.
    let a = writer.assert(group, stream, &m1).await.unwrap();
    assert_eq!(a.unchanged, all);
    assert_eq!(reads_and_scripts(&mut con), (1, 0), "assert reads");
    // A new grant's token is not taken for the tracked one.
    let m2 = tokens(1_000, 2, "m2");
    let a = writer.reassert(group, stream, &m2).await.unwrap();
    assert_eq!(a.written, all);

    // Deleted by another client: Redis's invalidation arrives, the next re-assertion repairs.
    writer.sync_tracking().await;
    writer.reassert(group, stream, &m2).await.unwrap();
    Keys::del(&mut con, &key(group, stream, 3));
    until(&writer, &m2, "a deleted owner key repaired", |a| {
        a.written == 1
    })
    .await;
    assert_eq!(
        Keys::get(&mut con, &key(group, stream, 3)).as_deref(),
        m2.get(&3).map(String::as_str)
    );
    // The whole database flushed: every key read and written again (once the push was
    // handled: `sync_tracking` waits for it).
    let () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    writer.sync_tracking().await;
    let a = writer.reassert(group, stream, &m2).await.unwrap();
    assert_eq!(a.written, all, "after FLUSHALL");

    // The tracking connection killed: nothing it read is believed; the next one tracks.
    writer.sync_tracking().await;
    writer.reassert(group, stream, &m2).await.unwrap();
    let () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(first)
        .query::<i64>(&mut con)
        .map(|_| ())
        .unwrap();
    Keys::del(&mut con, &key(group, stream, 5));
    until(&writer, &m2, "repaired after the connection's loss", |a| {
        a.written == 1
    })
    .await;
    let second = tracking_client(&mut con).expect("a new tracking connection");
    assert_ne!(first, second);
    // (The repair's own write is pushed as an invalidation too: a read sent before it was
    // handled is not kept.)
    writer.sync_tracking().await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    writer.reassert(group, stream, &m2).await.unwrap();
    writer.reassert(group, stream, &m2).await.unwrap();
    assert_eq!(
        reads_and_scripts(&mut con),
        (1, 0),
        "read once, then tracked"
    );
}

/// A data Redis that stops answering with its sockets open (SIGSTOP, as a host that vanished
/// without closing them): the tracking connection's `PING` goes unanswered, what it tracked
/// is forgotten, and once Redis answers again re-assertions read, and track, anew.
#[tokio::test]
async fn a_tracking_connection_that_stops_answering_is_forgotten() {
    struct Thaw(u32);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let _ = rsc_testkit::signal(self.0, rsc_testkit::Signal::SIGCONT);
        }
    }
    let (redis, writer, mut con) = standalone();
    let m1 = tokens(1_000, 1, "m1");
    writer.assert("billing", "orders", &m1).await.unwrap();
    writer.sync_tracking().await;
    writer.reassert("billing", "orders", &m1).await.unwrap();
    assert!(writer.tracking_live());
    let pid = redis.pid().expect("redis-server pid");
    rsc_testkit::signal(pid, rsc_testkit::Signal::SIGSTOP).expect("SIGSTOP");
    let thaw = Thaw(pid);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while writer.tracking_live() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a silent tracking connection still believed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(thaw);
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let a = writer.reassert("billing", "orders", &m1).await.unwrap();
    assert_eq!(a.unchanged, SHARDS as usize);
    assert_eq!(reads_and_scripts(&mut con), (1, 0), "read again");
    assert!(writer.tracking_live(), "tracking again");
}

/// A data Redis user without the `CLIENT` command: no tracking, every assertion reads, and
/// the assertions are as right as with it.
#[tokio::test]
async fn without_client_tracking_every_assertion_reads() {
    let redis = RedisServer::start().expect("redis-server starts");
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "fencer", "on", ">pw", "~*", "&*", "+@all", "-client",
            ][..],
        )
        .query(&mut con)
        .unwrap();
    let url = redis.url().replacen("redis://", "redis://fencer:pw@", 1);
    let lazy = LazyRedis::open(&[url], false, &settings(), &Tls::default()).unwrap();
    let writer = OwnerTokens::new(lazy, TIMEOUT);
    let m1 = tokens(1_000, 1, "m1");
    let a = writer.assert("billing", "orders", &m1).await.unwrap();
    assert_eq!(a.written, SHARDS as usize);
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    for _ in 0..3 {
        let a = writer.reassert("billing", "orders", &m1).await.unwrap();
        assert_eq!(a.unchanged, SHARDS as usize);
    }
    assert_eq!(
        reads_and_scripts(&mut con),
        (3, 0),
        "one MGET per assertion"
    );
    assert_eq!(tracking_client(&mut con), None);
    Keys::del(&mut con, &key("billing", "orders", 2));
    let a = writer.reassert("billing", "orders", &m1).await.unwrap();
    assert_eq!(a.written, 1, "repaired by the next assertion");
}

#[tokio::test]
async fn redis_cluster() {
    let cluster = RedisCluster::shared().expect("cluster starts");
    let stream = format!("ot-{}", std::process::id());
    // The owner keys of the assignment really are spread over slots and nodes.
    let mut node = redis::Client::open(cluster.urls()[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let slots: BTreeSet<i64> = (0..SHARDS)
        .map(|s| {
            redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key("billing", &stream, s))
                .query(&mut node)
                .unwrap()
        })
        .collect();
    assert!(slots.len() > 1, "owner keys in several slots: {slots:?}");
    let owners: BTreeSet<usize> = slots
        .iter()
        .map(|&slot| owner_node(cluster, slot))
        .collect();
    assert!(owners.len() > 1, "owner keys on several nodes: {owners:?}");

    let lazy = LazyRedis::open(&cluster.urls(), true, &settings(), &Tls::default()).unwrap();
    assert!(lazy.is_cluster());
    let writer = OwnerTokens::new(lazy, TIMEOUT);
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        scenario(&writer, &mut con, &stream),
    )
    .await
    .expect("bounded");
    let on_every_node = |cmd: &str| -> Vec<String> {
        cluster
            .nodes()
            .iter()
            .map(|n| n.command(cmd).unwrap())
            .collect()
    };
    let m9 = tokens(5_000, 1, "m9");
    // After SCRIPT FLUSH on every node, the script is loaded again where needed.
    on_every_node("SCRIPT FLUSH");
    let a = writer.assert("billing", &stream, &m9).await.unwrap();
    assert_eq!(a.written, SHARDS as usize);
    // Tokens in place are read (`GET`), not run through the script.
    on_every_node("CONFIG RESETSTAT");
    let a = writer.assert("billing", &stream, &m9).await.unwrap();
    assert_eq!(a.unchanged, SHARDS as usize);
    let stats = on_every_node("INFO commandstats");
    let total = |cmd: &str| -> u64 { stats.iter().map(|s| calls_in(s, cmd)).sum() };
    assert_eq!(
        total("evalsha") + total("eval"),
        0,
        "a steady assertion runs no script"
    );
    assert_eq!(total("get"), u64::from(SHARDS));
}

/// The retired-key cleaner sends one `UNLINK` with every key of a pass; on a cluster the
/// connection splits it per slot and sends each part to its node.
#[tokio::test]
async fn one_unlink_deletes_keys_of_several_slots_on_a_cluster() {
    let cluster = RedisCluster::shared().expect("cluster starts");
    let keys: Vec<String> = (0..SHARDS)
        .map(|s| shard_key(&format!("rk-{}", std::process::id()), s))
        .collect();
    let mut sync = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    for k in &keys {
        Keys::set(&mut sync, k, "x");
    }
    let lazy = LazyRedis::open(&cluster.urls(), true, &settings(), &Tls::default()).unwrap();
    let mut conn = lazy.get().await.unwrap();
    let deleted: i64 = tokio::time::timeout(
        TIMEOUT,
        redis::cmd("UNLINK").arg(&keys[1..]).query_async(&mut conn),
    )
    .await
    .expect("bounded")
    .unwrap();
    assert_eq!(deleted, i64::from(SHARDS) - 1);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(Keys::get(&mut sync, k).is_some(), i == 0, "{k}");
    }
}

/// Index of the node that serves `slot` (from `CLUSTER SHARDS`-free `CLUSTER SLOTS`).
fn owner_node(cluster: &RedisCluster, slot: i64) -> usize {
    let mut con = redis::Client::open(cluster.urls()[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let ranges: Vec<(i64, i64, (String, i64))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<redis::Value>>(&mut con)
        .unwrap()
        .into_iter()
        .map(|r| {
            let redis::Value::Array(parts) = r else {
                panic!("CLUSTER SLOTS entry: {r:?}")
            };
            let start: i64 = redis::from_redis_value(parts[0].clone()).unwrap();
            let end: i64 = redis::from_redis_value(parts[1].clone()).unwrap();
            let redis::Value::Array(primary) = parts[2].clone() else {
                panic!("CLUSTER SLOTS primary: {parts:?}")
            };
            let host: String = redis::from_redis_value(primary[0].clone()).unwrap();
            let port: i64 = redis::from_redis_value(primary[1].clone()).unwrap();
            (start, end, (host, port))
        })
        .collect();
    let (_, _, (_, port)) = ranges
        .iter()
        .find(|(s, e, _)| (*s..=*e).contains(&slot))
        .expect("slot served");
    cluster
        .nodes()
        .iter()
        .position(|n| i64::from(n.port()) == *port)
        .expect("a known node")
}

/// Concurrent assertions on a standalone Redis share script calls (group commit,
/// docs/FENCING.md), and each caller still gets the outcome of its own keys, a refusal
/// included.
#[tokio::test]
async fn concurrent_assertions_each_get_their_own_outcome() {
    let redis = RedisServer::start().expect("redis-server starts");
    let lazy = LazyRedis::open(&[redis.url()], false, &settings(), &Tls::default()).unwrap();
    let writer = OwnerTokens::new(lazy, TIMEOUT);
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    // Group 7's shard 0 already holds a later grant's token.
    Keys::set(&mut con, &key("g7", "s", 0), "99999999999999:1:later");
    let one = |g: usize| {
        let writer = &writer;
        async move {
            let t: BTreeMap<u32, String> = (0..=(g as u32 % 3))
                .map(|s| (s, format!("1000:1:m{g}")))
                .collect();
            (
                g,
                writer
                    .assert(&format!("g{g}"), "s", &t)
                    .await
                    .expect("assert"),
            )
        }
    };
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let first = futures::future::join_all((0..40).map(one)).await;
    let scripts = script_calls(&mut con);
    assert!(
        (1..=4).contains(&scripts),
        "40 assertions in {scripts} script calls"
    );
    for (g, a) in &first {
        let n = *g % 3 + 1;
        let expected = if *g == 7 {
            Asserted {
                written: n - 1,
                unchanged: 0,
                refused: 1,
            }
        } else {
            Asserted {
                written: n,
                unchanged: 0,
                refused: 0,
            }
        };
        assert_eq!(*a, expected, "group g{g}");
    }
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let again = futures::future::join_all((0..40).map(one)).await;
    // Tokens in place are read (`MGET`), not run through the script; only g7's refusal is.
    let (reads, scripts) = (calls(&mut con, "mget"), script_calls(&mut con));
    assert!((1..=4).contains(&reads), "40 assertions in {reads} reads");
    assert!(
        (1..=4).contains(&scripts),
        "one refusal in {scripts} script calls"
    );
    for (g, a) in &again {
        let n = *g % 3 + 1;
        let refused = usize::from(*g == 7);
        assert_eq!(
            *a,
            Asserted {
                written: 0,
                unchanged: n - refused,
                refused
            },
            "group g{g}"
        );
    }
    assert_eq!(
        Keys::get(&mut con, &key("g7", "s", 0)).as_deref(),
        Some("99999999999999:1:later")
    );
    assert_eq!(
        Keys::get(&mut con, &key("g39", "s", 0)).as_deref(),
        Some("1000:1:m39")
    );
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let (_, a) = one(39).await;
    assert_eq!((a.written, a.unchanged, a.refused), (0, 1, 0));
    assert_eq!(
        script_calls(&mut con),
        0,
        "a steady assertion runs no script"
    );
}

/// `EVALSHA` and `EVAL` calls since the last `CONFIG RESETSTAT`.
fn script_calls(con: &mut redis::Connection) -> u64 {
    calls(con, "evalsha") + calls(con, "eval")
}

/// Calls of `cmd` since the last `CONFIG RESETSTAT` (`INFO commandstats`).
fn calls(con: &mut redis::Connection, cmd: &str) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    calls_in(&stats, cmd)
}

/// Calls of `cmd` in the text of `INFO commandstats`.
fn calls_in(stats: &str, cmd: &str) -> u64 {
    rsc_testkit::command_calls(stats)
        .get(cmd)
        .copied()
        .unwrap_or(0)
}
