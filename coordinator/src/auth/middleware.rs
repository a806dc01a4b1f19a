//! The access middleware: policy lookup, authentication, role and scope checks, admin rate
//! limit and audit.

use super::policy::{self, Access, Lookup, Scope};
use super::{ANONYMOUS, Credential, Principal, Role, Security, retry_after_secs};
use crate::audit::RevisionLog;
use crate::http_error::ApiError;
use crate::tls::ClientCertificate;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::HeaderValue;
use axum::http::header::RETRY_AFTER;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rsc_protocol::{AuditEntry, AuditRequest, AuditResult, AuditTarget, ErrorCode};
use serde::Deserialize;
use std::sync::Arc;
use tracing::{error, warn};

/// How much of a non-JSON body the audit log keeps.
const AUDIT_TEXT_BODY_MAX: usize = 1024;

/// The axum middleware in front of every route (see the [module docs](super)).
pub(crate) async fn enforce(
    State(sec): State<Arc<Security>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(matched) = req.extensions().get::<MatchedPath>().cloned() else {
        // The fallback: 404 for everyone.
        return next.run(req).await;
    };
    let access = match policy::lookup(req.method(), matched.as_str()) {
        Lookup::Route(spec) => spec.access,
        Lookup::OtherMethod => return next.run(req).await, // the router answers 405
        Lookup::Unregistered if policy::is_dashboard_path(matched.as_str()) => Access::Open,
        Lookup::Unregistered => {
            error!(
                path = matched.as_str(),
                method = %req.method(),
                "route missing from the access policy table; refused"
            );
            return refuse(ApiError::new(
                ErrorCode::Forbidden,
                "this route has no access policy",
            ));
        }
    };
    match access {
        Access::Open => next.run(req).await,
        Access::Roles { roles, scope } => {
            let (mut parts, body) = req.into_parts();
            let target = path_target(&mut parts).await;
            let principal = match authorize(&sec, &parts, roles, scope, &target) {
                Ok(p) => p,
                Err(e) => return refuse(e),
            };
            parts.extensions.insert(principal);
            next.run(Request::from_parts(parts, body)).await
        }
        Access::Admin { action, scope } => admin(&sec, action, scope, req, next).await,
    }
}

/// The client certificate of the request's connection (mutual TLS), if it presented one.
fn client_certificate(parts: &Parts) -> Option<&ClientCertificate> {
    parts
        .extensions
        .get::<Arc<ClientCertificate>>()
        .map(|c| c.as_ref())
}

fn refuse(e: ApiError) -> Response {
    metrics::counter!("rsc_access_refusals_total", "code" => e.code.as_str()).increment(1);
    e.into_response()
}

/// Authentication, role and path-scope checks of a non-admin route.
fn authorize(
    sec: &Security,
    parts: &Parts,
    roles: &'static [Role],
    scope: Scope,
    target: &AuditTarget,
) -> Result<Principal, ApiError> {
    let principal = sec.authenticate(&parts.headers, client_certificate(parts))?;
    if !principal.has_any_role(roles) {
        let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "principal {} lacks the role for this route (one of: admin, {})",
                principal.name(),
                names.join(", ")
            ),
        ));
    }
    check_scope(&principal, scope, target)?;
    Ok(principal)
}

fn check_scope(principal: &Principal, scope: Scope, target: &AuditTarget) -> Result<(), ApiError> {
    let forbid = |kind: &str, name: &str| {
        ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "principal {} is not scoped for {kind} {name}",
                principal.name()
            ),
        )
    };
    let need_group = matches!(scope, Scope::Group | Scope::GroupAndStreamInBody);
    let need_stream = matches!(scope, Scope::Stream | Scope::GroupAndStreamInBody);
    if need_group {
        match &target.group {
            Some(g) if principal.may_group(g) => {}
            Some(g) => return Err(forbid("group", g)),
            None => return Err(missing_name("group")),
        }
    }
    if need_stream {
        match &target.stream {
            Some(s) if principal.may_stream(s) => {}
            Some(s) => return Err(forbid("stream", s)),
            None => return Err(missing_name("stream")),
        }
    }
    Ok(())
}

/// The group scope check of one item of a request whose items name their group
/// ([`Scope::GroupPerItemInBody`]): `403 FORBIDDEN`, with the message a `{group}` route
/// would give, when the principal's `groups` globs do not cover `group`. Counted as an
/// access refusal.
pub(crate) fn check_item_group(principal: &Principal, group: &str) -> Result<(), ApiError> {
    let target = AuditTarget {
        group: Some(group.to_owned()),
        ..AuditTarget::default()
    };
    check_scope(principal, Scope::Group, &target).inspect_err(|e| {
        metrics::counter!("rsc_access_refusals_total", "code" => e.code.as_str()).increment(1);
    })
}

