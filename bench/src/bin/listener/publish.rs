//! The publish figures (P4, P8) and the write options measured for them, all in one run,
//! interleaved in ten chunks per repetition, rotating which goes first:
//!
//! - `raw`: raw pipelined `XADD`s (the baseline);
//! - `unfenced`: `Producer::publish_batch_unfenced` (routing, pipelined `XADD`s): P4;
//! - `idem`: `Producer::publish_batch` (idempotent, the default: `WATCH` of markers and
//!   producer records, the check script, `MULTI`, the `XADD`s, the tail script, `EXEC`) on a
//!   stream never resharded (no epoch markers): the idempotent-but-unfenced path;
//! - `fenced`: the same on a stream resharded once (every shard has its marker): P8;
//! - `fenced_plain`: the same with `idempotent(false)` (no records, no producer fields);
//! - `watch_multi`: the write before idempotence, hand-written: `WATCH <markers>`, `EVAL
//!   <epoch check>`, `MULTI`, the `XADD`s, `EXEC` (one transaction per batch), on the
//!   resharded stream;
//! - `watch_multi_fields`: the same with `producer_id` and `producer_seq` in every entry (the
//!   fields PROTOCOL §2.2 asks of an idempotent producer) and no duplicate check, no producer
//!   record: what any idempotent write that keeps those fields costs at least, so the
//!   highest P8 such a write can reach;
//! - `fenced_fields`: P8 with `producer_fields(true)` (every entry also carries `producer_id`
//!   and `producer_seq`, for consumer-side deduplication): the default before the duplicate
//!   check moved into the producer record alone;
//! - `raw_c`, `fenced_c`, `multi_c`: `--in-flight` publishes at once (default 5), each a task
//!   of its own taking every `in_flight`-th batch: raw pipelined `XADD`s on one multiplexed
//!   connection; P8 (`publish_batch` of the default producer, whose `max_in_flight` is 5, from
//!   that many tasks); and the bare transaction `MULTI; XADD…; EXEC` of the same records (no
//!   `WATCH`, no script): the least any transactional write costs Redis 7.0, so the bound of
//!   P8's design.

use super::{
    PAYLOAD, create_group, own_cpu, raw_publish, redis_cpu, routed_publish, unfenced_publish,
};
use rsc_bench::{Row, summarize};
use rsc_client::producer::{Producer, Record};
use rsc_protocol::entry;
use rsc_protocol::routing::{epoch_key, shard_for_key, shard_key};
use std::time::{Duration, Instant};

/// The producer id `watch_multi_fields` writes (16 hex digits, as a producer's, PROTOCOL §21).
const PRODUCER_ID: &str = "0123456789abcdef";

/// How many variants.
const V: usize = 11;

/// The variants, in their rotation order.
const VARIANTS: [&str; V] = [
    "raw",
    "unfenced",
    "idem",
    "fenced",
    "fenced_plain",
    "watch_multi",
    "watch_multi_fields",
    "fenced_fields",
    "raw_c",
    "fenced_c",
    "multi_c",
];

/// What one section measures: per variant, msgs/s of each repetition; and the Redis and
/// total CPU per 1,000 messages of `raw` and `fenced`.
#[derive(Default)]
struct Samples {
    rate: [Vec<f64>; V],
    redis_cpu: [Vec<f64>; V],
    total_cpu: [Vec<f64>; V],
    own_cpu: [Vec<f64>; V],
}

/// Everything a section needs.
pub(crate) struct Setup<'a> {
    pub(crate) url: &'a str,
    pub(crate) redis_url: String,
    pub(crate) http: &'a reqwest::Client,
    pub(crate) con: &'a mut redis::aio::MultiplexedConnection,
    pub(crate) shards: u32,
    pub(crate) batch: usize,
    pub(crate) in_flight: usize,
    pub(crate) n: u64,
    pub(crate) reps: usize,
}

