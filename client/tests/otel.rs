//! Trace propagation (feature `otel`) against a real redis-server and a real coordinator:
//! a producer's span reaches the consumer through the entry's `traceparent` header, so
//! publishing and handling are one trace (checked with the SDK's in-memory exporter), and a
//! batch listener's span links every message's context.
//!
//! `cargo test -p rsc-client --features otel --test otel` (needs the coordinator binary:
//! `cargo build --workspace --bins`).
#![cfg(feature = "otel")]

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rsc_client::prelude::*;
use rsc_client::producer::Record;
use rsc_testkit::{CoordinatorProcess, RedisServer};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// One tracer provider for the test binary (the subscriber is global: workers run on other
/// threads).
fn tracing_setup() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static SETUP: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("rsc-test"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("one subscriber");
        (provider, exporter)
    })
}

async fn eventually<T>(what: &str, within: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spans(name: &str) -> Vec<SpanData> {
    let (provider, exporter) = tracing_setup();
    let _ = provider.force_flush();
    exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == name)
        .collect()
}

async fn run(batch: bool) -> (Vec<SpanData>, Vec<SpanData>) {
    tracing_setup();
    let redis = RedisServer::start().expect("redis-server");
    let coordinator = CoordinatorProcess::start(&["--store", "memory"]).expect("coordinator");
    let stream = if batch { "sb" } else { "ss" };
    let resp = {
        rsc_client::install_crypto_provider();
        reqwest::Client::new()
    }
    .post(format!("{}/v1/groups", coordinator.url()))
    .json(&json!({"group": "g", "stream": stream, "shard_count": 1,
            "session_timeout_ms": 3000, "heartbeat_interval_ms": 100}))
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let listener = if batch {
        Listener::batch("g", stream, move |b: Batch<Value>| {
            let h = h.clone();
            async move {
                h.fetch_add(b.len(), Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
        .max_batch(10)
        .linger(Duration::from_millis(300))
    } else {
        Listener::new("g", stream, move |_m: Message<Value>| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
    }
    .block_timeout(Duration::from_millis(200));
    let app = ConsumerApp::builder()
        .coordinator(&coordinator.url())
        .redis_url(redis.url())
        .instance_id(if batch { "b" } else { "s" })
        .listener(listener)
        .build()
        .unwrap();
    let handle = app.handle();
    let join = tokio::spawn(app.run_until(std::future::pending()));
    let producer = Producer::builder()
        .coordinator(&coordinator.url())
        .redis_url(redis.url())
        .build()
        .unwrap();
    producer.routing(stream).await.unwrap();
    // Two publishes, each in its own trace.
    for i in 0..2 {
        let span = tracing::info_span!("publish", stream, i);
        producer
            .publish_record(stream, Record::json(&json!({"i": i})).unwrap())
            .instrument(span)
            .await
            .unwrap();
    }
    eventually("both handled", Duration::from_secs(15), || {
        (handled.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await;
    handle.shutdown();
    join.await.unwrap().unwrap();
    let publishes: Vec<SpanData> = spans("publish")
        .into_iter()
        .filter(|s| {
            s.attributes
                .iter()
                .any(|kv| kv.key.as_str() == "stream" && kv.value.as_str() == stream)
        })
        .collect();
    (publishes, spans(if batch { "batch" } else { "message" }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_publish_to_handling() {
    let (publishes, messages) = run(false).await;
    assert_eq!(publishes.len(), 2);
    for p in &publishes {
        let child = messages
            .iter()
            .find(|m| m.span_context.trace_id() == p.span_context.trace_id())
            .unwrap_or_else(|| panic!("no message span in trace {}", p.span_context.trace_id()));
        assert_eq!(child.parent_span_id, p.span_context.span_id());
        assert!(child.parent_span_is_remote);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_span_links_every_message() {
    let (publishes, batches) = run(true).await;
    assert_eq!(publishes.len(), 2);
    let linked: Vec<_> = batches
        .iter()
        .flat_map(|b| b.links.links.iter().map(|l| l.span_context.clone()))
        .collect();
    for p in &publishes {
        assert!(
            linked
                .iter()
                .any(|l| l.trace_id() == p.span_context.trace_id()
                    && l.span_id() == p.span_context.span_id()),
            "no batch span links publish {:?}: {linked:?}",
            p.span_context
        );
    }
}
