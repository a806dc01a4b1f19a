//! A local Redis Cluster of `redis-server` processes.

use crate::redis::{RedisOptions, RedisServer, RedisTls};
use crate::wait_for;
use std::io::{self, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// How many primaries a test cluster has (no replicas): every key slot is served.
pub const CLUSTER_NODES: usize = 3;

/// A 3-node Redis Cluster (primaries only) on free loopback ports, formed with
/// `redis-cli --cluster create` and ready (`cluster_state:ok` on every node) when
/// [`RedisCluster::start`] returns. Killed when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Keeps the reaper of a [`RedisCluster::shared`] cluster waiting until the process exits.
    _reaper: Option<(Child, ChildStdin)>,
}

fn redis_cli_binary() -> String {
    std::env::var("RSC_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

impl RedisCluster {
    /// Starts the nodes, forms the cluster and waits until every node reports
    /// `cluster_state:ok` (about 2 s: a fresh primary waits before it accepts writes).
    pub fn start() -> io::Result<Self> {
        Self::start_with(None)
    }

    /// Same, TLS only (`tls-cluster yes`: the cluster bus too) with `certs`' server
    /// certificate; [`Self::urls`] are `rediss://`.
    pub fn start_tls(certs: &crate::TlsCerts) -> io::Result<Self> {
        Self::start_with(Some(RedisTls::new(certs, "optional")))
    }

    fn start_with(tls: Option<RedisTls>) -> io::Result<Self> {
        let mut nodes = Vec::with_capacity(CLUSTER_NODES);
        for _ in 0..CLUSTER_NODES {
            let mut extra_args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
            .map(String::from)
            .to_vec();
            if tls.is_some() {
                extra_args.extend(["--tls-cluster".into(), "yes".into()]);
            }
            nodes.push(RedisServer::start_with(RedisOptions {
                extra_args,
                tls: tls.clone(),
                ..RedisOptions::default()
            })?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new(redis_cli_binary());
        if let Some(t) = &tls {
            create
                .arg("--tls")
                .arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.cert)
                .arg("--key")
                .arg(&t.key);
        }
        let mut create = create
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot run redis-cli (install redis-tools): {e}"),
                )
            })?;
        let status = wait_for(
            "redis-cli --cluster create",
            Duration::from_secs(30),
            || create.try_wait().ok().flatten(),
        );
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                let _ = create.kill();
                let _ = create.wait();
                return Err(e);
            }
        };
        if !status.success() {
            let out = create.wait_with_output()?;
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({status}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let cluster = RedisCluster {
            nodes,
            _reaper: None,
        };
        cluster.wait_ready(Duration::from_secs(20))?;
        Ok(cluster)
    }

    /// One cluster per test process, started on first use and reaped when the process
    /// exits (however it exits: a helper process kills the nodes when the test process's
    /// end of a pipe closes). Tests share it by using distinct key prefixes; a test that
    /// stops or restarts nodes must start its own cluster instead.
    pub fn shared() -> io::Result<&'static RedisCluster> {
        static SHARED: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let mut cluster = RedisCluster::start().map_err(|e| e.to_string())?;
                cluster._reaper = Some(cluster.reaper().map_err(|e| e.to_string())?);
                Ok(cluster)
            })
            .as_ref()
            .map_err(|e| io::Error::other(e.clone()))
    }

    /// A `sh` that waits for end-of-file on its stdin, then kills the nodes and removes
    /// their directories.
    fn reaper(&self) -> io::Result<(Child, ChildStdin)> {
        let pids: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|n| n.pid())
            .map(|p| p.to_string())
            .collect();
        let dirs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("'{}'", n.dir().display()))
            .collect();
        let script = format!(
            "cat >/dev/null; kill -9 {} 2>/dev/null; rm -rf {}",
            pids.join(" "),
            dirs.join(" ")
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut stdin = child.stdin.take().expect("stdin piped");
        stdin.flush()?;
        Ok((child, stdin))
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_ready(&self, deadline: Duration) -> io::Result<()> {
        wait_for("cluster_state:ok on every node", deadline, || {
            self.nodes
                .iter()
                .filter(|n| n.pid().is_some())
                .all(|n| {
                    n.command("CLUSTER INFO")
                        .is_ok_and(|r| r.contains("cluster_state:ok"))
                })
                .then_some(())
        })
    }

    /// Seed URLs, comma-separated (what `--redis-url` takes with `--redis-cluster`).
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// Every node's `redis://HOST:PORT` (`rediss://` over TLS).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, to stop or restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }
}
