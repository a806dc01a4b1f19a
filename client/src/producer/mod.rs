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
//!
//! An idempotent producer (the default, PROTOCOL §21) also `WATCH`es its producer record on
//! each shard; the same script refuses, and answers with their entry ids, the records an
//! earlier attempt of the publish wrote, and the transaction records the highest sequence
//! written (module `write`). It also passes the highest sequence it knows it wrote to each
//! shard: a record found behind it is a loss (writes reported published and gone, e.g. a
//! failover without `WAIT`), logged, counted and kept for [`Producer::lost_writes`].

mod routing;
mod write;

pub use routing::Routing;

use crate::codec::{Codec, CodecSpec, Json};
use crate::config::ClientConfig;
use crate::error::ClientError;
use redis::aio::ConnectionLike;
use routing::RoutingCache;
use rsc_protocol::entry;
use rsc_redis::LazyRedis;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

/// How long a producer record is kept after its last write unless
/// [`ProducerBuilder::idempotence_ttl`] says otherwise: one day, as Kafka's
/// `producer.id.expiration.ms`, far above any retry budget.
pub const DEFAULT_IDEMPOTENCE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The default [`ProducerBuilder::delivery_timeout`]: Kafka's `delivery.timeout.ms`.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

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

    /// Appends `XADD <shard_key> * payload … [key …] [headers …] [fields …]` to `pipe`, and
    /// `producer_id <id> producer_seq <seq>` last with `idem` (PROTOCOL §2.2, §21).
    fn xadd(&self, pipe: &mut redis::Pipeline, shard_key: &str, idem: Option<(&str, u64)>) {
        pipe.cmd("XADD").arg(shard_key).arg("*");
        self.field_args(pipe);
        if let Some((id, seq)) = idem {
            pipe.arg(entry::PRODUCER_ID).arg(id);
            pipe.arg(entry::PRODUCER_SEQ).arg(seq);
        }
    }

    /// Appends the entry's fields to the last command of `pipe`: `payload`, then `key`,
    /// `content_type` and `headers` when set, then the record's own fields (PROTOCOL §2.2).
    fn field_args(&self, pipe: &mut redis::Pipeline) {
        pipe.arg(entry::PAYLOAD).arg(&self.payload);
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

/// Writes of this producer that a publish had reported written and that a later write to the
/// same shard found gone (PROTOCOL §21 "Across a failover"): the shard's producer record was
/// behind the highest sequence the producer id had written there — a failover to a replica
/// that had not received them, without [`ProducerBuilder::wait_for_replicas`], or the record
/// deleted. Read with [`Producer::lost_writes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWrites {
    /// The stream.
    pub stream: String,
    /// The shard index (under the routing of the write that found the loss).
    pub shard: u32,
    /// The producer id (the entries' `producer_id` field).
    pub producer_id: String,
    /// The lowest sequence lost (`producer_seq`; the record's `s` plus one).
    pub first_seq: u64,
    /// The highest sequence lost: the highest the producer id had written to the shard.
    pub last_seq: u64,
}

