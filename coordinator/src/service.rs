//! The coordinator service: store reads, engine decisions and store writes, in order.
//!
//! Every mutation runs as: take the document's lock, read it with its revision, let the
//! [`crate::engine`] decide, compare-and-set the result. A lost compare-and-set (the lock
//! expired under a slow replica) reruns the whole cycle a bounded number of times and then
//! answers [`ServiceError::Store`] with a conflict [`StoreError`] (`503 STORE_CONFLICT`).
//! Locks are taken stream first, then one group.
//!
//! A steady-state heartbeat (nothing to change, SPEC §5.1) skips all of that: the coordinator
//! keeps the documents it last read or wrote, by revision, and answers from them when
//! [`GroupDoc::steady_heartbeat`] says the heartbeat changes nothing, after one conditional
//! liveness touch that succeeds only while the group and stream documents are still at those
//! revisions ([`MetadataStore::touch_steady`]: one Redis round trip, batched with concurrent
//! heartbeats of the same group; two commands sent together on a cluster, where the two
//! documents live in different slots). Removing a member for silence
//! is committed with the liveness it was based on, so a heartbeat touched in between makes
//! that write lose and rerun (see [`crate::store`], "Liveness").

use crate::clock::Clock;
use crate::engine::{
    EngineError, GroupConfig, GroupDoc, GroupEvent, StreamDoc, group_view, members_to_wake,
    routing_view, stream_view,
};
use crate::fencing::{OwnerTokens, Sealer};
use crate::outage::StoreOutages;
use crate::store::{
    LivenessChange, LockResource, MetadataStore, SteadyTouch, StoreError, TouchOutcome, Versioned,
};
use crate::wake::WakeHub;
use futures::StreamExt;
use rsc_protocol::names::validate_name;
use rsc_protocol::{
    CreateGroupRequest, ErrorCode, FencingMode, GroupView, HeartbeatRequest, HeartbeatResponse,
    LeaveRequest, LeaveResponse, PatchGroupRequest, RoutingResponse, StreamView,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How many due groups one sweep visits at once.
const SWEEP_CONCURRENCY: usize = 16;

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// How long after a reshard completed it may be rolled back (ms).
    pub rollback_window_ms: u64,
    /// How many times a lost compare-and-set is retried before `STORE_CONFLICT`.
    pub cas_retries: u32,
    /// A cached group document unused for this long is dropped (and read again when needed):
    /// half the store's tombstone retention, so that no coordinator still caches a deleted
    /// group when its tombstone is collected and the name may start a new revision sequence.
    pub cache_idle: Duration,
    /// How long a sweep's claim on a due group lasts: if the sweeper dies before it has
    /// rescheduled the group, the group is due again this much later, for any coordinator.
    pub claim_ms: u64,
    /// Most due groups one sweep claims.
    pub sweep_batch: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            rollback_window_ms: 15 * 60 * 1000,
            cas_retries: 5,
            cache_idle: crate::store::TOMBSTONE_RETENTION / 2,
            claim_ms: 2_000,
            sweep_batch: 512,
        }
    }
}

/// Why a service call failed. Each variant maps to one SPEC error code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    /// The protocol refused.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No such group.
    #[error("group {0} does not exist")]
    GroupNotFound(String),
    /// No such stream.
    #[error("stream {0} does not exist")]
    StreamNotFound(String),
    /// The group exists.
    #[error("group {0} already exists")]
    GroupAlreadyExists(String),
    /// Create on an existing stream with another shard count.
    #[error("stream {stream} has {existing} shards, not {requested}")]
    ShardCountMismatch {
        /// Stream.
        stream: String,
        /// Its shard count.
        existing: u32,
        /// What the request said.
        requested: u32,
    },
    /// Delete of a group with members, without force.
    #[error("group {group} has {members} live members; delete with ?force=true to remove them")]
    GroupNotEmpty {
        /// Group.
        group: String,
        /// Live members.
        members: usize,
    },
}

impl ServiceError {
    /// The SPEC error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServiceError::Engine(e) => e.code(),
            ServiceError::Store(e) if e.is_conflict() => ErrorCode::StoreConflict,
            ServiceError::Store(_) => ErrorCode::StoreUnavailable,
            ServiceError::GroupNotFound(_) => ErrorCode::GroupNotFound,
            ServiceError::StreamNotFound(_) => ErrorCode::StreamNotFound,
            ServiceError::GroupAlreadyExists(_) => ErrorCode::GroupAlreadyExists,
            ServiceError::ShardCountMismatch { .. } => ErrorCode::ShardCountMismatch,
            ServiceError::GroupNotEmpty { .. } => ErrorCode::GroupNotEmpty,
        }
    }

    /// When retrying may succeed, how long until then (ms).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ServiceError::Engine(e) => e.retry_after_ms(),
            _ => None,
        }
    }

    fn is_conflict(&self) -> bool {
        matches!(self, ServiceError::Store(e) if e.is_conflict())
    }
}

type Result<T> = std::result::Result<T, ServiceError>;

fn invalid(msg: String) -> ServiceError {
    ServiceError::Engine(EngineError::Invalid(msg))
}

fn check_name(kind: &str, name: &str) -> Result<()> {
    validate_name(kind, name).map_err(invalid)
}

/// The documents this coordinator last read or wrote, by revision: what a steady heartbeat
/// is answered from (after checking the revisions in the store). A group document unused for
/// `idle` is dropped (see [`ServiceConfig::cache_idle`]).
#[derive(Debug)]
struct DocCache {
    groups: Mutex<HashMap<String, CachedGroup>>,
    streams: Mutex<HashMap<String, Arc<Versioned<StreamDoc>>>>,
    /// Deadline-index updates that failed: group → (revision, deadline), retried by the sweep.
    owed: Mutex<HashMap<String, (u64, u64)>>,
    idle: Duration,
}

/// A cached group document and when it was last used.
type CachedGroup = (Arc<Versioned<GroupDoc>>, Instant);

impl DocCache {
    fn new(idle: Duration) -> Self {
        DocCache {
            groups: Mutex::default(),
            streams: Mutex::default(),
            owed: Mutex::default(),
            idle,
        }
    }

