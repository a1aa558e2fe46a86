//! Who may use the dashboard, and proof that a form was posted by it.
//!
//! With a token, a person logs in once with it (the login form) and gets a session: an
//! `HttpOnly`, `SameSite=Strict` cookie naming a random session id kept in memory (a
//! restart logs everyone out; the token is never stored in the browser). The session also
//! lets the dashboard's own script read the API (`GET` only: its live streams), never
//! change anything through it. Without a token the server listens on loopback only
//! (`cairn serve` refuses otherwise) and the dashboard opens directly, but only under a
//! loopback host name, so a web page cannot reach it through DNS rebinding.
//!
//! Every form carries a CSRF token (the session's, or one per process without a token)
//! and a state-changing request is refused without it, or when the browser says it comes
//! from another site (`Sec-Fetch-Site`, `Origin`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{Form, Query, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::layout;
use crate::auth::Caller;
use crate::origin::cross_site;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "cairn_session";
/// How long a session lasts after login.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept; logging in past it drops the oldest.
const MAX_SESSIONS: usize = 1_000;

/// The dashboard's access rule.
pub(crate) struct Guard {
    tokens: Option<crate::auth::Tokens>,
    sessions: Mutex<HashMap<String, Session>>,
    /// The CSRF token of every form when there is no token (and so no session).
    open_csrf: String,
    /// Outcomes of actions waiting to be shown once (`?flash=<id>`): kept here, not in the
    /// URL, so a link cannot make the dashboard say something it did not.
    flashes: Mutex<HashMap<String, Flash>>,
    /// Wrong tokens by client address: each client that guesses wrong waits before its next
    /// attempt (its own wait, not anyone else's).
    logins: Mutex<HashMap<Client, Throttle>>,
}

/// Where a login comes from: the peer's address (its IP: ports change per connection), or
/// `None` for a request that did not come through a socket (a test's router call).
type Client = Option<std::net::IpAddr>;

/// A client's wrong logins in a row and when it may try again (on tokio's clock, which a
/// test can move).
#[derive(Clone, Copy)]
struct Throttle {
    wrong: u32,
    until: tokio::time::Instant,
}

/// The wait after a client's first wrong token; it doubles with each one in a row.
const LOGIN_PAUSE: Duration = Duration::from_secs(1);
/// The longest wait between a client's attempts.
const LOGIN_PAUSE_MAX: Duration = Duration::from_secs(60);
/// A client's count of wrong tokens is forgotten this long after its wait ended.
const LOGIN_MEMORY: Duration = Duration::from_secs(15 * 60);
/// The most clients remembered; past it the ones that may try again soonest are forgotten.
const MAX_THROTTLED: usize = 10_000;

/// An action's outcome in words, and when it was kept.
type Flash = (Result<String, String>, Instant);

/// How long an action's outcome waits to be shown.
const FLASH_TTL: Duration = Duration::from_secs(300);
/// The most outcomes waiting at once.
const MAX_FLASHES: usize = 10_000;

struct Session {
    csrf: String,
    until: Instant,
    /// The token it logged in with: its name for the audit log, its scope for what the
    /// pages offer and the forms may do.
    caller: Caller,
}

fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Guard {
    pub(crate) fn new(tokens: Option<crate::auth::Tokens>) -> Arc<Guard> {
        Arc::new(Guard {
            tokens,
            sessions: Mutex::new(HashMap::new()),
            open_csrf: random(),
            flashes: Mutex::new(HashMap::new()),
            logins: Mutex::new(HashMap::new()),
        })
    }

    /// How long `client` must still wait before it may try a token (`None`: it may now).
    fn login_wait(&self, client: Client) -> Option<Duration> {
        let logins = self.logins.lock().unwrap_or_else(PoisonError::into_inner);
        let until = logins.get(&client)?.until;
        until
            .checked_duration_since(tokio::time::Instant::now())
            .filter(|wait| !wait.is_zero())
    }

    /// Notes a login attempt's result for `client`: a wrong token makes it wait (doubling
    /// with each one in a row), a right one forgets its count.
    fn login_tried(&self, client: Client, right: bool) {
        let mut logins = self.logins.lock().unwrap_or_else(PoisonError::into_inner);
        if right {
            logins.remove(&client);
            return;
        }
        let now = tokio::time::Instant::now();
        if logins.len() >= MAX_THROTTLED && !logins.contains_key(&client) {
            logins.retain(|_, t| t.until + LOGIN_MEMORY > now);
            if logins.len() >= MAX_THROTTLED
                && let Some(soonest) = logins.iter().min_by_key(|(_, t)| t.until).map(|(k, _)| *k)
            {
                logins.remove(&soonest);
            }
        }
        let wrong = match logins.get(&client) {
            Some(t) if t.until + LOGIN_MEMORY > now => t.wrong.saturating_add(1),
            _ => 1,
        };
        let pause = LOGIN_PAUSE
            .saturating_mul(1u32.checked_shl(wrong - 1).unwrap_or(u32::MAX))
            .min(LOGIN_PAUSE_MAX);
        logins.insert(
            client,
            Throttle {
                wrong,
                until: now + pause,
            },
        );
    }

    /// Keeps `outcome` to be shown once; answers its id.
    pub(crate) fn flash(&self, outcome: Result<String, String>) -> String {
        let id = random();
        let mut flashes = self.flashes.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        flashes.retain(|_, (_, at)| now.duration_since(*at) < FLASH_TTL);
        if flashes.len() < MAX_FLASHES {
            flashes.insert(id.clone(), (outcome, now));
        }
        id
    }

    /// The outcome kept under `id`, once.
    pub(crate) fn take_flash(&self, id: &str) -> Option<Result<String, String>> {
        self.flashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
            .map(|(outcome, _)| outcome)
    }

    /// The CSRF token of the person sending `headers`, if they may use the dashboard.
    pub(crate) fn csrf(&self, headers: &HeaderMap) -> Option<String> {
        self.access(headers).map(|(csrf, _)| csrf)
    }

    /// The CSRF token and the caller (none without tokens) of the person sending
    /// `headers`, if they may use the dashboard. A session whose token was removed, or
    /// changed scope, since it logged in has ended.
    fn access(&self, headers: &HeaderMap) -> Option<(String, Option<Caller>)> {
        let Some(tokens) = &self.tokens else {
            return Some((self.open_csrf.clone(), None));
        };
        let id = session_id(headers)?;
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions
            .get(id)
            .filter(|s| s.until > Instant::now() && tokens.still(&s.caller))
            .map(|s| (s.csrf.clone(), Some(s.caller.clone())))
    }

    /// The caller of the live session `headers` carry, if any (the API lets it read).
    pub(crate) fn session_caller(&self, headers: &HeaderMap) -> Option<Caller> {
        self.access(headers).and_then(|(_, caller)| caller)
    }

    /// Whether `headers` carry a live session.
    pub(crate) fn has_session(&self, headers: &HeaderMap) -> bool {
        self.session_caller(headers).is_some()
    }

    fn login(&self, given: &str) -> Option<String> {
        let caller = self.tokens.as_ref()?.find(given)?;
        let id = random();
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        sessions.retain(|_, s| s.until > now);
        let full = sessions.len() >= MAX_SESSIONS;
        if let Some(oldest) = sessions
            .iter()
            .filter(|_| full)
            .min_by_key(|(_, s)| s.until)
            .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            Session {
                csrf: random(),
                until: now + SESSION_TTL,
                caller,
            },
        );
        Some(id)
    }

    fn logout(&self, headers: &HeaderMap) {
        if let Some(id) = session_id(headers) {
            self.sessions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(id);
        }
    }
}

fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// The dashboard's gate: a login (when a token is set) for every page but the login form
/// and the assets, and same-site posts (each form's CSRF token is compared by its handler,
/// see [`check_form`]).
pub(crate) async fn require(
    Extension(guard): Extension<Arc<Guard>>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    let open = path == "/login" || path.starts_with("/assets/") || path == "/favicon.ico";
    // (Without a token, `auth::local_only` already refused other hosts and sites.)
    if req.method() == Method::POST && cross_site(req.headers()) {
        return refuse(
            StatusCode::FORBIDDEN,
            "This form was sent from another site; open the dashboard and try again.",
        );
    }
    match guard.access(req.headers()) {
        // Everything that runs for a session's request knows its token (`auth::caller`):
        // the pages offer only what its scope allows, the forms check it, the audit log
        // names it.
        Some((_, Some(caller))) => {
            let tokens = guard.tokens.clone().unwrap_or_default();
            crate::auth::as_caller(caller, tokens, next.run(req)).await
        }
        Some((_, None)) => next.run(req).await,
        None if open => next.run(req).await,
        None if req.method() == Method::GET => {
            let next: String =
                form_urlencoded::byte_serialize(super::here(&req).as_bytes()).collect();
            Redirect::to(&format!("/login?next={next}")).into_response()
        }
        None => refuse(
            StatusCode::UNAUTHORIZED,
            "Your session has ended; log in again.",
        ),
    }
}

/// Checks a posted form's CSRF token against the sender's.
#[allow(clippy::result_large_err)] // a refusal is the answer itself, returned at once
pub(crate) fn check_form(guard: &Guard, headers: &HeaderMap, given: &str) -> Result<(), Response> {
    match guard.csrf(headers) {
        Some(csrf) if crate::auth::constant_time_eq(csrf.as_bytes(), given.as_bytes()) => Ok(()),
        _ => Err(refuse(
            StatusCode::FORBIDDEN,
            "This form has expired (its security token does not match); reload the page and try again.",
        )),
    }
}

