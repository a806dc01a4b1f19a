//! No secret in any output (PROTOCOL §12, "Secrets in output"): every binary of the project
//! is run, as a real process, with known secrets — the store Redis's password, the data
//! Redis user's password, the sentinels' password, ACL bearer tokens (given on the command
//! line, in the environment and in a token file), JWTs, TLS private keys — through its success
//! and failure paths (wrong password, unreachable Redis, TLS against a plain server, an
//! untrusted CA, a mismatched key, an invalid URL, a cluster-mode mismatch, a wrong or expired
//! token, a config or ACL file with a typo on a secret's line, `--help` with the secrets in the
//! environment), at `RSC_LOG=trace`/`debug` in text and JSON; then every line of stdout and
//! stderr of every process is searched for every secret.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsc_testkit::{RedisServer, Signal, TlsCerts, binary_path, signal};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const STORE_PW: &str = "store-pw-Zq81x";
const WRONG_PW: &str = "wrong-pw-Hd30v";
const DATA_PW: &str = "data-pw-Kx42m";
const SENTINEL_PW: &str = "sentinel-pw-Mv77q";
const ADMIN_TOKEN: &str = "admin-token-Hn55r";
const POD_TOKEN: &str = "pod-token-Ws63k";
const WRONG_TOKEN: &str = "wrong-token-Pp19j";
const FILE_TOKEN: &str = "file-token-Tb28c";

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "rsc-coordinator";

