//! The replayer on a real `redis-server`: whatever the target, the plan's count is the
//! number of entries after the new position (checked against `XRANGE`), walks that take many
//! pages end where one long walk would, and after the move Redis' own `XINFO GROUPS` answers
//! the plan's lag (the read counter given with `ENTRIESREAD` is right); the doorbell rings.

use super::plan::{Id, Target, fmt_id};
use super::*;
use redis::Commands;
use rsc_protocol::routing::parse_entry_id;
use rsc_redis::{ConnSettings, Reconnect, Tls};
use rsc_testkit::RedisServer;

const KEY: &str = "s:0";

fn lazy(redis: &RedisServer) -> LazyRedis {
    let t = Duration::from_secs(2);
    let settings = ConnSettings {
        connect_timeout: t,
        response_timeout: t,
        operation_timeout: t,
        reconnect: Reconnect::Quick,
    };
    LazyRedis::open(&[redis.url()], false, &settings, &Tls::default()).expect("settings")
}

/// Every entry id of `key`, in order.
fn ids(con: &mut redis::Connection, key: &str) -> Vec<Id> {
    let r: redis::streams::StreamRangeReply = con.xrange_all(key).expect("XRANGE");
    r.ids
        .iter()
        .map(|e| parse_entry_id(&e.id).expect("an id"))
        .collect()
}

/// `(last-delivered-id, lag)` of group `g` on `key`.
fn group_state(con: &mut redis::Connection, key: &str) -> (String, Option<usize>) {
    let r: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query(con)
        .expect("XINFO");
    let g = r
        .groups
        .into_iter()
        .find(|g| g.name == "g")
        .expect("group g");
    (g.last_delivered_id, g.lag)
}

#[tokio::test]
async fn plans_count_exactly_and_redis_agrees_after_the_move() {
    let server = RedisServer::start().expect("redis-server starts");
    let mut con = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("connection");
    // 2,500 entries, three to a millisecond, the first 100 trimmed away.
    let mut pipe = redis::pipe();
    for i in 0..2_500u64 {
        pipe.cmd("XADD")
            .arg(KEY)
            .arg(format!("{}-{}", 1_000 + i / 3, i % 3))
            .arg("payload")
            .arg(i)
            .ignore();
    }
    let () = pipe.query(&mut con).expect("XADD");
    let all = ids(&mut con, KEY);
    let _: u64 = redis::cmd("XTRIM")
        .arg(KEY)
        .arg("MINID")
        .arg(fmt_id(all[100]))
        .query(&mut con)
        .expect("XTRIM");
    let kept = ids(&mut con, KEY);
    assert_eq!(kept.len(), 2_400);
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(KEY)
        .arg("g")
        .arg("$")
        .query(&mut con)
        .expect("XGROUP CREATE");
    let after = |id: Id| kept.iter().filter(|e| **e > id).count() as u64;
    // Where the group is put back before each relative seek: 1,200 entries in.
    let home = kept[1_200];

    let mut pubsub_con = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("connection");
    let mut pubsub = pubsub_con.as_pubsub();
    pubsub.subscribe("{s:0}:ring").expect("SUBSCRIBE");
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");

    let replayer = Replayer::new(lazy(&server), Duration::from_secs(5)).with_page(7);
    let middle = kept[1_800];
    let cases: Vec<(Target, Id)> = vec![
        (Target::Earliest, (0, 0)),
        (Target::Latest, *kept.last().unwrap()),
        // A time: the entries at or after its millisecond follow.
        (
            Target::After((middle.0 - 1, u64::MAX)),
            (middle.0 - 1, u64::MAX),
        ),
        // A time after the last entry: the last entry.
        (Target::After((9_999, u64::MAX)), *kept.last().unwrap()),
        (Target::Exactly(kept[700]), kept[700]),
        (Target::Exactly((1_010, 1)), (1_010, 1)),
        (Target::Shift(-300), kept[1_200 - 300]),
        (Target::Shift(300), kept[1_200 + 300]),
        (Target::Shift(-5_000), (0, 0)),
        (Target::Shift(5_000), *kept.last().unwrap()),
    ];
    for (target, expected) in cases {
        let () = redis::cmd("XGROUP")
            .arg("SETID")
            .arg(KEY)
            .arg("g")
            .arg(fmt_id(home))
            .arg("ENTRIESREAD")
            .arg(2_500 - after(home))
            .query(&mut con)
            .expect("SETID");
        let moves = replayer
            .plan("g", StartPosition::Earliest, &[(0, KEY.into())], target)
            .await
            .expect("plan");
        let m = &moves[0];
        assert_eq!(m.new, expected, "{target:?}");
        assert_eq!(
            m.lag_after,
            after(expected),
            "{target:?}: entries after the new position"
        );
        assert_eq!(m.lag_before, Some(after(home)), "{target:?}");
        assert_eq!(m.entries_read, 2_500 - after(expected), "{target:?}");
        let wire = m.to_wire();
        assert_eq!(wire.current_id.as_deref(), Some(fmt_id(home).as_str()));
        assert_eq!(
            wire.redelivered,
            after(expected).saturating_sub(after(home)),
            "{target:?}"
        );
        replayer.apply("g", &moves).await.expect("apply");
        let (last, lag) = group_state(&mut con, KEY);
        assert_eq!(last, fmt_id(expected), "{target:?}");
        assert_eq!(
            lag,
            Some(after(expected) as usize),
            "{target:?}: Redis' own lag after the move"
        );
        let msg = pubsub.get_message().expect("the doorbell rang");
        assert_eq!(msg.get_channel_name(), "{s:0}:ring");
    }

    // Past the last id: refused. A key never written, without a consumer group: created.
    let r = replayer
        .plan(
            "g",
            StartPosition::Earliest,
            &[(0, KEY.into())],
            Target::Exactly((99_999, 0)),
        )
        .await;
    assert!(matches!(r, Err(ReplayError::Invalid(_))), "{r:?}");
    let moves = replayer
        .plan(
            "g",
            StartPosition::Earliest,
            &[(1, "s:1".into())],
            Target::Shift(-10),
        )
        .await
        .expect("plan");
    assert_eq!((moves[0].new, moves[0].lag_after), ((0, 0), 0));
    assert_eq!(moves[0].to_wire().current_id, None);
    replayer.apply("g", &moves).await.expect("apply");
    assert_eq!(group_state(&mut con, "s:1"), ("0-0".into(), Some(0)));
}
