//! The administrative calls of the operators' command line: groups, streams, resharding,
//! pausing, member removal. They use the client's timeout
//! ([`crate::CoordinatorClientBuilder::timeout`]) and keep the JSON the coordinator sent
//! beside the typed view ([`Fetched`]).

use crate::client::{CoordinatorClient, Fetched, Request};
use crate::error::CoordinatorError;
use reqwest::Method;
use rsc_protocol::{
    CreateGroupRequest, GroupList, GroupView, PatchStreamRequest, ReshardRequest, StreamList,
    StreamView,
};
use serde::de::DeserializeOwned;

impl CoordinatorClient {
    /// `POST /v1/groups`.
    pub async fn create_group(
        &self,
        req: &CreateGroupRequest,
    ) -> Result<Fetched<GroupView>, CoordinatorError> {
        let request = Request::new(Method::POST, &["v1", "groups"]).body(req);
        self.json(request).await.1
    }

    /// `GET /v1/groups/{group}`.
    pub async fn describe_group(
        &self,
        group: &str,
    ) -> Result<Fetched<GroupView>, CoordinatorError> {
        self.get(&["v1", "groups", group]).await
    }

    /// `GET /v1/groups`.
    pub async fn list_groups(&self) -> Result<Fetched<GroupList>, CoordinatorError> {
        self.get(&["v1", "groups"]).await
    }

    /// `DELETE /v1/groups/{group}[?force=true]`.
    pub async fn delete_group(&self, group: &str, force: bool) -> Result<(), CoordinatorError> {
        let path = ["v1", "groups", group];
        let mut request = Request::new(Method::DELETE, &path);
        if force {
            request = request.query("force=true");
        }
        self.exchange(request).await.1.map(drop)
    }

    /// `POST /v1/groups/{group}/pause` (`paused`) or `/resume`.
    pub async fn set_group_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> Result<Fetched<GroupView>, CoordinatorError> {
        let action = if paused { "pause" } else { "resume" };
        let path = ["v1", "groups", group, action];
        self.json(Request::new(Method::POST, &path)).await.1
    }

    /// `DELETE /v1/groups/{group}/members/{member}`: fences the member and reassigns its
    /// shards at once.
    pub async fn remove_member(&self, group: &str, member: &str) -> Result<(), CoordinatorError> {
        let path = ["v1", "groups", group, "members", member];
        self.exchange(Request::new(Method::DELETE, &path))
            .await
            .1
            .map(drop)
    }

    /// `GET /v1/streams/{stream}`.
    pub async fn describe_stream(
        &self,
        stream: &str,
    ) -> Result<Fetched<StreamView>, CoordinatorError> {
        self.get(&["v1", "streams", stream]).await
    }

    /// `GET /v1/streams`.
    pub async fn list_streams(&self) -> Result<Fetched<StreamList>, CoordinatorError> {
        self.get(&["v1", "streams"]).await
    }

    /// `POST /v1/streams/{stream}/reshard`.
    pub async fn reshard(
        &self,
        stream: &str,
        shard_count: u32,
    ) -> Result<Fetched<StreamView>, CoordinatorError> {
        let path = ["v1", "streams", stream, "reshard"];
        let body = ReshardRequest { shard_count };
        self.json(Request::new(Method::POST, &path).body(&body))
            .await
            .1
    }

    /// `PATCH /v1/streams/{stream}`: the stream's retention policies (PROTOCOL §18).
    pub async fn patch_stream(
        &self,
        stream: &str,
        patch: &PatchStreamRequest,
    ) -> Result<Fetched<StreamView>, CoordinatorError> {
        let path = ["v1", "streams", stream];
        self.json(Request::new(Method::PATCH, &path).body(patch))
            .await
            .1
    }

    /// `POST /v1/groups/{group}/seek` (PROTOCOL §18): the plan per shard, carried out
    /// unless `req.dry_run`.
    pub async fn seek(
        &self,
        group: &str,
        req: &rsc_protocol::SeekRequest,
    ) -> Result<Fetched<rsc_protocol::SeekResponse>, CoordinatorError> {
        let path = ["v1", "groups", group, "seek"];
        self.json(Request::new(Method::POST, &path).body(req))
            .await
            .1
    }

