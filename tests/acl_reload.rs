//! The ACL re-read without a restart (PROTOCOL §20, "ACL reload"), with real coordinator
//! processes: two replicas on one Redis store, each watching its own copy of the ACL — one
//! replaced by a rename, the other laid out as Kubernetes projects a ConfigMap or Secret
//! (`acl.toml` → `..data/acl.toml`, `..data` → a versioned directory, swapped by renaming a
//! new symlink over it) — see a token added and a token removed within about a second; a
//! file that does not parse keeps the old ACL and is counted; SIGHUP forces a re-read; an
//! entry past its `not_after` is refused as expired.

use rsc_e2e::{Api, code, metric_sum};
use rsc_testkit::{CoordinatorProcess, RedisServer, Signal, signal};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn entry(principal: &str, token: &str, rest: &str) -> String {
    format!("[[tokens]]\nprincipal = \"{principal}\"\ntoken = \"{token}\"\n{rest}\n\n")
}

fn ops() -> String {
    entry(
        "ops",
        "t-ops",
        "roles = [\"admin\"]\ngroups = [\"*\"]\nstreams = [\"*\"]",
    )
}

fn member(name: &str) -> String {
    entry(
        &format!("member-{name}"),
        &format!("t-{name}"),
        "roles = [\"member\"]\ngroups = [\"*\"]",
    )
}

/// Writes `text` to `path` the way editors and config tools do: a new file renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// An ACL directory laid out as a Kubernetes volume projects one.
struct ProjectedDir {
    dir: PathBuf,
    version: u32,
}

impl ProjectedDir {
    fn new(dir: &Path, text: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut p = ProjectedDir {
            dir: dir.to_owned(),
            version: 0,
        };
        p.update(text);
        std::os::unix::fs::symlink("..data/acl.toml", dir.join("acl.toml")).unwrap();
        p
    }

    /// A new versioned directory, then `..data` swapped to it in one rename.
    fn update(&mut self, text: &str) {
        self.version += 1;
        let v = format!("..v{}", self.version);
        std::fs::create_dir(self.dir.join(&v)).unwrap();
        std::fs::write(self.dir.join(&v).join("acl.toml"), text).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&v, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }

    fn acl(&self) -> String {
        self.dir.join("acl.toml").display().to_string()
    }
}

/// A coordinator (memory store) on the ACL file `path`, with group `g` created by `t-ops`.
async fn serving(path: &std::path::Path) -> CoordinatorProcess {
    let acl = path.display().to_string();
    let coordinator = CoordinatorProcess::start(&["--store", "memory", "--acl", &acl]).unwrap();
    let (s, _) = Api::new(coordinator.url())
        .with_token("t-ops")
        .post(
            "/v1/groups",
            json!({"group": "g", "stream": "s", "shard_count": 1}),
        )
        .await;
    assert_eq!(s.as_u16(), 201);
    coordinator
}

fn join(member: &str) -> serde_json::Value {
    json!({"protocol_version": 1, "member_id": member, "member_epoch": 0, "owned_shards": []})
}

/// The status of a heartbeat with `token`.
async fn heartbeat(base: &str, token: &str) -> u16 {
    let (s, _) = Api::new(base)
        .with_token(token)
        .post("/v1/groups/g/heartbeat", join("m-probe"))
        .await;
    s.as_u16()
}

/// A metric of the coordinator at `base`, scraped with the admin token.
async fn metric(base: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (s, body) = Api::new(base).with_token("t-ops").get("/metrics").await;
    assert_eq!(s.as_u16(), 200, "{body}");
    metric_sum(body.as_str().unwrap_or_default(), name, labels)
}

