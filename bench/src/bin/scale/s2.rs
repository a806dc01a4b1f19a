//! S2: batched vs single heartbeats.

use super::*;

pub(crate) async fn s2(args: &Args) -> Result<Vec<Row>> {
    let reps = args.pick(args.s2_reps, 5, 2);
    let processes = args.pick(args.s2_processes, 32, 16);
    let groups = args.pick(args.s2_groups, 32, 16);
    let duration = Duration::from_millis(args.pick(args.s2_duration_ms, 3000, 500));
    let redis = RedisServer::start().context("redis-server")?;
    let coordinator = start_coordinator(&coordinator_args(args, &redis.url(), false))?;
    let base = coordinator.url();
    let http = http_client(args.concurrency)?;
    let fleet = Arc::new(Fleet::new(
        "s2",
        processes,
        args.batch,
        groups,
        args.groups_per_stream,
    ));
    let members = fleet.sims.len();
    if !batch_route_available(&http, &base).await? {
        println!("S2: {NO_BATCH_ROUTE}");
        return Ok(Vec::new());
    }
    let t = Instant::now();
    create_groups(
        &http,
        std::slice::from_ref(&base),
        fleet.groups.clone(),
        fleet.shards,
        45_000,
        3_000,
        args.concurrency,
    )
    .await?;
    let rounds = converge_batched(
        &http,
        std::slice::from_ref(&base),
        &fleet,
        args.setup_concurrency,
        Duration::from_secs(300),
    )
    .await?
    .context("the batch route disappeared")?;
    println!(
        "S2: {} processes x {} members = {members} members over {} groups ({} shards each; a \
         process has one member in each of {} groups); set-up {:.1} s, converged in {rounds} \
         rounds",
        processes,
        args.batch,
        groups,
        fleet.shards,
        args.batch.min(groups),
        t.elapsed().as_secs_f64()
    );
    let singles = Arc::new(prepared_singles(&fleet, &base));
    let batches = Arc::new(prepared_batches(&fleet, std::slice::from_ref(&base)));
    let probe = Probe::new(&[&coordinator], &[&redis])?;
    let (_, idle) = probe
        .watch(Duration::from_secs(1), Duration::from_secs(1))
        .await?;
    // Warm-up of both.
    closed_loop(&http, args.concurrency, duration / 2, singles.clone()).await?;
    closed_loop(&http, args.concurrency, duration / 2, batches.clone()).await?;
    let (mut single_rates, mut batch_rates) = (Vec::new(), Vec::new());
    let (mut single_cpm, mut batch_cpm) = (Vec::new(), Vec::new());
    let (mut single_cpu, mut batch_cpu) = (Vec::new(), Vec::new());
    let (mut single_me, mut batch_me) = (Vec::new(), Vec::new());
    let (mut single_spm, mut batch_spm) = (Vec::new(), Vec::new());
    let mut errors = 0;
    for r in 0..reps {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for batched in order {
            let reqs = if batched { &batches } else { &singles };
            let a = probe.snap()?;
            let res = closed_loop(&http, args.concurrency, duration, reqs.clone()).await?;
            let b = probe.snap()?;
            let u = probe.usage(&a, &b);
            errors += res.errors;
            let cpm = u.commands as f64 / res.items.max(1) as f64;
            let (rates, cpms, cpus, mes, spms) = if batched {
                (
                    &mut batch_rates,
                    &mut batch_cpm,
                    &mut batch_cpu,
                    &mut batch_me,
                    &mut batch_spm,
                )
            } else {
                (
                    &mut single_rates,
                    &mut single_cpm,
                    &mut single_cpu,
                    &mut single_me,
                    &mut single_spm,
                )
            };
            rates.push(res.items_per_s);
            cpms.push(cpm);
            cpus.push(u.sum_coordinator_pct());
            mes.push(u.me_pct);
            spms.push(u.scripts as f64 / res.items.max(1) as f64);
        }
    }
    // Round trips: the client commands while every member heartbeats twice, each way.
    let twice = |v: &Arc<Vec<Prepared>>| Arc::new(v.iter().chain(v.iter()).cloned().collect());
    let (n1, c1) = client_commands(&redis, send_each(&http, twice(&singles))).await?;
    let (n2, c2) = client_commands(&redis, send_each(&http, twice(&batches))).await?;
    let (single_rt, batch_rt) = (c1 as f64 / n1 as f64, c2 as f64 / n2 as f64);
    println!(
        "S2: CPU % of a core (median): coordinator single {} / batched {}, load generator \
         single {} / batched {}; script calls per member-heartbeat single {} / batched {}; \
         Redis commands/s with no load (expiry sweep): {}; item errors: {errors}",
        num(summarize(&single_cpu).median),
        num(summarize(&batch_cpu).median),
        num(summarize(&single_me).median),
        num(summarize(&batch_me).median),
        num(summarize(&single_spm).median),
        num(summarize(&batch_spm).median),
        num(idle.commands_per_s())
    );
    let label = format!(
        "{members} members, {groups} groups, {} in flight",
        args.concurrency
    );
    Ok(vec![
        row(
            format!(
                "S2 batched heartbeats (batches of {}) vs single, member-heartbeats/s ({label})",
                args.batch
            ),
            "hb/s",
            &batch_rates,
            Some(&single_rates),
            "ratio >= 5",
        ),
        row(
            format!("S2 Redis commands per member-heartbeat, batched ({label})"),
            "cmds",
            &batch_cpm,
            None,
            "- (commands scripts run inside Redis included; the goal is on round trips, below)",
        ),
        row(
            format!("S2 Redis commands per member-heartbeat, single ({label})"),
            "cmds",
            &single_cpm,
            None,
            "-",
        ),
        row(
            format!(
                "S2 client commands (round trips, MONITOR) per member-heartbeat, batched vs single ({label})"
            ),
            "cmds",
            &[batch_rt],
            Some(&[single_rt]),
            "<= 0.1 batched (commands scripts run inside Redis excluded)",
        ),
    ])
}
