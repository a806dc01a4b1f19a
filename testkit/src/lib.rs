//! Test harness for Redis Stream Coordinator: starts real `redis-server` processes
//! (standalone, with AOF when asked, or a 3-node Redis Cluster) and `rsc-coordinator`
//! processes on free loopback ports, waits until they answer, and stops them when dropped.
//!
//! Nothing here assumes a server on 6379: every process gets its own port and directory.
//!
//! ```no_run
//! use rsc_testkit::{CoordinatorProcess, RedisServer};
//!
//! let redis = RedisServer::start().unwrap();
//! let coordinator = CoordinatorProcess::start(&["--sweep-interval-ms", "50"]).unwrap();
//! println!("redis at {}, coordinator at {}", redis.url(), coordinator.url());
//! ```
#![deny(missing_docs)]

mod cluster;
mod coordinator;
mod redis;
mod sentinel;
mod tls;

pub use cluster::{CLUSTER_NODES, RedisCluster};
pub use coordinator::{CoordinatorProcess, binary_path};
pub use redis::{RedisOptions, RedisServer, RedisTls};
pub use sentinel::{SENTINEL_MASTER, SentinelDeployment};
pub use tls::TlsCerts;

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

/// A free TCP port on `127.0.0.1` (bound and released; the OS does not hand it out again at
/// once).
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Polls `cond` every 20 ms until it returns `Some`, or fails after `deadline`.
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut cond: impl FnMut() -> Option<T>,
) -> io::Result<T> {
    let until = Instant::now() + deadline;
    loop {
        if let Some(v) = cond() {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("timed out after {deadline:?} waiting for {what}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a signal to a process by pid.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) -> io::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).map_err(io::Error::from)
}

pub use nix::sys::signal::Signal;

/// Calls per command (`cmdstat_<name>` → `calls`) in the text of Redis' `INFO commandstats`.
pub fn command_calls(info: &str) -> std::collections::BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The number of connections listed in the text of Redis' `CLIENT LIST`.
pub fn client_count(list: &str) -> usize {
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// The sum of every sample of `metric` in the Prometheus text `text` whose labels include all
/// of `labels` (exact name match: `x_total` does not match `x_total_bucket`).
pub fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let (name, rest) = name_labels.split_once('{').unwrap_or((name_labels, ""));
            let labelled = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            (name == metric && labelled).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_info_texts_are_read() {
        let info = "# Commandstats\r\ncmdstat_xadd:calls=12,usec=40,usec_per_call=3.33\r\n\
                    cmdstat_xinfo|groups:calls=3,usec=9\r\n";
        let calls = command_calls(info);
        assert_eq!(calls.get("xadd"), Some(&12));
        assert_eq!(calls.get("xinfo|groups"), Some(&3));
        assert_eq!(calls.values().sum::<u64>(), 15);
        assert_eq!(client_count("id=1 addr=a\nid=2 addr=b\n\n"), 2);
    }
}