/// A form posted by the dashboard, as pairs (repeated keys kept), once its CSRF token
/// (`csrf`) matches the sender's; the refusal otherwise.
#[allow(clippy::result_large_err)] // a refusal is the answer itself, returned at once
pub(crate) fn posted_form(
    guard: &Guard,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<(String, String)>, Response> {
    let form: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    check_form(guard, headers, super::value(&form, "csrf").unwrap_or(""))?;
    Ok(form)
}

fn refuse(status: StatusCode, message: &str) -> Response {
    super::html(status, layout::message_page(status.as_str(), message))
}

#[derive(Deserialize)]
pub(crate) struct LoginQuery {
    next: Option<String>,
    flash: Option<String>,
}

/// A path on this server to return to after logging in: never another origin (no `//`,
/// no backslash, and no whitespace or control character, which browsers drop from a URL:
/// `/\t/evil.example` would become `//evil.example`).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.bytes().any(|b| b <= b' ' || b == 0x7f) =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

pub(crate) async fn login_page(
    Extension(guard): Extension<Arc<Guard>>,
    Query(query): Query<LoginQuery>,
) -> Response {
    let next = safe_next(query.next.as_deref());
    if guard.tokens.is_none() {
        return Redirect::to(&next).into_response();
    }
    let body = html! {
        main.login {
            h1 { "Cairn" }
            p { "This server needs its token (" code { "cairn serve --token" } " or " code { "CAIRN_TOKEN" } ")." }
            @if let Some(Err(err)) = query.flash.as_deref().and_then(|id| guard.take_flash(id)) {
                p.flash.error role="alert" { (err) }
            }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                button type="submit" { "Log in" }
            }
        }
    };
    super::html(StatusCode::OK, layout::bare("Log in", body))
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
    next: Option<String>,
}

pub(crate) async fn login(
    Extension(guard): Extension<Arc<Guard>>,
    peer: Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    over_tls: Option<Extension<crate::serve::OverTls>>,
    Form(form): Form<LoginForm>,
) -> Response {
    let next = safe_next(form.next.as_deref());
    let client = peer.map(|Extension(axum::extract::ConnectInfo(addr))| addr.ip().to_canonical());
    if let Some(wait) = guard.login_wait(client) {
        let seconds = wait.as_secs_f64().ceil();
        let mut response = refuse(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("Too many wrong tokens from here; try again in {seconds} s."),
        );
        if let Ok(value) = HeaderValue::from_str(&format!("{seconds}")) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let session = guard.login(&form.token);
    guard.login_tried(client, session.is_some());
    match session {
        Some(id) => {
            // Over TLS the browser must never send it over plain HTTP.
            let secure = if over_tls.is_some() { "; Secure" } else { "" };
            let cookie = format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict{secure}");
            let mut response = Redirect::to(&next).into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        None => {
            let next: String = form_urlencoded::byte_serialize(next.as_bytes()).collect();
            super::back(
                &guard,
                &format!("/login?next={next}"),
                Err("Wrong token.".into()),
            )
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct LogoutForm {
    csrf: String,
}

pub(crate) async fn logout(
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    if let Err(refused) = check_form(&guard, &headers, &form.csrf) {
        return refused;
    }
    guard.logout(&headers);
    let mut response = Redirect::to("/login").into_response();
    let expired = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&expired) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_on_this_server() {
        assert_eq!(safe_next(Some("/instances?x=1")), "/instances?x=1");
        assert_eq!(safe_next(Some("//evil.example")), "/");
        assert_eq!(safe_next(Some("https://evil.example")), "/");
        assert_eq!(safe_next(Some("/\\evil.example")), "/");
        assert_eq!(safe_next(Some("/\t/evil.example")), "/");
        assert_eq!(safe_next(Some("/\n/evil.example")), "/");
        assert_eq!(safe_next(None), "/");
    }

    #[test]
    fn a_session_is_its_cookie_and_ends_at_logout() {
        let guard = Guard::new(Some(crate::auth::Tokens::new(vec![
            crate::auth::Token::new("t", "t0ken", crate::auth::Scope::Admin).unwrap(),
        ])));
        assert!(guard.login("wrong").is_none());
        let id = guard.login("t0ken").expect("logged in");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={id}")).unwrap(),
        );
        let csrf = guard.csrf(&headers).expect("session");
        assert!(check_form(&guard, &headers, &csrf).is_ok());
        assert!(check_form(&guard, &headers, "forged").is_err());
        guard.logout(&headers);
        assert!(guard.csrf(&headers).is_none());
    }
}
