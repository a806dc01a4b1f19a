//! Integration tests for apps built on `rsc-client`, as Spring Kafka's `EmbeddedKafka`: a
//! [`Harness`] starts a `redis-server` (from `PATH`) on a free loopback port and an
//! in-process `rsc-coordinator` on its memory store, reading lag from that Redis; both stop
//! when it is dropped.
//!
//! The example publishes, consumes and asserts (it needs `redis-server` on `PATH`):
//!
//! ```
//! use rsc_client::prelude::*;
//! use rsc_client::producer::Producer;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Order { cents: u64 }
//!
//! async fn on_order(msg: Message<Order>, total: Data<AtomicU64>) -> Result<(), HandlerError> {
//!     total.fetch_add(msg.payload().cents, Ordering::SeqCst);
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let harness = rsc_harness::Harness::start().await?;
//! harness.create_group("billing", "orders", 4).await?;
//!
//! let total = Arc::new(AtomicU64::new(0));
//! let app = ConsumerApp::builder()
//!     .coordinator(harness.coordinator_url())
//!     .redis_url(harness.redis_url())
//!     .instance_id("test-pod")
//!     .data_arc(total.clone())
//!     .listener(Listener::new("billing", "orders", on_order))
//!     .build()?;
//! let handle = app.handle();
//! let running = tokio::spawn(app.run_until(std::future::pending::<()>()));
//!
//! let producer = Producer::builder()
//!     .coordinator(harness.coordinator_url())
//!     .redis_url(harness.redis_url())
//!     .build()?;
//! for cents in 1..=10u64 {
//!     let key = format!("order-{cents}");
//!     producer.publish("orders", Some(&key), &Order { cents }).await?;
//! }
//!
//! // Wait on the condition, with a deadline.
//! let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
//! while total.load(Ordering::SeqCst) < 55 {
//!     assert!(tokio::time::Instant::now() < deadline, "not every order was handled");
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//! }
//! assert_eq!(total.load(Ordering::SeqCst), 55);
//!
//! handle.shutdown();
//! running.await??;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

