//! The producer: routes each message to its shard (PROTOCOL §3) and `XADD`s it there.
//!
//! The routing (shard count, routing epoch) comes from the coordinator and is cached; it is
//! refreshed in the background once older than the refresh interval (default 1 s), so a
//! reshard reaches producers within about that long, and again after a failed write.
//!
//! Every write is fenced by the routing epoch (ordered resharding, PROTOCOL §15): the `XADD`s of
//! a batch run in one `MULTI`/`EXEC` transaction that `WATCH`es the epoch markers
//! `{<shard key>}:epoch` of their shards, after a small script compared each marker with the
//! producer's routing epoch (and touched any that differs, which aborts the transaction).
//! The coordinator moves the markers at every reshard before answering it, so a write under
//! a stale routing never lands: its `EXEC` answers nil. A refused write writes nothing; the
//! producer fetches the routing again and writes the refused records to their shards under
//! the new epoch, in their order, transparently to the caller. Past [`ProducerBuilder::stale_retry_budget`]
//! without a routing the markers accept (coordinator unreachable), the publish fails with
//! [`ClientError::StaleRouting`] rather than write into a sealed or retired shard.

mod routing;

pub use routing::Routing;

use crate::codec::{Codec, CodecSpec, Json};
use crate::config::ClientConfig;
use crate::error::ClientError;
use redis::aio::ConnectionLike;
use routing::RoutingCache;
use rsc_protocol::entry;
use rsc_redis::LazyRedis;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

/// One message to publish: payload, optional key, headers and extra fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    key: Option<String>,
    payload: Vec<u8>,
    headers: BTreeMap<String, String>,
    fields: Vec<(String, Vec<u8>)>,
    content_type: Option<String>,
}

impl Record {
    /// A record whose payload is `value` as JSON.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self, ClientError> {
        Ok(Record::raw(serde_json::to_vec(value)?))
    }

    /// A record whose payload is `value` encoded with codec `C`, its content type recorded in
    /// the entry's `content_type` field (none for JSON, the default; see [`crate::codec`]).
    pub fn encode<C: Codec, T: Serialize + ?Sized>(value: &T) -> Result<Self, ClientError> {
        let payload = C::encode(value).map_err(|source| ClientError::Codec {
            content_type: C::CONTENT_TYPE,
            source,
        })?;
        let record = Record::raw(payload);
        Ok(if C::CONTENT_TYPE == Json::CONTENT_TYPE {
            record
        } else {
            record.content_type(C::CONTENT_TYPE)
        })
    }

    /// Records the payload's content type in the entry's `content_type` field (e.g.
    /// `application/octet-stream` for raw bytes; listeners of another format refuse it).
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// A record with these payload bytes.
    pub fn raw(payload: impl Into<Vec<u8>>) -> Self {
        Record {
            payload: payload.into(),
            ..Record::default()
        }
    }

    /// Sets the routing key (messages with one key go to one shard, in order).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header (written as the JSON object field `headers`).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Adds an extra entry field (beside `payload`, `key` and `headers`).
    pub fn field(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.fields.push((name.into(), value.into()));
        self
    }

    /// Appends `XADD <shard_key> * payload … [key …] [headers …] [fields …]` to `pipe`.
    fn xadd(&self, pipe: &mut redis::Pipeline, shard_key: &str) {
        pipe.cmd("XADD")
            .arg(shard_key)
            .arg("*")
            .arg(entry::PAYLOAD)
            .arg(&self.payload);
        if let Some(k) = &self.key {
            pipe.arg(entry::KEY).arg(k);
        }
        if let Some(ct) = &self.content_type {
            pipe.arg(entry::CONTENT_TYPE).arg(ct);
        }
        if !self.headers.is_empty() {
            pipe.arg(entry::HEADERS)
                .arg(serde_json::to_string(&self.headers).unwrap_or_default());
        }
        for (n, v) in &self.fields {
            pipe.arg(n).arg(v);
        }
    }
}

/// Where a message was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The shard index.
    pub shard: u32,
    /// The entry id Redis assigned.
    pub id: String,
}

