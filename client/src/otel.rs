//! W3C trace context through entries (feature `otel`): the producer writes the current
//! span's `traceparent` and `tracestate` into each entry's `headers`; the `message` span of
//! its handler continues that trace, and a `batch` span links every message's context.
//! Without the feature these are no-ops.

use crate::message::{Entry, Headers};

#[cfg(feature = "otel")]
mod imp {
    use super::{Entry, Headers};
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use std::str::FromStr;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The current span's `traceparent` (and non-empty `tracestate`), if it is in a trace.
    pub(crate) fn current() -> Option<(String, Option<String>)> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        let state = sc.trace_state().header();
        Some((traceparent, (!state.is_empty()).then_some(state)))
    }

    /// The remote span context an entry's headers carry (W3C `traceparent` version 00 and
    /// its `tracestate`); `None` when absent or malformed.
    pub(crate) fn parse(headers: &Headers) -> Option<SpanContext> {
        let tp = headers.get("traceparent")?.trim();
        let mut parts = tp.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?) & TraceFlags::SAMPLED;
        let state = headers
            .get("tracestate")
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default();
        let sc = SpanContext::new(trace_id, span_id, flags, true, state);
        sc.is_valid().then_some(sc)
    }

    pub(crate) fn continue_trace(span: &tracing::Span, entry: &Entry) {
        if let Some(sc) = parse(&entry.headers) {
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
        }
    }

    pub(crate) fn link_all<'a>(span: &tracing::Span, entries: impl Iterator<Item = &'a Entry>) {
        for entry in entries {
            if let Some(sc) = parse(&entry.headers) {
                span.add_link(sc);
            }
        }
    }
}

#[cfg(not(feature = "otel"))]
mod imp {
    use super::Entry;

    pub(crate) fn current() -> Option<(String, Option<String>)> {
        None
    }

    pub(crate) fn continue_trace(_span: &tracing::Span, _entry: &Entry) {}

    pub(crate) fn link_all<'a>(_span: &tracing::Span, _entries: impl Iterator<Item = &'a Entry>) {}
}

pub(crate) use imp::{continue_trace, current, link_all};

/// Writes the trace context `current()` returned into `headers`, unless the caller set a
/// `traceparent` already.
pub(crate) fn inject(headers: &mut Headers, trace: &Option<(String, Option<String>)>) {
    if let Some((traceparent, state)) = trace
        && !headers.contains_key("traceparent")
    {
        headers.insert("traceparent".into(), traceparent.clone());
        if let Some(state) = state {
            headers.insert("tracestate".into(), state.clone());
        }
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::imp::parse;
    use super::*;

    #[test]
    fn parses_w3c_traceparent() {
        let mut h = Headers::new();
        h.insert(
            "traceparent".into(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        );
        h.insert("tracestate".into(), "vendor=v1".into());
        let sc = parse(&h).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(sc.trace_state().get("vendor"), Some("v1"));
        for bad in [
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-xyz-b7ad6b7169203331-01",
        ] {
            h.insert("traceparent".into(), bad.into());
            assert!(parse(&h).is_none(), "{bad}");
        }
    }
}
