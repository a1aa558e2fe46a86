//! Bearer-token authentication and what each token may do.
//!
//! A server has one or more named tokens, each with a [`Scope`]: `read` (lookups, streams,
//! the dashboard without its buttons), `operate` (also create, events, pause, resume,
//! terminate, restart, and connecting workers) or `admin` (also every delete, schedules,
//! and Cloudflare's routes that act on a whole workflow). Only a SHA-256 of each token is
//! kept; the set can be replaced while the server runs ([`Tokens::replace`]: rotating is
//! adding the new one and removing the old). The caller a request was let in as is known to
//! everything that runs for it ([`caller`]), so the audit log names the token.

use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// What a token may do; each scope may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Lookups, listings, live streams; the dashboard without its actions.
    Read,
    /// Also create instances, send events, pause, resume, terminate, restart; connect
    /// workers.
    Operate,
    /// Also delete (one, a batch, in bulk, a whole workflow), manage schedules, and
    /// Cloudflare's routes that act on a whole workflow.
    Admin,
}

impl Scope {
    /// Its name as configured (`read`, `operate`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Operate => "operate",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Scope::Read),
            "operate" => Ok(Scope::Operate),
            "admin" => Ok(Scope::Admin),
            other => Err(format!(
                "unknown scope {other:?}: it is read, operate or admin"
            )),
        }
    }
}

/// One configured token: its name (logged; the token never is), the SHA-256 of its value,
/// and its scope.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    name: String,
    sha256: [u8; 32],
    scope: Scope,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// A token given by its value (kept only as its hash). `None` for an empty or blank
    /// value: such a token would let in anyone who sends nothing.
    ///
    /// Surrounding whitespace is dropped, as HTTP drops it from the header a client sends
    /// the token in: `"abc\n"` (a value written with `echo`) is the token `abc`.
    pub fn new(name: impl Into<String>, value: &str, scope: Scope) -> Option<Token> {
        let value = value.trim();
        (!value.is_empty()).then(|| Token {
            name: name.into(),
            sha256: Sha256::digest(value.as_bytes()).into(),
            scope,
        })
    }

    /// A token given by the SHA-256 of its value, as 64 hex digits.
    ///
    /// # Errors
    /// Anything but 64 hex digits.
    pub fn from_sha256(name: impl Into<String>, hex: &str, scope: Scope) -> Result<Token, String> {
        let hex = hex.trim();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("token_sha256 must be 64 hex digits (sha256sum of the token)".into());
        }
        let mut sha256 = [0; 32];
        for (i, byte) in sha256.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        // What `sha256sum` prints for an unset `$TOKEN` (`printf %s`, `echo`, a Windows
        // `echo`, a stray space or tab): such a token lets in anyone who sends nothing.
        if ["", "\n", "\r\n", " ", "\t", " \n"]
            .iter()
            .any(|blank| <[u8; 32]>::from(Sha256::digest(blank.as_bytes())) == sha256)
        {
            return Err(
                "token_sha256 is the SHA-256 of an empty or blank token (was the variable hashed empty?)"
                    .into(),
            );
        }
        Ok(Token {
            name: name.into(),
            sha256,
            scope,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its scope.
    pub fn scope(&self) -> Scope {
        self.scope
    }
}

/// The tokens a server accepts, replaceable while it runs (clones share them).
#[derive(Clone, Debug, Default)]
pub struct Tokens(Arc<RwLock<Arc<[Token]>>>);

impl Tokens {
    /// These tokens.
    pub fn new(tokens: Vec<Token>) -> Tokens {
        Tokens(Arc::new(RwLock::new(tokens.into())))
    }

    /// From now on, these tokens instead (a request in flight keeps the caller it was let
    /// in as; a dashboard session ends at its next request if its token is gone or changed
    /// scope).
    pub fn replace(&self, tokens: Vec<Token>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = tokens.into();
    }

    /// The tokens now.
    pub fn list(&self) -> Vec<Token> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .to_vec()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The caller `given` is the token of, if any.
    pub(crate) fn find(&self, given: &str) -> Option<Caller> {
        // An empty or blank token is no token, whatever the set holds. A pasted token's
        // surrounding whitespace is dropped, as it was from the token set (`Token::new`).
        let given = given.trim();
        if given.is_empty() {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        let tokens = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // Every token is compared, in time that does not depend on where bytes differ.
        let mut found = None;
        for token in tokens.iter() {
            if constant_time_eq(&digest, &token.sha256) && found.is_none() {
                found = Some(Caller {
                    name: token.name.clone().into(),
                    scope: token.scope,
                    sha256: token.sha256,
                });
            }
        }
        found
    }

    /// Whether a caller's token is still one of these, with the same name, value and
    /// scope (a token given a new value under its old name is another token).
    pub(crate) fn still(&self, caller: &Caller) -> bool {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|t| {
                *t.name == *caller.name
                    && t.scope == caller.scope
                    && constant_time_eq(&t.sha256, &caller.sha256)
            })
    }
}

/// Who a request was let in as: a token's name and scope (and its hash, to tell whether
/// the token is still in force).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) name: Arc<str>,
    pub(crate) scope: Scope,
    sha256: [u8; 32],
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A caller and the tokens it was let in by: whether it is still let in
/// ([`Grant::in_force`]) is asked by what outlives its request (a live stream, a worker's
/// connection), so that a token removed from the set ends them too.
#[derive(Clone, Debug)]
pub(crate) struct Grant {
    caller: Caller,
    tokens: Tokens,
}

impl Grant {
    /// Whether the caller's token is still in the set, unchanged.
    pub(crate) fn in_force(&self) -> bool {
        self.tokens.still(&self.caller)
    }
}

tokio::task_local! {
    /// The grant of the request being answered, for the handlers' scope checks that
    /// depend on a body (a bulk delete), the audit log, and what outlives the request.
    static GRANT: Grant;
}

/// The caller of the request being answered; `None` on a server without tokens (loopback
/// only, where every request may do everything).
pub(crate) fn caller() -> Option<Caller> {
    GRANT.try_with(|g| g.caller.clone()).ok()
}

/// The grant of the request being answered (`None` without tokens).
pub(crate) fn grant() -> Option<Grant> {
    GRANT.try_with(Clone::clone).ok()
}

/// Whether the request being answered may do what needs `scope`.
pub(crate) fn may(scope: Scope) -> bool {
    caller().is_none_or(|c| c.scope >= scope)
}

/// Refuses what needs `scope` when the request's caller lacks it: 403 `auth.forbidden`,
/// naming the scope.
pub(crate) fn require(scope: Scope) -> Result<(), ApiError> {
    match caller() {
        Some(c) if c.scope < scope => Err(forbidden(&c, scope)),
        _ => Ok(()),
    }
}

fn forbidden(caller: &Caller, needs: Scope) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "auth.forbidden",
        format!(
            "this needs a token with the {needs} scope; the token named {} has {}",
            caller.name, caller.scope
        ),
    )
}

