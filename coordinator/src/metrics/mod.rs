//! Prometheus metrics (PROTOCOL §7), served at `GET /metrics`.
//!
//! Two sources make up a scrape:
//! - **events** (counters and histograms) recorded through the `metrics` facade into the
//!   process-wide Prometheus recorder ([`prometheus`]): HTTP requests, heartbeats by result,
//!   member changes, expiries and fencing, rebalances, convergence time, store latency and
//!   errors, audit and rate-limit counts;
//! - **state** (gauges) computed from the store at scrape time ([`state`]): members, shards
//!   by state, epochs, pending revocations and their age, reshard state, and lag/pending per
//!   shard from the data Redis. Computing them from the documents keeps them right whichever
//!   coordinator replica changed a group, and drops the series of a deleted group at once.
//!
//! Names follow Prometheus conventions: prefix `rsc_`, base units in the name (`_seconds`),
//! `_total` on counters; labels are bounded (`group`, `stream`, `shard`, route templates,
//! error codes — never member ids or raw paths).

pub(crate) mod history;
mod http;
mod lag;
mod recent;
mod sampler;
pub(crate) mod scaling;
pub(crate) mod state;
mod store;

pub(crate) use history::{AfterTick, DEFAULT_HISTORY_INTERVAL, History};
pub(crate) use http::track_http;
pub(crate) use lag::{GroupReading, KeyReading, LagProbe};
pub(crate) use store::InstrumentedStore;

use crate::engine::GroupEvent;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use rsc_protocol::ErrorCode;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{OnceLock, RwLock};

/// Latency buckets (seconds) of HTTP and store operations.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Convergence-time buckets (seconds): from one heartbeat interval to the rebalance timeout.
const CONVERGENCE_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Batch-size buckets of `POST /v1/heartbeats` (heartbeats per request, up to
/// [`rsc_protocol::MAX_HEARTBEAT_BATCH`]).
const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder, installed on first use. If another recorder was
/// installed first, events are not recorded and only state gauges are rendered.
pub(crate) fn prometheus() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("rsc_group_convergence_seconds".into()),
                CONVERGENCE_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("rsc_heartbeat_batch_size".into()),
                    BATCH_SIZE_BUCKETS,
                )
            })
            .expect("bucket lists are not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "a metrics recorder was installed before ours; event metrics are not exported"
            );
        }
        handle
    })
}

/// Counts a group's events: member changes, expiries, operator fencing, rebalances,
/// revocation requests.
pub(crate) fn record_group_events(group: &str, events: &[GroupEvent]) {
    let g = group.to_owned();
    for e in events {
        match e {
            GroupEvent::Joined(_) => change(&g, "joined"),
            GroupEvent::Rejoined(_) => change(&g, "rejoined"),
            GroupEvent::Left(_) => change(&g, "left"),
            GroupEvent::SteppedAway(_) => change(&g, "stepped_away"),
            GroupEvent::Resumed(_) => change(&g, "resumed"),
            GroupEvent::Removed(_) => {
                change(&g, "removed");
                metrics::counter!("rsc_members_fenced_total", "group" => g.clone(), "reason" => "operator")
                    .increment(1);
            }
            GroupEvent::SessionExpired(_) => {
                metrics::counter!("rsc_members_expired_total", "group" => g.clone(), "reason" => "session_timeout")
                    .increment(1);
            }
            GroupEvent::RebalanceTimedOut(_) => {
                metrics::counter!("rsc_members_expired_total", "group" => g.clone(), "reason" => "rebalance_timeout")
                    .increment(1);
            }
            GroupEvent::Rebalanced(_) => record_rebalance(group),
            GroupEvent::RevocationRequested(_, shards) => {
                metrics::counter!("rsc_shard_revocations_total", "group" => g.clone())
                    .increment(shards.len() as u64);
            }
        }
    }
}

fn change(group: &str, change: &'static str) {
    metrics::counter!("rsc_member_changes_total", "group" => group.to_owned(), "change" => change)
        .increment(1);
}

/// Counts an operator's pause or resume of a group (`action` = `pause` or `resume`); the
/// current state is the `rsc_group_paused` gauge.
pub(crate) fn record_group_paused(group: &str, paused: bool) {
    let action = if paused { "pause" } else { "resume" };
    metrics::counter!("rsc_group_pause_changes_total", "group" => group.to_owned(), "action" => action)
        .increment(1);
}

/// Counts one recomputation of a group's target assignment.
pub(crate) fn record_rebalance(group: &str) {
    metrics::counter!("rsc_rebalances_total", "group" => group.to_owned()).increment(1);
}

