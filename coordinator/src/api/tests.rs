//! The router, the access policy table and the OpenAPI document agree.

use super::openapi::BEARER;
use super::*;
use crate::audit::{Auditor, RevisionRecordingStore};
use crate::auth::policy::ROUTES;
use crate::auth::{AdminRateLimiter, Security};
use crate::clock::SystemClock;
use crate::service::ServiceConfig;
use crate::store::{MemoryStore, MetadataStore};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use std::num::NonZeroU32;
use tower::ServiceExt;

fn app() -> Router {
    app_with_store().0
}

fn app_with_store() -> (Router, Arc<dyn MetadataStore>) {
    let store: Arc<dyn MetadataStore> =
        Arc::new(RevisionRecordingStore::new(Arc::new(MemoryStore::new())));
    let clock = Arc::new(SystemClock);
    let n = NonZeroU32::new(1000).unwrap();
    let security = Arc::new(Security::new(
        None,
        AdminRateLimiter::new(n, n),
        Auditor::new(store.clone(), clock.clone()),
        DEFAULT_BODY_LIMIT,
    ));
    let coordinator = Coordinator::new(store.clone(), clock, ServiceConfig::default());
    let app = router(
        AppState::new(super::Shared {
            coordinator,
            security,
            lag: None,
            history: crate::metrics::History::new(crate::metrics::DEFAULT_HISTORY_INTERVAL),
        }),
        DEFAULT_BODY_LIMIT,
    );
    (app, store)
}

/// A concrete path for a template: `{x}` → `x1`.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                format!("{}1", &seg[1..seg.len() - 1])
            } else {
                seg.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn doc_operations() -> Vec<(String, String)> {
    let doc = serde_json::to_value(openapi()).unwrap();
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "put", "post", "patch", "delete", "head", "options"] {
            if item.get(method).is_some() {
                ops.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops.sort();
    ops
}

#[test]
fn every_route_of_the_policy_table_is_documented_and_vice_versa() {
    let mut table: Vec<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_owned(), r.path.to_owned()))
        .collect();
    table.sort();
    let doc = doc_operations();
    let missing: Vec<_> = table.iter().filter(|r| !doc.contains(r)).collect();
    assert!(
        missing.is_empty(),
        "routes missing from the OpenAPI document: {missing:?}"
    );
    let unknown: Vec<_> = doc.iter().filter(|r| !table.contains(r)).collect();
    assert!(
        unknown.is_empty(),
        "documented operations without an access policy: {unknown:?}"
    );
}

