//! [`ApiError`]: every failure as JSON `{code, message}` with an HTTP status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An API failure: a stable code, a message naming what was wrong, and its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code, e.g. `instance.not_found`.
    pub code: String,
    /// What was wrong.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// A malformed request body or query.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "request.invalid", message)
    }
}

impl From<cairn::Error> for ApiError {
    fn from(e: cairn::Error) -> Self {
        let status = match e.code() {
            "instance.not_found" | "workflow.not_found" => StatusCode::NOT_FOUND,
            "instance.already_exists"
            | "instance.cannot_terminate"
            | "instance.cannot_pause"
            | "instance.cannot_resume"
            | "instance.cannot_delete"
            | "instance.finished" => StatusCode::CONFLICT,
            "payload.too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "params.invalid" | "instance.cannot_restart" => StatusCode::UNPROCESSABLE_ENTITY,
            "store.unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "internal" | "engine.config" => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "code": self.code, "message": self.message })),
        )
            .into_response()
    }
}