/// Publishes messages to sharded streams. Cheap to clone (shares its connection and cache).
///
/// ```no_run
/// # async fn demo() -> Result<(), rsc_client::ClientError> {
/// use rsc_client::producer::{Producer, Record};
///
/// let producer = Producer::builder()
///     .coordinator("http://127.0.0.1:7070")
///     .redis_url("redis://127.0.0.1:6379")
///     .build()?;
/// let at = producer.publish("orders", Some("customer-42"), &serde_json::json!({"total": 10})).await?;
/// println!("written to shard {} as {}", at.shard, at.id);
/// let batch = (0..100).map(|i| Record::json(&i).map(|r| r.key(format!("k{i}"))));
/// producer.publish_batch("orders", batch.collect::<Result<Vec<_>, _>>()?).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

struct Inner {
    conn: LazyRedis,
    /// The data Redis in errors (password hidden).
    label: String,
    /// On a cluster a pipeline stays within one slot: one pipeline per shard.
    cluster: bool,
    routes: Arc<RoutingCache>,
    round_robin: AtomicU64,
    stale_budget: Duration,
    /// How [`Producer::publish`] encodes payloads.
    codec: CodecSpec,
    /// `WAIT` after each pipeline: (replicas, timeout).
    wait: Option<(u32, Duration)>,
    /// The epoch check ran once on this Redis (see [`Producer::probe_check`]).
    check_usable: AtomicBool,
    /// The coordinators' base URLs, for [`Producer::not_ready`].
    coordinators: Vec<String>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

/// Builds a [`Producer`].
#[derive(Debug)]
pub struct ProducerBuilder {
    config: ClientConfig,
    refresh_every: Duration,
    stale_budget: Duration,
    codec: CodecSpec,
    wait: Option<(u32, Duration)>,
}

impl ProducerBuilder {
    crate::config::connection_setters!();

    /// Durability: after writing, a publish waits until `replicas` replicas have the entries
    /// (`WAIT replicas timeout`, on the same pipeline) and fails with
    /// [`ClientError::NotReplicated`] when fewer confirm within `timeout`. With it, an entry
    /// reported published survives a failover to any replica that confirmed it (Redis
    /// replication is otherwise asynchronous: a master killed before its replicas read the
    /// entry loses it). Cost: each publish waits one replication round trip (about the
    /// replicas' network latency; a lagging replica makes publishes wait up to `timeout`).
    /// Default: off (`RSC_PUBLISH_WAIT_REPLICAS`, `RSC_PUBLISH_WAIT_TIMEOUT_MS`).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// How old a cached routing may get before it is refreshed (default 1 s).
    pub fn refresh_every(mut self, every: Duration) -> Self {
        self.refresh_every = every;
        self
    }

    /// How long a publish keeps retrying records refused for a stale routing epoch (fetching
    /// the routing again between tries) before it fails with [`ClientError::StaleRouting`]
    /// (default 10 s).
    pub fn stale_retry_budget(mut self, budget: Duration) -> Self {
        self.stale_budget = budget;
        self
    }

    /// How [`Producer::publish`] encodes payloads (default [`Json`]); a codec other than JSON
    /// records its content type in each entry's `content_type` field.
    pub fn codec<C: Codec>(mut self) -> Self {
        self.codec = CodecSpec::of::<C>();
        self
    }

