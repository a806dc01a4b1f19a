//! The Redis round trips of a dead-letter list and purge (PROTOCOL §18): `XRANGE` (or
//! `XREVRANGE`, newest first) over `<stream>:dlq` in pages, [`super::Filter`] applied to
//! each dead letter, and `XDEL` of what a purge took.

use super::Filter;
use super::{DeadLetter, parse_range};
use rsc_protocol::routing;
use rsc_redis::Conn;

/// Dead letters read per round trip.
const PAGE: usize = 500;
/// Dead letters one list reads at most: a filter that matches little answers a page with
/// fewer entries and `next_after` where the scan stopped.
pub(crate) const LIST_SCAN_BUDGET: usize = 20_000;

/// What a list asks.
#[derive(Debug, Clone)]
pub(crate) struct Page<'a> {
    /// Which dead letters.
    pub filter: &'a Filter,
    /// At most this many.
    pub count: usize,
    /// Start after this dead-letter id (exclusive): the previous page's `next_after`.
    pub after: Option<&'a str>,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
}

/// One range read: `XRANGE key start end COUNT n`, or `XREVRANGE key end start COUNT n`.
async fn read(
    conn: &mut Conn,
    key: &str,
    (start, end): (&str, &str),
    newest_first: bool,
) -> redis::RedisResult<Vec<DeadLetter>> {
    let mut cmd = redis::cmd(if newest_first { "XREVRANGE" } else { "XRANGE" });
    cmd.arg(key);
    if newest_first {
        cmd.arg(end).arg(start);
    } else {
        cmd.arg(start).arg(end);
    }
    let reply = cmd.arg("COUNT").arg(PAGE).query_async(conn).await?;
    parse_range(reply)
}

/// One page of the dead letters of `stream` that `page.filter` takes, and the id to pass as
/// `after` for the next one (`None`: the scan reached the end).
pub(crate) async fn list(
    conn: &mut Conn,
    stream: &str,
    page: &Page<'_>,
) -> redis::RedisResult<(Vec<DeadLetter>, Option<String>)> {
    let key = routing::dlq_key(stream);
    let (mut start, mut end) = page.filter.range();
    if let Some(after) = page.after {
        if page.newest_first {
            end = format!("({after}");
        } else {
            start = format!("({after}");
        }
    }
    let mut out = Vec::new();
    let mut scanned = 0;
    loop {
        let batch = read(conn, &key, (&start, &end), page.newest_first).await?;
        let n = batch.len();
        for dl in batch {
            scanned += 1;
            let id = dl.id.clone();
            if page.filter.matches(&dl) {
                out.push(dl);
            }
            if out.len() >= page.count || scanned >= LIST_SCAN_BUDGET {
                return Ok((out, Some(id)));
            }
            if page.newest_first {
                end = format!("({id}");
            } else {
                start = format!("({id}");
            }
        }
        if n < PAGE {
            return Ok((out, None));
        }
    }
}

/// The dead letters of `stream` that `filter` takes, oldest first, at most `limit`, and
/// whether more matched; deleted (`XDEL`) unless `dry_run`.
pub(crate) async fn purge(
    conn: &mut Conn,
    stream: &str,
    filter: &Filter,
    limit: usize,
    dry_run: bool,
) -> redis::RedisResult<(Vec<DeadLetter>, bool)> {
    let key = routing::dlq_key(stream);
    let (mut start, end) = filter.range();
    let mut out = Vec::new();
    let more = 'scan: loop {
        let batch = read(conn, &key, (&start, &end), false).await?;
        let n = batch.len();
        for dl in batch {
            start = format!("({}", dl.id);
            if filter.matches(&dl) {
                if out.len() == limit {
                    break 'scan true;
                }
                out.push(dl);
            }
        }
        if n < PAGE {
            break false;
        }
    };
    if !dry_run {
        for chunk in out.chunks(PAGE) {
            let mut cmd = redis::cmd("XDEL");
            cmd.arg(&key);
            for dl in chunk {
                cmd.arg(&dl.id);
            }
            let _: u64 = cmd.query_async(conn).await?;
        }
    }
    Ok((out, more))
}
