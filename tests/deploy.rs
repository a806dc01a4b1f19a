//! Deployment: the Kubernetes manifests in `docker/k8s/` (parsed, and checked against the
//! binaries they run and against each other), and the sample consumer's probe endpoints that
//! they point at (a real `sample-consumer` process with a real Redis and coordinator).
//!
//! Build the binaries first: `cargo build --workspace --bins`. The Docker images and compose
//! file are exercised by `docker/smoke.sh`, which needs a Docker engine.

use rsc_e2e::Api;
use rsc_testkit::{CoordinatorProcess, RedisServer, Signal, binary_path, free_port, signal};
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---- the manifests ----------------------------------------------------------------------------

fn manifest(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docker/k8s")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The only container of a Deployment's pod template.
fn container(deployment: &Value) -> &Value {
    let cs = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(cs.len(), 1, "one container per pod");
    &cs[0]
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name} in {}", container["name"]))
}

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("args are strings").to_owned())
        .collect()
}

/// The value after `flag` in `args`.
fn arg<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    &args[i + 1]
}

/// The port number a probe or Service refers to (a number, or a named container port).
fn port_number(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == *port)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {port}"))
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr}"))
}

/// Every `--flag` of the manifest's args is one the binary knows.
fn assert_flags_exist(args: &[String], binary: &str, subcommand: &[&str]) {
    let out = Command::new(binary_path(binary).expect("built (cargo build --workspace --bins)"))
        .args(subcommand)
        .arg("--help")
        .output()
        .expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "{binary} {subcommand:?} has no {flag}:\n{help}"
        );
    }
}

/// Probes: readiness on /readyz and liveness on /healthz, both on `port`.
fn assert_probes(container: &Value, port: u64) {
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} path");
        assert_eq!(port_number(container, &get["port"]), port, "{probe} port");
        assert!(
            container[probe]["periodSeconds"]
                .as_u64()
                .is_some_and(|p| p > 0)
        );
    }
}

/// Selectors match the pod template, a rolling update never drops below the replica count,
/// and the image is one docker/build.sh makes (no registry: never pulled when present).
fn assert_deployment_basics(d: &Value, image: &str) {
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    for (k, v) in d["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&labels[k], v, "selector label {k} on the pod template");
    }
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    let c = container(d);
    assert!(
        c["image"]
            .as_str()
            .is_some_and(|i| i.starts_with(&format!("{image}:"))),
        "image {}",
        c["image"]
    );
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    // The images run as the `rsc` user (uid 10001) of the base image.
    assert_eq!(
        d["spec"]["template"]["spec"]["securityContext"]["runAsUser"],
        10001
    );
}

#[test]
fn coordinator_manifest_matches_the_binary_and_graceful_shutdown() {
    let docs = manifest("coordinator.yaml");
    let deploy = find(&docs, "Deployment", "rsc-coordinator");
    let service = find(&docs, "Service", "rsc-coordinator");
    assert_deployment_basics(deploy, "rsc-coordinator");
    let c = container(deploy);

    let a = args(c);
    assert_eq!(a[0], "serve");
    assert_eq!(
        arg(&a, "--store"),
        "redis",
        "replicas share the Redis store"
    );
    assert_flags_exist(&a[1..], "rsc-coordinator", &["serve"]);

    let listen = port_of(env(c, "RSC_LISTEN")["value"].as_str().expect("RSC_LISTEN"));
    assert!(
        env(c, "RSC_LISTEN")["value"]
            .as_str()
            .unwrap()
            .starts_with("0.0.0.0:")
    );
    assert_probes(c, listen);

    // The Service routes to the pods' listening port.
    let pod_labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&pod_labels[k], v, "Service selector {k}");
    }
    let sp = &service["spec"]["ports"][0];
    assert_eq!(port_number(c, &sp["targetPort"]), listen);

    // The ACL file comes from a Secret mounted where RSC_ACL points.
    let acl = env(c, "RSC_ACL")["value"].as_str().expect("RSC_ACL");
    let mount = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| acl.starts_with(m["mountPath"].as_str().unwrap_or("\0")))
        .expect("RSC_ACL is on a mounted volume");
    let volume = deploy["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert!(
        volume["secret"]["secretName"].is_string(),
        "ACL from a Secret"
    );

    // preStop sleeps while the endpoints are removed, then SIGTERM drains in-flight requests
    // (the client's heartbeat timeout is at most 10 s): the grace period covers both.
    let pre_stop = &c["lifecycle"]["preStop"]["exec"]["command"];
    assert_eq!(pre_stop[0], "sleep");
    let sleep_s: u64 = pre_stop[1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("sleep seconds");
    assert!((1..=15).contains(&sleep_s));
    let grace = deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        grace >= sleep_s + 10,
        "grace {grace} s < preStop {sleep_s} s + 10 s drain"
    );
}

