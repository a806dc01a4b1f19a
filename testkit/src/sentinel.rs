//! A Redis Sentinel deployment on loopback: one master, replicas, and sentinels watching it
//! (`redis-server CONF --sentinel`, as Debian's `redis-sentinel` runs it).

use crate::redis::{RedisOptions, RedisServer, RedisTls, raw_command, tls_command};
use crate::{free_port, wait_for};
use std::io;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The name the sentinels monitor the master under.
pub const SENTINEL_MASTER: &str = "rscmaster";

/// One master, `replicas` replicas and `sentinels` sentinels (quorum: a majority), with a
/// fast failure detection (`down-after-milliseconds` 1000). Everything is killed when
/// dropped.
#[derive(Debug)]
pub struct SentinelDeployment {
    /// The data servers; index 0 started as the master.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    /// Everything speaks TLS only (servers, replication, sentinels).
    tls: Option<RedisTls>,
}

#[derive(Debug)]
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SentinelDeployment {
    /// Starts the servers, waits until the replicas are in sync, starts the sentinels and
    /// waits until every sentinel knows the replicas and the other sentinels.
    pub fn start(replicas: usize, sentinels: usize) -> io::Result<Self> {
        Self::start_with(replicas, sentinels, None)
    }

    /// Same, everything over TLS only with `certs` (`tls-port`, `tls-replication yes`, and
    /// `tls-auth-clients optional`): servers, replication, sentinels.
    pub fn start_tls(
        replicas: usize,
        sentinels: usize,
        certs: &crate::TlsCerts,
    ) -> io::Result<Self> {
        Self::start_with(replicas, sentinels, Some(RedisTls::new(certs, "optional")))
    }

    fn start_with(replicas: usize, sentinels: usize, tls: Option<RedisTls>) -> io::Result<Self> {
        let master = RedisServer::start_with(RedisOptions {
            tls: tls.clone(),
            ..RedisOptions::default()
        })?;
        let mport = master.port();
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(RedisOptions {
                extra_args: vec!["--replicaof".into(), "127.0.0.1".into(), mport.to_string()],
                tls: tls.clone(),
                ..RedisOptions::default()
            })?);
        }
        for r in &servers[1..] {
            wait_for("a replica to sync", Duration::from_secs(20), || {
                r.command("INFO replication")
                    .ok()
                    .filter(|i| i.contains("master_link_status:up"))
            })?;
        }
        let quorum = sentinels / 2 + 1;
        let mut started = Vec::new();
        for _ in 0..sentinels {
            started.push(Self::spawn_sentinel(mport, quorum, tls.as_ref())?);
        }
        for s in &started {
            wait_for(
                "the sentinels to discover each other and the replicas",
                Duration::from_secs(30),
                || {
                    let r = command(
                        tls.as_ref(),
                        s.port,
                        &format!("SENTINEL MASTER {SENTINEL_MASTER}"),
                    )
                    .ok()?;
                    let field = |name: &str| -> Option<usize> {
                        // RESP (`$N` before each value) or redis-cli's output (values only).
                        let mut lines = r.lines().filter(|l| !l.starts_with('$'));
                        while let Some(l) = lines.next() {
                            if l == name {
                                return lines.next()?.parse().ok();
                            }
                        }
                        None
                    };
                    (field("num-slaves")? >= replicas
                        && field("num-other-sentinels")? + 1 >= sentinels)
                        .then_some(())
                },
            )?;
        }
        Ok(SentinelDeployment {
            servers,
            sentinels: started,
            tls,
        })
    }

    fn spawn_sentinel(
        master_port: u16,
        quorum: usize,
        tls: Option<&RedisTls>,
    ) -> io::Result<Sentinel> {
        let dir = tempfile::Builder::new().prefix("rsc-sentinel-").tempdir()?;
        let port = free_port()?;
        let conf = dir.path().join("sentinel.conf");
        // `--port 0 --tls-port P …` as `port 0\ntls-port P\n…` lines.
        let listen = match tls {
            Some(t) => t
                .args(port)
                .chunks(2)
                .map(|kv| format!("{} {}\n", kv[0].trim_start_matches("--"), kv[1]))
                .collect(),
            None => format!("port {port}\n"),
        };
        std::fs::write(
            &conf,
            format!(
                "{listen}bind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 logfile {dir}/sentinel.log\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 2\n",
                dir = dir.path().display()
            ),
        )?;
        let binary = std::env::var_os("RSC_REDIS_SERVER").unwrap_or_else(|| "redis-server".into());
        let child = Command::new(binary)
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot run redis-server --sentinel (apt-get install -y redis-sentinel): {e}"),
                )
            })?;
        let mut s = Sentinel {
            child,
            port,
            _dir: dir,
        };
        wait_for("a sentinel to answer PING", Duration::from_secs(10), || {
            if let Ok(Some(_)) = s.child.try_wait() {
                return Some(false);
            }
            command(tls, port, "PING")
                .is_ok_and(|r| r.starts_with("+PONG") || r.trim() == "PONG")
                .then_some(true)
        })
        .and_then(|ok| {
            if ok {
                Ok(())
            } else {
                Err(io::Error::other("redis sentinel exited at start"))
            }
        })?;
        s.port = port;
        Ok(s)
    }

    /// The sentinels' addresses, `127.0.0.1:PORT,…` (for `--redis-sentinel`).
    pub fn sentinel_addrs(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The port of the master according to the first sentinel that answers.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let r = command(
                self.tls.as_ref(),
                s.port,
                &format!("SENTINEL GET-MASTER-ADDR-BY-NAME {SENTINEL_MASTER}"),
            )
            .ok()?;
            r.lines().last()?.trim().parse().ok()
        })
    }
}

/// One command to a sentinel on `port`: plain, or through `redis-cli --tls`.
fn command(tls: Option<&RedisTls>, port: u16, line: &str) -> io::Result<String> {
    match tls {
        Some(t) => tls_command(t, "127.0.0.1", port, line),
        None => raw_command("127.0.0.1", port, line),
    }
}