    /// Creates the producer (Redis is connected on first use).
    pub fn build(self) -> Result<Producer, ClientError> {
        let coord = self.config.coordinator()?;
        let redis = self
            .config
            .data_redis_with(&crate::data::PRODUCER_SETTINGS)?;
        Ok(Producer {
            inner: Arc::new(Inner {
                cluster: redis.is_cluster(),
                conn: redis,
                label: self.config.data_redis_label(),
                routes: Arc::new(RoutingCache::new(coord, self.refresh_every)),
                round_robin: AtomicU64::new(0),
                stale_budget: self.stale_budget,
                check_usable: AtomicBool::new(false),
                codec: self.codec,
                wait: self.wait,
                coordinators: (self.config.coordinator_urls.iter())
                    .map(|u| u.trim().trim_end_matches('/').to_owned())
                    .collect(),
            }),
        })
    }
}

impl Producer {
    /// A builder, starting from the environment (`RSC_COORDINATOR_URL`, `RSC_REDIS_URL`,
    /// `RSC_TOKEN`).
    pub fn builder() -> ProducerBuilder {
        let env = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        ProducerBuilder {
            config: ClientConfig::from_env(),
            refresh_every: Duration::from_secs(1),
            stale_budget: Duration::from_secs(10),
            codec: CodecSpec::JSON,
            wait: env("RSC_PUBLISH_WAIT_REPLICAS")
                .filter(|&n| n > 0)
                .map(|n| {
                    let ms = env("RSC_PUBLISH_WAIT_TIMEOUT_MS").unwrap_or(1_000);
                    (n as u32, Duration::from_millis(ms))
                }),
        }
    }

    /// Why the producer could not publish now (`None`: it could): the data Redis does not
    /// answer `PING`, or no coordinator answers its `/readyz` (each within 1 s). For a
    /// producer pod's readiness probe (see `ops::Ops` with the `ops` feature).
    pub async fn not_ready(&self) -> Option<String> {
        const BOUND: Duration = Duration::from_secs(1);
        let mut conn = self.inner.conn.clone();
        let ping = redis::cmd("PING");
        match tokio::time::timeout(BOUND, ping.query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Some(format!("data Redis {}: {e}", self.inner.label)),
            Err(_) => {
                return Some(format!(
                    "data Redis {}: no answer to PING within {BOUND:?}",
                    self.inner.label
                ));
            }
        }
        let http = reqwest::Client::new();
        let mut errors = Vec::new();
        for base in &self.inner.coordinators {
            let get = http.get(format!("{base}/readyz")).timeout(BOUND).send();
            match get.await {
                Ok(r) if r.status().is_success() => return None,
                Ok(r) => errors.push(format!("{base}: {}", r.status())),
                Err(e) => errors.push(format!("{base}: {e}")),
            }
        }
        Some(format!("no coordinator ready ({})", errors.join("; ")))
    }

    /// Publishes `payload` with the producer's codec (JSON unless
    /// [`ProducerBuilder::codec`] says otherwise), routed by `key` (round-robin without one).
    pub async fn publish<T: Serialize + ?Sized>(
        &self,
        stream: &str,
        key: Option<&str>,
        payload: &T,
    ) -> Result<Published, ClientError> {
        let codec = &self.inner.codec;
        let mut record = if codec.is_json() {
            Record::json(payload)?
        } else {
            Record::raw(codec.encode(payload).map_err(|source| ClientError::Codec {
                content_type: codec.content_type,
                source,
            })?)
            .content_type(codec.content_type)
        };
        record.key = key.map(str::to_owned);
        self.publish_record(stream, record).await
    }

    /// Publishes one record.
    pub async fn publish_record(
        &self,
        stream: &str,
        record: Record,
    ) -> Result<Published, ClientError> {
        let mut out = self.publish_batch(stream, [record]).await?;
        Ok(out.remove(0))
    }

