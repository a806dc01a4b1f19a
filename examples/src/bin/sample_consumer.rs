//! `sample-consumer`: a sample consumer pod (PROTOCOL §8).
//!
//! ```text
//! sample-consumer --coordinator URL[,URL…] --redis-url URL[,URL…] [--redis-cluster] --group G --stream S \
//!   --concurrency N --pod-ip IP [--key-concurrency N] [--token T] [--handle-ms N] [--fail-rate F]
//!   [--poison-key K] [--poison-seq N] [--flaky-seq N] [--hang-key-prefix P] [--record-stream KEY] [--max-retries N] [--retry-backoff-ms N]
//!   [--health-listen ADDR] [--static-id ID] [--data-redis-grace-ms N]
//! ```
//! Member ids are `<pod_ip>-<group>-<index>`. Each handling attempt takes `--handle-ms` and
//! fails with probability `--fail-rate` (then it is retried, then dead-lettered to
//! `<stream>:dlq`); every attempt on an entry with key `--poison-key` (or payload seq `--poison-seq`) fails, the
//! first attempt on the entry with seq `--flaky-seq` fails; the handling of
//! an entry whose key starts with `--hang-key-prefix` never ends (a stuck handler: a
//! revocation drops it at its deadline, PROTOCOL §5.3). With
//! `--key-concurrency N`, up to N entries of one shard are handled at once, never two of one
//! key. With `--record-stream`, every successful handling adds one entry to KEY
//! (`entry_id, shard, member, key, seq, started_ms, finished_ms, attempt, delivery_count`) before the acknowledgement.
//! SIGTERM: finish in-flight messages, acknowledge, leave the group, exit 0 (with `--static-id`
//! the pod leaves for a restart: its shards wait for it). A crash of the app (a panic, a
//! refusal by the coordinator, a shutdown past its deadline) exits non-zero.
//! A member joins only once the data Redis answers; while it stays unreachable past
//! `--data-redis-grace-ms` (default 15 s) the pod's members give their shards back and join
//! again when it answers. With `--health-listen`, `/healthz` and `/readyz` serve Kubernetes probes
//! (the client's ops endpoints, `rsc_client::ops`: ready once every member joined and the data
//! Redis answers); `/readyz` answers 503 from the SIGTERM on; `/metrics` serves the client's
//! metrics in the Prometheus format. Logs: `RSC_LOG` (filter), `RSC_LOG_FORMAT` (`text`,
//! `json`). Listener settings may be overridden as any app's (`RSC_LISTENER_<GROUP>_*`,
//! `RSC_CONFIG_FILE`, `RSC_PROFILE`: GUIDE "Configuration outside the code"). With `--redis-sentinel` (and
//! `--redis-sentinel-master`) the data Redis master is found through Redis Sentinel
//! (`RSC_REDIS_SENTINEL_PASSWORD` for the sentinels' password). A `rediss://` URL connects
//! over TLS; `RSC_REDIS_TLS_CA`, `RSC_REDIS_TLS_CERT`, `RSC_REDIS_TLS_KEY` and
//! `RSC_REDIS_SENTINEL_TLS` are read as the client library reads them.

use anyhow::Context;
use clap::Parser;
use rsc_client::prelude::*;
use rsc_client::{ExposeSecret, SecretString, SecretUrl};
use rsc_examples::unix_ms;
use rsc_redis::LazyRedis;
use std::net::SocketAddr;
use std::time::Duration;

