//! The HTTP client of the coordinator's `/v1` API, with failover over several URLs.

use crate::error::CoordinatorError;
use rsc_protocol::{
    ErrorBody, HeartbeatBatchRequest, HeartbeatBatchResponse, HeartbeatRequest, HeartbeatResponse,
    RoutingResponse, WakeChannelRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A client for one or more coordinators (the same cluster behind several URLs). Requests go
/// to the current URL; a transport error or a 5xx moves on to the next one.
#[derive(Debug, Clone)]
pub(crate) struct CoordinatorClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    urls: Vec<String>,
    current: AtomicUsize,
    token: Option<String>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorClient")
            .field("urls", &self.urls)
            .field("current", &self.current)
            .field("token", &rsc_protocol::redact::redact_opt(&self.token))
            .finish_non_exhaustive()
    }
}

impl CoordinatorClient {
    /// `urls` must not be empty (the configuration checks it).
    pub(crate) fn new(urls: Vec<String>, token: Option<String>) -> Self {
        let urls = urls
            .into_iter()
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .collect();
        CoordinatorClient {
            inner: Arc::new(Inner {
                http: reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(2))
                    .build()
                    .unwrap_or_default(),
                urls,
                current: AtomicUsize::new(0),
                token,
            }),
        }
    }

    /// The URL requests go to now.
    pub(crate) fn current_url(&self) -> &str {
        let i = self.inner.current.load(Ordering::Relaxed) % self.inner.urls.len();
        &self.inner.urls[i]
    }

    /// `POST /v1/groups/{group}/heartbeat`.
    pub(crate) async fn heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
        timeout: Duration,
    ) -> Result<HeartbeatResponse, CoordinatorError> {
        self.send(
            reqwest::Method::POST,
            &format!("/v1/groups/{group}/heartbeat"),
            Some(req),
            timeout,
        )
        .await
    }

    /// `POST /v1/heartbeats`: several members' heartbeats in one request. Returns the URL of
    /// the coordinator that answered (item errors name it, as the single route's errors do).
    pub(crate) async fn heartbeat_batch(
        &self,
        req: &HeartbeatBatchRequest,
        timeout: Duration,
    ) -> (String, Result<HeartbeatBatchResponse, CoordinatorError>) {
        self.send_with_url(reqwest::Method::POST, "/v1/heartbeats", Some(req), timeout)
            .await
    }

    /// A heartbeat with epoch -1: leaves the group at once (not epoch-checked). A static
    /// member (with its `incarnation`) leaves with -2 instead: it keeps its shards until it is
    /// back or its session expires.
    pub(crate) async fn leave(
        &self,
        group: &str,
        member_id: &str,
        incarnation: Option<&str>,
        timeout: Duration,
    ) -> Result<(), CoordinatorError> {
        let req = HeartbeatRequest {
            protocol_version: rsc_protocol::PROTOCOL_VERSION,
            member_id: member_id.to_owned(),
            member_epoch: if incarnation.is_some() { -2 } else { -1 },
            owned_shards: Vec::new(),
            drained_shards: Vec::new(),
            client: None,
            incarnation: incarnation.map(str::to_owned),
        };
        let _: serde_json::Value = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/groups/{group}/heartbeat"),
                Some(&req),
                timeout,
            )
            .await?;
        Ok(())
    }

    /// `POST /v1/wakeups`: opens a wake-up channel on the current coordinator (moving to
    /// the next URL after a transport error or a 5xx, as every request does). Returns the
    /// URL and the streaming response (status 200); no overall timeout, only the connect one.
    pub(crate) async fn open_wake_channel(
        &self,
        req: &WakeChannelRequest,
    ) -> (String, Result<reqwest::Response, CoordinatorError>) {
        let index = self.inner.current.load(Ordering::Relaxed) % self.inner.urls.len();
        let url = self.inner.urls[index].clone();
        let mut r = self.inner.http.post(format!("{url}/v1/wakeups")).json(req);
        if let Some(t) = &self.inner.token {
            r = r.bearer_auth(t);
        }
        let result = async {
            let transport = |source| CoordinatorError::Transport {
                url: url.clone(),
                source: Arc::new(source),
            };
            let resp = r.send().await.map_err(transport)?;
            let status = resp.status().as_u16();
            if status == 200 {
                return Ok(resp);
            }
            let bytes = resp.bytes().await.map_err(transport)?;
            Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(body) => CoordinatorError::Api {
                    url: url.clone(),
                    status,
                    code: body.error.code,
                    message: body.error.message,
                    retry_after_ms: body.error.retry_after_ms,
                },
                Err(_) => CoordinatorError::Unexpected {
                    url: url.clone(),
                    status,
                    body: String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned(),
                },
            })
        }
        .await;
        if let Err(e) = &result
            && e.suggests_failover()
            && self.inner.urls.len() > 1
        {
            let next = (index + 1) % self.inner.urls.len();
            let _ = self.inner.current.compare_exchange(
                index,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        (url, result)
    }

    /// `GET /v1/streams/{stream}/routing`.
    pub(crate) async fn routing(
        &self,
        stream: &str,
        timeout: Duration,
    ) -> Result<RoutingResponse, CoordinatorError> {
        self.send::<(), _>(
            reqwest::Method::GET,
            &format!("/v1/streams/{stream}/routing"),
            None,
            timeout,
        )
        .await
    }

    async fn send<B: Serialize, R: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<R, CoordinatorError> {
        self.send_with_url(method, path, body, timeout).await.1
    }

    /// [`Self::send`], also returning the URL the request went to.
    async fn send_with_url<B: Serialize, R: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> (String, Result<R, CoordinatorError>) {
        let index = self.inner.current.load(Ordering::Relaxed) % self.inner.urls.len();
        let url = self.inner.urls[index].clone();
        let result = self.send_to(&url, method, path, body, timeout).await;
        if let Err(e) = &result
            && e.suggests_failover()
            && self.inner.urls.len() > 1
        {
            // Move on only if nobody else already did.
            let next = (index + 1) % self.inner.urls.len();
            let _ = self.inner.current.compare_exchange(
                index,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            tracing::warn!(from = %url, to = %self.inner.urls[next], error = %e, "coordinator failover");
        }
        (url, result)
    }

    async fn send_to<B: Serialize, R: DeserializeOwned>(
        &self,
        url: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<R, CoordinatorError> {
        let mut req = self
            .inner
            .http
            .request(method, format!("{url}{path}"))
            .timeout(timeout);
        if let Some(t) = &self.inner.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |source| CoordinatorError::Transport {
            url: url.to_owned(),
            source: Arc::new(source),
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(transport)?;
        let unexpected = || CoordinatorError::Unexpected {
            url: url.to_owned(),
            status,
            body: String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned(),
        };
        if (200..300).contains(&status) {
            serde_json::from_slice(&bytes).map_err(|_| unexpected())
        } else {
            match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(body) => Err(CoordinatorError::Api {
                    url: url.to_owned(),
                    status,
                    code: body.error.code,
                    message: body.error.message,
                    retry_after_ms: body.error.retry_after_ms,
                }),
                Err(_) => Err(unexpected()),
            }
        }
    }
}
