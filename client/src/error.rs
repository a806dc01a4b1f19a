//! The client's errors: [`ClientError`] for everything the framework does, and
//! [`CoordinatorError`] for one call to the coordinator.

use rsc_protocol::ErrorCode;

/// A boxed error: what a [`crate::HandlerError`] carries and a codec returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of the client framework (configuration, Redis, coordinator, encoding).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The configuration is incomplete or invalid: which setting, and what to do.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Strict fencing: Redis refused this member's owner token for the shard (it moved to
    /// another member); the acknowledgement did not land and the entry will be handled again.
    #[error("shard {shard_key} belongs to another member now: the acknowledgement was refused")]
    Fenced {
        /// The shard key.
        shard_key: String,
    },
    /// Ordered resharding (issue 16): the shard refused the write because the producer's
    /// routing epoch is stale, and no newer routing came within the producer's retry budget
    /// (coordinator unreachable?). Nothing of the refused records was written.
    #[error(
        "stream {stream}: the write was refused for routing epoch {routing_epoch} (shard at epoch {shard_epoch}) and no newer routing came within the retry budget"
    )]
    StaleRouting {
        /// The stream.
        stream: String,
        /// The routing epoch the producer wrote with.
        routing_epoch: u64,
        /// The epoch marker of the shard that refused.
        shard_epoch: u64,
    },
    /// The entries were written to the master, but fewer replicas than the producer's
    /// [`crate::producer::ProducerBuilder::wait_for_replicas`] confirmed them in time: a
    /// failover now could lose them. Publishing again may write them twice.
    #[error("written, but only {acked} of {wanted} replicas confirmed in time")]
    NotReplicated {
        /// Replicas that confirmed (the fewest over the batch's pipelines).
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },
    /// A call to the coordinator failed.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// A payload could not be encoded as JSON.
    #[error("payload encoding: {0}")]
    Encode(#[from] serde_json::Error),
    /// A payload could not be encoded with a codec (see [`crate::codec`]).
    #[error("payload encoding as {content_type}: {source}")]
    Codec {
        /// The codec's content type.
        content_type: &'static str,
        /// The codec's error.
        source: BoxError,
    },
    /// A member's task panicked (e.g. in an `on_assigned` / `on_revoked` callback, or a
    /// shard worker outside the handler; a handler's own panic is a failed attempt, retried
    /// and then dead-lettered): the app stopped.
    #[error("member {member} of group {group} panicked{}: {message}", shard.map(|s| format!(" (shard {s})")).unwrap_or_default())]
    Panicked {
        /// The group.
        group: String,
        /// The member id.
        member: String,
        /// The shard whose worker panicked, if it was a worker.
        shard: Option<u32>,
        /// The panic message.
        message: String,
    },
    /// The graceful shutdown outlived [`crate::ClientConfig::shutdown_timeout`]: the remaining
    /// members were stopped where they were (their unacknowledged entries are handled again
    /// by the next owner).
    #[error(
        "graceful shutdown timed out after {timeout:?}: {remaining} member(s) stopped where they were"
    )]
    ShutdownTimedOut {
        /// Members still running at the deadline.
        remaining: usize,
        /// The shutdown timeout.
        timeout: std::time::Duration,
    },
    /// A member was refused by the coordinator in a way retrying cannot fix (bad token,
    /// missing scope, invalid request): the listener stopped.
    #[error("member {member} of group {group} stopped: {source}")]
    MemberRejected {
        /// The group.
        group: String,
        /// The member id.
        member: String,
        /// What the coordinator answered.
        source: CoordinatorError,
    },
}