/// How many detected losses [`Producer::lost_writes`] keeps (the oldest are dropped first).
pub const LOST_WRITES_KEPT: usize = 1024;

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
    /// Idempotence (PROTOCOL §21): the idle time after which a producer record expires;
    /// `None`: off.
    idempotence: Option<Duration>,
    /// An idempotent producer also writes `producer_id` and `producer_seq` in every entry.
    producer_fields: bool,
    /// How long a publish sends its records again after errors that may have written them.
    retry_budget: Duration,
    /// How long a publish waits for its stream's routing ([`ProducerBuilder::delivery_timeout`]).
    delivery_timeout: Duration,
    /// The idle lanes of an idempotent producer.
    lanes: std::sync::Mutex<Vec<Lane>>,
    /// The last [`LOST_WRITES_KEPT`] losses detected, oldest first ([`Producer::lost_writes`]).
    lost: std::sync::Mutex<std::collections::VecDeque<LostWrites>>,
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
    idempotent: bool,
    idempotence_ttl: Duration,
    producer_fields: bool,
    retry_budget: Duration,
    delivery_timeout: Duration,
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

    /// Idempotence (PROTOCOL §21; default on): each publish carries a producer id and
    /// sequence numbers, checked against the producer's record on each shard (not written in
    /// the entries unless [`ProducerBuilder::producer_fields`]), and the write to a
    /// shard, in the same round trip, skips the records that an earlier attempt of the same
    /// publish wrote, so a publish sent again after a lost reply, a dropped connection or a
    /// `WAIT` not confirmed writes each record once. Off: such a publish fails at once and
    /// sending it again may write it twice (at-least-once).
    pub fn idempotent(mut self, on: bool) -> Self {
        self.idempotent = on;
        self
    }

    /// Consumer-side deduplication (PROTOCOL §21; default off): an idempotent producer also
    /// writes its producer id and each record's sequence in every entry (the fields
    /// `producer_id`, `producer_seq`; `Message::producer_seq()`), a stable key a handler may
    /// deduplicate redeliveries on. The producer's own duplicate check does not need them;
    /// they cost Redis about a quarter more per `XADD` (docs/benchmarks/HISTORY.md). Also
    /// `RSC_PUBLISH_PRODUCER_FIELDS=true`.
    pub fn producer_fields(mut self, on: bool) -> Self {
        self.producer_fields = on;
        self
    }

    /// How long a producer record (`{<shard key>}:producer:<id>`, one per producer id and
    /// shard written) is kept after its last write (default 24 h, as Kafka's
    /// `producer.id.expiration.ms`): it must outlive any retry of a publish; it expires so
    /// that short-lived producers leave nothing behind.
    pub fn idempotence_ttl(mut self, ttl: Duration) -> Self {
        self.idempotence_ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// How long an idempotent publish keeps sending its records again after an error that
    /// may have written them (a dropped connection, a timeout, a failover under way) or a
    /// `WAIT` not confirmed, before it fails with that error (default 10 s).
    pub fn retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// How long a publish may wait for its stream's routing before it fails with
    /// [`ClientError::DeliveryTimeout`] (default 120 s, as Kafka's `delivery.timeout.ms`;
    /// `RSC_PUBLISH_DELIVERY_TIMEOUT_MS`): while the coordinator answers that the stream
    /// does not exist (a store being restored, PROTOCOL §2.3) or cannot be reached, the
    /// publish asks again with a backoff instead of failing at once or waiting for ever. A
    /// routing refresh answered `STREAM_NOT_FOUND` drops the cached routing, so a producer
    /// never keeps writing to a stream that is gone.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
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
                idempotence: self.idempotent.then_some(self.idempotence_ttl),
                producer_fields: self.producer_fields,
                retry_budget: self.retry_budget,
                delivery_timeout: self.delivery_timeout,
                lanes: std::sync::Mutex::new(Vec::new()),
                lost: std::sync::Mutex::new(std::collections::VecDeque::new()),
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
            idempotent: true,
            idempotence_ttl: DEFAULT_IDEMPOTENCE_TTL,
            producer_fields: std::env::var("RSC_PUBLISH_PRODUCER_FIELDS").is_ok_and(|v| {
                matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes")
            }),
            retry_budget: Duration::from_secs(10),
            delivery_timeout: env("RSC_PUBLISH_DELIVERY_TIMEOUT_MS")
                .map_or(DEFAULT_DELIVERY_TIMEOUT, Duration::from_millis),
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

    /// Publishes records in one pipeline (one round trip: one `MULTI`/`EXEC` transaction), each
    /// to its shard; on a Redis Cluster, one pipeline and transaction per shard, all sent at
    /// once.
    /// Returns where each went, in order.
    /// Per-key order is kept within the batch and across a reshard: the writes of one shard
    /// are fenced by the routing epoch, and records refused for a stale epoch are written
    /// again, in order, on their shard under the new routing.
    /// Idempotent (the default, PROTOCOL §21): after a lost reply, a dropped connection or a
    /// `WAIT` not confirmed, the same records are sent again within
    /// [`ProducerBuilder::retry_budget`], and what had landed is recognised, not written twice.
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
        let rr = self.round_robin(&records);
        let mut guard = self.lane();
        let mut lane = guard.as_mut().map(|g| g.take(records.len()));
        let started = Instant::now();
        let mut routing = self.routing_within(stream, started).await?;
        let mut out: Vec<Option<Published>> = vec![None; records.len()];
        let mut todo: Vec<usize> = (0..records.len()).collect();
        let mut delay = Duration::from_millis(2);
        loop {
            let placed = place(&routing, &records, &rr, &todo);
            let sent = self.send_guarded(&routing, &records, &placed, lane.as_ref());
            let outcome = match sent.await {
                Ok(r) => r,
                Err(e) => {
                    self.retry_or_fail(stream, e, lane.is_some(), started, &mut delay)
                        .await?;
                    continue;
                }
            };
            self.written(stream, &routing, guard.as_mut(), lane.as_ref(), &outcome);
            let (written, acked) = (outcome.written.len(), outcome.acked);
            if let Some((wanted, _)) = self.inner.wait
                && acked < wanted
                && written > 0
            {
                metrics::counter!("rsc_client_publish_unreplicated_total", "stream" => stream.to_owned())
                    .increment(written as u64);
                if lane.is_some() && started.elapsed() < self.inner.retry_budget {
                    // The same records again: those written are recognised, then `WAIT`ed for.
                    debug!(
                        stream,
                        acked, wanted, "publish not replicated in time: sent again"
                    );
                    backoff(&mut delay).await;
                    continue;
                }
                return Err(ClientError::NotReplicated { acked, wanted });
            }
            metrics::counter!("rsc_client_published_total", "stream" => stream.to_owned())
                .increment(written as u64);
            let (marker, refused);
            (todo, marker, refused) = settle(&mut out, outcome);
            if todo.is_empty() {
                break;
            }
            let stale = Stale {
                stream,
                marker: marker.unwrap_or(routing.routing_epoch),
                records: todo.len(),
                started,
            };
            if marker.is_none() {
                // Aborted after the check passed: nothing written, sent again as it was.
                self.again(&stale, &routing, &mut delay).await?;
                continue;
            }
            metrics::counter!("rsc_client_publish_stale_total", "stream" => stream.to_owned())
                .increment(refused as u64);
            routing = self.newer_routing(&stale, &routing, &mut delay).await?;
            if let (Some(g), Some(ids)) = (guard.as_mut(), lane.as_mut()) {
                // Not written anywhere; placed anew, they must not meet the sequences this
                // publish wrote to their new shard (PROTOCOL §21).
                g.renumber(ids, &todo);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The routing of `stream`; while the coordinator answers that the stream does not
    /// exist, or cannot be reached, asked again with a backoff until the publish that
    /// `started` is [`ProducerBuilder::delivery_timeout`] old, then
    /// [`ClientError::DeliveryTimeout`].
    async fn routing_within(
        &self,
        stream: &str,
        started: Instant,
    ) -> Result<Arc<routing::Routing>, ClientError> {
        let mut delay = Duration::from_millis(50);
        let mut tries = 0u32;
        loop {
            let e = match self.inner.routes.get(stream).await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            let waits = match &e {
                ClientError::Coordinator(c) => {
                    c.code() == Some(rsc_protocol::ErrorCode::StreamNotFound) || c.is_retriable()
                }
                _ => false,
            };
            if !waits {
                return Err(e);
            }
            let timeout = self.inner.delivery_timeout;
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                metrics::counter!("rsc_client_publish_delivery_timeouts_total", "stream" => stream.to_owned())
                    .increment(1);
                warn!(stream, error = %e, ?timeout, "publish failed: no routing for the stream within the delivery timeout");
                return Err(ClientError::DeliveryTimeout {
                    stream: stream.to_owned(),
                    timeout,
                    source: Box::new(e),
                });
            }
            tries += 1;
            if tries == 1 {
                warn!(stream, error = %e, ?timeout, "no routing for the stream; asking again until the delivery timeout");
            } else {
                debug!(stream, error = %e, tries, "no routing for the stream yet");
            }
            tokio::time::sleep(delay.min(left)).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// After a publish's Redis error: `Ok` when the same records may be sent again (an
    /// idempotent producer, an error after which the write may or may not have landed, or
    /// that wrote nothing and passes — a dropped connection, a timeout, a replica not yet
    /// master — and time left in the retry budget), after a backoff; else the error.
    async fn retry_or_fail(
        &self,
        stream: &str,
        e: redis::RedisError,
        idempotent: bool,
        started: Instant,
        delay: &mut Duration,
    ) -> Result<(), ClientError> {
        self.inner.routes.mark_stale(stream);
        let passing = matches!(
            e.code(),
            Some("READONLY" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN")
        );
        let retry = idempotent
            && (passing || is_connection_error(&e))
            && started.elapsed() < self.inner.retry_budget;
        if !retry {
            metrics::counter!("rsc_client_publish_errors_total", "stream" => stream.to_owned())
                .increment(1);
            return Err(self.redis_error(e));
        }
        metrics::counter!("rsc_client_publish_retries_total", "stream" => stream.to_owned())
            .increment(1);
        debug!(stream, error = %e, "publish failed, sending the same records again");
        backoff(delay).await;
        Ok(())
    }

    /// A lane for one publish of an idempotent producer (`None` without idempotence).
    fn lane(&self) -> Option<LaneGuard<'_>> {
        self.inner.idempotence?;
        let pool = &self.inner.lanes;
        let free = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let lane = free.unwrap_or_else(|| Lane {
            id: format!("{:016x}", rand::random::<u64>()),
            next: 1,
            wrote: HashMap::new(),
        });
        Some(LaneGuard {
            pool,
            lane: Some(lane),
            window: compare_window(self.inner.idempotence?),
        })
    }

    /// A publish's Redis error; one of the connection (refused, dropped, timed out) names
    /// the data Redis.
    fn redis_error(&self, e: redis::RedisError) -> ClientError {
        if is_connection_error(&e) {
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

    /// After a transaction was aborted although its check passed (a marker or the producer
    /// record changed in between; nothing was written): waits a backoff before the records
    /// are sent again, or fails with [`ClientError::StaleRouting`] past the retry budget.
    async fn again(
        &self,
        stale: &Stale<'_>,
        routing: &Routing,
        delay: &mut Duration,
    ) -> Result<(), ClientError> {
        if stale.started.elapsed() >= self.inner.stale_budget {
            return Err(ClientError::StaleRouting {
                stream: stale.stream.to_owned(),
                routing_epoch: routing.routing_epoch,
                shard_epoch: stale.marker,
            });
        }
        debug!(
            stream = stale.stream,
            records = stale.records,
            "publish aborted after its check: sent again"
        );
        backoff(delay).await;
        Ok(())
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
            backoff(delay).await;
        }
    }

    /// Writes the records `placed` (index, shard; in order) under `routing`: one transaction
    /// (PROTOCOL §15, §21; [`write`]) for the batch (standalone) or per shard (cluster), all
    /// sent at once. What became of each record.
    async fn send_guarded(
        &self,
        routing: &Routing,
        records: &[Record],
        placed: &[(usize, u32)],
        lane: Option<&LaneIds>,
    ) -> redis::RedisResult<write::Outcome> {
        let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &(i, shard) in placed {
            by_shard.entry(shard).or_default().push(i);
        }
        let parts: Vec<write::Part> = by_shard.into_iter().collect();
        let groups: Vec<&[write::Part]> = if self.inner.cluster {
            parts.chunks(1).collect()
        } else {
            vec![&parts[..]]
        };
        let writer = write::Writer {
            routing,
            records,
            lane,
            ttl_ms: self.inner.idempotence.unwrap_or(Duration::ZERO).as_millis() as u64,
            fields: self.inner.producer_fields,
            cluster: self.inner.cluster,
            wait: self.inner.wait,
        };
        let wait = self.inner.wait.is_some();
        let sends = groups.into_iter().map(|group| {
            let pipe = writer.pipeline(group);
            async move {
                let values = (self.inner.conn.clone())
                    .req_packed_commands(&pipe, 0, pipe.len())
                    .await?;
                let (answers, acked) = write::read(values, group, wait)?;
                Ok::<_, redis::RedisError>((group, answers, acked))
            }
        });
        // Before the sends start (they are lazy): no later than the writes.
        let mut out = write::Outcome::new();
        let mut answered = Vec::with_capacity(parts.len());
        for (group, answers, acked) in futures::future::try_join_all(sends).await? {
            out.acked = out.acked.min(acked);
            answered.extend(group.iter().zip(answers));
        }
        self.read_landed(&writer, &mut answered).await?;
        for ((shard, _), answer) in &answered {
            if let (Some(s), Some(lane)) = (answer.behind, lane) {
                let known = lane.known_on(&routing.shard_keys[*shard as usize]);
                out.lost.push((*shard, s, known));
            }
        }
        for ((shard, idx), answer) in answered {
            for (&i, id) in idx.iter().zip(answer.ids) {
                match id {
                    Some(id) => out.written.push((i, Published { shard: *shard, id })),
                    None if answer.marker > 0 => out
                        .refused
                        .push((i, answer.marker.max(routing.routing_epoch + 1))),
                    None => out.again.push(i),
                }
            }
        }
        Ok(out)
    }

    /// Fills in the entry ids of the records that an earlier attempt wrote, as the check
    /// found them (an idempotent retry, PROTOCOL §21): one script call per such shard, in one
    /// pipeline (standalone) or one per shard (cluster), all sent at once.
    async fn read_landed(
        &self,
        writer: &write::Writer<'_>,
        answered: &mut [(&write::Part, write::ShardAnswer)],
    ) -> redis::RedisResult<()> {
        let Some(lane) = writer.lane else {
            return Ok(());
        };
        let mut asks: Vec<LandedAsk> = Vec::new();
        for (a, ((shard, idx), answer)) in answered.iter().enumerate() {
            let Some(top) = answer.landed else { continue };
            let (pos, recs): (Vec<usize>, Vec<usize>) = (idx.iter().enumerate())
                .filter(|&(_, &i)| lane.seqs[i] <= top)
                .map(|(p, &i)| (p, i))
                .unzip();
            asks.push((a, *shard, pos, recs));
        }
        let groups: Vec<&[LandedAsk]> = if self.inner.cluster {
            asks.chunks(1).collect()
        } else {
            vec![&asks[..]]
        };
        let sends = (groups.into_iter().filter(|g| !g.is_empty())).map(|group| {
            let pipe = writer.landed_pipeline(group.iter().map(|a| (a.1, &a.3[..])));
            async move {
                let values = (self.inner.conn.clone())
                    .req_packed_commands(&pipe, 0, pipe.len())
                    .await?;
                Ok::<_, redis::RedisError>((group, values))
            }
        });
        for (group, values) in futures::future::try_join_all(sends).await? {
            for ((a, _, pos, recs), v) in group.iter().zip(values) {
                let ids = write::read_landed(v, recs.len())?;
                for (&p, id) in pos.iter().zip(ids) {
                    answered[*a].1.ids[p] = Some(id);
                }
            }
        }
        Ok(())
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
                record.xadd(&mut pipe, &routing.shard_keys[shard as usize], None);
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
                records[i].xadd(&mut pipe, &routing.shard_keys[shard as usize], None);
            }
            let rings = self.ring(&mut pipe, routing, &[shard]);
            async move {
                let (ids, acked) = self.send(pipe, rings).await?;
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

    /// Appends a ring of each shard's doorbell (`PUBLISH {<shard key>}:ring ""`, `SPUBLISH`
    /// on a Redis Cluster; PROTOCOL §16) to `pipe`, so that consumers waiting on those shards
    /// read at once; `shards` are distinct. Returns how many were appended.
    fn ring(&self, pipe: &mut redis::Pipeline, routing: &Routing, shards: &[u32]) -> usize {
        for &s in shards {
            pipe.cmd(rsc_protocol::routing::ring_command(self.inner.cluster))
                .arg(rsc_protocol::routing::ring_channel(
                    &routing.shard_keys[s as usize],
                ))
                .arg("");
        }
        shards.len()
    }

    /// The writes this producer had reported published that a later write to the same shard
    /// found gone, oldest first (the last [`LOST_WRITES_KEPT`]; PROTOCOL §21 "Across a
    /// failover"). Each is also logged (`warn`) and counted in
    /// `rsc_producer_lost_writes_total{stream}` (by sequence numbers); the publish that found
    /// it succeeded. Only an idempotent producer detects losses, on its next write to the
    /// shard within its records' idle expiry: a loss on a shard it never writes again, or
    /// one of an earlier process (another producer id), is not detected.
    pub fn lost_writes(&self) -> Vec<LostWrites> {
        let lost = self.inner.lost.lock().unwrap_or_else(|p| p.into_inner());
        lost.iter().cloned().collect()
    }

    /// After an attempt answered: reports the losses its checks found
    /// ([`Producer::lost_writes`]) and notes what it wrote in the lane.
    fn written(
        &self,
        stream: &str,
        routing: &Routing,
        guard: Option<&mut LaneGuard<'_>>,
        lane: Option<&LaneIds>,
        outcome: &write::Outcome,
    ) {
        let (Some(guard), Some(lane)) = (guard, lane) else {
            return;
        };
        guard.wrote(routing, lane, &outcome.written, outcome.sent);
        for &(shard, s, known) in &outcome.lost {
            let lost = LostWrites {
                stream: stream.to_owned(),
                shard,
                producer_id: lane.id.clone(),
                first_seq: s + 1,
                last_seq: known,
            };
            warn!(
                stream,
                shard,
                producer_id = %lane.id,
                first_seq = lost.first_seq,
                last_seq = lost.last_seq,
                "writes reported published are gone from the shard (a failover without WAIT lost them, or the producer record was deleted)"
            );
            metrics::counter!("rsc_producer_lost_writes_total", "stream" => stream.to_owned())
                .increment(known.saturating_sub(s));
            let mut kept = self.inner.lost.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() == LOST_WRITES_KEPT {
                kept.pop_front();
            }
            kept.push_back(lost);
        }
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
/// The producer id and the sequence number of each record of one publish (idempotence,
/// PROTOCOL §21).
#[derive(Debug, Default)]
struct LaneIds {
    /// 16 hex digits.
    id: String,
    /// By record index.
    seqs: Vec<u64>,
    /// By shard key: the highest sequence the lane wrote there, for the shards written within
    /// the comparison window ([`compare_window`]) when the publish began.
    known: HashMap<String, u64>,
}

impl LaneIds {
    /// The highest sequence the lane knows it wrote to `shard_key`, for the check to compare
    /// with the producer record (0: nothing to compare; PROTOCOL §21 "Across a failover").
    fn known_on(&self, shard_key: &str) -> u64 {
        self.known.get(shard_key).copied().unwrap_or(0)
    }
}

/// One sequence of publishes, one at a time: an idempotent producer takes a lane for each
/// publish (a new one when all are busy), so the sequences a lane writes to a shard only
/// grow, and a retry of its publish in flight is the only one that can meet its own writes.
#[derive(Debug)]
struct Lane {
    id: String,
    next: u64,
    /// By shard key: the highest sequence written there and when the attempt that wrote it
    /// was sent (no later than the write, so the record's age is not underestimated).
    wrote: HashMap<String, (u64, Instant)>,
}

impl Lane {
    /// Notes that the lane wrote `seq` to `shard_key` in an attempt sent `at`.
    fn wrote(&mut self, shard_key: &str, seq: u64, at: Instant) {
        match self.wrote.get_mut(shard_key) {
            Some(w) if w.0 >= seq => {}
            Some(w) => *w = (seq, at),
            None => {
                self.wrote.insert(shard_key.to_owned(), (seq, at));
            }
        }
    }

    /// The highest sequence written per shard key, for the shards last written less than
    /// `window` before `now` (an older record may have expired: not a loss); forgets the
    /// others.
    fn known(&mut self, now: Instant, window: Duration) -> HashMap<String, u64> {
        self.wrote
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < window);
        (self.wrote.iter())
            .map(|(k, (seq, _))| (k.clone(), *seq))
            .collect()
    }
}

/// How long after a lane's last write to a shard the check compares the shard's producer
/// record with it: the records' idle expiry less a margin (a tenth of it, at least 1 s) for
/// the time between the client's clock and Redis' (a record that expired because the lane
/// was idle longer is not a loss).
fn compare_window(ttl: Duration) -> Duration {
    ttl.saturating_sub((ttl / 10).max(Duration::from_secs(1)))
}

/// A lane taken for one publish; given back when dropped (the publish done, or cancelled:
/// the lane's next publish still has higher sequences).
struct LaneGuard<'a> {
    pool: &'a std::sync::Mutex<Vec<Lane>>,
    lane: Option<Lane>,
    /// [`compare_window`] of the producer's record expiry.
    window: Duration,
}

impl LaneGuard<'_> {
    /// The next `n` sequence numbers of the lane, with its id and what it knows it wrote.
    fn take(&mut self, n: usize) -> LaneIds {
        let lane = self.lane.as_mut().expect("a lane until dropped");
        let first = lane.next;
        lane.next += n as u64;
        LaneIds {
            id: lane.id.clone(),
            seqs: (first..first + n as u64).collect(),
            known: lane.known(Instant::now(), self.window),
        }
    }

    /// Notes the records `written` (index, where) of an attempt sent `at`.
    fn wrote(
        &mut self,
        routing: &Routing,
        ids: &LaneIds,
        written: &[(usize, Published)],
        at: Instant,
    ) {
        let lane = self.lane.as_mut().expect("a lane until dropped");
        for (i, p) in written {
            lane.wrote(&routing.shard_keys[p.shard as usize], ids.seqs[*i], at);
        }
    }
}

impl LaneGuard<'_> {
    /// Gives the records `todo` (indices, in order) the lane's next sequence numbers.
    fn renumber(&mut self, ids: &mut LaneIds, todo: &[usize]) {
        let fresh = self.take(todo.len());
        for (&i, seq) in todo.iter().zip(fresh.seqs) {
            ids.seqs[i] = seq;
        }
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            self.pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lane);
        }
    }
}

/// Takes the records `outcome` wrote into `out`; the records still to write (those refused for
/// a stale epoch and those to send again, in order), the highest marker that refused, and how
/// many it refused.
fn settle(
    out: &mut [Option<Published>],
    outcome: write::Outcome,
) -> (Vec<usize>, Option<u64>, usize) {
    for (i, p) in outcome.written {
        out[i] = Some(p);
    }
    let marker = outcome.refused.iter().map(|&(_, m)| m).max();
    let refused = outcome.refused.len();
    let mut todo: Vec<usize> = (outcome.refused.into_iter().map(|(i, _)| i))
        .chain(outcome.again)
        .collect();
    todo.sort_unstable();
    (todo, marker, refused)
}

/// Where each record of `todo` goes under `routing`: (index, shard), in order.
fn place(routing: &Routing, records: &[Record], rr: &[u64], todo: &[usize]) -> Vec<(usize, u32)> {
    todo.iter()
        .map(|&i| {
            let key = records[i].key.as_deref().map(str::as_bytes);
            (i, routing.shard_for(key, rr[i]))
        })
        .collect()
}

/// An error of the connection itself (refused, dropped, timed out): the command may or may
/// not have run.
fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_connection_refusal() || e.is_connection_dropped() || e.is_timeout() || e.is_io_error()
}

