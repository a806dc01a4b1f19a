//! S3: 100,000 members, steady; and the saturation rate.

use super::*;

pub(crate) struct S3Result {
    pub(crate) label: String,
    pub(crate) long_label: String,
    pub(crate) offered: f64,
    pub(crate) achieved: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) usage: Usage,
    pub(crate) lost: u64,
    pub(crate) other_errors: u64,
    pub(crate) max_rate: f64,
}

pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

pub(crate) async fn s3_run(args: &Args, coordinators: usize) -> Result<Option<S3Result>> {
    let processes = args.pick(args.s3_processes, 3125, 20);
    let groups = args.pick(args.s3_groups, 10_000, 64);
    let window = Duration::from_millis(args.pick(args.s3_window_ms, 60_000, 3_000));
    let interval = Duration::from_millis(args.s3_interval_ms);
    let saturate = Duration::from_millis(if args.quick { 1000 } else { 5000 });
    let t = Instant::now();
    let (single, cluster) = if coordinators == 1 {
        (Some(RedisServer::start().context("redis-server")?), None)
    } else {
        (None, Some(RedisCluster::start().context("redis cluster")?))
    };
    let (redis_url, redis_nodes): (String, Vec<&RedisServer>) = match (&single, &cluster) {
        (Some(r), _) => (r.url(), vec![r]),
        (_, Some(c)) => (c.url(), c.nodes().iter().collect()),
        _ => unreachable!(),
    };
    let cargs = coordinator_args(args, &redis_url, cluster.is_some());
    let mut coords = Vec::new();
    for _ in 0..coordinators {
        coords.push(start_coordinator(&cargs)?);
    }
    let bases: Vec<String> = coords.iter().map(CoordinatorProcess::url).collect();
    // Up to 1,024 batches in flight in the steady phase: keep their connections.
    let http = http_client(256)?;
    let fleet = Arc::new(Fleet::new(
        "s3",
        processes,
        args.batch,
        groups,
        args.groups_per_stream,
    ));
    let members = fleet.sims.len();
    let store = if cluster.is_some() {
        "3-node Redis Cluster"
    } else {
        "1 redis-server"
    };
    let long_label = format!(
        "{processes} processes x {} = {members} members, {groups} groups, interval {} ms, \
         {coordinators} coordinator(s), {store}",
        args.batch, args.s3_interval_ms,
    );
    let label = format!("{members} members, {coordinators} coord., {store}");
    if !batch_route_available(&http, &bases[0]).await? {
        println!("S3: {NO_BATCH_ROUTE}");
        return Ok(None);
    }
    println!("S3: {long_label}: setting up");
    create_groups(
        &http,
        &bases,
        fleet.groups.clone(),
        fleet.shards,
        15 * args.s3_interval_ms,
        args.s3_interval_ms,
        args.concurrency,
    )
    .await?;
    let created = t.elapsed();
    let setup_limit = Duration::from_secs(if args.quick { 60 } else { 900 });
    let Some(rounds) =
        converge_batched(&http, &bases, &fleet, args.setup_concurrency, setup_limit).await?
    else {
        println!("S3: {NO_BATCH_ROUTE}");
        return Ok(None);
    };
    println!(
        "S3: set-up {:.1} s (groups created in {:.1} s; joined and converged in {rounds} rounds \
         of batches)",
        t.elapsed().as_secs_f64(),
        created.as_secs_f64()
    );

    // Steady phase: each process sends its batch once per interval, phases spread evenly.
    let probe = Probe::new(&coords.iter().collect::<Vec<_>>(), &redis_nodes)?;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let end = start + window;
    let in_flight = Arc::new(tokio::sync::Semaphore::new(1024));
    let mut tasks = Vec::new();
    for p in 0..processes {
        let (fleet, http, in_flight) = (fleet.clone(), http.clone(), in_flight.clone());
        let base = bases[p % bases.len()].clone();
        let phase = interval.mul_f64(p as f64 / processes as f64);
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut ok, mut lost, mut other) = (Vec::new(), 0u64, 0u64, 0u64);
            let mut scheduled = 0u64;
            let mut codes = std::collections::BTreeMap::<String, u64>::new();
            // Offered: one batch per interval from the process's phase on.
            for k in 0..=(window.as_millis() / interval.as_millis().max(1)) as u32 {
                if start + phase + interval * k < end {
                    scheduled += fleet.processes[p].len() as u64;
                }
            }
            // Sent as rsc-client's member loop does: the next heartbeat one interval after the
            // last was sent, or at once when its answer came later than that; never two at a
            // time. Only answers received within the window count as achieved.
            let mut due = start + phase;
            for _ in 0..=(window.as_millis() / interval.as_millis().max(1)) {
                if due >= end {
                    break;
                }
                tokio::time::sleep_until(due).await;
                let sent = tokio::time::Instant::now();
                let Ok(_permit) = in_flight.acquire().await else {
                    break;
                };
                match send_batch(&http, &base, &fleet, p).await {
                    Ok(Some(r)) => {
                        lat.push(sent.elapsed().as_secs_f64() * 1000.0);
                        let (_, errors) = fleet.apply_batch(p, &r);
                        if tokio::time::Instant::now() <= end {
                            ok += (r.results.len() - errors.len().min(r.results.len())) as u64;
                        }
                        for e in errors {
                            if is_lost(&e) {
                                lost += 1;
                            } else {
                                other += 1;
                            }
                            *codes.entry(e).or_default() += 1;
                        }
                    }
                    Ok(None) => other += fleet.processes[p].len() as u64,
                    Err(e) => {
                        other += fleet.processes[p].len() as u64;
                        let kind = if e.to_string().contains("POST /v1/heartbeats") {
                            e.to_string().chars().take(40).collect()
                        } else {
                            "request failed".to_owned()
                        };
                        *codes.entry(kind).or_default() += fleet.processes[p].len() as u64;
                    }
                }
                due = (sent + interval).max(tokio::time::Instant::now());
            }
            (lat, ok, lost, other, scheduled, codes)
        }));
    }
    tokio::time::sleep_until(start).await;
    let a = probe.snap()?;
    tokio::time::sleep_until(end).await;
    let b = probe.snap()?;
    let (mut lat, mut ok, mut lost, mut other) = (Vec::new(), 0u64, 0u64, 0u64);
    let mut scheduled = 0u64;
    let mut codes = std::collections::BTreeMap::<String, u64>::new();
    for t in tasks {
        let (l, o, x, y, z, c) = t.await?;
        lat.extend(l);
        ok += o;
        lost += x;
        other += y;
        scheduled += z;
        for (k, v) in c {
            *codes.entry(k).or_default() += v;
        }
    }
    if !codes.is_empty() {
        println!("S3: item errors in the window, by code: {codes:?}");
    }
    lat.sort_by(f64::total_cmp);
    let usage = probe.usage(&a, &b);
    // Offered: the heartbeats of the nominal schedule within the window (members / interval
    // when the window is a whole number of intervals); achieved: those answered 200 within the
    // window.
    let offered = scheduled as f64 / window.as_secs_f64();
    let achieved = ok as f64 / window.as_secs_f64();

    // Saturation: the same batches back to back, `concurrency` in flight.
    let batches = Arc::new(prepared_batches(&fleet, &bases));
    let max = closed_loop(&http, args.concurrency, saturate, batches).await?;
    let result = S3Result {
        label,
        long_label,
        offered,
        achieved,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        usage,
        lost,
        other_errors: other + max.errors,
        max_rate: max.items_per_s,
    };
    println!(
        "S3 {}: batch latency p50 {} ms, p99 {} ms (per member {} / {} ms); achieved {} of \
         {} member-heartbeats/s offered; CPU % of a core: coordinators {:?}, redis-server(s) {}, \
         load generator {}; expired/fenced items {}, other errors {}; saturation ({} in flight, \
         {saturate:?}): {} member-heartbeats/s",
        result.long_label,
        num(result.p50_ms),
        num(result.p99_ms),
        num(result.p50_ms / args.batch as f64),
        num(result.p99_ms / args.batch as f64),
        num(achieved),
        num(offered),
        result
            .usage
            .coordinator_pct
            .iter()
            .map(|c| (c * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        num(result.usage.redis_pct),
        num(result.usage.me_pct),
        lost,
        result.other_errors,
        args.concurrency,
        num(result.max_rate)
    );
    Ok(Some(result))
}

pub(crate) async fn s3(args: &Args) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut one: Option<S3Result> = None;
    for &k in &args.s3_coordinators {
        let Some(r) = s3_run(args, k).await? else {
            return Ok(rows);
        };
        let interval_goal = format!("< {} ms (interval/10)", args.s3_interval_ms / 10);
        rows.push(row(
            format!("S3 p99 batch latency ({})", r.label),
            "ms",
            &[r.p99_ms],
            None,
            &interval_goal,
        ));
        rows.push(row(
            format!("S3 p50 batch latency ({})", r.label),
            "ms",
            &[r.p50_ms],
            None,
            "-",
        ));
        rows.push(row(
            format!("S3 achieved vs offered member-heartbeats/s ({})", r.label),
            "hb/s",
            &[r.achieved],
            Some(&[r.offered]),
            "ratio 1.00 (sustained)",
        ));
        rows.push(row(
            format!("S3 CPU of the busiest coordinator ({})", r.label),
            "% core",
            &[r.usage.max_coordinator_pct()],
            None,
            "< 100 %",
        ));
        rows.push(row(
            format!("S3 redis-server CPU, all nodes ({})", r.label),
            "% core",
            &[r.usage.redis_pct],
            None,
            "-",
        ));
        rows.push(row(
            format!(
                "S3 members expired or fenced during the window ({})",
                r.label
            ),
            "items",
            &[r.lost as f64],
            None,
            "0",
        ));
        if let Some(o) = &one {
            rows.push(row(
                format!(
                    "S3 capacity: saturation member-heartbeats/s, {} vs {} coordinator(s)",
                    r.label,
                    o.usage.coordinator_pct.len()
                ),
                "hb/s",
                &[r.max_rate],
                Some(&[o.max_rate]),
                "- (same 2-core machine for all processes)",
            ));
        } else {
            rows.push(row(
                format!("S3 saturation member-heartbeats/s ({})", r.label),
                "hb/s",
                &[r.max_rate],
                Some(&[r.offered]),
                "-",
            ));
            one = Some(r);
        }
    }
    Ok(rows)
}
