//! Steady-state heartbeats per second with the Redis store, against a no-op route
//! (`GET /healthz`) of the same coordinator, driven by the same load generator in the same
//! run. Also counts the Redis commands one steady heartbeat costs (`INFO commandstats`).
//!
//! ```text
//! cargo build --release --bins && cargo run --release -p rsc-bench --bin heartbeat
//! ```
//! Goal: heartbeats/s at least 0.5 of the no-op's.
//!
//! With `--https` (P1-TLS): the same steady heartbeats to a second coordinator replica of the
//! same store serving HTTPS (`--tls-cert`, certificates made by `openssl`), against the
//! plain-HTTP replica, alternating, same run (goal ≥ 0.8 with keep-alive); and what one TLS
//! handshake costs (a request on a new connection against one on a kept-alive connection).

use anyhow::{Context, Result, bail};
use clap::Parser;
use rsc_bench::{Row, emit, rss_mib, summarize};
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Steady heartbeats/s (redis store) vs a no-op route, same server, same load")]
struct Args {
    /// Short run for CI: 3 repetitions of 0.5 s.
    #[arg(long)]
    quick: bool,
    /// Members heartbeating (each steady: stable, reporting what it owns).
    #[arg(long, default_value_t = 64)]
    members: usize,
    /// Shards of the stream.
    #[arg(long, default_value_t = 64)]
    shards: u32,
    /// Concurrent requests in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Length of one measurement, in ms.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,
    /// Also report the coordinator's resident memory (VmRSS) once the group is steady
    /// (P6; goal < 100 MB at 1,000 members x 4,096 shards).
    #[arg(long)]
    rss: bool,
    /// The group's fencing: `strict` also gives the coordinator a data Redis (the same
    /// server), and every steady heartbeat re-asserts the member's owner tokens there (from
    /// the owner keys Redis tracks for the coordinator once they were read in place).
    #[arg(long, default_value = "lease", value_parser = ["lease", "strict"])]
    fencing: String,
    /// Also measure P1 over HTTPS against plain HTTP (P1-TLS; a second coordinator replica
    /// of the same store, serving HTTPS).
    #[arg(long)]
    https: bool,
}

/// Builds the request a load loop sends: `(client, worker, iteration)`.
type MakeRequest =
    Arc<dyn Fn(&reqwest::Client, usize, u64) -> reqwest::RequestBuilder + Send + Sync>;

#[derive(Debug, Clone)]
struct Member {
    id: String,
    epoch: i64,
    owned: Vec<u64>,
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<(u16, Value)> {
    let r = http.post(url).json(body).send().await?;
    let status = r.status().as_u16();
    let v = r.json().await.unwrap_or(Value::Null);
    Ok((status, v))
}

/// The steady heartbeats of the members (`raw`: their bodies), spread over the load's
/// workers, to `hb_url`.
fn heartbeats_to(hb_url: Arc<String>, raw: Arc<Vec<&'static [u8]>>, workers: usize) -> MakeRequest {
    Arc::new(move |http, worker, n| {
        let i = (worker + n as usize * workers) % raw.len();
        http.post(hb_url.as_str())
            .header("content-type", "application/json")
            .body(raw[i])
    })
}

/// P1-TLS: the steady heartbeats over HTTPS to a second replica of the same store, against
/// the plain-HTTP replica.
struct TlsRun<'a> {
    args: &'a Args,
    store_url: &'a str,
    plain_base: &'a str,
    raw: Arc<Vec<&'static [u8]>>,
}

