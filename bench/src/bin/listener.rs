//! Listener and producer throughput, each beside a hand-written redis-rs baseline measured in
//! the same run on the same Redis:
//!
//! - **consume**: a `ConsumerApp` with one member reading a pre-filled stream of S shards
//!   (XAUTOCLAIM, XREADGROUP COUNT c, handler, XACK) against one task per shard running a bare
//!   `XREADGROUP COUNT c` + `XACK` loop. Goal: ratio ≥ 0.9.
//! - **strict fencing**: the same listener on a group with `fencing: "strict"` (guarded
//!   reads as `WATCH`ed transactions, owner tokens) against a group with `fencing: "lease"`
//!   on the same pre-filled stream, in alternating order. Goal: ratio ≥ 0.9. Beside the rate,
//!   the Redis server's CPU time per 1,000 messages of each (`INFO cpu`), which the machine's
//!   other load does not move.
//! - **batch listener** (P10): a handler that makes one Redis round trip per call (`INCRBY`
//!   on a counter, through a `Data<T>` connection) as a batch listener (`Listener::batch`,
//!   `max_batch` = COUNT) against the same handler as a single-message listener and against
//!   a hand-written `XREADGROUP` + `INCRBY` + `XACK` loop per shard, on one pre-filled stream,
//!   same run, rotating which goes first. Goal: batch ≥ 1.5× the single-message listener.
//!   `--only batch` runs this section alone.
//! - **publish**: `Producer::publish_batch` (routing by key) against a raw pipeline of the
//!   same XADDs. Goal: ratio ≥ 0.95 (P4, the unfenced path) and, with the routing-epoch fence
//!   of ordered resharding and idempotence (one script call per shard, on a stream resharded
//!   once so every shard has its epoch marker), ratio ≥ 0.9 (P8); beside them the options
//!   measured (`listener/publish.rs`). `--only publish` runs this section alone.
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p rsc-bench --bin listener [-- --quick]
//! ```

use anyhow::Context;
use clap::Parser;
use redis::AsyncCommands;
use rsc_bench::{Row, emit, summarize};
use rsc_client::producer::{Producer, Record};
use rsc_client::{Batch, ConsumerApp, Data, HandlerError, Listener, Message, Raw};
use rsc_protocol::routing::shard_key;
use rsc_testkit::{CoordinatorProcess, RedisServer};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

#[path = "listener/publish.rs"]
mod publish;

#[derive(Debug, Parser)]
#[command(about = "Listener and producer throughput against redis-rs baselines")]
struct Args {
    /// Fewer messages (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Repetitions of each figure (median, min, max are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Messages per repetition (default 100000, or 20000 with --quick).
    #[arg(long)]
    messages: Option<u64>,
    /// Shards of the stream.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// XREADGROUP COUNT, for both the listener and the baseline.
    #[arg(long, default_value_t = 64)]
    count: usize,
    /// Records per publish pipeline.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Publishes in flight at once in the concurrent publish variants (raw pipelined `XADD`,
    /// the bare `MULTI`/`EXEC`, and P8 with the producer's default `max_in_flight`): the
    /// same concurrency offered to each.
    #[arg(long, default_value_t = 5)]
    in_flight: usize,
    /// Run one section only (`batch`: the batch listener comparison, P10; `publish`: P4, P8
    /// and the write options; `consume`: P3 with and without the shared reader).
    #[arg(long)]
    only: Option<String>,
}

/// What the P10 handlers share: a connection for their one round trip per call, and the
/// count of messages handled.
struct Work {
    con: redis::aio::MultiplexedConnection,
    handled: AtomicU64,
    n: u64,
    done: Notify,
}

impl Work {
    fn count(&self, k: u64) {
        if self.handled.fetch_add(k, Ordering::Relaxed) + k >= self.n {
            self.done.notify_one();
        }
    }
}

async fn work_one(msg: Message<Raw>, work: Data<Work>) -> Result<(), HandlerError> {
    std::hint::black_box(msg.payload());
    let _: i64 = work.con.clone().incr("p10:work", 1).await?;
    work.count(1);
    Ok(())
}

