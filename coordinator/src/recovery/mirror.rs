//! The recovery copy in the data Redis (PROTOCOL §2.2 `P:recovery:groups`,
//! `P:recovery:streams`), and the store decorator that keeps it up to date.

use super::copy::{GroupCopy, StreamCopy};
use crate::fencing::FencingError;
use crate::store::{LockResource, MetadataStore, StoreError, StoreLayer, Stored};
use rsc_redis::{Conn, LazyRedis};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long this process trusts that the copy still holds what it last wrote for a group:
/// past it, the next write of the group's document writes the copy again even when
/// unchanged (another coordinator may have written an older state meanwhile).
const TRUST_WRITTEN: Duration = Duration::from_secs(60);

/// How often failed copy writes are retried.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The recovery copy: one hash of group copies and one of stream copies, in the data Redis.
pub struct RecoveryCopy {
    redis: LazyRedis,
    groups: String,
    streams: String,
    timeout: Duration,
    /// What this process last wrote per group, and when.
    written: Mutex<HashMap<String, (GroupCopy, Instant)>>,
    /// Documents whose copy could not be written: the retry task copies them from the store.
    failed: Mutex<BTreeSet<Pending>>,
}

/// A document whose copy is owed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Pending {
    Group(String),
    Stream(String),
}

impl std::fmt::Debug for RecoveryCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: do not print it.
        f.debug_struct("RecoveryCopy")
            .field("groups", &self.groups)
            .field("streams", &self.streams)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

macro_rules! within {
    ($timeout:expr, $doing:expr, $call:expr $(,)?) => {{
        let timeout: Duration = $timeout;
        let doing: &'static str = $doing;
        match tokio::time::timeout(timeout, $call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(FencingError::Redis { doing, source: e }),
            Err(_) => Err(FencingError::Timeout { doing, timeout }),
        }
    }};
}

impl RecoveryCopy {
    /// The copy in data Redis `redis` under key prefix `prefix`; each call fails past
    /// `timeout`.
    pub fn new(redis: LazyRedis, prefix: &str, timeout: Duration) -> Self {
        RecoveryCopy {
            redis,
            groups: format!("{prefix}:recovery:groups"),
            streams: format!("{prefix}:recovery:streams"),
            timeout,
            written: Mutex::default(),
            failed: Mutex::default(),
        }
    }

    async fn connection(&self) -> Result<Conn, FencingError> {
        within!(self.timeout, "connecting", self.redis.get())
    }

    async fn hset(&self, key: &str, field: &str, json: String) -> Result<(), FencingError> {
        let mut c = self.connection().await?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(key).arg(field).arg(json);
        let call = cmd.query_async::<i64>(&mut c);
        within!(self.timeout, "writing the recovery copy", call)?;
        Ok(())
    }

    async fn hget(&self, key: &str, field: &str) -> Result<Option<String>, FencingError> {
        let mut c = self.connection().await?;
        let mut cmd = redis::cmd("HGET");
        cmd.arg(key).arg(field);
        let call = cmd.query_async::<Option<String>>(&mut c);
        within!(self.timeout, "reading the recovery copy", call)
    }

    async fn hkeys(&self, key: &str) -> Result<Vec<String>, FencingError> {
        let mut c = self.connection().await?;
        let mut cmd = redis::cmd("HKEYS");
        cmd.arg(key);
        let call = cmd.query_async::<Vec<String>>(&mut c);
        within!(self.timeout, "listing the recovery copy", call)
    }

    /// Writes `copy` (unless this process wrote the same less than a minute ago).
    pub async fn write_group(&self, copy: &GroupCopy) -> Result<(), FencingError> {
        if self.recently_written(copy) {
            return Ok(());
        }
        let json = serde_json::to_string(copy).expect("a group copy encodes");
        self.hset(&self.groups, &copy.group, json).await?;
        self.lock_written()
            .insert(copy.group.clone(), (copy.clone(), Instant::now()));
        metrics::counter!("rsc_store_recovery_copy_writes_total", "kind" => "group").increment(1);
        Ok(())
    }

    /// Forgets what this process wrote for `group`: its next copy is written even if equal
    /// (the copy was found missing).
    pub fn forget_written(&self, group: &str) {
        self.lock_written().remove(group);
    }

    fn recently_written(&self, copy: &GroupCopy) -> bool {
        self.lock_written()
            .get(&copy.group)
            .is_some_and(|(c, at)| c.same_as(copy) && at.elapsed() < TRUST_WRITTEN)
    }

    fn lock_written(&self) -> std::sync::MutexGuard<'_, HashMap<String, (GroupCopy, Instant)>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `copy`.
    pub async fn write_stream(&self, copy: &StreamCopy) -> Result<(), FencingError> {
        let json = serde_json::to_string(copy).expect("a stream copy encodes");
        self.hset(&self.streams, &copy.doc.stream, json).await?;
        metrics::counter!("rsc_store_recovery_copy_writes_total", "kind" => "stream").increment(1);
        Ok(())
    }

    /// Removes `group`'s copy (before its document is deleted).
    pub async fn remove_group(&self, group: &str) -> Result<(), FencingError> {
        self.lock_written().remove(group);
        let mut c = self.connection().await?;
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(&self.groups).arg(group);
        let call = cmd.query_async::<i64>(&mut c);
        within!(self.timeout, "removing a recovery copy", call)?;
        Ok(())
    }

