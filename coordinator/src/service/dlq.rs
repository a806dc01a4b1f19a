//! Dead letters as a queue (PROTOCOL §18): the depth per group, a filtered and paged list
//! (viewer), a filtered purge with a dry run (admin).

use super::{Coordinator, Result, ServiceError, invalid};
use crate::dlq::{self, Filter, scan};
use rsc_protocol::{DlqGroupDepth, DlqList, DlqPurgeRequest, DlqPurgeResponse, StreamId};
use rsc_redis::Conn;
use tracing::info;

/// Dead letters one list page answers when the request names no count.
pub(crate) const DEFAULT_COUNT: u32 = 100;
/// The most one list page answers.
pub(crate) const MAX_COUNT: u32 = 1_000;
/// Dead letters one purge takes when the request names no limit.
const DEFAULT_PURGE_LIMIT: u32 = 10_000;
/// The most one purge takes.
const MAX_PURGE_LIMIT: u32 = 100_000;

/// What a list asks besides the stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListRequest {
    /// Which dead letters.
    pub filter: Filter,
    /// At most this many (1..=[`MAX_COUNT`], default [`DEFAULT_COUNT`]).
    pub count: Option<u32>,
    /// After this dead-letter id (the previous page's `next_after`).
    pub after: Option<String>,
    /// Newest first.
    pub newest_first: bool,
}

fn data_redis(e: redis::RedisError) -> ServiceError {
    ServiceError::DataRedis(e.to_string())
}

/// Whether `id` is a stream entry id (`<ms>-<seq>` or `<ms>`).
fn is_entry_id(id: &str) -> bool {
    let mut parts = id.splitn(2, '-');
    let digits = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.parse::<u64>().is_ok());
    let ms = parts.next();
    digits(ms) && parts.next().is_none_or(|seq| digits(Some(seq)))
}

impl Coordinator {
    /// A connection to the data Redis, which holds the dead letters.
    async fn dlq_conn(&self) -> Result<Conn> {
        let Some(sealer) = self.sealer.clone() else {
            return Err(invalid(
                "dead letters need the data Redis (--data-redis-url)".into(),
            ));
        };
        sealer.redis().get().await.map_err(data_redis)
    }

    /// Dead letters per group of `stream` (groups without any are absent); `None` without a
    /// data Redis or when it did not answer. For the gauges.
    pub(crate) async fn dlq_depths(&self, stream: &str) -> Option<Vec<DlqGroupDepth>> {
        let mut conn = self.dlq_conn().await.ok()?;
        match self.dlq_depth.depths(&mut conn, stream).await {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::debug!(stream, error = %e, "dead letters not counted");
                None
            }
        }
    }

    /// One page of `stream`'s dead letters that `req.filter` takes, and the depth per group.
    #[tracing::instrument(skip(self, req), fields(group = ?req.filter.group))]
    pub(crate) async fn dlq_list(&self, stream: &StreamId, req: &ListRequest) -> Result<DlqList> {
        let count = req.count.unwrap_or(DEFAULT_COUNT);
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(invalid(format!(
                "count must be 1..={MAX_COUNT}, not {count}"
            )));
        }
        if let Some(a) = &req.after
            && !is_entry_id(a)
        {
            return Err(invalid(format!(
                "after must be a dead-letter id (1767225600000-0), not {a:?}"
            )));
        }
        check_times(&req.filter)?;
        let stream = stream.as_str();
        self.load_stream(stream).await?;
        let mut conn = self.dlq_conn().await?;
        let page = scan::Page {
            filter: &req.filter,
            count: count as usize,
            after: req.after.as_deref(),
            newest_first: req.newest_first,
        };
        let (found, next_after) = scan::list(&mut conn, stream, &page)
            .await
            .map_err(data_redis)?;
        let depth = self
            .dlq_depth
            .depths(&mut conn, stream)
            .await
            .map_err(data_redis)?;
        Ok(DlqList {
            stream: stream.to_owned(),
            entries: found.iter().map(dlq::view).collect(),
            next_after,
            depth,
        })
    }

    /// Deletes (unless `req.dry_run`, the default) the dead letters of `stream` that the
    /// request's filters take, oldest first, at most its limit.
    #[tracing::instrument(skip(self, req), fields(group = ?req.group, dry_run = req.dry_run))]
    pub(crate) async fn dlq_purge(
        &self,
        stream: &StreamId,
        req: &DlqPurgeRequest,
    ) -> Result<DlqPurgeResponse> {
        let limit = req.limit.unwrap_or(DEFAULT_PURGE_LIMIT);
        if !(1..=MAX_PURGE_LIMIT).contains(&limit) {
            return Err(invalid(format!(
                "limit must be 1..={MAX_PURGE_LIMIT}, not {limit}"
            )));
        }
        let filter = Filter {
            group: req.group.as_ref().map(ToString::to_string),
            key: req.key.clone(),
            error: req.error.clone(),
            since_ms: req.since_ms,
            until_ms: req.until_ms,
        };
        check_times(&filter)?;
        let stream = stream.as_str();
        self.load_stream(stream).await?;
        let mut conn = self.dlq_conn().await?;
        let (found, more) = scan::purge(&mut conn, stream, &filter, limit as usize, req.dry_run)
            .await
            .map_err(data_redis)?;
        if !req.dry_run {
            self.dlq_depth.forget(stream).await;
            ::metrics::counter!("rsc_dlq_purged_total", "stream" => stream.to_owned())
                .increment(found.len() as u64);
            info!(stream, purged = found.len(), "dead letters purged");
        }
        Ok(DlqPurgeResponse {
            stream: stream.to_owned(),
            dry_run: req.dry_run,
            purged: found.len() as u64,
            more,
            entries: found.iter().map(dlq::view).collect(),
        })
    }

    /// Forgets the dead-letter counts of `stream` (a redrive removed some).
    pub(crate) async fn dlq_forget(&self, stream: &str) {
        self.dlq_depth.forget(stream).await;
    }
}

/// A time window that ends before it starts is refused.
fn check_times(f: &Filter) -> Result<()> {
    match (f.since_ms, f.until_ms) {
        (Some(s), Some(u)) if u <= s => {
            Err(invalid(format!("until ({u}) must be after since ({s})")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_ids() {
        for ok in ["1-0", "1767225600000-3", "5"] {
            assert!(super::is_entry_id(ok), "{ok}");
        }
        for bad in ["", "-", "1-", "a-0", "1-0-0", "(1-0"] {
            assert!(!super::is_entry_id(bad), "{bad}");
        }
    }
}
