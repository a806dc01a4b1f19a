//! Shared by the security and observability e2e tests: a coordinator started with an ACL.

#![allow(dead_code)]

use rsc_e2e::Api;
use rsc_testkit::CoordinatorProcess;
use std::io::Write;

/// Tokens of the test ACL, by principal name: `(principal, token, toml lines)`.
pub(crate) const PRINCIPALS: &[(&str, &str, &str)] = &[
    (
        "admin",
        "t-admin",
        "roles = [\"admin\"]\ngroups = [\"*\"]\nstreams = [\"*\"]",
    ),
    (
        "member",
        "t-member",
        "roles = [\"member\"]\ngroups = [\"g*\"]",
    ),
    (
        "producer",
        "t-producer",
        "roles = [\"producer\"]\nstreams = [\"s*\"]",
    ),
    (
        "viewer",
        "t-viewer",
        "roles = [\"viewer\"]\ngroups = [\"*\"]\nstreams = [\"*\"]",
    ),
    (
        "admin-elsewhere",
        "t-admin-elsewhere",
        "roles = [\"admin\"]\ngroups = [\"x*\"]\nstreams = [\"x*\"]",
    ),
    (
        "member-elsewhere",
        "t-member-elsewhere",
        "roles = [\"member\"]\ngroups = [\"x*\"]",
    ),
    (
        "producer-elsewhere",
        "t-producer-elsewhere",
        "roles = [\"producer\"]\nstreams = [\"x*\"]",
    ),
    (
        "viewer-g1",
        "t-viewer-g1",
        "roles = [\"viewer\"]\ngroups = [\"g1\"]",
    ),
    (
        "admin2",
        "t-admin2",
        "roles = [\"admin\"]\ngroups = [\"*\"]\nstreams = [\"*\"]",
    ),
];

/// A coordinator with the test ACL, and the ACL file kept alive beside it.
pub(crate) struct Secured {
    pub(crate) coordinator: CoordinatorProcess,
    pub(crate) url: String,
    _acl: tempfile::NamedTempFile,
}

impl Secured {
    /// Starts a memory-store coordinator with the test ACL and extra `serve` flags.
    pub(crate) fn start(extra: &[&str]) -> Self {
        Self::start_with_store(&["--store", "memory"], extra)
    }

    /// Starts a coordinator on the store `store` names (`--store …` flags) with the test ACL
    /// and extra `serve` flags.
    pub(crate) fn start_with_store(store: &[&str], extra: &[&str]) -> Self {
        let mut acl = tempfile::NamedTempFile::new().expect("temp file");
        for (name, token, rest) in PRINCIPALS {
            // One entry by its hash, the others in plain text: both forms are exercised.
            let secret = if *name == "viewer" {
                format!("token_sha256 = \"{}\"", rsc_coordinator_sha256_hex(token))
            } else {
                format!("token = \"{token}\"")
            };
            writeln!(
                acl,
                "[[tokens]]\nprincipal = \"{name}\"\n{secret}\n{rest}\n"
            )
            .unwrap();
        }
        acl.flush().unwrap();
        let path = acl.path().to_str().unwrap().to_owned();
        let mut args = store.to_vec();
        args.extend_from_slice(&["--sweep-interval-ms", "20", "--acl", &path]);
        args.extend_from_slice(extra);
        let coordinator = CoordinatorProcess::start(&args).expect("coordinator starts");
        let url = coordinator.url();
        Secured {
            coordinator,
            url,
            _acl: acl,
        }
    }

    /// A client with `principal`'s token (`none`: no token; `bad`: an unknown one).
    pub(crate) fn api(&self, principal: &str) -> Api {
        let api = Api::new(self.url.clone());
        match principal {
            "none" => api,
            "bad" => api.with_token("not-a-token"),
            p => api.with_token(token_of(p)),
        }
    }
}

/// The token of a test principal.
pub(crate) fn token_of(principal: &str) -> &'static str {
    PRINCIPALS
        .iter()
        .find(|(n, _, _)| *n == principal)
        .map(|(_, t, _)| *t)
        .unwrap_or_else(|| panic!("no principal {principal}"))
}

/// SHA-256 in lower-case hex, computed with `sha256sum` so the test does not share the
/// coordinator's code.
fn rsc_coordinator_sha256_hex(token: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(token.as_bytes())?;
            c.wait_with_output()
        })
        .expect("sha256sum runs");
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}
