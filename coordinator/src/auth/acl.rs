//! The ACL file (PROTOCOL §8, §20) and authentication by token, client certificate (its
//! subject, a SAN URI or a SAN DNS name) or JWT.
//!
//! ```toml
//! jwt_leeway_s = 30          # clock skew allowed on a JWT's exp and nbf (default 30)
//!
//! [[tokens]]
//! principal = "ops"          # who, as written in the audit log
//! token_sha256 = "<hex>"     # or: token = "plain" (dev only),
//!                            # or, over mutual TLS, one of: cert_subject = "CN=ops" (the
//!                            # subject DN only), cert_san_uri = "spiffe://prod/ns/ops/sa/x"
//!                            # (a SAN URI only), cert_san_dns = "ops.prod.example" (a SAN
//!                            # DNS name only)
//! roles = ["admin"]          # admin | member | producer | viewer
//! groups = ["*"]             # glob scopes; a missing list grants nothing of that kind
//! streams = ["orders*"]
//! members = ["billing-*"]    # optional: the member ids its member routes may name
//! not_after = 2027-01-31T00:00:00Z   # optional: the entry stops authenticating then
//!
//! [[jwt]]                    # signed JWTs, e.g. Kubernetes service-account tokens
//! issuer = "https://kubernetes.default.svc.cluster.local"
//! audience = "rsc-coordinator"
//! jwks_file = "jwks.json"    # relative to the ACL file's directory
//! subject = "system:serviceaccount:billing:*"   # glob; the principal is the token's sub
//! max_token_age = 3600       # optional: refuse tokens living longer (exp - iat, in s)
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
    /// A client certificate whose subject an entry's `cert_subject` names.
    CertSubject,
    /// A client certificate with a SAN URI an entry's `cert_san_uri` names.
    CertSanUri,
    /// A client certificate with a SAN DNS name an entry's `cert_san_dns` names.
    CertSanDns,
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
            Credential::CertSanUri => "cert_san_uri",
            Credential::CertSanDns => "cert_san_dns",
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
    /// The member ids the member routes may name (`members`); `None`: any.
    members: Option<Vec<Glob>>,
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
            members: None,
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

    /// Whether the principal may act as member `member_id` on the member routes (heartbeat,
    /// leave, wake-up channel): its entry's `members` globs cover it, or it has none
    /// (PROTOCOL §8).
    pub(crate) fn may_member(&self, member_id: &str) -> bool {
        self.0
            .members
            .as_ref()
            .is_none_or(|globs| globs.iter().any(|g| g.matches(member_id)))
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

/// Which name of a client certificate an entry compares, and the name: three separate
/// namespaces (PROTOCOL §20) — a SAN URI never satisfies `cert_subject`, nor the subject a
/// `cert_san_uri`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CertName {
    /// `cert_subject`: the subject DN, as an RFC 4514 string.
    Subject(String),
    /// `cert_san_uri`: one of the SAN URIs.
    SanUri(String),
    /// `cert_san_dns`: one of the SAN DNS names.
    SanDns(String),
}

impl CertName {
    /// Whether `cert` carries this name, in this name's namespace.
    fn names(&self, cert: &crate::tls::ClientCertificate) -> bool {
        match self {
            CertName::Subject(dn) => cert.has_subject(dn),
            CertName::SanUri(uri) => cert.has_san_uri(uri),
            CertName::SanDns(dns) => cert.has_san_dns(dns),
        }
    }

    /// The key of the ACL file, and the audit credential.
    fn credential(&self) -> Credential {
        match self {
            CertName::Subject(_) => Credential::CertSubject,
            CertName::SanUri(_) => Credential::CertSanUri,
            CertName::SanDns(_) => Credential::CertSanDns,
        }
    }

    /// Whether `other` names the same thing (DNS names regardless of ASCII case).
    fn same_as(&self, other: &CertName) -> bool {
        match (self, other) {
            (CertName::SanDns(a), CertName::SanDns(b)) => a.eq_ignore_ascii_case(b),
            (a, b) => a == b,
        }
    }
}

/// One `[[jwt]]` entry: what it accepts, what it grants (the principal is named by the
/// token's `sub`), and until when.
struct JwtEntry {
    rule: JwtRule,
    roles: Vec<Role>,
    groups: Vec<Glob>,
    streams: Vec<Glob>,
    members: Option<Vec<Glob>>,
    not_after: Option<i64>,
}