/// Observes how long a group took from unsettled to stable.
pub(crate) fn record_convergence(group: &str, ms: u64) {
    metrics::histogram!("rsc_group_convergence_seconds", "group" => group.to_owned())
        .record(ms as f64 / 1000.0);
}

/// Counts a heartbeat or leave answer: `result` is `ok` or the error code. The group label
/// is kept only for groups that exist, so that made-up names cannot grow the label set.
pub(crate) fn record_heartbeat(group: &str, result: Result<(), ErrorCode>) {
    if result.is_ok() {
        heartbeats_ok(group).increment(1);
        return;
    }
    let known = !matches!(
        result,
        Err(ErrorCode::GroupNotFound | ErrorCode::InvalidRequest | ErrorCode::StreamNotFound)
    );
    let g = if known {
        group.to_owned()
    } else {
        String::new()
    };
    let r = match result {
        Ok(()) => "ok",
        Err(c) => c.as_str(),
    };
    metrics::counter!("rsc_heartbeats_total", "group" => g, "result" => r).increment(1);
    if result == Err(ErrorCode::FencedMemberEpoch) {
        record_stale_epoch(group);
    }
}

/// `rsc_heartbeats_total{group, result="ok"}` of `group` (every answered heartbeat counts
/// here).
fn heartbeats_ok(group: &str) -> metrics::Counter {
    static OK: Handles<String, metrics::Counter> = Handles::new();
    OK.get(group, || {
        let c = metrics::counter!("rsc_heartbeats_total", "group" => group.to_owned(), "result" => "ok");
        (group.to_owned(), c)
    })
}

/// Counts owner tokens asserted for `group` (strict fencing, docs/FENCING.md):
/// `rsc_fencing_token_asserts_total{group, result=written|unchanged|refused}`. Every steady
/// heartbeat of a strict group counts here, so the handles are kept.
pub(crate) fn record_token_asserts(group: &str, written: usize, unchanged: usize, refused: usize) {
    static ASSERTS: Handles<String, [metrics::Counter; 3]> = Handles::new();
    let counters = ASSERTS.get(group, || {
        let counter = |result: &'static str| {
            metrics::counter!("rsc_fencing_token_asserts_total",
                "group" => group.to_owned(), "result" => result)
        };
        let counters = [counter("written"), counter("unchanged"), counter("refused")];
        (group.to_owned(), counters)
    });
    for (counter, n) in counters.iter().zip([written, unchanged, refused]) {
        if n > 0 {
            counter.increment(n as u64);
        }
    }
}

/// Counts an owner-token assertion answered from the owner keys the data Redis tracks for
/// this coordinator, without a read (`rsc_fencing_token_tracked_hits_total`, docs/FENCING.md).
/// Every steady heartbeat of a strict group may count here, so the handle is kept.
pub(crate) fn record_tracked_hit() {
    static HITS: Handles<(), metrics::Counter> = Handles::new();
    let hits = HITS.get(&(), || {
        (
            (),
            metrics::counter!("rsc_fencing_token_tracked_hits_total"),
        )
    });
    hits.increment(1);
}

/// Metric handles looked up in the recorder once per label value and kept: the recorder's
/// look-up builds and hashes the labels, an allocation per call, which every steady
/// heartbeat would pay.
pub(crate) struct Handles<K, H>(OnceLock<RwLock<HashMap<K, H>>>);

impl<K: Hash + Eq, H: Clone> Handles<K, H> {
    /// No handle yet.
    pub(crate) const fn new() -> Self {
        Handles(OnceLock::new())
    }

    /// The handle of `key`, made by `make` (with the key to keep) the first time.
    pub(crate) fn get<Q>(&self, key: &Q, make: impl FnOnce() -> (K, H)) -> H
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let handles = self.0.get_or_init(|| {
            // Handles taken before the recorder is installed would record nowhere.
            prometheus();
            RwLock::default()
        });
        if let Some(h) = handles.read().unwrap_or_else(|p| p.into_inner()).get(key) {
            return h.clone();
        }
        let (key, h) = make();
        handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, h.clone());
        h
    }
}

/// Records the size of a `POST /v1/heartbeats` request that was processed (its heartbeats
/// are counted one by one with [`record_heartbeat`]).
pub(crate) fn record_heartbeat_batch(size: usize) {
    metrics::histogram!("rsc_heartbeat_batch_size").record(size as f64);
}

/// Counts a heartbeat or leave refused with `FENCED_MEMBER_EPOCH`.
pub(crate) fn record_stale_epoch(group: &str) {
    metrics::counter!("rsc_members_fenced_total", "group" => group.to_owned(), "reason" => "stale_epoch")
        .increment(1);
}
