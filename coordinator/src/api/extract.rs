//! Extractors and a JSON response whose rejections are protocol error bodies ([`ApiError`]).

use crate::http_error::ApiError;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use rsc_protocol::ErrorCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// JSON extractor and response whose rejections are protocol error bodies
/// (`INVALID_REQUEST`, `PAYLOAD_TOO_LARGE`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Every request body is a JSON object; serde alone would also accept an array for a
        // struct (its fields in order), so `Object` accepts a map only. One pass, straight
        // into `T` (no intermediate `Value` tree: that doubled the cost of a heartbeat batch).
        // The plain `application/json` body is parsed without `axum::Json`'s error-path
        // tracking, which costs every field of every request; only a body that fails is
        // parsed again through `axum::Json`, so the rejection (and its message, with the
        // field's path) is the one `axum::Json` gives. Any other content type goes through
        // `axum::Json` whole.
        let plain = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == b"application/json");
        if !plain {
            return match axum::Json::<Object<T>>::from_request(req, state).await {
                Ok(axum::Json(Object(t))) => Ok(Json(t)),
                Err(e) => Err(json_rejection(e)),
            };
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| json_rejection(e.into()))?;
        if let Ok(Object(t)) = serde_json::from_slice::<Object<T>>(&bytes) {
            return Ok(Json(t));
        }
        match axum::Json::<Object<T>>::from_bytes(&bytes) {
            Ok(axum::Json(Object(t))) => Ok(Json(t)),
            Err(e) => Err(json_rejection(e)),
        }
    }
}

/// The protocol's error for a JSON body refused by `axum::Json`.
fn json_rejection(e: JsonRejection) -> ApiError {
    match e {
        JsonRejection::JsonDataError(e) if e.body_text().contains(NOT_AN_OBJECT) => ApiError::new(
            ErrorCode::InvalidRequest,
            "the request body must be a JSON object",
        ),
        JsonRejection::JsonDataError(e) => ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "invalid request body: {}",
                std::error::Error::source(&e).map_or_else(|| e.body_text(), |s| s.to_string())
            ),
        ),
        e => e.into(),
    }
}

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
pub(crate) struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            // A typed id refused by the name rule (PROTOCOL §1): its explanation alone, as
            // for a bad id in a body ("group id \"-x\" must start with a letter or a digit").
            Err(PathRejection::FailedToDeserializePathParams(e))
                if matches!(e.kind(), ErrorKind::Message(_)) =>
            {
                let ErrorKind::Message(m) = e.into_kind() else {
                    unreachable!("matched above")
                };
                Err(ApiError::new(ErrorCode::InvalidRequest, m))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Query extractor whose rejection is `INVALID_REQUEST`.
#[derive(Debug, Clone)]
pub(crate) struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(v) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(v))
    }
}
