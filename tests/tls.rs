//! TLS to Redis end to end, with real processes on loopback: a CA, a server certificate for
//! 127.0.0.1 and a client certificate made with the `openssl` CLI, a TLS-only `redis-server`
//! (`--port 0 --tls-port P`), the coordinator on `--store redis` with `rediss://` URLs for the
//! store and the data Redis, a `sample-producer` process (`RSC_REDIS_TLS_CA`) and an
//! in-process listener (`.redis_tls_ca()`), all over TLS. Then what must be refused, with a
//! clear error: a wrong CA, unusable TLS files, and (against `tls-auth-clients yes`) a client
//! without a certificate. Last, Redis Sentinel over TLS: master, replica and sentinels
//! TLS-only (`tls-replication yes`), the coordinator's store found through them
//! (`--redis-sentinel-tls`), and a client handle writing through a failover.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

use rsc_client::{AppHandle, ConsumerApp, Listener, Message, Raw};
use rsc_e2e::Api;
use rsc_redis::sentinel::SentinelTarget;
use rsc_redis::{ConnSettings, LazyRedis, Reconnect, Tls, TlsFiles};
use rsc_testkit::{
    CoordinatorProcess, RedisCluster, RedisServer, SENTINEL_MASTER, SentinelDeployment, Signal,
    TlsCerts, binary_path, signal,
};
use serde_json::json;
use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const COUNT: u64 = 2_000;

