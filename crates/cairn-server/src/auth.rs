//! Bearer-token authentication.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Compares in time that depends only on the lengths, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) async fn check(token: String, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
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

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secrets"));
    }
}
