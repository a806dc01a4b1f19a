//! Helpers shared by the end-to-end tests: a small JSON client for the coordinator's API.
#![deny(missing_docs)]

use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A plain `reqwest::Client`, built after installing the ring crypto provider (the
/// workspace's reqwest has rustls without a built-in provider: see
/// `rsc_api::install_crypto_provider`).
pub fn http() -> reqwest::Client {
    rsc_client::install_crypto_provider();
    reqwest::Client::new()
}

/// A JSON client for one coordinator.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// When set, [`Api::heartbeat`] alternates between the single route and the batch route
    /// (counting its calls here), so that a suite runs through both.
    alternate: Option<Arc<AtomicU64>>,
}

impl Api {
    /// A client for the coordinator at `base` (`http://HOST:PORT`).
    pub fn new(base: impl Into<String>) -> Self {
        Api {
            http: crate::http(),
            base: base.into(),
            token: None,
            alternate: None,
        }
    }

    /// The same client sending every other [`Api::heartbeat`] through `POST /v1/heartbeats`
    /// (a batch of one), answered back as the single route's status and body: every suite
    /// that heartbeats through it checks that the batch route answers exactly like the
    /// single one.
    pub fn alternating_heartbeats(mut self) -> Self {
        self.alternate = Some(Arc::default());
        self
    }

    /// One member heartbeat of `group` with request `body`, through the single route or (with
    /// `batched`) as a batch of one, mapped back to the single route's status and body.
    pub async fn member_heartbeat(
        &self,
        group: &str,
        body: Value,
        batched: bool,
    ) -> Result<(StatusCode, Value), reqwest::Error> {
        if !batched {
            let path = format!("/v1/groups/{group}/heartbeat");
            return self.try_call(Method::POST, &path, Some(body)).await;
        }
        let batch = serde_json::json!({"heartbeats": [{"group": group, "heartbeat": body}]});
        let (status, v) = self
            .try_call(Method::POST, "/v1/heartbeats", Some(batch))
            .await?;
        if status != StatusCode::OK {
            return Ok((status, v));
        }
        let item = &v["results"][0];
        let status = item["status"]
            .as_u64()
            .and_then(|s| StatusCode::from_u16(s as u16).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = match item.get("response") {
            Some(r) => r.clone(),
            None => serde_json::json!({"error": item["error"].clone()}),
        };
        Ok((status, body))
    }

    /// The same client sending `Authorization: Bearer TOKEN`.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sends a request; returns the status and the JSON body (`Null` when empty).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.try_call(method, path, body)
            .await
            .expect("coordinator reachable")
    }

    /// Like [`Api::call`], but a coordinator that cannot be reached (killed, restarting) is
    /// an `Err` rather than a panic.
    pub async fn try_call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), reqwest::Error> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        let json = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, json))
    }

    /// The base URL (`http://HOST:PORT`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// GET.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    /// POST with a JSON body.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// A heartbeat; returns status and body.
    pub async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        epoch: i64,
        owned: &[u32],
    ) -> (StatusCode, Value) {
        let body = serde_json::json!({"protocol_version": 1, "member_id": member, "member_epoch": epoch, "owned_shards": owned});
        let batched = self
            .alternate
            .as_ref()
            .is_some_and(|n| n.fetch_add(1, Ordering::Relaxed) % 2 == 1);
        self.member_heartbeat(group, body, batched)
            .await
            .expect("coordinator reachable")
    }

    /// The sum of the samples of `metric` whose labels include all of `labels`, in this
    /// coordinator's `/metrics` (0 when there is none).
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&scrape(&self.base).await, metric, labels)
    }
}

/// The Prometheus text a `/metrics` route at `base` serves (panics when it does not answer).
pub async fn scrape(base: &str) -> String {
    let r = crate::http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{base}/metrics: {e}"));
    assert!(r.status().is_success(), "{base}/metrics: {}", r.status());
    r.text().await.expect("metrics body")
}

pub use rsc_testkit::metric_sum;

/// The `error.code` of an error body.
pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// The metadata stores a protocol suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `--store memory`.
    Memory,
    /// `--store redis` on a standalone `redis-server` of its own.
    Redis,
    /// `--store redis --redis-cluster` on a 3-node Redis Cluster shared by the tests of one
    /// test binary (each stack has its own key prefix).
    RedisCluster,
}

/// A key prefix no other stack of this process uses.
pub fn unique_key_prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "rsc-t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A coordinator process on one backend, plus whatever that backend needs running.
#[derive(Debug)]
pub struct Stack {
    /// The coordinator process.
    pub coordinator: rsc_testkit::CoordinatorProcess,
    /// A client for it.
    pub api: Api,
    /// The Redis server of [`Backend::Redis`].
    pub redis: Option<rsc_testkit::RedisServer>,
    /// The (shared) cluster of [`Backend::RedisCluster`].
    pub cluster: Option<&'static rsc_testkit::RedisCluster>,
    /// The `serve` flags that select the store (to start more coordinators on it).
    pub store_args: Vec<String>,
}