fn missing_name(field: &str) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("the request must name a {field} (string field `{field}`)"),
    )
}

/// The `{group}`, `{stream}` and `{member}` path parameters.
async fn path_target(parts: &mut Parts) -> AuditTarget {
    let mut target = AuditTarget::default();
    if let Ok(params) = RawPathParams::from_request_parts(parts, &()).await {
        for (k, v) in &params {
            match k {
                "group" => target.group = Some(v.to_owned()),
                "stream" => target.stream = Some(v.to_owned()),
                "member" => target.member = Some(v.to_owned()),
                _ => {}
            }
        }
    }
    target
}

#[derive(Deserialize)]
struct BodyNames {
    #[serde(default)]
    group: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<serde_json::Value>,
}

/// An admin mutation: buffer the body, authenticate, rate-limit, authorize, run, audit.
async fn admin(
    sec: &Security,
    action: &'static str,
    scope: Scope,
    req: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let mut target = path_target(&mut parts).await;
    let mut request = AuditRequest {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        body: None,
    };
    let bytes = axum::body::to_bytes(body, sec.body_limit).await.ok();
    if let Some(b) = &bytes {
        request.body = audit_body(b);
        if scope == Scope::GroupAndStreamInBody
            && let Ok(names) = serde_json::from_slice::<BodyNames>(b)
        {
            let as_string = |v: Option<serde_json::Value>| match v {
                Some(serde_json::Value::String(s)) => Some(s),
                _ => None,
            };
            target.group = as_string(names.group);
            target.stream = as_string(names.stream);
        }
    }
    let principal = sec.authenticate(&parts.headers, client_certificate(&parts));
    let principal_name = principal
        .as_ref()
        .map_or(ANONYMOUS, |p| p.name())
        .to_owned();
    let credential = principal
        .as_ref()
        .map_or(Credential::Anonymous, |p| p.credential());
    let log = RevisionLog::new();
    let response = match admit(sec, principal, scope, &target, bytes.is_some()) {
        Err(refusal) => *refusal,
        Ok(p) => {
            parts.extensions.insert(p);
            let body = Body::from(bytes.unwrap_or_default());
            log.scope(next.run(Request::from_parts(parts, body))).await
        }
    };
    let status = response.status().as_u16();
    let entry = AuditEntry {
        time_ms: sec.auditor.now_ms(),
        principal: principal_name,
        credential: Some(credential.as_str().to_owned()),
        action: action.to_owned(),
        target,
        request,
        result: AuditResult {
            status,
            code: response.extensions().get::<ErrorCode>().copied(),
        },
        revisions: log.take(),
    };
    sec.auditor.record(entry).await;
    response
}

/// The checks of an admin mutation, in order: token (401), rate (429), role (403), body
/// size (413), scope (403).
fn admit(
    sec: &Security,
    principal: Result<Principal, ApiError>,
    scope: Scope,
    target: &AuditTarget,
    body_fits: bool,
) -> Result<Principal, Box<Response>> {
    let key = principal
        .as_ref()
        .map_or(ANONYMOUS, |p| p.name())
        .to_owned();
    if let Err(wait) = sec.limiter.check(&key) {
        let secs = retry_after_secs(wait);
        metrics::counter!("rsc_admin_rate_limited_total").increment(1);
        warn!(principal = %key, retry_after_s = secs, "admin mutation rate-limited");
        let mut r = refuse(ApiError::new(
            ErrorCode::RateLimited,
            format!("admin mutations of {key} are over their rate; retry in {secs} s"),
        ));
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
        return Err(Box::new(r));
    }
    let refused = |e: ApiError| Box::new(refuse(e));
    let principal = principal.map_err(refused)?;
    if !principal.has_role(Role::Admin) {
        return Err(refused(ApiError::new(
            ErrorCode::Forbidden,
            format!("principal {} lacks the admin role", principal.name()),
        )));
    }
    if !body_fits {
        return Err(Box::new(
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                "request body is over the size limit",
            )
            .into_response(),
        ));
    }
    check_scope(&principal, scope, target).map_err(refused)?;
    Ok(principal)
}

/// The body as the audit log keeps it: JSON as is, anything else as truncated text.
fn audit_body(bytes: &Bytes) -> Option<serde_json::Value> {
    if bytes.is_empty() {
        return None;
    }
    Some(match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(_) => {
            let text = String::from_utf8_lossy(bytes);
            let cut: String = text.chars().take(AUDIT_TEXT_BODY_MAX).collect();
            serde_json::Value::String(cut)
        }
    })
}