impl TlsRun<'_> {
    async fn rows(&self) -> Result<Vec<Row>> {
        let certs = rsc_testkit::TlsCerts::generate().context("certificates (openssl)")?;
        let (cert, key) = (certs.server_cert(), certs.server_key());
        let coordinator = CoordinatorProcess::start(&[
            "--store",
            "redis",
            "--redis-url",
            self.store_url,
            "--key-prefix",
            "bench",
            "--tls-cert",
            cert.to_str().context("path")?,
            "--tls-key",
            key.to_str().context("path")?,
        ])
        .context("rsc-coordinator with --tls-cert")?;
        let https_base = format!("https://{}", coordinator.addr());
        let tls = rsc_client::CoordinatorTls {
            ca: Some(certs.ca()),
            ..Default::default()
        };
        let client = |alpn: &[u8], pool: usize| -> Result<reqwest::Client> {
            let mut config = tls.rustls_config(true)?;
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok(reqwest::Client::builder()
                .tls_backend_preconfigured(config)
                .pool_max_idle_per_host(pool)
                .build()?)
        };
        let n = self.args.concurrency;
        let (h1, h2) = (client(b"http/1.1", n)?, client(b"h2", n)?);
        let plain = reqwest::Client::builder()
            .pool_max_idle_per_host(n)
            .build()?;
        let to = |base: &str| {
            let url = Arc::new(format!("{base}/v1/groups/bench/heartbeat"));
            heartbeats_to(url, self.raw.clone(), n)
        };
        let (over_plain, over_tls) = (to(self.plain_base), to(&https_base));
        let duration = Duration::from_millis(self.args.duration_ms);
        for (http, hb) in [(&plain, &over_plain), (&h1, &over_tls), (&h2, &over_tls)] {
            load(http, n, duration / 2, hb.clone()).await?;
        }
        let (mut plain_rates, mut h1_rates, mut h2_rates) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..self.args.reps {
            plain_rates.push(load(&plain, n, duration, over_plain.clone()).await?);
            h1_rates.push(load(&h1, n, duration, over_tls.clone()).await?);
            h2_rates.push(load(&h2, n, duration, over_tls.clone()).await?);
        }
        let handshake = self.handshake_ms(&client, &https_base).await?;
        drop(coordinator);
        let name = |how: &str| {
            format!(
                "P1-TLS steady heartbeats over HTTPS ({how}, keep-alive, {} members, {n} in flight) vs plain HTTP/1.1, same store",
                self.args.members
            )
        };
        let row = |how: &str, rates: &[f64], goal: &str| Row {
            name: name(how),
            unit: "req/s".into(),
            value: summarize(rates),
            baseline: Some(summarize(&plain_rates)),
            goal: goal.into(),
        };
        Ok(vec![
            row("HTTP/1.1 by ALPN", &h1_rates, "ratio >= 0.8"),
            row("HTTP/2 by ALPN", &h2_rates, "-"),
            Row {
                name: "P1-TLS one TLS handshake (a request on a new connection minus one on a kept-alive connection, sequential)".into(),
                unit: "ms".into(),
                value: summarize(&[handshake]),
                baseline: None,
                goal: "-".into(),
            },
        ])
    }

    /// The median request time on a new HTTPS connection minus that on a kept-alive one
    /// (`GET /healthz`, one at a time).
    async fn handshake_ms(
        &self,
        client: &dyn Fn(&[u8], usize) -> Result<reqwest::Client>,
        https_base: &str,
    ) -> Result<f64> {
        let url = format!("{https_base}/healthz");
        let kept = client(b"http/1.1", 1)?;
        kept.get(&url).send().await?.error_for_status()?;
        let fresh = client(b"http/1.1", 0)?;
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (mut new_conn, mut reused) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            let t = Instant::now();
            fresh.get(&url).send().await?.error_for_status()?;
            new_conn.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            kept.get(&url).send().await?.error_for_status()?;
            reused.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(new_conn) - median(reused))
    }
}

fn heartbeat_body(m: &Member) -> Value {
    json!({"protocol_version": 1, "member_id": m.id, "member_epoch": m.epoch, "owned_shards": m.owned})
}

/// Joins the members and heartbeats until every one is steady (the group is stable and a
/// heartbeat leaves its revision unchanged).
async fn settle(http: &reqwest::Client, base: &str, args: &Args) -> Result<Vec<Member>> {
    let url = format!("{base}/v1/groups/bench/heartbeat");
    let mut members: Vec<Member> = (0..args.members)
        .map(|i| Member {
            id: format!("member-{i}"),
            epoch: 0,
            owned: Vec::new(),
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for m in &mut members {
            let (s, v) = post(http, &url, &heartbeat_body(m)).await?;
            if s != 200 {
                bail!("heartbeat of {} answered {s}: {v}", m.id);
            }
            m.epoch = v["member_epoch"].as_i64().context("epoch")?;
            m.owned = serde_json::from_value(v["assignment"].clone())?;
        }
        let view: Value = http
            .get(format!("{base}/v1/groups/bench"))
            .send()
            .await?
            .json()
            .await?;
        let reported_all = view["members"]
            .as_array()
            .is_some_and(|ms| ms.iter().all(|m| m["owned_shards"] == m["assigned_shards"]));
        if view["state"] == "stable" && reported_all {
            return Ok(members);
        }
        if Instant::now() > deadline {
            bail!("the group did not settle: {view}");
        }
    }
}

/// Runs `concurrency` loops for `duration`; returns requests per second.
async fn load(
    http: &reqwest::Client,
    concurrency: usize,
    duration: Duration,
    request: MakeRequest,
) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let (http, stop, done, failed, request) = (
            http.clone(),
            stop.clone(),
            done.clone(),
            failed.clone(),
            request.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match request(&http, worker, n).send().await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                n += 1;
            }
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    Ok(count as f64 / elapsed.as_secs_f64())
}

