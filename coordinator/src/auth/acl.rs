//! The ACL file (PROTOCOL §8) and token authentication.
//!
//! ```toml
//! [[tokens]]
//! principal = "ops"          # who, as written in the audit log
//! token_sha256 = "<hex>"     # or: token = "plain" (dev only),
//!                            # or: cert_subject = "CN=ops" (mutual TLS, a subject or SAN URI)
//! roles = ["admin"]          # admin | member | producer | viewer
//! groups = ["*"]             # glob scopes; a missing list grants nothing of that kind
//! streams = ["orders*"]
//! ```
//!
//! Every entry is kept as the SHA-256 digest of its token. A presented token is hashed and
//! compared with every entry's digest in constant time, without stopping at the first
//! match, so neither the comparison nor the position of the entry leaks through timing.
//! Tokens are never logged, and [`Principal`] does not carry one.

use super::glob::Glob;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// A role (PROTOCOL §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Everything.
    Admin,
    /// Heartbeat, leave, read its own group.
    Member,
    /// Routing reads.
    Producer,
    /// All reads and monitoring.
    Viewer,
}

impl Role {
    /// The role's name as written in the ACL file.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
            Role::Producer => "producer",
            Role::Viewer => "viewer",
        }
    }
}

/// How a principal proved who it is (PROTOCOL §8); the audit log records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Credential {
    /// A bearer token of the ACL (`token` or `token_sha256`).
    Token,
    /// A client certificate whose subject or SAN URI an entry's `cert_subject` names.
    CertSubject,
    /// None: the coordinator runs without an ACL.
    Anonymous,
}

impl Credential {
    /// The name written in the audit log.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Credential::Token => "token",
            Credential::CertSubject => "cert_subject",
            Credential::Anonymous => "anonymous",
        }
    }
}

/// Who made a request: an ACL entry, or `anonymous`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Principal(Arc<Grant>);

#[derive(Debug, PartialEq, Eq)]
struct Grant {
    name: String,
    credential: Credential,
    roles: Vec<Role>,
    groups: Vec<Glob>,
    streams: Vec<Glob>,
}

/// The principal name of requests without a valid token, and of every request when the
/// coordinator runs without an ACL.
pub(crate) const ANONYMOUS: &str = "anonymous";

impl Principal {
    /// The principal of a coordinator without an ACL: `anonymous`, every role, every scope.
    pub(crate) fn open() -> Self {
        Principal(Arc::new(Grant {
            name: ANONYMOUS.to_owned(),
            credential: Credential::Anonymous,
            roles: vec![Role::Admin],
            groups: vec![Glob::new("*")],
            streams: vec![Glob::new("*")],
        }))
    }

    /// The name written in the audit log.
    pub(crate) fn name(&self) -> &str {
        &self.0.name
    }

    /// How it was authenticated.
    pub(crate) fn credential(&self) -> Credential {
        self.0.credential
    }

    /// Whether the principal has `role`; `admin` has every role.
    pub(crate) fn has_role(&self, role: Role) -> bool {
        self.0.roles.iter().any(|&r| r == role || r == Role::Admin)
    }

    /// Whether any of `roles` is granted.
    pub(crate) fn has_any_role(&self, roles: &[Role]) -> bool {
        roles.iter().any(|&r| self.has_role(r))
    }

    /// Whether the group scope covers `group`.
    pub(crate) fn may_group(&self, group: &str) -> bool {
        self.0.groups.iter().any(|g| g.matches(group))
    }

    /// Whether the stream scope covers `stream`.
    pub(crate) fn may_stream(&self, stream: &str) -> bool {
        self.0.streams.iter().any(|g| g.matches(stream))
    }

    /// Whether both scopes cover every name (`*`).
    pub(crate) fn unrestricted(&self) -> bool {
        self.0.groups.iter().any(Glob::is_any) && self.0.streams.iter().any(Glob::is_any)
    }
}

/// Handlers take the principal the access middleware authenticated. Fails closed (403)
/// if the middleware did not run for the route.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Principal {
    type Rejection = crate::http_error::ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
            crate::http_error::ApiError::new(
                rsc_protocol::ErrorCode::Forbidden,
                "no authenticated principal for this route",
            )
        })
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Principal")
            .field("name", &self.0.name)
            .field("credential", &self.0.credential)
            .field("roles", &self.0.roles)
            .finish_non_exhaustive()
    }
}

/// A loaded ACL: token digests and certificate subjects, and the principals they
/// authenticate.
pub(crate) struct Acl {
    entries: Vec<([u8; 32], Principal)>,
    subjects: Vec<(String, Principal)>,
}

