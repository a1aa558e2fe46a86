//! The web dashboard at `/`: server-rendered HTML (typed `maud` templates compiled into
//! the binary) over the same [`Engine`] the API serves, with one small hand-written script
//! for live updates, local times and the timeline's details. Nothing to build or install.
//!
//! Pages: the workflows overview (`/`), the instance list (`/instances`), one instance
//! (`/workflows/{name}/instances/{id}`), and the login form when a token is set. Every
//! action is an HTML form posted back here (CSRF-checked), answered by a redirect to the
//! page with the result in words.

mod guard;
mod instance;
mod layout;
mod list;
mod overview;
mod timeline;

use axum::Router;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use cairn::Engine;

pub(crate) use guard::Guard;

/// Whether `path` is one of the dashboard's, behind its own gate rather than the API's.
pub(crate) fn owns(path: &str) -> bool {
    matches!(
        path,
        "/" | "/instances" | "/instances/bulk" | "/live" | "/login" | "/logout" | "/favicon.ico"
    ) || path.starts_with("/workflows/")
        || path.starts_with("/schedules/")
        || path.starts_with("/assets/")
}

/// The dashboard's routes; `guard` decides who may see them.
pub(crate) fn routes(guard: std::sync::Arc<Guard>) -> Router<Engine> {
    Router::new()
        .route("/", get(overview::page))
        .route("/instances", get(list::page))
        .route("/instances/bulk", post(list::bulk))
        .route("/live", get(live))
        .route("/schedules/{name}/trigger", post(overview::trigger))
        .route("/schedules/{name}/{verb}", post(overview::pause_or_resume))
        .route("/workflows/{name}/instances/{id}", get(instance::page))
        .route(
            "/workflows/{name}/instances/{id}/action",
            post(instance::action),
        )
        .route(
            "/workflows/{name}/instances/{id}/event",
            post(instance::event),
        )
        .route("/login", get(guard::login_page).post(guard::login))
        .route("/logout", post(guard::logout))
        .route("/assets/app.css", get(css))
        .route("/assets/app.js", get(js))
        .route("/assets/icon.svg", get(icon))
        .route("/favicon.ico", get(icon))
        .route_layer(axum::middleware::from_fn(guard::require))
        .route_layer(axum::Extension(guard))
}

/// `GET /live?cursor=N`: a `change` event whenever any instance changes after record `N`
/// (Server-Sent Events; the list of every workflow refreshes on it).
async fn live(
    State(engine): State<Engine>,
    streams: crate::stream::StreamExtensions,
    RawQuery(query): RawQuery,
) -> Response {
    let pairs = pairs(query.as_deref());
    let cursor = value(&pairs, "cursor")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    match crate::stream::lease(streams) {
        Ok(lease) => crate::stream::follow_changes(engine, cursor, lease).into_response(),
        Err(e) => e.into_response(),
    }
}

const CSS: &str = include_str!("assets/app.css");
const JS: &str = include_str!("assets/app.js");
const ICON: &str = include_str!("assets/icon.svg");

async fn icon() -> Response {
    asset("image/svg+xml", ICON)
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

/// What a dashboard page may load and who may frame it: only this server's own script,
/// styles and connections, inline `style` attributes (the timeline's positions), and no
/// framing at all (a framed page could be clicked through: "Delete").
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; \
     base-uri 'none'";

/// An HTML answer. `no-store`: pages show live state and, with a token, private data.
pub(crate) fn html(status: StatusCode, markup: maud::Markup) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("same-origin"),
            ),
        ],
        markup.into_string(),
    )
        .into_response()
}

/// Back to `to` with the outcome of an action shown there, once, in words.
/// Sends the person back to `to` saying why not, when their session's token lacks `scope`
/// (the pages offer only what it allows; this is the check behind them).
#[allow(clippy::result_large_err)] // a refusal is the answer itself, returned at once
pub(crate) fn allowed(guard: &Guard, to: &str, scope: crate::auth::Scope) -> Result<(), Response> {
    match crate::auth::require(scope) {
        Ok(()) => Ok(()),
        Err(e) => Err(back(guard, to, Err(format!("Not allowed: {}.", e.message)))),
    }
}

pub(crate) fn back(guard: &Guard, to: &str, outcome: Result<String, String>) -> Response {
    let id = guard.flash(outcome);
    let sep = if to.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{to}{sep}flash={id}")).into_response()
}

/// A query string as pairs, repeated keys kept (several `status=`).
pub(crate) fn pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// The first value of `key` in `pairs`.
pub(crate) fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// The path of an instance's page.
pub(crate) fn instance_path(workflow: &str, id: &str) -> String {
    format!(
        "/workflows/{}/instances/{}",
        encode_segment(workflow),
        encode_segment(id)
    )
}

/// `s` made safe for one path segment.
pub(crate) fn encode_segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// `req`'s path and query, for a redirect back to it after logging in.
pub(crate) fn here(req: &Request) -> String {
    req.uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_script_listens_to_every_record_kind() {
        for kind in cairn::LogKind::ALL {
            assert!(
                super::JS.contains(&format!("\"{}\"", kind.as_str())),
                "app.js does not follow {kind} records"
            );
        }
    }
}
