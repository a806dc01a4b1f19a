//! Helpers shared by the end-to-end tests: a small JSON client for the coordinator's API.
#![deny(missing_docs)]

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// A JSON client for one coordinator.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    /// A client for the coordinator at `base` (`http://HOST:PORT`).
    pub fn new(base: impl Into<String>) -> Self {
        Api {
            http: reqwest::Client::new(),
            base: base.into(),
            token: None,
        }
    }

    /// The same client sending `Authorization: Bearer TOKEN`.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sends a request; returns the status and the JSON body (`Null` when empty).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("coordinator reachable");
        let status = resp.status();
        let text = resp.text().await.expect("body readable");
        let json = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, json)
    }

    /// GET.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    /// POST with a JSON body.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// A heartbeat; returns status and body.
    pub async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        epoch: i64,
        owned: &[u32],
    ) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/groups/{group}/heartbeat"),
            serde_json::json!({"protocol_version": 1, "member_id": member, "member_epoch": epoch, "owned_shards": owned}),
        )
        .await
    }
}

/// The `error.code` of an error body.
pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// The metadata stores a protocol suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `--store memory`.
    Memory,
}

/// A coordinator process on one backend, plus whatever that backend needs running.
#[derive(Debug)]
pub struct Stack {
    /// The coordinator process.
    pub coordinator: rsc_testkit::CoordinatorProcess,
    /// A client for it.
    pub api: Api,
}

impl Stack {
    /// Starts a coordinator on `backend` with extra `serve` flags.
    pub fn start(backend: Backend, extra: &[&str]) -> Self {
        let mut args: Vec<&str> = vec!["--sweep-interval-ms", "20"];
        match backend {
            Backend::Memory => args.extend(["--store", "memory"]),
        }
        args.extend_from_slice(extra);
        let coordinator =
            rsc_testkit::CoordinatorProcess::start(&args).expect("coordinator starts");
        let api = Api::new(coordinator.url());
        Stack { coordinator, api }
    }
}

/// Declares one async test per backend for each listed suite function
/// (`async fn(Backend)`): `store_suite!(heartbeat_basics, leave_frees_at_once);`
#[macro_export]
macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::Backend::Memory).await;
                }
            )*
        }
    };
}