/// A loaded ACL: token digests, certificate names and JWT entries, and the principals
/// they authenticate.
pub(crate) struct Acl {
    entries: Vec<Entry<[u8; 32]>>,
    certs: Vec<Entry<CertName>>,
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
                    .chain(self.certs.iter().map(|e| e.principal.name()))
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
    members: Option<Vec<String>>,
    #[serde(default)]
    not_after: Option<toml::Value>,
    #[serde(default)]
    max_token_age: Option<u64>,
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
    #[serde(default)]
    cert_san_uri: Option<String>,
    #[serde(default)]
    cert_san_dns: Option<String>,
    roles: Vec<Role>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    streams: Vec<String>,
    #[serde(default)]
    members: Option<Vec<String>>,
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

/// An entry's `members` globs: `None` without the key (any member id); an empty list is
/// refused, as it would bind the entry to no member id at all.
fn members_of(list: &Option<Vec<String>>) -> Result<Option<Vec<Glob>>, &'static str> {
    match list {
        None => Ok(None),
        Some(l) if l.is_empty() || l.iter().any(|g| g.trim().is_empty()) => Err(
            "members must name at least one non-empty glob (leave the key out to allow every member id)",
        ),
        Some(l) => Ok(Some(l.iter().map(|g| Glob::new(g.trim())).collect())),
    }
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
    /// A name of a client certificate.
    Cert(CertName),
}

/// The one credential of an entry: `token`, `token_sha256`, `cert_subject`, `cert_san_uri`
/// or `cert_san_dns`.
fn credential_of(e: &EntryFile) -> Result<EntryCredential, String> {
    let given: [(&str, Option<&str>); 5] = [
        ("token", e.token.as_ref().map(|t| t.expose_secret())),
        ("token_sha256", e.token_sha256.as_deref()),
        ("cert_subject", e.cert_subject.as_deref()),
        ("cert_san_uri", e.cert_san_uri.as_deref()),
        ("cert_san_dns", e.cert_san_dns.as_deref()),
    ];
    let mut present = given.iter().filter_map(|(k, v)| Some((*k, (*v)?)));
    let (Some((key, value)), None) = (present.next(), present.next()) else {
        let count = given.iter().filter(|(_, v)| v.is_some()).count();
        return Err(if count == 0 {
            "token, token_sha256, cert_subject, cert_san_uri or cert_san_dns is required"
        } else {
            "give exactly one of token, token_sha256, cert_subject, cert_san_uri and \
             cert_san_dns"
        }
        .into());
    };
    if key != "token" && value.trim().is_empty() {
        return Err(format!("{key} must not be empty"));
    }
    Ok(match key {
        "token" if value.is_empty() => return Err("token must not be empty".into()),
        "token" => EntryCredential::Digest(Sha256::digest(value.as_bytes()).into()),
        "token_sha256" => EntryCredential::Digest(
            parse_hex32(value).ok_or("token_sha256 must be 64 hexadecimal characters")?,
        ),
        "cert_subject" => EntryCredential::Cert(CertName::Subject(subject_dn(value.trim())?)),
        "cert_san_uri" => EntryCredential::Cert(CertName::SanUri(san_uri(value.trim())?)),
        _ => EntryCredential::Cert(CertName::SanDns(san_dns(value.trim())?)),
    })
}

/// A `cert_subject`: an RFC 4514 DN, which starts with an attribute type (`CN`, `O`, a
/// dotted OID) and `=`. A URI is refused with the key it belongs in: `cert_subject` once
/// matched SAN URIs too, and an ACL written then must move them (PROTOCOL §20,
/// "Compatibility").
fn subject_dn(value: &str) -> Result<String, String> {
    let attr = value.split('=').next().unwrap_or("");
    let is_type = |t: &str| {
        let keyword = t.starts_with(|c: char| c.is_ascii_alphabetic())
            && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        let oid = !t.is_empty()
            && t.split('.')
                .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        keyword || oid
    };
    if value.contains('=') && is_type(attr) {
        return Ok(value.to_owned());
    }
    if uri_scheme(value).is_some() {
        return Err(format!(
            "cert_subject {value:?} is a URI, not a subject DN: cert_subject matches the \
             certificate's subject only; name a SAN URI with cert_san_uri"
        ));
    }
    Err(format!(
        "cert_subject {value:?} is not a subject DN (RFC 4514, e.g. \"CN=billing,O=shop\")"
    ))
}

/// The scheme of an absolute URI (`scheme ":" …`, RFC 3986 §3.1), if `value` is one.
fn uri_scheme(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(':')?;
    let ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !rest.is_empty();
    ok.then_some(scheme)
}

