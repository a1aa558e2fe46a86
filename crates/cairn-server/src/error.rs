//! [`ApiError`]: every failure as JSON `{code, message}` with an HTTP status.

use axum::Json;
use axum::extract::rejection::JsonRejection;
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

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
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

/// The HTTP status of one of the engine's error codes.
pub(crate) fn status_of_code(code: &str) -> StatusCode {
    match code {
        "instance.not_found" | "workflow.not_found" | "schedule.not_found" | "step.not_found" => {
            StatusCode::NOT_FOUND
        }
        "instance.already_exists"
        | "schedule.already_exists"
        | "schedule.declared_in_code"
        | "instance.cannot_terminate"
        | "instance.cannot_pause"
        | "instance.cannot_resume"
        | "instance.cannot_delete"
        | "instance.finished" => StatusCode::CONFLICT,
        "payload.too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "params.invalid" | "event.invalid_payload" | "instance.cannot_restart" => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        "store.unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "internal" | "engine.config" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl From<cairn::Error> for ApiError {
    fn from(e: cairn::Error) -> Self {
        let status = status_of_code(e.code());
        // An id or name the caller sent may be echoed in the message: never 10 kB of it.
        ApiError::new(status, e.code(), clip_to(&e.to_string(), 1_000))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(json!({ "code": self.code, "message": self.message })),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Busy or down for now: a client may try again in a moment.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

/// Turns an error response to `method path` that is not JSON yet (axum's own: an unknown
/// route, a wrong method, a path that is not UTF-8 or does not parse) into
/// `{code, message}`, keeping its status and headers (`Allow` on a 405).
pub(crate) async fn json_errors(
    method: &axum::http::Method,
    path: &str,
    response: Response,
) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("application/json")
                || v.starts_with("text/event-stream")
                || v.starts_with("text/html")
        });
    if status.as_u16() < 400 || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let shown = crate::error::clip(path);
    let (code, message) = match status {
        StatusCode::NOT_FOUND => (
            "route.not_found",
            format!("no route {method} {shown} (see /api/openapi.json)"),
        ),
        // The allowed methods are in the `Allow` header (axum adds it after this layer).
        StatusCode::METHOD_NOT_ALLOWED => (
            "method.not_allowed",
            format!("{method} is not allowed on {shown} (see the Allow header)"),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "request.unsupported_media_type",
            format!(
                "{text}: send the body as JSON with the header `Content-Type: application/json` (curl: -H 'content-type: application/json')"
            ),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("payload.too_large", text),
        s if s.is_server_error() => ("internal", text),
        _ => (
            "request.invalid",
            if text.is_empty() {
                status.to_string()
            } else {
                text
            },
        ),
    };
    if code == "request.invalid" {
        // An extractor's 422 (a form missing a field) is the same bad request as any.
        parts.status = StatusCode::BAD_REQUEST;
    }
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let body = json!({ "code": code, "message": message }).to_string();
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// The stable code of an error answer known only by its status (an extractor's rejection,
/// axum's own answers): the one table both places use.
pub(crate) fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload.too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "request.unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "request.invalid",
    }
}

/// Input echoed in a message, cut to a readable length (a 10 kB id is not echoed whole).
pub(crate) fn clip(text: &str) -> String {
    clip_to(text, 200)
}

/// `text`, cut to at most `max` bytes (on a character boundary) with the length said.
pub(crate) fn clip_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// Maps an extractor's rejection (malformed JSON, wrong content type, oversized body) to
/// an [`ApiError`].
pub(crate) fn rejected(status: StatusCode, detail: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ApiError::new(status, crate::error::code_for(status), detail)
        }
        // Malformed JSON (400) and JSON of the wrong shape (422) alike: one code, one status.
        _ => ApiError::bad_request(detail),
    }
}

/// A JSON body; `Object` bodies refuse an array with the same `request.invalid` as any
/// other malformed body.
pub(crate) fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(v)| v)
        .map_err(|e| rejected(e.status(), e.body_text()))
}
