//! The producer's routing cache: each stream's shard layout, refreshed in the background when
//! it is older than the refresh interval, and at once after an error.

use crate::coordinator::CoordinatorClient;
use crate::error::ClientError;
use rsc_protocol::RoutingResponse;
use rsc_protocol::routing::{HASH_NAME, shard_for_key};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tracing::{info, warn};

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
            return Err(ClientError::Config(format!(
                "stream {} routes with {:?}; this client only knows {HASH_NAME}",
                r.stream, r.hash
            )));
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

    /// The shard a message goes to: the SPEC §3 hash of its key, or round-robin (`seq`) for
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
}

/// Routing of every stream the producer wrote to.
pub(crate) struct RoutingCache {
    coord: CoordinatorClient,
    refresh_every: Duration,
    entries: RwLock<HashMap<String, Cached>>,
    refreshes: AtomicU64,
}

impl RoutingCache {
    pub(crate) fn new(coord: CoordinatorClient, refresh_every: Duration) -> Self {
        RoutingCache {
            coord,
            refresh_every,
            entries: RwLock::new(HashMap::new()),
            refreshes: AtomicU64::new(0),
        }
    }

    /// The routing of `stream`: from the cache (refreshing it in the background when old or
    /// marked stale), or fetched now the first time.
    pub(crate) async fn get(self: &Arc<Self>, stream: &str) -> Result<Arc<Routing>, ClientError> {
        let hit = {
            let map = self.entries.read().unwrap_or_else(|p| p.into_inner());
            map.get(stream).map(|c| {
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

    /// Fetches the routing now and caches it.
    pub(crate) async fn fetch(&self, stream: &str) -> Result<Arc<Routing>, ClientError> {
        let r = self.coord.routing(stream, Duration::from_secs(5)).await?;
        let routing = Arc::new(Routing::from_response(r)?);
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let mut map = self.entries.write().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(stream) {
            Some(c) => {
                if c.routing.routing_epoch != routing.routing_epoch {
                    info!(%stream, from = c.routing.routing_epoch, to = routing.routing_epoch,
                        shard_count = routing.shard_count, "routing epoch changed");
                }
                c.routing = routing.clone();
                c.fetched = Instant::now();
                c.stale.store(false, Ordering::Relaxed);
            }
            None => {
                map.insert(
                    stream.to_owned(),
                    Cached {
                        routing: routing.clone(),
                        fetched: Instant::now(),
                        refreshing: Arc::new(AtomicBool::new(false)),
                        stale: Arc::new(AtomicBool::new(false)),
                    },
                );
            }
        }
        Ok(routing)
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
        let coord = CoordinatorClient::new(vec!["http://127.0.0.1:1".into()], None);
        let cache = Arc::new(RoutingCache::new(coord, Duration::from_secs(1)));
        assert!(cache.get("s").await.is_err());
        assert_eq!(cache.refreshes(), 0);
    }
}