/// (`Debug` hides the token and the Redis URL's password, PROTOCOL §12.)
#[derive(Debug, Parser)]
#[command(
    name = "sample-consumer",
    version,
    about = "A sample consumer pod of Redis Stream Coordinator"
)]
struct Args {
    /// Coordinator URL(s), comma-separated for failover.
    #[arg(long, env = "RSC_COORDINATOR_URL")]
    coordinator: String,
    /// The data Redis (with `--redis-cluster`, seed nodes, comma-separated).
    #[arg(long, env = "RSC_REDIS_URL", hide_env_values = true)]
    redis_url: SecretUrl,
    /// The data Redis is a Redis Cluster.
    #[arg(long)]
    redis_cluster: bool,
    /// Find the data Redis master through these sentinels (`HOST:PORT`, comma-separated).
    #[arg(long, env = "RSC_REDIS_SENTINEL", requires = "redis_sentinel_master")]
    redis_sentinel: Option<String>,
    /// The master name the sentinels monitor.
    #[arg(long, env = "RSC_REDIS_SENTINEL_MASTER")]
    redis_sentinel_master: Option<String>,
    /// The consumer group (must exist).
    #[arg(long)]
    group: String,
    /// The stream.
    #[arg(long)]
    stream: String,
    /// Members in this pod.
    #[arg(long, default_value_t = 1)]
    concurrency: u32,
    /// The pod's IP: member ids are `<pod_ip>-<group>-<index>`.
    #[arg(long, env = "POD_IP")]
    pod_ip: String,
    /// Static membership under this id (e.g. a StatefulSet's pod name): member ids become
    /// `<id>-<group>-<index>`; a SIGTERM leaves for a restart (the shards wait, unread, for
    /// this id until the session timeout) and a second live pod with the same id is refused.
    #[arg(long, env = "RSC_STATIC_ID")]
    static_id: Option<String>,
    /// Bearer token for the coordinator.
    #[arg(long, env = "RSC_TOKEN", hide_env_values = true)]
    token: Option<SecretString>,
    /// Handler calls of one shard in flight at once, never two of one key.
    #[arg(long, env = "RSC_KEY_CONCURRENCY", default_value_t = 1)]
    key_concurrency: usize,
    /// How long each handling attempt takes, in ms.
    #[arg(long, default_value_t = 0)]
    handle_ms: u64,
    /// Every handling attempt of an entry with this key fails (a poison key).
    #[arg(long)]
    poison_key: Option<String>,
    /// Every handling attempt of the entry whose payload `seq` is this fails (one poison entry).
    #[arg(long)]
    poison_seq: Option<u64>,
    /// The first handling attempt of the entry whose payload `seq` is this fails; the next ones
    /// succeed.
    #[arg(long)]
    flaky_seq: Option<u64>,
    /// The handling of an entry whose key starts with this never ends (a stuck handler).
    #[arg(long)]
    hang_key_prefix: Option<String>,
    /// Probability that a handling attempt fails (0..=1).
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Stream to which every successful handling is recorded.
    #[arg(long)]
    record_stream: Option<String>,
    /// Retries of a failed message before it is dead-lettered.
    #[arg(long, default_value_t = 3)]
    max_retries: u32,
    /// First retry delay in ms (doubles per retry, capped at 10 s).
    #[arg(long, default_value_t = 200)]
    retry_backoff_ms: u64,
    /// Serve `/healthz`, `/readyz` (Kubernetes probes) and `/metrics` (Prometheus) on this
    /// address, e.g. `0.0.0.0:8080`.
    #[arg(long, env = "RSC_HEALTH_LISTEN")]
    health_listen: Option<SocketAddr>,
    /// How long the data Redis may stay unreachable before the pod's members give their
    /// shards back (leave the group until it answers again), in ms (default 15,000).
    #[arg(long, env = "RSC_DATA_REDIS_GRACE_MS")]
    data_redis_grace_ms: Option<u64>,
}

/// The sample producer's payload.
#[derive(Debug, serde::Deserialize)]
struct Sample {
    seq: u64,
    key: String,
}

struct Pod {
    handle: Duration,
    fail_rate: f64,
    poison_key: Option<String>,
    poison_seq: Option<u64>,
    flaky_seq: Option<u64>,
    hang_key_prefix: Option<String>,
    /// Where handlings are recorded: the stream key on the data Redis.
    record: Option<(String, LazyRedis)>,
}