    fn group(&self, group: &str) -> Option<Arc<Versioned<GroupDoc>>> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let (doc, used) = groups.get_mut(group)?;
        if used.elapsed() >= self.idle {
            groups.remove(group);
            return None;
        }
        *used = Instant::now();
        Some(doc.clone())
    }

    /// Drops group documents unused for longer than `idle`.
    fn evict_idle(&self) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|_, (_, used)| used.elapsed() < self.idle);
    }

    fn stream(&self, stream: &str) -> Option<Arc<Versioned<StreamDoc>>> {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.get(stream).cloned()
    }

    fn put_group(&self, revision: u64, doc: GroupDoc) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.insert(
            doc.group.clone(),
            (Arc::new(Versioned { revision, doc }), Instant::now()),
        );
    }

    fn put_stream(&self, v: Versioned<StreamDoc>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.insert(v.doc.stream.clone(), Arc::new(v));
    }

    /// Remembers a deadline-index update that failed, for the next sweep to retry.
    fn owe_deadline(&self, group: &str, revision: u64, deadline: u64) {
        let mut owed = self.owed.lock().unwrap_or_else(|p| p.into_inner());
        let entry = owed.entry(group.to_owned()).or_insert((revision, deadline));
        *entry = (entry.0.max(revision), entry.1.min(deadline));
    }

    fn take_owed(&self) -> Vec<(String, u64, u64)> {
        let mut owed = self.owed.lock().unwrap_or_else(|p| p.into_inner());
        owed.drain().map(|(g, (r, d))| (g, r, d)).collect()
    }

    fn forget_group(&self, group: &str) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.remove(group);
    }
}

/// The coordinator: one per process, shared by every HTTP handler and the expiry sweep.
#[derive(Debug, Clone)]
pub struct Coordinator {
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    config: ServiceConfig,
    cache: Arc<DocCache>,
    fencing: Option<Arc<OwnerTokens>>,
    sealer: Option<Arc<Sealer>>,
    /// Store outages seen, so that one does not expire the members it kept silent.
    outages: Arc<Mutex<StoreOutages>>,
    wakes: Option<Arc<WakeHub>>,
}

