//! The producer's routing cache: each stream's shard layout, refreshed in the background.
//!
//! A background task per stream fetches the routing every refresh interval, whether or not
//! the producer publishes, so a routing-epoch change (a reshard) reaches the producer within
//! one refresh interval plus one request. A failed write marks the routing stale: the next
//! publish triggers a refresh at once. After a failed refresh the next one waits (50 ms,
//! doubling up to [`MAX_RETRY_DELAY`]), and only the first failure of a run and every 30th
//! after it are logged as warnings, so a producer that publishes while the coordinator is
//! down neither floods it with requests nor floods its log. A stream not published to for
//! [`IDLE_FORGET`] is dropped from the cache (its task stops) and fetched again on its next
//! use.

use crate::error::ClientError;
use rsc_api::CoordinatorClient;
use rsc_protocol::RoutingResponse;
use rsc_protocol::routing::{HASH_NAME, shard_for_key};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long a stream's routing is kept (and refreshed) without any publish to it.
pub(crate) const IDLE_FORGET: Duration = Duration::from_secs(300);

/// The longest a publish-triggered refresh waits after failed ones.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(1);

/// How a stream's refreshes have been going, shared by the background task and the
/// publish-triggered refreshes.
#[derive(Debug, Default)]
struct RefreshHealth {
    /// Failed refreshes in a row.
    failures: AtomicU32,
    /// No publish-triggered refresh before this (ms since the cache was created).
    retry_at_ms: AtomicU64,
}

/// A stream's layout as the producer routes over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// The stream.
    pub stream: String,
    /// Shards producers write to.
    pub shard_count: u32,
    /// Bumped by the coordinator on every layout change.
    pub routing_epoch: u64,
    /// The shard keys, by index.
    pub shard_keys: Vec<String>,
}

impl Routing {
    fn from_response(r: RoutingResponse) -> Result<Self, ClientError> {
        if r.hash != HASH_NAME {
            return Err(crate::error::ConfigError::UnknownHash {
                stream: r.stream,
                hash: r.hash,
                known: HASH_NAME,
            }
            .into());
        }
        let shard_keys = if r.shard_keys.len() == r.shard_count as usize {
            r.shard_keys
        } else {
            (0..r.shard_count)
                .map(|i| rsc_protocol::routing::shard_key(&r.stream, i))
                .collect()
        };
        Ok(Routing {
            stream: r.stream,
            shard_count: r.shard_count.max(1),
            routing_epoch: r.routing_epoch,
            shard_keys,
        })
    }

    /// The shard a message goes to: the PROTOCOL §3 hash of its key, or round-robin (`seq`) for
    /// messages without a key.
    pub fn shard_for(&self, key: Option<&[u8]>, seq: u64) -> u32 {
        match key {
            Some(k) => shard_for_key(k, self.shard_count),
            None => (seq % u64::from(self.shard_count)) as u32,
        }
    }
}

struct Cached {
    routing: Arc<Routing>,
    fetched: Instant,
    refreshing: Arc<AtomicBool>,
    stale: Arc<AtomicBool>,
    /// When it was last used, in ms since the cache was created.
    used_ms: Arc<AtomicU64>,
    health: Arc<RefreshHealth>,
}

/// Routing of every stream the producer wrote to.
pub(crate) struct RoutingCache {
    coord: CoordinatorClient,
    refresh_every: Duration,
    entries: RwLock<HashMap<String, Cached>>,
    refreshes: AtomicU64,
    /// Routing requests sent (answered or not).
    attempts: AtomicU64,
    created: Instant,
}