async fn work_batch(batch: Batch<Raw>, work: Data<Work>) -> Result<(), HandlerError> {
    std::hint::black_box(batch.messages());
    let k = batch.len() as u64;
    let _: i64 = work.con.clone().incr("p10:work", k).await?;
    work.count(k);
    Ok(())
}

/// A `ConsumerApp` with one member running the P10 handler (batch or single) until `n`
/// messages were handled; msgs/s.
#[allow(clippy::too_many_arguments)]
async fn work_consume(
    client: &redis::Client,
    redis_url: &str,
    coordinator: &str,
    stream: &str,
    group: &str,
    n: u64,
    count: usize,
    batch: bool,
) -> anyhow::Result<f64> {
    let work = Arc::new(Work {
        con: client.get_multiplexed_async_connection().await?,
        handled: AtomicU64::new(0),
        n,
        done: Notify::new(),
    });
    let listener = if batch {
        Listener::batch(group, stream, work_batch).max_batch(count)
    } else {
        Listener::new(group, stream, work_one).batch_size(count)
    };
    let app = ConsumerApp::builder()
        .coordinator(coordinator)
        .redis_url(redis_url)
        .instance_id("bench")
        .data_arc(work.clone())
        .listener(listener)
        .build()?;
    let handle = app.handle();
    let started = Instant::now();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    work.done.notified().await;
    let elapsed = started.elapsed();
    handle.shutdown();
    run.await??;
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// One task per shard: XREADGROUP COUNT c, one INCRBY (the handler's round trip), XACK,
/// until `n` entries in total; msgs/s.
async fn raw_work_consume(
    client: &redis::Client,
    stream: &str,
    group: &str,
    shards: u32,
    n: u64,
    count: usize,
) -> anyhow::Result<f64> {
    let total = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..shards {
        let key = shard_key(stream, s);
        let mut con = client.get_multiplexed_async_connection().await?;
        let mut work = client.get_multiplexed_async_connection().await?;
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut con)
            .await;
        if let Err(e) = r {
            anyhow::ensure!(e.code() == Some("BUSYGROUP"), "{e}");
        }
        let (group, total) = (group.to_owned(), total.clone());
        tasks.push(tokio::spawn(async move {
            let opts = redis::streams::StreamReadOptions::default()
                .group(&group, "raw")
                .count(count)
                .block(100);
            loop {
                let reply: Option<redis::streams::StreamReadReply> =
                    con.xread_options(&[&key], &[">"], &opts).await?;
                let ids: Vec<String> = reply
                    .into_iter()
                    .flat_map(|r| r.keys)
                    .flat_map(|k| k.ids)
                    .map(|i| i.id)
                    .collect();
                if ids.is_empty() {
                    if total.load(Ordering::Relaxed) >= n {
                        return Ok::<(), redis::RedisError>(());
                    }
                    continue;
                }
                let _: i64 = work.incr("p10:work", ids.len()).await?;
                let _: i64 = con.xack(&key, &group, &ids).await?;
                total.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    let mut elapsed = None;
    while elapsed.is_none() {
        if total.load(Ordering::Relaxed) >= n {
            elapsed = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / elapsed.unwrap_or_default().as_secs_f64())
}

/// P10: batch listener, single-message listener and hand-written loop on one pre-filled
/// stream, each `reps` times, rotating the order; (batch, single, raw) msgs/s.
#[allow(clippy::too_many_arguments)]
async fn batch_section(
    client: &redis::Client,
    redis_url: &str,
    con: &mut redis::aio::MultiplexedConnection,
    url: &str,
    args: &Args,
    n: u64,
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let (mut batch, mut single, mut raw) = (vec![], vec![], vec![]);
    for rep in 0..reps {
        let stream = format!("p10-{rep}");
        raw_publish(con, &stream, args.shards, n, 500).await?;
        for turn in 0..3 {
            match (rep + turn) % 3 {
                0 => {
                    let g = format!("p10b-{rep}");
                    create_group(url, &g, &stream, args.shards, "lease").await?;
                    batch.push(
                        work_consume(client, redis_url, url, &stream, &g, n, args.count, true)
                            .await?,
                    );
                }
                1 => {
                    let g = format!("p10s-{rep}");
                    create_group(url, &g, &stream, args.shards, "lease").await?;
                    single.push(
                        work_consume(client, redis_url, url, &stream, &g, n, args.count, false)
                            .await?,
                    );
                }
                _ => {
                    let g = format!("p10r-{rep}");
                    raw.push(
                        raw_work_consume(client, &stream, &g, args.shards, n, args.count).await?,
                    );
                }
            }
        }
        eprintln!(
            "rep {rep}: batch listener {:.0}, single-message listener {:.0}, hand-written loop {:.0} msgs/s",
            batch[rep], single[rep], raw[rep]
        );
        let _: () = redis::cmd("FLUSHALL").query_async(con).await?;
    }
    let what = format!(
        "({} shards, batch/COUNT {}, one INCRBY per handler call, {n} msgs)",
        args.shards, args.count
    );
    Ok(vec![
        Row {
            name: format!("P10 batch listener {what} vs single-message listener"),
            unit: "msgs/s".into(),
            value: summarize(&batch),
            baseline: Some(summarize(&single)),
            goal: "ratio >= 1.5 (baseline: the same handler as a single-message listener)".into(),
        },
        Row {
            name: "P10 batch listener vs hand-written XREADGROUP + INCRBY + XACK loop".into(),
            unit: "msgs/s".into(),
            value: summarize(&batch),
            baseline: Some(summarize(&raw)),
            goal: "- (baseline: redis-rs loop per shard, one INCRBY per read)".into(),
        },
    ])
}

const PAYLOAD: &str = r#"{"order":12345,"customer":"c-42","total_cents":1999}"#;

async fn create_group(
    url: &str,
    group: &str,
    stream: &str,
    shards: u32,
    fencing: &str,
) -> anyhow::Result<()> {
    rsc_bench::create_group(
        url,
        serde_json::json!({"group": group, "stream": stream, "shard_count": shards,
            "fencing": fencing}),
    )
    .await
}

/// Raw pipelined XADDs of `n` keyed messages over the shards; returns the time taken.
async fn raw_publish(
    con: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    shards: u32,
    n: u64,
    batch: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut i = 0u64;
    while i < n {
        let mut pipe = redis::pipe();
        for _ in 0..batch.min((n - i) as usize) {
            let key = format!("k{}", i % 1000);
            pipe.cmd("XADD")
                .arg(shard_key(stream, (i % u64::from(shards)) as u32))
                .arg("*")
                .arg("payload")
                .arg(PAYLOAD)
                .arg("key")
                .arg(&key);
            i += 1;
        }
        let _: Vec<String> = pipe.query_async(con).await?;
    }
    Ok(started.elapsed())
}

/// `Producer::publish_batch` of the same messages; returns the time taken.
async fn routed_publish(
    producer: &Producer,
    stream: &str,
    n: u64,
    batch: usize,
) -> anyhow::Result<Duration> {
    producer.routing(stream).await?; // routing fetched once, as a long-lived producer has it
    let started = Instant::now();
    let mut i = 0u64;
    while i < n {
        let end = (i + batch as u64).min(n);
        let records = (i..end).map(|j| Record::raw(PAYLOAD).key(format!("k{}", j % 1000)));
        producer.publish_batch(stream, records).await?;
        i = end;
    }
    Ok(started.elapsed())
}

/// `Producer::publish_batch_unfenced` (routing by key, pipelined XADD without the epoch
/// fence) of the same messages; returns the time taken.
async fn unfenced_publish(
    producer: &Producer,
    stream: &str,
    n: u64,
    batch: usize,
) -> anyhow::Result<Duration> {
    producer.routing(stream).await?;
    let started = Instant::now();
    let mut i = 0u64;
    while i < n {
        let end = (i + batch as u64).min(n);
        let records: Vec<Record> = (i..end)
            .map(|j| Record::raw(PAYLOAD).key(format!("k{}", j % 1000)))
            .collect();
        producer.publish_batch_unfenced(stream, &records).await?;
        i = end;
    }
    Ok(started.elapsed())
}

/// One task per shard: XREADGROUP COUNT c, XACK, until `n` entries in total; msgs/s.
async fn raw_consume(
    client: &redis::Client,
    stream: &str,
    group: &str,
    shards: u32,
    n: u64,
    count: usize,
) -> anyhow::Result<f64> {
    let total = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..shards {
        let key = shard_key(stream, s);
        let mut con = client.get_multiplexed_async_connection().await?;
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut con)
            .await;
        if let Err(e) = r {
            anyhow::ensure!(e.code() == Some("BUSYGROUP"), "{e}");
        }
        let (group, total) = (group.to_owned(), total.clone());
        tasks.push(tokio::spawn(async move {
            let opts = redis::streams::StreamReadOptions::default()
                .group(&group, "raw")
                .count(count)
                .block(100);
            loop {
                let reply: Option<redis::streams::StreamReadReply> =
                    con.xread_options(&[&key], &[">"], &opts).await?;
                let ids: Vec<String> = reply
                    .into_iter()
                    .flat_map(|r| r.keys)
                    .flat_map(|k| k.ids)
                    .map(|i| i.id)
                    .collect();
                if ids.is_empty() {
                    if total.load(Ordering::Relaxed) >= n {
                        return Ok::<(), redis::RedisError>(());
                    }
                    continue;
                }
                let _: i64 = con.xack(&key, &group, &ids).await?;
                total.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    let mut elapsed = None;
    while elapsed.is_none() {
        if total.load(Ordering::Relaxed) >= n {
            elapsed = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / elapsed.unwrap_or_default().as_secs_f64())
}

/// This process's CPU time so far (user + system, every thread), in seconds.
fn own_cpu() -> anyhow::Result<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(secs(u.user_time()) + secs(u.system_time()))
}

/// The Redis server's CPU time so far (`used_cpu_user + used_cpu_sys`), in seconds.
/// Redis' calls per command so far (`INFO commandstats`), to count a reader's commands.
async fn redis_calls(
    con: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect())
}

async fn redis_cpu(con: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .with_context(|| format!("INFO cpu without {name}"))
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// [`listener_consume`], with the Redis server's CPU milliseconds per 1,000 messages.
async fn listener_consume_cpu(
    con: &mut redis::aio::MultiplexedConnection,
    coordinator: &str,
    redis_url: &str,
    stream: &str,
    group: &str,
    n: u64,
    count: usize,
) -> anyhow::Result<(f64, f64)> {
    let before = redis_cpu(con).await?;
    let rate = listener_consume(coordinator, redis_url, stream, group, n, count).await?;
    let cpu = redis_cpu(con).await? - before;
    Ok((rate, cpu * 1e3 / (n as f64 / 1e3)))
}

/// A `ConsumerApp` with one member of `group` until `n` messages were handled; msgs/s.
async fn listener_consume(
    coordinator: &str,
    redis_url: &str,
    stream: &str,
    group: &str,
    n: u64,
    count: usize,
) -> anyhow::Result<f64> {
    let at = (stream, group, n, count);
    Ok(listener_consume_with(coordinator, redis_url, at, true)
        .await?
        .0)
}

/// [`listener_consume`] with the shared reader on or off; (msgs/s, seconds from the start
/// to the first message handled).
async fn listener_consume_with(
    coordinator: &str,
    redis_url: &str,
    (stream, group, n, count): (&str, &str, u64, usize),
    shared: bool,
) -> anyhow::Result<(f64, f64)> {
    let first = Arc::new(std::sync::OnceLock::<Instant>::new());
    let f = first.clone();
    let handled = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let (h, d) = (handled.clone(), done.clone());
    let listener = Listener::new(group, stream, move |msg: Message<Raw>| {
        let (h, d) = (h.clone(), d.clone());
        f.get_or_init(Instant::now);
        async move {
            std::hint::black_box(msg.payload());
            if h.fetch_add(1, Ordering::Relaxed) + 1 == n {
                d.notify_one();
            }
            Ok::<(), HandlerError>(())
        }
    })
    .batch_size(count);
    let app = ConsumerApp::builder()
        .coordinator(coordinator)
        .redis_url(redis_url)
        .instance_id("bench")
        .shared_reader(shared)
        .listener(listener)
        .build()?;
    let handle = app.handle();
    let started = Instant::now();
    let run = tokio::spawn(app.run_until(std::future::pending()));
    done.notified().await;
    let elapsed = started.elapsed();
    handle.shutdown();
    run.await??;
    let first = first.get().map_or(0.0, |t| (*t - started).as_secs_f64());
    Ok((n as f64 / elapsed.as_secs_f64(), first))
}

/// `--only consume`: P3 alone, the listener with the shared reader (the default) and with
/// `shared_reader(false)` against the hand-written loop, same stream, rotating the order.
async fn consume_section(
    client: &redis::Client,
    con: &mut redis::aio::MultiplexedConnection,
    (url, redis_url): (&str, &str),
    args: &Args,
    n: u64,
    reps: usize,
) -> anyhow::Result<Vec<Row>> {
    let (mut raw, mut shared, mut dedicated) = (vec![], vec![], vec![]);
    // Per variant (raw, shared, per-shard): this process's and Redis' CPU ms per 1,000.
    let mut cpu: [Vec<(f64, f64)>; 3] = Default::default();
    let per_k = |secs: f64| secs * 1e3 / (n as f64 / 1e3);
    for rep in 0..reps {
        let stream = format!("con-{rep}");
        for g in ["cg", "dg"] {
            create_group(url, &format!("{g}-{rep}"), &stream, args.shards, "lease").await?;
        }
        raw_publish(con, &stream, args.shards, n, 500).await?;
        let mut firsts = [0.0; 2];
        for k in 0..3 {
            let (own0, redis0) = (own_cpu()?, redis_cpu(con).await?);
            let calls0 = redis_calls(con).await?;
            let v = (rep + k) % 3;
            match v {
                0 => raw.push(
                    raw_consume(
                        client,
                        &stream,
                        &format!("raw-{rep}"),
                        args.shards,
                        n,
                        args.count,
                    )
                    .await?,
                ),
                v => {
                    let on = v == 1;
                    let g = format!("{}-{rep}", if on { "cg" } else { "dg" });
                    let at = (stream.as_str(), g.as_str(), n, args.count);
                    let (rate, first) = listener_consume_with(url, redis_url, at, on).await?;
                    firsts[usize::from(!on)] = first;
                    if on {
                        shared.push(rate)
                    } else {
                        dedicated.push(rate)
                    }
                }
            }
            let used = (own_cpu()? - own0, redis_cpu(con).await? - redis0);
            cpu[v].push((per_k(used.0), per_k(used.1)));
            let calls: Vec<String> = redis_calls(con)
                .await?
                .into_iter()
                .filter_map(|(c, total)| {
                    let d = total - calls0.get(&c).copied().unwrap_or(0);
                    (d > 0).then(|| format!("{c} {:.2}", d as f64 * 1e3 / n as f64))
                })
                .collect();
            eprintln!(
                "rep {rep} {}: Redis commands per 1k msgs: {}",
                ["raw", "shared", "per-shard"][v],
                calls.join(", ")
            );
        }
        eprintln!(
            "rep {rep}: CPU per 1k (process, Redis): raw {:.2?}, shared {:.2?}, per-shard {:.2?} ms",
            cpu[0][rep], cpu[1][rep], cpu[2][rep]
        );
        eprintln!(
            "rep {rep}: consume raw {:.0}, listener shared {:.0} ({:.2}; first message after \
             {:.0} ms), per-shard {:.0} ({:.2}; first after {:.0} ms) msgs/s",
            raw[rep],
            shared[rep],
            shared[rep] / raw[rep],
            firsts[0] * 1e3,
            dedicated[rep],
            dedicated[rep] / raw[rep],
            firsts[1] * 1e3,
        );
        let _: () = redis::cmd("FLUSHALL").query_async(con).await?;
    }
    let name = |what: &str| {
        format!(
            "P3 listener consume{what} ({} shards, COUNT {}, {n} msgs) vs redis-rs loop",
            args.shards, args.count
        )
    };
    let row = |name: String, v: &[f64]| Row {
        name,
        unit: "msgs/s".into(),
        value: summarize(v),
        baseline: Some(summarize(&raw)),
        goal: "ratio >= 0.9 (baseline: redis-rs XREADGROUP + XACK loop per shard)".into(),
    };
    let ms = |name: &str, v: &[f64], b: &[f64]| Row {
        name: format!("P3 {name} CPU per 1,000 messages consumed, vs redis-rs loop"),
        unit: "ms".into(),
        value: summarize(v),
        baseline: Some(summarize(b)),
        goal: "- (getrusage of this process / INFO cpu of Redis, same run)".into(),
    };
    let col = |v: usize, redis: bool| -> Vec<f64> {
        cpu[v]
            .iter()
            .map(|c| if redis { c.1 } else { c.0 })
            .collect()
    };
    Ok(vec![
        row(name(""), &shared),
        row(name(", shared_reader(false)"), &dedicated),
        ms(
            "consumer process, listener (shared reader),",
            &col(1, false),
            &col(0, false),
        ),
        ms(
            "consumer process, listener shared_reader(false),",
            &col(2, false),
            &col(0, false),
        ),
        ms(
            "Redis, listener (shared reader),",
            &col(1, true),
            &col(0, true),
        ),
        ms(
            "Redis, listener shared_reader(false),",
            &col(2, true),
            &col(0, true),
        ),
    ])
}

/// `redis-benchmark` XADD on the same server (pipelined, `clients` connections): the
/// physical limit of writing entries to this Redis on this machine; entries/s.
fn redis_benchmark_xadd(port: u16, n: u64, clients: usize) -> anyhow::Result<f64> {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
        .args(["-n", &n.to_string(), "-c", &clients.to_string(), "-P", "64"])
        .args(["xadd", "rb-limit", "*", "payload", PAYLOAD, "key", "k1"])
        .output()
        .context("redis-benchmark (apt-get install redis-tools)")?;
    anyhow::ensure!(out.status.success(), "redis-benchmark failed: {out:?}");
    // `-q` prints "<command>: <n> requests per second, p50=..." (after \r progress lines).
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(['\r', '\n'])
        .filter_map(|l| l.split_once(" requests per second"))
        .filter_map(|(head, _)| head.rsplit(' ').next()?.parse::<f64>().ok())
        .next_back()
        .with_context(|| format!("redis-benchmark output: {text}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let n = args
        .messages
        .unwrap_or(if args.quick { 20_000 } else { 100_000 });
    let reps = if args.quick {
        args.reps.min(5)
    } else {
        args.reps
    }
    .max(1);
    let redis = RedisServer::start().context("redis-server")?;
    let coordinator =
        CoordinatorProcess::start(&["--store", "memory", "--data-redis-url", &redis.url()])
            .context("rsc-coordinator (cargo build --release --bins first)")?;
    let url = coordinator.url();
    let http = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    };
    let client = redis::Client::open(redis.url())?;
    let mut con = client.get_multiplexed_async_connection().await?;
    if args.only.as_deref() == Some("batch") {
        let rows = batch_section(&client, &redis.url(), &mut con, &url, &args, n, reps).await?;
        emit(&rows)?;
        return Ok(());
    }
    let setup = |con| publish::Setup {
        url: &url,
        redis_url: redis.url(),
        http: &http,
        con,
        shards: args.shards,
        batch: args.batch,
        in_flight: args.in_flight.max(1),
        n,
        reps,
    };
    if args.only.as_deref() == Some("publish") {
        emit(&publish::section(setup(&mut con)).await?)?;
        return Ok(());
    }
    if args.only.as_deref() == Some("consume") {
        let at = (url.as_str(), redis.url());
        let rows = consume_section(&client, &mut con, (at.0, &at.1), &args, n, reps).await?;
        emit(&rows)?;
        return Ok(());
    }
    if let Some(other) = args.only.as_deref() {
        anyhow::bail!(
            "--only {other}: the sections that run alone are `batch`, `publish` and `consume`"
        );
    }
    let publish_rows = publish::section(setup(&mut con)).await?;

    let mut limit = vec![];
    let (mut con_raw, mut con_listener, mut con_strict) = (vec![], vec![], vec![]);
    let (mut con_lease, mut cpu_lease, mut cpu_strict) = (vec![], vec![], vec![]);
    for rep in 0..reps {
        // Consume: one pre-filled stream, read by two groups (baseline first, then listener).
        let stream = format!("con-{rep}");
        let group = format!("cg-{rep}");
        let strict_group = format!("sg-{rep}");
        create_group(&url, &group, &stream, args.shards, "lease").await?;
        create_group(&url, &strict_group, &stream, args.shards, "strict").await?;
        raw_publish(&mut con, &stream, args.shards, n, 500).await?;
        let raw_group = format!("raw-{rep}");
        if rep % 2 == 0 {
            con_raw
                .push(raw_consume(&client, &stream, &raw_group, args.shards, n, args.count).await?);
            con_listener
                .push(listener_consume(&url, &redis.url(), &stream, &group, n, args.count).await?);
        } else {
            con_listener
                .push(listener_consume(&url, &redis.url(), &stream, &group, n, args.count).await?);
            con_raw
                .push(raw_consume(&client, &stream, &raw_group, args.shards, n, args.count).await?);
        }
        // Strict against lease on the same stream, alternating which goes first.
        let mut strict = (0.0, 0.0);
        let mut lease = (0.0, 0.0);
        let lease_group = format!("lg-{rep}");
        create_group(&url, &lease_group, &stream, args.shards, "lease").await?;
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let (g, out) = if first {
                (&strict_group, &mut strict)
            } else {
                (&lease_group, &mut lease)
            };
            *out = listener_consume_cpu(&mut con, &url, &redis.url(), &stream, g, n, args.count)
                .await?;
        }
        con_strict.push(strict.0);
        con_lease.push(lease.0);
        cpu_strict.push(strict.1);
        cpu_lease.push(lease.1);
        eprintln!(
            "rep {rep}: consume listener {:.0} raw {:.0}; \
             strict fencing {:.0} lease {:.0} msgs/s, Redis CPU {:.1} / {:.1} ms per 1k",
            con_listener[rep],
            con_raw[rep],
            con_strict[rep],
            con_lease[rep],
            cpu_strict[rep],
            cpu_lease[rep]
        );
        let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
        let port = redis.port();
        limit.push(tokio::task::spawn_blocking(move || redis_benchmark_xadd(port, n, 4)).await??);
        let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
    }
    let mut rows = vec![
        Row {
            name: format!(
                "P3 listener consume ({} shards, COUNT {}, {n} msgs) vs redis-rs loop",
                args.shards, args.count
            ),
            unit: "msgs/s".into(),
            value: summarize(&con_listener),
            baseline: Some(summarize(&con_raw)),
            goal: "ratio >= 0.9 (baseline: redis-rs XREADGROUP + XACK loop per shard)".into(),
        },
        Row {
            name: format!(
                "P7 listener consume, strict fencing ({} shards, COUNT {}, {n} msgs)",
                args.shards, args.count
            ),
            unit: "msgs/s".into(),
            value: summarize(&con_strict),
            baseline: Some(summarize(&con_lease)),
            goal: "ratio >= 0.9 (baseline: the same listener with lease-only fencing)".into(),
        },
        Row {
            name: "P7 Redis CPU per 1,000 messages consumed, strict fencing vs lease".into(),
            unit: "ms".into(),
            value: summarize(&cpu_strict),
            baseline: Some(summarize(&cpu_lease)),
            goal: "- (INFO cpu of the Redis server, same stream, same run)".into(),
        },
        Row {
            name: "P3 listener consume vs redis-benchmark XADD (physical limit)".into(),
            unit: "msgs/s".into(),
            value: summarize(&con_listener),
            baseline: Some(summarize(&limit)),
            goal: "- (redis-benchmark -c 4 -P 64 XADD, same server)".into(),
        },
        Row {
            name: "P3 redis-rs XREADGROUP+XACK loop vs redis-benchmark XADD".into(),
            unit: "msgs/s".into(),
            value: summarize(&con_raw),
            baseline: Some(summarize(&limit)),
            goal: "-".into(),
        },
    ];
    rows.extend(publish_rows);
    rows.extend(batch_section(&client, &redis.url(), &mut con, &url, &args, n, reps).await?);
    emit(&rows)?;
    Ok(())
}