/// Creates a stream of `shards` shards, resharded once (from one fewer) when `marked`, so that
/// every shard carries its epoch marker.
async fn stream(s: &mut Setup<'_>, name: &str, marked: bool) -> anyhow::Result<()> {
    let from = if marked {
        s.shards.saturating_sub(1).max(1)
    } else {
        s.shards
    };
    create_group(s.url, &format!("g-{name}"), name, from, "lease").await?;
    if from != s.shards {
        let r = (s.http)
            .post(format!("{}/v1/streams/{name}/reshard", s.url))
            .json(&serde_json::json!({"shard_count": s.shards}))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "reshard: {}", r.text().await?);
    }
    Ok(())
}

/// The write before idempotence, by hand: one `WATCH`ed, script-checked transaction per
/// batch of keyed records (as P8 measured it until then); with `producer_fields`, every entry
/// also carries `producer_id` and `producer_seq` (nothing checks or records them).
async fn watch_multi_publish(
    con: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    (shards, epoch): (u32, u64),
    n: u64,
    batch: usize,
    producer_fields: bool,
) -> anyhow::Result<Duration> {
    let check: String = (rsc_protocol::routing::EPOCH_CHECK_LUA.lines())
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let started = Instant::now();
    let (mut i, mut seq) = (0u64, 0u64);
    while i < n {
        let end = (i + batch as u64).min(n);
        let placed: Vec<(String, u32)> = (i..end)
            .map(|j| {
                let key = format!("k{}", j % 1000);
                let shard = shard_for_key(key.as_bytes(), shards);
                (key, shard)
            })
            .collect();
        let mut touched: Vec<u32> = placed.iter().map(|p| p.1).collect();
        touched.sort_unstable();
        touched.dedup();
        let markers: Vec<String> = touched
            .iter()
            .map(|&s| epoch_key(&shard_key(stream, s)))
            .collect();
        let mut pipe = redis::pipe();
        pipe.cmd("WATCH").arg(&markers);
        pipe.cmd("EVAL")
            .arg(&check)
            .arg(markers.len())
            .arg(&markers)
            .arg(epoch);
        pipe.cmd("MULTI");
        for (key, shard) in &placed {
            let xadd = pipe.cmd("XADD");
            xadd.arg(shard_key(stream, *shard))
                .arg("*")
                .arg("payload")
                .arg(PAYLOAD)
                .arg("key")
                .arg(key);
            if producer_fields {
                seq += 1;
                xadd.arg(entry::PRODUCER_ID)
                    .arg(PRODUCER_ID)
                    .arg(entry::PRODUCER_SEQ)
                    .arg(seq);
            }
        }
        pipe.cmd("EXEC");
        let _: Vec<redis::Value> = pipe.query_async(con).await?;
        i = end;
    }
    Ok(started.elapsed())
}

