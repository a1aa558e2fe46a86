//! What both route sets (`/api` and Cloudflare's `/client/v4`) do to an instance beyond a
//! single engine call: a status change with its options, and reading an event's payload.
//! Each route set parses its own request shape into these and renders its own answer.

use axum::http::{HeaderMap, StatusCode};
use cairn::{Instance, StepKind};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// Where a restart begins (`from`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct From {
    pub(crate) name: String,
    pub(crate) count: Option<u32>,
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
}

/// `{"status": "pause" | "resume" | "terminate" | "restart", "rollback"?, "from"?}`: the
/// body of `PATCH …/status` in both APIs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusChange {
    pub(crate) status: String,
    #[serde(default, deserialize_with = "cairn::json::optional_object")]
    pub(crate) from: Option<From>,
    pub(crate) rollback: Option<bool>,
}

/// Applies a status change to `instance`, logged with its `origin` (see `audit`).
pub(crate) async fn change_status(
    instance: &Instance<Value>,
    request: StatusChange,
    origin: &str,
) -> Result<(), ApiError> {
    let action = match (request.status.as_str(), request.rollback, &request.from) {
        ("terminate", Some(true), _) => "terminate with rollback".to_owned(),
        ("restart", _, Some(from)) => format!("restart from {:?}", from.name),
        (status, _, _) => crate::error::clip(status),
    };
    let outcome = apply(instance, request).await;
    crate::audit::control(
        origin,
        &action,
        &format!("{}/{}", instance.workflow(), instance.id()),
        &outcome,
    );
    outcome
}

async fn apply(instance: &Instance<Value>, request: StatusChange) -> Result<(), ApiError> {
    if request.rollback.is_some() && request.status != "terminate" {
        return Err(ApiError::bad_request(
            "'rollback' is only valid when terminating.",
        ));
    }
    if request.from.is_some() && request.status != "restart" {
        return Err(ApiError::bad_request(
            "'from' is only valid when restarting.",
        ));
    }
    if request
        .from
        .as_ref()
        .is_some_and(|from| from.count == Some(0))
    {
        // Counts start at 1 (the first step of that name), as `…/step?count=` and wrangler's
        // `--from-step-count` do: 0 is a mistake, not the first.
        return Err(ApiError::bad_request(
            "'from.count' counts from 1: the first step of that name is 1.",
        ));
    }
    match request.status.as_str() {
        "pause" => instance.pause().await?,
        "resume" => instance.resume().await?,
        "terminate" if request.rollback == Some(true) => instance.terminate_with_rollback().await?,
        "terminate" => instance.terminate().await?,
        "restart" => match request.from {
            None => instance.restart().await?,
            Some(from) => {
                let kind = match from.kind.as_deref() {
                    None => StepKind::Run,
                    Some(name) => StepKind::parse(name).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "unknown step type {:?}: expected {}",
                            crate::error::clip(name),
                            StepKind::NAMES
                        ))
                    })?,
                };
                instance
                    .restart_from(kind, &from.name, from.count.unwrap_or(1))
                    .await?;
            }
        },
        other => {
            return Err(ApiError::bad_request(format!(
                "unknown status {:?}: expected pause, resume, terminate or restart",
                crate::error::clip(other)
            )));
        }
    }
    Ok(())
}

/// A per-instance retention on create (Cloudflare's `retention` of `create`, its REST
/// API's `instance_retention`): how long the finished instance is kept, by outcome.
/// Cloudflare's routes ignore keys they do not know (newer clients send more); the native
/// route refuses them ([`Retention::apply_strictly`]).
#[derive(Deserialize, Default)]
pub(crate) struct Retention {
    #[serde(alias = "successRetention")]
    success_retention: Option<Value>,
    #[serde(alias = "errorRetention")]
    error_retention: Option<Value>,
    #[serde(flatten)]
    unknown: serde_json::Map<String, Value>,
}

impl Retention {
    /// [`Retention::apply`], refusing a key it does not know.
    pub(crate) fn apply_strictly(
        &self,
        options: cairn::CreateOptions<Value>,
    ) -> Result<cairn::CreateOptions<Value>, ApiError> {
        if let Some(key) = self.unknown.keys().next() {
            return Err(ApiError::bad_request(format!(
                "retention has no key {key:?} (success_retention, error_retention)"
            )));
        }
        self.apply(options)
    }

    /// `options` with these retentions, each milliseconds or a duration (`"30 days"`).
    pub(crate) fn apply(
        &self,
        mut options: cairn::CreateOptions<Value>,
    ) -> Result<cairn::CreateOptions<Value>, ApiError> {
        if let Some(d) = retention(self.success_retention.as_ref(), "success_retention")? {
            options = options.success_retention(d);
        }
        if let Some(d) = retention(self.error_retention.as_ref(), "error_retention")? {
            options = options.error_retention(d);
        }
        Ok(options)
    }
}

/// A retention: milliseconds or a duration string such as `"30 days"`.
fn retention(value: Option<&Value>, what: &str) -> Result<Option<std::time::Duration>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|ms| Some(std::time::Duration::from_millis(ms)))
            .ok_or_else(|| ApiError::bad_request(format!("{what} must be a whole number of ms"))),
        Some(Value::String(s)) => cairn::parse_duration(s)
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("{what}: {e}"))),
        Some(_) => Err(ApiError::bad_request(format!(
            "{what} must be milliseconds or a duration such as \"30 days\""
        ))),
    }
}

/// A JSON body, or `None` when there is none. A body must be declared JSON: a browser
/// sends `text/plain` (and form encodings) cross-site without asking, so accepting those
/// would let any web page act on a server without a token.
pub(crate) fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Option<Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        // Media types are case-insensitive (RFC 9110 §8.3.1).
        .is_some_and(|v| v == "application/json" || v.ends_with("+json"));
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "request.unsupported_media_type",
            "a request body must be sent as JSON, with the header `Content-Type: application/json` (curl: -H 'content-type: application/json')",
        ));
    }
    serde_json::from_slice(body)
        .map(Some)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

/// An event's payload from a request body: no body is `null` (see [`json_body`]).
pub(crate) fn event_payload(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    json_body(headers, body).map(Option::unwrap_or_default)
}

/// A request object of type `T` from a JSON value: an array is refused (serde would read
/// it positionally, bypassing field names), as `cairn::json::Object` does for `/api`.
pub(crate) fn object<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A workflow's instance counts by status name, as both APIs describe a workflow.
pub(crate) async fn counts(
    workflow: &cairn::UntypedWorkflow,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut counts = serde_json::Map::new();
    for status in cairn::InstanceStatus::ALL {
        counts.insert(
            status.as_str().into(),
            Value::from(workflow.count(status).await?),
        );
    }
    Ok(counts)
}