fn settings() -> ConnSettings {
    ConnSettings {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(2),
        operation_timeout: Duration::from_secs(3),
        reconnect: Reconnect::Quick,
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Waits for `cond` (checked every 50 ms) for at most `secs`.
async fn eventually(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `PING` through a fresh handle to `url` with `tls`: the reply or the error's text (with
/// rustls's reason when the handshake failed).
async fn ping(url: &str, tls: &Tls) -> Result<String, String> {
    let mut redis =
        LazyRedis::open(&[url.to_owned()], false, &settings(), tls).map_err(|e| e.to_string())?;
    redis::cmd("PING")
        .query_async::<String>(&mut redis)
        .await
        .map_err(|e| match rsc_redis::tls::tls_failure(&e) {
            Some(reason) => format!("TLS: {reason}"),
            None => e.to_string(),
        })
}

/// A consumer app of one listener with 2 members, over TLS with `ca`; records entry ids.
fn start_listener(
    coordinator: &str,
    url: &str,
    cluster: bool,
    ca: &Path,
    seen: Arc<Mutex<HashSet<String>>>,
) -> (
    AppHandle,
    tokio::task::JoinHandle<Result<(), rsc_client::ClientError>>,
) {
    let listener = Listener::new("billing", "orders", move |msg: Message<Raw>| {
        let seen = seen.clone();
        async move {
            let id = format!("{}/{}", msg.shard(), msg.id());
            seen.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
            Ok::<(), rsc_client::HandlerError>(())
        }
    })
    .concurrency(2);
    let app = ConsumerApp::builder()
        .coordinator(coordinator)
        .redis_url(url)
        .redis_cluster(cluster)
        .redis_tls_ca(ca)
        .instance_id("127.0.0.71")
        .listener(listener)
        .build()
        .expect("app");
    let handle = app.handle();
    (handle, tokio::spawn(app.run_until(std::future::pending())))
}

/// Creates a group on `coordinator` (answered `201`).
async fn create_group(coordinator: &CoordinatorProcess, group: serde_json::Value) {
    let (s, body) = Api::new(coordinator.url()).post("/v1/groups", group).await;
    assert_eq!(s.as_u16(), 201, "{body}");
}

/// `sample-producer` publishing `COUNT` entries over TLS (`RSC_REDIS_TLS_CA`).
fn produce(coordinator: &str, url: &str, cluster: bool, ca: &Path) -> Duration {
    let started = Instant::now();
    let mut cmd = Command::new(binary_path("sample-producer").expect("built"));
    if cluster {
        cmd.arg("--redis-cluster");
    }
    let out = cmd
        .args(["--coordinator", coordinator, "--redis-url", url])
        .args(["--stream", "orders", "--count", &COUNT.to_string()])
        .env("RSC_REDIS_TLS_CA", ca)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("sample-producer runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "producer failed: {stdout}");
    assert_eq!(stdout.trim(), format!("published {COUNT}"));
    started.elapsed()
}

/// The store, the data Redis, the producer and the listener over TLS; every entry handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_producer_and_listener_work_over_tls() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let redis = RedisServer::start_tls(&certs, "optional").expect("TLS redis-server starts");
    let url = redis.url();
    assert!(url.starts_with("rediss://127.0.0.1:"), "{url}");
    produce_and_consume(&certs, &url, false).await;
}

/// The same on a 3-node Redis Cluster over TLS (`tls-cluster yes`): shard workers connect to
/// the node of their shard's slot, following `MOVED` with the seeds' TLS settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_over_tls_works_too() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let cluster = RedisCluster::start_tls(&certs).expect("TLS cluster forms");
    let url = cluster.url();
    assert!(url.starts_with("rediss://"), "{url}");
    produce_and_consume(&certs, &url, true).await;
}

/// A coordinator with the store and the data Redis at `url` (a cluster's seeds with
/// `cluster`), a group, the producer and a listener: every entry handled, all over TLS.
async fn produce_and_consume(certs: &TlsCerts, url: &str, cluster: bool) {
    let ca = path(&certs.ca());
    let mut args = vec![
        "--store",
        "redis",
        "--redis-url",
        url,
        "--redis-tls-ca",
        &ca,
        "--data-redis-url",
        url,
        "--data-redis-tls-ca",
        &ca,
    ];
    if cluster {
        args.extend(["--redis-cluster", "--data-redis-cluster"]);
    }
    let coordinator = CoordinatorProcess::start(&args).expect("the coordinator starts on TLS");
    create_group(
        &coordinator,
        json!({"group": "billing", "stream": "orders", "shard_count": 4,
            "session_timeout_ms": 3000, "heartbeat_interval_ms": 300}),
    )
    .await;

    let seen = Arc::new(Mutex::new(HashSet::new()));
    let (handle, app) = start_listener(&coordinator.url(), url, cluster, &certs.ca(), seen.clone());
    let published_in = produce(&coordinator.url(), url, cluster, &certs.ca());
    let started = Instant::now();
    eventually("every entry handled over TLS", 60, || {
        seen.lock().unwrap_or_else(|e| e.into_inner()).len() as u64 >= COUNT
    })
    .await;
    println!(
        "TLS (cluster: {cluster}): {COUNT} entries published in {published_in:?}, all handled \
         {:?} after the producer finished",
        started.elapsed()
    );
    // The coordinator reads the group's lag from the data Redis, over TLS too.
    let (s, view) = Api::new(coordinator.url()).get("/v1/groups/billing").await;
    assert_eq!(s.as_u16(), 200, "{view}");
    handle.shutdown();
    app.await.expect("app task").expect("app ends cleanly");
    assert_eq!(
        seen.lock().unwrap_or_else(|e| e.into_inner()).len() as u64,
        COUNT
    );
}

/// A server certificate not signed by the CA given, and TLS files that cannot be used: the
/// coordinator refuses to start and says why; the library names rustls's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_and_bad_files_are_refused_with_a_clear_error() {
    let certs = TlsCerts::generate().expect("certificates");
    let redis = RedisServer::start_tls(&certs, "optional").expect("TLS redis-server starts");
    let url = redis.url();
    let start = |args: &[&str]| {
        let mut all = vec!["--store", "redis", "--redis-url", &url];
        all.extend_from_slice(args);
        CoordinatorProcess::start(&all)
            .expect_err("the coordinator refuses to start")
            .to_string()
    };
    let other = path(&certs.other_ca());
    let err = start(&["--redis-tls-ca", &other]);
    assert!(
        err.contains("TLS to Redis at 127.0.0.1:") && err.contains("UnknownIssuer"),
        "{err}"
    );
    let err = start(&["--redis-tls-ca", "/nonexistent/ca.pem"]);
    assert!(
        err.contains("cannot read the CA certificate file /nonexistent/ca.pem"),
        "{err}"
    );
    let garbage = certs.dir().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let err = start(&["--redis-tls-ca", &path(&garbage)]);
    assert!(err.contains("no PEM certificate"), "{err}");
    let err = start(&["--redis-tls-cert", &path(&certs.client_cert())]);
    assert!(err.contains("needs its private key"), "{err}");
    let plain = "redis://127.0.0.1:1".to_owned();
    let err = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-url",
        &plain,
        "--redis-tls-ca",
        &path(&certs.ca()),
    ])
    .expect_err("a CA with a redis:// URL is refused")
    .to_string();
    assert!(err.contains("does not use TLS"), "{err}");

    let wrong = TlsFiles {
        ca: Some(certs.other_ca()),
        ..TlsFiles::default()
    }
    .load()
    .expect("the other CA loads");
    let err = ping(&url, &wrong).await.unwrap_err();
    assert!(
        err.starts_with("TLS: ") && err.contains("UnknownIssuer"),
        "{err}"
    );
    // The system's roots do not know the test CA either.
    assert!(ping(&url, &Tls::default()).await.is_err());
    // `#insecure` skips the verification (tests only).
    assert_eq!(
        ping(&format!("{url}/#insecure"), &Tls::default())
            .await
            .as_deref(),
        Ok("PONG")
    );
}

