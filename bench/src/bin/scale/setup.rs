//! Processes and set-up: coordinators, groups.

use super::*;

pub(crate) fn coordinator_args(args: &Args, redis_url: &str, cluster: bool) -> Vec<String> {
    let mut v: Vec<String> = [
        "--store",
        "redis",
        "--redis-url",
        redis_url,
        "--key-prefix",
        "bench",
        "--admin-rate",
        "1000000",
        "--admin-burst",
        "1000000",
    ]
    .map(String::from)
    .to_vec();
    if cluster {
        v.push("--redis-cluster".into());
    }
    if let Some(ms) = args.sweep_interval_ms {
        v.extend(["--sweep-interval-ms".into(), ms.to_string()]);
    }
    v
}

pub(crate) fn start_coordinator(args: &[String]) -> Result<CoordinatorProcess> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    CoordinatorProcess::start(&a)
        .context("rsc-coordinator (build it first: cargo build --release --bins)")
}

pub(crate) fn pid(c: &CoordinatorProcess) -> Result<u32> {
    c.pid().context("coordinator pid")
}

/// Runs `f(0..n)` with at most `concurrency` calls in flight; fails on the first error or
/// after `deadline`.
pub(crate) async fn for_each_concurrent<F, Fut>(
    n: usize,
    concurrency: usize,
    deadline: Duration,
    f: F,
) -> Result<()>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + deadline;
    let mut tasks = Vec::new();
    for _ in 0..concurrency.min(n).max(1) {
        let (f, next) = (f.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok(());
                }
                if Instant::now() > until {
                    bail!("timed out after {deadline:?} at {i} of {n}");
                }
                f(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

pub(crate) async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<(u16, Value)> {
    let r = http.post(url).json(body).send().await?;
    let status = r.status().as_u16();
    let v = r.json().await.unwrap_or(Value::Null);
    Ok((status, v))
}

/// `POST /v1/groups`, retried while the stream's lock is busy or the store conflicts.
pub(crate) async fn create_group(http: &reqwest::Client, base: &str, body: &Value) -> Result<()> {
    let url = format!("{base}/v1/groups");
    for attempt in 0..50 {
        let (s, v) = post(http, &url, body).await?;
        match s {
            201 => return Ok(()),
            409 if attempt > 0 && v["error"]["code"] == "GROUP_ALREADY_EXISTS" => return Ok(()),
            400 | 401 | 403 | 404 => bail!("create group {body}: {s} {v}"),
            _ => tokio::time::sleep(Duration::from_millis(10 + 10 * attempt)).await,
        }
    }
    bail!("create group {body}: still refused after 50 attempts")
}

/// Creates `groups` (name, stream) with the given shard count and timeouts, spread over
/// `bases`, 32 in flight.
pub(crate) async fn create_groups(
    http: &reqwest::Client,
    bases: &[String],
    groups: Vec<(String, String)>,
    shards: u32,
    session_ms: u64,
    interval_ms: u64,
    concurrency: usize,
) -> Result<()> {
    let groups = Arc::new(groups);
    let bases = Arc::new(bases.to_vec());
    let http = http.clone();
    let n = groups.len();
    for_each_concurrent(n, concurrency, Duration::from_secs(900), move |i| {
        let (groups, bases, http) = (groups.clone(), bases.clone(), http.clone());
        async move {
            let (g, s) = &groups[i];
            let body = json!({"group": g, "stream": s, "shard_count": shards,
                "session_timeout_ms": session_ms, "heartbeat_interval_ms": interval_ms,
                "rebalance_timeout_ms": session_ms, "fencing": "lease"});
            create_group(&http, &bases[i % bases.len()], &body).await
        }
    })
    .await
}
