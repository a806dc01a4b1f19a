//! A small typed HTTP client for the coordinator's `/v1` API, as the operators' CLI uses it.
//!
//! Every answer is kept twice: as the typed view (to render tables) and as the JSON the
//! coordinator sent (printed unchanged by `--output json`, so that fields added by a newer
//! coordinator reach scripts).

use reqwest::{Method, StatusCode, Url};
use rsc_protocol::{
    CreateGroupRequest, ErrorBody, ErrorCode, GroupList, GroupView, ReshardRequest, StreamList,
    StreamView,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;

/// How long one request may take before the CLI gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator answered with a SPEC error body.
    #[error("{code}: {message}")]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// SPEC error code.
        code: ErrorCode,
        /// The coordinator's explanation.
        message: String,
    },
    /// The coordinator could not be reached, or did not answer in time.
    #[error("cannot reach the coordinator at {url}: {detail}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// The transport error and its causes, e.g. `… : Connection refused`.
        detail: String,
    },
    /// The answer was not what the API documents (e.g. not a coordinator at that address).
    #[error("unexpected answer from {url} (HTTP {status}): {detail}")]
    Unexpected {
        /// The URL asked.
        url: String,
        /// HTTP status.
        status: StatusCode,
        /// What was wrong with it.
        detail: String,
    },
    /// The `--coordinator` URL is not a usable base URL.
    #[error("invalid coordinator URL {0:?}: expected e.g. http://127.0.0.1:7070")]
    BadUrl(String),
}

impl ClientError {
    /// Whether the coordinator refused the request itself (a 4xx answer): the request, the
    /// token or the target is wrong, and repeating it unchanged will not help.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ClientError::Api { status, .. } if status.is_client_error())
    }

    /// The SPEC error code, when the coordinator sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// A decoded answer: the typed value and the JSON as the coordinator sent it.
#[derive(Debug, Clone)]
pub struct Fetched<T> {
    /// The typed view.
    pub view: T,
    /// The raw JSON body.
    pub json: Value,
}