use rsc_api::CoordinatorClient;
use rsc_protocol::CreateGroupRequest;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long the harness waits for the Redis and the coordinator to answer.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the harness could not start or do what it was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// `redis-server` could not be started (is it on `PATH`?).
    #[error("cannot start redis-server (it must be on PATH)")]
    RedisSpawn(#[source] std::io::Error),
    /// `redis-server` did not answer `PING` in time.
    #[error("redis-server on port {port} did not answer within {START_TIMEOUT:?}")]
    RedisNotReady {
        /// Its port.
        port: u16,
    },
    /// No free loopback port, or no temporary directory.
    #[error("cannot set up the harness")]
    Io(#[from] std::io::Error),
    /// The coordinator's settings were refused.
    #[error("the coordinator's settings were refused")]
    CoordinatorConfig(#[source] rsc_coordinator::config::ConfigError),
    /// The coordinator stopped, or did not answer in time.
    #[error("the in-process coordinator did not start: {0}")]
    CoordinatorNotReady(String),
    /// A call to the coordinator failed.
    #[error(transparent)]
    Coordinator(#[from] rsc_api::CoordinatorError),
    /// A group or stream id given to the harness is not a valid id (PROTOCOL §1).
    #[error(transparent)]
    InvalidId(#[from] rsc_protocol::IdError),
}

/// A `redis-server` and an in-process coordinator for one test. Dropping it stops both.
pub struct Harness {
    redis: Child,
    redis_url: String,
    coordinator_url: String,
    api: CoordinatorClient,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("redis_url", &self.redis_url)
            .field("coordinator_url", &self.coordinator_url)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// Starts `redis-server` on a free port of 127.0.0.1 (no persistence) and a coordinator
    /// (memory store, strict fencing, lag from that Redis) on another; returns once both
    /// answer. Needs a multi-threaded Tokio runtime or a current-thread one that keeps
    /// running (the coordinator runs on it).
    pub async fn start() -> Result<Self, HarnessError> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let redis = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(HarnessError::RedisSpawn)?;
        let mut guard = KillOnDrop(Some(redis));
        wait_for_redis(port).await?;
        let redis_url = format!("redis://127.0.0.1:{port}");
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let cfg = rsc_coordinator::config::ServeArgs {
            data_redis: rsc_coordinator::config::DataRedisArgs {
                data_redis_url: Some(redis_url.clone().into()),
                ..Default::default()
            },
            listen: Some(listen),
            ..Default::default()
        }
        .resolve()
        .map_err(HarnessError::CoordinatorConfig)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let (done_tx, mut done) = oneshot::channel::<String>();
        let server = tokio::spawn(async move {
            let r = rsc_coordinator::server::serve(cfg, async {
                let _ = stopped.await;
            })
            .await;
            let _ = done_tx.send(match r {
                Ok(()) => "it stopped".to_owned(),
                Err(e) => format!("{e:#}"),
            });
        });
        let coordinator_url = format!("http://{listen}");
        let api = CoordinatorClient::builder([coordinator_url.clone()]).build()?;
        wait_for_coordinator(&api, &mut done).await?;
        Ok(Harness {
            redis: guard.0.take().expect("spawned"),
            redis_url,
            coordinator_url,
            api,
            stop: Some(stop),
            server,
            _dir: dir,
        })
    }

    /// The Redis, e.g. `redis://127.0.0.1:41234` (for `.redis_url(..)`).
    pub fn redis_url(&self) -> &str {
        &self.redis_url
    }

    /// The coordinator, e.g. `http://127.0.0.1:41235` (for `.coordinator(..)`).
    pub fn coordinator_url(&self) -> &str {
        &self.coordinator_url
    }

    /// The coordinator's HTTP client, for anything [`Self::create_group`] does not cover.
    pub fn api(&self) -> &CoordinatorClient {
        &self.api
    }

    /// Creates `group` reading `stream` (`shards` shards when the stream is new), with a
    /// short session timeout (3 s) and heartbeat interval (300 ms) so that tests move fast.
    pub async fn create_group(
        &self,
        group: &str,
        stream: &str,
        shards: u32,
    ) -> Result<(), HarnessError> {
        let req = CreateGroupRequest {
            shard_count: Some(shards),
            session_timeout_ms: Some(3_000),
            heartbeat_interval_ms: Some(300),
            ..CreateGroupRequest::new(group.parse()?, stream.parse()?)
        };
        self.api.create_group(&req).await?;
        Ok(())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.server.abort();
        let _ = self.redis.kill();
        let _ = self.redis.wait();
    }
}

/// Kills the Redis if the harness fails to start after spawning it.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until the Redis on `port` answers `PING`.
async fn wait_for_redis(port: u16) -> Result<(), HarnessError> {
    let deadline = Instant::now() + START_TIMEOUT;
    let ping = move || -> std::io::Result<bool> {
        let mut conn = TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_secs(1)))?;
        conn.write_all(b"PING\r\n")?;
        let mut buf = [0u8; 7];
        conn.read_exact(&mut buf)?;
        Ok(&buf == b"+PONG\r\n")
    };
    while Instant::now() < deadline {
        if tokio::task::spawn_blocking(ping)
            .await
            .ok()
            .and_then(Result::ok)
            == Some(true)
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(HarnessError::RedisNotReady { port })
}

/// Waits until the coordinator answers (or reports why it stopped).
async fn wait_for_coordinator(
    api: &CoordinatorClient,
    done: &mut oneshot::Receiver<String>,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(why) = done.try_recv() {
            return Err(HarnessError::CoordinatorNotReady(why));
        }
        if api.list_groups().await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(HarnessError::CoordinatorNotReady(format!(
        "no answer within {START_TIMEOUT:?}"
    )))
}