/// A `cert_san_uri`: an absolute URI without whitespace (a SAN URI is one, RFC 5280
/// §4.2.1.6).
fn san_uri(value: &str) -> Result<String, String> {
    if uri_scheme(value).is_some() && !value.chars().any(char::is_whitespace) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "cert_san_uri {value:?} is not an absolute URI (e.g. \
             \"spiffe://prod/ns/billing/sa/consumer\")"
        ))
    }
}

/// A `cert_san_dns`: a DNS name (letters, digits, `-`, `_`, `.`; a leading `*.` of a
/// wildcard SAN, compared as written).
fn san_dns(value: &str) -> Result<String, String> {
    let name = value.strip_prefix("*.").unwrap_or(value);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if ok {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "cert_san_dns {value:?} is not a DNS name (e.g. \"billing.prod.example\")"
        ))
    }
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
            certs: Vec::new(),
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
        let members = members_of(&e.members).map_err(&bad)?;
        let grant = |credential| {
            Principal(Arc::new(Grant {
                name: e.principal.clone(),
                credential,
                roles: e.roles.clone(),
                groups: e.groups.iter().map(|g| Glob::new(g)).collect(),
                streams: e.streams.iter().map(|s| Glob::new(s)).collect(),
                members: members.clone(),
            }))
        };
        match credential_of(&e).map_err(|r| bad(&r))? {
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
            EntryCredential::Cert(key) => {
                let credential = key.credential();
                if self.certs.iter().any(|x| x.key.same_as(&key)) {
                    return Err(bad(&format!(
                        "the same {} appears in another entry",
                        credential.as_str()
                    )));
                }
                let principal = grant(credential);
                self.certs.push(Entry {
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

    /// The principal of a client certificate an entry names — its subject by
    /// `cert_subject`, one of its SAN URIs by `cert_san_uri`, one of its SAN DNS names by
    /// `cert_san_dns`, each only in its own namespace — the first such entry in file order
    /// whose `not_after` has not passed at `now` (Unix seconds).
    pub(crate) fn authenticate_certificate(
        &self,
        cert: &crate::tls::ClientCertificate,
        now: i64,
    ) -> Result<Principal, Refusal> {
        let named: Vec<&Entry<CertName>> =
            self.certs.iter().filter(|e| e.key.names(cert)).collect();
        if let Some(e) = named.iter().find(|e| valid_at(e.not_after, now)) {
            return Ok(e.principal.clone());
        }
        match named.first() {
            Some(e) => Err(expired(&principal_of(e), e.not_after)),
            None => Err(Refusal::new(
                "unknown_certificate",
                format!(
                    "no ACL entry names the client certificate (subject {:?}) by \
                     cert_subject, nor one of its SAN URIs or DNS names by cert_san_uri or \
                     cert_san_dns; send a bearer token or use a certificate the ACL names",
                    cert.subject
                ),
            )),
        }
    }

    /// How many entries (tokens, certificate names and JWT entries) the ACL holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() + self.certs.len() + self.jwt.len()
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
            members: e.members.clone(),
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
    let members = members_of(&e.members).map_err(str::to_owned)?;
    let max_token_age = match e.max_token_age {
        None => None,
        Some(0) => return Err("max_token_age must be at least 1 (seconds)".into()),
        Some(s) => Some(i64::try_from(s).unwrap_or(i64::MAX)),
    };
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
            max_token_age,
        },
        roles: e.roles.clone(),
        groups: e.groups.iter().map(|g| Glob::new(g)).collect(),
        streams: e.streams.iter().map(|s| Glob::new(s)).collect(),
        members,
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

    fn cert(subject: &str, uris: &[&str], dns: &[&str]) -> crate::tls::ClientCertificate {
        crate::tls::ClientCertificate {
            subject: subject.into(),
            uris: uris.iter().map(|u| (*u).to_owned()).collect(),
            dns_names: dns.iter().map(|d| (*d).to_owned()).collect(),
        }
    }

    #[test]
    fn certificate_names_authenticate_their_principal() {
        let acl = Acl::from_toml(
            "[[tokens]]\nprincipal = \"billing\"\ncert_subject = \"CN=billing-consumer\"\n\
             roles = [\"member\"]\ngroups = [\"billing*\"]\n\
             [[tokens]]\nprincipal = \"spiffe-pod\"\ncert_san_uri = \"spiffe://prod/ns/a\"\n\
             roles = [\"viewer\"]\n\
             [[tokens]]\nprincipal = \"dns-pod\"\ncert_san_dns = \"pod.prod.example\"\n\
             roles = [\"producer\"]\n\
             [[tokens]]\nprincipal = \"ops\"\ntoken = \"ops-token\"\nroles = [\"admin\"]",
        )
        .unwrap();
        assert_eq!(acl.len(), 4);
        let p = acl
            .authenticate_certificate(&cert("CN=billing-consumer", &[], &[]), 0)
            .unwrap();
        assert_eq!(
            (p.name(), p.credential()),
            ("billing", Credential::CertSubject)
        );
        assert!(p.has_role(Role::Member) && p.may_group("billing-eu"));
        let p = acl
            .authenticate_certificate(&cert("CN=x", &["spiffe://prod/ns/a"], &[]), 0)
            .unwrap();
        assert_eq!(
            (p.name(), p.credential()),
            ("spiffe-pod", Credential::CertSanUri)
        );
        let p = acl
            .authenticate_certificate(&cert("CN=x", &[], &["POD.prod.example"]), 0)
            .unwrap();
        assert_eq!(
            (p.name(), p.credential()),
            ("dns-pod", Credential::CertSanDns)
        );
        assert_eq!(Credential::CertSanUri.as_str(), "cert_san_uri");
        assert_eq!(Credential::CertSanDns.as_str(), "cert_san_dns");
        assert!(
            acl.authenticate_certificate(&cert("CN=other", &[], &[]), 0)
                .is_err()
        );
        assert_eq!(
            acl.authenticate("ops-token", 0).unwrap().credential(),
            Credential::Token
        );
        // A subject is not a token.
        assert!(acl.authenticate("CN=billing-consumer", 0).is_err());
    }

    /// The attacker's certificate: subject `CN=nobody`, a SAN URI `CN=ops-cert`. It must not
    /// authenticate as the entry whose `cert_subject` is `CN=ops-cert`; nor does a name of
    /// one kind satisfy an entry of another kind.
    #[test]
    fn a_name_satisfies_only_the_matcher_of_its_kind() {
        let acl = Acl::from_toml(
            "[[tokens]]\nprincipal = \"ops-cert\"\ncert_subject = \"CN=ops-cert\"\n\
             roles = [\"admin\"]\n\
             [[tokens]]\nprincipal = \"uri\"\ncert_san_uri = \"spiffe://prod/ops\"\n\
             roles = [\"admin\"]\n\
             [[tokens]]\nprincipal = \"dns\"\ncert_san_dns = \"ops.prod.example\"\n\
             roles = [\"admin\"]",
        )
        .unwrap();
        for (c, what) in [
            (
                cert("CN=nobody", &["CN=ops-cert"], &[]),
                "a SAN URI as subject",
            ),
            (
                cert("CN=nobody", &[], &["CN=ops-cert"]),
                "a SAN DNS as subject",
            ),
            (
                cert("CN=nobody", &[], &["spiffe://prod/ops"]),
                "a SAN DNS as URI",
            ),
            (
                cert("CN=nobody", &["ops.prod.example"], &[]),
                "a SAN URI as DNS",
            ),
        ] {
            let r = acl.authenticate_certificate(&c, 0).unwrap_err();
            assert_eq!(r.reason, "unknown_certificate", "{what}");
            assert!(r.message.contains("subject \"CN=nobody\""), "{}", r.message);
        }
        // The same value under two kinds is two entries, not a duplicate.
        assert!(
            Acl::from_toml(
                "[[tokens]]\nprincipal = \"a\"\ncert_san_dns = \"x.example\"\nroles = [\"admin\"]\n\
                 [[tokens]]\nprincipal = \"b\"\ncert_san_uri = \"dns:x.example\"\nroles = [\"viewer\"]"
            )
            .is_ok()
        );
    }

    #[test]
    fn certificate_names_of_each_form_are_accepted() {
        for (key, value) in [
            ("cert_subject", "CN=a,O=shop"),
            ("cert_subject", "2.5.4.3=a"),
            ("cert_subject", "UID=x+CN=a\\\\,b"),
            ("cert_san_uri", "spiffe://prod/ns/a/sa/b"),
            ("cert_san_uri", "urn:uuid:0f1e2d3c"),
            ("cert_san_dns", "billing.prod.example"),
            ("cert_san_dns", "*.prod.example"),
            ("cert_san_dns", "localhost"),
        ] {
            let text =
                format!("[[tokens]]\nprincipal = \"p\"\n{key} = \"{value}\"\nroles = [\"viewer\"]");
            assert!(Acl::from_toml(&text).is_ok(), "{key} = {value}");
        }
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
                "the same cert_subject appears in another entry",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_san_uri = \"spiffe://x\"\nroles = [\"admin\"]\n[[tokens]]\nprincipal = \"b\"\ncert_san_uri = \"spiffe://x\"\nroles = [\"viewer\"]",
                "the same cert_san_uri appears in another entry",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_san_dns = \"x.example\"\nroles = [\"admin\"]\n[[tokens]]\nprincipal = \"b\"\ncert_san_dns = \"X.Example\"\nroles = [\"viewer\"]",
                "the same cert_san_dns appears in another entry",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_subject = \"CN=a\"\ncert_san_uri = \"spiffe://a\"\nroles = [\"admin\"]",
                "exactly one of",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_san_dns = \"a.example\"\ntoken_sha256 = \"00\"\nroles = [\"admin\"]",
                "exactly one of",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_san_uri = \"\"\nroles = [\"admin\"]",
                "cert_san_uri must not be empty",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"\"\nroles = [\"admin\"]",
                "token must not be empty",
            ),
            // An ACL written when cert_subject also matched SAN URIs.
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_subject = \"spiffe://prod/ns/a\"\nroles = [\"admin\"]",
                "is a URI, not a subject DN",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_subject = \"billing-consumer\"\nroles = [\"admin\"]",
                "not a subject DN",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_san_uri = \"CN=ops-cert\"\nroles = [\"admin\"]",
                "not an absolute URI",
            ),
            (
                "[[tokens]]\nprincipal = \"a\"\ncert_san_dns = \"spiffe://a\"\nroles = [\"admin\"]",
                "not a DNS name",
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
    #[test]
    fn members_bind_an_entry_to_member_ids() {
        let acl = Acl::from_toml(
            "[[tokens]]\nprincipal = \"billing\"\ntoken = \"t-billing\"\nroles = [\"member\"]\n\
             groups = [\"*\"]\nmembers = [\"billing-*\", \"10.0.0.?-g-*\"]\n\
             [[tokens]]\nprincipal = \"free\"\ntoken = \"t-free\"\nroles = [\"member\"]\n\
             groups = [\"*\"]",
        )
        .unwrap();
        let bound = acl.authenticate("t-billing", 0).unwrap();
        assert!(bound.may_member("billing-0"));
        assert!(bound.may_member("10.0.0.7-g-3"));
        assert!(!bound.may_member("shipping-0"));
        assert!(!bound.may_member("10.0.0.17-g-3"));
        let free = acl.authenticate("t-free", 0).unwrap();
        assert!(free.may_member("anything"), "no members key: any member id");
        assert!(Principal::open().may_member("anything"));
        for bad in ["members = []", "members = [\" \"]"] {
            let text = format!(
                "[[tokens]]\nprincipal = \"a\"\ntoken = \"t\"\nroles = [\"member\"]\n{bad}"
            );
            let e = Acl::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains("members must name at least one"), "{bad}: {e}");
        }
    }

    #[test]
    fn jwt_entries_bind_their_subjects_to_member_ids() {
        use super::super::jwt::test_keys::{KEY, KEY_X, sign};
        use jsonwebtoken::Algorithm;
        let dir = std::env::temp_dir().join(format!("rsc-acl-jwt-members-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("jwks.json"),
            format!(
                "{{\"keys\": [{{\"kty\": \"OKP\", \"crv\": \"Ed25519\", \"kid\": \"k1\", \"x\": \"{KEY_X}\"}}]}}"
            ),
        )
        .unwrap();
        let text = "[[jwt]]\nissuer = \"https://k8s\"\naudience = \"rsc\"\njwks_file = \"jwks.json\"\n\
                    subject = \"*\"\nroles = [\"member\"]\ngroups = [\"*\"]\nmembers = [\"billing-*\"]\n";
        let acl = Acl::parse(text, &dir).unwrap();
        let now = 1_796_283_000;
        let claims = serde_json::json!({"iss": "https://k8s", "aud": "rsc", "sub": "system:serviceaccount:billing:c", "exp": now + 60});
        let p = acl
            .authenticate(&sign(KEY, Some("k1"), Algorithm::EdDSA, claims), now)
            .unwrap();
        assert!(p.may_member("billing-1") && !p.may_member("shipping-1"));
        let e = Acl::parse(&text.replace("[\"billing-*\"]", "[]"), &dir)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[[jwt]] entry 0") && e.contains("members must name"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