    /// Publishes records in one pipeline (one round trip, one fenced transaction), each to
    /// its shard; on a Redis Cluster, one transaction per shard (a transaction stays within
    /// one slot), all sent at once. Returns where each went, in order.
    /// Per-key order is kept within the batch and across a reshard: the writes of one shard
    /// are fenced by the routing epoch, and records refused for a stale epoch are written
    /// again, in order, on their shard under the new routing.
    pub async fn publish_batch(
        &self,
        stream: &str,
        records: impl IntoIterator<Item = Record>,
    ) -> Result<Vec<Published>, ClientError> {
        let trace = crate::otel::current();
        let mut records: Vec<Record> = records.into_iter().collect();
        for record in &mut records {
            crate::otel::inject(&mut record.headers, &trace);
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let seqs = self.round_robin(&records);
        let mut routing = self.inner.routes.get(stream).await?;
        let mut out: Vec<Option<Published>> = vec![None; records.len()];
        let mut todo: Vec<usize> = (0..records.len()).collect();
        let started = Instant::now();
        let mut delay = Duration::from_millis(2);
        loop {
            let sent = self.send_guarded(&routing, &records, &seqs, &todo).await;
            let (written, refused, acked) = match sent {
                Ok(r) => r,
                Err(e) => {
                    self.inner.routes.mark_stale(stream);
                    metrics::counter!("rsc_client_publish_errors_total", "stream" => stream.to_owned())
                        .increment(1);
                    return Err(self.redis_error(e));
                }
            };
            if let Some((wanted, _)) = self.inner.wait
                && acked < wanted
                && !written.is_empty()
            {
                metrics::counter!("rsc_client_publish_unreplicated_total", "stream" => stream.to_owned())
                    .increment(written.len() as u64);
                return Err(ClientError::NotReplicated { acked, wanted });
            }
            metrics::counter!("rsc_client_published_total", "stream" => stream.to_owned())
                .increment(written.len() as u64);
            for (i, p) in written {
                out[i] = Some(p);
            }
            let Some(marker) = refused.iter().map(|&(_, m)| m).max() else {
                break;
            };
            todo = refused.into_iter().map(|(i, _)| i).collect();
            metrics::counter!("rsc_client_publish_stale_total", "stream" => stream.to_owned())
                .increment(todo.len() as u64);
            let stale = Stale {
                stream,
                marker,
                records: todo.len(),
                started,
            };
            routing = self.newer_routing(&stale, &routing, &mut delay).await?;
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// A publish's Redis error; one of the connection (refused, dropped, timed out) names
    /// the data Redis.
    fn redis_error(&self, e: redis::RedisError) -> ClientError {
        if e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.is_io_error()
        {
            ClientError::DataRedisUnreachable {
                url: self.inner.label.clone(),
                source: e,
            }
        } else {
            e.into()
        }
    }

    /// The round-robin sequence number of each record without a key (0 for those with one).
    fn round_robin(&self, records: &[Record]) -> Vec<u64> {
        records
            .iter()
            .map(|r| {
                if r.key.is_none() {
                    self.inner.round_robin.fetch_add(1, Ordering::Relaxed)
                } else {
                    0
                }
            })
            .collect()
    }

    /// After records were refused for a stale routing epoch: refreshes the routing until the
    /// coordinator answers with a newer one (it moves the markers before it answers the
    /// reshard, so the answer follows at once), within the producer's retry budget.
    async fn newer_routing(
        &self,
        stale: &Stale<'_>,
        routing: &Routing,
        delay: &mut Duration,
    ) -> Result<Arc<Routing>, ClientError> {
        let stream = stale.stream;
        loop {
            if stale.started.elapsed() >= self.inner.stale_budget {
                warn!(
                    stream,
                    routing_epoch = routing.routing_epoch,
                    marker = stale.marker,
                    records = stale.records,
                    "publish refused for a stale routing epoch and no newer routing within the retry budget"
                );
                return Err(ClientError::StaleRouting {
                    stream: stream.to_owned(),
                    routing_epoch: routing.routing_epoch,
                    shard_epoch: stale.marker,
                });
            }
            match self.inner.routes.fetch(stream).await {
                Ok(r) if r.routing_epoch != routing.routing_epoch => {
                    debug!(
                        stream,
                        from = routing.routing_epoch,
                        to = r.routing_epoch,
                        records = stale.records,
                        "writing refused records again under the new routing"
                    );
                    return Ok(r);
                }
                Ok(_) => {}
                Err(e) => debug!(stream, error = %e, "routing refresh failed"),
            }
            tokio::time::sleep(*delay).await;
            *delay = (*delay * 2).min(Duration::from_millis(200));
        }
    }

    /// Writes the records `todo` (indices, in order) under `routing`: one fenced transaction
    /// for the whole batch (standalone), or one per shard sent at once (cluster). Returns the
    /// records written with where they went, those refused with the highest epoch marker
    /// that refused them, and how many replicas confirmed (`WAIT`; the fewest, `u32::MAX`
    /// without it).
    #[allow(clippy::type_complexity)]
    async fn send_guarded(
        &self,
        routing: &Routing,
        records: &[Record],
        seqs: &[u64],
        todo: &[usize],
    ) -> redis::RedisResult<(Vec<(usize, Published)>, Vec<(usize, u64)>, u32)> {
        let placed: Vec<(usize, u32)> = todo
            .iter()
            .map(|&i| {
                let key = records[i].key.as_deref().map(str::as_bytes);
                (i, routing.shard_for(key, seqs[i]))
            })
            .collect();
        self.probe_check(routing).await?;
        let parts: Vec<Vec<(usize, u32)>> = if self.inner.cluster {
            let mut by_shard: BTreeMap<u32, Vec<(usize, u32)>> = BTreeMap::new();
            for &(i, shard) in &placed {
                by_shard.entry(shard).or_default().push((i, shard));
            }
            by_shard.into_values().collect()
        } else {
            vec![placed]
        };
        let sends = parts.into_iter().map(|part| async move {
            let (pipe, rings) = self.fenced_pipeline(routing, records, &part);
            let values = self
                .inner
                .conn
                .clone()
                .req_packed_commands(&pipe, 0, pipe.len())
                .await?;
            let outcome = Fenced::read(values, part.len(), rings, self.inner.wait.is_some())?;
            Ok::<_, redis::RedisError>((part, outcome))
        });
        let mut written = Vec::new();
        let mut refused = Vec::new();
        let mut fewest = u32::MAX;
        for (part, outcome) in futures::future::try_join_all(sends).await? {
            fewest = fewest.min(outcome.acked);
            match outcome.ids {
                Some(ids) => written.extend(
                    part.into_iter()
                        .zip(ids)
                        .map(|((i, shard), id)| (i, Published { shard, id })),
                ),
                // The markers moved after the check: at least one epoch on.
                None => {
                    let marker = outcome.marker.unwrap_or(routing.routing_epoch + 1);
                    refused.extend(part.into_iter().map(|(i, _)| (i, marker)));
                }
            }
        }
        Ok((written, refused, fewest))
    }

    /// Before the first fenced write: runs the epoch check once without keys. A transaction
    /// whose check fails to run (scripting disabled, `EVAL` denied by an ACL) would still run
    /// its `XADD`s, unchecked; this refuses to publish instead, writing nothing.
    async fn probe_check(&self, routing: &Routing) -> redis::RedisResult<()> {
        if self.inner.check_usable.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut probe = redis::cmd("EVAL");
        probe
            .arg(epoch_check_body())
            .arg(0)
            .arg(routing.routing_epoch);
        // On a cluster a command without keys goes to any node: each runs scripts alike.
        let _: redis::Value = probe.query_async(&mut self.inner.conn.clone()).await?;
        self.inner.check_usable.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// `WATCH <markers>; EVAL <check> <markers> <epoch>; MULTI; XADD …; PUBLISH <ring> …; EXEC
    /// [; WAIT]` for the records `part` (index, shard), in order, and how many rings it
    /// queued. One pipeline, so nothing else sent on the shared connection comes between the
    /// `WATCH` and the `EXEC`. `EVAL` rather than `EVALSHA`: a `NOSCRIPT` would let the
    /// transaction run unchecked.
    fn fenced_pipeline(
        &self,
        routing: &Routing,
        records: &[Record],
        part: &[(usize, u32)],
    ) -> (redis::Pipeline, usize) {
        let mut shards: Vec<u32> = part.iter().map(|&(_, s)| s).collect();
        shards.sort_unstable();
        shards.dedup();
        let markers: Vec<String> = shards
            .iter()
            .map(|&s| rsc_protocol::routing::epoch_key(&routing.shard_keys[s as usize]))
            .collect();
        let mut pipe = redis::pipe();
        pipe.cmd("WATCH").arg(&markers);
        pipe.cmd("EVAL")
            .arg(epoch_check_body())
            .arg(markers.len())
            .arg(&markers)
            .arg(routing.routing_epoch);
        pipe.cmd("MULTI");
        for &(i, shard) in part {
            records[i].xadd(&mut pipe, &routing.shard_keys[shard as usize]);
        }
        let rings = self.ring(&mut pipe, routing, &shards);
        pipe.cmd("EXEC");
        if let Some((replicas, timeout)) = self.inner.wait {
            pipe.cmd("WAIT")
                .arg(replicas)
                .arg(timeout.as_millis() as u64);
        }
        (pipe, rings)
    }

    /// Raw pipelined `XADD`s without the epoch fence (the bench baseline for P8; not per-key
    /// order safe across a reshard).
    #[doc(hidden)]
    pub async fn publish_batch_unfenced(
        &self,
        stream: &str,
        records: &[Record],
    ) -> Result<Vec<Published>, ClientError> {
        let routing = self.inner.routes.get(stream).await?;
        let shards: Vec<u32> = records
            .iter()
            .map(|r| {
                let seq = self.inner.round_robin.fetch_add(1, Ordering::Relaxed);
                routing.shard_for(r.key.as_deref().map(str::as_bytes), seq)
            })
            .collect();
        let (ids, _acked) = if self.inner.cluster {
            self.xadd_per_shard(&routing, &shards, records).await?
        } else {
            let mut pipe = redis::pipe();
            for (record, &shard) in records.iter().zip(&shards) {
                record.xadd(&mut pipe, &routing.shard_keys[shard as usize]);
            }
            let mut touched = shards.clone();
            touched.sort_unstable();
            touched.dedup();
            let rings = self.ring(&mut pipe, &routing, &touched);
            self.send(pipe, rings).await?
        };
        Ok(shards
            .into_iter()
            .zip(ids)
            .map(|(shard, id)| Published { shard, id })
            .collect())
    }

    /// One pipeline per shard (a cluster pipeline stays within one slot), all sent at once;
    /// the ids in the records' order.
    async fn xadd_per_shard(
        &self,
        routing: &Routing,
        shards: &[u32],
        records: &[Record],
    ) -> redis::RedisResult<(Vec<String>, u32)> {
        let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, &shard) in shards.iter().enumerate() {
            by_shard.entry(shard).or_default().push(i);
        }
        let sends = by_shard.into_iter().map(|(shard, idx)| {
            let mut pipe = redis::pipe();
            for &i in &idx {
                records[i].xadd(&mut pipe, &routing.shard_keys[shard as usize]);
            }
            async move {
                let (ids, acked) = self.send(pipe, 0).await?;
                Ok::<_, redis::RedisError>((idx.into_iter().zip(ids), acked))
            }
        });
        let mut out = vec![String::new(); shards.len()];
        let mut fewest = u32::MAX;
        for (part, acked) in futures::future::try_join_all(sends).await? {
            fewest = fewest.min(acked);
            for (i, id) in part {
                out[i] = id;
            }
        }
        Ok((out, fewest))
    }

    /// Sends a pipeline of `XADD`s followed by `rings` doorbell rings, with `WAIT` at its end
    /// when the producer waits for replicas: the entry ids, and how many replicas confirmed
    /// (`u32::MAX` without `WAIT`).
    async fn send(
        &self,
        mut pipe: redis::Pipeline,
        rings: usize,
    ) -> redis::RedisResult<(Vec<String>, u32)> {
        let mut conn = self.inner.conn.clone();
        if let Some((replicas, timeout)) = self.inner.wait {
            pipe.cmd("WAIT")
                .arg(replicas)
                .arg(timeout.as_millis() as u64);
        }
        let mut values: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let acked = match self.inner.wait {
            None => u32::MAX,
            Some(_) => match values.pop() {
                Some(redis::Value::Int(n)) => n.max(0) as u32,
                _ => 0,
            },
        };
        values.truncate(values.len().saturating_sub(rings));
        let ids = redis::from_redis_value(redis::Value::Array(values))?;
        Ok((ids, acked))
    }

    /// Appends a ring of each shard's doorbell (`PUBLISH {<shard key>}:ring ""`, PROTOCOL
    /// §16) to `pipe`, so that consumers waiting on those shards read at once; `shards` are
    /// distinct. Returns how many were appended: none on a Redis Cluster, whose consumers
    /// wait in blocked reads (a `PUBLISH` there reaches every node).
    fn ring(&self, pipe: &mut redis::Pipeline, routing: &Routing, shards: &[u32]) -> usize {
        if self.inner.cluster {
            return 0;
        }
        for &s in shards {
            pipe.cmd("PUBLISH")
                .arg(rsc_protocol::routing::ring_channel(
                    &routing.shard_keys[s as usize],
                ))
                .arg("");
        }
        shards.len()
    }

    /// The routing the producer uses now for `stream` (fetched if unknown).
    pub async fn routing(&self, stream: &str) -> Result<Arc<Routing>, ClientError> {
        self.inner.routes.get(stream).await
    }

    /// Fetches the routing of `stream` now (e.g. right after a reshard).
    pub async fn refresh_routing(&self, stream: &str) -> Result<Arc<Routing>, ClientError> {
        self.inner.routes.fetch(stream).await
    }
}
/// The epoch check script without its comment lines: `EVAL` sends it with every batch, and
/// Redis hashes what it is sent.
fn epoch_check_body() -> &'static str {
    static BODY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        rsc_protocol::routing::EPOCH_CHECK_LUA
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
    });
    &BODY
}

/// The answer to one [`Producer::fenced_pipeline`].
#[derive(Debug)]
struct Fenced {
    /// The entry ids, in the records' order; `None`: refused (nothing written).
    ids: Option<Vec<String>>,
    /// The highest epoch marker that refused the write, when the check did.
    marker: Option<u64>,
    /// Replicas that confirmed (`u32::MAX` without `WAIT`).
    acked: u32,
}

impl Fenced {
    /// Reads the replies `OK, <check>, OK, QUEUED × (n + rings), <EXEC> [, <WAIT>]` (the
    /// `rings` doorbell rings queued after the `n` `XADD`s).
    fn read(
        mut values: Vec<redis::Value>,
        n: usize,
        rings: usize,
        wait: bool,
    ) -> redis::RedisResult<Self> {
        use redis::Value;
        let acked = if wait {
            match values.pop() {
                Some(Value::Int(k)) => k.max(0) as u32,
                _ => 0,
            }
        } else {
            u32::MAX
        };
        if values.len() != n + rings + 4 {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "fenced write: unexpected number of replies",
            )));
        }
        // A server error anywhere (a queued XADD refused, an EXECABORT) fails the publish.
        if let Some(Value::ServerError(e)) =
            values.iter().find(|v| matches!(v, Value::ServerError(_)))
        {
            if matches!(values.get(1), Some(Value::ServerError(_)))
                && matches!(values.last(), Some(Value::Array(_)))
            {
                warn!(error = ?e, "the epoch check failed but the XADDs ran: written unchecked");
            }
            return Err(e.clone().into());
        }
        let marker = match &values[1] {
            Value::Int(m) => Some((*m).max(0) as u64),
            _ => None,
        };
        let ids = match values.pop() {
            Some(Value::Nil) | None => None,
            Some(Value::Array(replies)) => {
                if let Some(Value::ServerError(e)) =
                    replies.iter().find(|v| matches!(v, Value::ServerError(_)))
                {
                    return Err(e.clone().into());
                }
                let mut replies = replies;
                replies.truncate(n);
                let ids: Vec<String> = redis::from_redis_value(Value::Array(replies))?;
                if ids.len() != n {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "fenced write: EXEC returned another number of ids",
                    )));
                }
                Some(ids)
            }
            Some(other) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "fenced write: unexpected EXEC reply",
                    format!("{other:?}"),
                )));
            }
        };
        Ok(Fenced { ids, marker, acked })
    }
}

/// Records refused for a stale routing epoch: what the routing refresh reports.
struct Stale<'a> {
    stream: &'a str,
    /// The highest epoch marker among the refusing shards.
    marker: u64,
    /// How many records wait.
    records: usize,
    /// When the publish began (the retry budget counts from it).
    started: Instant,
}
