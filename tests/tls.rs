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
//! Then the coordinator's own API over HTTPS (PROTOCOL §20): with mutual TLS, the CLI, a
//! `sample-producer`, a listener and its wake-up channel all present a client certificate
//! an ACL entry names by `cert_subject`; a client without a certificate, with one of another
//! CA, or of a subject no entry names is refused. A certificate swapped on disk is served to
//! new connections while an open one keeps working; bad files stop startup, named. The
//! certificate matchers keep subject, SAN URI and SAN DNS name apart (a SAN URI `CN=ops-cert`
//! is not the subject `CN=ops-cert`); the client CA file replaced on disk applies to new
//! handshakes; a certificate a `--tls-client-crl` list revokes is refused.
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
    if !cluster {
        // The group is strict: its owner keys are tracked on a TLS connection of their own.
        let api = Api::new(coordinator.url());
        let connected = api
            .metric("rsc_fencing_token_tracking_connected", &[])
            .await;
        assert_eq!(connected, 1.0, "owner-key tracking over TLS");
        let hits = api
            .metric("rsc_fencing_token_tracked_hits_total", &[])
            .await;
        assert!(
            hits > 0.0,
            "steady heartbeats answered from the tracked keys"
        );
    }
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
        coordinator.logged("wake-up subscriber connected")
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
    // The first sentinel that answers may learn the new configuration from the leader's
    // hello messages a little after the client already found the new master (asking
    // each sentinel in turn): wait until it names another server too.
    eventually("the sentinels name the new master", 10, || {
        deployment.master_port().is_some_and(|p| p != first)
    })
    .await;
    println!(
        "Sentinel over TLS: writes resumed on the new master {:?} after the kill ({} lookups)",
        started.elapsed(),
        redis.sentinel().map_or(0, |s| s.lookups())
    );
    deployment.servers[master].kill();
}

/// An HTTPS client trusting `ca` only (not the system's roots), presenting `identity`
/// (certificate, key) when given. ALPN offers HTTP/2 first, as rsc-api does.
fn https_client(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::Client {
    https_client_alpn(ca, identity, &[b"h2", b"http/1.1"])
}

/// [`https_client`] offering the ALPN protocols `alpn`.
fn https_client_alpn(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> reqwest::Client {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |p: &Path| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(p)
            .expect("PEM file")
            .map(|c| c.expect("certificate"))
            .collect()
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca) {
        roots.add(c).expect("CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certs(cert), PrivateKeyDer::from_pem_file(key).expect("key"))
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTPS client")
}

/// `GET base/path` with `client`: status and JSON body, or the transport error's text.
async fn get_json(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, serde_json::Value), String> {
    let mut req = client.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_str(&text).unwrap_or(json!(text))))
}

/// An ACL with an admin token and an entry for the test client certificate's subject.
const MTLS_ACL: &str = r#"
[[tokens]]
principal = "ops"
token = "ops-token"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[tokens]]
principal = "billing-pods"
cert_subject = "CN=rsc test client"
roles = ["admin"]
groups = ["*"]
streams = ["*"]
"#;

