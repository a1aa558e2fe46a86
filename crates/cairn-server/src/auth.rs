//! Bearer-token authentication.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

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

/// Lets a request with the bearer token through, and one of the dashboard's sessions when
/// it only reads (its live streams): a session can never change anything through the API,
/// so the API needs no CSRF defence.
pub(crate) async fn check(
    token: String,
    guard: std::sync::Arc<crate::dashboard::Guard>,
    req: Request,
    next: Next,
) -> Response {
    // Load balancers probe `/healthz` without credentials; it reveals nothing else. The
    // dashboard's pages have their own gate (its login form).
    if req.uri().path() == "/healthz" || crate::dashboard::owns(req.uri().path()) {
        return next.run(req).await;
    }
    let reads = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if reads && guard.has_session(req.headers()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => ApiError::new(
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
pub(crate) async fn local_only(req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    // A browser always names the host; a request without one is not a web page's.
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .map(|v| v.to_str().unwrap_or("?"));
    if host.is_some_and(|h| !crate::dashboard::loopback_host(h)) {
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
    if !reads && crate::dashboard::cross_site(req.headers()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "auth.cross_site",
            "a request from another site may not change anything here",
        )
        .into_response();
    }
    next.run(req).await
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
    fn constant_time_eq_compares_exactly() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secrets"));
    }
}