impl Pod {
    async fn handle(&self, msg: Message<Sample>) -> Result<(), HandlerError> {
        let started_ms = unix_ms();
        if !self.handle.is_zero() {
            tokio::time::sleep(self.handle).await;
        }
        let key = msg.key().unwrap_or(&msg.payload().key);
        if let Some(prefix) = &self.hang_key_prefix
            && key.starts_with(prefix.as_str())
        {
            tracing::info!(
                entry_id = msg.id(),
                key,
                "stuck handler: this handling never ends"
            );
            std::future::pending::<()>().await;
        }
        if self.poison_key.as_deref() == Some(key) {
            return Err(HandlerError::retry(format!(
                "poison key {key} (seq {}, attempt {})",
                msg.payload().seq,
                msg.attempt()
            )));
        }
        let seq = msg.payload().seq;
        if self.poison_seq == Some(seq) || (self.flaky_seq == Some(seq) && msg.attempt() == 1) {
            return Err(HandlerError::retry(format!(
                "failing seq {seq} (attempt {})",
                msg.attempt()
            )));
        }
        if self.fail_rate > 0.0 && rand::random::<f64>() < self.fail_rate {
            return Err(HandlerError::retry(format!(
                "injected failure (seq {}, attempt {})",
                msg.payload().seq,
                msg.attempt()
            )));
        }
        if let Some((key, conn)) = &self.record {
            let finished_ms = unix_ms();
            let p = msg.payload();
            let mut cmd = redis::cmd("XADD");
            cmd.arg(key)
                .arg("*")
                .arg("entry_id")
                .arg(msg.id())
                .arg("shard")
                .arg(msg.shard())
                .arg("member")
                .arg(msg.member_id())
                .arg("key")
                .arg(msg.key().unwrap_or(&p.key))
                .arg("seq")
                .arg(p.seq)
                .arg("started_ms")
                .arg(started_ms)
                .arg("finished_ms")
                .arg(finished_ms)
                .arg("attempt")
                .arg(msg.attempt())
                .arg("delivery_count")
                .arg(msg.delivery_count());
            let _: String = cmd.query_async(&mut conn.clone()).await?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The app logs what it does to stderr by default (RUST_LOG or RSC_LOG filter it); the
    // ops subscriber is only needed for JSON lines.
    if std::env::var_os("RSC_LOG_FORMAT").is_some() {
        rsc_client::ops::init_tracing()?;
    }
    let args = Args::parse();
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.fail_rate),
        "--fail-rate must be within 0..=1"
    );
    let sentinel = args
        .redis_sentinel
        .as_deref()
        .zip(args.redis_sentinel_master.as_deref());
    let data =
        rsc_examples::data_redis(args.redis_url.expose_secret(), args.redis_cluster, sentinel)
            .context("--redis-url")?;
    let pod = Pod::new(&args, &data);
    let app = consumer_app(&args, pod)?;
    tracing::info!(members = ?app.member_ids(), "sample consumer starting");
    app.run().await?;
    Ok(())
}

impl Pod {
    /// The pod's handling settings, and its connection to the record stream if it has one.
    fn new(args: &Args, data: &LazyRedis) -> Self {
        Pod {
            handle: Duration::from_millis(args.handle_ms),
            fail_rate: args.fail_rate,
            poison_key: args.poison_key.clone(),
            poison_seq: args.poison_seq,
            flaky_seq: args.flaky_seq,
            hang_key_prefix: args.hang_key_prefix.clone(),
            record: args.record_stream.clone().map(|key| (key, data.clone())),
        }
    }
}

/// The consumer app: one listener of `--group` on `--stream`, the pod as shared state.
fn consumer_app(args: &Args, pod: Pod) -> anyhow::Result<ConsumerApp> {
    /// The handler: the pod's settings arrive as shared state (`Data<Pod>`).
    async fn handler(msg: Message<Sample>, pod: Data<Pod>) -> Result<(), HandlerError> {
        pod.handle(msg).await
    }
    let listener = Listener::new(args.group.clone(), args.stream.clone(), handler)
        .concurrency(args.concurrency)
        .key_concurrency(args.key_concurrency)
        .max_retries(args.max_retries)
        .retry_backoff(
            Duration::from_millis(args.retry_backoff_ms),
            Duration::from_secs(10),
        );
    let mut builder = ConsumerApp::builder()
        .coordinator(&args.coordinator)
        .redis_url(args.redis_url.expose_secret())
        .redis_cluster(args.redis_cluster)
        .instance_id(&args.pod_ip)
        .data(pod)
        .listener(listener);
    if let Some(id) = &args.static_id {
        builder = builder.static_instance_id(id);
    }
    if let Some(t) = &args.token {
        builder = builder.token(t.expose_secret());
    }
    if let Some(ms) = args.data_redis_grace_ms {
        builder = builder.data_redis_grace(Duration::from_millis(ms));
    }
    if let (Some(addrs), Some(master)) = (&args.redis_sentinel, &args.redis_sentinel_master) {
        builder = builder.redis_sentinel(addrs, master);
    }
    if let Some(addr) = args.health_listen {
        // `/healthz`, `/readyz` and `/metrics` while the app runs, until it has stopped.
        builder = builder.ops(addr);
    }
    Ok(builder.build()?)
}
