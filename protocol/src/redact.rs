//! Keeping secrets out of logs, error messages and `Debug` output, shared by the coordinator,
//! the client and the CLI (PROTOCOL §12, "Secrets in output").
//!
//! Two types carry every secret the project handles, so that a struct holding one can
//! `#[derive(Debug)]` and still print none:
//! - [`SecretString`] (the `secrecy` crate's) for a secret that is nothing but a secret: a
//!   bearer token, a JWT, a sentinel password. `Debug` prints `[REDACTED]`, there is no
//!   `Display`, and the value is wiped from memory when dropped.
//! - [`SecretUrl`] for a URL that may carry a password (a Redis URL): `Debug` and `Display`
//!   show it with the password replaced by `<redacted>` ([`redact_url`]), so that logs still
//!   name the server.
//!
//! Either gives its value only through [`ExposeSecret::expose_secret`], at the place that
//! connects or authenticates with it.

use std::fmt;

pub use secrecy::{ExposeSecret, SecretString};

/// What a hidden secret prints as.
pub const REDACTED: &str = "<redacted>";

/// A Redis URL, or a comma-separated list of them, with any password hidden:
/// `redis://app:secret@host:6379` becomes `redis://app:<redacted>@host:6379`, and the `pass`
/// parameter of a Unix socket URL (`redis+unix:///run/redis.sock?pass=secret`) too. Text
/// that is not a URL but has an `@` loses everything before it.
///
/// ```
/// use rsc_protocol::redact::redact_url;
/// assert_eq!(redact_url("redis://:pw@r1:6379,redis://r2"), "redis://<redacted>@r1:6379,redis://r2");
/// assert_eq!(redact_url("unix:///r.sock?db=1&pass=pw"), "unix:///r.sock?db=1&pass=<redacted>");
/// ```
pub fn redact_url(urls: &str) -> String {
    urls.split(',')
        .map(|u| redact_query(&redact_userinfo(u)))
        .collect::<Vec<_>>()
        .join(",")
}

/// `scheme://user:password@rest` → `scheme://user:<redacted>@rest`.
fn redact_userinfo(u: &str) -> String {
    let Some(at) = u.rfind('@') else {
        return u.to_owned();
    };
    match u.find("://") {
        Some(scheme) if at > scheme + 3 => {
            let creds = &u[scheme + 3..at];
            let user = match creds.split_once(':') {
                Some((user, _)) if !user.is_empty() => format!("{user}:"),
                _ => String::new(),
            };
            format!("{}{user}{REDACTED}{}", &u[..scheme + 3], &u[at..])
        }
        Some(_) => u.to_owned(),
        // Not a URL: whatever precedes the `@` may be a password.
        None => format!("{REDACTED}{}", &u[at..]),
    }
}

/// The values of `pass`/`password` query parameters hidden.
fn redact_query(u: &str) -> String {
    let Some((base, query)) = u.split_once('?') else {
        return u.to_owned();
    };
    let query = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if matches!(k.to_ascii_lowercase().as_str(), "pass" | "password") => {
                format!("{k}={REDACTED}")
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{base}?{query}")
}

/// A URL that may carry a password, or a comma-separated list of them (Redis Cluster seed
/// nodes): a Redis URL as configured. `Debug` and `Display` show it through [`redact_url`];
/// [`ExposeSecret::expose_secret`] gives the URL itself, to connect with. Held in a
/// [`SecretString`], wiped from memory when dropped.
///
/// ```
/// use rsc_protocol::redact::{ExposeSecret, SecretUrl};
/// let url = SecretUrl::from("redis://app:pw@r1:6379");
/// assert_eq!(url.to_string(), "redis://app:<redacted>@r1:6379");
/// assert_eq!(format!("{url:?}"), "\"redis://app:<redacted>@r1:6379\"");
/// assert_eq!(url.expose_secret(), "redis://app:pw@r1:6379");
/// ```
#[derive(Clone, Default)]
pub struct SecretUrl(SecretString);

impl SecretUrl {
    /// Wraps `url`.
    pub fn new(url: impl Into<String>) -> Self {
        SecretUrl(SecretString::from(url.into()))
    }

    /// The URLs of a comma-separated list, trimmed, empty ones dropped.
    pub fn split(&self) -> Vec<SecretUrl> {
        self.expose_secret()
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(SecretUrl::from)
            .collect()
    }

    /// The URLs themselves, to connect with (for APIs that take plain strings).
    pub fn expose_all(urls: &[SecretUrl]) -> Vec<String> {
        urls.iter().map(|u| u.expose_secret().to_owned()).collect()
    }

    /// Whether it is empty (or only blanks).
    pub fn is_blank(&self) -> bool {
        self.expose_secret().trim().is_empty()
    }
}

impl ExposeSecret<str> for SecretUrl {
    fn expose_secret(&self) -> &str {
        self.0.expose_secret()
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(self.expose_secret()))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(self.expose_secret()), f)
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        SecretUrl::new(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        SecretUrl::new(url)
    }
}

