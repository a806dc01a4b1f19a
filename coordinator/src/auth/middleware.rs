//! The access middleware: policy lookup, authentication, role and scope checks, admin rate
//! limit and audit.

use super::client::{ClientAddr, Throttled};
use super::policy::{self, Access, Lookup, RouteSpec, Scope};
use super::{ANONYMOUS, Principal, Role, Security, retry_after_secs};
use crate::audit::{Refusal, RevisionLog};
use crate::http_error::ApiError;
use crate::tls::ClientCertificate;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::Method;
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
    let client = sec.client_addr(&req);
    // HEAD is answered by the GET handler (axum): it is a GET for the policy.
    let method = if req.method() == Method::HEAD {
        Method::GET
    } else {
        req.method().clone()
    };
    let route = matched.as_str();
    let lookup = policy::lookup(&method, route);
    let ctx = Ctx {
        sec: &sec,
        client,
        method: req.method().clone(),
        route,
        admin_action: match lookup {
            Lookup::Route(RouteSpec {
                access: Access::Admin { action, .. },
                ..
            }) => Some(action),
            _ => None,
        },
    };
    // Ahead of every credential check: the per-address limits. Not on the open routes: a
    // health probe from a throttled address (a node's kubelet) must still be answered.
    let open = matches!(
        lookup,
        Lookup::Route(RouteSpec {
            access: Access::Open,
            ..
        })
    );
    if !open && let Err(t) = sec.clients.admit(client) {
        return ctx.throttled(t).await;
    }
    let access = match lookup {
        Lookup::Route(spec) => spec.access,
        // A known path with another method: 405 from the router, but only for a principal
        // that passes the checks of one of the path's routes (an unknown method tells no one
        // else whether the path's resource exists).
        Lookup::OtherMethod => {
            let (mut parts, body) = req.into_parts();
            let target = path_target(&mut parts).await;
            return match ctx.authorize_any(&parts, route, &target).await {
                Err(refused) => refused,
                Ok(()) => next.run(Request::from_parts(parts, body)).await,
            };
        }
        Lookup::Unregistered if policy::is_dashboard_path(route) => Access::Open,
        Lookup::Unregistered => {
            error!(
                path = route,
                method = %method,
                "route missing from the access policy table; refused"
            );
            let e = ApiError::new(ErrorCode::Forbidden, "this route has no access policy");
            return ctx.refuse(None, e).await;
        }
    };
    match access {
        Access::Open => next.run(req).await,
        Access::Roles { roles, scope } => roles_route(&ctx, roles, scope, req, next).await,
        Access::Admin { action, scope } => admin(&ctx, action, scope, req, next).await,
    }
}

/// A non-admin route: authenticate, check role and scope, run.
async fn roles_route(
    ctx: &Ctx<'_>,
    roles: &'static [Role],
    scope: Scope,
    req: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let target = path_target(&mut parts).await;
    let principal = match ctx.authenticate(&parts).await {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    if let Err(e) =
        check_roles(&principal, roles).and_then(|()| check_scope(&principal, scope, &target))
    {
        return ctx.refuse(Some(&principal), e).await;
    }
    parts.extensions.insert(principal);
    next.run(Request::from_parts(parts, body)).await
}

/// What the access checks of one request know of it.
struct Ctx<'a> {
    sec: &'a Security,
    client: ClientAddr,
    /// The method as sent.
    method: Method,
    /// The matched path template.
    route: &'a str,
    /// The admin action of the route, if it is an admin route. (What a refusal records is
    /// built only when one happens: nothing is formatted on the path of a served request.)
    admin_action: Option<&'static str>,
}