impl Stack {
    /// Starts a coordinator on `backend` with extra `serve` flags.
    pub fn start(backend: Backend, extra: &[&str]) -> Self {
        let (redis, cluster, store_args) = match backend {
            Backend::Memory => (None, None, vec!["--store".to_owned(), "memory".to_owned()]),
            Backend::Redis => {
                let redis = rsc_testkit::RedisServer::start().expect("redis-server starts");
                let args = vec![
                    "--store".to_owned(),
                    "redis".to_owned(),
                    "--redis-url".to_owned(),
                    redis.url(),
                    "--key-prefix".to_owned(),
                    unique_key_prefix(),
                ];
                (Some(redis), None, args)
            }
            Backend::RedisCluster => {
                let cluster = rsc_testkit::RedisCluster::shared().expect("redis cluster starts");
                let args = vec![
                    "--store".to_owned(),
                    "redis".to_owned(),
                    "--redis-cluster".to_owned(),
                    "--redis-url".to_owned(),
                    cluster.url(),
                    "--key-prefix".to_owned(),
                    unique_key_prefix(),
                ];
                (None, Some(cluster), args)
            }
        };
        let coordinator = start_coordinator(&store_args, extra);
        // Every other heartbeat of a suite goes through the batch route.
        let api = Api::new(coordinator.url()).alternating_heartbeats();
        Stack {
            coordinator,
            api,
            redis,
            cluster,
            store_args,
        }
    }

    /// Another coordinator process on the same store (Redis backends: several coordinators
    /// share one store).
    pub fn another_coordinator(&self, extra: &[&str]) -> rsc_testkit::CoordinatorProcess {
        start_coordinator(&self.store_args, extra)
    }
}

fn start_coordinator(store_args: &[String], extra: &[&str]) -> rsc_testkit::CoordinatorProcess {
    let mut args: Vec<&str> = vec!["--sweep-interval-ms", "20"];
    args.extend(store_args.iter().map(String::as_str));
    args.extend_from_slice(extra);
    rsc_testkit::CoordinatorProcess::start(&args).expect("coordinator starts")
}

/// Declares one async test per backend for each listed suite function
/// (`async fn(Backend)`): `store_suite!(heartbeat_basics, leave_frees_at_once);`
#[macro_export]
macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::Backend::Memory).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::Backend::Redis).await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::Backend::RedisCluster).await;
                }
            )*
        }
    };
}

/// A loopback TCP proxy a test controls, to fault the path to a coordinator or a Redis.
///
/// - [`Proxy::cut`]: open connections are dropped; new ones are accepted and held silent
///   (a black hole, as in a partition) until [`Proxy::restore`].
/// - [`Proxy::swallow_replies`]: requests still reach the server, and are executed, but its
///   replies are thrown away (a reply lost in flight); [`Proxy::drop_connections`] then makes
///   the client notice.
#[derive(Debug, Clone)]
pub struct Proxy {
    addr: std::net::SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    swallow: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: impl Into<String>) -> std::io::Result<Proxy> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let proxy = Proxy {
            addr: listener.local_addr()?,
            cut: Default::default(),
            swallow: Default::default(),
            conns: Default::default(),
        };
        let (upstream, p) = (upstream.into(), proxy.clone());
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let (up, cut, swallow) = (upstream.clone(), p.cut.clone(), p.swallow.clone());
                let task = tokio::spawn(async move {
                    if cut.load(Ordering::SeqCst) {
                        // Hold the connection silent until the client gives up.
                        tokio::time::sleep(std::time::Duration::from_secs(120)).await;
                        return;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(&up).await else {
                        return;
                    };
                    let (mut down_r, mut down_w) = down.into_split();
                    let (mut up_r, mut up_w) = up.into_split();
                    let requests = tokio::io::copy(&mut down_r, &mut up_w);
                    let replies = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = up_r.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<(), std::io::Error>(());
                            }
                            if !swallow.load(Ordering::SeqCst) {
                                down_w.write_all(&buf[..n]).await?;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        _ = replies => {}
                    }
                });
                p.conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(task.abort_handle());
            }
        });
        Ok(proxy)
    }

    /// `host:port` to connect to instead of the upstream.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Drops every open connection (the next ones are forwarded again).
    pub fn drop_connections(&self) {
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            c.abort();
        }
    }

    /// Drops every open connection and holds new ones silent.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// Forwards new connections again after [`Self::cut`].
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Throws the server's replies away (`true`) or forwards them again (`false`).
    pub fn swallow_replies(&self, on: bool) {
        self.swallow.store(on, Ordering::SeqCst);
    }
}
