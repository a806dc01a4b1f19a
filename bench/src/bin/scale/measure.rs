//! Measuring: CPU of processes, Redis commands.

use super::*;

pub(crate) fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User + system CPU seconds of process `pid` so far (`/proc/<pid>/stat`).
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').context("/proc stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    Ok(ticks as f64 / clk_tck())
}

/// From `INFO stats commandstats` of one server: `total_commands_processed` (which counts the
/// commands scripts run inside Redis too), and the script calls clients made (`EVALSHA`,
/// `EVAL`, `FCALL`). The `INFO` call itself is counted by the next one.
pub(crate) fn commands_processed(conn: &Mutex<redis::Connection>) -> Result<(u64, u64)> {
    let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .arg("commandstats")
        .query(&mut *conn)?;
    let total = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .context("total_commands_processed")?;
    let mut scripts = 0;
    for l in info.lines() {
        for cmd in ["evalsha", "eval", "fcall"] {
            if let Some(rest) = l.strip_prefix(&format!("cmdstat_{cmd}:calls=")) {
                scripts += rest
                    .split(',')
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Ok((total, scripts))
}

/// Commands clients send to `redis` (not those scripts run inside Redis) while `work` runs,
/// counted with `MONITOR` on a raw connection (as P1 does).
pub(crate) async fn client_commands<F: std::future::Future<Output = Result<u64>>>(
    redis: &RedisServer,
    work: F,
) -> Result<(u64, u64)> {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", redis.port()))?;
    conn.write_all(b"MONITOR\r\n")?;
    let reader = conn.try_clone()?;
    let lines = std::thread::spawn(move || {
        let mut n = 0u64;
        for line in BufReader::new(reader)
            .lines()
            .map_while(std::result::Result::ok)
        {
            // `+<time> [<db> <client>] "<COMMAND>" ...`; a script's own calls show `[0 lua]`.
            if let Some((client, _)) = line.split_once("] ")
                && !client.ends_with(" lua")
            {
                n += 1;
            }
        }
        n
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let done = work.await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.shutdown(std::net::Shutdown::Both)?;
    let n = lines
        .join()
        .map_err(|_| anyhow::anyhow!("monitor reader panicked"))?;
    Ok((done, n))
}

/// Sends each prepared request once, in order, 8 in flight; returns the member heartbeats
/// answered.
pub(crate) async fn send_each(http: &reqwest::Client, requests: Arc<Vec<Prepared>>) -> Result<u64> {
    let done = Arc::new(AtomicU64::new(0));
    let (h, d, r) = (http.clone(), done.clone(), requests.clone());
    for_each_concurrent(requests.len(), 8, Duration::from_secs(120), move |i| {
        let (h, d, r) = (h.clone(), d.clone(), r.clone());
        async move {
            let p = &r[i];
            let resp = h
                .post(&p.url)
                .header("content-type", "application/json")
                .body(reqwest::Body::from(p.body.to_vec()))
                .send()
                .await?;
            if !resp.status().is_success() {
                bail!("{}: {}", p.url, resp.status());
            }
            let _ = resp.bytes().await?;
            d.fetch_add(p.items, Ordering::Relaxed);
            Ok(())
        }
    })
    .await?;
    Ok(done.load(Ordering::Relaxed))
}

/// What is watched during a window.
pub(crate) struct Probe {
    pub(crate) coordinators: Vec<u32>,
    /// redis-server pids, and one connection to each (opened once: a connection's set-up
    /// commands would be counted).
    pub(crate) redis: Vec<(u32, Mutex<redis::Connection>)>,
}

#[derive(Debug, Clone)]
pub(crate) struct Snap {
    pub(crate) at: Instant,
    pub(crate) coordinators: Vec<f64>,
    pub(crate) redis_cpu: f64,
    pub(crate) commands: u64,
    pub(crate) scripts: u64,
    pub(crate) me: f64,
}

/// Usage over a window.
#[derive(Debug, Clone)]
pub(crate) struct Usage {
    pub(crate) secs: f64,
    /// % of one core, per coordinator.
    pub(crate) coordinator_pct: Vec<f64>,
    /// % of one core, every redis-server together.
    pub(crate) redis_pct: f64,
    /// % of one core, this process (the load generator).
    pub(crate) me_pct: f64,
    /// Commands Redis processed (less the probe's own `INFO` calls).
    pub(crate) commands: u64,
    /// Script calls clients made.
    pub(crate) scripts: u64,
}

impl Usage {
    pub(crate) fn commands_per_s(&self) -> f64 {
        self.commands as f64 / self.secs
    }
    pub(crate) fn max_coordinator_pct(&self) -> f64 {
        self.coordinator_pct.iter().copied().fold(0.0, f64::max)
    }
    pub(crate) fn sum_coordinator_pct(&self) -> f64 {
        self.coordinator_pct.iter().sum()
    }
}

impl Probe {
    pub(crate) fn new(
        coordinators: &[&CoordinatorProcess],
        redis: &[&RedisServer],
    ) -> Result<Self> {
        Ok(Probe {
            coordinators: coordinators.iter().map(|c| pid(c)).collect::<Result<_>>()?,
            redis: redis
                .iter()
                .map(|r| {
                    let conn = redis::Client::open(r.url())?.get_connection()?;
                    Ok((r.pid().context("redis pid")?, Mutex::new(conn)))
                })
                .collect::<Result<_>>()?,
        })
    }

    pub(crate) fn snap(&self) -> Result<Snap> {
        let (mut commands, mut scripts) = (0, 0);
        let mut redis_cpu = 0.0;
        for (pid, conn) in &self.redis {
            let (c, s) = commands_processed(conn)?;
            commands += c;
            scripts += s;
            redis_cpu += cpu_seconds(*pid)?;
        }
        Ok(Snap {
            at: Instant::now(),
            coordinators: self
                .coordinators
                .iter()
                .map(|&p| cpu_seconds(p))
                .collect::<Result<_>>()?,
            redis_cpu,
            commands,
            scripts,
            me: cpu_seconds(std::process::id())?,
        })
    }

    pub(crate) fn usage(&self, a: &Snap, b: &Snap) -> Usage {
        let secs = (b.at - a.at).as_secs_f64();
        let pct = |x: f64, y: f64| 100.0 * (y - x) / secs;
        Usage {
            secs,
            coordinator_pct: a
                .coordinators
                .iter()
                .zip(&b.coordinators)
                .map(|(x, y)| pct(*x, *y))
                .collect(),
            redis_pct: pct(a.redis_cpu, b.redis_cpu),
            me_pct: pct(a.me, b.me),
            commands: (b.commands - a.commands).saturating_sub(self.redis.len() as u64),
            scripts: b.scripts - a.scripts,
        }
    }

    /// Samples every `step` for `window`: one [`Usage`] per step, and one over the whole window.
    pub(crate) async fn watch(
        &self,
        window: Duration,
        step: Duration,
    ) -> Result<(Vec<Usage>, Usage)> {
        let first = self.snap()?;
        let mut last = first.clone();
        let mut steps = Vec::new();
        let n = (window.as_secs_f64() / step.as_secs_f64()).round().max(1.0) as u32;
        for i in 1..=n {
            tokio::time::sleep_until((first.at + step * i).into()).await;
            let s = self.snap()?;
            steps.push(self.usage(&last, &s));
            last = s;
        }
        let whole = self.usage(&first, &last);
        Ok((steps, whole))
    }
}