/// Runs `one(first, end)` for every batch of `n` messages, `c` tasks at once (task `j` takes
/// batches `j`, `j + c`, …); the time taken.
async fn concurrently<F, Fut>(n: u64, batch: usize, c: usize, one: F) -> anyhow::Result<Duration>
where
    F: Fn(u64, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let (batch, c) = (batch as u64, c as u64);
    let batches = n.div_ceil(batch);
    let mut tasks = tokio::task::JoinSet::new();
    for j in 0..c {
        let one = one.clone();
        tasks.spawn(async move {
            let mut b = j;
            while b < batches {
                let i = b * batch;
                one(i, (i + batch).min(n)).await?;
                b += c;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(started.elapsed())
}

/// `XADD`s of messages `first..end` (as [`super::raw_publish`] places them) on `pipe`.
fn raw_xadds(pipe: &mut redis::Pipeline, stream: &str, shards: u32, first: u64, end: u64) {
    for i in first..end {
        pipe.cmd("XADD")
            .arg(shard_key(stream, (i % u64::from(shards)) as u32))
            .arg("*")
            .arg("payload")
            .arg(PAYLOAD)
            .arg("key")
            .arg(format!("k{}", i % 1000));
    }
}

/// Raw pipelined `XADD`s, or (`multi`) each batch as the bare transaction `MULTI; XADD…;
/// EXEC`, `c` batches in flight on one multiplexed connection; the time taken.
async fn raw_concurrent(
    con: &redis::aio::MultiplexedConnection,
    stream: &str,
    (shards, n, batch, c): (u32, u64, usize, usize),
    multi: bool,
) -> anyhow::Result<Duration> {
    let (con, stream) = (con.clone(), stream.to_owned());
    concurrently(n, batch, c, move |first, end| {
        let (mut con, stream) = (con.clone(), stream.clone());
        async move {
            let mut pipe = redis::pipe();
            if multi {
                pipe.atomic();
            }
            raw_xadds(&mut pipe, &stream, shards, first, end);
            let _: Vec<String> = pipe.query_async(&mut con).await?;
            Ok(())
        }
    })
    .await
}

/// `Producer::publish_batch` of the same messages from `c` tasks at once; the time taken.
async fn routed_concurrent(
    producer: &Producer,
    stream: &str,
    (n, batch, c): (u64, usize, usize),
) -> anyhow::Result<Duration> {
    producer.routing(stream).await?;
    let (producer, stream) = (producer.clone(), stream.to_owned());
    concurrently(n, batch, c, move |first, end| {
        let (producer, stream) = (producer.clone(), stream.clone());
        async move {
            let records = (first..end).map(|j| Record::raw(PAYLOAD).key(format!("k{}", j % 1000)));
            producer.publish_batch(&stream, records).await?;
            Ok(())
        }
    })
    .await
}

/// The machine's load average over the last minute (`/proc/loadavg`), for the log.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Runs the section; the rows of P4, P8 and the options.
pub(crate) async fn section(mut s: Setup<'_>) -> anyhow::Result<Vec<Row>> {
    let idem = Producer::builder()
        .coordinator(s.url)
        .redis_url(s.redis_url.clone())
        .build()?;
    let plain = Producer::builder()
        .coordinator(s.url)
        .redis_url(s.redis_url.clone())
        .idempotent(false)
        .build()?;
    let fields = Producer::builder()
        .coordinator(s.url)
        .redis_url(s.redis_url.clone())
        .producer_fields(true)
        .build()?;
    let mut samples = Samples::default();
    for rep in 0..s.reps {
        let names: Vec<String> = VARIANTS.iter().map(|v| format!("pub-{v}-{rep}")).collect();
        for (v, name) in names.iter().enumerate() {
            stream(&mut s, name, v >= 3).await?;
        }
        let epochs = (
            plain.refresh_routing(&names[5]).await?.routing_epoch,
            plain.refresh_routing(&names[6]).await?.routing_epoch,
        );
        let chunk = (s.n / 10).max(1);
        let mut took = [Duration::ZERO; V];
        let mut rcpu = [0.0; V];
        let mut own = [0.0; V];
        let conc = (s.shards, chunk, s.batch, s.in_flight);
        for c in 0..10 {
            for k in 0..VARIANTS.len() {
                let v = (c + k) % VARIANTS.len();
                let (before, own0) = (redis_cpu(s.con).await?, own_cpu()?);
                let name = &names[v];
                took[v] += match v {
                    0 => raw_publish(s.con, name, s.shards, chunk, s.batch).await?,
                    1 => unfenced_publish(&idem, name, chunk, s.batch).await?,
                    2 | 3 => routed_publish(&idem, name, chunk, s.batch).await?,
                    4 => routed_publish(&plain, name, chunk, s.batch).await?,
                    5 => {
                        let at = (s.shards, epochs.0);
                        watch_multi_publish(s.con, name, at, chunk, s.batch, false).await?
                    }
                    6 => {
                        let at = (s.shards, epochs.1);
                        watch_multi_publish(s.con, name, at, chunk, s.batch, true).await?
                    }
                    7 => routed_publish(&fields, name, chunk, s.batch).await?,
                    8 => raw_concurrent(s.con, name, conc, false).await?,
                    9 => routed_concurrent(&idem, name, (chunk, s.batch, s.in_flight)).await?,
                    _ => raw_concurrent(s.con, name, conc, true).await?,
                };
                own[v] += own_cpu()? - own0;
                rcpu[v] += redis_cpu(s.con).await? - before;
            }
        }
        let msgs = (chunk * 10) as f64;
        let per_k = |cpu: f64| cpu * 1e3 / (msgs / 1e3);
        for v in 0..VARIANTS.len() {
            samples.rate[v].push(msgs / took[v].as_secs_f64());
            samples.redis_cpu[v].push(per_k(rcpu[v]));
            samples.total_cpu[v].push(per_k(rcpu[v] + own[v]));
            samples.own_cpu[v].push(per_k(own[v]));
        }
        let line: Vec<String> = (0..VARIANTS.len())
            .map(|v| {
                let r = samples.rate[v][rep];
                let cpu = (samples.redis_cpu[v][rep], samples.own_cpu[v][rep]);
                format!(
                    "{} {r:.0} ({:.2}; Redis {:.2} ms, producer {:.2} ms per 1k)",
                    VARIANTS[v],
                    r / samples.rate[0][rep],
                    cpu.0,
                    cpu.1
                )
            })
            .collect();
        eprintln!(
            "rep {rep} (load average {}; {} in flight in raw_c, fenced_c, multi_c): publish msgs/s (ratio to raw): {}",
            load(),
            s.in_flight,
            line.join(", ")
        );
        let _: () = redis::cmd("FLUSHALL").query_async(s.con).await?;
    }
    let mut out = rows(&samples, s.batch, s.n);
    out.extend(concurrent_rows(&samples, s.batch, s.in_flight));
    Ok(out)
}

/// The rows of the variants with several publishes in flight.
fn concurrent_rows(x: &Samples, batch: usize, c: usize) -> Vec<Row> {
    let row = |name: String, unit: &str, v: &[f64], b: &[f64], goal: &str| Row {
        name,
        unit: unit.into(),
        value: summarize(v),
        baseline: Some(summarize(b)),
        goal: goal.into(),
    };
    let raw_goal = format!("(baseline: raw pipelined XADD, {c} pipelines in flight, same run)");
    vec![
        row(
            format!(
                "P8 with {c} publishes in flight (batch {batch}, max_in_flight 5) vs raw XADD with {c} in flight"
            ),
            "msgs/s",
            &x.rate[9],
            &x.rate[8],
            &format!("ratio >= 0.9 {raw_goal}"),
        ),
        row(
            format!("P8 ({c} in flight) Redis CPU per 1,000 messages vs raw XADD ({c} in flight)"),
            "ms",
            &x.redis_cpu[9],
            &x.redis_cpu[8],
            "- (INFO cpu of the Redis server, same chunks)",
        ),
        row(
            format!(
                "P8 ({c} in flight) producer process CPU per 1,000 messages vs raw XADD ({c} in flight)"
            ),
            "ms",
            &x.own_cpu[9],
            &x.own_cpu[8],
            "- (getrusage of this process, same chunks)",
        ),
        row(
            format!(
                "bound: bare MULTI; {batch} XADD; EXEC ({c} in flight) vs raw XADD ({c} in flight)"
            ),
            "msgs/s",
            &x.rate[10],
            &x.rate[8],
            &format!("- (the most a transactional write can reach on this server) {raw_goal}"),
        ),
        row(
            format!(
                "bound: Redis CPU per 1,000 messages, bare MULTI/EXEC vs raw XADD ({c} in flight)"
            ),
            "ms",
            &x.redis_cpu[10],
            &x.redis_cpu[8],
            "- (INFO cpu of the Redis server, same chunks)",
        ),
    ]
}

fn rows(x: &Samples, batch: usize, n: u64) -> Vec<Row> {
    let row = |name: String, unit: &str, v: &[f64], b: &[f64], goal: &str| Row {
        name,
        unit: unit.into(),
        value: summarize(v),
        baseline: Some(summarize(b)),
        goal: goal.into(),
    };
    let raw_goal = "(baseline: raw pipelined XADD, same run)";
    vec![
        row(
            format!("P4 routed publish_batch, unfenced (batch {batch}, {n} msgs)"),
            "msgs/s",
            &x.rate[1],
            &x.rate[0],
            "ratio >= 0.95 (baseline: raw pipelined XADD)",
        ),
        row(
            format!("P8 routed, epoch-guarded, idempotent publish_batch (batch {batch}, {n} msgs)"),
            "msgs/s",
            &x.rate[3],
            &x.rate[0],
            &format!("ratio >= 0.9 {raw_goal}"),
        ),
        row(
            "P8 idempotent publish_batch on a stream without epoch markers vs raw".into(),
            "msgs/s",
            &x.rate[2],
            &x.rate[0],
            &format!("- {raw_goal}"),
        ),
        row(
            "P8 idempotent publish_batch without markers vs P4 (unfenced routed)".into(),
            "msgs/s",
            &x.rate[2],
            &x.rate[1],
            "- (baseline: publish_batch_unfenced, same run)",
        ),
        row(
            "P8 option: epoch-guarded publish_batch, idempotent(false) vs raw".into(),
            "msgs/s",
            &x.rate[4],
            &x.rate[0],
            &format!("- {raw_goal}"),
        ),
        row(
            "P8 option: WATCH + check + MULTI/XADD/EXEC (the write before idempotence) vs raw".into(),
            "msgs/s",
            &x.rate[5],
            &x.rate[0],
            &format!("- {raw_goal}"),
        ),
        row(
            "P8 bound: the WATCH/MULTI write with producer_id and producer_seq in every entry, no duplicate check, vs raw".into(),
            "msgs/s",
            &x.rate[6],
            &x.rate[0],
            &format!("- (the most any idempotent write keeping the entry fields can reach) {raw_goal}"),
        ),
        row(
            "P8 Redis CPU per 1,000 messages published, epoch-guarded idempotent vs raw XADD".into(),
            "ms",
            &x.redis_cpu[3],
            &x.redis_cpu[0],
            "- (INFO cpu of the Redis server, same run)",
        ),
        row(
            "P8 Redis CPU per 1,000 messages, WATCH/MULTI write vs raw XADD".into(),
            "ms",
            &x.redis_cpu[5],
            &x.redis_cpu[0],
            "- (INFO cpu of the Redis server, same run)",
        ),
        row(
            "P8 Redis CPU per 1,000 messages, WATCH/MULTI write with the producer fields vs raw XADD".into(),
            "ms",
            &x.redis_cpu[6],
            &x.redis_cpu[0],
            "- (INFO cpu of the Redis server, same run)",
        ),
        row(
            "P8 option: producer_fields(true) (the entry fields for consumer-side dedup; the default before) vs raw".into(),
            "msgs/s",
            &x.rate[7],
            &x.rate[0],
            &format!("- {raw_goal}"),
        ),
        row(
            "P8 default vs producer_fields(true) (the previous default), same run".into(),
            "msgs/s",
            &x.rate[3],
            &x.rate[7],
            "- (baseline: the same producer writing producer_id/producer_seq in every entry)",
        ),
        row(
            "P8 idempotent publish_batch without markers vs raw: producer process CPU per 1,000 messages".into(),
            "ms",
            &x.own_cpu[2],
            &x.own_cpu[0],
            "- (getrusage of this process, same chunks)",
        ),
        row(
            "P8 producer process CPU per 1,000 messages, epoch-guarded idempotent vs raw XADD".into(),
            "ms",
            &x.own_cpu[3],
            &x.own_cpu[0],
            "- (getrusage of this process, same chunks)",
        ),
        row(
            "P8 Redis CPU per 1,000 messages, idempotent without markers vs P4 (unfenced routed)".into(),
            "ms",
            &x.redis_cpu[2],
            &x.redis_cpu[1],
            "- (INFO cpu of the Redis server, same run)",
        ),
        row(
            "P8 CPU per 1,000 messages published (producer process + Redis server), epoch-guarded idempotent vs raw XADD".into(),
            "ms",
            &x.total_cpu[3],
            &x.total_cpu[0],
            "- (getrusage of this process + INFO cpu of the Redis server, same chunks)",
        ),
    ]
}