/// HTTPS with required client certificates: the CLI creates a group, a listener (and its
/// wake-up channel) and a producer work, every one with the client certificate and no
/// token; the audit names the principal and the credential kind. Refused: no certificate,
/// another CA's, a subject no entry names (401 unless a token is sent), plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_carries_the_cli_producer_listener_and_wakeups() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let other = TlsCerts::generate().expect("openssl makes the certificates");
    let redis = RedisServer::start().expect("redis-server starts");
    let acl = certs.dir().join("acl.toml");
    std::fs::write(&acl, MTLS_ACL).unwrap();
    let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
    let coordinator = CoordinatorProcess::start(&[
        "--acl",
        &path(&acl),
        "--tls-cert",
        &path(&certs.server_cert()),
        "--tls-key",
        &path(&certs.server_key()),
        "--tls-client-ca",
        &path(&ca),
        "--data-redis-url",
        &redis.url(),
    ])
    .expect("the coordinator starts on HTTPS");
    let base = format!("https://{}", coordinator.addr());
    let started = Instant::now();

    let cli = Command::new(binary_path("rsc-coordinator").expect("built"))
        .args([
            "group", "create", "billing", "--stream", "orders", "--shards", "4",
        ])
        .env("RSC_COORDINATOR_URL", &base)
        .env("RSC_COORDINATOR_CA", &ca)
        .env("RSC_COORDINATOR_CERT", &cert)
        .env("RSC_COORDINATOR_KEY", &key)
        .env_remove("RSC_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("the CLI runs");
    assert!(
        cli.status.success(),
        "CLI over mutual TLS: {}",
        String::from_utf8_lossy(&cli.stderr)
    );

    let seen = Arc::new(Mutex::new(HashSet::new()));
    let sink = seen.clone();
    let listener = Listener::new("billing", "orders", move |msg: Message<Raw>| {
        let sink = sink.clone();
        async move {
            let id = format!("{}/{}", msg.shard(), msg.id());
            sink.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
            Ok::<(), rsc_client::HandlerError>(())
        }
    });
    let app = ConsumerApp::builder()
        .coordinator(&base)
        .coordinator_tls(rsc_client::CoordinatorTls {
            ca: Some(ca.clone()),
            cert: Some(cert.clone()),
            key: Some(key.clone()),
        })
        .redis_url(redis.url())
        .instance_id("127.0.0.72")
        .listener(listener)
        .build()
        .expect("app");
    let handle = app.handle();
    let app = tokio::spawn(app.run_until(std::future::pending()));

    const ENTRIES: u64 = 300;
    let out = Command::new(binary_path("sample-producer").expect("built"))
        .args(["--coordinator", &base, "--redis-url", &redis.url()])
        .args(["--stream", "orders", "--count", &ENTRIES.to_string()])
        .env("RSC_COORDINATOR_CA", &ca)
        .env("RSC_COORDINATOR_CERT", &cert)
        .env("RSC_COORDINATOR_KEY", &key)
        .env_remove("RSC_TOKEN")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("sample-producer runs");
    assert!(out.status.success(), "producer over mutual TLS failed");
    eventually("every entry handled, membership over HTTPS", 12, || {
        seen.lock().unwrap_or_else(|e| e.into_inner()).len() as u64 >= ENTRIES
    })
    .await;

    let client = https_client(&ca, Some((&cert, &key)));
    let mut wakes = 0.0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while wakes < 1.0 && Instant::now() < deadline {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        wakes = rsc_testkit::metric_sum(&text, "rsc_wake_channels_open", &[]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        wakes >= 1.0,
        "the listener's wake-up channel is open over HTTPS"
    );
    let (s, audit) = get_json(&client, &base, "/v1/audit", None).await.unwrap();
    assert_eq!(s, 200, "{audit}");
    let create = &audit["entries"][0];
    assert_eq!(create["action"], "group.create", "{audit}");
    assert_eq!(create["principal"], "billing-pods", "{audit}");
    assert_eq!(create["credential"], "cert_subject", "{audit}");

    // Refused at the handshake: no certificate, another CA's certificate, plain HTTP.
    for (what, refused) in [
        ("no client certificate", https_client(&ca, None)),
        (
            "a certificate of another CA",
            https_client(&ca, Some((&other.client_cert(), &other.client_key()))),
        ),
    ] {
        let r = get_json(&refused, &base, "/v1/groups", Some("ops-token")).await;
        assert!(r.is_err(), "{what}: {r:?}");
    }
    let plain = format!("http://{}", coordinator.addr());
    let r = get_json(&rsc_e2e::http(), &plain, "/v1/groups", Some("ops-token")).await;
    assert!(r.is_err(), "plain HTTP to an HTTPS listener: {r:?}");
    // A valid certificate whose subject no entry names: 401, unless a token says who.
    let stranger = https_client(&ca, Some((&certs.server_cert(), &certs.server_key())));
    let (s, body) = get_json(&stranger, &base, "/v1/groups", None)
        .await
        .unwrap();
    assert_eq!(s, 401, "{body}");
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("CN=rsc test server"),
        "{body}"
    );
    let (s, body) = get_json(&stranger, &base, "/v1/groups", Some("ops-token"))
        .await
        .unwrap();
    assert_eq!(s, 200, "{body}");
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let failed = rsc_testkit::metric_sum(&text, "rsc_tls_handshake_errors_total", &[]);
    assert!(failed >= 3.0, "refused handshakes are counted: {failed}");
    println!(
        "mutual TLS: {ENTRIES} entries over HTTPS membership in {:?}",
        started.elapsed()
    );
    handle.shutdown();
    app.await.expect("app task").expect("app ends cleanly");
}