/// How long after `since` every coordinator of `bases` answers `want` to `token`.
async fn until_all(bases: &[String], token: &str, want: u16, since: Instant) -> Vec<Duration> {
    let mut took = vec![None; bases.len()];
    while took.iter().any(Option::is_none) {
        for (i, base) in bases.iter().enumerate() {
            if took[i].is_none() && heartbeat(base, token).await == want {
                took[i] = Some(since.elapsed());
            }
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{token} did not get {want} everywhere within 5 s: {took:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    took.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_edits_take_effect_on_two_replicas_without_a_restart() {
    let redis = RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().unwrap();
    let v1 = format!("{}{}", ops(), member("a"));
    let plain = dir.path().join("acl.toml");
    std::fs::write(&plain, &v1).unwrap();
    let mut projected = ProjectedDir::new(&dir.path().join("projected"), &v1);
    let prefix = rsc_e2e::unique_key_prefix();
    let url = redis.url();
    let start = |acl: String| {
        CoordinatorProcess::start(&[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--key-prefix",
            &prefix,
            "--acl",
            &acl,
        ])
        .expect("coordinator starts")
    };
    let one = start(plain.display().to_string());
    let two = start(projected.acl());
    let bases = vec![one.url(), two.url()];
    let (s, body) = Api::new(&bases[0])
        .with_token("t-ops")
        .post(
            "/v1/groups",
            json!({"group": "g", "stream": "s", "shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    for base in &bases {
        assert_eq!(heartbeat(base, "t-a").await, 200);
        assert_eq!(heartbeat(base, "t-b").await, 401);
    }

    // A token added.
    let v2 = format!("{}{}{}", ops(), member("a"), member("b"));
    let since = Instant::now();
    replace(&plain, &v2);
    projected.update(&v2);
    let added = until_all(&bases, "t-b", 200, since).await;

    // A token removed.
    let v3 = format!("{}{}", ops(), member("b"));
    let since = Instant::now();
    replace(&plain, &v3);
    projected.update(&v3);
    let removed = until_all(&bases, "t-a", 401, since).await;
    println!(
        "ACL reload: token added in effect after {added:?}, removed after {removed:?} (rename, ..data swap)"
    );
    for took in added.iter().chain(&removed) {
        assert!(*took < Duration::from_millis(2_500), "{took:?}");
    }
    for base in &bases {
        assert!(metric(base, "rsc_acl_reloads_total", &[]).await >= 2.0);
        assert_eq!(metric(base, "rsc_acl_reload_errors_total", &[]).await, 0.0);
        assert_eq!(
            heartbeat(base, "t-b").await,
            200,
            "the added token still works"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_file_that_does_not_parse_keeps_the_old_acl_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acl.toml");
    std::fs::write(&path, format!("{}{}", ops(), member("a"))).unwrap();
    let coordinator = serving(&path).await;
    let base = coordinator.url();

    replace(&path, "[[tokens]\nprincipal = \"broken");
    let since = Instant::now();
    while metric(&base, "rsc_acl_reload_errors_total", &[]).await < 1.0 {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "reload error not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        heartbeat(&base, "t-a").await,
        200,
        "the old ACL is still served"
    );
    assert_eq!(heartbeat(&base, "t-b").await, 401);
    let log = coordinator.log().join("\n");
    assert!(
        log.contains("ACL reload failed") && log.contains(&path.display().to_string()),
        "the log names the file: {log}"
    );

    // Fixed: read again at once, counted as a reload.
    replace(&path, &format!("{}{}", ops(), member("b")));
    until_all(std::slice::from_ref(&base), "t-b", 200, Instant::now()).await;
    assert_eq!(heartbeat(&base, "t-a").await, 401);
    let reloads = metric(&base, "rsc_acl_reloads_total", &[]).await;
    assert!(reloads >= 1.0);

    // SIGHUP re-reads the unchanged file.
    signal(coordinator.pid().unwrap(), Signal::SIGHUP).unwrap();
    let since = Instant::now();
    while metric(&base, "rsc_acl_reloads_total", &[]).await < reloads + 1.0 {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "SIGHUP did not reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        heartbeat(&base, "t-b").await,
        200,
        "and the process is still up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_past_its_not_after_is_refused_as_expired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acl.toml");
    let acl_with = |until: &str| {
        format!(
            "{}{}{}",
            ops(),
            entry(
                "old",
                "t-old",
                "roles = [\"member\"]\ngroups = [\"*\"]\nnot_after = 2020-01-01T00:00:00Z"
            ),
            entry(
                "new",
                "t-new",
                &format!("roles = [\"member\"]\ngroups = [\"*\"]\nnot_after = \"{until}\""),
            )
        )
    };
    std::fs::write(&path, acl_with("2099-01-01T02:00:00+02:00")).unwrap();
    let coordinator = serving(&path).await;
    let base = coordinator.url();

    let (s, body) = Api::new(&base)
        .with_token("t-old")
        .post("/v1/groups/g/heartbeat", join("m1"))
        .await;
    assert_eq!(
        (s.as_u16(), code(&body)),
        (401, "UNAUTHENTICATED"),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("credential expired") && message.contains("2020-01-01T00:00:00Z"),
        "{message}"
    );
    assert!(
        metric(
            &base,
            "rsc_auth_refusals_total",
            &[("reason", "credential_expired")]
        )
        .await
            >= 1.0
    );
    assert_eq!(
        heartbeat(&base, "t-new").await,
        200,
        "not_after ahead: accepted"
    );

    // Moved into the past by an edit: refused without a restart.
    replace(&path, &acl_with("2021-06-01T00:00:00Z"));
    until_all(std::slice::from_ref(&base), "t-new", 401, Instant::now()).await;
}