impl Coordinator {
    /// A coordinator over `store`, telling time by `clock`.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        clock: Arc<dyn Clock>,
        config: ServiceConfig,
    ) -> Self {
        Coordinator {
            store,
            clock,
            cache: Arc::new(DocCache::new(config.cache_idle)),
            config,
            fencing: None,
            sealer: None,
            outages: Arc::default(),
            wakes: None,
        }
    }

    /// Fences producers and records seal positions in the data Redis at every routing-epoch
    /// switch, before the reshard request is answered (ordered resharding, issue 16).
    /// Without it, reshards keep at-least-once but not per-key order.
    pub fn with_sealer(mut self, sealer: Arc<Sealer>) -> Self {
        self.sealer = Some(sealer);
        self
    }

    /// The sealer, when the coordinator knows the data Redis.
    pub fn sealer(&self) -> Option<&Arc<Sealer>> {
        self.sealer.as_ref()
    }

    /// The store answered at `now`: closes an outage if calls were failing.
    fn store_ok(&self, now: u64) {
        let closed = self
            .outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ok(now);
        if let Some(c) = closed {
            info!(
                outage_ms = c.length_ms,
                "metadata store reachable again: sessions are extended by the outage's length \
                 for one session timeout"
            );
            ::metrics::counter!("rsc_store_outages_total").increment(1);
            ::metrics::gauge!("rsc_store_last_outage_seconds").set(c.length_ms as f64 / 1000.0);
        }
    }

    /// The store could not be reached.
    fn store_failed(&self) {
        self.outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .failed();
    }

    /// The time expiry is judged at, for a group with `session_timeout_ms`: `now` set back
    /// by a recent store outage (see [`crate::outage`]). Called after the store answered.
    fn expiry_now(&self, now: u64, session_timeout_ms: u64) -> u64 {
        self.store_ok(now);
        let shift = self
            .outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shift_ms(now, session_timeout_ms);
        now.saturating_sub(shift)
    }

    /// Wakes the members a write concerns through `hub` (the wake-up channels); without it
    /// members learn of changes at their next heartbeat.
    pub fn with_wakeups(mut self, hub: Arc<WakeHub>) -> Self {
        self.wakes = Some(hub);
        self
    }

    /// The wake-up hub, if any.
    pub fn wakeups(&self) -> Option<&Arc<WakeHub>> {
        self.wakes.as_ref()
    }

    /// After a write of `group` succeeded: wakes the members it concerns (all of them when
    /// `after` is `None`: deleted), except `requester`, which gets its answer directly.
    fn wake(
        &self,
        group: &str,
        before: Option<&GroupDoc>,
        after: Option<&GroupDoc>,
        requester: Option<&str>,
    ) {
        let Some(hub) = &self.wakes else { return };
        let mut members = members_to_wake(before, after);
        if let Some(r) = requester {
            members.retain(|m| m != r);
        }
        hub.wake(group, members);
    }

    /// Writes owner tokens of strict-fencing groups to the data Redis through `tokens`
    /// (without it, groups default to lease fencing and `strict` is refused).
    pub fn with_fencing(mut self, tokens: Arc<OwnerTokens>) -> Self {
        self.fencing = Some(tokens);
        self
    }

    /// Checks that a requested fencing mode can be served.
    fn check_fencing(&self, mode: Option<FencingMode>) -> Result<()> {
        if mode == Some(FencingMode::Strict) && self.fencing.is_none() {
            return Err(invalid(
                "fencing \"strict\" needs the data Redis: start the coordinator with --data-redis-url"
                    .into(),
            ));
        }
        Ok(())
    }

    /// With strict fencing, writes the owner tokens of the answer's assignment before the
    /// answer leaves (and repairs lost ones); without a data Redis, strips them (lease only).
    async fn assert_tokens(&self, doc: &GroupDoc, response: &mut HeartbeatResponse) -> Result<()> {
        if response.owner_tokens.is_empty() || response.member_epoch < 0 {
            return Ok(());
        }
        let Some(fencing) = &self.fencing else {
            warn!(group = %doc.group, "group is set to strict fencing but this coordinator has no --data-redis-url: members fall back to their lease");
            response.owner_tokens.clear();
            return Ok(());
        };
        fencing
            .assert(&doc.group, &doc.stream, &response.owner_tokens)
            .await
            .map_err(|e| ServiceError::Store(StoreError::unavailable(e.to_string())))?;
        Ok(())
    }

    /// The store (for readiness checks).
    pub fn store(&self) -> &Arc<dyn MetadataStore> {
        &self.store
    }

    /// The coordinator's clock, now (Unix ms).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Runs `op` again while it loses a compare-and-set, at most `cas_retries` more times.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Err(e) if e.is_conflict() && attempt < self.config.cas_retries => {
                    attempt += 1;
                    debug!(attempt, error = %e, "compare-and-set lost; retrying");
                }
                other => return other,
            }
        }
    }

    async fn load_group(&self, group: &str) -> Result<Versioned<GroupDoc>> {
        let Some((mut v, live)) = self.store.load_group_live(group).await? else {
            // Deleted (perhaps through another coordinator): drop what this one cached.
            self.cache.forget_group(group);
            return Err(ServiceError::GroupNotFound(group.to_owned()));
        };
        overlay_liveness(&mut v.doc, &live);
        Ok(v)
    }

    /// The group as the expiry sweep needs it. When the cached document is still the stored
    /// one only the liveness is read: the sweep runs every 250 ms, and decoding a document of
    /// 1,000 members × 4,096 shards that often cost a third of the steady-heartbeat throughput.
    async fn sweep_view(&self, group: &str) -> Result<Versioned<GroupDoc>> {
        if let Some(cached) = self.cache.group(group)
            && self.store.group_revision(group).await? == Some(cached.revision)
        {
            let live = self.store.liveness(group).await?;
            let mut v = Versioned::clone(&cached);
            overlay_liveness(&mut v.doc, &live);
            return Ok(v);
        }
        self.load_group(group).await
    }

    /// The stream's layout version: from the cache while its revision is the stored one.
    async fn layout_version(&self, stream: &str) -> Result<u64> {
        if let Some(cached) = self.cache.stream(stream)
            && self.store.stream_revision(stream).await? == Some(cached.revision)
        {
            return Ok(cached.doc.layout_version);
        }
        Ok(self.load_stream(stream).await?.doc.layout_version)
    }

    async fn load_stream(&self, stream: &str) -> Result<Versioned<StreamDoc>> {
        self.store
            .load_stream(stream)
            .await?
            .ok_or_else(|| ServiceError::StreamNotFound(stream.to_owned()))
    }

    /// Handles a heartbeat (SPEC §5).
    pub async fn heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse> {
        check_name("group", group)?;
        if let Some(response) = self.steady_heartbeat(group, req).await? {
            return Ok(response);
        }
        self.full_heartbeat(group, req).await
    }

    /// Handles a batch of heartbeats (`POST /v1/heartbeats`): each `(group, request)` is
    /// answered as [`Coordinator::heartbeat`] answers it, results in the order given, as if
    /// the heartbeats of each group ran one after another in that order. First every item
    /// tries the steady path, concurrently, so that their liveness touches share round
    /// trips; then, per group, the items from the first one that was not steady onwards run
    /// one after another through [`Coordinator::heartbeat`] (queueing on the group lock in
    /// order, not contending for it), concurrently across groups. The items before it
    /// changed nothing, so their steady answers are what the same order would have given;
    /// a steady pass answer that is thrown away only touched liveness and re-asserted
    /// tokens, which the second pass does again.
    pub async fn heartbeat_batch(
        &self,
        items: &[(&str, &HeartbeatRequest)],
    ) -> Vec<Result<HeartbeatResponse>> {
        let steady = futures::future::join_all(items.iter().map(|&(group, req)| async move {
            check_name("group", group)?;
            self.steady_heartbeat(group, req).await
        }))
        .await;
        let mut results: Vec<Option<Result<HeartbeatResponse>>> = Vec::with_capacity(items.len());
        let mut again: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, r) in steady.into_iter().enumerate() {
            let group = items[i].0;
            match again.get_mut(group) {
                Some(tail) => tail.push(i),
                None if matches!(r, Ok(None)) => {
                    again.insert(group, vec![i]);
                }
                None => {
                    results.push(r.transpose());
                    continue;
                }
            }
            results.push(None);
        }
        let answered = futures::future::join_all(again.into_values().map(|indices| async move {
            let mut out = Vec::with_capacity(indices.len());
            for i in indices {
                let (group, req) = items[i];
                out.push((i, self.heartbeat(group, req).await));
            }
            out
        }))
        .await;
        for (i, r) in answered.into_iter().flatten() {
            results[i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    // Unreachable: every item without an answer went through the second pass.
                    Err(StoreError::conflict("heartbeat left unanswered; retry".into()).into())
                })
            })
            .collect()
    }

    /// The full heartbeat: lock, load, engine, write. (The span is here rather than on
    /// [`Coordinator::heartbeat`]: the steady path logs nothing, and an info span per steady
    /// heartbeat costs a third of its throughput.)
    #[tracing::instrument(skip_all, fields(group = %group, member = %req.member_id, epoch = req.member_epoch))]
    async fn full_heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse> {
        let (response, drained, stream) = self
            .retrying(|| async {
                let _lock = self
                    .store
                    .lock(&LockResource::Group(group.to_owned()))
                    .await?;
                let Versioned { revision, mut doc } = self.load_group(group).await?;
                let stream = self.load_stream(&doc.stream).await?;
                let now = self.now();
                let before = self.wakes.as_ref().map(|_| doc.clone());
                let mut dirty = doc.sync_layout(&stream.doc);
                if dirty {
                    crate::metrics::record_rebalance(group);
                }
                let judged = self.expiry_now(now, doc.config.session_timeout_ms);
                let (mut events, expired) = expire(&mut doc, &stream.doc, judged);
                dirty |= !events.is_empty();
                let outcome = match doc.heartbeat(&stream.doc, req, now) {
                    Ok(out) => out,
                    Err(e) => {
                        dirty |= track_convergence(&mut doc, now);
                        if dirty {
                            let change = LivenessChange {
                                forget: departed(&events),
                                expired,
                                touch: None,
                            };
                            let revision =
                                self.store.put_group_live(&doc, revision, &change).await?;
                            self.lower_deadline(&doc, revision).await;
                            self.wake(group, before.as_ref(), Some(&doc), Some(&req.member_id));
                            log_events(group, &events);
                            self.cache.put_group(revision, doc);
                        }
                        return Err(e.into());
                    }
                };
                dirty |= outcome.changed;
                events.extend(outcome.events);
                dirty |= track_convergence(&mut doc, now);
                let touch =
                    (outcome.response.member_epoch >= 0).then(|| (req.member_id.clone(), now));
                let revision = if dirty {
                    let change = LivenessChange {
                        forget: departed(&events),
                        expired,
                        touch,
                    };
                    let revision = self.store.put_group_live(&doc, revision, &change).await?;
                    self.lower_deadline(&doc, revision).await;
                    self.wake(group, before.as_ref(), Some(&doc), Some(&req.member_id));
                    revision
                } else {
                    if let Some((member, now)) = &touch {
                        // Nothing to write but the liveness: only while nobody else wrote.
                        let t = self
                            .store
                            .touch_if(group, revision, member, *now, None)
                            .await?;
                        if t != TouchOutcome::Touched {
                            return Err(StoreError::conflict(format!(
                                "group {group} changed while a heartbeat was answered"
                            ))
                            .into());
                        }
                    }
                    revision
                };
                // Under the group lock, after the document write, before the answer leaves:
                // the member cannot learn of a grant whose owner token is not in place.
                let mut response = outcome.response;
                self.assert_tokens(&doc, &mut response).await?;
                log_events(group, &events);
                let stream_name = doc.stream.clone();
                self.cache.put_group(revision, doc);
                self.cache.put_stream(stream);
                Ok((response, outcome.drained, stream_name))
            })
            .await?;
        if !drained.is_empty()
            && let Err(e) = self.record_drained(&stream, group, &drained).await
        {
            // The member reports drained shards on every heartbeat: the next one retries.
            warn!(%stream, ?drained, error = %e, "could not record drained shards yet");
        }
        Ok(response)
    }

    /// Answers a steady-state heartbeat from the cached documents: no lock, no document
    /// write, one conditional liveness touch.
    /// `None` when the heartbeat needs the full path (anything to change, a cache miss, a
    /// newer revision, a member whose session is over).
    async fn steady_heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
    ) -> Result<Option<HeartbeatResponse>> {
        let Some(g) = self.cache.group(group) else {
            return Ok(None);
        };
        let Some(s) = self.cache.stream(&g.doc.stream) else {
            return Ok(None);
        };
        let Some(mut response) = g.doc.steady_heartbeat(&s.doc, req) else {
            return Ok(None);
        };
        let touch = SteadyTouch {
            group,
            revision: g.revision,
            stream: &s.doc.stream,
            stream_revision: s.revision,
            member: &req.member_id,
            now_ms: self.now(),
            max_silence_ms: g.doc.config.session_timeout_ms
                + self
                    .outages
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .shift_ms(self.now(), g.doc.config.session_timeout_ms),
        };
        // Strict fencing: every heartbeat re-asserts the member's owner tokens, repairing a
        // lost write within one heartbeat, at the same time as the touch (two round trips
        // in parallel, to two Redis). Without the group lock, and even when the touch finds
        // the cached document stale, this cannot hand a shard back: the token script never
        // replaces a later grant's token with an earlier one, and a grant's token is written
        // before the grant is answered.
        let (touched, asserted) = tokio::join!(
            self.store.touch_steady(&touch),
            self.assert_tokens(&g.doc, &mut response)
        );
        let steady = touched? == TouchOutcome::Touched;
        debug!(steady, revision = g.revision, "steady-state heartbeat");
        if !steady {
            return Ok(None);
        }
        asserted?;
        Ok(Some(response))
    }

    /// Handles `POST leave`.
    #[tracing::instrument(skip_all, fields(group = %group, member = %req.member_id))]
    pub async fn leave(&self, group: &str, req: &LeaveRequest) -> Result<LeaveResponse> {
        check_name("group", group)?;
        check_name("member", &req.member_id)?;
        if req.member_epoch < -1 {
            return Err(invalid(format!(
                "member_epoch {} is invalid",
                req.member_epoch
            )));
        }
        self.mutate_group(group, |doc, stream, _now| {
            doc.leave(stream, &req.member_id, req.member_epoch)?;
            Ok(vec![GroupEvent::Left(req.member_id.clone())])
        })
        .await?;
        Ok(LeaveResponse {
            member_id: req.member_id.clone(),
            member_epoch: -1,
        })
    }

    /// Fences and removes a member (admin).
    #[tracing::instrument(skip(self))]
    pub async fn remove_member(&self, group: &str, member: &str) -> Result<()> {
        check_name("group", group)?;
        check_name("member", member)?;
        self.mutate_group(group, |doc, stream, _now| {
            doc.remove_member(stream, member)?;
            Ok(vec![GroupEvent::Removed(member.to_owned())])
        })
        .await
        .map(drop)
    }

    /// Changes a group's settings (admin).
    #[tracing::instrument(skip(self))]
    pub async fn patch_group(&self, group: &str, patch: &PatchGroupRequest) -> Result<GroupView> {
        check_name("group", group)?;
        self.check_fencing(patch.fencing)?;
        self.mutate_group(group, |doc, stream, _now| {
            doc.update_config(stream, patch)?;
            Ok(Vec::new())
        })
        .await?;
        self.describe_group(group).await
    }

    /// Pauses or resumes a group (admin; PROTOCOL §14): durable in the group document, so it
    /// outlives rebalances, member restarts and coordinator restarts.
    #[tracing::instrument(skip(self))]
    pub async fn set_group_paused(&self, group: &str, paused: bool) -> Result<GroupView> {
        check_name("group", group)?;
        self.mutate_group(group, |doc, _stream, now| {
            if doc.set_paused(paused, now) {
                tracing::info!(group, paused, "group pause changed");
            }
            Ok(Vec::new())
        })
        .await?;
        crate::metrics::record_group_paused(group, paused);
        self.describe_group(group).await
    }

    /// Lock, load, apply `f`, write if the document changed, log. Returns what happened.
    async fn mutate_group<F>(&self, group: &str, f: F) -> Result<Vec<GroupEvent>>
    where
        F: Fn(&mut GroupDoc, &StreamDoc, u64) -> std::result::Result<Vec<GroupEvent>, EngineError>,
    {
        Ok(self.mutate_group_at(group, f).await?.events)
    }

    /// [`Coordinator::mutate_group`], also telling the revision and next deadline of the
    /// group document it left (written or not).
    async fn mutate_group_at<F>(&self, group: &str, f: F) -> Result<Mutated>
    where
        F: Fn(&mut GroupDoc, &StreamDoc, u64) -> std::result::Result<Vec<GroupEvent>, EngineError>,
    {
        self.retrying(|| async {
            let _lock = self
                .store
                .lock(&LockResource::Group(group.to_owned()))
                .await?;
            let Versioned { revision, mut doc } = self.load_group(group).await?;
            let stream = self.load_stream(&doc.stream).await?;
            let now = self.now();
            let before = doc.clone();
            if doc.sync_layout(&stream.doc) {
                crate::metrics::record_rebalance(group);
            }
            let judged = self.expiry_now(now, doc.config.session_timeout_ms);
            let (mut events, expired) = expire(&mut doc, &stream.doc, judged);
            events.extend(f(&mut doc, &stream.doc, now)?);
            track_convergence(&mut doc, now);
            let next_deadline_ms = doc.next_deadline_ms();
            let mut at = revision;
            if doc != before {
                let change = LivenessChange {
                    forget: departed(&events),
                    expired,
                    touch: None,
                };
                at = self.store.put_group_live(&doc, revision, &change).await?;
                self.lower_deadline(&doc, at).await;
                self.wake(group, Some(&before), Some(&doc), None);
                self.cache.put_group(at, doc);
            }
            self.cache.put_stream(stream);
            log_events(group, &events);
            Ok(Mutated {
                events,
                revision: at,
                next_deadline_ms,
            })
        })
        .await
    }

    /// After a write of `doc` at `revision`: brings the group's entry in the deadline index
    /// forward to the document's next deadline, if that is earlier. A failure is logged and
    /// remembered: the sweep retries it (until then the member's expiry may come late, never
    /// early).
    async fn lower_deadline(&self, doc: &GroupDoc, revision: u64) {
        if let Some(deadline) = doc.next_deadline_ms() {
            self.schedule(&doc.group, revision, deadline).await;
        }
    }

    /// Brings `group`'s deadline-index entry forward to `deadline` (recorded as seen at
    /// `revision`); on failure remembers it for the next sweep to retry.
    async fn schedule(&self, group: &str, revision: u64, deadline: u64) {
        if let Err(e) = self.store.lower_deadline(group, revision, deadline).await {
            warn!(group, deadline, error = %e, "could not record the group's next deadline; the sweep retries");
            self.cache.owe_deadline(group, revision, deadline);
        }
    }

    /// Creates a group, and its stream when new (admin).
    #[tracing::instrument(skip_all, fields(group = %req.group, stream = %req.stream))]
    pub async fn create_group(&self, req: &CreateGroupRequest) -> Result<GroupView> {
        check_name("group", &req.group)?;
        check_name("stream", &req.stream)?;
        let defaults = GroupConfig::default();
        let config = GroupConfig {
            start: req.start.unwrap_or(defaults.start),
            session_timeout_ms: req
                .session_timeout_ms
                .unwrap_or(defaults.session_timeout_ms),
            heartbeat_interval_ms: req
                .heartbeat_interval_ms
                .unwrap_or(defaults.heartbeat_interval_ms),
            rebalance_timeout_ms: req
                .rebalance_timeout_ms
                .unwrap_or(defaults.rebalance_timeout_ms),
            max_members: req.max_members,
            assignor: req.assignor.clone().unwrap_or(defaults.assignor),
            fencing: req.fencing.unwrap_or(if self.fencing.is_some() {
                FencingMode::Strict
            } else {
                FencingMode::Lease
            }),
            ordering: req.ordering.unwrap_or_default(),
            paused_since_ms: None,
        };
        self.check_fencing(req.fencing)?;
        config.validate()?;
        if let Some(n) = req.shard_count {
            crate::engine::validate_shard_count(n)?;
        }
        self.retrying(|| async {
            let _s = self
                .store
                .lock(&LockResource::Stream(req.stream.clone()))
                .await?;
            let _g = self.store.lock(&LockResource::Group(req.group.clone())).await?;
            if self.store.load_group(&req.group).await?.is_some() {
                return Err(ServiceError::GroupAlreadyExists(req.group.clone()));
            }
            let now = self.now();
            let (mut stream, revision) = match self.store.load_stream(&req.stream).await? {
                Some(v) => {
                    if let Some(n) = req.shard_count
                        && n != v.doc.shard_count
                    {
                        return Err(ServiceError::ShardCountMismatch {
                            stream: req.stream.clone(),
                            existing: v.doc.shard_count,
                            requested: n,
                        });
                    }
                    (v.doc, v.revision)
                }
                None => {
                    let n = req.shard_count.ok_or_else(|| {
                        invalid(format!(
                            "stream {} is new: shard_count (1..=4096) is required",
                            req.stream
                        ))
                    })?;
                    (StreamDoc::new(&req.stream, n, now)?, 0)
                }
            };
            // The stream names the group before the group exists: a crash in between leaves
            // a name the drain check prunes, never a group without its stream.
            stream.add_group(&req.group);
            self.store.put_stream(&stream, revision).await?;
            let doc = GroupDoc::new(&req.group, config.clone(), &stream, now);
            let revision = self.store.put_group(&doc, 0).await?;
            info!(group = %req.group, stream = %req.stream, shards = stream.shard_count, "group created");
            Ok(group_view(&doc, &stream, revision, now, &HashMap::new()))
        })
        .await
    }

    /// Deletes a group (admin). Without `force`, refuses while it has members.
    #[tracing::instrument(skip(self))]
    pub async fn delete_group(&self, group: &str, force: bool) -> Result<()> {
        check_name("group", group)?;
        let stream_name = self.load_group(group).await?.doc.stream;
        let stream = self
            .retrying(|| async {
                let _s = self
                    .store
                    .lock(&LockResource::Stream(stream_name.clone()))
                    .await?;
                let _g = self
                    .store
                    .lock(&LockResource::Group(group.to_owned()))
                    .await?;
                let Versioned { revision, mut doc } = self.load_group(group).await?;
                let stream = self.load_stream(&doc.stream).await?;
                let now = self.now();
                doc.expire(&stream.doc, now);
                if !doc.members.is_empty() && !force {
                    return Err(ServiceError::GroupNotEmpty {
                        group: group.to_owned(),
                        members: doc.members.len(),
                    });
                }
                self.store.delete_group(group, revision).await?;
                self.cache.forget_group(group);
                self.wake(group, Some(&doc), None, None);
                let mut s = stream.doc;
                let layout_changed = s.remove_group(group, now);
                self.store.put_stream(&s, stream.revision).await?;
                info!(group, stream = %s.stream, force, "group deleted");
                Ok(layout_changed.then_some(s))
            })
            .await?;
        if let Some(s) = stream {
            self.fan_out(&s).await;
        }
        Ok(())
    }

    /// Starts a reshard of `stream` to `shard_count` shards (admin).
    #[tracing::instrument(skip(self))]
    pub async fn reshard(&self, stream: &str, shard_count: u32) -> Result<StreamView> {
        check_name("stream", stream)?;
        self.mutate_stream(stream, |s, now| s.reshard(shard_count, now))
            .await
    }

    /// Rolls back the latest reshard of `stream` (admin).
    #[tracing::instrument(skip(self))]
    pub async fn rollback(&self, stream: &str) -> Result<StreamView> {
        check_name("stream", stream)?;
        let window = self.config.rollback_window_ms;
        self.mutate_stream(stream, |s, now| s.rollback(now, window))
            .await
    }

    async fn mutate_stream<F>(&self, stream: &str, f: F) -> Result<StreamView>
    where
        F: Fn(&mut StreamDoc, u64) -> std::result::Result<(), EngineError>,
    {
        let (doc, revision) = self
            .retrying(|| async {
                let _s = self
                    .store
                    .lock(&LockResource::Stream(stream.to_owned()))
                    .await?;
                let Versioned { revision, mut doc } = self.load_stream(stream).await?;
                let before = doc.clone();
                f(&mut doc, self.now())?;
                self.seal_switch(&before, &mut doc).await?;
                let revision = self.store.put_stream(&doc, revision).await?;
                info!(
                    stream,
                    shard_count = doc.shard_count,
                    routing_epoch = doc.routing_epoch,
                    "stream layout changed"
                );
                Ok((doc, revision))
            })
            .await?;
        self.fan_out(&doc).await;
        Ok(stream_view(
            &doc,
            revision,
            self.config.rollback_window_ms,
            self.now(),
        ))
    }

    /// Ordered resharding (issue 16): when `doc` switched the routing epoch from `before`,
    /// moves every affected shard's epoch marker in the data Redis and records the seals in
    /// the reshard record. Called under the stream lock, before the document is written and
    /// the request answered. A failure undoes the markers and fails the request (503).
    async fn seal_switch(&self, before: &StreamDoc, doc: &mut StreamDoc) -> Result<()> {
        let Some(sealer) = &self.sealer else {
            return Ok(());
        };
        if doc.routing_epoch == before.routing_epoch {
            return Ok(());
        }
        let shards = doc.shards_to_seal(before);
        let started = std::time::Instant::now();
        match sealer
            .seal(&doc.stream, doc.routing_epoch, before.shard_count, &shards)
            .await
        {
            Ok(seals) => {
                metrics::histogram!("rsc_seal_seconds").record(started.elapsed().as_secs_f64());
                info!(stream = %doc.stream, routing_epoch = doc.routing_epoch, shards = shards.len(),
                    "shards sealed: stale producers are refused from now on");
                if let Some(r) = doc.last_reshard.as_mut() {
                    r.seals = seals;
                }
                Ok(())
            }
            Err(e) => {
                warn!(stream = %doc.stream, error = %e, "could not seal the shards; the reshard is not made");
                sealer.unseal(&doc.stream, doc.routing_epoch, &shards).await;
                Err(ServiceError::Store(StoreError::unavailable(format!(
                    "{e} (the reshard was not made; retry it)"
                ))))
            }
        }
    }

    /// Records drained shards of `group` in the stream; retires shards every group drained.
    async fn record_drained(&self, stream: &str, group: &str, shards: &[u32]) -> Result<()> {
        let changed = self
            .retrying(|| async {
                let _s = self
                    .store
                    .lock(&LockResource::Stream(stream.to_owned()))
                    .await?;
                let Versioned { revision, mut doc } = self.load_stream(stream).await?;
                let now = self.now();
                // Prune names of groups that no longer exist (a create that crashed halfway).
                for g in doc.groups.clone() {
                    if g != group && self.store.load_group(&g).await?.is_none() {
                        warn!(stream, group = %g, "pruning a group the stream names but the store lacks");
                        doc.remove_group(&g, now);
                    }
                }
                let layout_changed = doc.mark_drained(group, shards, now);
                self.store.put_stream(&doc, revision).await?;
                info!(stream, group, ?shards, retired = layout_changed, "draining shards drained");
                Ok(layout_changed.then_some(doc))
            })
            .await?;
        if let Some(doc) = changed {
            self.fan_out(&doc).await;
        }
        Ok(())
    }

    /// Recomputes every group of the stream for its new layout, now rather than at the next
    /// heartbeat. A failure here is healed by the next heartbeat or sweep (`sync_layout`).
    async fn fan_out(&self, stream: &StreamDoc) {
        for group in &stream.groups {
            let r = self
                .mutate_group(group, |_doc, _stream, _now| Ok(Vec::new()))
                .await;
            if let Err(e) = r {
                warn!(stream = %stream.stream, group, error = %e, "layout change not yet applied to group; the sweep retries");
                // Due now: the sweep applies it (as would the group's next heartbeat).
                self.schedule(group, 0, self.now()).await;
            }
        }
    }

    /// Expires silent members and members that outlived their rebalance timeout, in the
    /// groups of the deadline-index `buckets` that are due. Returns how many members were
    /// removed. A group that fails stays claimed and is due again after the claim
    /// ([`ServiceConfig::claim_ms`]); the first failure is returned after the others ran.
    ///
    /// Only due groups are visited: every group document write records the group's next
    /// deadline (session or revocation) in the index, and a visit that finds nothing due
    /// (members heartbeated since) reschedules the group at its real next deadline.
    pub async fn sweep(&self, buckets: &[u32]) -> Result<usize> {
        for (group, revision, deadline) in self.cache.take_owed() {
            if let Err(e) = self.store.lower_deadline(&group, revision, deadline).await {
                self.cache.owe_deadline(&group, revision, deadline);
                return Err(e.into());
            }
        }
        self.cache.evict_idle();
        let now = self.now();
        let due = match self
            .store
            .claim_due(buckets, now, self.config.claim_ms, self.config.sweep_batch)
            .await
        {
            Ok(due) => {
                self.store_ok(now);
                due
            }
            Err(e) => {
                if e.is_unavailable() {
                    self.store_failed();
                }
                return Err(e.into());
            }
        };
        if due.is_empty() {
            return Ok(0);
        }
        ::metrics::counter!("rsc_sweep_visits_total").increment(due.len() as u64);
        let visits: Vec<(String, Result<usize>)> = futures::stream::iter(due)
            .map(|group| async move {
                let r = self.visit(&group).await;
                (group, r)
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .collect()
            .await;
        let mut removed = 0;
        let mut failure = None;
        for (group, r) in visits {
            match r {
                Ok(n) => removed += n,
                Err(e) => {
                    warn!(group, error = %e, "expiry sweep of the group failed; it is due again after the claim");
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// One due group: expire what is due (and apply a layout change the group missed), then
    /// reschedule the group at its next deadline.
    #[tracing::instrument(level = "debug", skip(self))]
    async fn visit(&self, group: &str) -> Result<usize> {
        let v = match self.sweep_view(group).await {
            Ok(v) => v,
            Err(ServiceError::GroupNotFound(_)) => {
                // Deleted: its index entry goes too.
                self.store.reschedule(group, u64::MAX, None).await?;
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        let now = self.now();
        let layout_stale = match self.layout_version(&v.doc.stream).await {
            Ok(layout) => layout != v.doc.layout_version,
            Err(ServiceError::StreamNotFound(_)) => false,
            Err(e) => return Err(e),
        };
        // After a store outage, deadlines are judged on a clock set back by its length.
        let judged = self.expiry_now(now, v.doc.config.session_timeout_ms);
        let due = v.doc.next_deadline_ms().is_some_and(|t| t <= judged);
        let (removed, revision, deadline) = if due || layout_stale {
            let m = match self
                .mutate_group_at(group, |_doc, _stream, _now| Ok(Vec::new()))
                .await
            {
                Ok(m) => m,
                Err(ServiceError::GroupNotFound(_) | ServiceError::StreamNotFound(_)) => {
                    return Ok(0);
                }
                Err(e) => return Err(e),
            };
            let removed = m
                .events
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        GroupEvent::SessionExpired(_) | GroupEvent::RebalanceTimedOut(_)
                    )
                })
                .count();
            (removed, m.revision, m.next_deadline_ms)
        } else {
            (0, v.revision, v.doc.next_deadline_ms())
        };
        let deadline = deadline.map(|t| t + (now - judged));
        let set = self.store.reschedule(group, revision, deadline).await?;
        debug!(group, due, layout_stale, ?deadline, set, "swept");
        Ok(removed)
    }

    /// Deletes the keys of retired shards whose latest reshard is at least `delay_ms` past
    /// completion (so no rollback can bring them back), at most `budget` keys in all.
    ///
    /// Per stream, under the stream's lock: reload the document, take the shards still
    /// retired (never one active or draining again, e.g. after a rollback or a new reshard),
    /// `delete` their keys in the data Redis, then forget them in the document. A reshard
    /// waits for the lock, so it cannot reactivate a shard between the check and the delete.
    /// A failed delete leaves the document as it was (retried on the next pass).
    pub async fn purge_retired<F, Fut>(
        &self,
        delay_ms: u64,
        budget: usize,
        delete: F,
    ) -> Result<Vec<PurgedKeys>>
    where
        F: Fn(Vec<String>) -> Fut,
        Fut: Future<Output = std::result::Result<(), String>>,
    {
        let mut out = Vec::new();
        let mut left = budget;
        for name in self.store.list_streams().await? {
            if left == 0 {
                break;
            }
            // A cheap look without the lock first: most streams have nothing to delete.
            let Some(v) = self.store.load_stream(&name).await? else {
                continue;
            };
            if v.doc.deletable_retired(self.now(), delay_ms).is_empty() {
                continue;
            }
            let _lock = self.store.lock(&LockResource::Stream(name.clone())).await?;
            let Some(Versioned { revision, mut doc }) = self.store.load_stream(&name).await? else {
                continue;
            };
            let mut shards = doc.deletable_retired(self.now(), delay_ms);
            shards.truncate(left);
            if shards.is_empty() {
                continue;
            }
            let keys: Vec<String> = shards
                .iter()
                .map(|&s| rsc_protocol::routing::shard_key(&name, s))
                .collect();
            if let Err(e) = delete(keys.clone()).await {
                ::metrics::counter!("rsc_retired_key_delete_errors_total", "stream" => name.clone())
                    .increment(1);
                warn!(stream = %name, ?shards, error = %e, "could not delete retired shard keys; retrying next pass");
                continue;
            }
            doc.forget_retired(&shards);
            let after = self.store.put_stream(&doc, revision).await?;
            info!(stream = %name, ?shards, ?keys, "deleted retired shard keys");
            left -= shards.len();
            out.push(PurgedKeys {
                stream: name,
                shards,
                keys,
                revision_before: revision,
                revision_after: after,
            });
        }
        Ok(out)
    }

    /// The group view.
    pub async fn describe_group(&self, group: &str) -> Result<GroupView> {
        check_name("group", group)?;
        let v = self.load_group(group).await?;
        let stream = self.load_stream(&v.doc.stream).await?;
        let mut view = group_view(&v.doc, &stream.doc, v.revision, self.now(), &HashMap::new());
        if v.doc.config.ordering == rsc_protocol::OrderingMode::Key {
            view.waiting_on_parents = self.parent_progress(group, &stream.doc).await;
        }
        Ok(view)
    }

    /// Ordered resharding (issue 16): for the latest switch of `stream`, each parent shard
    /// the group has not yet drained up to its seal, with how far it is (from the data
    /// Redis; empty without one or when every parent reached its seal). Children are the
    /// shards the parent's moved keys can have gone to: the new shards of a scale-up, the
    /// remaining ones of a scale-down.
    async fn parent_progress(
        &self,
        group: &str,
        stream: &StreamDoc,
    ) -> Vec<rsc_protocol::ParentProgress> {
        let (Some(sealer), Some(r)) = (&self.sealer, &stream.last_reshard) else {
            return Vec::new();
        };
        let (parents, children): (Vec<u32>, Vec<u32>) = if r.to > r.from {
            ((0..r.from).collect(), (r.from..r.to).collect())
        } else {
            ((r.to..r.from).collect(), (0..r.to).collect())
        };
        let calls = parents.iter().filter_map(|&p| {
            let seal = r.seals.get(&p)?.clone();
            Some(async move {
                let progress = sealer
                    .progress(&stream.stream, p, group, &seal, 10_000)
                    .await;
                (p, seal, progress)
            })
        });
        let mut out = Vec::new();
        for (parent, seal, progress) in futures::future::join_all(calls).await {
            match progress {
                Ok(pr) if pr.reached() => {}
                Ok(pr) => out.push(rsc_protocol::ParentProgress {
                    parent,
                    routing_epoch: r.epoch,
                    seal,
                    children: children.clone(),
                    undelivered: pr.undelivered,
                    pending: pr.pending,
                }),
                Err(e) => debug!(group, parent, error = %e, "parent progress not read"),
            }
        }
        out
    }

    /// Every group's view.
    pub async fn list_groups(&self) -> Result<Vec<GroupView>> {
        let mut out = Vec::new();
        for g in self.store.list_groups().await? {
            match self.describe_group(&g).await {
                Ok(v) => out.push(v),
                Err(ServiceError::GroupNotFound(_) | ServiceError::StreamNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The stream view.
    pub async fn describe_stream(&self, stream: &str) -> Result<StreamView> {
        check_name("stream", stream)?;
        let v = self.load_stream(stream).await?;
        Ok(stream_view(
            &v.doc,
            v.revision,
            self.config.rollback_window_ms,
            self.now(),
        ))
    }

    /// Every stream's view.
    pub async fn list_streams(&self) -> Result<Vec<StreamView>> {
        let mut out = Vec::new();
        for s in self.store.list_streams().await? {
            if let Some(v) = self.store.load_stream(&s).await? {
                out.push(stream_view(
                    &v.doc,
                    v.revision,
                    self.config.rollback_window_ms,
                    self.now(),
                ));
            }
        }
        Ok(out)
    }

    /// Producers' routing metadata.
    pub async fn routing(&self, stream: &str) -> Result<RoutingResponse> {
        check_name("stream", stream)?;
        Ok(routing_view(&self.load_stream(stream).await?.doc))
    }
}

/// What [`Coordinator::mutate_group_at`] did and left.
#[derive(Debug)]
struct Mutated {
    events: Vec<GroupEvent>,
    /// The group document's revision afterwards.
    revision: u64,
    /// Its next deadline.
    next_deadline_ms: Option<u64>,
}

/// Retired shard keys one [`Coordinator::purge_retired`] pass deleted on one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgedKeys {
    /// The stream.
    pub stream: String,
    /// The retired shards.
    pub shards: Vec<u32>,
    /// Their keys, deleted from the data Redis.
    pub keys: Vec<String>,
    /// The stream document's revision before the pass.
    pub revision_before: u64,
    /// And after.
    pub revision_after: u64,
}

/// Updates the document's convergence clock; observes the convergence time when the group
/// just became stable. Returns whether the document changed.
fn track_convergence(doc: &mut GroupDoc, now: u64) -> bool {
    let before = doc.reconciling_since_ms;
    if let Some(ms) = doc.track_convergence(now) {
        crate::metrics::record_convergence(&doc.group, ms);
        debug!(group = %doc.group, ms, "group converged");
    }
    doc.reconciling_since_ms != before
}

/// Runs the engine's expiry; returns its events and, for each member removed for silence,
/// the liveness the decision was based on (the write fails if it changed since).
fn expire(
    doc: &mut GroupDoc,
    stream: &StreamDoc,
    now: u64,
) -> (Vec<GroupEvent>, Vec<(String, u64)>) {
    if doc.next_deadline_ms().is_none_or(|t| t > now) {
        return (Vec::new(), Vec::new());
    }
    let seen: HashMap<String, u64> = doc
        .members
        .iter()
        .map(|(id, m)| (id.clone(), m.last_heartbeat_ms))
        .collect();
    let events = doc.expire(stream, now);
    let expired = events
        .iter()
        .filter_map(|e| match e {
            GroupEvent::SessionExpired(m) => seen.get(m).map(|t| (m.clone(), *t)),
            _ => None,
        })
        .collect();
    (events, expired)
}

/// Liveness lives beside the document: a member was last heard from at the later of the two.
fn overlay_liveness(doc: &mut GroupDoc, live: &HashMap<String, u64>) {
    for (id, m) in doc.members.iter_mut() {
        if let Some(&t) = live.get(id) {
            m.last_heartbeat_ms = m.last_heartbeat_ms.max(t);
        }
    }
}

/// Members an update removed: their liveness goes with them.
fn departed(events: &[GroupEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            GroupEvent::Left(m)
            | GroupEvent::SessionExpired(m)
            | GroupEvent::RebalanceTimedOut(m)
            | GroupEvent::Removed(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn log_events(group: &str, events: &[GroupEvent]) {
    crate::metrics::record_group_events(group, events);
    for e in events {
        match e {
            GroupEvent::Joined(m) => info!(group, member = %m, "member joined"),
            GroupEvent::Rejoined(m) => info!(group, member = %m, "member rejoined with epoch 0"),
            GroupEvent::Left(m) => info!(group, member = %m, "member left"),
            GroupEvent::SteppedAway(m) => {
                info!(group, member = %m, "static member left for a restart: its shards wait for it")
            }
            GroupEvent::Resumed(m) => {
                info!(group, member = %m, "static member returned: resumes its shards, no rebalance")
            }
            GroupEvent::SessionExpired(m) => {
                warn!(group, member = %m, "member expired: no heartbeat within the session timeout")
            }
            GroupEvent::RebalanceTimedOut(m) => {
                warn!(group, member = %m, "member removed: did not revoke within the rebalance timeout")
            }
            GroupEvent::Removed(m) => info!(group, member = %m, "member removed by an operator"),
            GroupEvent::Rebalanced(epoch) => debug!(group, epoch, "target assignment recomputed"),
            GroupEvent::RevocationRequested(m, shards) => {
                info!(group, member = %m, ?shards, "revocation requested")
            }
        }
    }
}