/// Runs `inner` (what answers the request) as `caller`'s, let in by `tokens`. A live
/// stream it answers with ends once the caller's token is no longer in force (checked at
/// each event and keep-alive).
pub(crate) async fn as_caller(
    caller: Caller,
    tokens: Tokens,
    inner: impl Future<Output = Response>,
) -> Response {
    let grant = Grant { caller, tokens };
    let response = GRANT.scope(grant.clone(), inner).await;
    let streams = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streams {
        return response;
    }
    let (parts, body) = response.into_parts();
    let frames = futures::StreamExt::take_while(body.into_data_stream(), move |_| {
        std::future::ready(grant.in_force())
    });
    Response::from_parts(parts, axum::body::Body::from_stream(frames))
}

/// The scope a request needs, from its method and route. Reads need `read`; the routes
/// that act on instances without deleting them need `operate`; every other change needs
/// `admin`, so a route added later is closed until it is placed here. A bulk action's
/// need depends on its body (delete is `admin`): its handler checks that with
/// [`require`].
pub(crate) fn needs(method: &Method, path: &str) -> Scope {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Workers run the code of TypeScript workflows: they read every instance's values and
    // write its results. Their connection is a GET (a WebSocket upgrade).
    if segments == ["api", "workers"] {
        return Scope::Operate;
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Scope::Read;
    }
    // The instance routes under `/api/workflows/{name}` and Cloudflare's
    // `/client/v4/accounts/{account}/workflows/{name}`.
    let instance_route = match segments.as_slice() {
        ["api", "workflows", _, rest @ ..] => Some(rest),
        ["client", "v4", "accounts", _, "workflows", _, rest @ ..] => Some(rest),
        _ => None,
    };
    let operates = match (method.as_str(), instance_route) {
        // Create one or a batch.
        ("POST", Some(["instances"] | ["instances", "batch"])) => true,
        // Pause, resume, terminate, restart; send an event.
        ("PATCH", Some(["instances", _, "status"])) => true,
        ("POST", Some(["instances", _, "events", _])) => true,
        _ => matches!(
            (method.as_str(), segments.as_slice()),
            ("POST", ["api", "instances", "bulk"])
        ),
    };
    if operates {
        Scope::Operate
    } else {
        Scope::Admin
    }
}