#[tokio::test]
async fn the_router_serves_every_route_of_the_table() {
    let app = app();
    for r in ROUTES {
        let req = Request::builder()
            .method(r.method)
            .uri(concrete(r.path))
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let code = json["error"]["code"].as_str().unwrap_or("");
        assert!(
            code != "NOT_FOUND" && code != "METHOD_NOT_ALLOWED",
            "{} {} is not served: {json}",
            r.method,
            r.path
        );
    }
    // And a route that does not exist is not served.
    let req = Request::builder()
        .uri("/v1/nope")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let req = Request::builder()
        .method("PUT")
        .uri("/v1/groups")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        app.oneshot(req).await.unwrap().status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[test]
fn the_document_is_openapi_3_1_with_error_bodies_and_bearer_security() {
    let doc = serde_json::to_value(openapi()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"][BEARER]["scheme"],
        "bearer"
    );
    let create = &doc["paths"]["/v1/groups"]["post"];
    for status in ["201", "400", "401", "403", "409", "413", "429", "503"] {
        assert!(
            create["responses"].get(status).is_some(),
            "POST /v1/groups lacks {status}"
        );
    }
    assert_eq!(
        create["responses"]["403"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ErrorBody"
    );
    assert!(
        create["responses"]["429"]["headers"]
            .get("Retry-After")
            .is_some()
    );
    assert_eq!(create["security"][0][BEARER], serde_json::json!([]));
    assert!(doc["paths"]["/healthz"]["get"].get("security").is_none());
    for schema in [
        "ErrorBody",
        "ErrorCode",
        "GroupView",
        "HeartbeatRequest",
        "AuditList",
    ] {
        assert!(
            doc["components"]["schemas"].get(schema).is_some(),
            "schema {schema} missing"
        );
    }
}

/// The OpenAPI document says what PROTOCOL §5 says of `owned_shards` (tests/contract.rs holds
/// the PROTOCOL side): optional on the wire, and a heartbeat without it means "unchanged",
/// not "owns nothing".
#[test]
fn owned_shards_is_optional_and_both_documents_say_missing_means_unchanged() {
    let doc = serde_json::to_value(openapi()).unwrap();
    let schema = &doc["components"]["schemas"]["HeartbeatRequest"];
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        required,
        ["protocol_version", "member_id", "member_epoch"],
        "{schema}"
    );
    let description = schema["properties"]["owned_shards"]["description"]
        .as_str()
        .unwrap_or_default()
        .replace('\n', " ");
    for phrase in ["unchanged", "releases nothing", "FENCED_MEMBER_EPOCH"] {
        assert!(
            description.contains(phrase),
            "the OpenAPI description of owned_shards lacks {phrase:?}: {description}"
        );
    }
}

#[test]
fn name_patterns_in_the_document_are_the_protocol_s() {
    /// Every `pattern`, and apart those of object keys (`propertyNames`).
    fn walk(v: &serde_json::Value, key: bool, names: &mut Vec<String>, keys: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if k == "pattern" {
                        let p = v.as_str().unwrap_or_default().to_owned();
                        if key { keys.push(p) } else { names.push(p) }
                    } else {
                        walk(v, k == "propertyNames", names, keys);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, false, names, keys)),
            _ => {}
        }
    }
    let (mut names, mut keys) = (Vec::new(), Vec::new());
    walk(
        &serde_json::to_value(openapi()).unwrap(),
        false,
        &mut names,
        &mut keys,
    );
    // group, stream, member path parameters (9 uses), audit filters (2), body names (4).
    assert!(names.len() >= 15, "{names:?}");
    assert!(
        names.iter().all(|p| p == rsc_protocol::names::NAME_PATTERN),
        "{names:?}"
    );
    // The objects keyed by shard index: `seals` and `owner_tokens`.
    assert_eq!(
        keys,
        [rsc_protocol::SHARD_INDEX_PATTERN; 2],
        "object keys' patterns"
    );
}

#[tokio::test]
async fn request_bodies_must_be_json_objects() {
    let app = app();
    let create = Request::builder()
        .method("POST")
        .uri("/v1/groups")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"group":"g","stream":"s","shard_count":1}"#))
        .unwrap();
    assert_eq!(
        app.clone().oneshot(create).await.unwrap().status(),
        StatusCode::CREATED
    );
    for (method, uri, body) in [
        ("PATCH", "/v1/groups/g", "[null, null]"),
        ("POST", "/v1/groups", r#"["g", "s", 1]"#),
        ("POST", "/v1/groups/g/heartbeat", r#"[1, "m", 0, []]"#),
        ("POST", "/v1/groups/g/heartbeat", "7"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::BAD_REQUEST,
            "{method} {uri} {body}"
        );
    }
}

#[tokio::test]
async fn an_oversized_admin_body_is_refused_and_audited() {
    let (app, store) = app_with_store();
    let big = format!(
        r#"{{"group":"g","stream":"s","pad":"{}"}}"#,
        "x".repeat(DEFAULT_BODY_LIMIT)
    );
    let req = Request::builder()
        .method("POST")
        .uri("/v1/groups")
        .header("content-type", "application/json")
        .body(Body::from(big))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let all = crate::store::AuditFilter::default();
    let log = store
        .read_audit(crate::store::AuditLog::Refusals, 10, &all)
        .await
        .unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].count, Some(1));
    assert_eq!(log[0].request.path, "/v1/groups");
    let mutations = store
        .read_audit(crate::store::AuditLog::Mutations, 10, &all)
        .await
        .unwrap();
    assert!(
        mutations.is_empty(),
        "a refusal is no mutation: {mutations:?}"
    );
    assert_eq!(log[0].principal, crate::auth::ANONYMOUS);
    assert_eq!(log[0].result.status, 413);
    assert_eq!(log[0].result.code, Some(ErrorCode::PayloadTooLarge));
    assert_eq!(log[0].request.body, None, "an oversized body is not kept");
}

