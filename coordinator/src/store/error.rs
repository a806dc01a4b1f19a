//! [`StoreError`]: why a store operation failed, with a kind and the cause.

use std::error::Error;
use std::sync::Arc;

/// What kind of failure a [`StoreError`] is; each maps to one error code of the API
/// (`503 STORE_UNAVAILABLE`, `503 STORE_CONFLICT`) and one `error` label of
/// `rsc_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The store cannot be reached or did not answer in time.
    Unavailable,
    /// A compare-and-set lost: the document changed since it was read.
    Conflict,
    /// A stored document could not be decoded.
    Corrupt,
}

impl StoreErrorKind {
    /// The kind as the `error` label of `rsc_store_errors_total`: `unavailable`, `conflict`
    /// or `corrupt`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Conflict => "conflict",
            StoreErrorKind::Corrupt => "corrupt",
        }
    }
}

/// Why a store operation failed: a [`kind`](Self::kind), a message, and the underlying error
/// (a Redis error, a decoder's error) as [`Error::source`].
///
/// The message already includes the cause's text, so that a one-line log keeps it; code
/// that needs to tell causes apart asks [`Self::is_timeout`], [`Self::is_retriable`] or
/// looks at the source. Cheap to clone (the source is shared).
#[derive(Debug, Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    timeout: bool,
    busy: bool,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl StoreError {
    /// The store cannot be reached or did not answer: `message` says what failed.
    pub fn unavailable(message: String) -> Self {
        Self::new(StoreErrorKind::Unavailable, message)
    }

    /// The store did not answer within a deadline: `message` says what and which.
    pub fn timed_out(message: String) -> Self {
        StoreError {
            timeout: true,
            ..Self::unavailable(message)
        }
    }

    /// The store answered, but the operation waited too long for another request (a lock
    /// held past the wait): answered like an unavailable store, not counted as an outage
    /// of it.
    pub fn busy(message: String) -> Self {
        StoreError {
            busy: true,
            ..Self::unavailable(message)
        }
    }

    /// A compare-and-set lost: `message` names the document (and why, when it is not the
    /// revision).
    pub fn conflict(message: String) -> Self {
        Self::new(StoreErrorKind::Conflict, message)
    }

    /// The document stored at `key` could not be decoded, for `reason`.
    pub fn corrupt(key: &str, reason: impl std::fmt::Display) -> Self {
        Self::new(
            StoreErrorKind::Corrupt,
            format!("{key} is unreadable: {reason}"),
        )
    }

    /// The store cannot be reached: Redis answered `e` to `what` (a timeout among them).
    pub fn from_redis(what: &str, e: redis::RedisError) -> Self {
        StoreError {
            timeout: e.is_timeout(),
            ..Self::unavailable(format!("redis {what}: {e}"))
        }
        .with_source(e)
    }

    /// The same error, caused by `source`.
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    fn new(kind: StoreErrorKind, message: String) -> Self {
        StoreError {
            kind,
            message,
            timeout: false,
            busy: false,
            source: None,
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether the store did not answer in time (an operation deadline, or a Redis reply
    /// timeout).
    pub fn is_timeout(&self) -> bool {
        self.timeout
    }

    /// Whether the store could not be reached or did not answer — an outage of it, unlike
    /// a [`Self::busy`] wait for another request.
    pub fn is_outage(&self) -> bool {
        self.is_unavailable() && !self.busy
    }

    /// Whether a compare-and-set lost to a concurrent write.
    pub fn is_conflict(&self) -> bool {
        self.kind == StoreErrorKind::Conflict
    }

    /// Whether the store could not be reached or did not answer.
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// Whether the same operation may succeed when tried again: after an outage or a lost
    /// compare-and-set (re-read first), not on a corrupt document.
    pub fn is_retriable(&self) -> bool {
        self.kind != StoreErrorKind::Corrupt
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            StoreErrorKind::Unavailable => {
                write!(f, "metadata store unavailable: {}", self.message)
            }
            StoreErrorKind::Conflict => write!(f, "document {} changed concurrently", self.message),
            StoreErrorKind::Corrupt => write!(f, "stored document {}", self.message),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ErrorKind;

    #[test]
    fn texts_are_those_of_the_api_and_the_logs() {
        assert_eq!(
            StoreError::unavailable("redis load: refused".into()).to_string(),
            "metadata store unavailable: redis load: refused"
        );
        assert_eq!(
            StoreError::conflict("group:g".into()).to_string(),
            "document group:g changed concurrently"
        );
        assert_eq!(
            StoreError::corrupt("rsc:group:{g}", "expected value").to_string(),
            "stored document rsc:group:{g} is unreadable: expected value"
        );
    }

    #[test]
    fn kind_and_cause_are_kept() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e = StoreError::from_redis("load", refused);
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
        assert!(e.is_unavailable() && e.is_retriable() && !e.is_timeout() && !e.is_conflict());
        let cause = e.source().expect("the Redis error");
        assert!(cause.downcast_ref::<redis::RedisError>().is_some());

        assert!(e.is_outage());
        let busy = StoreError::busy("lock group:g held".into());
        assert!(busy.is_unavailable() && busy.is_retriable() && !busy.is_outage());

        let slow = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(StoreError::from_redis("load", slow).is_timeout());
        assert!(StoreError::timed_out("redis load: no answer within 1s".into()).is_timeout());

        let corrupt = StoreError::corrupt("k", "bad")
            .with_source(redis::RedisError::from((ErrorKind::Parse, "bad")));
        assert!(!corrupt.is_retriable());
        assert_eq!(corrupt.kind().as_str(), "corrupt");
        assert!(StoreError::conflict("g".into()).is_conflict());
    }
}
