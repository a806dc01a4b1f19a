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
//! earlier attempt of the publish wrote, and the transaction records the last sequence
//! written (module `write`). Its concurrent publishes share one producer id, several in
//! flight, ordered by call (module `inflight`; [`ProducerBuilder::max_in_flight`]): on each
//! shard a write runs only where the one before it ended. It also passes the last sequence
//! it knows it wrote to each shard: a record found elsewhere, nothing being in flight before
//! the write there, is a loss (writes reported published and gone, e.g. a
//! failover without `WAIT`), logged, counted and kept for [`Producer::lost_writes`].

mod inflight;
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

/// The default [`ProducerBuilder::max_in_flight`]: Kafka's
/// `max.in.flight.requests.per.connection` with idempotence.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 5;

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
    /// The lane an idempotent producer's publishes take now (a new one after a publish
    /// failed on it).
    lane: std::sync::Mutex<Option<Arc<SharedLane>>>,
    /// Publishes of an idempotent producer sent and not settled, at most.
    max_in_flight: usize,
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
    max_in_flight: usize,
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

    /// How many publishes of an idempotent producer may be in flight at once (sent and not
    /// settled; default [`DEFAULT_MAX_IN_FLIGHT`], as Kafka's
    /// `max.in.flight.requests.per.connection`; at least 1; `RSC_PUBLISH_MAX_IN_FLIGHT`).
    /// Concurrent calls of [`Producer::publish_batch`] share one producer id and are ordered
    /// by call: each is sent at once while fewer than this many are in flight (their
    /// transactions pipelined on the connection), else it waits for the oldest to settle. Order
    /// per key holds across them: on each shard a publish's write runs only where the one
    /// before it ended (PROTOCOL §21 "Several publishes in flight"), so a later publish never
    /// lands before an earlier one that was refused, aborted or lost; retries go out in call
    /// order. A publish that fails (or whose future is dropped) fails the later ones that
    /// still have to write to its shards. 1: one publish at a time.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
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
                lane: std::sync::Mutex::new(None),
                max_in_flight: self.max_in_flight,
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
            max_in_flight: env("RSC_PUBLISH_MAX_IN_FLIGHT")
                .map_or(DEFAULT_MAX_IN_FLIGHT, |n| n.max(1) as usize),
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
    ///
    /// Publishes awaited together (`join`) keep per key the order in which their futures are
    /// first polled: each takes its turn then.
    pub async fn publish_batch(
        &self,
        stream: &str,
        records: impl IntoIterator<Item = Record>,
    ) -> Result<Vec<Published>, ClientError> {
        let records = traced(records);
        let ticket = self.turn(&records);
        self.publish_in_turn(stream, records, ticket).await
    }

    /// [`Producer::publish_batch`] with its turn taken at the call, for a caller that runs the
    /// future at once (a language binding spawning it, [`crate::foreign::publish_batch`]):
    /// a turn holds the later publishes until its future runs.
    pub(crate) fn publish_batch_now(
        &self,
        stream: &str,
        records: Vec<Record>,
    ) -> impl Future<Output = Result<Vec<Published>, ClientError>> + Send + use<> {
        let records = traced(records);
        let ticket = self.turn(&records);
        let (this, stream) = (self.clone(), stream.to_owned());
        async move { this.publish_in_turn(&stream, records, ticket).await }
    }

    /// Idempotent: the publish's ticket, in call order (PROTOCOL §21); placed in turn.
    fn turn(&self, records: &[Record]) -> Option<InFlight> {
        if records.is_empty() {
            None
        } else {
            self.ticket()
        }
    }

    /// [`Producer::publish_batch`] once its turn is taken.
    async fn publish_in_turn(
        &self,
        stream: &str,
        records: Vec<Record>,
        mut ticket: Option<InFlight>,
    ) -> Result<Vec<Published>, ClientError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let rr = self.round_robin(&records);
        let started = Instant::now();
        let mut routing = self.routing_within(stream, started).await?;
        let mut out: Vec<Option<Published>> = vec![None; records.len()];
        let mut todo: Vec<usize> = (0..records.len()).collect();
        let mut placed = place(&routing, &records, &rr, &todo);
        if let Some(t) = ticket.as_mut() {
            t.place_in_turn(&routing, &placed).await;
            t.send_in_turn().await;
        }
        let mut delay = Duration::from_millis(2);
        let mut retry = false;
        loop {
            if retry {
                placed = place(&routing, &records, &rr, &todo);
                if let Some(t) = ticket.as_mut() {
                    t.retry_in_turn(stream, &routing, &placed).await?;
                }
            }
            retry = true;
            let lane = ticket.as_ref().map(|t| &t.ids);
            let sent = self.send_guarded(&routing, &records, &placed, lane);
            let outcome = match queued(sent, ticket.as_ref()).await {
                Ok(r) => r,
                Err(e) => {
                    let idem = ticket.is_some();
                    self.retry_or_fail(stream, e, idem, started, &mut delay)
                        .await?;
                    continue;
                }
            };
            self.written(stream, &routing, ticket.as_mut(), &outcome);
            if self
                .unreplicated(stream, &outcome, ticket.is_some(), started, &mut delay)
                .await?
            {
                continue;
            }
            metrics::counter!("rsc_client_published_total", "stream" => stream.to_owned())
                .increment(outcome.written.len() as u64);
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
                // Aborted after the check passed, or refused for order: nothing written,
                // sent again as it was.
                self.again(&stale, &routing, &mut delay).await?;
                continue;
            }
            metrics::counter!("rsc_client_publish_stale_total", "stream" => stream.to_owned())
                .increment(refused as u64);
            routing = self.newer_routing(&stale, &routing, &mut delay).await?;
            if let Some(t) = ticket.as_mut() {
                // Not written anywhere; placed anew, they must not meet the sequences this
                // publish wrote to their new shard (PROTOCOL §21).
                t.renumber(&todo);
            }
        }
        ticket.iter_mut().for_each(|t| t.ok = true);
        Ok(out.into_iter().flatten().collect())
    }

    /// After an attempt that wrote records and whose `WAIT` fewer replicas than asked
    /// confirmed: `Ok(true)` when the same records go again (an idempotent producer within
    /// its retry budget: those written are recognised, then `WAIT`ed for), after a backoff;
    /// else [`ClientError::NotReplicated`]. `Ok(false)`: nothing to wait for.
    async fn unreplicated(
        &self,
        stream: &str,
        outcome: &write::Outcome,
        idempotent: bool,
        started: Instant,
        delay: &mut Duration,
    ) -> Result<bool, ClientError> {
        let (written, acked) = (outcome.written.len(), outcome.acked);
        let Some((wanted, _)) = self.inner.wait else {
            return Ok(false);
        };
        if acked >= wanted || written == 0 {
            return Ok(false);
        }
        metrics::counter!("rsc_client_publish_unreplicated_total", "stream" => stream.to_owned())
            .increment(written as u64);
        if idempotent && started.elapsed() < self.inner.retry_budget {
            debug!(
                stream,
                acked, wanted, "publish not replicated in time: sent again"
            );
            backoff(delay).await;
            return Ok(true);
        }
        Err(ClientError::NotReplicated { acked, wanted })
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

    /// The place of one publish of an idempotent producer in its lane (`None` without
    /// idempotence): a ticket after every earlier call's ([`InFlight::place_in_turn`] gives
    /// it its sequences and placement).
    fn ticket(&self) -> Option<InFlight> {
        let window = compare_window(self.inner.idempotence?);
        let lane = {
            let mut current = self.inner.lane.lock().unwrap_or_else(|p| p.into_inner());
            match &*current {
                Some(l) if !l.state().window.retired() => l.clone(),
                _ => {
                    let l = Arc::new(SharedLane {
                        id: format!("{:016x}", rand::random::<u64>()),
                        state: std::sync::Mutex::new(LaneState {
                            next: 1,
                            window: inflight::Window::new(self.inner.max_in_flight),
                        }),
                        changed: tokio::sync::Notify::new(),
                    });
                    *current = Some(l.clone());
                    l
                }
            }
        };
        let mut st = lane.state();
        st.window.forget_idle(Instant::now(), window);
        let ticket = st.window.open();
        drop(st);
        let ids = LaneIds {
            id: lane.id.clone(),
            ..LaneIds::default()
        };
        Some(InFlight {
            lane,
            ticket,
            ids,
            window,
            ok: false,
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
            history: self.inner.max_in_flight,
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
            if answer.order {
                // An earlier publish of the lane is missing on the shard: this one waits for
                // it and goes again (PROTOCOL §21 "Several publishes in flight").
                metrics::counter!("rsc_client_publish_out_of_order_total", "stream" => routing.stream.clone())
                    .increment(1);
                debug!(stream = %routing.stream, shard, "publish refused for order: sent again after the earlier ones");
            }
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
        if writer.lane.is_none() {
            return Ok(());
        }
        let mut asks: Vec<LandedAsk> = Vec::new();
        for (a, ((shard, idx), answer)) in answered.iter().enumerate() {
            if answer.landed.is_none() {
                continue;
            }
            // One transaction wrote all of the shard's records of that attempt, the same
            // records as this one's (a retry under the same routing).
            let (pos, recs): (Vec<usize>, Vec<usize>) = idx.iter().copied().enumerate().unzip();
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
        ticket: Option<&mut InFlight>,
        outcome: &write::Outcome,
    ) {
        let Some(ticket) = ticket else {
            return;
        };
        ticket.wrote(routing, &outcome.written, outcome.sent);
        let lane = &ticket.ids;
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
    /// By shard key: the last sequence the lane is known to have written there, for the
    /// shards written within the comparison window ([`compare_window`]); 0 or absent: none.
    known: HashMap<String, u64>,
    /// By shard key: where the shard's producer record must end for this write to run (the
    /// lane's write before it there; PROTOCOL §21 "Several publishes in flight"); absent:
    /// `known`.
    prev: HashMap<String, u64>,
}

impl LaneIds {
    /// The last sequence the lane knows it wrote to `shard_key`, for the check to compare
    /// with the producer record (0: nothing to compare; PROTOCOL §21 "Across a failover").
    fn known_on(&self, shard_key: &str) -> u64 {
        self.known.get(shard_key).copied().unwrap_or(0)
    }

    /// Where the producer record of `shard_key` must end for the write to run (0: anywhere).
    fn prev_on(&self, shard_key: &str) -> u64 {
        (self.prev.get(shard_key).copied()).unwrap_or_else(|| self.known_on(shard_key))
    }
}

/// The lane of an idempotent producer (PROTOCOL §21): one producer id whose publishes are
/// ordered by call, several in flight ([`ProducerBuilder::max_in_flight`]).
struct SharedLane {
    /// 16 hex digits.
    id: String,
    state: std::sync::Mutex<LaneState>,
    /// Notified whenever a ticket is sent or settled.
    changed: tokio::sync::Notify,
}

struct LaneState {
    /// The next sequence number.
    next: u64,
    window: inflight::Window,
}

impl SharedLane {
    fn state(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long after a lane's last write to a shard the check compares the shard's producer
/// record with it: the records' idle expiry less a margin (a tenth of it, at least 1 s) for
/// the time between the client's clock and Redis' (a record that expired because the lane
/// was idle longer is not a loss).
fn compare_window(ttl: Duration) -> Duration {
    ttl.saturating_sub((ttl / 10).max(Duration::from_secs(1)))
}

/// Per shard key of `placed` (index, shard; in order), the highest sequence placed there.
fn chain_parts(routing: &Routing, placed: &[(usize, u32)], seqs: &[u64]) -> Vec<(String, u64)> {
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for &(i, shard) in placed {
        let e = last.entry(shard).or_default();
        *e = (*e).max(seqs[i]);
    }
    (last.into_iter())
        .map(|(s, seq)| (routing.shard_keys[s as usize].clone(), seq))
        .collect()
}

/// One publish's ticket in its lane, held until it is settled: dropped, it settles the
/// ticket (failed unless [`InFlight::ok`]) and wakes the publishes waiting on the lane.
struct InFlight {
    lane: Arc<SharedLane>,
    ticket: inflight::Ticket,
    /// The producer id, the records' sequences and the chain of the current placement.
    ids: LaneIds,
    /// [`compare_window`] of the producer's record expiry.
    window: Duration,
    /// Every record written: the ticket settles as done.
    ok: bool,
}

impl InFlight {
    /// Waits until `ready` holds of the lane's window.
    async fn wait_until(&self, ready: impl Fn(&inflight::Window) -> bool) {
        loop {
            let notified = self.lane.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(&self.lane.state().window) {
                return;
            }
            notified.await;
        }
    }

    /// Waits until every earlier ticket is placed, then gives the records `placed` (index,
    /// shard) the lane's next sequences and places them, chained on the lane's earlier
    /// writes.
    async fn place_in_turn(&mut self, routing: &Routing, placed: &[(usize, u32)]) {
        self.wait_until(|w| w.may_place(self.ticket)).await;
        let now = Instant::now();
        let mut st = self.lane.state();
        let (first, n) = (st.next, placed.len() as u64);
        st.next += n;
        self.ids.seqs = (first..first + n).collect();
        let parts = chain_parts(routing, placed, &self.ids.seqs);
        let chain = (st.window).place(self.ticket, &parts, false, now, self.window);
        drop(st);
        self.lane.changed.notify_waiters();
        self.chain(&parts, chain);
    }

    /// Waits for the ticket's turn to be sent a first time (every earlier ticket sent, room in
    /// the window).
    async fn send_in_turn(&self) {
        self.wait_until(|w| w.may_send(self.ticket)).await;
    }

    /// The ticket's attempt is in the connection's queue: the next ticket may follow.
    fn mark_sent(&self) {
        self.lane.state().window.sent(self.ticket);
        self.lane.changed.notify_waiters();
    }

    /// Waits until every earlier ticket is settled (retries go out in ticket order), then
    /// places `placed` again, chained on what is written ([`InFlight::replace`]).
    async fn retry_in_turn(
        &mut self,
        stream: &str,
        routing: &Routing,
        placed: &[(usize, u32)],
    ) -> Result<(), ClientError> {
        self.wait_until(|w| w.may_retry(self.ticket)).await;
        self.replace(stream, routing, placed)
    }

    /// Notes the chain `(prev, known)` of each part `(shard key, last)`.
    fn chain(&mut self, parts: &[(String, u64)], chain: Vec<(u64, u64)>) {
        self.ids.prev.clear();
        self.ids.known.clear();
        for ((key, _), (prev, known)) in parts.iter().zip(chain) {
            self.ids.prev.insert(key.clone(), prev);
            self.ids.known.insert(key.clone(), known);
        }
    }

    /// Places the records `placed` again for a retry (every earlier ticket settled),
    /// chained on what the lane knows written; an earlier ticket that failed on one of their
    /// shards fails this publish ([`ClientError::EarlierPublishFailed`]).
    fn replace(
        &mut self,
        stream: &str,
        routing: &Routing,
        placed: &[(usize, u32)],
    ) -> Result<(), ClientError> {
        let parts = chain_parts(routing, placed, &self.ids.seqs);
        let keys: Vec<String> = parts.iter().map(|(k, _)| k.clone()).collect();
        let mut st = self.lane.state();
        if let Some(shard_key) = st.window.blocked(self.ticket, &keys) {
            warn!(stream, shard_key, producer_id = %self.lane.id,
                "an earlier publish of this producer to the shard failed: this one fails too (per-key order)");
            return Err(ClientError::EarlierPublishFailed {
                stream: stream.to_owned(),
                shard_key: shard_key.to_owned(),
            });
        }
        let chain = st
            .window
            .place(self.ticket, &parts, true, Instant::now(), self.window);
        drop(st);
        self.chain(&parts, chain);
        Ok(())
    }

    /// Gives the records `todo` (indices, in order) the lane's next sequence numbers.
    fn renumber(&mut self, todo: &[usize]) {
        let mut st = self.lane.state();
        let first = st.next;
        st.next += todo.len() as u64;
        drop(st);
        for (k, &i) in todo.iter().enumerate() {
            self.ids.seqs[i] = first + k as u64;
        }
    }

    /// Notes the records `written` (index, where) of an attempt sent `at`: per shard, the
    /// last sequence written there.
    fn wrote(&mut self, routing: &Routing, written: &[(usize, Published)], at: Instant) {
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, p) in written {
            let e = last.entry(p.shard).or_default();
            *e = (*e).max(self.ids.seqs[*i]);
        }
        let mut st = self.lane.state();
        for (shard, seq) in last {
            let key = &routing.shard_keys[shard as usize];
            st.window.written(self.ticket, key, seq, at);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.lane.state().window.close(self.ticket, self.ok);
        self.lane.changed.notify_waiters();
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

/// Awaits `send` after polling it once, which writes its pipelines to the multiplexed
/// connection's queue, and then lets the lane's next ticket be sent: first attempts reach
/// Redis in ticket order (one sent before the one ahead of it would be refused for order,
/// PROTOCOL §21, and go again).
async fn queued<T>(send: impl std::future::Future<Output = T>, ticket: Option<&InFlight>) -> T {
    let mut send = std::pin::pin!(send);
    let first = futures::poll!(send.as_mut());
    if let Some(t) = ticket {
        t.mark_sent();
    }
    match first {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => send.await,
    }
}

/// The records of a publish, each carrying the current trace context in its headers.
fn traced(records: impl IntoIterator<Item = Record>) -> Vec<Record> {
    let trace = crate::otel::current();
    let mut records: Vec<Record> = records.into_iter().collect();
    for record in &mut records {
        crate::otel::inject(&mut record.headers, &trace);
    }
    records
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
    }

    #[test]
    fn a_placement_chains_on_the_last_sequence_of_each_shard() {
        let routing = Routing {
            stream: "s".into(),
            shard_count: 2,
            routing_epoch: 1,
            shard_keys: vec!["s:0".into(), "s:1".into()],
        };
        let placed = [(0, 1), (1, 0), (2, 1), (3, 0)];
        let parts = chain_parts(&routing, &placed, &[7, 8, 9, 10]);
        assert_eq!(parts, [("s:0".to_owned(), 10), ("s:1".to_owned(), 9)]);
    }
}