/// A bad id is refused where it enters (PROTOCOL §1): in a body when it is parsed, in a path
/// or query by the extractor; each answer is `400 INVALID_REQUEST` naming the id and why.
#[tokio::test]
async fn bad_ids_are_refused_at_the_edge_with_the_name_rule_s_explanation() {
    let app = app();
    let cases = [
        (
            "POST",
            "/v1/groups",
            r#"{"group":"-bad","stream":"s","shard_count":1}"#,
            r#"group: group id "-bad" must start with a letter or a digit"#,
        ),
        (
            "POST",
            "/v1/groups",
            r#"{"group":"g","stream":"s s","shard_count":1}"#,
            r#"stream id "s s" contains ' '"#,
        ),
        (
            "POST",
            "/v1/groups/g/leave",
            r#"{"member_id":"","member_epoch":1}"#,
            "member id must not be empty",
        ),
        (
            "GET",
            "/v1/groups/-g",
            "",
            r#"group id "-g" must start with a letter or a digit"#,
        ),
        (
            "DELETE",
            "/v1/groups/g/members/a%20b",
            "",
            r#"member id "a b" contains ' '"#,
        ),
        (
            "GET",
            "/v1/streams/s%7Bx%7D/routing",
            "",
            r#"stream id "s{x}" contains '{'"#,
        ),
        ("GET", "/v1/audit?group=a%20b", "", r#"group id "a b""#),
    ];
    for (method, uri, body, why) in cases {
        let mut req = Request::builder().method(method).uri(uri);
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let resp = app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{method} {uri}");
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "INVALID_REQUEST", "{method} {uri}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{method} {uri}: {message}");
    }
}

