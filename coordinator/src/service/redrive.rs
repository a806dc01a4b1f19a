//! Dead-letter redrive (admin; PROTOCOL §18): a group's dead letters republished through
//! the stream's routing, then removed from `<stream>:dlq`.

use super::{Coordinator, Result, ServiceError, invalid};
use crate::retention::redrive::{self, Republish};
use rsc_protocol::StreamId;
use rsc_protocol::{RedriveRequest, RedriveResponse, RedrivenEntry, routing};
use rsc_redis::Conn;
use std::collections::BTreeMap;
use tracing::{info, warn};

/// Dead letters one redrive takes when the request names no limit.
const DEFAULT_LIMIT: u32 = 1_000;
/// The most one redrive takes.
const MAX_LIMIT: u32 = 10_000;
/// Routings tried before a redrive whose writes keep being refused (reshards in a row) gives
/// up on the rest.
const MAX_ROUTINGS: usize = 5;

fn data_redis(e: redis::RedisError) -> ServiceError {
    ServiceError::DataRedis(e.to_string())
}

impl Coordinator {
    /// Republishes the dead letters of `req.group` in `<stream>:dlq` (oldest first, those
    /// since `req.since_ms`, at most `req.limit`) to their shards under the stream's current
    /// routing, each shard's in one fenced transaction, and removes each shard's from the
    /// dead-letter stream once its `EXEC` confirmed the write. A crash between the two
    /// leaves both copies (redriven again later: a duplicate, never a loss). A dry run
    /// reads only.
    #[tracing::instrument(skip(self, req), fields(group = %req.group, dry_run = req.dry_run))]
    pub async fn redrive(
        &self,
        stream: &StreamId,
        req: &RedriveRequest,
    ) -> Result<RedriveResponse> {
        let stream = stream.as_str();
        let limit = req.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(invalid(format!(
                "limit must be 1..={MAX_LIMIT}, not {limit}"
            )));
        }
        let Some(sealer) = self.sealer.clone() else {
            return Err(invalid(
                "redrive needs the data Redis (--data-redis-url)".into(),
            ));
        };
        let mut doc = self.load_stream(stream).await?.doc;
        let group = self.load_group(&req.group).await?.doc;
        if group.stream != stream {
            return Err(invalid(format!(
                "group {} reads stream {}, not {stream}",
                req.group, group.stream
            )));
        }
        let mut conn = sealer.redis().get().await.map_err(data_redis)?;
        let found = redrive::scan(&mut conn, stream, &req.group, req.since_ms, limit as usize)
            .await
            .map_err(data_redis)?;
        let mut placed: Vec<(u32, Option<String>)> = found
            .iter()
            .enumerate()
            .map(|(i, r)| (r.shard(doc.shard_count, i as u64), None))
            .collect();
        if !req.dry_run {
            let mut todo: Vec<usize> = (0..found.len()).collect();
            for _ in 0..MAX_ROUTINGS {
                for &i in &todo {
                    placed[i].0 = found[i].shard(doc.shard_count, i as u64);
                }
                todo = self
                    .write_placed(
                        &mut conn,
                        stream,
                        doc.routing_epoch,
                        &found,
                        &mut placed,
                        &todo,
                    )
                    .await?;
                if todo.is_empty() {
                    break;
                }
                doc = self.load_stream(stream).await?.doc;
            }
            if !todo.is_empty() {
                warn!(
                    stream,
                    left = todo.len(),
                    "redrive refused under every routing tried"
                );
                return Err(ServiceError::DataRedis(format!(
                    "{} dead letters not redriven: the stream's routing kept changing (a \
                     reshard); they stay in {}, redrive again",
                    todo.len(),
                    routing::dlq_key(stream)
                )));
            }
            ::metrics::counter!("rsc_dlq_redriven_total", "stream" => stream.to_owned(), "group" => req.group.to_string())
                .increment(found.len() as u64);
            info!(stream, redriven = found.len(), "dead letters redriven");
            self.dlq_forget(stream).await;
        }
        Ok(response(stream, req, &found, placed))
    }

    /// Writes the dead letters `todo` (indices into `found`, oldest first) to the shards
    /// `placed` names, one fenced transaction per shard, and removes each confirmed shard's
    /// from the dead-letter stream. Returns those refused for a stale routing epoch.
    async fn write_placed(
        &self,
        conn: &mut Conn,
        stream: &str,
        epoch: u64,
        found: &[Republish],
        placed: &mut [(u32, Option<String>)],
        todo: &[usize],
    ) -> Result<Vec<usize>> {
        let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in todo {
            by_shard.entry(placed[i].0).or_default().push(i);
        }
        let cluster = conn.is_cluster();
        let mut refused = Vec::new();
        for (shard, idx) in by_shard {
            let key = routing::shard_key(stream, shard);
            let batch: Vec<&Republish> = idx.iter().map(|&i| &found[i]).collect();
            let Some(ids) = redrive::write_shard(conn, &key, epoch, &batch, cluster)
                .await
                .map_err(data_redis)?
            else {
                refused.extend(idx);
                continue;
            };
            let dlq_ids: Vec<&str> = batch.iter().map(|r| r.dlq_id.as_str()).collect();
            redrive::remove(conn, stream, &dlq_ids)
                .await
                .map_err(data_redis)?;
            for (&i, id) in idx.iter().zip(ids) {
                placed[i].1 = Some(id);
            }
        }
        refused.sort_unstable();
        Ok(refused)
    }
}

/// The answer: every dead letter taken, where it went (or would go).
fn response(
    stream: &str,
    req: &RedriveRequest,
    found: &[Republish],
    placed: Vec<(u32, Option<String>)>,
) -> RedriveResponse {
    let entries: Vec<RedrivenEntry> = found
        .iter()
        .zip(placed)
        .map(|(r, (shard, id))| RedrivenEntry {
            dlq_id: r.dlq_id.clone(),
            key: r.key.clone(),
            shard,
            id,
            error: r.error.clone(),
            redrive_count: r.redrive_count,
        })
        .collect();
    RedriveResponse {
        stream: stream.to_owned(),
        group: req.group.to_string(),
        dry_run: req.dry_run,
        redriven: entries.len() as u64,
        entries,
    }
}
