//! The process's Prometheus recorder, and the removal of a shard's series when this process
//! gives the shard up.
//!
//! The `metrics` facade cannot remove a series, and the Prometheus exporter only forgets
//! idle ones. So the recorder [`install_metrics`] installs keeps the per-shard gauges of the
//! client (`rsc_client_*` gauges with a `shard` label, such as `rsc_client_shard_lag`) itself,
//! beside the exporter's registry, and renders them after the exporter's text: once a shard
//! is revoked or abandoned, [`forget_shard`] drops its series, so `/metrics` no longer shows
//! a lag that nobody in the process measures any more.

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Renders the process's metrics in the Prometheus text format (cheap to clone).
#[derive(Clone)]
pub struct MetricsHandle {
    prometheus: PrometheusHandle,
    shards: Arc<ShardGauges>,
}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHandle").finish_non_exhaustive()
    }
}

impl MetricsHandle {
    /// Every metric of the process, in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut text = self.prometheus.render();
        self.shards.render_into(&mut text);
        text
    }
}

/// The recorder of this process, once [`install_metrics`] ran: `Err` when another recorder
/// was installed first.
static INSTALLED: OnceLock<Result<MetricsHandle, String>> = OnceLock::new();

/// Installs the process's metrics recorder (once; later calls return the same handle):
/// the Prometheus exporter's, with the per-shard gauges kept apart so that a shard given up
/// loses its series. Fails when the program installed another recorder first (then its
/// metrics are that recorder's to serve).
pub fn install_metrics() -> Result<MetricsHandle, crate::ConfigError> {
    INSTALLED
        .get_or_init(|| {
            let shards = Arc::new(ShardGauges::default());
            let recorder = OpsRecorder {
                inner: PrometheusBuilder::new().build_recorder(),
                shards: shards.clone(),
            };
            let prometheus = recorder.inner.handle();
            metrics::set_global_recorder(recorder)
                .map(|()| {
                    crate::consumer::hooks::on_shard_released(forget_shard);
                    MetricsHandle { prometheus, shards }
                })
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(crate::ConfigError::Metrics)
}

/// Drops the series of `shard` of `stream` in `group` (this process gave the shard up).
/// Nothing to do without the recorder of [`install_metrics`].
fn forget_shard(group: &str, stream: &str, shard: u32) {
    if let Some(Ok(handle)) = INSTALLED.get() {
        handle.shards.forget(group, stream, shard);
    }
}

/// The per-shard gauges: by key, the gauge's value (an `f64`'s bits).
#[derive(Default)]
struct ShardGauges {
    gauges: Mutex<BTreeMap<Key, Arc<AtomicU64>>>,
}

impl ShardGauges {
    /// Whether the recorder keeps `key` here rather than in the exporter's registry.
    fn keeps(key: &Key) -> bool {
        key.name().starts_with("rsc_client_") && key.labels().any(|l| l.key() == "shard")
    }

    fn gauge(&self, key: &Key) -> Gauge {
        let mut gauges = self.gauges.lock().unwrap_or_else(PoisonError::into_inner);
        Gauge::from_arc(gauges.entry(key.clone()).or_default().clone())
    }

    fn forget(&self, group: &str, stream: &str, shard: u32) {
        let shard = shard.to_string();
        let is = |key: &Key, name: &str, value: &str| {
            key.labels().any(|l| l.key() == name && l.value() == value)
        };
        self.gauges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, _| {
                !(is(key, "group", group) && is(key, "stream", stream) && is(key, "shard", &shard))
            });
    }

    /// Appends the gauges, one `# TYPE` line per name, as the exporter writes its own.
    fn render_into(&self, text: &mut String) {
        let gauges = self.gauges.lock().unwrap_or_else(PoisonError::into_inner);
        let mut last: Option<&str> = None;
        for (key, value) in gauges.iter() {
            if last != Some(key.name()) {
                if last.is_some() {
                    text.push('\n');
                }
                let _ = writeln!(text, "# TYPE {} gauge", key.name());
                last = Some(key.name());
            }
            text.push_str(key.name());
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}=\"{}\"", l.key(), escape(l.value())))
                .collect();
            let _ = writeln!(
                text,
                "{{{}}} {}",
                labels.join(","),
                f64::from_bits(value.load(Ordering::Relaxed))
            );
        }
        if last.is_some() {
            text.push('\n');
        }
    }
}

/// A label value in the text format: backslash, double quote and line feed escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// The exporter's recorder, with the per-shard gauges kept in [`ShardGauges`].
struct OpsRecorder {
    inner: PrometheusRecorder,
    shards: Arc<ShardGauges>,
}

impl Recorder for OpsRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if ShardGauges::keeps(key) {
            return self.shards.gauge(key);
        }
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> (OpsRecorder, MetricsHandle) {
        let shards = Arc::new(ShardGauges::default());
        let recorder = OpsRecorder {
            inner: PrometheusBuilder::new().build_recorder(),
            shards: shards.clone(),
        };
        let handle = MetricsHandle {
            prometheus: recorder.inner.handle(),
            shards,
        };
        (recorder, handle)
    }

    fn lag(shard: u32) -> Gauge {
        metrics::gauge!("rsc_client_shard_lag", "group" => "g", "stream" => "s",
            "shard" => shard.to_string())
    }

    #[test]
    fn a_forgotten_shard_loses_its_series_and_the_others_keep_theirs() {
        let (recorder, handle) = recorder();
        metrics::with_local_recorder(&recorder, || {
            lag(0).set(5.0);
            lag(1).set(7.0);
            metrics::gauge!("rsc_client_shard_in_flight_entries", "group" => "g",
                "stream" => "s", "shard" => "1")
            .set(2.0);
            metrics::gauge!("rsc_client_data_redis_up").set(1.0);
            metrics::counter!("rsc_client_messages_handled_total", "group" => "g").increment(3);
        });
        let text = handle.render();
        assert!(
            text.contains("# TYPE rsc_client_shard_lag gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("rsc_client_shard_lag{group=\"g\",stream=\"s\",shard=\"1\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("rsc_client_data_redis_up 1"), "{text}");
        assert!(text.contains("rsc_client_messages_handled_total{group=\"g\"} 3"));

        handle.shards.forget("g", "s", 1);
        let text = handle.render();
        assert!(
            !text.contains("shard=\"1\""),
            "shard 1's series are gone:\n{text}"
        );
        assert!(text.contains("rsc_client_shard_lag{group=\"g\",stream=\"s\",shard=\"0\"} 5"));
        handle.shards.forget("g", "other", 0);
        handle.shards.forget("h", "s", 0);
        assert!(
            handle.render().contains("shard=\"0\""),
            "another group's or stream's shard 0"
        );

        // Given back to this process later: the series comes back with the new value.
        metrics::with_local_recorder(&recorder, || lag(1).set(0.0));
        assert!(
            handle
                .render()
                .contains("rsc_client_shard_lag{group=\"g\",stream=\"s\",shard=\"1\"} 0\n")
        );
    }

    #[test]
    fn label_values_are_escaped_as_the_text_format_wants() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