/// A heartbeat body's answer, sent as `content_type`: status and body.
async fn heartbeat_with(app: &Router, content_type: &str, body: &str) -> (u16, serde_json::Value) {
    let req = Request::builder()
        .method("POST")
        .uri("/v1/groups/g1/heartbeat")
        .header("content-type", content_type)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

#[tokio::test]
async fn a_json_body_is_refused_alike_whatever_path_parses_it() {
    // `application/json` is parsed without path tracking and parsed again only when it
    // fails; any other JSON content type goes through `axum::Json` alone. Both must give
    // the same refusal, with the field's path in the message.
    let app = app();
    let bodies = [
        r#"{"protocol_version":1,"member_id":"m1","member_epoch":0,"extra":1}"#,
        r#"{"protocol_version":1,"member_id":"m1","member_epoch":"zero"}"#,
        r#"{"protocol_version":1,"member_id":"m1","member_epoch":0,"owned_shards":[1,"x"]}"#,
        r#"[1,"m1",0]"#,
        r#"{"protocol_version":1,"member_id":"m1","member_epoch":0"#,
        r#"{"protocol_version":1,"member_id":"m1","member_epoch":0} trailing"#,
        "",
    ];
    for body in bodies {
        let fast = heartbeat_with(&app, "application/json", body).await;
        let slow = heartbeat_with(&app, "application/json; charset=utf-8", body).await;
        assert_eq!(fast, slow, "{body}");
        assert!(fast.0 >= 400, "{body} was accepted: {fast:?}");
        assert_eq!(
            fast.1["error"]["code"], "INVALID_REQUEST",
            "{body}: {fast:?}"
        );
    }
    let (_, unknown) = heartbeat_with(&app, "application/json", bodies[0]).await;
    let message = unknown["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("extra"), "{message}");
    let (_, nested) = heartbeat_with(&app, "application/json", bodies[2]).await;
    let message = nested["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("owned_shards[1]"), "{message}");
    let (_, array) = heartbeat_with(&app, "application/json", bodies[3]).await;
    assert_eq!(
        array["error"]["message"],
        "the request body must be a JSON object"
    );
    // A well-formed body passes either way (the group does not exist: 404, not 400).
    let ok = r#"{"protocol_version":1,"member_id":"m1","member_epoch":0}"#;
    assert_eq!(
        heartbeat_with(&app, "application/json", ok).await,
        heartbeat_with(&app, "application/json; charset=utf-8", ok).await
    );
    assert_eq!(
        heartbeat_with(&app, "application/json", ok).await.1["error"]["code"],
        "GROUP_NOT_FOUND"
    );
    // Not JSON: refused before the body is read.
    let (status, body) = heartbeat_with(&app, "text/plain", ok).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &"INVALID_REQUEST".into())
    );
}

/// Every protected handler takes the [`crate::auth::Principal`] the access middleware
/// authenticated, before anything else of the request: served without the middleware, each
/// answers the extractor's refusal and runs nothing. A handler added without one fails here.
#[tokio::test]
async fn every_protected_handler_requires_a_principal() {
    use crate::auth::policy::Access;
    let (router, _) = routes().split_for_parts();
    let (_, state) = state_with(None);
    let bare: Router = router.with_state(state);
    for r in ROUTES.iter().filter(|r| r.access != Access::Open) {
        let methods: &[&str] = if r.method == "GET" {
            &["GET", "HEAD"]
        } else {
            &[r.method]
        };
        for &method in methods {
            let req = Request::builder()
                .method(method)
                .uri(concrete(r.path))
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let resp = bare.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&body);
            assert!(
                status == StatusCode::FORBIDDEN
                    && (method == "HEAD"
                        || text.contains("no authenticated principal for this route")),
                "{method} {} ran without a principal: {status} {text}",
                r.path
            );
        }
    }
}

/// The state of a test router: over a memory store, with `acl` (a file) when given.
fn state_with(acl: Option<&std::path::Path>) -> (Arc<dyn MetadataStore>, AppState) {
    let store: Arc<dyn MetadataStore> =
        Arc::new(RevisionRecordingStore::new(Arc::new(MemoryStore::new())));
    let clock = Arc::new(SystemClock);
    let n = NonZeroU32::new(1000).unwrap();
    let acl = acl.map(|p| Arc::new(crate::auth::LiveAcl::load(p).expect("ACL")));
    let security = Arc::new(Security::new(
        acl,
        AdminRateLimiter::new(n, n),
        Auditor::new(store.clone(), clock.clone()),
        DEFAULT_BODY_LIMIT,
    ));
    let coordinator = Coordinator::new(store.clone(), clock, ServiceConfig::default());
    let state = AppState::new(super::Shared {
        coordinator,
        security,
        lag: None,
        history: crate::metrics::History::new(crate::metrics::DEFAULT_HISTORY_INTERVAL),
    });
    (store, state)
}

