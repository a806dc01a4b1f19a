//! `ApiError`: the one place where failures become SPEC error bodies and statuses.

use crate::service::ServiceError;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use rsc_protocol::{ErrorBody, ErrorCode, ErrorDetail};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An error answer: a SPEC code and a human message.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The code; decides the status.
    pub code: ErrorCode,
    /// The explanation.
    pub message: String,
    /// When a retry may succeed, how long until then (ms); also sent as `Retry-After`.
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// The `error` object of the SPEC error body (an item of a batch answer carries it
    /// beside [`ErrorCode::http_status`] instead of answering with it).
    pub fn into_detail(self) -> ErrorDetail {
        ErrorDetail {
            code: self.code,
            message: self.message,
            retry_after_ms: self.retry_after_ms,
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        ApiError {
            retry_after_ms: e.retry_after_ms(),
            ..ApiError::new(e.code(), e.to_string())
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                "request body is over the size limit",
            )
        } else {
            ApiError::new(ErrorCode::InvalidRequest, r.body_text())
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::new(ErrorCode::InvalidRequest, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::new(ErrorCode::InvalidRequest, r.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(code = %self.code, message = %self.message, "request failed");
        }
        let retry_after = self.retry_after_ms;
        let code = self.code;
        let mut response = (
            status,
            axum::Json(ErrorBody {
                error: self.into_detail(),
            }),
        )
            .into_response();
        if let Some(ms) = retry_after {
            // Whole seconds, rounded up (RFC 9110); the body carries the milliseconds.
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, ms.div_ceil(1000).into());
        }
        // For the audit log and metrics, which see only the response.
        response.extensions_mut().insert(code);
        response
    }
}

/// JSON extractor and response whose rejections are SPEC error bodies
/// (`INVALID_REQUEST`, `PAYLOAD_TOO_LARGE`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Every request body is a JSON object; serde alone would also accept an array for a
        // struct (its fields in order), so `Object` accepts a map only. One pass, straight
        // into `T` (no intermediate `Value` tree: that doubled the cost of a heartbeat batch).
        match axum::Json::<Object<T>>::from_request(req, state).await {
            Ok(axum::Json(Object(t))) => Ok(Json(t)),
            Err(JsonRejection::JsonDataError(e)) if e.body_text().contains(NOT_AN_OBJECT) => {
                Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    "the request body must be a JSON object",
                ))
            }
            Err(JsonRejection::JsonDataError(e)) => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "invalid request body: {}",
                    std::error::Error::source(&e).map_or_else(|| e.body_text(), |s| s.to_string())
                ),
            )),
            Err(e) => Err(e.into()),
        }
    }
}

/// What [`Object`] expects, also how its refusal is recognized.
const NOT_AN_OBJECT: &str = "a JSON object (the request body)";

/// A `T` that must come as a JSON object (never as an array of its fields).
struct Object<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(NOT_AN_OBJECT)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
            .map(Object)
    }
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// Path extractor whose rejection is `INVALID_REQUEST`.
#[derive(Debug, Clone)]
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(v) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Path(v))
    }
}

/// Query extractor whose rejection is `INVALID_REQUEST`.
#[derive(Debug, Clone)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(v) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(v))
    }
}
