//! The calls of members and producers: heartbeats, leaving, routing, the wake-up channel.
//!
//! Each takes its own timeout (a member's heartbeat deadline, a producer's routing budget)
//! instead of the client's.

use crate::client::{CoordinatorClient, Request};
use crate::error::CoordinatorError;
use reqwest::Method;
use rsc_protocol::{
    HeartbeatBatchRequest, HeartbeatBatchResponse, HeartbeatRequest, HeartbeatResponse,
    MemberEpoch, RoutingResponse, WakeChannelRequest,
};
use std::time::Duration;

impl CoordinatorClient {
    /// `POST /v1/groups/{group}/heartbeat`.
    pub async fn heartbeat(
        &self,
        group: &str,
        req: &HeartbeatRequest,
        timeout: Duration,
    ) -> Result<HeartbeatResponse, CoordinatorError> {
        let path = ["v1", "groups", group, "heartbeat"];
        let request = Request::new(Method::POST, &path).body(req).timeout(timeout);
        self.json(request).await.1.map(|f| f.view)
    }

    /// `POST /v1/heartbeats`: several members' heartbeats in one request. Returns the URL of
    /// the coordinator that answered (item errors name it, as the single route's errors do).
    pub async fn heartbeat_batch(
        &self,
        req: &HeartbeatBatchRequest,
        timeout: Duration,
    ) -> (String, Result<HeartbeatBatchResponse, CoordinatorError>) {
        let request = Request::new(Method::POST, &["v1", "heartbeats"])
            .body(req)
            .timeout(timeout);
        let (url, result) = self.json(request).await;
        (url, result.map(|f| f.view))
    }

    /// A heartbeat with epoch -1: leaves the group at once (not epoch-checked). With the
    /// `incarnation` the member joined with, the coordinator refuses it when another process
    /// run holds the id (PROTOCOL §11), so a replaced run cannot end the live one's membership.
    pub async fn leave(
        &self,
        group: &str,
        member_id: &str,
        incarnation: Option<&str>,
        timeout: Duration,
    ) -> Result<(), CoordinatorError> {
        self.leave_with(
            group,
            member_id,
            MemberEpoch::LEAVE.get(),
            incarnation,
            timeout,
        )
        .await
    }

    /// A heartbeat with epoch -2: a static member stops for a restart (PROTOCOL §11). It keeps
    /// its shards, unread, until it joins again or its session expires.
    pub async fn step_away(
        &self,
        group: &str,
        member_id: &str,
        incarnation: &str,
        timeout: Duration,
    ) -> Result<(), CoordinatorError> {
        self.leave_with(
            group,
            member_id,
            MemberEpoch::STEP_AWAY.get(),
            Some(incarnation),
            timeout,
        )
        .await
    }

    async fn leave_with(
        &self,
        group: &str,
        member_id: &str,
        member_epoch: i64,
        incarnation: Option<&str>,
        timeout: Duration,
    ) -> Result<(), CoordinatorError> {
        let req = HeartbeatRequest {
            protocol_version: rsc_protocol::PROTOCOL_VERSION,
            member_id: member_id.to_owned(),
            member_epoch,
            owned_shards: Some(Vec::new()),
            drained_shards: Vec::new(),
            client: None,
            incarnation: incarnation.map(str::to_owned),
        };
        let path = ["v1", "groups", group, "heartbeat"];
        let request = Request::new(Method::POST, &path)
            .body(&req)
            .timeout(timeout);
        self.json::<serde_json::Value>(request).await.1.map(drop)
    }

    /// `GET /v1/streams/{stream}/routing`.
    pub async fn routing(
        &self,
        stream: &str,
        timeout: Duration,
    ) -> Result<RoutingResponse, CoordinatorError> {
        let path = ["v1", "streams", stream, "routing"];
        let request = Request::new(Method::GET, &path).timeout(timeout);
        self.json(request).await.1.map(|f| f.view)
    }

    /// `POST /v1/wakeups`: opens a wake-up channel on the current coordinator (moving to
    /// the next URL after a transport error or a 5xx, as every request does). Returns the
    /// coordinator's URL and the streaming response (status 200), to read as server-sent
    /// events. Only the connect timeout applies (and the client's, if it was given one).
    pub async fn open_wake_channel(
        &self,
        req: &WakeChannelRequest,
    ) -> (String, Result<reqwest::Response, CoordinatorError>) {
        let request = Request::new(Method::POST, &["v1", "wakeups"]).body(req);
        let (url, result) = self.exchange(request).await;
        let result = match result {
            Ok(resp) if resp.status() != reqwest::StatusCode::OK => {
                Err(CoordinatorError::Unexpected {
                    url: url.clone(),
                    status: resp.status().as_u16(),
                    body: "the wake-up channel answered without a stream".into(),
                })
            }
            other => other,
        };
        (url, result)
    }
}
