//! Protocol compatibility: frozen v1 client request shapes (`tests/compat/v1/`) still work
//! against the current coordinator, and every field those clients read is still answered.

use reqwest::{Method, StatusCode};
use rsc_e2e::{Backend, Stack};
use serde_json::Value;

fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

#[tokio::test]
async fn frozen_v1_flow_still_works() {
    let flow: Value = serde_json::from_str(include_str!("compat/v1/flow.json")).unwrap();
    let stack = Stack::start(Backend::Memory, &[]);
    for (i, step) in flow["steps"].as_array().unwrap().iter().enumerate() {
        let method = Method::from_bytes(step["method"].as_str().unwrap().as_bytes()).unwrap();
        let path = step["path"].as_str().unwrap();
        let (status, body) = stack.api.call(method, path, step.get("body").cloned()).await;
        let want = StatusCode::from_u16(step["status"].as_u64().unwrap() as u16).unwrap();
        assert_eq!(status, want, "step {i} {path}: {body}");
        for read in step["reads"].as_array().unwrap() {
            let read = read.as_str().unwrap();
            assert!(field(&body, read).is_some(), "step {i} {path}: field {read} missing from {body}");
        }
    }
}