impl fmt::Debug for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Digests are not secrets in the usual sense, but keep them out of logs anyway.
        f.debug_struct("Acl")
            .field(
                "principals",
                &self
                    .entries
                    .iter()
                    .map(|(_, p)| p.name())
                    .chain(self.subjects.iter().map(|(_, p)| p.name()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why an ACL file was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AclError {
    /// The file could not be read.
    #[error("cannot read ACL file {path}: {cause}")]
    Read {
        /// File.
        path: String,
        /// Cause.
        cause: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("ACL file is invalid: {0}")]
    Parse(String),
    /// An entry is inconsistent.
    #[error("ACL entry {index} ({principal:?}): {reason}")]
    Entry {
        /// 0-based position in `[[tokens]]`.
        index: usize,
        /// Its principal.
        principal: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AclFile {
    #[serde(default)]
    tokens: Vec<EntryFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    principal: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_sha256: Option<String>,
    #[serde(default)]
    cert_subject: Option<String>,
    roles: Vec<Role>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    streams: Vec<String>,
}

/// SHA-256 of a token, lower-case hex (what `token_sha256` holds).
#[cfg(test)]
pub(crate) fn token_sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What an entry authenticates with.
enum EntryCredential {
    /// SHA-256 of its token.
    Digest([u8; 32]),
    /// A certificate subject or SAN URI.
    Subject(String),
}

/// The one credential of an entry: `token`, `token_sha256` or `cert_subject`.
fn credential_of(e: &EntryFile) -> Result<EntryCredential, &'static str> {
    const ONE: &str = "give exactly one of token, token_sha256 and cert_subject";
    Ok(match (&e.token, &e.token_sha256, &e.cert_subject) {
        (Some(t), None, None) if !t.is_empty() => {
            EntryCredential::Digest(Sha256::digest(t.as_bytes()).into())
        }
        (None, Some(h), None) => EntryCredential::Digest(
            parse_hex32(h).ok_or("token_sha256 must be 64 hexadecimal characters")?,
        ),
        (None, None, Some(s)) if !s.trim().is_empty() => {
            EntryCredential::Subject(s.trim().to_owned())
        }
        (None, None, Some(_)) => return Err("cert_subject must not be empty"),
        (None, None, None) | (Some(_), None, None) => {
            return Err("token, token_sha256 or cert_subject is required");
        }
        _ => return Err(ONE),
    })
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Acl {
    /// Reads and checks an ACL file.
    pub(crate) fn load(path: &Path) -> Result<Self, AclError> {
        let text = std::fs::read_to_string(path).map_err(|cause| AclError::Read {
            path: path.display().to_string(),
            cause,
        })?;
        Self::from_toml(&text)
    }

    /// Parses and checks ACL text.
    pub(crate) fn from_toml(text: &str) -> Result<Self, AclError> {
        let file: AclFile = toml::from_str(text).map_err(|e| AclError::Parse(e.to_string()))?;
        let mut acl = Acl {
            entries: Vec::with_capacity(file.tokens.len()),
            subjects: Vec::new(),
        };
        for (index, e) in file.tokens.into_iter().enumerate() {
            let bad = |reason: &str| AclError::Entry {
                index,
                principal: e.principal.clone(),
                reason: reason.to_owned(),
            };
            if e.principal.trim().is_empty() {
                return Err(bad("principal must not be empty"));
            }
            if e.roles.is_empty() {
                return Err(bad("roles must name at least one role"));
            }
            let grant = |credential| {
                Principal(Arc::new(Grant {
                    name: e.principal.clone(),
                    credential,
                    roles: e.roles.clone(),
                    groups: e.groups.iter().map(|g| Glob::new(g)).collect(),
                    streams: e.streams.iter().map(|s| Glob::new(s)).collect(),
                }))
            };
            match credential_of(&e).map_err(&bad)? {
                EntryCredential::Digest(digest) => {
                    if acl.entries.iter().any(|(d, _)| d == &digest) {
                        return Err(bad("the same token appears in another entry"));
                    }
                    acl.entries.push((digest, grant(Credential::Token)));
                }
                EntryCredential::Subject(subject) => {
                    if acl.subjects.iter().any(|(s, _)| *s == subject) {
                        return Err(bad("the same cert_subject appears in another entry"));
                    }
                    acl.subjects.push((subject, grant(Credential::CertSubject)));
                }
            }
        }
        Ok(acl)
    }

    /// The principal of a client certificate whose subject or SAN URI an entry's
    /// `cert_subject` names (the first such entry in file order).
    pub(crate) fn authenticate_certificate(
        &self,
        cert: &crate::tls::ClientCertificate,
    ) -> Option<Principal> {
        self.subjects
            .iter()
            .find(|(s, _)| cert.matches(s))
            .map(|(_, p)| p.clone())
    }

    /// How many entries (tokens and certificate subjects) the ACL holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() + self.subjects.len()
    }

    /// The principal `token` authenticates, if any. Constant time in the token's content
    /// and in which entry matches.
    pub(crate) fn authenticate(&self, token: &str) -> Option<Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<&Principal> = None;
        for (d, p) in &self.entries {
            let eq: bool = d.ct_eq(&digest).into();
            // Digests are unique, so at most one entry matches; keep scanning regardless.
            if eq {
                found = Some(p);
            }
        }
        found.cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: &str = r#"
[[tokens]]
principal = "ops"
token = "ops-token"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[tokens]]
principal = "billing-pods"
token_sha256 = "HASH"
roles = ["member"]
groups = ["billing*"]

[[tokens]]
principal = "shop"
token = "shop-token"
roles = ["producer", "viewer"]
streams = ["orders*"]
"#;

    fn acl() -> Acl {
        Acl::from_toml(&ACL.replace("HASH", &token_sha256_hex("pod-token"))).unwrap()
    }

    #[test]
    fn tokens_authenticate_their_principal() {
        let acl = acl();
        assert_eq!(acl.len(), 3);
        assert_eq!(acl.authenticate("ops-token").unwrap().name(), "ops");
        let pods = acl.authenticate("pod-token").unwrap();
        assert_eq!(pods.name(), "billing-pods");
        assert!(pods.has_role(Role::Member) && !pods.has_role(Role::Viewer));
        assert!(pods.may_group("billing-eu") && !pods.may_group("shipping"));
        assert!(!pods.may_stream("orders"), "a missing list grants nothing");
        assert!(acl.authenticate("nope").is_none());
        assert!(acl.authenticate("").is_none());
        let ops = acl.authenticate("ops-token").unwrap();
        assert!(ops.has_role(Role::Viewer), "admin has every role");
        assert!(ops.unrestricted());
        assert!(!format!("{acl:?}{ops:?}").contains("token"));
    }

    #[test]
    fn certificate_subjects_authenticate_their_principal() {
        use crate::tls::ClientCertificate;
        let acl = Acl::from_toml(
            "[[tokens]]\nprincipal = \"billing\"\ncert_subject = \"CN=billing-consumer\"\n\
             roles = [\"member\"]\ngroups = [\"billing*\"]\n\
             [[tokens]]\nprincipal = \"spiffe-pod\"\ncert_subject = \"spiffe://prod/ns/a\"\n\
             roles = [\"viewer\"]\n\
             [[tokens]]\nprincipal = \"ops\"\ntoken = \"ops-token\"\nroles = [\"admin\"]",
        )
        .unwrap();
        assert_eq!(acl.len(), 3);
        let cert = |subject: &str, uris: &[&str]| ClientCertificate {
            subject: subject.into(),
            uris: uris.iter().map(|u| (*u).to_owned()).collect(),
        };
        let p = acl
            .authenticate_certificate(&cert("CN=billing-consumer", &[]))
            .unwrap();
        assert_eq!(
            (p.name(), p.credential()),
            ("billing", Credential::CertSubject)
        );
        assert!(p.has_role(Role::Member) && p.may_group("billing-eu"));
        let p = acl
            .authenticate_certificate(&cert("CN=x", &["spiffe://prod/ns/a"]))
            .unwrap();
        assert_eq!(p.name(), "spiffe-pod");
        assert!(
            acl.authenticate_certificate(&cert("CN=other", &[]))
                .is_none()
        );
        assert_eq!(
            acl.authenticate("ops-token").unwrap().credential(),
            Credential::Token
        );
        // A subject is not a token.
        assert!(acl.authenticate("CN=billing-consumer").is_none());
    }

    #[test]
    fn bad_entries_are_refused() {
        let cases = [
            (
                "[[tokens]]\nprincipal = \"a\"\nroles = [\"admin\"]",
                "required",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\ntoken_sha256 = \"00\"\nroles = [\"admin\"]",
                "exactly one of",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken_sha256 = \"xyz\"\nroles = [\"admin\"]",
                "64 hexadecimal",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\nroles = []",
                "at least one role",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\nroles = [\"root\"]",
                "unknown variant",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\nroles = [\"admin\"]\ngroup = [\"*\"]",
                "unknown field",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\nroles = [\"admin\"]\n[[tokens]]\nprincipal = \"b\"\ntoken = \"t\"\nroles = [\"viewer\"]",
                "another entry",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\ncert_subject = \"CN=a\"\nroles = [\"admin\"]",
                "exactly one of",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_subject = \" \"\nroles = [\"admin\"]",
                "must not be empty",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_subject = \"CN=a\"\nroles = [\"admin\"]\n[[tokens]]\nprincipal = \"b\"\ncert_subject = \"CN=a\"\nroles = [\"viewer\"]",
                "another entry",
            ),
        ];
        for (text, want) in cases {
            let err = Acl::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