/// Compares in time that depends only on the lengths, not on where the bytes differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The credentials of a `Bearer` authorization; the scheme is case-insensitive (RFC 7235).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim_start())
}

/// Lets a request with one of the tokens through when its scope covers the route, and one
/// of the dashboard's sessions (`session`: the caller of the session its headers carry)
/// when it only reads (its live streams): a session can never change anything through the
/// API, so the API needs no CSRF defence.
pub(crate) async fn check<F: Future<Output = Response>>(
    tokens: Tokens,
    session: impl FnOnce(&axum::http::HeaderMap) -> Option<Caller>,
    req: Request,
    inner: impl FnOnce(Request) -> F,
) -> Response {
    let needs = needs(req.method(), req.uri().path());
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    let caller = match given {
        Some(given) => tokens.find(given),
        None if needs == Scope::Read => session(req.headers()),
        None => None,
    };
    match caller {
        Some(caller) if caller.scope >= needs => as_caller(caller, tokens, inner(req)).await,
        Some(caller) => forbidden(&caller, needs).into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "auth.unauthorized",
            "missing or wrong bearer token (send Authorization: Bearer <token>)",
        )
        .into_response(),
    }
}

/// Without a token the server listens on loopback only (`cairn serve` refuses otherwise),
/// and answers only requests that name a loopback host (a web page cannot reach it through
/// DNS rebinding) and, when they change something, come from no other site (a browser's
/// `Sec-Fetch-Site`/`Origin`: any page may send a simple POST to 127.0.0.1).
pub(crate) async fn local_only<F: Future<Output = Response>>(
    req: Request,
    inner: impl FnOnce(Request) -> F,
) -> Response {
    // A browser always names the host (HTTP/2: in the request's authority); a request
    // without one is not a web page's.
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .map(|v| v.to_str().unwrap_or("?"))
        .or(authority.as_deref());
    if host.is_some_and(|h| !crate::origin::loopback_host(h)) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "auth.host",
            "this server has no token, so it answers only requests to 127.0.0.1, [::1] or localhost",
        )
        .into_response();
    }
    let reads = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if !reads && crate::origin::cross_site(req.headers()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "auth.cross_site",
            "a request from another site may not change anything here",
        )
        .into_response();
    }
    inner(req).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(super::bearer("Bearer abc"), Some("abc"));
        assert_eq!(super::bearer("bearer abc"), Some("abc"));
        assert_eq!(super::bearer("BEARER  abc"), Some("abc"));
        assert_eq!(super::bearer("Basic abc"), None);
        assert_eq!(super::bearer("Bearerabc"), None);
    }

    #[test]
    fn each_route_needs_the_scope_its_effect_calls_for() {
        use super::{Scope, needs};
        use axum::http::Method;
        let cf = "/client/v4/accounts/a/workflows";
        for (method, path, scope) in [
            (Method::GET, "/api/workflows/w/instances", Scope::Read),
            (
                Method::GET,
                "/api/workflows/w/instances/i/stream",
                Scope::Read,
            ),
            (Method::GET, "/api/workers", Scope::Operate),
            (Method::POST, "/api/workflows/w/instances", Scope::Operate),
            (
                Method::POST,
                "/api/workflows/w/instances/batch",
                Scope::Operate,
            ),
            (
                Method::PATCH,
                "/api/workflows/w/instances/i/status",
                Scope::Operate,
            ),
            (
                Method::POST,
                "/api/workflows/w/instances/i/events/e",
                Scope::Operate,
            ),
            (Method::POST, "/api/instances/bulk", Scope::Operate),
            (Method::DELETE, "/api/workflows/w/instances/i", Scope::Admin),
            (
                Method::POST,
                "/api/workflows/w/instances/batch/delete",
                Scope::Admin,
            ),
            (Method::POST, "/api/schedules", Scope::Admin),
            (Method::POST, "/api/schedules/s/pause", Scope::Admin),
            (Method::GET, "/api/schedules", Scope::Read),
            (Method::GET, cf, Scope::Read),
            (Method::PUT, &format!("{cf}/w"), Scope::Admin),
            (Method::DELETE, &format!("{cf}/w"), Scope::Admin),
            (
                Method::PUT,
                &format!("{cf}/w/instances/terminate"),
                Scope::Admin,
            ),
            (
                Method::POST,
                &format!("{cf}/w/instances/batch/delete"),
                Scope::Admin,
            ),
            (Method::POST, &format!("{cf}/w/instances"), Scope::Operate),
            (
                Method::PATCH,
                &format!("{cf}/w/instances/i/status"),
                Scope::Operate,
            ),
        ] {
            assert_eq!(needs(&method, path), scope, "{method} {path}");
        }
    }

    #[test]
    fn tokens_are_kept_as_hashes_and_found_by_value() {
        use super::{Scope, Token, Tokens};
        let ci = Token::new("ci", "s3cret", Scope::Operate).unwrap();
        assert!(!format!("{ci:?}").contains("s3cret"));
        let hashed = Token::from_sha256(
            "ops",
            // sha256("hunter2")
            "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7",
            Scope::Admin,
        )
        .unwrap();
        let tokens = Tokens::new(vec![ci, hashed]);
        assert_eq!(tokens.find("s3cret").unwrap().scope, Scope::Operate);
        assert_eq!(&*tokens.find("hunter2").unwrap().name, "ops");
        assert!(tokens.find("nope").is_none());
        assert!(Token::new("blank", "  ", Scope::Admin).is_none());
        // Review finding: a token written with `echo` could never be sent (a header drops
        // the newline), which left the API closed to every client.
        let echoed = Tokens::new(vec![Token::new("echoed", "abc\n", Scope::Admin).unwrap()]);
        assert_eq!(&*echoed.find("abc").unwrap().name, "echoed");
        assert!(Token::from_sha256("bad", "abc", Scope::Admin).is_err());
        tokens.replace(vec![Token::new("new", "n3w", Scope::Read).unwrap()]);
        assert!(tokens.find("s3cret").is_none(), "rotated out");
        assert_eq!(tokens.find("n3w").unwrap().scope, Scope::Read);
    }

    /// Review finding: `printf %s "$TOKEN" | sha256sum` with `$TOKEN` unset gives the hash
    /// of nothing, and `echo` adds a newline: configured as `token_sha256`, either let in
    /// anyone who sent an empty token (an empty login form, an empty bearer over HTTP/2).
    #[test]
    fn a_token_hashed_from_nothing_is_refused_and_an_empty_token_finds_none() {
        use super::{Scope, Token, Tokens};
        use sha2::{Digest, Sha256};
        for blank in ["", "\n", " ", "\t", "\r\n", " \n"] {
            let hex: String = Sha256::digest(blank.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let refused = Token::from_sha256("ci", &hex, Scope::Admin);
            assert!(
                refused.as_ref().is_err_and(|e| e.contains("empty")),
                "{blank:?}: {refused:?}"
            );
            // Should such a token be in the set anyway, nothing blank is taken for it.
            let tokens = Tokens::new(vec![Token {
                name: "ci".into(),
                sha256: Sha256::digest(blank.as_bytes()).into(),
                scope: Scope::Admin,
            }]);
            for given in ["", " ", "\n", "\t\n", "\r\n"] {
                assert!(tokens.find(given).is_none(), "{blank:?}, given {given:?}");
            }
        }
    }

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secrets"));
    }
}
