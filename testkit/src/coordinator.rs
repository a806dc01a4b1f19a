//! `rsc-coordinator serve` processes.

use crate::wait_for;
use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where a workspace binary was built: beside the running test executable
/// (`target/<profile>/deps/…` → `target/<profile>/NAME`).
pub fn binary_path(name: &str) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} not found: build it first (cargo build --workspace --bins)",
                path.display()
            ),
        ))
    }
}

/// A running `rsc-coordinator serve` on a free loopback port. Killed when dropped.
#[derive(Debug)]
pub struct CoordinatorProcess {
    child: Option<Child>,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    /// Reads stderr into `log` until the process exits.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl CoordinatorProcess {
    /// Starts `rsc-coordinator serve --listen 127.0.0.1:0 ARGS…` and waits for its
    /// `listening on ADDR` line.
    pub fn start(args: &[&str]) -> io::Result<Self> {
        Self::start_listening("127.0.0.1:0", args)
    }

    /// Starts a coordinator on its memory store whose data Redis is `cluster`
    /// (`--data-redis-url <seeds> --data-redis-cluster`), with more `args`.
    pub fn start_on_cluster(cluster: &crate::RedisCluster, args: &[&str]) -> io::Result<Self> {
        let seeds = cluster.url();
        let mut all = vec![
            "--store",
            "memory",
            "--data-redis-url",
            &seeds,
            "--data-redis-cluster",
        ];
        all.extend_from_slice(args);
        Self::start(&all)
    }

    /// Same, on a chosen listen address (e.g. to restart on the same port).
    pub fn start_listening(listen: &str, args: &[&str]) -> io::Result<Self> {
        let bin = binary_path("rsc-coordinator")?;
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .args(args)
            .env(
                "RSC_LOG",
                std::env::var("RSC_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let echo = std::env::var_os("RSC_TEST_ECHO").is_some();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[coordinator] {line}");
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let found = wait_for(
            "the coordinator's `listening on` line",
            Duration::from_secs(20),
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(Err(status));
                }
                let lines = log.lock().unwrap_or_else(|p| p.into_inner());
                lines.iter().find_map(|l| {
                    let rest = &l[l.find("listening on ")? + "listening on ".len()..];
                    // Text logs end the address with a space, JSON logs with a quote.
                    rest.split(|c: char| c.is_whitespace() || c == '"')
                        .next()?
                        .parse::<SocketAddr>()
                        .ok()
                        .map(Ok)
                })
            },
        );
        match found {
            Ok(Ok(addr)) => Ok(CoordinatorProcess {
                child: Some(child),
                addr,
                log,
                reader: Some(reader),
            }),
            Ok(Err(status)) => {
                // The process is gone, so its stderr ends: read it to the end before quoting
                // it (a loaded machine can run this before the reader saw the last lines).
                let _ = reader.join();
                Err(io::Error::other(format!(
                    "rsc-coordinator exited with {status}: {}",
                    log.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
                )))
            }
            Err(e) => {
                let _ = child.kill();
                Err(e)
            }
        }
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a line of its log so far contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.contains(text))
    }

    /// SIGKILL, and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            self.drain_log();
        }
    }

    /// After the process exited: waits until every line it wrote is in [`Self::log`].
    fn drain_log(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// SIGTERM, and wait up to `timeout` for a clean exit; returns its status.
    pub fn terminate(&mut self, timeout: Duration) -> io::Result<ExitStatus> {
        let mut c = self
            .child
            .take()
            .ok_or_else(|| io::Error::other("not running"))?;
        crate::signal(c.id(), crate::Signal::SIGTERM)?;
        let r = wait_for("the coordinator to exit", timeout, || {
            c.try_wait().ok().flatten()
        });
        if r.is_err() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.drain_log();
        r
    }
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