impl RoutingCache {
    pub(crate) fn new(coord: CoordinatorClient, refresh_every: Duration) -> Self {
        RoutingCache {
            coord,
            refresh_every,
            entries: RwLock::new(HashMap::new()),
            refreshes: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            created: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.created.elapsed().as_millis() as u64
    }

    /// The routing of `stream`: from the cache (refreshing it in the background when old or
    /// marked stale), or fetched now the first time.
    pub(crate) async fn get(self: &Arc<Self>, stream: &str) -> Result<Arc<Routing>, ClientError> {
        let hit = {
            let map = self.entries.read().unwrap_or_else(|p| p.into_inner());
            map.get(stream).map(|c| {
                let now = self.now_ms();
                c.used_ms.store(now, Ordering::Relaxed);
                let old = (c.fetched.elapsed() >= self.refresh_every
                    || c.stale.load(Ordering::Relaxed))
                    && now >= c.health.retry_at_ms.load(Ordering::Relaxed)
                    && !c.refreshing.swap(true, Ordering::AcqRel);
                // Only the publish that starts a refresh takes the handles it needs.
                let refresh = old.then(|| (c.refreshing.clone(), c.health.clone()));
                (c.routing.clone(), refresh)
            })
        };
        match hit {
            Some((routing, refresh)) => {
                if let Some((refreshing, health)) = refresh {
                    let this = self.clone();
                    let stream = stream.to_owned();
                    tokio::spawn(async move {
                        if let Err(e) = this.fetch(&stream).await {
                            this.refresh_failed(&stream, &health, &e);
                        }
                        refreshing.store(false, Ordering::Release);
                    });
                }
                Ok(routing)
            }
            None => self.fetch(stream).await,
        }
    }

    /// Refreshes `stream` every refresh interval until the cache is dropped or the stream
    /// has not been used for [`IDLE_FORGET`]. One task per stream (the first fetch starts it).
    fn spawn_refresher(self: &Arc<Self>, stream: &str) {
        let (refreshing, health) = {
            let map = self.entries.read().unwrap_or_else(|p| p.into_inner());
            match map.get(stream) {
                Some(c) => (c.refreshing.clone(), c.health.clone()),
                None => return,
            }
        };
        let weak = Arc::downgrade(self);
        let every = self.refresh_every.max(Duration::from_millis(10));
        let stream = stream.to_owned();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { return };
                if this.forget_if_idle(&stream) {
                    debug!(%stream, "routing not used for a while: no longer refreshed");
                    return;
                }
                if this.now_ms() < health.retry_at_ms.load(Ordering::Relaxed)
                    || refreshing.swap(true, Ordering::AcqRel)
                {
                    continue;
                }
                if let Err(e) = this.fetch_once(&stream).await {
                    this.refresh_failed(&stream, &health, &e);
                }
                refreshing.store(false, Ordering::Release);
            }
        });
    }

    /// Drops `stream` from the cache when unused for [`IDLE_FORGET`]; `true` when dropped.
    fn forget_if_idle(&self, stream: &str) -> bool {
        let now = self.now_ms();
        let mut map = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let idle = map.get(stream).is_none_or(|c| {
            now.saturating_sub(c.used_ms.load(Ordering::Relaxed)) >= IDLE_FORGET.as_millis() as u64
        });
        if idle {
            map.remove(stream);
        }
        idle
    }

    /// Fetches the routing now and caches it; the first fetch of a stream starts its
    /// background refresh.
    pub(crate) async fn fetch(self: &Arc<Self>, stream: &str) -> Result<Arc<Routing>, ClientError> {
        let (routing, inserted) = self.fetch_once(stream).await?;
        if inserted {
            self.spawn_refresher(stream);
        }
        Ok(routing)
    }

    /// After a failed refresh: the next publish-triggered one waits (50 ms doubling to
    /// [`MAX_RETRY_DELAY`]); the first failure of a run and every 30th are warnings.
    fn refresh_failed(&self, stream: &str, health: &RefreshHealth, e: &ClientError) {
        if let ClientError::Coordinator(c) = e
            && c.code() == Some(rsc_protocol::ErrorCode::StreamNotFound)
        {
            // Gone (deleted, or lost with the metadata store and not restored): publishes
            // stop writing to it and wait for it up to their delivery timeout.
            warn!(%stream, error = %e, "the stream no longer exists: its cached routing is dropped");
            self.entries
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(stream);
            return;
        }
        let failures = health.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let delay = Duration::from_millis(50)
            .saturating_mul(1 << (failures - 1).min(10))
            .min(MAX_RETRY_DELAY);
        health
            .retry_at_ms
            .store(self.now_ms() + delay.as_millis() as u64, Ordering::Relaxed);
        metrics::counter!("rsc_client_routing_refresh_failures_total", "stream" => stream.to_owned())
            .increment(1);
        if failures == 1 || failures.is_multiple_of(30) {
            warn!(%stream, error = %e, failures, "routing refresh failed; using the cached layout");
        } else {
            debug!(%stream, error = %e, failures, "routing refresh failed again");
        }
    }

    /// Fetches the routing and caches it; `true` when the stream was not cached.
    async fn fetch_once(&self, stream: &str) -> Result<(Arc<Routing>, bool), ClientError> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let r = self.coord.routing(stream, Duration::from_secs(5)).await?;
        let routing = Arc::new(Routing::from_response(r)?);
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let mut map = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(stream) {
            c.health.failures.store(0, Ordering::Relaxed);
            c.health.retry_at_ms.store(0, Ordering::Relaxed);
        }
        match map.get_mut(stream) {
            Some(c) if c.routing.routing_epoch > routing.routing_epoch => {
                // An answer older than what we have (another coordinator lagging behind).
                debug!(%stream, cached = c.routing.routing_epoch, answered = routing.routing_epoch,
                    "ignoring an older routing epoch");
                c.stale.store(false, Ordering::Relaxed);
                Ok((c.routing.clone(), false))
            }
            Some(c) => {
                if c.routing.routing_epoch != routing.routing_epoch {
                    info!(%stream, from = c.routing.routing_epoch, to = routing.routing_epoch,
                        shard_count = routing.shard_count, "routing epoch changed");
                }
                c.routing = routing.clone();
                c.fetched = Instant::now();
                c.stale.store(false, Ordering::Relaxed);
                Ok((routing, false))
            }
            None => {
                map.insert(
                    stream.to_owned(),
                    Cached {
                        routing: routing.clone(),
                        fetched: Instant::now(),
                        refreshing: Arc::new(AtomicBool::new(false)),
                        stale: Arc::new(AtomicBool::new(false)),
                        used_ms: Arc::new(AtomicU64::new(self.now_ms())),
                        health: Arc::default(),
                    },
                );
                Ok((routing, true))
            }
        }
    }

    /// After a failed write: refresh before long (in the background, on the next publish).
    pub(crate) fn mark_stale(&self, stream: &str) {
        let map = self.entries.read().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(stream) {
            c.stale.store(true, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    pub(crate) fn refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_like_the_protocol_crate() {
        let r = Routing::from_response(RoutingResponse {
            stream: "orders".into(),
            shard_count: 16,
            routing_epoch: 3,
            hash: HASH_NAME.into(),
            shard_keys: (0..16).map(|i| format!("orders:{i}")).collect(),
            resharding: None,
        })
        .unwrap();
        assert_eq!(r.shard_for(Some(b"order-1001"), 0), 11);
        assert_eq!(r.shard_for(None, 17), 1);
        let bad = RoutingResponse {
            stream: "s".into(),
            shard_count: 2,
            routing_epoch: 1,
            hash: "md5-mod".into(),
            shard_keys: vec![],
            resharding: None,
        };
        assert!(Routing::from_response(bad).is_err());
    }

    /// The producer's routing reproduces the independent implementation's known answers.
    #[test]
    fn reproduces_the_routing_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../protocol/tests/routing-vectors.json"))
                .unwrap();
        let mut checked = 0;
        for v in doc["vectors"].as_array().unwrap() {
            let key = v["key"].as_str().unwrap();
            for (count, shard) in v["shards"].as_object().unwrap() {
                let count: u32 = count.parse().unwrap();
                let r = Routing {
                    stream: "s".into(),
                    shard_count: count,
                    routing_epoch: 1,
                    shard_keys: vec![],
                };
                assert_eq!(
                    u64::from(r.shard_for(Some(key.as_bytes()), 0)),
                    shard.as_u64().unwrap(),
                    "{key:?} over {count}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 40);
    }

    /// Answers one routing request (epoch 1, 2 shards) on a loopback port, then closes it:
    /// the coordinator is gone after the first fetch.
    async fn one_answer() -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await.unwrap();
            let body = serde_json::to_string(&RoutingResponse {
                stream: "s".into(),
                shard_count: 2,
                routing_epoch: 1,
                hash: HASH_NAME.into(),
                shard_keys: vec!["s:0".into(), "s:1".into()],
                resharding: None,
            })
            .unwrap();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await.unwrap();
            sock.write_all(body.as_bytes()).await.unwrap();
            // Dropping the listener closes the port: later requests are refused.
        });
        format!("http://{addr}")
    }

    /// Publishing while the coordinator is down: a few refresh requests with growing gaps,
    /// not one per publish.
    #[tokio::test]
    async fn failed_refreshes_back_off() {
        let coord = CoordinatorClient::builder([one_answer().await])
            .build()
            .unwrap();
        let cache = Arc::new(RoutingCache::new(coord, Duration::from_millis(1)));
        let first = cache.get("s").await.expect("first fetch");
        assert_eq!(first.routing_epoch, 1);
        let started = Instant::now();
        let mut calls = 0;
        // At least 300 ms and 100 calls (a loaded machine sleeps longer than 1 ms).
        while started.elapsed() < Duration::from_millis(300) || calls < 100 {
            assert_eq!(
                cache.get("s").await.unwrap().routing_epoch,
                1,
                "cached layout"
            );
            calls += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Without the backoff every call past the 1 ms refresh interval would send one: here
        // 50 + 100 + 200 ms of gaps (and the background task's ticks, which share them).
        let attempts = cache.attempts();
        let took = started.elapsed();
        assert!(attempts <= 12, "{attempts} refresh requests in {took:?}");
    }

    #[tokio::test]
    async fn unreachable_coordinator_is_an_error_not_a_panic() {
        let coord = CoordinatorClient::builder(["http://127.0.0.1:1"])
            .build()
            .unwrap();
        let cache = Arc::new(RoutingCache::new(coord, Duration::from_secs(1)));
        assert!(cache.get("s").await.is_err());
        assert_eq!(cache.refreshes(), 0);
    }
}
