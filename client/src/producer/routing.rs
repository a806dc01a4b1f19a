//! The producer's routing cache: each stream's shard layout, refreshed in the background.
//!
//! A background task per stream fetches the routing every refresh interval, whether or not
//! the producer publishes, so a routing-epoch change (a reshard) reaches the producer within
//! one refresh interval plus one request. A failed write marks the routing stale: the next
//! publish triggers a refresh at once. A stream not published to for [`IDLE_FORGET`] is
//! dropped from the cache (its task stops) and fetched again on its next use.

use crate::error::ClientError;
use rsc_api::CoordinatorClient;
use rsc_protocol::RoutingResponse;
use rsc_protocol::routing::{HASH_NAME, shard_for_key};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long a stream's routing is kept (and refreshed) without any publish to it.
pub(crate) const IDLE_FORGET: Duration = Duration::from_secs(300);

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
}

/// Routing of every stream the producer wrote to.
pub(crate) struct RoutingCache {
    coord: CoordinatorClient,
    refresh_every: Duration,
    entries: RwLock<HashMap<String, Cached>>,
    refreshes: AtomicU64,
    created: Instant,
}

impl RoutingCache {
    pub(crate) fn new(coord: CoordinatorClient, refresh_every: Duration) -> Self {
        RoutingCache {
            coord,
            refresh_every,
            entries: RwLock::new(HashMap::new()),
            refreshes: AtomicU64::new(0),
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
                c.used_ms.store(self.now_ms(), Ordering::Relaxed);
                let old =
                    c.fetched.elapsed() >= self.refresh_every || c.stale.load(Ordering::Relaxed);
                (c.routing.clone(), old, c.refreshing.clone())
            })
        };
        match hit {
            Some((routing, old, refreshing)) => {
                if old && !refreshing.swap(true, Ordering::AcqRel) {
                    let this = self.clone();
                    let stream = stream.to_owned();
                    tokio::spawn(async move {
                        if let Err(e) = this.fetch(&stream).await {
                            warn!(%stream, error = %e, "routing refresh failed; using the cached layout");
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
        let refreshing = {
            let map = self.entries.read().unwrap_or_else(|p| p.into_inner());
            match map.get(stream) {
                Some(c) => c.refreshing.clone(),
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
            let mut failures = 0u32;
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { return };
                if this.forget_if_idle(&stream) {
                    debug!(%stream, "routing not used for a while: no longer refreshed");
                    return;
                }
                if refreshing.swap(true, Ordering::AcqRel) {
                    continue;
                }
                match this.fetch_once(&stream).await {
                    Ok(_) => failures = 0,
                    Err(e) => {
                        failures += 1;
                        if failures == 1 || failures.is_multiple_of(30) {
                            warn!(%stream, error = %e, failures, "routing refresh failed; using the cached layout");
                        }
                    }
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

    /// Fetches the routing and caches it; `true` when the stream was not cached.
    async fn fetch_once(&self, stream: &str) -> Result<(Arc<Routing>, bool), ClientError> {
        let r = self.coord.routing(stream, Duration::from_secs(5)).await?;
        let routing = Arc::new(Routing::from_response(r)?);
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let mut map = self.entries.write().unwrap_or_else(|p| p.into_inner());
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