impl Ctx<'_> {
    /// The answer to a request whose client address is over one of its limits (`429`, before
    /// any credential is looked at).
    async fn throttled(&self, t: Throttled) -> Response {
        metrics::counter!("rsc_client_throttled_total", "reason" => t.reason()).increment(1);
        let limit = match t {
            Throttled::Requests(_) => "request rate",
            Throttled::Refusals(_) => "refused-request rate",
        };
        let e = ApiError {
            retry_after_ms: Some(t.wait().as_millis().max(1) as u64),
            ..ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "client {} is over its {limit} limit; retry in {} s",
                    self.client,
                    retry_after_secs(t.wait())
                ),
            )
        };
        self.refuse(None, e).await
    }

    /// The principal of the request, or its refusal (401, recorded).
    async fn authenticate(&self, parts: &Parts) -> Result<Principal, Response> {
        match self
            .sec
            .authenticate(&parts.headers, client_certificate(parts))
        {
            Ok(p) => Ok(p),
            Err(e) => Err(self.refuse(None, e).await),
        }
    }

    /// A request with a method its path does not serve: authenticated, and the principal
    /// must pass the role and scope checks of one of the path's routes (admin routes: the
    /// admin role and the path's names). No check at all when one of them is open.
    async fn authorize_any(
        &self,
        parts: &Parts,
        route: &str,
        target: &AuditTarget,
    ) -> Result<(), Response> {
        let routes: Vec<&RouteSpec> = policy::routes_of(route).collect();
        if routes.iter().any(|r| r.access == Access::Open) {
            return Ok(());
        }
        let principal = self.authenticate(parts).await?;
        let passes = |r: &&RouteSpec| match r.access {
            Access::Open => true,
            Access::Roles { roles, scope } => {
                check_roles(&principal, roles).is_ok()
                    && check_scope(&principal, scope, target).is_ok()
            }
            Access::Admin { scope, .. } => {
                principal.has_role(Role::Admin)
                    && (scope == Scope::GroupAndStreamInBody
                        || check_scope(&principal, scope, target).is_ok())
            }
        };
        if routes.iter().any(passes) {
            Ok(())
        } else {
            let e = ApiError::new(
                ErrorCode::Forbidden,
                format!("principal {} may not use this path", principal.name()),
            );
            Err(self.refuse(Some(&principal), e).await)
        }
    }

    /// Answers `e` to a refused request: counted, throttling its address when it is an
    /// access refusal (401, 403, 413), and written to the audit log's refusals (merged,
    /// without the body: PROTOCOL §7).
    async fn refuse(&self, principal: Option<&Principal>, e: ApiError) -> Response {
        metrics::counter!("rsc_access_refusals_total", "code" => e.code.as_str()).increment(1);
        if matches!(
            e.code,
            ErrorCode::Unauthenticated | ErrorCode::Forbidden | ErrorCode::PayloadTooLarge
        ) {
            self.sec.clients.refused(self.client);
        }
        self.sec
            .auditor
            .refused(Refusal {
                client_addr: self.client.to_string(),
                principal: principal.map_or(ANONYMOUS, |p| p.name()).to_owned(),
                credential: principal.map(|p| p.credential().as_str()),
                action: match self.admin_action {
                    Some(action) => action.to_owned(),
                    // HEAD is recorded as the GET it was checked as.
                    None if self.method == Method::HEAD => format!("GET {}", self.route),
                    None => format!("{} {}", self.method, self.route),
                },
                method: self.method.to_string(),
                route: self.route.to_owned(),
                status: e.code.http_status(),
                code: e.code,
            })
            .await;
        e.into_response()
    }
}

/// The client certificate of the request's connection (mutual TLS), if it presented one.
fn client_certificate(parts: &Parts) -> Option<&ClientCertificate> {
    parts
        .extensions
        .get::<Arc<ClientCertificate>>()
        .map(|c| c.as_ref())
}

/// The role check of a non-admin route: one of `roles` (admin always qualifies).
fn check_roles(principal: &Principal, roles: &'static [Role]) -> Result<(), ApiError> {
    if principal.has_any_role(roles) {
        return Ok(());
    }
    let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "principal {} lacks the role for this route (one of: admin, {})",
            principal.name(),
            names.join(", ")
        ),
    ))
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