impl From<&String> for SecretUrl {
    fn from(url: &String) -> Self {
        SecretUrl::new(url.as_str())
    }
}

// Equality by value, for settings (never used to check a credential: it is not constant
// time).
impl PartialEq for SecretUrl {
    fn eq(&self, other: &Self) -> bool {
        self.expose_secret() == other.expose_secret()
    }
}

impl Eq for SecretUrl {}

impl PartialEq<str> for SecretUrl {
    fn eq(&self, other: &str) -> bool {
        self.expose_secret() == other
    }
}

impl PartialEq<&str> for SecretUrl {
    fn eq(&self, other: &&str) -> bool {
        self.expose_secret() == *other
    }
}

impl PartialEq<String> for SecretUrl {
    fn eq(&self, other: &String) -> bool {
        self.expose_secret() == other
    }
}

impl std::str::FromStr for SecretUrl {
    type Err = std::convert::Infallible;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Ok(SecretUrl::new(url))
    }
}

impl<'de> serde::Deserialize<'de> for SecretUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(SecretUrl::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_the_rest_kept() {
        assert_eq!(
            redact_url("redis://app:pa55@r1:6379,redis://:pa55@r2:6379,redis://r3:6379"),
            "redis://app:<redacted>@r1:6379,redis://<redacted>@r2:6379,redis://r3:6379"
        );
        assert_eq!(redact_url("rediss://user@h"), "rediss://<redacted>@h");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url(":pa55@h:6379"), "<redacted>@h:6379");
        assert_eq!(
            redact_url("redis://:p@ss/w?rd@h:1/0"),
            "redis://<redacted>@h:1/0",
            "an @ or / in the password"
        );
        assert_eq!(
            redact_url("redis+unix:///s.sock?user=u&PASS=pa55&db=2"),
            "redis+unix:///s.sock?user=u&PASS=<redacted>&db=2"
        );
    }

    #[test]
    fn a_secret_url_prints_redacted_and_gives_itself_when_asked() {
        let url = SecretUrl::from(" redis://:pa55@r1:1 , ,redis://:pa55@r2:2");
        for shown in [format!("{url}"), format!("{url:?}"), format!("{url:#?}")] {
            assert!(!shown.contains("pa55") && shown.contains("r1:1"), "{shown}");
        }
        let seeds = url.split();
        assert_eq!(seeds.len(), 2);
        assert_eq!(seeds[1].expose_secret(), "redis://:pa55@r2:2");
        assert!(!format!("{seeds:?}").contains("pa55"));
        let token = SecretString::from("t0ken");
        assert!(!format!("{token:?}").contains("t0ken"));
        assert!(SecretUrl::from("  ").is_blank());
        let parsed: SecretUrl = serde_json::from_str("\"redis://:pa55@h\"").unwrap();
        assert_eq!(parsed.expose_secret(), "redis://:pa55@h");
    }
}
