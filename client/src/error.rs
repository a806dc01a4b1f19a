//! The client's errors: [`ClientError`] for everything the framework does, and
//! [`CoordinatorError`] (from `rsc-api`) for one call to the coordinator.

pub use rsc_api::{CoordinatorError, ErrorKind as CoordinatorErrorKind};

/// A boxed error: what a [`crate::HandlerError`] carries and a codec returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of the client framework (configuration, Redis, coordinator, encoding).
///
/// Classify it with [`is_timeout`](Self::is_timeout) and [`is_retriable`](Self::is_retriable)
/// (which ask the cause: the Redis error, the [`CoordinatorError`]) rather than by its
/// message; the cause is also its [`source`](std::error::Error::source). A message never
/// repeats its source's (so `anyhow`'s `Error: … Caused by: …` prints each once): log the
/// whole chain with [`ClientError::chain`], or anyhow's `{:#}`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The configuration is incomplete or invalid: which setting, and what to do.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A Redis command failed.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// The data Redis did not answer: the connection was refused, dropped, or timed out.
    #[error("the data Redis at {url} does not answer")]
    DataRedisUnreachable {
        /// Its URL(s), any password hidden (behind Sentinel: the master's name and the
        /// sentinels).
        url: String,
        /// What the connection said.
        #[source]
        source: redis::RedisError,
    },
    /// Strict fencing: Redis refused this member's owner token for the shard (it moved to
    /// another member); the acknowledgement did not land and the entry will be handled again.
    #[error("shard {shard_key} belongs to another member now: the acknowledgement was refused")]
    Fenced {
        /// The shard key.
        shard_key: String,
    },
    /// Ordered resharding (PROTOCOL §15): the shard refused the write because the producer's
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
    /// A publish could not be delivered within the producer's
    /// [`crate::producer::ProducerBuilder::delivery_timeout`]: the coordinator kept
    /// answering that the stream does not exist (deleted, or lost with the metadata store
    /// and not restored, PROTOCOL §2.3), or could not be reached. Nothing was written.
    #[error("stream {stream}: not delivered within the delivery timeout of {timeout:?}")]
    DeliveryTimeout {
        /// The stream.
        stream: String,
        /// The producer's delivery timeout.
        timeout: std::time::Duration,
        /// The last answer (e.g. `STREAM_NOT_FOUND`).
        #[source]
        source: Box<ClientError>,
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
    /// An earlier publish of this idempotent producer to the same shard failed, and this
    /// one, refused or not yet written there, must not land after it (per-key order with
    /// several publishes in flight, PROTOCOL §21): nothing of this publish is written to
    /// that shard (its records on other shards may be, as after any failed publish).
    /// Publishing again is a new publish (on a new producer id).
    #[error(
        "stream {stream}: an earlier publish to {shard_key} failed; this one was not written after it"
    )]
    EarlierPublishFailed {
        /// The stream.
        stream: String,
        /// The shard key the earlier publish failed on.
        shard_key: String,
    },
    /// A call to the coordinator failed.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// A payload could not be encoded as JSON.
    #[error("payload encoding as JSON")]
    Encode(#[from] serde_json::Error),
    /// A payload could not be encoded with a codec (see [`crate::codec`]).
    #[error("payload encoding as {content_type}")]
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
    /// The ops endpoints (`ConsumerAppBuilder::ops`, feature `ops`) cannot listen on their
    /// address.
    #[error("ops endpoints on {addr}")]
    OpsListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why not.
        source: std::io::Error,
    },
    /// A member was refused by the coordinator in a way retrying cannot fix (bad token,
    /// missing scope, invalid request): the listener stopped.
    #[error("member {member} of group {group} stopped")]
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
    /// An environment variable holds a value of the wrong kind.
    #[error("{name}={value:?}: expected {expected}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// The Redis Sentinel settings are incomplete or invalid.
    #[error("{0}")]
    Sentinel(String),
    /// A listener setting from the environment or the configuration file (GUIDE
    /// "Configuration outside the code") has a value of the wrong kind, or names no listener
    /// of the app.
    #[error("{setting}={value:?}: expected {expected}")]
    InvalidSetting {
        /// Where it was read: the variable (`RSC_LISTENER_BILLING_CONCURRENCY`) or the file
        /// and key (`rsc.toml: listeners.billing.concurrency`).
        setting: String,
        /// Its value, as written.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// The configuration file (`RSC_CONFIG_FILE`) cannot be read or is not valid TOML.
    #[error("configuration file {path}: {reason}")]
    ConfigFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The metrics recorder of the ops endpoints cannot be installed (the program installed
    /// another one first).
    #[error("metrics recorder: {0}")]
    Metrics(String),
    /// The TLS files of the data Redis cannot be used (unreadable, not PEM, a certificate
    /// without its key, …).
    #[error("data Redis TLS (RSC_REDIS_TLS_CA / RSC_REDIS_TLS_CERT / RSC_REDIS_TLS_KEY): {0}")]
    Tls(String),
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
    /// A group, stream or member id is not a valid name (PROTOCOL §1).
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

/// An error's message and every cause below it, `: `-separated, each once: a cause whose
/// text the message so far already ends with (redis-rs repeats an I/O error's text in its
/// own; `"db: {0}"` over its own source) is not written again.
pub(crate) fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

impl ClientError {
    /// The message and every cause below it, `: `-separated (as anyhow's `{:#}`), each once
    /// (redis-rs repeats an I/O error's text in its own): for logs.
    pub fn chain(&self) -> String {
        chain_text(self)
    }

    /// Whether the operation gave up because Redis or the coordinator did not answer in
    /// time.
    pub fn is_timeout(&self) -> bool {
        match self {
            ClientError::Redis(e) | ClientError::DataRedisUnreachable { source: e, .. } => {
                e.is_timeout()
            }
            ClientError::Coordinator(e) | ClientError::MemberRejected { source: e, .. } => {
                e.is_timeout()
            }
            _ => false,
        }
    }

    /// Whether the same operation may succeed if tried again later: a Redis error that
    /// redis-rs would retry (a dropped connection, a failover, `TRYAGAIN`, a cluster
    /// redirect), a retriable [`CoordinatorError`], a stale routing (the coordinator may
    /// publish the new one) or a write the replicas did not confirm in time (mind that
    /// publishing again may write it twice). Configuration, encoding and fencing errors are
    /// not.
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Redis(e) => {
                !matches!(e.retry_method(), redis::RetryMethod::NoRetry) || e.is_timeout()
            }
            ClientError::Coordinator(e) => e.is_retriable(),
            ClientError::StaleRouting { .. }
            | ClientError::NotReplicated { .. }
            | ClientError::EarlierPublishFailed { .. }
            | ClientError::DataRedisUnreachable { .. } => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_message_repeats_its_cause_and_the_chain_has_each_once() {
        let refused = || redis::RedisError::from(std::io::Error::other("refused"));
        let cases = [
            ClientError::Redis(refused()),
            ClientError::DataRedisUnreachable {
                url: "redis://r:6379".into(),
                source: refused(),
            },
            ClientError::MemberRejected {
                group: "g".into(),
                member: "m".into(),
                source: CoordinatorError::Unexpected {
                    url: "http://c".into(),
                    status: 400,
                    body: "refused".into(),
                },
            },
            ClientError::Config(ConfigError::NoCoordinator),
        ];
        for e in cases {
            let mut messages = vec![e.to_string()];
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                messages.push(c.to_string());
                cause = c.source();
            }
            // (Below the first cause, redis-rs repeats an I/O error in its own message.)
            if let [ours, cause, ..] = &messages[..]
                && !matches!(e, ClientError::Redis(_))
            {
                assert!(
                    !ours.contains(cause.as_str()),
                    "{messages:?} repeats its cause"
                );
            }
            let chain = e.chain();
            assert!(
                messages
                    .iter()
                    .all(|m| chain.matches(m.as_str()).count() == 1),
                "{chain:?} has each of {messages:?} once"
            );
        }
    }

    #[test]
    fn redis_errors_are_classified_by_redis_rs() {
        let io = |kind| ClientError::Redis(redis::RedisError::from(std::io::Error::new(kind, "x")));
        let timeout = io(std::io::ErrorKind::TimedOut);
        assert!(timeout.is_timeout() && timeout.is_retriable());
        let reset = io(std::io::ErrorKind::ConnectionReset);
        assert!(!reset.is_timeout() && reset.is_retriable());
        let denied = io(std::io::ErrorKind::PermissionDenied);
        assert!(!denied.is_retriable());
        let fenced = ClientError::Fenced {
            shard_key: "s:0".into(),
        };
        assert!(!fenced.is_retriable() && !fenced.is_timeout());
    }

    #[test]
    fn coordinator_errors_delegate() {
        let e = ClientError::Coordinator(CoordinatorError::Api {
            url: "http://c/v1/streams/s/routing".into(),
            status: 503,
            code: rsc_protocol::ErrorCode::StoreUnavailable,
            message: "m".into(),
            retry_after_ms: None,
        });
        assert!(e.is_retriable() && !e.is_timeout());
        let bad = ClientError::Coordinator(CoordinatorError::InvalidUrl("x".into()));
        assert!(!bad.is_retriable());
    }
}