/// An admin mutation: authenticate (before the body is read), rate-limit, authorize, buffer
/// the body, check its names' scope, run, audit. The checks, in order: credential (401),
/// rate (429), role (403), body size (413), scope (403).
async fn admin(
    ctx: &Ctx<'_>,
    action: &'static str,
    scope: Scope,
    req: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let mut target = path_target(&mut parts).await;
    let principal = match ctx.authenticate(&parts).await {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    if let Err(e) = admin_rate_and_role(ctx.sec, &principal) {
        return ctx.refuse(Some(&principal), e).await;
    }
    let bytes = match read_body(ctx.sec, body).await {
        Ok(bytes) => bytes,
        Err(e) if e.code == ErrorCode::PayloadTooLarge => {
            return ctx.refuse(Some(&principal), e).await;
        }
        Err(e) => return e.into_response(),
    };
    if scope == Scope::GroupAndStreamInBody
        && let Ok(names) = serde_json::from_slice::<BodyNames>(&bytes)
    {
        let as_string = |v: Option<serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => Some(s),
            _ => None,
        };
        target.group = as_string(names.group);
        target.stream = as_string(names.stream);
    }
    if let Err(e) = check_scope(&principal, scope, &target) {
        return ctx.refuse(Some(&principal), e).await;
    }
    let mut entry = AuditEntry {
        time_ms: 0,
        principal: principal.name().to_owned(),
        credential: Some(principal.credential().as_str().to_owned()),
        action: action.to_owned(),
        target,
        request: AuditRequest {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            body: audit_body(&bytes),
        },
        result: AuditResult {
            status: 0,
            code: None,
        },
        revisions: Vec::new(),
        client_addr: Some(ctx.client.to_string()),
        count: None,
        since_ms: None,
    };
    let name = principal.name().to_owned();
    parts.extensions.insert(principal);
    let log = RevisionLog::new();
    let run = next.run(Request::from_parts(parts, Body::from(bytes)));
    let response = log.scope(crate::revisions::as_admin(name, run)).await;
    entry.time_ms = ctx.sec.auditor.now_ms();
    entry.result = AuditResult {
        status: response.status().as_u16(),
        code: response.extensions().get::<ErrorCode>().copied(),
    };
    entry.revisions = log.take();
    ctx.sec.auditor.record(entry).await;
    response
}

/// The per-principal admin rate (`429`) and the admin role (`403`).
fn admin_rate_and_role(sec: &Security, principal: &Principal) -> Result<(), ApiError> {
    if let Err(wait) = sec.limiter.check(principal.name()) {
        let secs = retry_after_secs(wait);
        metrics::counter!("rsc_admin_rate_limited_total").increment(1);
        warn!(principal = %principal.name(), retry_after_s = secs, "admin mutation rate-limited");
        return Err(ApiError {
            retry_after_ms: Some(secs * 1000),
            ..ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "admin mutations of {} are over their rate; retry in {secs} s",
                    principal.name()
                ),
            )
        });
    }
    if !principal.has_role(Role::Admin) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("principal {} lacks the admin role", principal.name()),
        ));
    }
    Ok(())
}

/// An admin request's body, read whole: `413` over the body limit, `400` when it does not
/// arrive (the body read timeout, PROTOCOL §4.4, or a client that went away).
async fn read_body(sec: &Security, body: Body) -> Result<Bytes, ApiError> {
    match axum::body::to_bytes(body, sec.body_limit).await {
        Ok(bytes) => Ok(bytes),
        Err(e) if over_the_limit(&e) => Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            "request body is over the size limit",
        )),
        Err(e) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("the request body was not received: {e}"),
        )),
    }
}

/// Whether reading a body failed because it is longer than the limit (not because it did not
/// arrive).
fn over_the_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
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
