//! Who may call which route: the access policy table (PROTOCOL §4).
//!
//! [`ROUTES`] names every route the coordinator serves with its [`Access`]. The access
//! middleware looks requests up here by method and matched path template; a matched route
//! that is missing from the table is refused for everyone (fail closed), and tests check
//! that the table, the router and the OpenAPI document agree.

use super::acl::Role;
use axum::http::Method;

/// Which names of a request the principal's scopes must cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// No group or stream (lists are filtered by scope instead).
    None,
    /// The `{group}` path parameter.
    Group,
    /// The `{stream}` path parameter.
    Stream,
    /// The `group` and `stream` fields of the JSON body (group creation).
    GroupAndStreamInBody,
    /// The `group` of each item of the JSON body (`POST /v1/heartbeats`, `POST /v1/wakeups`).
    /// Not checked by the middleware: the handler checks each item with
    /// [`super::check_item_group`]; a heartbeat out of scope is refused alone, in its own
    /// result; a wake-up channel with one is refused whole.
    GroupPerItemInBody,
}

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// No token needed.
    Open,
    /// One of `roles` (admin always qualifies) and the scope.
    Roles {
        /// Accepted roles.
        roles: &'static [Role],
        /// Scope to check.
        scope: Scope,
    },
    /// An admin mutation: role admin and the scope; audited, allowed or refused, and
    /// rate-limited per principal.
    Admin {
        /// The audit log's action name.
        action: &'static str,
        /// Scope to check.
        scope: Scope,
    },
}

/// One route: method, axum path template and access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RouteSpec {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path template as given to axum (and to OpenAPI): `/v1/groups/{group}`.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

const fn admin(
    method: &'static str,
    path: &'static str,
    action: &'static str,
    scope: Scope,
) -> RouteSpec {
    RouteSpec {
        method,
        path,
        access: Access::Admin { action, scope },
    }
}

const fn roles(
    method: &'static str,
    path: &'static str,
    roles: &'static [Role],
    scope: Scope,
) -> RouteSpec {
    RouteSpec {
        method,
        path,
        access: Access::Roles { roles, scope },
    }
}

const fn open(method: &'static str, path: &'static str) -> RouteSpec {
    RouteSpec {
        method,
        path,
        access: Access::Open,
    }
}

const VIEWER: &[Role] = &[Role::Viewer];

/// Every route the coordinator serves.
pub(crate) const ROUTES: &[RouteSpec] = &[
    // Admin (audited, rate-limited).
    admin(
        "POST",
        "/v1/groups",
        "group.create",
        Scope::GroupAndStreamInBody,
    ),
    admin("PATCH", "/v1/groups/{group}", "group.update", Scope::Group),
    admin("DELETE", "/v1/groups/{group}", "group.delete", Scope::Group),
    admin(
        "POST",
        "/v1/groups/{group}/pause",
        "group.pause",
        Scope::Group,
    ),
    admin(
        "POST",
        "/v1/groups/{group}/resume",
        "group.resume",
        Scope::Group,
    ),
    admin(
        "POST",
        "/v1/groups/{group}/seek",
        "group.seek",
        Scope::Group,
    ),
    admin(
        "POST",
        "/v1/groups/{group}/restore",
        "group.restore",
        Scope::Group,
    ),
    admin(
        "DELETE",
        "/v1/groups/{group}/members/{member}",
        "member.remove",
        Scope::Group,
    ),
    admin(
        "PATCH",
        "/v1/streams/{stream}",
        "stream.update",
        Scope::Stream,
    ),
    admin(
        "POST",
        "/v1/streams/{stream}/dlq/redrive",
        "stream.dlq_redrive",
        Scope::Stream,
    ),
    admin(
        "POST",
        "/v1/streams/{stream}/dlq/purge",
        "stream.dlq_purge",
        Scope::Stream,
    ),
    admin(
        "POST",
        "/v1/streams/{stream}/reshard",
        "stream.reshard",
        Scope::Stream,
    ),
    admin(
        "POST",
        "/v1/streams/{stream}/rollback",
        "stream.rollback",
        Scope::Stream,
    ),
    // Members.
    roles(
        "POST",
        "/v1/groups/{group}/heartbeat",
        &[Role::Member],
        Scope::Group,
    ),
    roles(
        "POST",
        "/v1/groups/{group}/leave",
        &[Role::Member],
        Scope::Group,
    ),
    roles(
        "POST",
        "/v1/heartbeats",
        &[Role::Member],
        Scope::GroupPerItemInBody,
    ),
    roles(
        "POST",
        "/v1/wakeups",
        &[Role::Member],
        Scope::GroupPerItemInBody,
    ),
    // Producers.
    roles(
        "GET",
        "/v1/streams/{stream}/routing",
        &[Role::Producer, Role::Viewer],
        Scope::Stream,
    ),
    // Monitoring.
    roles("GET", "/v1/groups", VIEWER, Scope::None),
    roles(
        "GET",
        "/v1/groups/{group}",
        &[Role::Viewer, Role::Member],
        Scope::Group,
    ),
    roles("GET", "/v1/groups/{group}/scaling", VIEWER, Scope::Group),
    roles("GET", "/v1/groups/{group}/history", VIEWER, Scope::Group),
    roles("GET", "/v1/groups/{group}/revisions", VIEWER, Scope::Group),
    roles("GET", "/v1/groups/{group}/diff", VIEWER, Scope::Group),
    roles(
        "GET",
        "/v1/streams/{stream}/revisions",
        VIEWER,
        Scope::Stream,
    ),
    roles("GET", "/v1/streams", VIEWER, Scope::None),
    roles("GET", "/v1/streams/{stream}", VIEWER, Scope::Stream),
    roles("GET", "/v1/streams/{stream}/dlq", VIEWER, Scope::Stream),
    roles("GET", "/v1/audit", VIEWER, Scope::None),
    roles("GET", "/metrics", VIEWER, Scope::None),
    // Open.
    open("GET", "/healthz"),
    open("GET", "/readyz"),
    open("GET", "/openapi.json"),
    open("GET", "/"),
];

