//! Every control action is logged, with what it acted on and where it came from, so an
//! operator can answer "who terminated this?" from the log alone: one `info` line on the
//! `cairn::audit` target per action (pause, resume, terminate, restart, delete, a bulk
//! action, a schedule change), with its origin — `api`, `cli` (the `cairn` CLI, which says
//! so in its User-Agent), `cloudflare` (the `/client/v4` routes, with the client named
//! when it says who it is, e.g. wrangler) or `dashboard` — the name of the token it came
//! with (the dashboard's: the one its session logged in with), and whether it succeeded.

use axum::http::HeaderMap;

/// Where a request came from, for the audit line.
pub(crate) fn origin(route_set: RouteSet, headers: &HeaderMap) -> String {
    let agent = headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match route_set {
        RouteSet::Api if agent.starts_with("cairn-cli") => "cli".to_owned(),
        RouteSet::Api => "api".to_owned(),
        RouteSet::Cloudflare if agent.contains("wrangler") => "cloudflare (wrangler)".to_owned(),
        RouteSet::Cloudflare => "cloudflare".to_owned(),
    }
}

/// The route set a request came through (the dashboard's handlers say `dashboard`
/// themselves: a session, not a client, acts there).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RouteSet {
    Api,
    Cloudflare,
}

/// Logs one control action on `target` (`workflow/id`, a schedule's name, or a bulk
/// action's filter) and its outcome.
pub(crate) fn control<E: std::fmt::Display>(
    origin: &str,
    action: &str,
    target: &str,
    outcome: &Result<(), E>,
) {
    // The token's name, when the server has tokens (never the token itself).
    let caller = crate::auth::caller();
    let token = caller.as_ref().map_or("", |c| &*c.name);
    match outcome {
        Ok(()) => {
            tracing::info!(target: "cairn::audit", origin, token, action, on = target, "control action")
        }
        Err(e) => {
            tracing::info!(target: "cairn::audit", origin, token, action, on = target, refused = %e, "control action refused")
        }
    }
}

/// Logs an action a request asked for, its origin read from the request's `headers`.
pub(crate) fn request<E: std::fmt::Display>(
    route_set: RouteSet,
    headers: &HeaderMap,
    action: &str,
    target: &str,
    outcome: &Result<(), E>,
) {
    control(&origin(route_set, headers), action, target, outcome);
}

/// Logs an action that has no refusal of its own to report: a job started in the
/// background, or a batch whose answer lists each instance's outcome.
pub(crate) fn started(route_set: RouteSet, headers: &HeaderMap, action: &str, target: &str) {
    request::<std::convert::Infallible>(route_set, headers, action, target, &Ok(()));
}
