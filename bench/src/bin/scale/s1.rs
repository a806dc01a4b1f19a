//! S1: idle groups.

use super::*;

pub(crate) async fn s1(args: &Args) -> Result<Vec<Row>> {
    let levels = args.s1_groups.clone().unwrap_or_else(|| {
        if args.quick {
            vec![50, 200]
        } else {
            vec![1000, 5000, 10000]
        }
    });
    let window = Duration::from_millis(args.pick(args.s1_window_ms, 10_000, 1_000));
    let step = if args.quick {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    };
    let settle = Duration::from_millis(if args.quick { 300 } else { 2000 });
    let max_n = levels.iter().copied().max().unwrap_or(0);
    let streams = max_n.div_ceil(args.groups_per_stream).max(1);
    let redis = RedisServer::start().context("redis-server")?;
    let cargs = coordinator_args(args, &redis.url(), false);
    let first = start_coordinator(&cargs)?;
    let base = first.url();
    let http = http_client(args.concurrency)?;
    println!(
        "S1: idle groups (1 member, heartbeat interval 20 min), streams of 1 shard, up to {} \
         groups per stream; window {window:?} sampled every {step:?}, after {settle:?}",
        max_n.div_ceil(streams)
    );
    let mut rows = Vec::new();
    let mut created = 0usize;
    let mut baseline: [Option<(Vec<f64>, Vec<f64>)>; 2] = [None, None];
    for n in std::iter::once(0).chain(levels.iter().copied()) {
        if n > created {
            let t = Instant::now();
            // Group i on stream i mod streams: groups created together lock different streams.
            let groups: Vec<(String, String)> = (created..n)
                .map(|i| (format!("idle-{i}"), format!("idle-s{}", i % streams)))
                .collect();
            create_groups(
                &http,
                std::slice::from_ref(&base),
                groups.clone(),
                1,
                3_600_000,
                1_200_000,
                args.concurrency,
            )
            .await?;
            let created_in = t.elapsed();
            let groups = Arc::new(groups);
            let (h, b) = (http.clone(), base.clone());
            for_each_concurrent(
                groups.len(),
                args.concurrency,
                Duration::from_secs(600),
                move |i| {
                    let (h, b, groups) = (h.clone(), b.clone(), groups.clone());
                    async move {
                        let g = &groups[i].0;
                        let (s, v) = post(
                            &h,
                            &format!("{b}/v1/groups/{g}/heartbeat"),
                            &json!({"protocol_version": 1, "member_id": format!("{g}-m"),
                                "member_epoch": 0, "owned_shards": []}),
                        )
                        .await?;
                        if s != 200 {
                            bail!("join {g}: {s} {v}");
                        }
                        Ok(())
                    }
                },
            )
            .await?;
            println!(
                "  set-up to {n} groups: {} created in {:.1} s, joined in {:.1} s",
                n - created,
                created_in.as_secs_f64(),
                (t.elapsed() - created_in).as_secs_f64()
            );
            created = n;
        }
        for (k, count) in [1usize, 3].into_iter().enumerate() {
            let mut extra = Vec::new();
            for _ in 1..count {
                extra.push(start_coordinator(&cargs)?);
            }
            let mut running = vec![&first];
            running.extend(extra.iter());
            let probe = Probe::new(&running, &[&redis])?;
            tokio::time::sleep(settle).await;
            let (steps, whole) = probe.watch(window, step).await?;
            let cmds: Vec<f64> = steps.iter().map(Usage::commands_per_s).collect();
            let cpu: Vec<f64> = steps.iter().map(Usage::max_coordinator_pct).collect();
            println!(
                "  {n:>6} groups, {count} coordinator(s): {} Redis cmds/s, coordinator CPU {:?} % \
                 of a core, redis-server {} %",
                num(whole.commands_per_s()),
                whole
                    .coordinator_pct
                    .iter()
                    .map(|c| (c * 10.0).round() / 10.0)
                    .collect::<Vec<_>>(),
                num(whole.redis_pct)
            );
            if n == 0 {
                baseline[k] = Some((cmds.clone(), cpu.clone()));
            }
            let (bc, bu) = match &baseline[k] {
                Some((c, u)) => (Some(c.clone()), Some(u.clone())),
                None => (None, None),
            };
            let vs = if n == 0 { "" } else { " vs 0 groups" };
            rows.push(row(
                format!("S1 idle: Redis commands/s, {n} groups, {count} coordinator(s){vs}"),
                "cmds/s",
                &cmds,
                if n == 0 { None } else { bc.as_deref() },
                "<= 200 in total, flat in N",
            ));
            rows.push(row(
                format!(
                    "S1 idle: CPU of the busiest coordinator, {n} groups, {count} coordinator(s){}",
                    match (n, bu.as_deref()) {
                        (1.., Some(b)) => format!(" (0 groups: {} %)", num(summarize(b).median)),
                        _ => String::new(),
                    }
                ),
                "% core",
                &cpu,
                None,
                "<= 2 % per coordinator, flat in N",
            ));
            drop(extra);
        }
    }
    Ok(rows)
}
