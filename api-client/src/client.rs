//! [`CoordinatorClient`]: the URLs, the token, the timeouts and the request plumbing.

use crate::error::CoordinatorError;
use crate::tls::{ClientTls, TokenFile};
use reqwest::{Method, Url};
use rsc_protocol::ErrorBody;
use rsc_protocol::redact::{ExposeSecret, SecretString, redact_url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A client for one or more coordinators (the same cluster behind several URLs). Requests go
/// to the current URL; a transport error or a 5xx moves on to the next one. Cheap to clone
/// (the clones share the connection pool and the current URL). `Debug`, errors and logs show
/// no token, nor a password a URL may hold (PROTOCOL §12).
#[derive(Clone)]
pub struct CoordinatorClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The base URLs, to send requests to.
    urls: Vec<Url>,
    /// The same, as errors and logs show them: without a trailing `/`, any password hidden.
    names: Vec<String>,
    current: AtomicUsize,
    token: Option<SecretString>,
    /// Read again when it changes; takes the place of `token` when set.
    token_file: Option<TokenFile>,
}

impl std::fmt::Debug for CoordinatorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs as `names` has them: a `Url`'s `Debug` shows its password.
        f.debug_struct("CoordinatorClient")
            .field("urls", &self.inner.names)
            .field("current", &self.inner.current)
            .field("token", &self.inner.token)
            .field("token_file", &self.inner.token_file)
            .finish_non_exhaustive()
    }
}

/// Builds a [`CoordinatorClient`] ([`CoordinatorClient::builder`]).
#[derive(Debug, Clone)]
pub struct CoordinatorClientBuilder {
    urls: Vec<String>,
    token: Option<SecretString>,
    token_file: Option<PathBuf>,
    tls: ClientTls,
    timeout: Option<Duration>,
    connect_timeout: Duration,
    user_agent: String,
}

impl CoordinatorClientBuilder {
    /// Sends `Authorization: Bearer TOKEN` with every request (none: no token, or an empty
    /// one).
    pub fn token(mut self, token: Option<SecretString>) -> Self {
        self.token = token.filter(|t| !t.expose_secret().is_empty());
        self
    }

    /// Reads the bearer token from this file, and again whenever the file changes (a
    /// Kubernetes projected service-account token, `RSC_TOKEN_FILE`); takes the place of
    /// [`token`](Self::token). The file must hold a token when the client is built.
    pub fn token_file(mut self, path: Option<PathBuf>) -> Self {
        self.token_file = path;
        self
    }

    /// The CA, client certificate and key for `https://` URLs (default: the system's roots,
    /// no client certificate).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// How long a request may take, unless the call gives its own timeout (the member calls
    /// do). Default: no limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long connecting may take. Default: 2 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The `User-Agent` header. Default: `rsc-api/<version>`.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// The client, or [`CoordinatorError::InvalidUrl`] for the first URL that is not an
    /// `http`/`https` base URL (or when there is none), or [`CoordinatorError::Setup`] for
    /// a TLS or token file that cannot be used.
    pub fn build(self) -> Result<CoordinatorClient, CoordinatorError> {
        let urls = self
            .urls
            .iter()
            .map(|u| base_url(u))
            .collect::<Result<Vec<_>, _>>()?;
        if urls.is_empty() {
            return Err(CoordinatorError::InvalidUrl(String::new()));
        }
        let https = urls.iter().any(|u| u.scheme() == "https");
        let token_file = self.token_file.map(TokenFile::open).transpose()?;
        let mut http = reqwest::Client::builder()
            .tls_backend_preconfigured(self.tls.rustls_config(https)?)
            .connect_timeout(self.connect_timeout)
            .user_agent(self.user_agent);
        if let Some(t) = self.timeout {
            http = http.timeout(t);
        }
        let names: Vec<String> = urls
            .iter()
            .map(|u| redact_url(u.as_str().trim_end_matches('/')))
            .collect();
        let http = http.build().map_err(|e| CoordinatorError::Transport {
            url: names[0].clone(),
            source: Arc::new(e),
        })?;
        Ok(CoordinatorClient {
            inner: Arc::new(Inner {
                http,
                urls,
                names,
                current: AtomicUsize::new(0),
                token: self.token,
                token_file,
            }),
        })
    }
}

