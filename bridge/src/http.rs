//! The bridge's HTTP server for the application and the kubelet: `POST /v1/publish/{stream}`
//! (through the routed, fenced, idempotent producer), `/healthz`, `/readyz`, `/metrics`.
//! Errors have PROTOCOL's shape, `{"error": {"code": "…", "message": "…"}}` (§4.2).

use crate::deliver::AppState;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use rsc_client::ops::MetricsHandle;
use rsc_client::producer::{Producer, Record};
use rsc_client::{AppHandle, ClientError, ExposeSecret, SecretString};
use rsc_protocol::error::{ErrorBody, ErrorCode, ErrorDetail};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// What the routes share.
#[derive(Clone)]
pub(crate) struct Shared {
    /// The producer of the publish route.
    pub(crate) producer: Producer,
    /// The consumer app (its readiness).
    pub(crate) app: AppHandle,
    /// Each listener's application, by listener name.
    pub(crate) apps: Arc<Vec<(String, Arc<AppState>)>>,
    /// The token the application must present on the publish route.
    pub(crate) token: Option<SecretString>,
    /// The metrics to render.
    pub(crate) metrics: Option<MetricsHandle>,
    /// The largest publish body, in bytes.
    pub(crate) body_limit: usize,
}

/// The routes.
pub(crate) fn router(shared: Shared) -> Router {
    Router::new()
        .route("/v1/publish/{stream}", post(publish))
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { error(ErrorCode::NotFound, "no such route".into()) })
        .with_state(shared)
}

/// An error answer of PROTOCOL's shape.
fn error(code: ErrorCode, message: String) -> Response {
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = ErrorBody {
        error: ErrorDetail {
            code,
            message,
            retry_after_ms: None,
        },
    };
    (status, axum::Json(body)).into_response()
}

async fn readyz(State(s): State<Shared>) -> Response {
    let reason = s.app.not_ready().or_else(|| {
        s.apps.iter().find_map(|(name, st)| {
            st.not_ready()
                .map(|r| format!("listener {name}: the application {r}"))
        })
    });
    match reason {
        None => axum::Json(json!({"status": "ready"})).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "not ready", "reason": reason})),
        )
            .into_response(),
    }
}

async fn metrics(State(s): State<Shared>) -> Response {
    match &s.metrics {
        Some(h) => ([("content-type", "text/plain; version=0.0.4")], h.render()).into_response(),
        None => error(ErrorCode::NotFound, "no metrics recorder".into()),
    }
}

/// One record of a publish request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn {
    /// The routing key (round-robin without one).
    #[serde(default)]
    key: Option<String>,
    /// The payload: any JSON value (stored as its JSON text), or with a non-JSON
    /// `content_type`, a string stored as its bytes.
    #[serde(default)]
    payload: Option<serde_json::Value>,
    /// The payload's bytes, base64 (instead of `payload`).
    #[serde(default)]
    payload_base64: Option<String>,
    /// Headers (strings).
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    /// The payload's content type (default `application/json`, or
    /// `application/octet-stream` with `payload_base64`).
    #[serde(default)]
    content_type: Option<String>,
}

/// A publish request: one record, or `{"records": [...]}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PublishIn {
    Batch { records: Vec<RecordIn> },
    One(RecordIn),
}

impl RecordIn {
    fn into_record(self, i: usize) -> Result<Record, String> {
        let json_type = |ct: &str| {
            let e = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            e == "application/json" || e.ends_with("+json")
        };
        let (bytes, ct) = match (self.payload, self.payload_base64) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "record {i}: payload and payload_base64 exclude each other"
                ));
            }
            (None, None) => {
                return Err(format!("record {i}: payload or payload_base64 is required"));
            }
            (None, Some(b64)) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| format!("record {i}: payload_base64 is not base64: {e}"))?;
                (
                    bytes,
                    Some(
                        self.content_type
                            .unwrap_or_else(|| "application/octet-stream".into()),
                    ),
                )
            }
            (Some(serde_json::Value::String(s)), None)
                if self.content_type.as_deref().is_some_and(|c| !json_type(c)) =>
            {
                (s.into_bytes(), self.content_type)
            }
            (Some(v), None) => (
                v.to_string().into_bytes(),
                self.content_type
                    .filter(|c| !c.eq_ignore_ascii_case("application/json")),
            ),
        };
        let mut r = Record::raw(bytes);
        if let Some(ct) = ct {
            r = r.content_type(ct);
        }
        if let Some(k) = self.key {
            r = r.key(k);
        }
        for (n, v) in self.headers {
            r = r.header(n, v);
        }
        Ok(r)
    }
}

/// Whether the request carries the application token (always, without one).
fn authorized(token: &Option<SecretString>, headers: &HeaderMap) -> bool {
    let Some(want) = token else { return true };
    let got = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    subtle::ConstantTimeEq::ct_eq(got.as_bytes(), want.expose_secret().as_bytes()).into()
}