/// A process run for this test, its stdout and stderr read as they come.
struct Proc {
    what: String,
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(what: &str, cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
        let out = Arc::new(Mutex::new(String::new()));
        let echo = std::env::var_os("RSC_TEST_ECHO").is_some();
        let mut readers = Vec::new();
        let pipes: [Box<dyn std::io::Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("piped")),
            Box::new(child.stderr.take().expect("piped")),
        ];
        for pipe in pipes {
            let sink = out.clone();
            let label = what.to_owned();
            readers.push(std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                    if echo {
                        eprintln!("[{label}] {line}");
                    }
                    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                    s.push_str(&line);
                    s.push('\n');
                }
            }));
        }
        Proc {
            what: what.to_owned(),
            child: Some(child),
            out,
            readers,
        }
    }

    fn text(&self) -> String {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Waits until the output contains `marker`, up to `max` (or until the process exited);
    /// panics with the output when it never does: the path under test must have been taken.
    #[track_caller]
    fn wait_for(&mut self, marker: &str, max: Duration) {
        if let Err(e) = self.try_wait_for(marker, max) {
            panic!("{e}");
        }
    }

    /// [`Self::wait_for`], returning the failure rather than panicking.
    fn try_wait_for(&mut self, marker: &str, max: Duration) -> Result<(), String> {
        let until = Instant::now() + max;
        while Instant::now() < until {
            if self.text().contains(marker) {
                return Ok(());
            }
            if self.exited() {
                self.join_readers();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = self.text();
        match text.contains(marker) {
            true => Ok(()),
            false => Err(format!(
                "{}: expected {marker:?} in its output:\n{}",
                self.what,
                mask(&text)
            )),
        }
    }

    /// Waits for the process to exit by itself (up to `max`); its output.
    #[track_caller]
    fn wait_exit(mut self, max: Duration) -> Transcript {
        let until = Instant::now() + max;
        while !self.exited() {
            assert!(
                Instant::now() < until,
                "{}: still running after {max:?}:\n{}",
                self.what,
                mask(&self.text())
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop()
    }

    /// SIGTERM (SIGKILL after 10 s), then the whole output.
    fn stop(mut self) -> Transcript {
        if let Some(mut c) = self.child.take() {
            let _ = signal(c.id(), Signal::SIGTERM);
            let until = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.join_readers();
        Transcript {
            what: self.what.clone(),
            text: self.text(),
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one process printed.
struct Transcript {
    what: String,
    text: String,
}

/// Every secret this test hands out, and the lines of the TLS private keys.
fn secrets(extra: &[String]) -> Vec<String> {
    let mut all: Vec<String> = [
        STORE_PW,
        WRONG_PW,
        DATA_PW,
        SENTINEL_PW,
        ADMIN_TOKEN,
        POD_TOKEN,
        WRONG_TOKEN,
        FILE_TOKEN,
    ]
    .map(str::to_owned)
    .to_vec();
    all.extend_from_slice(extra);
    all
}

/// `text` with every secret of this file replaced by `<SECRET>`, for failure messages.
fn mask(text: &str) -> String {
    secrets(&[])
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "<SECRET>"))
}

/// Asserts that no transcript holds any of `secrets`; the message names the process and
/// shows the line (with the secret masked).
#[track_caller]
fn assert_no_secret(transcripts: &[Transcript], secrets: &[String]) {
    let mut leaks = Vec::new();
    for t in transcripts {
        for line in t.text.lines() {
            for (i, s) in secrets.iter().enumerate() {
                if line.contains(s.as_str()) {
                    let shown = line.replace(s.as_str(), &format!("<SECRET #{i}>"));
                    leaks.push(format!("{}: {}", t.what, mask(&shown)));
                }
            }
        }
    }
    let lines: usize = transcripts.iter().map(|t| t.text.lines().count()).sum();
    assert!(
        lines > 0 && transcripts.iter().all(|t| !t.text.is_empty()),
        "every process printed something"
    );
    assert!(
        leaks.is_empty(),
        "{} line(s) of {lines} show a secret:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}

/// The base64 lines of a PEM file's body (long enough not to match by chance).
fn pem_body_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 40)
        .map(str::to_owned)
        .collect()
}

fn coordinator(log: &str, json: bool) -> Command {
    let mut c = Command::new(binary_path("rsc-coordinator").expect("built"));
    c.env("RSC_LOG", log)
        .env_remove("RSC_TOKEN")
        .env_remove("RSC_COORDINATOR_URL")
        .env_remove("RSC_REDIS_URL");
    if json {
        c.env("RSC_LOG_FORMAT", "json");
    }
    c
}

fn serve(what: &str, log: &str, json: bool, args: &[&str]) -> Proc {
    let mut c = coordinator(log, json);
    c.args(["serve", "--listen", "127.0.0.1:0"]).args(args);
    Proc::spawn(what, &mut c)
}

fn cli(what: &str, url: &str, args: &[&str]) -> Transcript {
    let mut c = coordinator("trace", false);
    c.args(args).args(["--coordinator", url]);
    Proc::spawn(what, &mut c).wait_exit(Duration::from_secs(30))
}

fn pod(bin: &str, log: &str, json: bool, args: &[&str]) -> Command {
    let mut c = Command::new(binary_path(bin).expect("built"));
    c.args(args)
        .env("RSC_LOG", log)
        .env_remove("RSC_TOKEN")
        .env_remove("RSC_REDIS_URL")
        .env_remove("RSC_COORDINATOR_URL");
    if json {
        c.env("RSC_LOG_FORMAT", "json");
    }
    c
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An RSA key made with `openssl` (its PEM), for the JWTs.
fn rsa_key(dir: &Path) -> Vec<u8> {
    let path = dir.join("jwt-key.pem");
    let status = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .arg("-out")
        .arg(&path)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success());
    std::fs::read(path).unwrap()
}

fn sign(key: &EncodingKey, sub: &str, exp: i64) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("k1".into());
    let claims = json!({"iss": ISSUER, "aud": [AUDIENCE], "sub": sub, "iat": now() - 7200,
        "nbf": now() - 7200, "exp": exp});
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

/// The ACL: an admin token, a pod token (member and producer) and JWTs of one issuer.
fn write_acl(dir: &Path, key: &EncodingKey) -> PathBuf {
    let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(key, Algorithm::RS256).unwrap();
    jwk.common.key_id = Some("k1".into());
    let jwks = jsonwebtoken::jwk::JwkSet { keys: vec![jwk] };
    std::fs::write(dir.join("jwks.json"), serde_json::to_string(&jwks).unwrap()).unwrap();
    let acl = dir.join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            "[[tokens]]\nprincipal = \"ops\"\ntoken = \"{ADMIN_TOKEN}\"\nroles = [\"admin\"]\n\
             groups = [\"*\"]\nstreams = [\"*\"]\n\n\
             [[tokens]]\nprincipal = \"file\"\ntoken = \"{FILE_TOKEN}\"\nroles = [\"viewer\"]\n\
             groups = [\"*\"]\nstreams = [\"*\"]\n\n\
             [[tokens]]\nprincipal = \"pod\"\ntoken = \"{POD_TOKEN}\"\n\
             roles = [\"member\", \"producer\"]\ngroups = [\"*\"]\nstreams = [\"*\"]\n\n\
             [[jwt]]\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\n\
             jwks_file = \"jwks.json\"\nsubject = \"deployer\"\nroles = [\"admin\"]\n\
             groups = [\"*\"]\nstreams = [\"*\"]\n"
        ),
    )
    .unwrap();
    acl
}

/// A password-protected store Redis (`requirepass`) and a data Redis with an ACL user.
fn protected_redis() -> (RedisServer, RedisServer) {
    let store = RedisServer::start().expect("redis-server");
    let reply = store
        .command(&format!("CONFIG SET requirepass {STORE_PW}"))
        .unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let data = RedisServer::start().expect("redis-server");
    let reply = data
        .command(&format!("ACL SETUSER app on >{DATA_PW} ~* &* +@all"))
        .unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let reply = data.command("ACL SETUSER default off").unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    (store, data)
}

/// The coordinator on a password-protected store and data Redis with an ACL, the CLI with
/// every way of giving a token (right, wrong, expired, a JWT, a token file, the
/// environment), and a sample consumer and producer with the data Redis's password and a
/// token: everything succeeds or is refused as it should, at trace level, in text and JSON.
#[test]
fn success_paths_and_refused_tokens_print_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let key_pem = rsa_key(dir.path());
    let key = EncodingKey::from_rsa_pem(&key_pem).unwrap();
    let acl = write_acl(dir.path(), &key);
    let jwt = sign(&key, "deployer", now() + 600);
    let expired = sign(&key, "deployer", now() - 3600);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{FILE_TOKEN}\n")).unwrap();
    let (store, data) = protected_redis();
    let store_url = format!("redis://:{STORE_PW}@127.0.0.1:{}", store.port());
    let data_url = format!("redis://app:{DATA_PW}@127.0.0.1:{}", data.port());
    let mut out = Vec::new();

    for json in [false, true] {
        let format = if json { "json" } else { "text" };
        let mut coord = serve(
            &format!("coordinator ({format})"),
            "trace",
            json,
            &[
                "--store",
                "redis",
                "--redis-url",
                &store_url,
                "--data-redis-url",
                &data_url,
                "--acl",
                acl.to_str().unwrap(),
                "--key-prefix",
                &format!("rsc-{format}"),
            ],
        );
        coord.wait_for("listening on", Duration::from_secs(20));
        let text = coord.text();
        let addr = text[text.find("listening on ").unwrap() + 13..]
            .split(|c: char| c.is_whitespace() || c == '"')
            .next()
            .unwrap()
            .to_owned();
        let url = format!("http://{addr}");
        let group = format!("billing-{format}");
        let stream = format!("orders-{format}");

        let created = cli(
            "cli group create (--token)",
            &url,
            &[
                "group",
                "create",
                &group,
                "--stream",
                &stream,
                "--shards",
                "2",
                "--token",
                ADMIN_TOKEN,
            ],
        );
        assert!(created.text.contains(&group), "{}", mask(&created.text));
        out.push(created);
        let listed = cli(
            "cli group list (JWT)",
            &url,
            &["group", "list", "--output", "json", "--token", &jwt],
        );
        assert!(listed.text.contains(&group), "{}", mask(&listed.text));
        out.push(listed);
        let by_file = cli(
            "cli group list (--token-file)",
            &url,
            &[
                "group",
                "list",
                "--token-file",
                token_file.to_str().unwrap(),
            ],
        );
        assert!(by_file.text.contains(&group), "{}", mask(&by_file.text));
        out.push(by_file);
        let mut by_env = coordinator("trace", false);
        by_env
            .args(["group", "describe", &group, "--coordinator", &url])
            .env("RSC_TOKEN", ADMIN_TOKEN);
        out.push(
            Proc::spawn("cli group describe (RSC_TOKEN)", &mut by_env)
                .wait_exit(Duration::from_secs(30)),
        );
        for (what, token) in [
            ("wrong token", WRONG_TOKEN),
            ("expired JWT", expired.as_str()),
        ] {
            let refused = cli(
                &format!("cli group list ({what})"),
                &url,
                &["group", "list", "--token", token],
            );
            assert!(
                refused.text.contains("UNAUTHENTICATED"),
                "{}",
                mask(&refused.text)
            );
            out.push(refused);
        }
        out.push(cli(
            "cli group list (unreachable coordinator)",
            "http://127.0.0.1:1",
            &["group", "list", "--token", ADMIN_TOKEN],
        ));

        // A sample consumer and producer, with the data Redis's password and a token.
        let mut consumer = Proc::spawn(
            &format!("sample-consumer ({format})"),
            pod("sample-consumer", "trace", json, &[])
                .args([
                    "--coordinator",
                    &url,
                    "--group",
                    &group,
                    "--stream",
                    &stream,
                ])
                .args(["--pod-ip", "127.0.0.1", "--token", POD_TOKEN])
                .env("RSC_REDIS_URL", &data_url),
        );
        consumer.wait_for("joined the group", Duration::from_secs(30));
        let producer = Proc::spawn(
            &format!("sample-producer ({format})"),
            pod("sample-producer", "trace", json, &[])
                .args(["--coordinator", &url, "--redis-url", &data_url])
                .args(["--stream", &stream, "--count", "50", "--keys", "5"])
                .env("RSC_TOKEN", POD_TOKEN),
        );
        let produced = producer.wait_exit(Duration::from_secs(30));
        assert!(
            produced.text.contains("published 50"),
            "{}",
            mask(&produced.text)
        );
        out.push(produced);
        out.push(consumer.stop());

        // A consumer with a wrong token is refused and stops.
        let refused = Proc::spawn(
            &format!("sample-consumer, wrong token ({format})"),
            pod("sample-consumer", "debug", json, &[])
                .args([
                    "--coordinator",
                    &url,
                    "--group",
                    &group,
                    "--stream",
                    &stream,
                ])
                .args(["--pod-ip", "127.0.0.1", "--token", WRONG_TOKEN])
                .args(["--redis-url", &data_url]),
        );
        out.push(refused.wait_exit(Duration::from_secs(30)));
        // A consumer with a wrong data Redis password never joins, and says why.
        let mut wrong_pw = Proc::spawn(
            &format!("sample-consumer, wrong data Redis password ({format})"),
            pod("sample-consumer", "debug", json, &[])
                .args([
                    "--coordinator",
                    &url,
                    "--group",
                    &group,
                    "--stream",
                    &stream,
                ])
                .args(["--pod-ip", "127.0.0.1", "--token", POD_TOKEN])
                .args([
                    "--redis-url",
                    &format!("redis://app:{WRONG_PW}@127.0.0.1:{}", data.port()),
                ]),
        );
        wrong_pw.wait_for("the data Redis does not answer", Duration::from_secs(30));
        out.push(wrong_pw.stop());
        // A consumer whose data Redis is behind sentinels that do not answer, with a password.
        let mut sentinels = Proc::spawn(
            &format!("sample-consumer, unreachable sentinels ({format})"),
            pod("sample-consumer", "trace", json, &[])
                .args([
                    "--coordinator",
                    &url,
                    "--group",
                    &group,
                    "--stream",
                    &stream,
                ])
                .args(["--pod-ip", "127.0.0.1", "--token", POD_TOKEN])
                .args(["--redis-url", &data_url])
                .args([
                    "--redis-sentinel",
                    "127.0.0.1:1",
                    "--redis-sentinel-master",
                    "data",
                ])
                .env("RSC_REDIS_SENTINEL_PASSWORD", SENTINEL_PW),
        );
        sentinels.wait_for("the data Redis does not answer", Duration::from_secs(30));
        out.push(sentinels.stop());
        // The sample producer against an unreachable data Redis, and with a wrong password.
        for (what, redis) in [
            (
                "unreachable data Redis",
                format!("redis://app:{DATA_PW}@127.0.0.1:1"),
            ),
            (
                "wrong data Redis password",
                format!("redis://app:{WRONG_PW}@127.0.0.1:{}", data.port()),
            ),
            (
                "rediss:// against a plain data Redis",
                format!("rediss://app:{DATA_PW}@127.0.0.1:{}", data.port()),
            ),
        ] {
            let mut p = Proc::spawn(
                &format!("sample-producer: {what} ({format})"),
                pod("sample-producer", "trace", json, &[])
                    .args(["--coordinator", &url, "--redis-url", &redis])
                    .args(["--stream", &stream, "--count", "1", "--token", POD_TOKEN])
                    .env("RSC_REDIS_SENTINEL_PASSWORD", SENTINEL_PW),
            );
            p.wait_for("127.0.0.1", Duration::from_secs(30));
            out.push(p.stop());
        }
        out.push(coord.stop());
    }
    assert_no_secret(&out, &secrets(&[jwt.clone(), expired.clone()]));
    // The JWTs' signatures alone (a JWT's header and claims are not secret).
    let sigs: Vec<String> = [&jwt, &expired]
        .iter()
        .map(|t| t.rsplit('.').next().unwrap().to_owned())
        .collect();
    assert_no_secret(&out, &sigs);
}

/// The coordinator's failure paths: each is run until it says what went wrong (or exits).
#[test]
fn failure_paths_print_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let certs = TlsCerts::generate().unwrap();
    let (store, data) = protected_redis();
    let tls_store = RedisServer::start_tls(&certs, "no").expect("TLS redis-server");
    let reply = tls_store
        .command(&format!("CONFIG SET requirepass {STORE_PW}"))
        .unwrap();
    assert!(reply.contains("OK"), "{reply}");
    let ca = certs.ca().display().to_string();
    let other_ca = certs.other_ca().display().to_string();
    let url = |pw: &str, port: u16| format!("redis://:{pw}@127.0.0.1:{port}");
    let data_url = format!("redis://app:{DATA_PW}@127.0.0.1:{}", data.port());

    // A config file with a typo on the line of a password, and an ACL file with one on the
    // line of a token: the parse errors must not quote the line.
    let config = dir.path().join("rsc.toml");
    std::fs::write(
        &config,
        format!(
            "store = \"redis\"\nredis-url = \"{}\"\nredis-sentinel-pasword = \"{SENTINEL_PW}\"\n",
            url(STORE_PW, store.port())
        ),
    )
    .unwrap();
    let bad_acl = dir.path().join("acl.toml");
    std::fs::write(
        &bad_acl,
        format!("[[tokens]]\nprincipal = \"ops\"\ntokn = \"{ADMIN_TOKEN}\"\nroles = [\"admin\"]\n"),
    )
    .unwrap();
    let typed_acl = dir.path().join("acl-typed.toml");
    std::fs::write(
        &typed_acl,
        format!(
            "[[tokens]]\nprincipal = \"ops\"\ntoken = [\"{ADMIN_TOKEN}\"]\nroles = [\"admin\"]\n"
        ),
    )
    .unwrap();

    let store_url = url(STORE_PW, store.port());
    let wrong = url(WRONG_PW, store.port());
    let unreachable = url(STORE_PW, 1);
    let tls_on_plain = format!("rediss://:{STORE_PW}@127.0.0.1:{}", store.port());
    let untrusted = format!("rediss://:{STORE_PW}@127.0.0.1:{}", tls_store.port());
    let bad_port = format!("redis://:{STORE_PW}@127.0.0.1:notaport");
    let server_cert = certs.server_cert().display().to_string();
    let client_cert = certs.client_cert().display().to_string();
    let client_key = certs.client_key().display().to_string();
    let server_key = certs.server_key().display().to_string();
    let sentinel_args = [
        "--data-redis-sentinel",
        "127.0.0.1:1",
        "--data-redis-sentinel-master",
        "data",
        "--data-redis-sentinel-password",
        SENTINEL_PW,
        "--data-redis-url",
        &data_url,
    ];

    // (what, log level, JSON, arguments, what the output must show)
    let store_flags = |u: &str| {
        vec![
            "--store".to_owned(),
            "redis".into(),
            "--redis-url".into(),
            u.into(),
        ]
    };
    let cases: Vec<(&str, &str, bool, Vec<String>, &str)> = vec![
        (
            "wrong store password",
            "trace",
            false,
            store_flags(&wrong),
            "authentication failed",
        ),
        (
            "wrong store password (JSON)",
            "debug",
            true,
            store_flags(&wrong),
            "authentication failed",
        ),
        (
            "unreachable store",
            "debug",
            false,
            store_flags(&unreachable),
            "127.0.0.1:1",
        ),
        (
            "unreachable store (JSON)",
            "trace",
            true,
            store_flags(&unreachable),
            "127.0.0.1:1",
        ),
        (
            "TLS against a plain store",
            "trace",
            false,
            [
                store_flags(&tls_on_plain),
                vec!["--redis-tls-ca".into(), ca.clone()],
            ]
            .concat(),
            "TLS",
        ),
        (
            "untrusted store certificate",
            "trace",
            true,
            [
                store_flags(&untrusted),
                vec!["--redis-tls-ca".into(), other_ca.clone()],
            ]
            .concat(),
            "TLS",
        ),
        (
            "invalid store URL",
            "trace",
            false,
            store_flags(&bad_port),
            "did not parse",
        ),
        (
            "data Redis is not a cluster",
            "trace",
            false,
            [
                "--store",
                "memory",
                "--data-redis-url",
                &data_url,
                "--data-redis-cluster",
            ]
            .map(str::to_owned)
            .to_vec(),
            "cluster",
        ),
        (
            "config file with a typo",
            "trace",
            false,
            vec!["--config".into(), config.display().to_string()],
            "redis-sentinel-pasword",
        ),
        (
            "ACL file with a typo",
            "trace",
            false,
            vec!["--acl".into(), bad_acl.display().to_string()],
            "tokn",
        ),
        (
            "ACL file with a token of the wrong type",
            "trace",
            true,
            vec!["--acl".into(), typed_acl.display().to_string()],
            "line 3, column 9",
        ),
        (
            "listener key of another certificate",
            "trace",
            false,
            ["--tls-cert", &server_cert, "--tls-key", &client_key]
                .map(str::to_owned)
                .to_vec(),
            "key",
        ),
        (
            "store client key of another certificate",
            "trace",
            false,
            [
                store_flags(&format!(
                    "rediss://:{STORE_PW}@127.0.0.1:{}",
                    tls_store.port()
                )),
                [
                    "--redis-tls-ca",
                    &ca,
                    "--redis-tls-cert",
                    &client_cert,
                    "--redis-tls-key",
                    &server_key,
                ]
                .map(str::to_owned)
                .to_vec(),
            ]
            .concat(),
            "key",
        ),
    ];
    let (mut out, mut missed) = (Vec::new(), Vec::new());
    for (what, log, json, args, marker) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = serve(&format!("coordinator: {what}"), log, *json, &args);
        if let Err(e) = p.try_wait_for(marker, Duration::from_secs(20)) {
            missed.push(e);
        }
        out.push(p.stop());
    }
    // A data Redis behind sentinels that do not answer, with a password: a group's lag is
    // read from it, and fails.
    let sentinel_args: Vec<&str> = [&["--store", "memory"][..], &sentinel_args[..]].concat();
    let mut coord = serve(
        "coordinator: unreachable sentinels",
        "trace",
        true,
        &sentinel_args,
    );
    coord.wait_for("listening on", Duration::from_secs(20));
    let text = coord.text();
    let addr = text[text.find("listening on ").unwrap() + 13..]
        .split(|c: char| c.is_whitespace() || c == '"')
        .next()
        .unwrap()
        .to_owned();
    out.push(cli(
        "cli group create (no ACL)",
        &format!("http://{addr}"),
        &["group", "create", "g", "--stream", "s", "--shards", "1"],
    ));
    coord.wait_for("sentinel", Duration::from_secs(20));
    out.push(coord.stop());
    // A store that answers after all: the coordinator starts (its startup lines name it).
    let mut ok = serve(
        "coordinator: good store",
        "debug",
        false,
        &store_flags(&store_url)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    ok.wait_for("listening on", Duration::from_secs(20));
    let t = ok.stop();
    assert!(!t.text.contains("does not answer"), "{}", mask(&t.text));
    out.push(t);
    // The same over TLS, at trace level: rustls logs its handshake, never the AUTH after it.
    let mut ok = serve(
        "coordinator: good TLS store",
        "trace",
        false,
        &[
            "--store",
            "redis",
            "--redis-url",
            &untrusted,
            "--redis-tls-ca",
            &ca,
        ],
    );
    ok.wait_for("listening on", Duration::from_secs(20));
    let t = ok.stop();
    assert!(!t.text.contains("does not answer"), "{}", mask(&t.text));
    out.push(t);

    // `--help` with the secrets in the environment: clap must not show their values.
    for (what, args) in [
        ("serve --help", vec!["serve", "--help"]),
        ("group list --help", vec!["group", "list", "--help"]),
    ] {
        let mut c = coordinator("info", false);
        c.args(args)
            .env("RSC_REDIS_URL", &store_url)
            .env("RSC_DATA_REDIS_URL", &data_url)
            .env("RSC_REDIS_SENTINEL_PASSWORD", SENTINEL_PW)
            .env("RSC_DATA_REDIS_SENTINEL_PASSWORD", SENTINEL_PW)
            .env("RSC_TOKEN", ADMIN_TOKEN);
        out.push(Proc::spawn(what, &mut c).wait_exit(Duration::from_secs(10)));
    }
    for bin in ["sample-consumer", "sample-producer"] {
        let mut c = pod(bin, "info", false, &["--help"]);
        c.env("RSC_REDIS_URL", &data_url)
            .env("RSC_TOKEN", ADMIN_TOKEN)
            .env("RSC_REDIS_SENTINEL_PASSWORD", SENTINEL_PW);
        out.push(Proc::spawn(&format!("{bin} --help"), &mut c).wait_exit(Duration::from_secs(10)));
    }
    let mut keys = pem_body_lines(&certs.client_key());
    keys.extend(pem_body_lines(&certs.server_key()));
    assert!(!keys.is_empty());
    assert_no_secret(&out, &secrets(&keys));
    assert!(missed.is_empty(), "{}", missed.join("\n\n"));
}