    /// `group`'s copy, if any. A copy that cannot be decoded is reported and treated as
    /// absent (never restored from).
    pub async fn group(&self, group: &str) -> Result<Option<GroupCopy>, FencingError> {
        Ok(self
            .hget(&self.groups, group)
            .await?
            .and_then(|json| decode(&self.groups, group, &json)))
    }

    /// `stream`'s copy, if any (undecodable: as [`Self::group`]).
    pub async fn stream(&self, stream: &str) -> Result<Option<StreamCopy>, FencingError> {
        Ok(self
            .hget(&self.streams, stream)
            .await?
            .and_then(|json| decode(&self.streams, stream, &json)))
    }

    /// The groups the copy holds.
    pub async fn group_names(&self) -> Result<Vec<String>, FencingError> {
        self.hkeys(&self.groups).await
    }

    /// The streams the copy holds.
    pub async fn stream_names(&self) -> Result<Vec<String>, FencingError> {
        self.hkeys(&self.streams).await
    }

    /// Every stream copy (one that cannot be decoded is left out, as [`Self::group`]).
    pub async fn streams(&self) -> Result<Vec<StreamCopy>, FencingError> {
        let mut c = self.connection().await?;
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&self.streams);
        let call = cmd.query_async::<Vec<(String, String)>>(&mut c);
        let all = within!(self.timeout, "reading the recovery copy", call)?;
        Ok(all
            .into_iter()
            .filter_map(|(name, json)| decode(&self.streams, &name, &json))
            .collect())
    }

    fn owe(&self, pending: Pending, e: &dyn std::fmt::Display) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        let kind = match &pending {
            Pending::Group(_) => "group",
            Pending::Stream(_) => "stream",
        };
        metrics::counter!("rsc_store_recovery_copy_failures_total", "kind" => kind).increment(1);
        warn!(document = ?pending, error = %e, "could not write the recovery copy (PROTOCOL §2.3); retrying");
        failed.insert(pending);
        metrics::gauge!("rsc_store_recovery_copy_owed").set(failed.len() as f64);
    }

    /// Retries the copies that could not be written, from what `store` holds now, every
    /// second, for ever (a document the store no longer holds is dropped from the list: its
    /// copy, if any, is what a restore needs).
    pub async fn run_retries(self: Arc<Self>, store: Arc<dyn MetadataStore>) {
        let mut tick = tokio::time::interval(RETRY_EVERY);
        loop {
            tick.tick().await;
            let owed: Vec<Pending> = {
                let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                std::mem::take(&mut *failed).into_iter().collect()
            };
            for p in owed {
                match self.copy_from(store.as_ref(), &p).await {
                    Ok(()) => info!(document = ?p, "recovery copy written after a failure"),
                    Err(e) => self.owe(p, &e),
                }
            }
            let owed = self.failed.lock().unwrap_or_else(|p| p.into_inner()).len();
            metrics::gauge!("rsc_store_recovery_copy_owed").set(owed as f64);
        }
    }
}

impl RecoveryCopy {
    /// Copies the document `p` names as `store` holds it now (nothing when it holds none).
    async fn copy_from(&self, store: &dyn MetadataStore, p: &Pending) -> Result<(), String> {
        match p {
            Pending::Group(g) => {
                // Under the group's lock, as a delete (which removes the copy first): a copy
                // written here never outlives a delete.
                let resource = LockResource::Group(g.clone());
                let _lock = store.lock(&resource).await.map_err(|e| e.to_string())?;
                match store.load_group(g).await.map_err(|e| e.to_string())? {
                    Some(v) => self.write_group(&GroupCopy::of(&v.doc, v.revision)).await,
                    None => Ok(()),
                }
            }
            Pending::Stream(s) => match store.load_stream(s).await.map_err(|e| e.to_string())? {
                Some(v) => {
                    let copy = StreamCopy {
                        doc: v.doc,
                        revision: v.revision,
                    };
                    self.write_stream(&copy).await
                }
                None => Ok(()),
            },
        }
        .map_err(|e| e.to_string())
    }
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, field: &str, json: &str) -> Option<T> {
    match serde_json::from_str(json) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(key, field, error = %e, "a recovery copy cannot be decoded: it is ignored");
            metrics::counter!("rsc_store_recovery_copy_corrupt_total").increment(1);
            None
        }
    }
}

/// The store decorator that writes the recovery copy after every committed write of a
/// stream document and every write of a group document that changed its copy, and removes
/// a group's copy before its document is deleted (a failure there refuses the delete, so
/// that no deleted group is ever restored).
#[derive(Debug, Clone)]
pub struct CopyLayer(pub Arc<RecoveryCopy>);

impl StoreLayer for CopyLayer {
    async fn stored(&self, write: Stored<'_>) {
        match write {
            Stored::Group(doc, revision) => {
                let copy = GroupCopy::of(doc, revision);
                if let Err(e) = self.0.write_group(&copy).await {
                    self.0.owe(Pending::Group(doc.group.clone()), &e);
                }
            }
            Stored::Stream(doc, revision) => {
                let copy = StreamCopy {
                    doc: doc.clone(),
                    revision,
                };
                if let Err(e) = self.0.write_stream(&copy).await {
                    self.0.owe(Pending::Stream(doc.stream.clone()), &e);
                }
            }
        }
    }

    async fn deleting(&self, group: &str) -> Result<(), StoreError> {
        self.0.remove_group(group).await.map_err(|e| {
            StoreError::unavailable(format!(
                "could not remove the recovery copy of group {group} before deleting it: {e}"
            ))
        })
    }
}