/// Waits `delay`, then doubles it (up to 200 ms).
async fn backoff(delay: &mut Duration) {
    tokio::time::sleep(*delay).await;
    *delay = (*delay * 2).min(Duration::from_millis(200));
}

/// Records of one shard whose entry ids are to read after a check found them written: the
/// answer's index, the shard, the records' positions in their part and their indices.
type LandedAsk = (usize, u32, Vec<usize>, Vec<usize>);

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

#[cfg(test)]
mod tests {
    use super::*;

    fn lane() -> Lane {
        Lane {
            id: "p".into(),
            next: 1,
            wrote: HashMap::new(),
        }
    }

    #[test]
    fn a_lane_knows_the_highest_sequence_written_per_shard() {
        let t0 = Instant::now();
        let mut l = lane();
        l.wrote("s:0", 3, t0);
        l.wrote("s:0", 2, t0 + Duration::from_secs(5));
        l.wrote("s:1", 4, t0);
        let known = l.known(t0 + Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(known, [("s:0".into(), 3), ("s:1".into(), 4)].into());
        // A lower sequence (a retry's record found written) neither lowers nor refreshes it.
        assert_eq!(l.wrote["s:0"], (3, t0));
        l.wrote("s:0", 9, t0 + Duration::from_secs(30));
        assert_eq!(l.wrote["s:0"], (9, t0 + Duration::from_secs(30)));
    }

    #[test]
    fn a_shard_written_longer_ago_than_the_window_is_not_compared() {
        let t0 = Instant::now();
        let window = Duration::from_secs(10);
        let mut l = lane();
        l.wrote("s:0", 3, t0);
        l.wrote("s:1", 4, t0 + Duration::from_secs(5));
        let known = l.known(t0 + window, window);
        assert_eq!(known, [("s:1".into(), 4)].into());
        assert!(!l.wrote.contains_key("s:0"), "forgotten");
        let ids = LaneIds {
            known,
            ..LaneIds::default()
        };
        assert_eq!((ids.known_on("s:0"), ids.known_on("s:1")), (0, 4));
    }

    #[test]
    fn the_window_is_the_expiry_less_a_margin() {
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(compare_window(day), day - day / 10);
        assert_eq!(
            compare_window(Duration::from_secs(3)),
            Duration::from_secs(2)
        );
        // An expiry of a second or less: never compared (it may have expired already).
        assert_eq!(compare_window(Duration::from_millis(800)), Duration::ZERO);
        let mut l = lane();
        let t0 = Instant::now();
        l.wrote("s:0", 1, t0);
        assert!(l.known(t0, Duration::ZERO).is_empty());
    }
}