/// Whether `path` lies on one of `container`'s volume mounts.
fn on_a_mount(container: &Value, path: &str) -> bool {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| path.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap_or("\0"))))
}

#[test]
fn https_manifest_mounts_every_tls_file_and_probes_the_tls_port() {
    let docs = manifest("coordinator-https.yaml");
    let deploy = find(&docs, "Deployment", "rsc-coordinator");
    assert_deployment_basics(deploy, "rsc-coordinator");
    let c = container(deploy);
    let a = args(c);
    assert_flags_exist(&a[1..], "rsc-coordinator", &["serve"]);
    for name in [
        "RSC_ACL",
        "RSC_TLS_CERT",
        "RSC_TLS_KEY",
        "RSC_TLS_CLIENT_CA",
    ] {
        let file = env(c, name)["value"].as_str().expect(name);
        assert!(on_a_mount(c, file), "{name}={file} is on a mounted volume");
        let flag = format!(
            "--{}",
            name["RSC_".len()..].to_lowercase().replace('_', "-")
        );
        assert_flags_exist(&[flag], "rsc-coordinator", &["serve"]);
    }
    // The kubelet has no client certificate: the probes only open a connection.
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["tcpSocket"]["port"], "https", "{probe}");
    }
    let consumer = find(&docs, "Deployment", "rsc-sample-consumer");
    let c = container(consumer);
    assert_flags_exist(&args(c), "sample-consumer", &[]);
    let url = env(c, "RSC_COORDINATOR_URL")["value"].as_str().unwrap();
    assert!(url.starts_with("https://rsc-coordinator:"), "{url}");
    for name in [
        "RSC_COORDINATOR_CA",
        "RSC_COORDINATOR_CERT",
        "RSC_COORDINATOR_KEY",
        "RSC_TOKEN_FILE",
    ] {
        let file = env(c, name)["value"].as_str().expect(name);
        assert!(on_a_mount(c, file), "{name}={file} is on a mounted volume");
    }
    let volumes = consumer["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains("serviceAccountToken"),
        "a projected token: {volumes}"
    );
    // The token is for the coordinator (its [[jwt]] audience), of a service account of its own.
    let token = &consumer["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "token")
        .expect("token volume")["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(token["audience"], "rsc-coordinator");
    assert!(
        token["expirationSeconds"]
            .as_u64()
            .is_some_and(|s| s >= 600)
    );
    let account = consumer["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    find(&docs, "ServiceAccount", account);
    // The coordinator mounts the cluster's JWKS (a ConfigMap) for its [[jwt]] entries.
    let volumes = deploy["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(volumes.contains("rsc-coordinator-jwks"), "{volumes}");
    let mounts = mount_paths(deploy);
    assert!(mounts.contains(&"/etc/rsc/jwks".to_owned()), "{mounts:?}");
}

/// The mount paths of a Deployment's only container.
fn mount_paths(deployment: &Value) -> Vec<String> {
    container(deployment)["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn statefulset_manifest_gives_each_pod_a_static_id_from_its_name() {
    let docs = manifest("sample-consumer-statefulset.yaml");
    let set = find(&docs, "StatefulSet", "rsc-sample-consumer");
    let c = container(set);
    let a = args(c);
    assert_flags_exist(&a, "sample-consumer", &[]);
    // The static id is the pod's name, which a StatefulSet keeps across restarts; the flag
    // it feeds exists on the binary.
    assert_eq!(
        env(c, "RSC_STATIC_ID")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_flags_exist(&["--static-id".to_owned()], "sample-consumer", &[]);
    let labels = &set["spec"]["template"]["metadata"]["labels"];
    for (k, v) in set["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "selector label {k} on the pod template");
    }
    let health = arg(&a, "--health-listen");
    assert_probes(c, port_of(health));
}

#[test]
fn consumer_manifest_matches_the_binary_and_graceful_shutdown() {
    let docs = manifest("sample-consumer.yaml");
    let deploy = find(&docs, "Deployment", "rsc-sample-consumer");
    assert_deployment_basics(deploy, "rsc-sample-consumer");
    let c = container(deploy);

    let a = args(c);
    assert_flags_exist(&a, "sample-consumer", &[]);

    // Member ids come from the pod's own address (downward API).
    assert_eq!(
        env(c, "POD_IP")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.podIP"
    );
    assert!(
        !a.iter().any(|x| x == "--pod-ip"),
        "POD_IP, not a fixed --pod-ip"
    );
    assert!(env(c, "RSC_TOKEN")["valueFrom"]["secretKeyRef"]["name"].is_string());

    // The probes hit the port --health-listen serves.
    let health = arg(&a, "--health-listen");
    assert!(health.starts_with("0.0.0.0:"));
    assert_probes(c, port_of(health));

    // Scrape-ready: the client's metrics are served on the health port.
    let ann = &deploy["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/path"], "/metrics");
    assert_eq!(
        ann["prometheus.io/port"]
            .as_str()
            .and_then(|p| p.parse::<u64>().ok()),
        Some(port_of(health))
    );

    // It talks to the coordinator Service of coordinator.yaml.
    let coord = find(&manifest("coordinator.yaml"), "Service", "rsc-coordinator").clone();
    assert_eq!(
        env(c, "RSC_COORDINATOR_URL")["value"],
        format!(
            "http://{}:{}",
            coord["metadata"]["name"].as_str().unwrap(),
            coord["spec"]["ports"][0]["port"]
        )
    );

    // SIGTERM starts the graceful shutdown itself (finish in-flight, ack, leave): no preStop
    // delays it, and the grace period covers the handling time plus 10 s for ack and leave.
    assert!(c["lifecycle"]["preStop"].is_null(), "no preStop delay");
    let handle_s = arg(&a, "--handle-ms").parse::<u64>().expect("ms") / 1000;
    let grace = deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(grace >= handle_s + 10, "grace {grace} s");
}

#[test]
fn producer_manifest_matches_the_binary_and_is_scrape_ready() {
    let docs = manifest("sample-producer.yaml");
    let deploy = find(&docs, "Deployment", "rsc-sample-producer");
    assert_deployment_basics(deploy, "rsc-sample-producer");
    let c = container(deploy);
    let a = args(c);
    assert_flags_exist(&a, "sample-producer", &[]);
    let health = arg(&a, "--health-listen");
    assert!(health.starts_with("0.0.0.0:"));
    assert_probes(c, port_of(health));
    let ann = &deploy["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/path"], "/metrics");
    assert_eq!(
        ann["prometheus.io/port"]
            .as_str()
            .and_then(|p| p.parse::<u64>().ok()),
        Some(port_of(health))
    );
    assert!(env(c, "RSC_TOKEN")["valueFrom"]["secretKeyRef"]["name"].is_string());
}

#[test]
fn bridge_sidecar_manifest_matches_the_binary_and_its_configuration_checks() {
    let docs = manifest("bridge-sidecar.yaml");
    let deploy = find(&docs, "Deployment", "billing");
    let pod = &deploy["spec"]["template"]["spec"];
    let sidecar = &pod["initContainers"][0];
    assert_eq!(sidecar["name"], "rsc-bridge");
    assert_eq!(
        sidecar["restartPolicy"], "Always",
        "a native sidecar: up before the application, down after it"
    );
    assert!(
        sidecar["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("rsc-bridge:"))
    );
    let a = args(sidecar);
    assert_flags_exist(&a, "rsc-bridge", &[]);
    // The configuration file the ConfigMap holds, where the sidecar reads it.
    let config = find(&docs, "ConfigMap", "rsc-bridge-billing");
    let toml = config["data"]["bridge.toml"].as_str().expect("bridge.toml");
    let path = arg(&a, "--config");
    assert!(on_a_mount(sidecar, path), "{path} is on a mount");
    let listen = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = "))
        .expect("listen")
        .trim_matches('"');
    assert_probes(sidecar, port_of(listen));
    let app = &pod["containers"][0];
    assert_eq!(
        env(app, "BRIDGE_URL")["value"],
        format!("http://127.0.0.1:{}", port_of(listen))
    );
    assert_eq!(
        env(app, "APP_TOKEN")["valueFrom"]["secretKeyRef"]["name"],
        "rsc-bridge-app-token"
    );
    // The bridge accepts the file as written (the token file replaced by a local one).
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").expect("write");
    let local = toml.replace("/var/run/secrets/rsc-app/token", &token.to_string_lossy());
    let file = dir.path().join("bridge.toml");
    std::fs::write(&file, local).expect("write");
    let out = Command::new(binary_path("rsc-bridge").expect("built"))
        .args(["--config", &file.to_string_lossy(), "--check-config"])
        .env("RSC_COORDINATOR_URL", "http://127.0.0.1:1")
        .env("POD_IP", "10.0.0.7")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("listener billing: group billing stream orders"),
        "{stdout}"
    );
}

// ---- the sample consumer's probe endpoints ------------------------------------------------------

/// A running `sample-consumer` whose log is kept for failure messages. Killed when dropped.
struct Pod {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Pod {
    fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n")
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn status_of(http: &reqwest::Client, url: &str) -> Option<(u16, Value)> {
    let r = http
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// Polls `url` until `want(status, body)` holds, or panics with the pod's log after 30 s.
async fn wait_health(
    http: &reqwest::Client,
    pod: &Pod,
    url: &str,
    what: &str,
    want: impl Fn(u16, &Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = status_of(http, url).await;
        if let Some((s, body)) = &got
            && want(*s, body)
        {
            return body.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: last {got:?}; log:\n{}",
            pod.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn redis_conn(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("redis connection")
}

#[tokio::test]
async fn sample_consumer_probes_follow_redis_and_shutdown() {
    let mut redis = RedisServer::start().expect("redis-server starts");
    let coordinator = CoordinatorProcess::start(&["--store", "memory"]).expect("coordinator");
    let api = Api::new(coordinator.url());
    let (s, body) = api
        .post(
            "/v1/groups",
            json!({"group": "probe", "stream": "events", "shard_count": 1,
                   "session_timeout_ms": 3000, "heartbeat_interval_ms": 300}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");

    let port = free_port().expect("port");
    let mut child = Command::new(binary_path("sample-consumer").expect("built"))
        .args([
            "--coordinator",
            &coordinator.url(),
            "--redis-url",
            &redis.url(),
        ])
        .args([
            "--group",
            "probe",
            "--stream",
            "events",
            "--pod-ip",
            "127.0.0.31",
        ])
        .args(["--handle-ms", "3000", "--record-stream", "probe:handled"])
        .args(["--health-listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sample-consumer starts");
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    let mut pod = Pod { child, log };
    let http = rsc_e2e::http();
    let healthz = format!("http://127.0.0.1:{port}/healthz");
    let readyz = format!("http://127.0.0.1:{port}/readyz");

    wait_health(&http, &pod, &healthz, "healthz 200", |s, _| s == 200).await;
    let ready = wait_health(&http, &pod, &readyz, "ready", |s, _| s == 200).await;
    assert_eq!(ready["status"], "ready");

    // The data Redis goes away: not ready (still alive), with the reason; back: ready again.
    redis.stop();
    let down = wait_health(&http, &pod, &readyz, "not ready without Redis", |s, _| {
        s == 503
    })
    .await;
    assert!(
        down["reason"]
            .as_str()
            .is_some_and(|r| r.contains("data Redis")),
        "{down}"
    );
    assert_eq!(status_of(&http, &healthz).await.map(|r| r.0), Some(200));
    redis.restart().expect("redis restarts");
    wait_health(&http, &pod, &readyz, "ready again", |s, _| s == 200).await;

    // One message whose handling takes 3 s; SIGTERM while it is in flight: not ready from the
    // signal on, yet alive until the handling is done, acknowledged, and the member has left.
    let mut con = redis_conn(&redis);
    let _: String = redis::cmd("XADD")
        .arg("events:0")
        .arg("*")
        .arg("payload")
        .arg(r#"{"seq":0,"key":"k0"}"#)
        .arg("key")
        .arg("k0")
        .query(&mut con)
        .expect("XADD");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pending: redis::RedisResult<(u64, redis::Value, redis::Value, redis::Value)> =
            redis::cmd("XPENDING")
                .arg("events:0")
                .arg("probe")
                .query(&mut con);
        if matches!(pending, Ok((1, ..))) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the message was never delivered: {pending:?}; log:\n{}",
            pod.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The pod's metrics can be scraped on the same port (Prometheus text format).
    let metrics = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("/metrics answers");
    assert_eq!(metrics.status().as_u16(), 200);
    assert!(
        metrics
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/plain")),
        "Prometheus text format"
    );
    let text = metrics.text().await.expect("body");
    for name in ["rsc_client_heartbeats_total", "rsc_client_owned_shards"] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing from /metrics:\n{text}"
        );
    }
    signal(pod.child.id(), Signal::SIGTERM).expect("SIGTERM");
    let leaving = wait_health(&http, &pod, &readyz, "not ready once SIGTERM", |s, b| {
        s == 503 && b["reason"] == "shutting down"
    })
    .await;
    assert_eq!(leaving["status"], "not ready");
    assert!(
        pod.child.try_wait().expect("try_wait").is_none(),
        "still finishing the message in flight"
    );

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = pod.child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit; log:\n{}",
            pod.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit {status:?}; log:\n{}", pod.log());
    let recorded: u64 = redis::cmd("XLEN")
        .arg("probe:handled")
        .query(&mut con)
        .expect("XLEN");
    assert_eq!(
        recorded, 1,
        "the message in flight was handled before the exit"
    );
    let pending: (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg("events:0")
        .arg("probe")
        .query(&mut con)
        .expect("XPENDING");
    assert_eq!(pending.0, 0, "and acknowledged");
    let (s, group) = api.get("/v1/groups/probe").await;
    assert_eq!(s.as_u16(), 200);
    assert_eq!(group["members"], json!([]), "the member left");
}
