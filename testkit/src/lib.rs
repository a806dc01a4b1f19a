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