async fn publish(
    State(s): State<Shared>,
    Path(stream): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !authorized(&s.token, &headers) {
        return error(
            ErrorCode::Unauthenticated,
            "a valid bearer token is required".into(),
        );
    }
    if let Err(e) = rsc_protocol::names::validate_name("stream", &stream) {
        return error(ErrorCode::InvalidRequest, e.to_string());
    }
    let bytes = match axum::body::to_bytes(body, s.body_limit).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                ErrorCode::PayloadTooLarge,
                format!("the body is over {} bytes", s.body_limit),
            );
        }
    };
    let parsed: PublishIn = match serde_json::from_slice(&bytes) {
        Ok(p) => p,
        Err(e) => {
            return error(
                ErrorCode::InvalidRequest,
                format!("the body is not a record or {{\"records\": [...]}}: {e}"),
            );
        }
    };
    let records = match parsed {
        PublishIn::Batch { records } => records,
        PublishIn::One(r) => vec![r],
    };
    if records.is_empty() {
        return error(ErrorCode::InvalidRequest, "no record".into());
    }
    let records: Result<Vec<Record>, String> = records
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.into_record(i))
        .collect();
    let records = match records {
        Ok(r) => r,
        Err(e) => return error(ErrorCode::InvalidRequest, e),
    };
    let n = records.len() as u64;
    match s.producer.publish_batch(&stream, records).await {
        Ok(out) => {
            metrics::counter!("rsc_bridge_published_total", "stream" => stream).increment(n);
            let entries: Vec<_> = out
                .iter()
                .map(|p| json!({"id": p.id, "shard": p.shard}))
                .collect();
            axum::Json(json!({"entries": entries})).into_response()
        }
        Err(e) => {
            let code = error_code(&e);
            metrics::counter!("rsc_bridge_publish_errors_total", "stream" => stream, "code" => code.as_str())
                .increment(1);
            tracing::warn!(error = %e.chain(), "publish failed");
            error(code, e.chain())
        }
    }
}

/// The PROTOCOL error code of a failed publish.
fn error_code(e: &ClientError) -> ErrorCode {
    match e {
        ClientError::Coordinator(c) => c.code().unwrap_or(ErrorCode::StoreUnavailable),
        ClientError::DeliveryTimeout { source, .. } => match &**source {
            ClientError::Coordinator(c) if c.code() == Some(ErrorCode::StreamNotFound) => {
                ErrorCode::StreamNotFound
            }
            _ => ErrorCode::StoreUnavailable,
        },
        ClientError::Config(_) | ClientError::Encode(_) | ClientError::Codec { .. } => {
            ErrorCode::InvalidRequest
        }
        _ if e.is_retriable() || e.is_timeout() => ErrorCode::StoreUnavailable,
        ClientError::Redis(_)
        | ClientError::DataRedisUnreachable { .. }
        | ClientError::StaleRouting { .. } => ErrorCode::StoreUnavailable,
        _ => ErrorCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Vec<Record>, String> {
        let p: PublishIn = serde_json::from_str(body).map_err(|e| e.to_string())?;
        let rs = match p {
            PublishIn::Batch { records } => records,
            PublishIn::One(r) => vec![r],
        };
        rs.into_iter()
            .enumerate()
            .map(|(i, r)| r.into_record(i))
            .collect()
    }

    #[test]
    fn records_from_json() {
        let one = parse(r#"{"key":"k1","payload":{"n":1},"headers":{"a":"b"}}"#).unwrap();
        assert_eq!(
            one,
            [Record::raw(br#"{"n":1}"#.to_vec())
                .key("k1")
                .header("a", "b")]
        );
        let text = parse(r#"{"payload":"hé","content_type":"text/plain"}"#).unwrap();
        assert_eq!(
            text,
            [Record::raw("hé".as_bytes().to_vec()).content_type("text/plain")]
        );
        let bytes = parse(r#"{"records":[{"payload_base64":"/wA="},{"payload":"s"}]}"#).unwrap();
        assert_eq!(
            bytes,
            [
                Record::raw(vec![0xff, 0]).content_type("application/octet-stream"),
                Record::raw(br#""s""#.to_vec())
            ]
        );
        assert!(parse(r#"{"key":"k"}"#).unwrap_err().contains("required"));
        assert!(parse(r#"{"payload":1,"payload_base64":"AA=="}"#).is_err());
        assert!(parse(r#"{"payload_base64":"%%"}"#).is_err());
        assert!(parse(r#"{"payload":1,"extra":2}"#).is_err());
    }

    #[test]
    fn the_token_is_checked() {
        let mut h = HeaderMap::new();
        assert!(authorized(&None, &h));
        let t = Some(SecretString::from("s3cret".to_owned()));
        assert!(!authorized(&t, &h));
        h.insert("authorization", "Bearer nope".parse().unwrap());
        assert!(!authorized(&t, &h));
        h.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(authorized(&t, &h));
    }
}