/// Counts the commands clients send to Redis (not those Lua scripts run inside Redis) while
/// `work` runs, with `MONITOR` on a raw connection.
async fn client_commands<F: std::future::Future<Output = Result<u64>>>(
    redis: &RedisServer,
    work: F,
) -> Result<(u64, u64, Vec<(String, u64)>)> {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", redis.port()))?;
    conn.write_all(b"MONITOR\r\n")?;
    let reader = conn.try_clone()?;
    let lines = std::thread::spawn(move || {
        let mut by_command: HashMap<String, u64> = HashMap::new();
        for line in BufReader::new(reader)
            .lines()
            .map_while(std::result::Result::ok)
        {
            // `+<time> [<db> <client>] "<COMMAND>" ...`; Lua's own calls show `[0 lua]`.
            let Some((client, rest)) = line.split_once("] ") else {
                continue;
            };
            if client.ends_with(" lua") {
                continue;
            }
            let cmd = rest.split('"').nth(1).unwrap_or("").to_ascii_lowercase();
            *by_command.entry(cmd).or_default() += 1;
        }
        by_command
    });
    // MONITOR answers +OK before streaming; give it a moment to be in place.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let done = work.await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.shutdown(std::net::Shutdown::Both)?;
    let by_command = lines
        .join()
        .map_err(|_| anyhow::anyhow!("monitor reader panicked"))?;
    let total = by_command.values().sum();
    let mut by_command: Vec<(String, u64)> = by_command.into_iter().collect();
    by_command.sort_by_key(|c| std::cmp::Reverse(c.1));
    Ok((done, total, by_command))
}

/// CPU time the Redis server has used so far, user and system (`INFO cpu`), in seconds.
fn redis_cpu_seconds(redis: &RedisServer) -> Result<f64> {
    let info = redis.command("INFO cpu")?;
    let field = |name: &str| -> Result<f64> {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.parse().ok())
            .with_context(|| format!("INFO cpu lacks {name}"))
    };
    Ok(field("used_cpu_user:")? + field("used_cpu_sys:")?)
}

/// Calls of `cmd` so far (`INFO commandstats`).
fn calls(redis: &RedisServer, cmd: &str) -> Result<u64> {
    let info = redis.command("INFO commandstats")?;
    Ok(rsc_testkit::command_calls(&info)
        .get(cmd)
        .copied()
        .unwrap_or(0))
}