/// Replaces `to` with `from`'s content by a rename (as a certificate manager does).
fn swap_in(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// A certificate and key swapped on disk are served to new connections within the poll
/// period, while a connection opened before keeps working; a bad file at reload keeps the
/// certificate served and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_swapped_on_disk_is_served_to_new_connections() {
    let first = TlsCerts::generate().expect("openssl makes the certificates");
    let second = TlsCerts::generate().expect("openssl makes the certificates");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    swap_in(&first.server_cert(), &cert);
    swap_in(&first.server_key(), &key);
    let coordinator =
        CoordinatorProcess::start(&["--tls-cert", &path(&cert), "--tls-key", &path(&key)])
            .expect("the coordinator starts on HTTPS");
    let base = format!("https://{}", coordinator.addr());
    let open = https_client(&first.ca(), None);
    let resp = open.get(format!("{base}/v1/groups")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), reqwest::Version::HTTP_2, "ALPN h2");
    // HTTP/1.1 by ALPN, and the dashboard, on the same listener.
    let h1 = https_client_alpn(&first.ca(), None, &[b"http/1.1"]);
    let resp = h1.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the dashboard over HTTPS");
    assert_eq!(resp.version(), reqwest::Version::HTTP_11, "ALPN http/1.1");
    assert!(
        get_json(&https_client(&second.ca(), None), &base, "/v1/groups", None)
            .await
            .is_err()
    );

    swap_in(&second.server_key(), &key);
    swap_in(&second.server_cert(), &cert);
    let swapped = Instant::now();
    loop {
        let fresh = https_client(&second.ca(), None);
        if get_json(&fresh, &base, "/v1/groups", None).await.is_ok() {
            break;
        }
        assert!(
            swapped.elapsed() < Duration::from_secs(5),
            "the new certificate is served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "new certificate served {:?} after the swap",
        swapped.elapsed()
    );
    let (s, _) = get_json(&open, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(
        s, 200,
        "the connection opened before the swap keeps working"
    );
    let r = get_json(&https_client(&first.ca(), None), &base, "/v1/groups", None).await;
    assert!(r.is_err(), "new connections get the new certificate: {r:?}");

    std::fs::write(dir.path().join("bad.pem"), "not a certificate\n").unwrap();
    swap_in(&dir.path().join("bad.pem"), &cert);
    eventually("the failed reload logged", 5, || {
        coordinator.logged("TLS certificate reload failed")
    })
    .await;
    let fresh = https_client(&second.ca(), None);
    let (s, _) = get_json(&fresh, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(s, 200, "a bad file keeps the certificate served");
    let text = fresh
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(rsc_testkit::metric_sum(&text, "rsc_tls_reload_errors_total", &[]) >= 1.0);

    // SIGHUP re-reads the files even when they did not change.
    let reloads = |text: &str| rsc_testkit::metric_sum(text, "rsc_tls_reloads_total", &[]);
    let before = reloads(&text);
    assert!(before >= 1.0);
    signal(coordinator.pid().expect("running"), Signal::SIGHUP).unwrap();
    eventually("SIGHUP logged", 5, || coordinator.logged("SIGHUP received")).await;
    // The file is still the bad one: the forced reload fails and keeps the certificate.
    let fresh = https_client(&second.ca(), None);
    let (s, _) = get_json(&fresh, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(
        s, 200,
        "a failed SIGHUP reload keeps the certificate served"
    );
    swap_in(&second.server_cert(), &cert);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = fresh
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if reloads(&text) > before {
            break;
        }
        assert!(Instant::now() < deadline, "the good file is read again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(coordinator.pid().expect("running"), Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = fresh
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if reloads(&text) >= before + 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP reloads unchanged good files"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A certificate file that is not one, a key of another certificate, a missing key: the
/// coordinator does not start, and says which file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_certificate_files_stop_startup_naming_the_file() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let other = TlsCerts::generate().expect("openssl makes the certificates");
    let garbage = certs.dir().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN NOTHING-----\n").unwrap();
    let missing = certs.dir().join("missing.key");
    for (cert, key, want) in [
        (
            garbage.clone(),
            certs.server_key(),
            format!("{}", garbage.display()),
        ),
        (
            certs.server_cert(),
            other.server_key(),
            "does not match the certificate".into(),
        ),
        (
            certs.server_cert(),
            missing.clone(),
            format!("cannot read {}", missing.display()),
        ),
    ] {
        let started =
            CoordinatorProcess::start(&["--tls-cert", &path(&cert), "--tls-key", &path(&key)]);
        let Err(e) = started else {
            panic!("startup with {cert:?} and {key:?} is refused");
        };
        let e = e.to_string();
        assert!(e.contains(&want), "want {want:?} in: {e}");
    }
}

/// A coordinator on HTTPS with mutual TLS: the server certificate of `certs`, the client CA
/// file `client_ca`, the ACL `acl` (written beside), and `extra` flags.
fn mtls_coordinator(
    certs: &TlsCerts,
    client_ca: &Path,
    acl: &str,
    extra: &[&str],
) -> std::io::Result<CoordinatorProcess> {
    let acl_file = certs.dir().join("acl.toml");
    std::fs::write(&acl_file, acl).unwrap();
    let mut args = vec![
        "--acl".to_owned(),
        path(&acl_file),
        "--tls-cert".into(),
        path(&certs.server_cert()),
        "--tls-key".into(),
        path(&certs.server_key()),
        "--tls-client-ca".into(),
        path(client_ca),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    CoordinatorProcess::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `/metrics` through `client` with the admin token `ops-token`.
async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let (s, body) = get_json(client, base, "/metrics", Some("ops-token"))
        .await
        .expect("metrics over mutual TLS");
    assert_eq!(s, 200, "{body}");
    body.as_str().unwrap_or_default().to_owned()
}

/// ACL entries of the three certificate matchers, each an admin.
const MATCHERS_ACL: &str = r#"
[[tokens]]
principal = "ops"
token = "ops-token"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[tokens]]
principal = "ops-cert"
cert_subject = "CN=ops-cert"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[tokens]]
principal = "spiffe-consumer"
cert_san_uri = "spiffe://prod/ns/billing/sa/consumer"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[tokens]]
principal = "dns-consumer"
cert_san_dns = "billing.prod.example"
roles = ["admin"]
groups = ["*"]
streams = ["*"]
"#;

/// Subject, SAN URI and SAN DNS name are three namespaces: a certificate `CN=nobody` with
/// the SAN URI `CN=ops-cert` is not the admin whose `cert_subject` is `CN=ops-cert` (it was,
/// when `cert_subject` matched SAN URIs too); `cert_san_uri` and `cert_san_dns` entries
/// authenticate their certificates, audited with their credential kind; an ACL that puts
/// a URI in `cert_subject` stops startup with a message naming `cert_san_uri`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_and_san_matchers_are_separate() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let ca = certs.ca();
    let coordinator =
        mtls_coordinator(&certs, &ca, MATCHERS_ACL, &[]).expect("the coordinator starts");
    let base = format!("https://{}", coordinator.addr());
    let (real_cert, real_key) = certs.client_with("ops-real", "ops-cert", &[], &[]).unwrap();
    let (forged_cert, forged_key) = certs
        .client_with("forged", "nobody", &["CN=ops-cert"], &["CN=ops-cert"])
        .unwrap();
    let (uri_cert, uri_key) = certs
        .client_with(
            "spiffe",
            "pod-7f9c",
            &["spiffe://prod/ns/billing/sa/consumer"],
            &[],
        )
        .unwrap();
    let (dns_cert, dns_key) = certs
        .client_with("dns", "pod-8a1b", &[], &["Billing.Prod.Example"])
        .unwrap();
    // The subject of one certificate as the SAN URI of another: not the SAN URI entry.
    let (cross_cert, cross_key) = certs
        .client_with(
            "cross",
            "spiffe://prod/ns/billing/sa/consumer",
            &["spiffe://prod/ns/other"],
            &["spiffe://prod/ns/billing/sa/consumer"],
        )
        .unwrap();

    let forged = https_client(&ca, Some((&forged_cert, &forged_key)));
    let (s, body) = get_json(&forged, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(
        s, 401,
        "a SAN URI CN=ops-cert is not the subject CN=ops-cert: {body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subject \"CN=nobody\""),
        "{body}"
    );
    let cross = https_client(&ca, Some((&cross_cert, &cross_key)));
    let (s, body) = get_json(&cross, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(s, 401, "a subject or DNS name is not a SAN URI: {body}");

    for (n, (cert, key, principal, credential)) in [
        (&real_cert, &real_key, "ops-cert", "cert_subject"),
        (&uri_cert, &uri_key, "spiffe-consumer", "cert_san_uri"),
        (&dns_cert, &dns_key, "dns-consumer", "cert_san_dns"),
    ]
    .into_iter()
    .enumerate()
    {
        let client = https_client(&ca, Some((cert, key)));
        let resp = client
            .post(format!("{base}/v1/groups"))
            .json(&json!({"group": format!("g{n}"), "stream": format!("s{n}"), "shard_count": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201, "{credential}");
        let (s, audit) = get_json(&client, &base, "/v1/audit", None).await.unwrap();
        assert_eq!(s, 200, "{audit}");
        let entry = audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["action"] == "group.create" && e["target"]["group"] == format!("g{n}"))
            .unwrap_or_else(|| panic!("group.create g{n} audited: {audit}"))
            .clone();
        assert_eq!(entry["principal"], principal, "{audit}");
        assert_eq!(entry["credential"], credential, "{audit}");
    }
    let text = scrape(&https_client(&ca, Some((&real_cert, &real_key))), &base).await;
    assert!(
        rsc_testkit::metric_sum(
            &text,
            "rsc_auth_refusals_total",
            &[("reason", "unknown_certificate")]
        ) >= 2.0
    );

    // An ACL of the time when cert_subject matched SAN URIs too: refused, saying where to
    // move the URI.
    let old = MATCHERS_ACL.replace(
        "cert_san_uri = \"spiffe://prod/ns/billing/sa/consumer\"",
        "cert_subject = \"spiffe://prod/ns/billing/sa/consumer\"",
    );
    let other = TlsCerts::generate().expect("openssl makes the certificates");
    let e = mtls_coordinator(&other, &other.ca(), &old, &[])
        .expect_err("a URI in cert_subject stops startup")
        .to_string();
    assert!(
        e.contains("is a URI, not a subject DN") && e.contains("cert_san_uri"),
        "{e}"
    );
}

/// The client CA file replaced on disk: within the poll period new handshakes accept the
/// new CA's client certificates and refuse the old CA's, without a restart, while a
/// connection opened before keeps working; a CA file that becomes invalid keeps the last
/// good CA (fail closed), logged and counted; SIGHUP re-reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_replaced_on_disk_applies_to_new_handshakes() {
    let first = TlsCerts::generate().expect("openssl makes the certificates");
    let second = TlsCerts::generate().expect("openssl makes the certificates");
    let dir = tempfile::tempdir().unwrap();
    let client_ca = dir.path().join("clients-ca.crt");
    swap_in(&first.ca(), &client_ca);
    let coordinator =
        mtls_coordinator(&first, &client_ca, MTLS_ACL, &[]).expect("the coordinator starts");
    let base = format!("https://{}", coordinator.addr());
    // The server's certificate is first's: every client trusts first's CA for the server.
    let server_ca = first.ca();
    let old_client = || {
        https_client(
            &server_ca,
            Some((&first.client_cert(), &first.client_key())),
        )
    };
    let new_client = || {
        https_client(
            &server_ca,
            Some((&second.client_cert(), &second.client_key())),
        )
    };
    let open = old_client();
    let (s, body) = get_json(&open, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(s, 200, "{body}");
    assert!(
        get_json(&new_client(), &base, "/v1/groups", None)
            .await
            .is_err()
    );

    swap_in(&second.ca(), &client_ca);
    let swapped = Instant::now();
    loop {
        let new = get_json(&new_client(), &base, "/v1/groups", None).await;
        let old = get_json(&old_client(), &base, "/v1/groups", None).await;
        if matches!(new, Ok((200, _))) && old.is_err() {
            break;
        }
        assert!(
            swapped.elapsed() < Duration::from_secs(5),
            "the new client CA applies: new {new:?}, old {old:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("new client CA used {:?} after the swap", swapped.elapsed());
    let (s, _) = get_json(&open, &base, "/v1/groups", None).await.unwrap();
    assert_eq!(
        s, 200,
        "a connection verified before the swap keeps working"
    );
    let text = scrape(&new_client(), &base).await;
    assert!(rsc_testkit::metric_sum(&text, "rsc_tls_client_ca_reloads_total", &[]) >= 1.0);
    // The test CAs share their name (`CN=rsc test ca`): the old CA's certificate is found
    // an issuer by name, whose signature does not verify (`bad_signature`; a CA of another
    // name gives `unknown_ca`).
    assert!(
        rsc_testkit::metric_sum(
            &text,
            "rsc_tls_client_cert_refusals_total",
            &[("reason", "bad_signature")]
        ) >= 1.0,
        "refused client certificates are counted by reason"
    );

    // A CA file that is no longer one: the last good CA stays; never "accept any client".
    std::fs::write(dir.path().join("bad.pem"), "not a certificate\n").unwrap();
    swap_in(&dir.path().join("bad.pem"), &client_ca);
    eventually("the failed client CA reload logged", 5, || {
        coordinator.logged("TLS client CA reload failed")
    })
    .await;
    let (s, _) = get_json(&new_client(), &base, "/v1/groups", None)
        .await
        .unwrap();
    assert_eq!(s, 200, "the last good client CA is kept");
    assert!(
        get_json(&old_client(), &base, "/v1/groups", None)
            .await
            .is_err()
    );
    let stranger = TlsCerts::generate().expect("openssl makes the certificates");
    let r = get_json(
        &https_client(
            &server_ca,
            Some((&stranger.client_cert(), &stranger.client_key())),
        ),
        &base,
        "/v1/groups",
        None,
    )
    .await;
    assert!(r.is_err(), "another CA's client is still refused: {r:?}");
    let text = scrape(&new_client(), &base).await;
    assert!(rsc_testkit::metric_sum(&text, "rsc_tls_client_ca_reload_errors_total", &[]) >= 1.0);
    // Deleted: the same.
    std::fs::remove_file(&client_ca).unwrap();
    signal(coordinator.pid().expect("running"), Signal::SIGHUP).unwrap();
    eventually("SIGHUP logged", 5, || coordinator.logged("SIGHUP received")).await;
    let (s, _) = get_json(&new_client(), &base, "/v1/groups", None)
        .await
        .unwrap();
    assert_eq!(s, 200, "a missing CA file keeps the last good client CA");

    // Back to the first CA, read again when the file reappears.
    swap_in(&first.ca(), &client_ca);
    eventually_async("the first CA applies again", 5, || async {
        get_json(&old_client(), &base, "/v1/groups", None)
            .await
            .is_ok()
    })
    .await;
}

/// Waits for the async `cond` (checked every 50 ms) for at most `secs`.
async fn eventually_async<F, Fut>(what: &str, secs: u64, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `--tls-client-crl`: a revoked client certificate fails the handshake (counted as
/// `revoked`) while the others pass; the CRL file is re-read like the CA file, so a
/// certificate revoked later is refused on new handshakes without a restart; an invalid
/// CRL file stops startup, named, and at reload keeps the last good list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused() {
    let certs = TlsCerts::generate().expect("openssl makes the certificates");
    let ca = certs.ca();
    let (lost_cert, lost_key) = certs
        .client_with("lost", "rsc test client", &[], &[])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let crl = dir.path().join("clients.crl");
    swap_in(&certs.crl("crl-1", &[&lost_cert]).unwrap(), &crl);
    let coordinator = mtls_coordinator(&certs, &ca, MTLS_ACL, &["--tls-client-crl", &path(&crl)])
        .expect("the coordinator starts with a CRL");
    let base = format!("https://{}", coordinator.addr());
    let good = || https_client(&ca, Some((&certs.client_cert(), &certs.client_key())));
    let lost = || https_client(&ca, Some((&lost_cert, &lost_key)));
    let (s, body) = get_json(&good(), &base, "/v1/groups", None).await.unwrap();
    assert_eq!(s, 200, "a certificate the CRL does not list: {body}");
    let r = get_json(&lost(), &base, "/v1/groups", Some("ops-token")).await;
    assert!(
        r.is_err(),
        "a revoked certificate fails the handshake: {r:?}"
    );
    let text = scrape(&good(), &base).await;
    let revoked = |t: &str| {
        rsc_testkit::metric_sum(
            t,
            "rsc_tls_client_cert_refusals_total",
            &[("reason", "revoked")],
        )
    };
    assert!(revoked(&text) >= 1.0, "counted as revoked");
    assert!(
        rsc_testkit::metric_sum(
            &text,
            "rsc_tls_client_crl_next_update_timestamp_seconds",
            &[]
        ) > 0.0
    );

    // The good certificate revoked too, in a new CRL: refused on new handshakes.
    let open = good();
    assert!(get_json(&open, &base, "/v1/groups", None).await.is_ok());
    swap_in(
        &certs
            .crl("crl-2", &[&lost_cert, &certs.client_cert()])
            .unwrap(),
        &crl,
    );
    eventually_async("the new CRL applies", 5, || async {
        get_json(&good(), &base, "/v1/groups", None).await.is_err()
    })
    .await;
    let text = scrape(&open, &base).await;
    assert!(revoked(&text) >= 2.0, "{}", revoked(&text));
    assert!(rsc_testkit::metric_sum(&text, "rsc_tls_client_ca_reloads_total", &[]) >= 1.0);

    // A CRL file that is not one: the last good list stays.
    std::fs::write(
        dir.path().join("bad.pem"),
        "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
    )
    .unwrap();
    swap_in(&dir.path().join("bad.pem"), &crl);
    eventually("the failed CRL reload logged", 5, || {
        coordinator.logged("TLS client CA reload failed")
    })
    .await;
    assert!(get_json(&good(), &base, "/v1/groups", None).await.is_err());
    assert!(get_json(&lost(), &base, "/v1/groups", None).await.is_err());
    drop(coordinator);

    // At startup an unusable CRL file stops the coordinator, named.
    let e = mtls_coordinator(&certs, &ca, MTLS_ACL, &["--tls-client-crl", &path(&crl)])
        .expect_err("a bad CRL stops startup")
        .to_string();
    assert!(e.contains(&path(&crl)), "{e}");
}
