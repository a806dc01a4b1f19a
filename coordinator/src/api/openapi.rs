//! The OpenAPI 3.1 document (`GET /openapi.json`), generated from the handlers' `#[utoipa::path]`
//! annotations and the wire types' schemas, completed from the access policy table: each
//! operation gets its security requirement, the roles and scope it needs, and the error
//! answers the access layer and extractors can give (401, 403, 429 with `Retry-After`, …).

use super::AppState;
use crate::auth::policy::{Access, ROUTES, RouteSpec, Scope};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use std::sync::OnceLock;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    Content, HeaderBuilder, OpenApi, Ref, ResponseBuilder, Type, schema::ObjectBuilder,
};
use utoipa::{Modify, OpenApi as _};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The security scheme name of bearer tokens in the document.
pub(crate) const BEARER: &str = "bearer";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Redis Stream Coordinator",
        description = "Kafka-style (KIP-848) consumer groups for sharded Redis Streams: \
membership, sticky shard assignment with revoke-before-assign, epochs and fencing, \
resharding, routing. Every error answers `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "Apache-2.0")
    ),
    components(schemas(rsc_protocol::ErrorBody, rsc_protocol::ErrorCode)),
    modifiers(&BearerScheme),
    tags(
        (name = "admin", description = "Role admin; audited; rate-limited per principal"),
        (name = "members", description = "Role member: the consumer protocol"),
        (name = "producers", description = "Role producer: routing"),
        (name = "monitoring", description = "Role viewer: reads, audit log, metrics"),
        (name = "health", description = "Open: liveness, readiness, this document"),
    )
)]
struct ApiDoc;

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from the coordinator's ACL file (PROTOCOL §8).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The base document (info, tags, security scheme) the routes are added to.
pub(super) fn base() -> OpenApi {
    ApiDoc::openapi()
}

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// This OpenAPI document.
#[utoipa::path(
    get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object, content_type = "application/json"))
)]
async fn openapi_json() -> impl IntoResponse {
    static JSON: OnceLock<String> = OnceLock::new();
    let body = JSON.get_or_init(|| {
        serde_json::to_string(&super::openapi()).unwrap_or_else(|e| {
            tracing::error!(error = %e, "OpenAPI document not serializable");
            "{}".into()
        })
    });
    ([(CONTENT_TYPE, "application/json")], body.as_str())
}

fn operation_mut<'a>(doc: &'a mut OpenApi, route: &RouteSpec) -> Option<&'a mut Operation> {
    let item = doc.paths.paths.get_mut(route.path)?;
    match route.method {
        "GET" => item.get.as_mut(),
        "POST" => item.post.as_mut(),
        "PUT" => item.put.as_mut(),
        "PATCH" => item.patch.as_mut(),
        "DELETE" => item.delete.as_mut(),
        _ => None,
    }
}

fn error_response(description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            Content::new(Some(Ref::from_schema_name("ErrorBody"))),
        )
        .build()
}

/// Adds what the access policy implies to every operation of the document.
pub(super) fn document_access(doc: &mut OpenApi) {
    for route in ROUTES {
        let Some(op) = operation_mut(doc, route) else {
            continue;
        };
        let (needs, scope) = required_access(route);
        for (status, text) in access_errors(route, op, needs.is_some()) {
            op.responses
                .responses
                .entry(status.to_owned())
                .or_insert_with(|| error_response(&text).into());
        }
        match route.access {
            Access::Admin { .. } => document_rate_limit(
                op,
                "RATE_LIMITED: over the principal's admin mutation rate, or the client address \
                 over its limits (PROTOCOL §7)",
            ),
            Access::Roles { .. } => document_rate_limit(
                op,
                "RATE_LIMITED: the client address is over its request or refused-request \
                 limit (PROTOCOL §7)",
            ),
            Access::Open => {}
        }
        if let Some(needs) = needs {
            document_security(op, &needs, scope);
        }
    }
}

/// The roles a route requires (`None`: open), in words, and its scope check.
fn required_access(route: &RouteSpec) -> (Option<String>, Scope) {
    match route.access {
        Access::Open => (None, Scope::None),
        Access::Roles { roles, scope } => {
            let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
            (Some(format!("admin or {}", names.join(" or "))), scope)
        }
        Access::Admin { scope, .. } => (Some("admin".to_owned()), scope),
    }
}

/// The error answers an operation can give, by status, from its parameters, body and
/// access (`authenticated`: it needs a token).
fn access_errors(
    route: &RouteSpec,
    op: &Operation,
    authenticated: bool,
) -> Vec<(&'static str, String)> {
    let has_params = route.path.contains('{');
    let has_body = op.request_body.is_some();
    let has_query = op
        .parameters
        .as_ref()
        .is_some_and(|ps| ps.iter().any(|p| matches!(p, utoipa::openapi::RefOr::T(p) if p.parameter_in == utoipa::openapi::path::ParameterIn::Query)));
    let mut errors: Vec<(&'static str, String)> = Vec::new();
    if has_params || has_body || has_query {
        errors.push((
            "400",
            "INVALID_REQUEST (or UNSUPPORTED_PROTOCOL_VERSION)".into(),
        ));
    }
    if authenticated {
        errors.push(("401", "UNAUTHENTICATED: no or unknown bearer token".into()));
        errors.push((
            "403",
            "FORBIDDEN: the token lacks the role or the scope".into(),
        ));
    }
    if has_params {
        errors.push((
            "404",
            "GROUP_NOT_FOUND, STREAM_NOT_FOUND or UNKNOWN_MEMBER_ID".into(),
        ));
    }
    if has_body || matches!(route.access, Access::Admin { .. }) {
        errors.push(("413", "PAYLOAD_TOO_LARGE".into()));
    }
    if authenticated {
        errors.push((
            "503",
            "STORE_UNAVAILABLE or STORE_CONFLICT: retry with backoff".into(),
        ));
    }
    errors
}

/// A rate limit's `429` answer, `text`, with its `Retry-After` header.
fn document_rate_limit(op: &mut Operation, text: &str) {
    let retry_after = HeaderBuilder::new()
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1)),
        ))
        .description(Some("Seconds until the bucket has a token again"))
        .build();
    let mut r = error_response(text);
    r.headers.insert("Retry-After".into(), retry_after.into());
    op.responses
        .responses
        .entry("429".into())
        .or_insert(r.into());
}

/// The bearer security requirement, and the required role and scope in the description.
fn document_security(op: &mut Operation, needs: &str, scope: Scope) {
    op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    let scope_text = match scope {
        Scope::None => "results are limited to the token's scopes",
        Scope::Group => "the token's `groups` scope must cover `{group}`",
        Scope::Stream => "the token's `streams` scope must cover `{stream}`",
        Scope::GroupAndStreamInBody => {
            "the token's `groups` and `streams` scopes must cover the body's `group` and `stream`"
        }
        Scope::GroupPerItemInBody => {
            "the token's `groups` scope must cover each item's `group`, checked per item \
             (the description says what an item out of scope gets)"
        }
    };
    let note = format!("Requires role {needs}; {scope_text}.");
    op.description = Some(match op.description.take() {
        Some(d) if !d.is_empty() => format!("{d}\n\n{note}"),
        _ => note,
    });
}