/// A client for one coordinator.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("token", &rsc_protocol::redact::redact_opt(&self.token))
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the coordinator at `base` (e.g. `http://127.0.0.1:7070`), sending
    /// `Authorization: Bearer TOKEN` when a token is given.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ClientError> {
        let bad = || ClientError::BadUrl(base.to_owned());
        let base = Url::parse(base).map_err(|_| bad())?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(bad());
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("rsc-coordinator-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Unreachable {
                url: base.to_string(),
                detail: error_chain(&e),
            })?;
        Ok(Client {
            http,
            base,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// `base` + the path segments, each percent-encoded (so a name with `/` in it reaches
    /// the coordinator, which refuses it as `INVALID_REQUEST`, instead of another route).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&impl Serialize>,
    ) -> Result<(StatusCode, String), ClientError> {
        let mut req = self.http.request(method, url.clone());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: url.to_string(),
            detail: if e.is_timeout() {
                format!("no answer within {REQUEST_TIMEOUT:?}")
            } else {
                error_chain(&e)
            },
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let text = resp.text().await.map_err(unreachable)?;
        if status.is_success() {
            return Ok((status, text));
        }
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => Err(ClientError::Api {
                status,
                code: body.error.code,
                message: body.error.message,
            }),
            Err(_) => Err(ClientError::Unexpected {
                url: url.to_string(),
                status,
                detail: snippet(&text),
            }),
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&impl Serialize>,
    ) -> Result<Fetched<T>, ClientError> {
        let url = self.url(segments);
        let (status, text) = self.send(method, url.clone(), body).await?;
        let unexpected = |detail: String| ClientError::Unexpected {
            url: url.to_string(),
            status,
            detail,
        };
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| unexpected(format!("{e}: {}", snippet(&text))))?;
        let view = T::deserialize(&json).map_err(|e| unexpected(e.to_string()))?;
        Ok(Fetched { view, json })
    }

    async fn no_content(&self, method: Method, segments: &[&str]) -> Result<(), ClientError> {
        self.send(method, self.url(segments), None::<&()>)
            .await
            .map(drop)
    }

    /// `POST /v1/groups`.
    pub async fn create_group(
        &self,
        req: &CreateGroupRequest,
    ) -> Result<Fetched<GroupView>, ClientError> {
        self.json(Method::POST, &["v1", "groups"], Some(req)).await
    }

    /// `GET /v1/groups/{group}`.
    pub async fn describe_group(&self, group: &str) -> Result<Fetched<GroupView>, ClientError> {
        self.json(Method::GET, &["v1", "groups", group], None::<&()>)
            .await
    }

    /// `GET /v1/groups`.
    pub async fn list_groups(&self) -> Result<Fetched<GroupList>, ClientError> {
        self.json(Method::GET, &["v1", "groups"], None::<&()>).await
    }

    /// `DELETE /v1/groups/{group}[?force=true]`.
    pub async fn delete_group(&self, group: &str, force: bool) -> Result<(), ClientError> {
        let mut url = self.url(&["v1", "groups", group]);
        if force {
            url.set_query(Some("force=true"));
        }
        self.send(Method::DELETE, url, None::<&()>).await.map(drop)
    }

    /// `POST /v1/groups/{group}/pause` (`paused`) or `/resume`.
    pub async fn set_group_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> Result<Fetched<GroupView>, ClientError> {
        let action = if paused { "pause" } else { "resume" };
        self.json(Method::POST, &["v1", "groups", group, action], None::<&()>)
            .await
    }

    /// `DELETE /v1/groups/{group}/members/{member}`.
    pub async fn remove_member(&self, group: &str, member: &str) -> Result<(), ClientError> {
        self.no_content(Method::DELETE, &["v1", "groups", group, "members", member])
            .await
    }

    /// `GET /v1/streams/{stream}`.
    pub async fn describe_stream(&self, stream: &str) -> Result<Fetched<StreamView>, ClientError> {
        self.json(Method::GET, &["v1", "streams", stream], None::<&()>)
            .await
    }

    /// `GET /v1/streams`.
    pub async fn list_streams(&self) -> Result<Fetched<StreamList>, ClientError> {
        self.json(Method::GET, &["v1", "streams"], None::<&()>)
            .await
    }

    /// `POST /v1/streams/{stream}/reshard`.
    pub async fn reshard(
        &self,
        stream: &str,
        shard_count: u32,
    ) -> Result<Fetched<StreamView>, ClientError> {
        self.json(
            Method::POST,
            &["v1", "streams", stream, "reshard"],
            Some(&ReshardRequest { shard_count }),
        )
        .await
    }

    /// `POST /v1/streams/{stream}/rollback`.
    pub async fn rollback(&self, stream: &str) -> Result<Fetched<StreamView>, ClientError> {
        self.json(
            Method::POST,
            &["v1", "streams", stream, "rollback"],
            None::<&()>,
        )
        .await
    }
}

/// An error and its causes, `outer: inner: root` (reqwest's own message hides the cause,
/// e.g. "Connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = c.source();
    }
    parts.join(": ")
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
        let c = Client::new("http://127.0.0.1:7070/", None).unwrap();
        assert_eq!(
            c.url(&["v1", "groups", "a/b c"]).as_str(),
            "http://127.0.0.1:7070/v1/groups/a%2Fb%20c"
        );
        let c = Client::new("http://h:1/prefix", None).unwrap();
        assert_eq!(
            c.url(&["v1", "streams"]).as_str(),
            "http://h:1/prefix/v1/streams"
        );
    }

    #[test]
    fn bad_base_urls_are_refused() {
        for bad in ["", "127.0.0.1:7070", "ftp://h/", "mailto:x@y"] {
            assert!(
                matches!(Client::new(bad, None), Err(ClientError::BadUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn snippets_are_bounded() {
        assert_eq!(snippet("  "), "empty body");
        assert_eq!(snippet(&"x".repeat(500)).chars().count(), 201);
    }
}