/// `tls-auth-clients yes`: the client certificate is accepted, its absence refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = TlsCerts::generate().expect("certificates");
    let redis = RedisServer::start_tls(&certs, "yes").expect("TLS redis-server starts");
    let url = redis.url();
    let (ca, cert, key) = (
        path(&certs.ca()),
        path(&certs.client_cert()),
        path(&certs.client_key()),
    );
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-tls-ca",
        &ca,
        "--redis-tls-cert",
        &cert,
        "--redis-tls-key",
        &key,
    ])
    .expect("the coordinator starts with a client certificate");
    create_group(
        &coordinator,
        json!({"group": "g", "stream": "s", "shard_count": 2}),
    )
    .await;

    let with_cert = TlsFiles {
        ca: Some(certs.ca()),
        cert: Some(certs.client_cert()),
        key: Some(certs.client_key()),
    }
    .load()
    .expect("loads");
    assert_eq!(ping(&url, &with_cert).await.as_deref(), Ok("PONG"));
    // A producer given the same files through its builder publishes.
    let producer = rsc_client::producer::Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(url.as_str())
        .redis_tls_ca(certs.ca())
        .redis_tls_client_cert(certs.client_cert(), certs.client_key())
        .build()
        .expect("producer");
    let at = producer
        .publish("s", Some("k1"), &json!({"n": 1}))
        .await
        .expect("publish over mutual TLS");
    assert!(at.shard < 2, "{at:?}");
    let ca_only = TlsFiles {
        ca: Some(certs.ca()),
        ..TlsFiles::default()
    }
    .load()
    .expect("loads");
    let err = ping(&url, &ca_only).await.unwrap_err();
    println!("without a client certificate: {err}");
    let err = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-tls-ca",
        &ca,
    ])
    .expect_err("the coordinator refuses to start without its certificate")
    .to_string();
    assert!(err.contains("TLS to Redis at 127.0.0.1:"), "{err}");
}

/// Sentinels, master and replica over TLS only: the coordinator's store behind them, and a
/// client handle that keeps writing across a failover (the new master found over TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_finds_the_master_and_the_next_one() {
    let certs = TlsCerts::generate().expect("certificates");
    let mut deployment =
        SentinelDeployment::start_tls(1, 3, &certs).expect("TLS sentinel deployment starts");
    let sentinels = deployment.sentinel_addrs();
    let ca = path(&certs.ca());
    let coordinator = CoordinatorProcess::start(&[
        "--store",
        "redis",
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        SENTINEL_MASTER,
        "--redis-sentinel-tls",
        "--redis-tls-ca",
        &ca,
    ])
    .expect("the coordinator starts behind TLS sentinels");
    // The wake-up pub/sub goes to the master the sentinels name, over TLS too.
    eventually("the wake-up subscriber connected", 20, || {
        coordinator
            .log()
            .iter()
            .any(|l| l.contains("wake-up subscriber connected"))
    })
    .await;
    create_group(
        &coordinator,
        json!({"group": "g", "stream": "s", "shard_count": 2}),
    )
    .await;

    let target = SentinelTarget {
        sentinels: rsc_redis::sentinel::parse_addrs(&sentinels).expect("addresses"),
        master_name: SENTINEL_MASTER.into(),
        username: None,
        password: None,
        tls: true,
    };
    let tls = TlsFiles {
        ca: Some(certs.ca()),
        ..TlsFiles::default()
    }
    .load()
    .expect("loads");
    let redis = LazyRedis::open_sentinel(&target, "redis://sentinel-master/", &settings(), &tls)
        .expect("handle");
    let set = |v: u32| {
        let mut redis = redis.clone();
        async move {
            redis::cmd("SET")
                .arg("k")
                .arg(v)
                .query_async::<()>(&mut redis)
                .await
        }
    };
    set(1).await.expect("SET on the first master over TLS");
    let mut node = redis.dedicated(Duration::from_secs(2));
    let pong: String = redis::cmd("PING")
        .query_async(&mut node)
        .await
        .expect("a dedicated connection to the master over TLS");
    assert_eq!(pong, "PONG");

    let first = deployment.master_port().expect("a master");
    let master = deployment
        .servers
        .iter()
        .position(|s| s.port() == first)
        .expect("the master is one of the servers");
    let pid = deployment.servers[master].pid().expect("running");
    signal(pid, Signal::SIGKILL).expect("kill the master");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut v = 2;
    while set(v).await.is_err() {
        assert!(Instant::now() < deadline, "no new master over TLS");
        tokio::time::sleep(Duration::from_millis(100)).await;
        v += 1;
    }
    let second = deployment.master_port().expect("a new master");
    assert_ne!(second, first);
    println!(
        "Sentinel over TLS: writes resumed on the new master {:?} after the kill ({} lookups)",
        started.elapsed(),
        redis.sentinel().map_or(0, |s| s.lookups())
    );
    deployment.servers[master].kill();
}