/// `e` with the password of the URL it names removed (its `Display` shows the URL).
fn without_password(mut e: reqwest::Error) -> reqwest::Error {
    if let Some(url) = e.url_mut()
        && url.password().is_some()
    {
        let _ = url.set_password(None);
    }
    e
}

/// A coordinator URL as a base: `http`/`https`, with a path prefix kept.
fn base_url(url: &str) -> Result<Url, CoordinatorError> {
    let bad = || CoordinatorError::InvalidUrl(redact_url(url));
    let base = Url::parse(url.trim()).map_err(|_| bad())?;
    if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
        return Err(bad());
    }
    Ok(base)
}

/// A decoded answer of an administrative call: the typed value and the JSON as the
/// coordinator sent it (so that fields added by a newer coordinator reach scripts).
#[derive(Debug, Clone)]
pub struct Fetched<T> {
    /// The typed view.
    pub view: T,
    /// The raw JSON body.
    pub json: Value,
}

impl CoordinatorClient {
    /// A builder for a client of the coordinators at `urls` (one cluster behind several
    /// URLs, tried in order on failure), e.g. `["http://127.0.0.1:7070"]`.
    pub fn builder<I>(urls: I) -> CoordinatorClientBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        CoordinatorClientBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            token: None,
            token_file: None,
            tls: ClientTls::default(),
            timeout: None,
            connect_timeout: Duration::from_secs(2),
            user_agent: concat!("rsc-api/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }

    /// The coordinator URL requests go to now (any password it holds hidden).
    pub fn current_url(&self) -> &str {
        &self.inner.names[self.current()]
    }

    fn current(&self) -> usize {
        self.inner.current.load(Ordering::Relaxed) % self.inner.urls.len()
    }

    /// `base` + the path segments, each percent-encoded (so a name with `/` in it reaches
    /// the coordinator, which refuses it as `INVALID_REQUEST`, instead of another route).
    fn url(&self, index: usize, segments: &[&str]) -> Url {
        let mut url = self.inner.urls[index].clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Sends one request to the current coordinator; after a failure that suggests it is
    /// down, later requests go to the next URL. Returns the coordinator's URL with the
    /// answer (status 2xx: the body's bytes).
    pub(crate) async fn exchange(
        &self,
        request: Request<'_, impl Serialize>,
    ) -> (String, Result<reqwest::Response, CoordinatorError>) {
        let index = self.current();
        let base = self.inner.names[index].clone();
        let mut url = self.url(index, request.path);
        url.set_query(request.query);
        let result = self.send(&base, url, &request).await;
        if let Err(e) = &result
            && e.suggests_failover()
            && self.inner.urls.len() > 1
        {
            // Move on only if nobody else already did.
            let next = (index + 1) % self.inner.urls.len();
            let _ = self.inner.current.compare_exchange(
                index,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            let to = &self.inner.names[next];
            tracing::warn!(from = %base, to = %to, error = %e, "coordinator failover");
        }
        (base, result)
    }

    async fn send(
        &self,
        base: &str,
        url: Url,
        request: &Request<'_, impl Serialize>,
    ) -> Result<reqwest::Response, CoordinatorError> {
        let mut req = self.inner.http.request(request.method.clone(), url);
        if let Some(t) = request.timeout {
            req = req.timeout(t);
        }
        // reqwest marks the header sensitive: its `Debug` hides it.
        if let Some(f) = &self.inner.token_file {
            req = req.bearer_auth(f.token().expose_secret());
        } else if let Some(t) = &self.inner.token {
            req = req.bearer_auth(t.expose_secret());
        }
        if let Some(b) = request.body {
            req = req.json(b);
        }
        let transport = |source| CoordinatorError::Transport {
            url: base.to_owned(),
            source: Arc::new(without_password(source)),
        };
        let resp = req.send().await.map_err(transport)?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(transport)?;
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => CoordinatorError::Api {
                url: base.to_owned(),
                status,
                code: body.error.code,
                message: body.error.message,
                retry_after_ms: body.error.retry_after_ms,
            },
            Err(_) => CoordinatorError::Unexpected {
                url: base.to_owned(),
                status,
                body: snippet(&String::from_utf8_lossy(&bytes)),
            },
        })
    }

    /// [`Self::exchange`], decoding the JSON answer.
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        request: Request<'_, impl Serialize>,
    ) -> (String, Result<Fetched<T>, CoordinatorError>) {
        let (base, resp) = self.exchange(request).await;
        let result = async {
            let resp = resp?;
            let status = resp.status().as_u16();
            let url = base.clone();
            let text = resp
                .text()
                .await
                .map_err(|source| CoordinatorError::Transport {
                    url: url.clone(),
                    source: Arc::new(without_password(source)),
                })?;
            let unexpected = |body| CoordinatorError::Unexpected {
                url: url.clone(),
                status,
                body,
            };
            let json: Value = serde_json::from_str(&text)
                .map_err(|e| unexpected(format!("{e}: {}", snippet(&text))))?;
            let view = T::deserialize(&json).map_err(|e| unexpected(e.to_string()))?;
            Ok(Fetched { view, json })
        }
        .await;
        (base, result)
    }
}

