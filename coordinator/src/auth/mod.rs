//! Authentication and authorization (PROTOCOL §4, §8): the ACL file, bearer tokens, roles and
//! glob scopes, the per-route access policy, and the admin rate limit.
//!
//! [`enforce`] is the axum middleware in front of every route. It looks the route up in
//! [`policy::ROUTES`], authenticates the bearer token (an ACL token, or a JWT a `[[jwt]]`
//! entry accepts) — or, over mutual TLS, the connection's client certificate by an entry's
//! `cert_subject`, `cert_san_uri` or `cert_san_dns` (PROTOCOL §20) — against the ACL served now ([`LiveAcl`], re-read when its
//! files change), or, without an ACL, treats every request as the all-powerful `anonymous`
//! principal; then checks role and scope, and hands the handler a [`Principal`] in the
//! request extensions. Admin mutations additionally pass the per-principal rate limit and
//! are audited, whatever the outcome. Every `401` is counted in
//! `rsc_auth_refusals_total{reason}`.

mod acl;
pub(crate) mod client;
mod glob;
mod jwt;
mod live;
mod middleware;
pub(crate) mod policy;
mod rate_limit;
mod refusal;

pub(crate) use acl::{ANONYMOUS, Credential, Principal, Role};
#[cfg(test)]
pub(crate) use jwt::test_keys;
pub(crate) use live::LiveAcl;
pub(crate) use middleware::{check_item_group, enforce};
pub(crate) use rate_limit::{AdminRateLimiter, retry_after_secs};

use crate::audit::Auditor;
use crate::http_error::ApiError;
use crate::tls::ClientCertificate;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use client::{ClientAddr, ClientLimiter, TrustedProxies};
use refusal::Refusal;
use rsc_protocol::ErrorCode;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Everything the access middleware needs.
#[derive(Debug)]
pub(crate) struct Security {
    acl: Option<Arc<LiveAcl>>,
    limiter: AdminRateLimiter,
    auditor: Auditor,
    body_limit: usize,
    clients: Arc<ClientLimiter>,
    proxies: TrustedProxies,
}

impl Security {
    /// `acl: None` serves every request as `anonymous` with every role and scope.
    pub(crate) fn new(
        acl: Option<Arc<LiveAcl>>,
        limiter: AdminRateLimiter,
        auditor: Auditor,
        body_limit: usize,
    ) -> Self {
        Security {
            acl,
            limiter,
            auditor,
            body_limit,
            clients: Arc::new(ClientLimiter::off()),
            proxies: TrustedProxies::default(),
        }
    }

    /// The same with per-address limits ahead of authentication, and the proxies whose
    /// `X-Forwarded-For` names the client (PROTOCOL §7).
    pub(crate) fn with_clients(
        mut self,
        clients: Arc<ClientLimiter>,
        proxies: TrustedProxies,
    ) -> Self {
        self.clients = clients;
        self.proxies = proxies;
        self
    }

    /// The address a request is attributed to.
    pub(crate) fn client_addr<B>(&self, req: &axum::http::Request<B>) -> ClientAddr {
        self.proxies
            .client_addr(client::peer_ip(req), req.headers())
    }

    /// The principal of a request (PROTOCOL §8, §20): with an ACL, from its bearer token
    /// when it sends one (a token entry, else a JWT a `[[jwt]]` entry accepts), else from
    /// the client certificate of its connection (`cert`, mutual TLS) when an entry's
    /// `cert_subject`, `cert_san_uri` or `cert_san_dns` names it; `anonymous` (every role) without an ACL.
    /// `401 UNAUTHENTICATED` saying which check failed otherwise, counted by reason.
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
        cert: Option<&ClientCertificate>,
    ) -> Result<Principal, ApiError> {
        let Some(live) = &self.acl else {
            return Ok(Principal::open());
        };
        let acl = live.current();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let outcome = match (bearer_token(headers), cert) {
            (Some(token), _) => acl.authenticate(token, now),
            (None, Some(cert)) => acl.authenticate_certificate(cert, now),
            (None, None) => Err(Refusal::new(
                "missing",
                "missing bearer token: send `Authorization: Bearer <token>`",
            )),
        };
        outcome.map_err(|r| {
            metrics::counter!("rsc_auth_refusals_total", "reason" => r.reason).increment(1);
            ApiError::new(ErrorCode::Unauthenticated, r.message)
        })
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        for (v, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer  abc ", Some("abc")),
            ("Basic abc", None),
            ("Bearer", None),
            ("Bearer ", None),
        ] {
            h.insert(AUTHORIZATION, HeaderValue::from_static(v));
            assert_eq!(bearer_token(&h), want, "{v}");
        }
    }
}
