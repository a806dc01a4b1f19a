//! Authentication and authorization (PROTOCOL §4, §8): the ACL file, bearer tokens, roles and
//! glob scopes, the per-route access policy, and the admin rate limit.
//!
//! [`enforce`] is the axum middleware in front of every route. It looks the route up in
//! [`policy::ROUTES`], authenticates the bearer token — or, over mutual TLS, the connection's
//! client certificate by an entry's `cert_subject` (PROTOCOL §20) — against the [`Acl`] (or,
//! without an ACL, treats every request as the all-powerful `anonymous` principal), checks role and
//! scope, and hands the handler a [`Principal`] in the request extensions. Admin mutations
//! additionally pass the per-principal rate limit and are audited, whatever the outcome.

mod acl;
mod glob;
mod middleware;
pub(crate) mod policy;
mod rate_limit;

pub(crate) use acl::{ANONYMOUS, Acl, Credential, Principal, Role};
pub(crate) use middleware::{check_item_group, enforce};
pub(crate) use rate_limit::{AdminRateLimiter, retry_after_secs};

use crate::audit::Auditor;
use crate::http_error::ApiError;
use crate::tls::ClientCertificate;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use rsc_protocol::ErrorCode;

/// Everything the access middleware needs.
#[derive(Debug)]
pub(crate) struct Security {
    acl: Option<Acl>,
    limiter: AdminRateLimiter,
    auditor: Auditor,
    body_limit: usize,
}

impl Security {
    /// `acl: None` serves every request as `anonymous` with every role and scope.
    pub(crate) fn new(
        acl: Option<Acl>,
        limiter: AdminRateLimiter,
        auditor: Auditor,
        body_limit: usize,
    ) -> Self {
        Security {
            acl,
            limiter,
            auditor,
            body_limit,
        }
    }

    /// The principal of a request (PROTOCOL §8): with an ACL, from its bearer token when it
    /// sends one, else from the client certificate of its connection (`cert`, mutual TLS)
    /// when an entry's `cert_subject` names it; `anonymous` (every role) without an ACL.
    /// `401 UNAUTHENTICATED` for a missing, malformed or unknown token, or a certificate
    /// no entry names.
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
        cert: Option<&ClientCertificate>,
    ) -> Result<Principal, ApiError> {
        let Some(acl) = &self.acl else {
            return Ok(Principal::open());
        };
        let unauthenticated = |m: String| ApiError::new(ErrorCode::Unauthenticated, m);
        match (bearer_token(headers), cert) {
            (Some(token), _) => acl
                .authenticate(token)
                .ok_or_else(|| unauthenticated("unknown token".into())),
            (None, Some(cert)) => acl.authenticate_certificate(cert).ok_or_else(|| {
                unauthenticated(format!(
                    "no ACL entry names the client certificate (subject {:?}) in its \
                     cert_subject; send a bearer token or use a certificate the ACL names",
                    cert.subject
                ))
            }),
            (None, None) => Err(unauthenticated(
                "missing bearer token: send `Authorization: Bearer <token>`".into(),
            )),
        }
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
