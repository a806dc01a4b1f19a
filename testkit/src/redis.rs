//! `redis-server` processes.

use crate::{free_port, wait_for};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How to start a server.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Append-only file persistence (`appendonly yes`, `appendfsync always`), so that a
    /// restart keeps every acknowledged write.
    pub aof: bool,
    /// Extra `redis-server` arguments, e.g. `["--cluster-enabled", "yes"]`.
    pub extra_args: Vec<String>,
    /// Bind address (default `127.0.0.1`).
    pub bind: Option<String>,
    /// Serve TLS only ([`RedisTls`]): the port is a TLS port, [`RedisServer::url`] is
    /// `rediss://`.
    pub tls: Option<RedisTls>,
}

/// The TLS settings of a test server ([`RedisOptions::tls`]): `--port 0 --tls-port P` with
/// these files.
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// `--tls-cert-file` (also the certificate redis-server presents as a client, to its
    /// master).
    pub cert: PathBuf,
    /// `--tls-key-file`.
    pub key: PathBuf,
    /// `--tls-ca-cert-file`: the CA client certificates must be signed by.
    pub ca: PathBuf,
    /// `--tls-auth-clients`: `no`, `optional` (a client certificate, if sent, must be valid)
    /// or `yes` (required).
    pub auth_clients: String,
}

impl RedisTls {
    /// The server certificate of `certs`, their CA for clients, and `auth_clients`.
    pub fn new(certs: &crate::TlsCerts, auth_clients: &str) -> Self {
        RedisTls {
            cert: certs.server_cert(),
            key: certs.server_key(),
            ca: certs.ca(),
            auth_clients: auth_clients.to_owned(),
        }
    }

    /// The `redis-server` (or sentinel) arguments for a TLS-only server on `port`.
    pub fn args(&self, port: u16) -> Vec<String> {
        let path = |p: &PathBuf| p.display().to_string();
        [
            ("--port", "0".to_owned()),
            ("--tls-port", port.to_string()),
            ("--tls-cert-file", path(&self.cert)),
            ("--tls-key-file", path(&self.key)),
            ("--tls-ca-cert-file", path(&self.ca)),
            ("--tls-auth-clients", self.auth_clients.clone()),
            ("--tls-replication", "yes".to_owned()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }
}

/// A `redis-server` on a free loopback port, in its own temporary directory.
/// Killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    bind: String,
    options: RedisOptions,
    dir: tempfile::TempDir,
}

fn redis_server_binary() -> PathBuf {
    std::env::var_os("RSC_REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

impl RedisServer {
    /// A standalone server without persistence.
    pub fn start() -> io::Result<Self> {
        Self::start_with(RedisOptions::default())
    }

    /// A TLS-only server (`--tls-auth-clients auth_clients`) with `certs`' server certificate.
    pub fn start_tls(certs: &crate::TlsCerts, auth_clients: &str) -> io::Result<Self> {
        Self::start_with(RedisOptions {
            tls: Some(RedisTls::new(certs, auth_clients)),
            ..RedisOptions::default()
        })
    }

    /// A server with these options.
    pub fn start_with(options: RedisOptions) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("rsc-redis-").tempdir()?;
        let bind = options.bind.clone().unwrap_or_else(|| "127.0.0.1".into());
        let mut server = RedisServer {
            child: None,
            port: 0,
            bind,
            options,
            dir,
        };
        // A port picked free can be taken by another test before redis binds it: retry.
        let mut last_err = None;
        for _ in 0..5 {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut cmd = Command::new(redis_server_binary());
        match &self.options.tls {
            Some(tls) => cmd.args(tls.args(self.port)),
            None => cmd.arg("--port").arg(self.port.to_string()),
        };
        cmd.current_dir(self.dir.path())
            .arg("--bind")
            .arg(&self.bind)
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--protected-mode")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"));
        if self.options.aof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        cmd.args(&self.options.extra_args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot run redis-server (install it: apt-get install -y redis-server): {e}"
                ),
            )
        })?;
        let port = self.port;
        let host = self.bind.clone();
        let log = self.dir.path().join("redis.log");
        let tls = self.options.tls.is_some();
        let ready = wait_for(
            "redis-server to answer PING",
            Duration::from_secs(10),
            || {
                if let Ok(Some(_)) = child.try_wait() {
                    return Some(false);
                }
                // A TLS port does not answer a plain PING: the log says when it listens.
                let up = match tls {
                    true => std::fs::read_to_string(&log)
                        .is_ok_and(|l| l.contains("Ready to accept connections")),
                    false => ping(&host, port),
                };
                up.then_some(true)
            },
        );
        match ready {
            Ok(true) => {
                self.child = Some(child);
                Ok(())
            }
            Ok(false) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(io::Error::other(format!(
                    "redis-server on port {port} did not start; log: {}",
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
                )))
            }
        }
    }

    /// `redis://HOST:PORT` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}:{}", self.bind, self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (AOF, logs, cluster config).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL): nothing is flushed beyond what AOF already wrote.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server gracefully (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = crate::signal(c.id(), crate::Signal::SIGTERM);
            let exited = wait_for("redis-server to exit", Duration::from_secs(10), || {
                c.try_wait().ok().flatten()
            });
            if exited.is_err() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Starts the server again on the same port and directory (an AOF server reloads its
    /// data). Kills it first if it runs.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Sends one command (inline protocol; on a TLS server through `redis-cli --tls`, with
    /// the server's own certificate as the client's) and returns the raw reply. For test
    /// set-up only.
    pub fn command(&self, line: &str) -> io::Result<String> {
        match &self.options.tls {
            Some(tls) => tls_command(tls, &self.bind, self.port, line),
            None => raw_command(&self.bind, self.port, line),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(host: &str, port: u16) -> bool {
    raw_command(host, port, "PING").is_ok_and(|r| r.starts_with("+PONG"))
}

/// One command through `redis-cli --tls` (words separated by spaces); its output.
pub(crate) fn tls_command(tls: &RedisTls, host: &str, port: u16, line: &str) -> io::Result<String> {
    let out = Command::new("redis-cli")
        .args(["--tls", "-h", host, "-p", &port.to_string()])
        .arg("--cacert")
        .arg(&tls.ca)
        .arg("--cert")
        .arg(&tls.cert)
        .arg("--key")
        .arg(&tls.key)
        .args(line.split_whitespace())
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn raw_command(host: &str, port: u16, line: &str) -> io::Result<String> {
    let mut s = TcpStream::connect((host, port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("{line}\r\n").as_bytes())?;
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}