/// One request: method, path segments, optional query, JSON body and timeout.
pub(crate) struct Request<'a, B> {
    pub(crate) method: Method,
    pub(crate) path: &'a [&'a str],
    pub(crate) query: Option<&'a str>,
    pub(crate) body: Option<&'a B>,
    pub(crate) timeout: Option<Duration>,
}

impl<'a> Request<'a, ()> {
    /// A request without a body, query or own timeout.
    pub(crate) fn new(method: Method, path: &'a [&'a str]) -> Self {
        Request {
            method,
            path,
            query: None,
            body: None,
            timeout: None,
        }
    }
}

impl<'a, B> Request<'a, B> {
    /// With a JSON body.
    pub(crate) fn body<C>(self, body: &'a C) -> Request<'a, C> {
        Request {
            method: self.method,
            path: self.path,
            query: self.query,
            body: Some(body),
            timeout: self.timeout,
        }
    }

    /// With a query string.
    pub(crate) fn query(mut self, query: &'a str) -> Self {
        self.query = Some(query);
        self
    }

    /// With its own timeout.
    pub(crate) fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// The start of a body, for error messages.
fn snippet(text: &str) -> String {
    const MAX: usize = 200;
    let t = text.trim();
    if t.is_empty() {
        return "empty body".into();
    }
    match t.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_joined_and_encoded() {
        let c = CoordinatorClient::builder(["http://127.0.0.1:7070/"])
            .build()
            .unwrap();
        assert_eq!(
            c.url(0, &["v1", "groups", "a/b c"]).as_str(),
            "http://127.0.0.1:7070/v1/groups/a%2Fb%20c"
        );
        let c = CoordinatorClient::builder(["http://h:1/prefix"])
            .build()
            .unwrap();
        assert_eq!(
            c.url(0, &["v1", "streams"]).as_str(),
            "http://h:1/prefix/v1/streams"
        );
        assert_eq!(c.current_url(), "http://h:1/prefix");
    }

    #[test]
    fn bad_base_urls_are_refused() {
        for bad in ["", "127.0.0.1:7070", "ftp://h/", "mailto:x@y"] {
            assert!(
                matches!(
                    CoordinatorClient::builder([bad]).build(),
                    Err(CoordinatorError::InvalidUrl(_))
                ),
                "{bad}"
            );
        }
        let none: [&str; 0] = [];
        assert!(CoordinatorClient::builder(none).build().is_err());
    }

    #[test]
    fn snippets_are_bounded() {
        assert_eq!(snippet("  "), "empty body");
        assert_eq!(snippet(&"x".repeat(500)).chars().count(), 201);
    }

    #[test]
    fn the_token_and_a_url_password_are_not_printed() {
        let b = CoordinatorClient::builder(["http://ops:pw-url@h:1/"]).token(Some("s3cret".into()));
        assert!(!format!("{b:?}").contains("s3cret"));
        let c = b.build().unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw-url"),
            "{shown}"
        );
        assert_eq!(c.current_url(), "http://ops:<redacted>@h:1");
        let e = CoordinatorClient::builder(["ftp://ops:pw-url@h:1"])
            .build()
            .unwrap_err();
        assert!(!e.to_string().contains("pw-url"), "{e}");
    }
}
