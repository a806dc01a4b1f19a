//! The HTTP API of a real `rsc-coordinator` process, on every store backend.

use reqwest::StatusCode;
use rsc_e2e::{Backend, Stack, code, store_suite};
use serde_json::json;

store_suite!(join_and_routing_over_a_real_socket);

async fn join_and_routing_over_a_real_socket(backend: Backend) {
    let stack = Stack::start(backend, &[]);
    let api = &stack.api;
    let (s, _) = api
        .post(
            "/v1/groups",
            json!({"group": "g", "stream": "s", "shard_count": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, body) = api.heartbeat("g", "m1", 0, &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["assignment"], json!([0, 1]));
    let (s, body) = api.heartbeat("g", "m1", 7, &[]).await;
    assert_eq!(
        (s, code(&body)),
        (StatusCode::CONFLICT, "FENCED_MEMBER_EPOCH")
    );
}
