//! The ACL file (PROTOCOL §8, §20) and authentication by token, certificate subject or JWT.
//!
//! ```toml
//! jwt_leeway_s = 30          # clock skew allowed on a JWT's exp and nbf (default 30)
//!
//! [[tokens]]
//! principal = "ops"          # who, as written in the audit log
//! token_sha256 = "<hex>"     # or: token = "plain" (dev only),
//!                            # or: cert_subject = "CN=ops" (mutual TLS, a subject or SAN URI)
//! roles = ["admin"]          # admin | member | producer | viewer
//! groups = ["*"]             # glob scopes; a missing list grants nothing of that kind
//! streams = ["orders*"]
//! not_after = 2027-01-31T00:00:00Z   # optional: the entry stops authenticating then
//!
//! [[jwt]]                    # signed JWTs, e.g. Kubernetes service-account tokens
//! issuer = "https://kubernetes.default.svc.cluster.local"
//! audience = "rsc-coordinator"
//! jwks_file = "jwks.json"    # relative to the ACL file's directory
//! subject = "system:serviceaccount:billing:*"   # glob; the principal is the token's sub
//! roles = ["member"]
//! groups = ["billing*"]
//! ```
//!
//! Every token entry is kept as the SHA-256 digest of its token. A presented token is hashed
//! and compared with every entry's digest in constant time, without stopping at the first
//! match, so neither the comparison nor the position of the entry leaks through timing.
//! A token no entry holds is verified as a JWT when it has a JWT's shape ([`super::jwt`]).
//! Tokens are never logged, and [`Principal`] does not carry one.

use super::glob::Glob;
use super::jwt::{self, Jwks, JwtRule};
use super::refusal::{Refusal, days_from_civil, rfc3339};
use crate::watch::Stamp;
use rsc_protocol::redact::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The default clock skew allowed on a JWT's `exp` and `nbf`, in seconds.
const DEFAULT_JWT_LEEWAY_S: u64 = 30;

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
    /// A signed JWT a `[[jwt]]` entry accepts.
    Jwt,
    /// None: the coordinator runs without an ACL.
    Anonymous,
}