/// What is wrong with a configuration (of a [`crate::ConsumerApp`], a
/// [`crate::producer::Producer`], or a stream's routing). Match on the variant rather than
/// on the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No coordinator URL.
    #[error(
        "no coordinator URL: set RSC_COORDINATOR_URL (comma-separated for failover) or call \
         .coordinator(url)"
    )]
    NoCoordinator,
    /// No instance id for member ids.
    #[error("{}", if *static_membership {
        "static membership needs a stable instance id: set POD_NAME (or HOSTNAME), or call \
         .static_instance_id()"
    } else {
        "no instance id for member ids: set POD_IP (or POD_NAME), or call .instance_id()"
    })]
    NoInstanceId {
        /// Whether static membership was asked for.
        static_membership: bool,
    },
    /// The data Redis URL(s) are invalid.
    #[error("{0}")]
    DataRedis(String),
    /// The Redis Sentinel settings are incomplete or invalid.
    #[error("{0}")]
    Sentinel(String),
    /// The app has no listener.
    #[error(
        "no listeners: annotate an async fn with #[stream_listener] or add one with .listener()"
    )]
    NoListeners,
    /// Two listeners have one name.
    #[error(
        "two listeners are named {0:?}: give one a distinct name \
         (#[stream_listener(name = \"…\")] or .name())"
    )]
    DuplicateListener(String),
    /// A listener's concurrency is 0.
    #[error("listener {0}: concurrency must be at least 1")]
    ZeroConcurrency(String),
    /// A group, stream or member id is not a valid name (SPEC §1).
    #[error("listener {listener}: {reason}")]
    InvalidName {
        /// The listener.
        listener: String,
        /// `group`, `stream` or `member`.
        kind: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A listener's handler asks for a [`crate::Data`] type the app was never given
    /// ([`crate::ConsumerAppBuilder::data`]).
    #[error(
        "listener {listener}: its handler takes Data<{type_name}>, but the app was given no \
         {type_name}: add .data(value) to the ConsumerApp builder"
    )]
    MissingData {
        /// The listener's name.
        listener: String,
        /// The missing type.
        type_name: &'static str,
    },
    /// A stream routes with a hash this client does not know.
    #[error("stream {stream} routes with {hash:?}; this client only knows {known}")]
    UnknownHash {
        /// The stream.
        stream: String,
        /// The hash its routing names.
        hash: String,
        /// The hash this client implements.
        known: &'static str,
    },
}

/// The outcome of one failed call to the coordinator. Cloneable: a failed batched heartbeat
/// request (`POST /v1/heartbeats`) fails every heartbeat it carried with the same error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// The coordinator answered with a SPEC error body.
    #[error("{code} (HTTP {status}) from {url}: {message}")]
    Api {
        /// The coordinator that answered.
        url: String,
        /// HTTP status.
        status: u16,
        /// The SPEC error code.
        code: ErrorCode,
        /// The human-readable message.
        message: String,
        /// When a retry may succeed, how long until then (ms), if the coordinator said.
        retry_after_ms: Option<u64>,
    },
    /// The coordinator answered something that is not the expected JSON.
    #[error("unexpected answer (HTTP {status}) from {url}: {body}")]
    Unexpected {
        /// The coordinator that answered.
        url: String,
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The coordinator could not be reached (connection refused, timeout, reset).
    #[error("cannot reach the coordinator at {url}: {source}")]
    Transport {
        /// The coordinator tried.
        url: String,
        /// The HTTP client's error (shared by every heartbeat of a failed batch).
        source: std::sync::Arc<reqwest::Error>,
    },
}

impl CoordinatorError {
    /// The SPEC error code, when the coordinator answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CoordinatorError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the same request may succeed later (or on another coordinator): transport
    /// errors, 5xx, 429 and the retryable SPEC codes.
    pub fn is_retryable(&self) -> bool {
        match self {
            CoordinatorError::Api { code, .. } => code.is_retryable(),
            CoordinatorError::Unexpected { status, .. } => *status >= 500 || *status == 429,
            CoordinatorError::Transport { .. } => true,
        }
    }

    /// When the coordinator said a retry may succeed, how long until then.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            CoordinatorError::Api { retry_after_ms, .. } => {
                retry_after_ms.map(std::time::Duration::from_millis)
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
        }
    }
}
