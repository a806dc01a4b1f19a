//! Tracing events to Python's `logging`: a tracing layer writes each event as a `log`
//! record, which pyo3-log hands to the logger named after the event's target
//! (`rsc_client.consumer.member`, …). `RSC_LOG` filters as in the Rust pods (default `info`).

use pyo3::Python;
use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::SubscriberExt as _;

/// The event's message and its other fields, `key=value`.
#[derive(Default)]
struct Text(String, String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.1, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.1, " {}={value}", field.name());
        }
    }
}

/// The layer that forwards events to the `log` facade.
struct ToLog;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ToLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !crate::interpreter::python_alive() {
            return;
        }
        let meta = event.metadata();
        let level = match *meta.level() {
            tracing::Level::ERROR => log::Level::Error,
            tracing::Level::WARN => log::Level::Warn,
            tracing::Level::INFO => log::Level::Info,
            tracing::Level::DEBUG => log::Level::Debug,
            tracing::Level::TRACE => log::Level::Trace,
        };
        let logger = log::logger();
        let target = meta.target();
        let enabled = log::Metadata::builder().level(level).target(target).build();
        if !logger.enabled(&enabled) {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        logger.log(
            &log::Record::builder()
                .level(level)
                .target(target)
                .module_path(meta.module_path())
                .file(meta.file())
                .line(meta.line())
                .args(format_args!("{}{}", text.0, text.1))
                .build(),
        );
    }
}

/// Installs the bridge (once per process; a program that set its own tracing subscriber
/// keeps it).
pub(crate) fn init(py: Python<'_>) {
    let _ = pyo3_log::Logger::new(py, pyo3_log::Caching::Loggers).map(|l| l.install());
    let filter = std::env::var("RSC_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let subscriber = tracing_subscriber::registry().with(filter).with(ToLog);
    let _ = tracing::subscriber::set_global_default(subscriber);
}