/// An ACL with an admin token, a viewer scoped to `billing*`, and JWTs of an issuer; and
/// the directory it lives in.
fn front_door_acl() -> std::path::PathBuf {
    use crate::auth::test_keys::KEY_X;
    let dir = std::env::temp_dir().join(format!(
        "rsc-front-door-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("jwks.json"),
        format!(
            "{{\"keys\": [{{\"kty\": \"OKP\", \"crv\": \"Ed25519\", \"kid\": \"k1\", \"x\": \"{KEY_X}\"}}]}}"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("acl.toml"),
        "[[tokens]]\nprincipal = \"ops\"\ntoken = \"admin-token\"\nroles = [\"admin\"]\n\
         groups = [\"*\"]\nstreams = [\"*\"]\n\n\
         [[tokens]]\nprincipal = \"billing-viewer\"\ntoken = \"viewer-token\"\n\
         roles = [\"viewer\"]\ngroups = [\"billing*\"]\nstreams = [\"billing*\"]\n\n\
         [[jwt]]\nissuer = \"https://k8s\"\naudience = \"rsc\"\njwks_file = \"jwks.json\"\n\
         subject = \"*\"\nroles = [\"admin\"]\ngroups = [\"*\"]\nstreams = [\"*\"]\n",
    )
    .unwrap();
    dir
}

/// The front door (PROTOCOL §4): every path of the policy table (and the dashboard's) ×
/// every method × {no credential, a bad token, an expired JWT, an out-of-scope viewer} is
/// never answered 2xx and never reaches a handler; a protected path answers 401 to a
/// request without a valid credential whatever its method (405 comes only after
/// authentication, so it tells no one else whether a path exists).
#[tokio::test]
async fn no_request_without_a_valid_credential_reaches_a_handler() {
    use crate::auth::policy::{Access, Scope, routes_of};
    use crate::auth::test_keys::{KEY, sign};
    use axum::middleware::{Next, from_fn};
    use std::sync::atomic::{AtomicUsize, Ordering};
    static REACHED: AtomicUsize = AtomicUsize::new(0);
    async fn probe(req: axum::extract::Request, next: Next) -> axum::response::Response {
        REACHED.fetch_add(1, Ordering::SeqCst);
        next.run(req).await
    }
    let dir = front_door_acl();
    let (store, state) = state_with(Some(&dir.join("acl.toml")));
    let (router, _) = routes().split_for_parts();
    let app = with_edges(
        router.route_layer(from_fn(probe)),
        state,
        DEFAULT_BODY_LIMIT,
    );
    // The group and the stream exist: a handler that ran would answer 200.
    let create = Request::builder()
        .method("POST")
        .uri("/v1/groups")
        .header("authorization", "Bearer admin-token")
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"group":"shop","stream":"shop","shard_count":2}"#,
        ))
        .unwrap();
    assert_eq!(
        app.clone().oneshot(create).await.unwrap().status(),
        StatusCode::CREATED
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let expired = sign(
        KEY,
        Some("k1"),
        jsonwebtoken::Algorithm::EdDSA,
        serde_json::json!({"iss": "https://k8s", "aud": "rsc", "sub": "ops-bot",
            "exp": now - 3_600, "iat": now - 7_200}),
    );
    let credentials: [(&str, Option<String>); 4] = [
        ("no credential", None),
        ("a bad token", Some("Bearer not-a-token".into())),
        ("an expired JWT", Some(format!("Bearer {expired}"))),
        ("an out-of-scope viewer", Some("Bearer viewer-token".into())),
    ];
    let mut paths: Vec<&str> = ROUTES.iter().map(|r| r.path).collect();
    paths.dedup();
    let concrete_shop = |t: &str| {
        t.replace("{group}", "shop")
            .replace("{stream}", "shop")
            .replace("{member}", "m1")
    };
    let mut checked = 0;
    for path in paths {
        let open = routes_of(path).any(|r| r.access == Access::Open);
        for method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            let looked_up = if method == "HEAD" { "GET" } else { method };
            let route = routes_of(path).find(|r| r.method == looked_up);
            for (what, auth) in &credentials {
                // Served to anyone on purpose: the open routes, and a viewer's lists (they
                // are filtered by its scopes instead).
                let legit = match route.map(|r| r.access) {
                    Some(Access::Open) => true,
                    Some(Access::Roles {
                        scope: Scope::None,
                        roles,
                    }) => {
                        *what == "an out-of-scope viewer"
                            && roles.contains(&crate::auth::Role::Viewer)
                    }
                    _ => false,
                };
                if legit {
                    continue;
                }
                let mut req = Request::builder()
                    .method(method)
                    .uri(concrete_shop(path))
                    .header("content-type", "application/json");
                if let Some(a) = auth {
                    req = req.header("authorization", a.as_str());
                }
                let before = REACHED.load(Ordering::SeqCst);
                let resp = app
                    .clone()
                    .oneshot(req.body(Body::from("{}")).unwrap())
                    .await
                    .unwrap();
                let status = resp.status();
                assert!(
                    !status.is_success(),
                    "{method} {path} with {what}: {status}"
                );
                assert_eq!(
                    REACHED.load(Ordering::SeqCst),
                    before,
                    "{method} {path} with {what} ran its handler ({status})"
                );
                if !open && *what != "an out-of-scope viewer" {
                    assert_eq!(
                        status,
                        StatusCode::UNAUTHORIZED,
                        "{method} {path} with {what}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 500, "only {checked} requests checked");
    // The refusals are audited merged, without bodies, apart from the mutations.
    let all = crate::store::AuditFilter::default();
    let mutations = store
        .read_audit(crate::store::AuditLog::Mutations, 100, &all)
        .await
        .unwrap();
    assert_eq!(
        mutations.len(),
        1,
        "the group's creation only: {mutations:?}"
    );
    let refusals = store
        .read_audit(crate::store::AuditLog::Refusals, 10_000, &all)
        .await
        .unwrap();
    assert!(!refusals.is_empty());
    assert!(
        refusals
            .iter()
            .all(|e| e.request.body.is_none() && e.count == Some(1))
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A field over its limit (PROTOCOL §4.3) is refused at the edge, before the service: the
/// group does not even exist, yet the answer is the limit's `400`, naming field and limit;
/// in a batch only the item over its limit is refused.
#[tokio::test]
async fn fields_over_their_limits_are_refused_before_the_service() {
    let app = app();
    let host = "h".repeat(63 * 1024);
    let body = format!(
        r#"{{"protocol_version":1,"member_id":"m1","member_epoch":0,"client":{{"host":"{host}"}}}}"#
    );
    let (status, v) = heartbeat_with(&app, "application/json", &body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("INVALID_REQUEST")),
        "{v}"
    );
    assert_eq!(
        v["error"]["message"],
        "client.host is 64512 bytes long; at most 256 are allowed (PROTOCOL §4.3)"
    );
    let shards =
        r#"{"protocol_version":1,"member_id":"m1","member_epoch":1,"owned_shards":[4096]}"#;
    let (status, v) = heartbeat_with(&app, "application/json", shards).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("owned_shards holds shard 4096"),
        "{v}"
    );

    let batch = serde_json::json!({"heartbeats": [
        {"group": "g1", "heartbeat": {"protocol_version": 1, "member_id": "m1", "member_epoch": 0,
            "client": {"version": "v".repeat(257)}}},
        {"group": "g1", "heartbeat": {"protocol_version": 1, "member_id": "m2", "member_epoch": 0}},
        {"group": "g".repeat(201), "heartbeat": {"protocol_version": 1, "member_id": "m3", "member_epoch": 0}},
    ]});
    let req = Request::builder()
        .method("POST")
        .uri("/v1/heartbeats")
        .header("content-type", "application/json")
        .body(Body::from(batch.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], 400, "{v}");
    assert_eq!(
        results[0]["error"]["message"],
        "client.version is 257 bytes long; at most 256 are allowed (PROTOCOL §4.3)"
    );
    assert_eq!(results[1]["error"]["code"], "GROUP_NOT_FOUND", "{v}");
    assert_eq!(results[2]["status"], 400, "{v}");
    assert!(
        results[2]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("group is 201 bytes long"),
        "{v}"
    );
}