/// Paths served open by the dashboard (its page shell and static assets; their data calls
/// go to the `/v1` API with a viewer token).
pub(crate) fn is_dashboard_path(path: &str) -> bool {
    path == "/" || path.starts_with("/dashboard/")
}

/// The answer of [`lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The route and its access.
    Route(&'static RouteSpec),
    /// The path is known but not with this method: the router answers 405, once the
    /// principal passed the checks of one of the path's routes ([`routes_of`]).
    OtherMethod,
    /// The path is not in the table.
    Unregistered,
}

/// The routes of a path template, whatever their method.
pub(crate) fn routes_of(path: &str) -> impl Iterator<Item = &'static RouteSpec> + '_ {
    ROUTES.iter().filter(move |r| r.path == path)
}

/// Finds the route of a request by method and matched path template. `HEAD` is looked up as
/// `GET`: the router answers it with the `GET` handler, so it must pass `GET`'s checks.
pub(crate) fn lookup(method: &Method, matched_path: &str) -> Lookup {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let mut path_known = false;
    for r in routes_of(matched_path) {
        if r.method == method.as_str() {
            return Lookup::Route(r);
        }
        path_known = true;
    }
    if path_known {
        Lookup::OtherMethod
    } else {
        Lookup::Unregistered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert!(matches!(
            lookup(&Method::DELETE, "/v1/groups/{group}"),
            Lookup::Route(RouteSpec {
                access: Access::Admin {
                    action: "group.delete",
                    ..
                },
                ..
            })
        ));
        assert_eq!(
            lookup(&Method::PUT, "/v1/groups/{group}"),
            Lookup::OtherMethod
        );
        // HEAD runs the GET handler: it gets GET's access, never a pass to the router.
        assert_eq!(
            lookup(&Method::HEAD, "/v1/groups/{group}"),
            lookup(&Method::GET, "/v1/groups/{group}")
        );
        assert_eq!(
            lookup(&Method::HEAD, "/healthz"),
            lookup(&Method::GET, "/healthz")
        );
        assert_eq!(routes_of("/v1/groups/{group}").count(), 3);
        assert_eq!(lookup(&Method::GET, "/v1/nope"), Lookup::Unregistered);
        assert!(is_dashboard_path("/") && is_dashboard_path("/dashboard/app.js"));
        assert!(!is_dashboard_path("/dashboards"));
    }

    #[test]
    fn one_entry_per_method_and_path() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
        }
    }
}