    /// `POST /v1/streams/{stream}/dlq/redrive` (PROTOCOL §18): republishes a group's dead
    /// letters (or, with `dry_run`, lists what would be).
    pub async fn redrive(
        &self,
        stream: &str,
        req: &rsc_protocol::RedriveRequest,
    ) -> Result<Fetched<rsc_protocol::RedriveResponse>, CoordinatorError> {
        let path = ["v1", "streams", stream, "dlq", "redrive"];
        self.json(Request::new(Method::POST, &path).body(req))
            .await
            .1
    }

    /// `GET /v1/streams/{stream}/dlq` (PROTOCOL §18): one page of the stream's dead letters
    /// that the query's filters take, with the depth per group. `query` holds the query
    /// parameters (`group`, `key`, `error`, `since_ms`, `until_ms`, `count`, `after`,
    /// `newest_first`), encoded here.
    pub async fn dlq_list(
        &self,
        stream: &str,
        query: &[(&str, String)],
    ) -> Result<Fetched<rsc_protocol::DlqList>, CoordinatorError> {
        let path = ["v1", "streams", stream, "dlq"];
        let mut url = reqwest::Url::parse("http://query.invalid/").expect("a valid URL");
        url.query_pairs_mut()
            .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        let q = url.query().unwrap_or_default().to_owned();
        let mut request = Request::new(Method::GET, &path);
        if !q.is_empty() {
            request = request.query(&q);
        }
        self.json(request).await.1
    }

    /// `POST /v1/streams/{stream}/dlq/purge` (PROTOCOL §18): deletes the stream's dead
    /// letters that the request's filters take (with `dry_run`, lists what would be).
    pub async fn dlq_purge(
        &self,
        stream: &str,
        req: &rsc_protocol::DlqPurgeRequest,
    ) -> Result<Fetched<rsc_protocol::DlqPurgeResponse>, CoordinatorError> {
        let path = ["v1", "streams", stream, "dlq", "purge"];
        self.json(Request::new(Method::POST, &path).body(req))
            .await
            .1
    }

    /// `POST /v1/streams/{stream}/rollback`.
    pub async fn rollback(&self, stream: &str) -> Result<Fetched<StreamView>, CoordinatorError> {
        let path = ["v1", "streams", stream, "rollback"];
        self.json(Request::new(Method::POST, &path)).await.1
    }

    /// `GET /v1/groups/{group}/revisions` or, with `stream`, `GET /v1/streams/{name}/revisions`
    /// (PROTOCOL §22), with `query` (`before=R&limit=N`, may be empty); the answer decoded
    /// as `T` (the coordinator's `RevisionsPage`).
    pub async fn revisions<T: DeserializeOwned>(
        &self,
        name: &str,
        stream: bool,
        query: &str,
    ) -> Result<Fetched<T>, CoordinatorError> {
        let kind = if stream { "streams" } else { "groups" };
        let path = ["v1", kind, name, "revisions"];
        let mut request = Request::new(Method::GET, &path);
        if !query.is_empty() {
            request = request.query(query);
        }
        self.json(request).await.1
    }

    /// `GET /v1/groups/{group}/diff?from=R1&to=R2` (PROTOCOL §22), decoded as `T` (the
    /// coordinator's `DiffView`).
    pub async fn group_diff<T: DeserializeOwned>(
        &self,
        group: &str,
        from: u64,
        to: u64,
    ) -> Result<Fetched<T>, CoordinatorError> {
        let path = ["v1", "groups", group, "diff"];
        let query = format!("from={from}&to={to}");
        self.json(Request::new(Method::GET, &path).query(&query))
            .await
            .1
    }

    /// `POST /v1/groups/{group}/restore` with `body` (`{revision, force, dry_run}`, PROTOCOL
    /// §22), decoded as `T` (the coordinator's `RestorePlan`).
    pub async fn restore_group<T: DeserializeOwned>(
        &self,
        group: &str,
        body: &serde_json::Value,
    ) -> Result<Fetched<T>, CoordinatorError> {
        let path = ["v1", "groups", group, "restore"];
        self.json(Request::new(Method::POST, &path).body(body))
            .await
            .1
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &[&str],
    ) -> Result<Fetched<T>, CoordinatorError> {
        self.json(Request::new(Method::GET, path)).await.1
    }
}