async fn group_revision(http: &reqwest::Client, base: &str) -> Result<u64> {
    let v: Value = http
        .get(format!("{base}/v1/groups/bench"))
        .send()
        .await?
        .json()
        .await?;
    v["revision"].as_u64().context("revision")
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.reps = 3;
        args.duration_ms = 500;
    }
    let redis = RedisServer::start().context("redis-server")?;
    let url = redis.url();
    let mut coordinator_args = vec![
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--key-prefix",
        "bench",
    ];
    if args.fencing == "strict" {
        coordinator_args.extend(["--data-redis-url", &url]);
    }
    let coordinator = CoordinatorProcess::start(&coordinator_args)
        .context("rsc-coordinator (build it first: cargo build --release --bins)")?;
    let base = coordinator.url();
    rsc_client::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let (s, v) = post(
        &http,
        &format!("{base}/v1/groups"),
        &json!({"group": "bench", "stream": "bench", "shard_count": args.shards,
            "fencing": args.fencing}),
    )
    .await?;
    if s != 201 {
        bail!("create group: {s} {v}");
    }
    let members = Arc::new(settle(&http, &base, &args).await?);
    let hb_url = Arc::new(format!("{base}/v1/groups/bench/heartbeat"));
    let bodies: Arc<Vec<Value>> = Arc::new(members.iter().map(heartbeat_body).collect());
    let concurrency = args.concurrency;
    // Bodies serialized once: the load generator does the same work for both routes.
    let raw_bodies: Arc<Vec<&'static [u8]>> = Arc::new(
        bodies
            .iter()
            .map(|b| &*Vec::leak(serde_json::to_vec(b).expect("json")))
            .collect(),
    );
    let heartbeat = heartbeats_to(hb_url.clone(), raw_bodies.clone(), concurrency);
    let health_url = Arc::new(format!("{base}/healthz"));
    let healthz: MakeRequest = Arc::new(move |http, _, _| http.get(health_url.as_str()));

    let duration = Duration::from_millis(args.duration_ms);
    // Warm up both routes (connections, scripts loaded, documents cached).
    load(&http, args.concurrency, duration / 2, healthz.clone()).await?;
    load(&http, args.concurrency, duration / 2, heartbeat.clone()).await?;

    let revision_before = group_revision(&http, &base).await?;
    let mut hb_rates = Vec::new();
    let mut noop_rates = Vec::new();
    let mut scripts_under_load = 0u64;
    let mut heartbeats_under_load = 0f64;
    let mut reads_under_load = 0u64;
    let mut redis_cpu_under_load = 0f64;
    for _ in 0..args.reps {
        noop_rates.push(load(&http, args.concurrency, duration, healthz.clone()).await?);
        let before = (calls(&redis, "evalsha")?, calls(&redis, "mget")?);
        let cpu_before = redis_cpu_seconds(&redis)?;
        let rate = load(&http, args.concurrency, duration, heartbeat.clone()).await?;
        redis_cpu_under_load += redis_cpu_seconds(&redis)? - cpu_before;
        scripts_under_load += calls(&redis, "evalsha")? - before.0;
        reads_under_load += calls(&redis, "mget")? - before.1;
        heartbeats_under_load += rate * duration.as_secs_f64();
        hb_rates.push(rate);
    }
    let revision_after = group_revision(&http, &base).await?;

    // Round trips: the commands the coordinator sends while it answers a known number of
    // steady heartbeats (the expiry sweep's few reads in that time are included).
    let counted = 2_000.min(20 * args.members as u64);
    let (heartbeats, commands, by_command) = client_commands(&redis, async {
        for i in 0..counted {
            let body = &bodies[i as usize % bodies.len()];
            let (s, v) = post(&http, &hb_url, body).await?;
            if s != 200 {
                bail!("heartbeat answered {s}: {v}");
            }
        }
        Ok(counted)
    })
    .await?;
    let per_heartbeat = commands as f64 / heartbeats as f64;

    println!(
        "steady heartbeats: {} members, {} shards, {} in flight, {} x {} ms, redis store on {}\n",
        args.members,
        args.shards,
        args.concurrency,
        args.reps,
        args.duration_ms,
        redis.url()
    );
    let heartbeat_summary = summarize(&hb_rates);
    let fencing_label = if args.fencing == "strict" {
        ", strict fencing"
    } else {
        ""
    };
    let mut rows = vec![
        Row {
            name: format!(
                "P1 steady heartbeat, redis store{} ({} members, {} shards, {} in flight) vs GET /healthz",
                fencing_label, args.members, args.shards, args.concurrency
            ),
            unit: "req/s".into(),
            value: heartbeat_summary,
            baseline: Some(summarize(&noop_rates)),
            goal: "ratio >= 0.5".into(),
        },
        Row {
            name: format!(
                "P1 Redis commands per steady heartbeat{} ({} members)",
                fencing_label, args.members
            ),
            unit: "cmds".into(),
            value: summarize(&[per_heartbeat]),
            baseline: None,
            goal: "<= 2 (one or two round trips)".into(),
        },
        Row {
            name: format!(
                "P1 Redis script calls per heartbeat{} at {} in flight ({} members, batched)",
                fencing_label, args.concurrency, args.members
            ),
            unit: "calls".into(),
            value: summarize(&[scripts_under_load as f64 / heartbeats_under_load]),
            baseline: None,
            goal: "-".into(),
        },
    ];
    // The store Redis is one thread shared by every coordinator: its CPU time per steady
    // heartbeat (scripts, reads and socket I/O together) bounds the heartbeats it can serve.
    rows.push(Row {
        name: format!(
            "P1 Redis CPU per steady heartbeat{} at {} in flight ({} members)",
            fencing_label, args.concurrency, args.members
        ),
        unit: "us".into(),
        value: summarize(&[redis_cpu_under_load * 1e6 / heartbeats_under_load]),
        baseline: None,
        goal: "-".into(),
    });
    if args.fencing == "strict" {
        // The owner tokens' re-assertion reads the owner keys of the heartbeats in flight
        // together (docs/FENCING.md): how many heartbeats one read serves.
        rows.push(Row {
            name: format!(
                "P1 owner-key reads (MGET) per heartbeat, strict fencing at {} in flight ({} members, batched)",
                args.concurrency, args.members
            ),
            unit: "calls".into(),
            value: summarize(&[reads_under_load as f64 / heartbeats_under_load]),
            baseline: None,
            goal: "-".into(),
        });
    }
    if args.rss {
        let pid = coordinator.pid().context("coordinator pid")?;
        let mib = rss_mib(pid)?;
        println!("coordinator VmRSS after the steady phase: {mib:.1} MiB");
        rows.push(Row {
            name: format!(
                "P6 coordinator RSS ({} members x {} shards, redis store, steady)",
                args.members, args.shards
            ),
            unit: "MiB".into(),
            value: summarize(&[mib]),
            baseline: None,
            goal: "< 100 MB".into(),
        });
    }
    if args.https {
        let tls = TlsRun {
            args: &args,
            store_url: &url,
            plain_base: &base,
            raw: raw_bodies.clone(),
        };
        rows.extend(tls.rows().await?);
    }
    emit(&rows)?;
    println!(
        "\ngroup revision {revision_before} -> {revision_after} during the steady phase \
         (unchanged: no document written); commands sent for {heartbeats} heartbeats: {:?}",
        &by_command[..by_command.len().min(6)]
    );
    Ok(())
}