impl Credential {
    /// The name written in the audit log.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Credential::Token => "token",
            Credential::CertSubject => "cert_subject",
            Credential::Jwt => "jwt",
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

/// One `[[tokens]]` entry: what it authenticates with, whom, and until when.
struct Entry<K> {
    key: K,
    principal: Principal,
    not_after: Option<i64>,
}

/// One `[[jwt]]` entry: what it accepts, what it grants (the principal is named by the
/// token's `sub`), and until when.
struct JwtEntry {
    rule: JwtRule,
    roles: Vec<Role>,
    groups: Vec<Glob>,
    streams: Vec<Glob>,
    not_after: Option<i64>,
}

/// A loaded ACL: token digests, certificate subjects and JWT entries, and the principals
/// they authenticate.
pub(crate) struct Acl {
    entries: Vec<Entry<[u8; 32]>>,
    subjects: Vec<Entry<String>>,
    jwt: Vec<JwtEntry>,
    leeway: i64,
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
                    .map(|e| e.principal.name())
                    .chain(self.subjects.iter().map(|e| e.principal.name()))
                    .collect::<Vec<_>>(),
            )
            .field("jwt_entries", &self.jwt.len())
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
    #[error("ACL file {path} is invalid: {reason}")]
    Parse {
        /// File (`-` for text not read from a file).
        path: String,
        /// What is wrong.
        reason: String,
    },
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
    /// A `[[jwt]]` entry is inconsistent, or its JWKS file cannot be used.
    #[error("ACL [[jwt]] entry {index} (issuer {issuer:?}): {reason}")]
    Jwt {
        /// 0-based position in `[[jwt]]`.
        index: usize,
        /// Its issuer.
        issuer: String,
        /// What is wrong (a JWKS file's problem names the file).
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AclFile {
    #[serde(default)]
    tokens: Vec<EntryFile>,
    #[serde(default)]
    jwt: Vec<JwtFile>,
    #[serde(default)]
    jwt_leeway_s: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JwtFile {
    issuer: String,
    audience: String,
    #[serde(default)]
    jwks_file: Option<PathBuf>,
    #[serde(default)]
    jwks_url: Option<String>,
    subject: String,
    roles: Vec<Role>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    streams: Vec<String>,
    #[serde(default)]
    not_after: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    principal: String,
    #[serde(default)]
    token: Option<SecretString>,
    #[serde(default)]
    token_sha256: Option<String>,
    #[serde(default)]
    cert_subject: Option<String>,
    roles: Vec<Role>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    streams: Vec<String>,
    #[serde(default)]
    not_after: Option<toml::Value>,
}

/// `not_after` as Unix seconds: a TOML offset date-time (`2027-01-31T00:00:00Z`) or a string
/// holding an RFC 3339 timestamp.
fn not_after_of(v: &Option<toml::Value>) -> Result<Option<i64>, &'static str> {
    const NEED: &str = "not_after must be an RFC 3339 timestamp with a time and an offset, \
                        e.g. 2027-01-31T00:00:00Z";
    let dt = match v {
        None => return Ok(None),
        Some(toml::Value::Datetime(d)) => *d,
        Some(toml::Value::String(s)) => s.parse::<toml::value::Datetime>().map_err(|_| NEED)?,
        Some(_) => return Err(NEED),
    };
    let (Some(date), Some(time), Some(offset)) = (dt.date, dt.time, dt.offset) else {
        return Err(NEED);
    };
    let offset_s = match offset {
        toml::value::Offset::Z => 0,
        toml::value::Offset::Custom { minutes } => i64::from(minutes) * 60,
    };
    let days = days_from_civil(i64::from(date.year), date.month.into(), date.day.into());
    let secs = i64::from(time.hour) * 3600 + i64::from(time.minute) * 60 + i64::from(time.second);
    Ok(Some(days * 86_400 + secs - offset_s))
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
        (Some(t), None, None) if !t.expose_secret().is_empty() => {
            EntryCredential::Digest(Sha256::digest(t.expose_secret().as_bytes()).into())
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
    /// Reads and checks an ACL file and the JWKS files it names (relative paths are taken
    /// from the ACL file's directory).
    pub(crate) fn load(path: &Path) -> Result<Self, AclError> {
        let text = std::fs::read_to_string(path).map_err(|cause| AclError::Read {
            path: path.display().to_string(),
            cause,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir).map_err(|e| match e {
            AclError::Parse { reason, .. } => AclError::Parse {
                path: path.display().to_string(),
                reason,
            },
            e => e,
        })
    }

    /// Parses and checks ACL text; relative JWKS paths are taken from `dir`.
    pub(crate) fn parse(text: &str, dir: &Path) -> Result<Self, AclError> {
        let file: AclFile = toml::from_str(text).map_err(|e| AclError::Parse {
            path: "-".into(),
            // Where and what, without the line, which may hold a token (PROTOCOL §12).
            reason: crate::config::toml_error(text, &e),
        })?;
        let leeway = file.jwt_leeway_s.unwrap_or(DEFAULT_JWT_LEEWAY_S).min(3600) as i64;
        let mut acl = Acl {
            entries: Vec::with_capacity(file.tokens.len()),
            subjects: Vec::new(),
            jwt: Vec::with_capacity(file.jwt.len()),
            leeway,
        };
        for (index, e) in file.tokens.into_iter().enumerate() {
            acl.add_entry(index, e)?;
        }
        let mut jwks: HashMap<PathBuf, Arc<Jwks>> = HashMap::new();
        for (index, e) in file.jwt.into_iter().enumerate() {
            let bad = |reason: String| AclError::Jwt {
                index,
                issuer: e.issuer.clone(),
                reason,
            };
            let entry = jwt_entry(&e, dir, &mut jwks).map_err(bad)?;
            acl.jwt.push(entry);
        }
        Ok(acl)
    }

    /// Parses ACL text without JWKS files of relative paths to resolve (unit tests).
    #[cfg(test)]
    pub(crate) fn from_toml(text: &str) -> Result<Self, AclError> {
        Self::parse(text, Path::new("."))
    }

    /// Checks and adds one `[[tokens]]` entry.
    fn add_entry(&mut self, index: usize, e: EntryFile) -> Result<(), AclError> {
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
        let not_after = not_after_of(&e.not_after).map_err(&bad)?;
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
            EntryCredential::Digest(key) => {
                if self.entries.iter().any(|x| x.key == key) {
                    return Err(bad("the same token appears in another entry"));
                }
                let principal = grant(Credential::Token);
                self.entries.push(Entry {
                    key,
                    principal,
                    not_after,
                });
            }
            EntryCredential::Subject(key) => {
                if self.subjects.iter().any(|x| x.key == key) {
                    return Err(bad("the same cert_subject appears in another entry"));
                }
                let principal = grant(Credential::CertSubject);
                self.subjects.push(Entry {
                    key,
                    principal,
                    not_after,
                });
            }
        }
        Ok(())
    }

    /// The JWKS files the ACL read, each with its stamp from before it was read.
    pub(crate) fn jwks_files(&self) -> Vec<(PathBuf, Stamp)> {
        let mut out: Vec<(PathBuf, Stamp)> = Vec::new();
        for e in &self.jwt {
            let (path, stamp) = e.rule.jwks.file();
            if !out.iter().any(|(p, _)| p == path) {
                out.push((path.to_owned(), stamp));
            }
        }
        out
    }

    /// The principal of a client certificate whose subject or SAN URI an entry's
    /// `cert_subject` names (the first such entry in file order whose `not_after` has not
    /// passed at `now`, Unix seconds).
    pub(crate) fn authenticate_certificate(
        &self,
        cert: &crate::tls::ClientCertificate,
        now: i64,
    ) -> Result<Principal, Refusal> {
        let named: Vec<&Entry<String>> = self
            .subjects
            .iter()
            .filter(|e| cert.matches(&e.key))
            .collect();
        if let Some(e) = named.iter().find(|e| valid_at(e.not_after, now)) {
            return Ok(e.principal.clone());
        }
        match named.first() {
            Some(e) => Err(expired(&principal_of(e), e.not_after)),
            None => Err(Refusal::new(
                "unknown_certificate",
                format!(
                    "no ACL entry names the client certificate (subject {:?}) in its \
                     cert_subject; send a bearer token or use a certificate the ACL names",
                    cert.subject
                ),
            )),
        }
    }

    /// How many entries (tokens, certificate subjects and JWT entries) the ACL holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() + self.subjects.len() + self.jwt.len()
    }

    /// The principal `token` authenticates at `now` (Unix seconds): a token entry's
    /// (constant time in the token's content and in which entry matches), else, for a token
    /// of a JWT's shape, the `[[jwt]]` entry's that accepts it; or why not.
    pub(crate) fn authenticate(&self, token: &str, now: i64) -> Result<Principal, Refusal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<&Entry<[u8; 32]>> = None;
        for e in &self.entries {
            let eq: bool = e.key.ct_eq(&digest).into();
            // Digests are unique, so at most one entry matches; keep scanning regardless.
            if eq {
                found = Some(e);
            }
        }
        match found {
            Some(e) if valid_at(e.not_after, now) => Ok(e.principal.clone()),
            Some(e) => Err(expired(&principal_of(e), e.not_after)),
            None if jwt::looks_like_jwt(token) => self.authenticate_jwt(token, now),
            None => Err(Refusal::new("unknown_token", "unknown token")),
        }
    }

    /// A JWT's principal: its `sub`, with the grant of the first `[[jwt]]` entry that
    /// accepts it and whose `not_after` has not passed.
    fn authenticate_jwt(&self, token: &str, now: i64) -> Result<Principal, Refusal> {
        let rules: Vec<&JwtRule> = self.jwt.iter().map(|e| &e.rule).collect();
        let (sub, matching) = jwt::verify(token, &rules, self.leeway, now)?;
        let entries: Vec<&JwtEntry> = matching.iter().map(|&i| &self.jwt[i]).collect();
        let Some(e) = entries.iter().find(|e| valid_at(e.not_after, now)) else {
            let what = format!("subject {sub:?} ([[jwt]])");
            return Err(expired(&what, entries[0].not_after));
        };
        Ok(Principal(Arc::new(Grant {
            name: sub,
            credential: Credential::Jwt,
            roles: e.roles.clone(),
            groups: e.groups.clone(),
            streams: e.streams.clone(),
        })))
    }
}

/// Whether an entry with `not_after` still authenticates at `now`.
fn valid_at(not_after: Option<i64>, now: i64) -> bool {
    not_after.is_none_or(|t| now <= t)
}

/// `principal "NAME"`, for messages.
fn principal_of<K>(e: &Entry<K>) -> String {
    format!("principal {:?}", e.principal.name())
}

/// `401`: the entry of `who` authenticated the credential until its `not_after`.
fn expired(who: &str, not_after: Option<i64>) -> Refusal {
    let at = not_after.map_or_else(|| "-".to_owned(), rfc3339);
    Refusal::new(
        "credential_expired",
        format!("credential expired: the ACL entry for {who} was valid until {at} (not_after)"),
    )
}

/// Checks one `[[jwt]]` entry and loads its JWKS file (once per file: `jwks` caches them).
fn jwt_entry(
    e: &JwtFile,
    dir: &Path,
    jwks: &mut HashMap<PathBuf, Arc<Jwks>>,
) -> Result<JwtEntry, String> {
    if e.issuer.trim().is_empty() || e.audience.trim().is_empty() {
        return Err("issuer and audience must not be empty".into());
    }
    if e.subject.trim().is_empty() {
        return Err("subject must not be empty (\"*\" accepts every subject)".into());
    }
    if e.roles.is_empty() {
        return Err("roles must name at least one role".into());
    }
    let file = match (&e.jwks_file, &e.jwks_url) {
        (_, Some(_)) => {
            return Err(
                "jwks_url is not supported: write the JWKS to a file and name it in \
                        jwks_file (it is re-read when it changes)"
                    .into(),
            );
        }
        (None, None) => return Err("jwks_file is required".into()),
        (Some(f), None) => dir.join(f),
    };
    let not_after = not_after_of(&e.not_after).map_err(str::to_owned)?;
    let keys = match jwks.get(&file) {
        Some(k) => k.clone(),
        None => {
            let k = Arc::new(Jwks::load(&file)?);
            jwks.insert(file, k.clone());
            k
        }
    };
    Ok(JwtEntry {
        rule: JwtRule {
            issuer: e.issuer.clone(),
            audience: e.audience.clone(),
            subject: Glob::new(&e.subject),
            jwks: keys,
        },
        roles: e.roles.clone(),
        groups: e.groups.iter().map(|g| Glob::new(g)).collect(),
        streams: e.streams.iter().map(|s| Glob::new(s)).collect(),
        not_after,
    })
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
        assert_eq!(acl.authenticate("ops-token", 0).unwrap().name(), "ops");
        let pods = acl.authenticate("pod-token", 0).unwrap();
        assert_eq!(pods.name(), "billing-pods");
        assert!(pods.has_role(Role::Member) && !pods.has_role(Role::Viewer));
        assert!(pods.may_group("billing-eu") && !pods.may_group("shipping"));
        assert!(!pods.may_stream("orders"), "a missing list grants nothing");
        assert!(acl.authenticate("nope", 0).is_err());
        assert!(acl.authenticate("", 0).is_err());
        let ops = acl.authenticate("ops-token", 0).unwrap();
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
            .authenticate_certificate(&cert("CN=billing-consumer", &[]), 0)
            .unwrap();
        assert_eq!(
            (p.name(), p.credential()),
            ("billing", Credential::CertSubject)
        );
        assert!(p.has_role(Role::Member) && p.may_group("billing-eu"));
        let p = acl
            .authenticate_certificate(&cert("CN=x", &["spiffe://prod/ns/a"]), 0)
            .unwrap();
        assert_eq!(p.name(), "spiffe-pod");
        assert!(
            acl.authenticate_certificate(&cert("CN=other", &[]), 0)
                .is_err()
        );
        assert_eq!(
            acl.authenticate("ops-token", 0).unwrap().credential(),
            Credential::Token
        );
        // A subject is not a token.
        assert!(acl.authenticate("CN=billing-consumer", 0).is_err());
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

    #[test]
    fn not_after_ends_an_entry() {
        let acl = Acl::from_toml(
            "[[tokens]]\nprincipal = \"old\"\ntoken = \"t-old\"\nroles = [\"viewer\"]\n\
             not_after = 2026-12-03T07:30:00Z\n\
             [[tokens]]\nprincipal = \"cet\"\ntoken = \"t-cet\"\nroles = [\"viewer\"]\n\
             not_after = \"2026-12-03T08:30:00+01:00\"\n",
        )
        .unwrap();
        let at = 1_796_283_000; // 2026-12-03T07:30:00Z
        assert!(
            acl.authenticate("t-old", at).is_ok(),
            "valid up to and at not_after"
        );
        let r = acl.authenticate("t-old", at + 1).unwrap_err();
        assert_eq!(r.reason, "credential_expired");
        assert!(
            r.message
                .contains("principal \"old\" was valid until 2026-12-03T07:30:00Z"),
            "{}",
            r.message
        );
        assert!(acl.authenticate("t-cet", at).is_ok());
        assert!(
            acl.authenticate("t-cet", at + 1).is_err(),
            "the offset is applied"
        );
        for bad in [
            "not_after = 2026-12-03",
            "not_after = \"tomorrow\"",
            "not_after = 5",
        ] {
            let text = format!(
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\nroles = [\"viewer\"]\n{bad}"
            );
            let e = Acl::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains("RFC 3339"), "{bad}: {e}");
        }
    }

    #[test]
    fn jwt_entries_read_their_jwks_and_grant_the_subject() {
        use super::super::jwt::test_keys::{KEY, KEY_X, sign};
        use jsonwebtoken::Algorithm;
        let dir = std::env::temp_dir().join(format!("rsc-acl-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let jwks = format!(
            "{{\"keys\": [{{\"kty\": \"OKP\", \"crv\": \"Ed25519\", \"kid\": \"k1\", \"x\": \"{KEY_X}\"}},\
             {{\"kty\": \"oct\", \"k\": \"c2VjcmV0\"}}]}}"
        );
        std::fs::write(dir.join("jwks.json"), jwks).unwrap();
        let entry = |subject: &str, extra: &str| {
            format!(
                "[[jwt]]\nissuer = \"https://k8s\"\naudience = \"rsc\"\njwks_file = \"jwks.json\"\n\
                 subject = \"{subject}\"\nroles = [\"member\"]\ngroups = [\"billing*\"]\n{extra}\n"
            )
        };
        let text = format!(
            "jwt_leeway_s = 5\n{}{}",
            entry(
                "system:serviceaccount:billing:*",
                "not_after = 2020-01-01T00:00:00Z"
            ),
            entry("system:serviceaccount:billing:a*", "")
        );
        let acl = Acl::parse(&text, &dir).unwrap();
        assert_eq!(acl.len(), 2);
        assert_eq!(acl.jwks_files().len(), 1, "one file, read once");
        let now = 1_796_283_000;
        let token = |sub: &str| {
            let claims = serde_json::json!({"iss": "https://k8s", "aud": "rsc", "sub": sub,
                "exp": now + 60});
            sign(KEY, Some("k1"), Algorithm::EdDSA, claims)
        };
        // The first entry is past its not_after: the second one grants.
        let p = acl
            .authenticate(&token("system:serviceaccount:billing:api"), now)
            .unwrap();
        assert_eq!(p.name(), "system:serviceaccount:billing:api");
        assert_eq!(p.credential(), Credential::Jwt);
        assert!(p.has_role(Role::Member) && p.may_group("billing-eu") && !p.may_group("shop"));
        let r = acl
            .authenticate(&token("system:serviceaccount:billing:web"), now)
            .unwrap_err();
        assert_eq!(r.reason, "credential_expired", "{}", r.message);
        // A JWT-shaped token that is no JWT, and a plain unknown token.
        assert_eq!(
            acl.authenticate("abc.def.ghi", now).unwrap_err().reason,
            "jwt_malformed"
        );
        assert_eq!(
            acl.authenticate("nope", now).unwrap_err().reason,
            "unknown_token"
        );

        let bad = [
            (
                entry("*", "").replace("jwks.json", "missing.json"),
                "missing.json",
            ),
            (
                entry("*", "jwks_url = \"https://k8s/openid/v1/jwks\""),
                "jwks_url is not supported",
            ),
            (entry("", ""), "subject must not be empty"),
            (
                entry("*", "").replace("roles = [\"member\"]", "roles = []"),
                "at least one role",
            ),
        ];
        for (text, want) in bad {
            let e = Acl::parse(&text, &dir).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("[[jwt]] entry 0"),
                "{want}: {e}"
            );
        }
        std::fs::write(dir.join("empty.json"), "{\"keys\": []}").unwrap();
        let e = Acl::parse(&entry("*", "").replace("jwks.json", "empty.json"), &dir)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("empty.json") && e.contains("no usable public key"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
