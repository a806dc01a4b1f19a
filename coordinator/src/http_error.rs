//! [`ApiError`]: the one place where failures become protocol error bodies and statuses.
//!
//! Its own module, below both [`crate::api`] (the handlers) and [`crate::auth`] (the
//! authentication and authorization layer), which both answer with it.

use crate::service::ServiceError;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rsc_protocol::{ErrorBody, ErrorCode, ErrorDetail};

/// An error answer: a protocol error code and a human message.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// The code; decides the status.
    pub code: ErrorCode,
    /// The explanation.
    pub message: String,
    /// When a retry may succeed, how long until then (ms); also sent as `Retry-After`.
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    /// An error with this code and message.
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// The `error` object of the protocol error body (an item of a batch answer carries it
    /// beside [`ErrorCode::http_status`] instead of answering with it).
    pub(crate) fn into_detail(self) -> ErrorDetail {
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
