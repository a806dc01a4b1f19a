//! [`CoordinatorError`]: why one call to the coordinator failed, with its [`ErrorKind`].

use rsc_protocol::ErrorCode;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What kind of failure a [`CoordinatorError`] is (its [`CoordinatorError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The coordinator answered with an error body: see [`CoordinatorError::code`].
    Api,
    /// The coordinator answered something the API does not document (not JSON, a proxy's
    /// page, a body of another shape).
    Unexpected,
    /// No answer within the timeout.
    Timeout,
    /// The connection could not be made (refused, unknown host, TLS).
    Connect,
    /// Another transport failure (the connection broke during the exchange).
    Transport,
    /// A coordinator URL is not a usable `http`/`https` base URL.
    InvalidUrl,
    /// The client's own files (CA, client certificate and key, token file) cannot be used.
    Setup,
}

/// The outcome of one failed call to the coordinator. Cloneable: a failed batched heartbeat
/// request (`POST /v1/heartbeats`) fails every heartbeat it carried with the same error.
///
/// Classify it with [`kind`](Self::kind), [`is_timeout`](Self::is_timeout),
/// [`is_retriable`](Self::is_retriable) and [`code`](Self::code) rather than by its message;
/// a transport error's cause (the `reqwest` error, and its I/O error) is its
/// [`source`](std::error::Error::source).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// The coordinator answered with a protocol error body.
    Api {
        /// The coordinator that answered (its base URL).
        url: String,
        /// HTTP status.
        status: u16,
        /// The protocol error code.
        code: ErrorCode,
        /// The human-readable message.
        message: String,
        /// When a retry may succeed, how long until then (ms), if the coordinator said.
        retry_after_ms: Option<u64>,
    },
    /// The coordinator answered something that is not the expected JSON.
    Unexpected {
        /// The coordinator that answered (its base URL).
        url: String,
        /// HTTP status.
        status: u16,
        /// What was wrong, with the start of the body.
        body: String,
    },
    /// The coordinator could not be reached (connection refused, timeout, reset).
    Transport {
        /// The coordinator tried (its base URL; the error names the URL requested).
        url: String,
        /// The HTTP client's error (shared by every heartbeat of a failed batch).
        source: Arc<reqwest::Error>,
    },
    /// A coordinator URL is not a usable base URL.
    InvalidUrl(String),
    /// A file the client was given (`RSC_COORDINATOR_CA`, `RSC_COORDINATOR_CERT` /
    /// `RSC_COORDINATOR_KEY`, `RSC_TOKEN_FILE`) cannot be read or used.
    Setup {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

impl CoordinatorError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CoordinatorError::Api { .. } => ErrorKind::Api,
            CoordinatorError::Unexpected { .. } => ErrorKind::Unexpected,
            CoordinatorError::Transport { source, .. } if source.is_timeout() => ErrorKind::Timeout,
            CoordinatorError::Transport { source, .. } if source.is_connect() => ErrorKind::Connect,
            CoordinatorError::Transport { .. } => ErrorKind::Transport,
            CoordinatorError::InvalidUrl(_) => ErrorKind::InvalidUrl,
            CoordinatorError::Setup { .. } => ErrorKind::Setup,
        }
    }

    /// Whether the coordinator gave no answer within the timeout.
    pub fn is_timeout(&self) -> bool {
        self.kind() == ErrorKind::Timeout
    }

    /// Whether the same request may succeed later (or on another coordinator): transport
    /// errors, 5xx, 429 and the retryable protocol codes ([`ErrorCode::is_retryable`]). A
    /// refusal (bad token, missing scope, invalid request, unknown group) is not.
    pub fn is_retriable(&self) -> bool {
        match self {
            CoordinatorError::Api { code, .. } => code.is_retryable(),
            CoordinatorError::Unexpected { status, .. } => *status >= 500 || *status == 429,
            CoordinatorError::Transport { .. } => true,
            CoordinatorError::InvalidUrl(_) | CoordinatorError::Setup { .. } => false,
        }
    }

    /// The protocol error code, when the coordinator answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CoordinatorError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The HTTP status, when the coordinator answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            CoordinatorError::Api { status, .. } | CoordinatorError::Unexpected { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }

    /// When the coordinator said a retry may succeed, how long until then.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CoordinatorError::Api { retry_after_ms, .. } => {
                retry_after_ms.map(Duration::from_millis)
            }
            _ => None,
        }
    }

    /// Whether another coordinator URL should be tried next (this one is down or failing).
    pub(crate) fn suggests_failover(&self) -> bool {
        match self {
            CoordinatorError::Api { status, .. } | CoordinatorError::Unexpected { status, .. } => {
                *status >= 500
            }
            CoordinatorError::Transport { .. } => true,
            CoordinatorError::InvalidUrl(_) | CoordinatorError::Setup { .. } => false,
        }
    }
}

impl fmt::Display for CoordinatorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoordinatorError::Api {
                url,
                status,
                code,
                message,
                ..
            } => write!(f, "{code} (HTTP {status}) from {url}: {message}"),
            CoordinatorError::Unexpected { url, status, body } => {
                write!(f, "unexpected answer (HTTP {status}) from {url}: {body}")
            }
            CoordinatorError::Transport { url, source } => write!(
                f,
                "cannot reach the coordinator at {}: {}",
                source.url().map_or(url.as_str(), reqwest::Url::as_str),
                error_chain(source.as_ref())
            ),
            CoordinatorError::InvalidUrl(url) => write!(
                f,
                "invalid coordinator URL {url:?}: expected e.g. http://127.0.0.1:7070"
            ),
            CoordinatorError::Setup { path, reason } => write!(f, "{path}: {reason}"),
        }
    }
}

impl std::error::Error for CoordinatorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CoordinatorError::Transport { source, .. } => Some(source.as_ref()),
            _ => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, code: ErrorCode) -> CoordinatorError {
        CoordinatorError::Api {
            url: "http://c".into(),
            status,
            code,
            message: "m".into(),
            retry_after_ms: Some(250),
        }
    }

    #[test]
    fn api_errors_are_classified_by_their_code() {
        let busy = api(503, ErrorCode::StoreUnavailable);
        assert_eq!(busy.kind(), ErrorKind::Api);
        assert!(busy.is_retriable() && !busy.is_timeout());
        assert_eq!(busy.retry_after(), Some(Duration::from_millis(250)));
        assert_eq!(busy.status(), Some(503));
        let refused = api(404, ErrorCode::GroupNotFound);
        assert!(!refused.is_retriable());
        assert_eq!(refused.code(), Some(ErrorCode::GroupNotFound));
        assert_eq!(
            refused.to_string(),
            "GROUP_NOT_FOUND (HTTP 404) from http://c: m"
        );
        assert!(std::error::Error::source(&refused).is_none());
    }

    #[test]
    fn unexpected_answers_are_retriable_when_the_server_failed() {
        let e = |status| CoordinatorError::Unexpected {
            url: "u".into(),
            status,
            body: "b".into(),
        };
        assert!(e(502).is_retriable() && e(429).is_retriable());
        assert!(!e(400).is_retriable());
        assert_eq!(e(502).kind(), ErrorKind::Unexpected);
    }

    #[test]
    fn invalid_urls_are_final() {
        let e = CoordinatorError::InvalidUrl("x".into());
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
        assert!(!e.is_retriable() && !e.suggests_failover());
    }
}
