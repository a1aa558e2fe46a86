//! The routes and their handlers.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, patch, post};
use axum::{Extension, Json, Router};
use cairn::json::Object;
use cairn::{CreateOptions, Engine, InstanceStatus, UntypedWorkflow};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, body, rejected};

type ApiResult<T> = Result<T, ApiError>;

pub(crate) fn routes() -> Router<Engine> {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({ "ok": true })) }))
        .route("/api", get(index))
        .route("/api/workflows", get(list_workflows))
        .route(
            "/api/openapi.json",
            get(|| async { Json(crate::openapi::document()) }),
        )
        .route("/api/workflows/{name}", get(describe_workflow))
        .route("/api/workflows/{name}/versions", get(workflow_versions))
        .route("/api/instances", get(list_all_instances))
        .route("/api/instances/bulk", post(bulk))
        // An instance may be named `batch` (ids allow it): this route reads and deletes it.
        .route(
            "/api/workflows/{name}/instances/batch",
            post(create_batch)
                .get(|engine, Path(name): Path<String>| {
                    instance_details(engine, Path((name, "batch".to_owned())))
                })
                .delete(|engine, Path(name): Path<String>, headers| {
                    delete_instance(engine, Path((name, "batch".to_owned())), headers)
                }),
        )
        .route(
            "/api/workflows/{name}/instances/batch/delete",
            post(delete_batch),
        )
        .route("/api/workflows/{name}/instances/{id}/stream", get(stream))
        .route(
            "/api/workflows/{name}/instances/{id}/wait",
            get(wait_instance),
        )
        .route("/api/workflows/{name}/stream", get(workflow_stream))
        .route(
            "/api/workflows/{name}/instances",
            post(create_instance).get(list_instances),
        )
        .route(
            "/api/workflows/{name}/instances/{id}",
            get(instance_details).delete(delete_instance),
        )
        .route(
            "/api/workflows/{name}/instances/{id}/status",
            patch(change_status),
        )
        .route(
            "/api/workflows/{name}/instances/{id}/step",
            get(step_output),
        )
        .route(
            "/api/workflows/{name}/instances/{id}/events/{event_type}",
            post(send_event),
        )
        .merge(crate::schedules::routes())
        .merge(crate::workers::routes())
}

fn workflow(engine: &Engine, name: &str) -> ApiResult<UntypedWorkflow> {
    Ok(engine.workflow_by_name(name)?)
}

/// What the banner's URL answers: the version and where to go next.
async fn index() -> Json<Value> {
    Json(json!({
        "name": "cairn",
        "version": env!("CARGO_PKG_VERSION"),
        "links": {
            "openapi": "/api/openapi.json",
            "workflows": "/api/workflows",
            "health": "/healthz",
        },
    }))
}

async fn list_workflows(State(engine): State<Engine>) -> Json<Value> {
    let names: Vec<Value> = engine
        .workflow_names()
        .iter()
        .map(|n| json!({ "name": n.as_str() }))
        .collect();
    Json(json!({ "workflows": names }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// `id` as Cloudflare's binding calls it; both at once are refused.
    #[serde(alias = "id")]
    instance_id: Option<String>,
    params: Option<Value>,
    /// The concurrency key it runs under (the workflow must have a limit).
    concurrency_key: Option<String>,
    /// Its priority among the instances waiting for a slot of the key.
    priority: Option<i32>,
    /// How long it is kept once finished, by outcome (`success_retention`,
    /// `error_retention`; Cloudflare's binding spells them `successRetention`, …).
    retention: Option<crate::actions::Retention>,
}

impl CreateBody {
    fn into_options(self) -> ApiResult<CreateOptions<Value>> {
        let mut options = CreateOptions::new(self.params.unwrap_or_else(|| json!({})));
        options.id = self.instance_id;
        options.concurrency_key = self.concurrency_key;
        options.priority = self.priority.unwrap_or(0);
        match &self.retention {
            Some(retention) => retention.apply_strictly(options),
            None => Ok(options),
        }
    }
}

/// `?wait=30s`: how long a create (or `GET …/wait?timeout=`) waits for the instance to
/// finish. Unknown keys are ignored, as on every query.
#[derive(Deserialize)]
struct WaitQuery {
    wait: Option<String>,
    timeout: Option<String>,
}

/// The longest one request waits for an instance to finish; a client that wants to wait
/// longer asks again (`cairn workflows trigger --wait` does).
pub(crate) const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A wait from a query value: a duration (`30s`, `2 minutes`, milliseconds), at most
/// [`MAX_WAIT`].
fn wait_for(value: Option<&str>) -> ApiResult<Option<std::time::Duration>> {
    let Some(text) = value.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    // A bare number would be milliseconds in Cloudflare's grammar: `wait=30` meaning 30 ms
    // surprises everyone, so a unit is required.
    if text != "0" && text.trim().parse::<f64>().is_ok() {
        return Err(ApiError::bad_request(format!(
            "the wait needs a unit: {text}s, {text}ms, …"
        )));
    }
    // `30s`, `2m`, `500ms` (humantime), or Cloudflare's `30 seconds`.
    let wait = humantime::parse_duration(text)
        .ok()
        .or_else(|| cairn::parse_duration(text).ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "the wait must be a duration such as 30s, 2m or 500ms, not {:?}",
                crate::error::clip(text)
            ))
        })?;
    if wait > MAX_WAIT {
        return Err(ApiError::bad_request(format!(
            "the wait is at most {} s per request; ask again to wait longer",
            MAX_WAIT.as_secs()
        )));
    }
    Ok(Some(wait))
}

/// Waits up to `wait` (wall clock) for `instance` to finish, or until the server begins
/// to shut down, and answers its status then: `{id, status, output, error, rollback?}`.
async fn settle(
    instance: &cairn::Instance<Value>,
    wait: std::time::Duration,
    closing: Option<Extension<crate::serve::Closing>>,
) -> ApiResult<Value> {
    let closed = async {
        match closing {
            Some(Extension(mut c)) => {
                let _ = c.0.wait_for(|closing| *closing).await;
            }
            None => std::future::pending().await,
        }
    };
    // The output as stored: bytes as `{"$bytes": …}`, as clients send them.
    let ended = tokio::select! {
        status = instance.wait_stored() => Some(status?),
        () = tokio::time::sleep(wait) => None,
        () = closed => None,
    };
    let status = match ended {
        Some(status) => status,
        None => instance.stored_status().await?,
    };
    let mut answer = json!({
        "id": instance.id().as_str(),
        "status": status.status,
        "output": status.output,
        "error": status.error,
    });
    if let (Some(map), Some(rollback)) = (answer.as_object_mut(), status.rollback) {
        map.insert("rollback".into(), json!(rollback));
    }
    Ok(answer)
}

/// `POST …/instances[?wait=30s]`: with a wait, the answer comes when the instance has
/// finished (or the wait is over), with its output: create and wait in one round trip.
async fn create_instance(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    query: Result<Query<WaitQuery>, QueryRejection>,
    (slots, closing, peer): crate::stream::StreamExtensions,
    payload: Result<Json<Object<CreateBody>>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let Query(query) = query.map_err(|e| rejected(e.status(), e.body_text()))?;
    let wait = wait_for(query.wait.as_deref())?;
    // Refused before anything is created.
    let _slot = match wait {
        Some(_) => crate::stream::wait_slot(slots, peer)?,
        None => None,
    };
    let Object(request) = body(payload)?;
    let workflow = workflow(&engine, &name)?;
    let instance = workflow.create(request.into_options()?).await?;
    // Created: the answer is 201 with the id whatever happens next, so a client never
    // creates it again for an error that came after.
    let answer = match wait {
        Some(wait) => settle(&instance, wait, closing).await,
        None => instance
            .stored_status()
            .await
            .map(|s| json!({ "id": instance.id().as_str(), "status": s.status }))
            .map_err(ApiError::from),
    };
    let answer = answer.unwrap_or_else(|e| {
        json!({
            "id": instance.id().as_str(),
            "status": "unknown",
            "waitError": { "code": e.code, "message": e.message },
        })
    });
    Ok((StatusCode::CREATED, Json(answer)))
}

/// `GET …/instances/{id}/wait?timeout=30s` (default 30 s, at most 60 s): a long poll that
/// answers when the instance has finished, or at the timeout, with its status and output.
async fn wait_instance(
    State(engine): State<Engine>,
    Path((name, id)): Path<(String, String)>,
    query: Result<Query<WaitQuery>, QueryRejection>,
    (slots, closing, peer): crate::stream::StreamExtensions,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| rejected(e.status(), e.body_text()))?;
    let wait = wait_for(query.timeout.as_deref())?.unwrap_or(std::time::Duration::from_secs(30));
    let _slot = crate::stream::wait_slot(slots, peer)?;
    let instance = workflow(&engine, &name)?.get(&id).await?;
    Ok(Json(settle(&instance, wait, closing).await?))
}

/// The largest page of a list.
const MAX_LIMIT: usize = 1_000;

/// Unknown query keys are ignored (cache-busters such as `?_=1` are common); bodies, which
/// a caller composes on purpose, refuse them.
#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_instances(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| rejected(e.status(), e.body_text()))?;
    let workflow = workflow(&engine, &name)?;
    let status = match &query.status {
        Some(s) => Some(s.parse::<InstanceStatus>().map_err(ApiError::bad_request)?),
        None => None,
    };
    let limit = match query.limit {
        None => 50,
        Some(n @ 1..=MAX_LIMIT) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_LIMIT}, not {n}"
            )));
        }
    };
    let mut options = cairn::ListOptions::default().limit(limit);
    options.statuses = status.into_iter().collect();
    options.cursor = query.cursor.clone();
    let page = workflow.list(&options).await?;
    Ok(Json(
        json!({ "instances": page.instances, "cursor": page.cursor }),
    ))
}

/// `GET /api/instances`: the filter of the dashboard's list as query parameters.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AllQuery {
    workflow: Option<String>,
    /// Comma-separated statuses.
    status: Option<String>,
    created_from: Option<String>,
    created_before: Option<String>,
    id_prefix: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// A time in a query: RFC 3339 (UTC, `Z`) or epoch milliseconds.
fn query_time(name: &str, text: Option<&str>) -> ApiResult<Option<cairn::Timestamp>> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(Some(cairn::Timestamp::from_millis(ms)));
    }
    humantime::parse_rfc3339_weak(text)
        .map(|t| Some(cairn::Timestamp::from_system_time(t)))
        .map_err(|e| {
            ApiError::bad_request(format!(
                "{name} must be an RFC 3339 time such as 2026-01-31T12:00:00Z: {e}"
            ))
        })
}

/// The statuses of a comma-separated list.
pub(crate) fn parse_statuses(list: Option<&str>) -> ApiResult<Vec<InstanceStatus>> {
    list.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<InstanceStatus>().map_err(ApiError::bad_request))
        .collect()
}

async fn list_all_instances(
    State(engine): State<Engine>,
    query: Result<Query<AllQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(query) = query.map_err(|e| rejected(e.status(), e.body_text()))?;
    let filter = crate::bulk::Filter {
        workflow: query.workflow.filter(|w| !w.is_empty()),
        status: parse_statuses(query.status.as_deref())?,
        created_from: query_time("createdFrom", query.created_from.as_deref())?,
        created_before: query_time("createdBefore", query.created_before.as_deref())?,
        id_prefix: query.id_prefix,
    };
    let limit = match query.limit {
        None => 50,
        Some(n @ 1..=MAX_LIMIT) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_LIMIT}, not {n}"
            )));
        }
    };
    let page = engine
        .list_instances(
            filter.workflow.as_deref(),
            &filter.options(query.cursor, limit),
        )
        .await?;
    let instances: Vec<Value> = page
        .instances
        .iter()
        .map(|i| {
            let mut row = serde_json::to_value(i).unwrap_or_default();
            if let Some(map) = row.as_object_mut() {
                map.insert("workflow".into(), json!(i.workflow));
            }
            row
        })
        .collect();
    Ok(Json(
        json!({ "instances": instances, "cursor": page.cursor }),
    ))
}

async fn bulk(
    State(engine): State<Engine>,
    headers: HeaderMap,
    payload: Result<Json<Object<crate::bulk::Request>>, JsonRejection>,
) -> ApiResult<Json<Value>> {
    let Object(request) = body(payload)?;
    if request.action == crate::bulk::Action::Delete {
        crate::auth::require(crate::auth::Scope::Admin)?;
    }
    let origin = crate::audit::origin(crate::audit::RouteSet::Api, &headers);
    Ok(Json(crate::bulk::handle(&engine, request, &origin).await?))
}

async fn instance_details(
    State(engine): State<Engine>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let details = instance.details().await?;
    let status = instance.stored_status().await?;
    let mut value = serde_json::to_value(&details)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    if let (Some(map), Some(rollback)) = (value.as_object_mut(), status.rollback) {
        map.insert("rollback".into(), json!(rollback));
    }
    link_full_outputs(&mut value, &name, &id);
    Ok(Json(value))
}

/// `?name=&count=&type=&attempt=`: which step's output `GET …/step` serves.
#[derive(Deserialize)]
struct StepQuery {
    name: Option<String>,
    count: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    attempt: Option<String>,
}

/// A positive number from a query value.
fn positive(value: Option<&str>, what: &str) -> ApiResult<Option<u32>> {
    value
        .map(|v| {
            v.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{what} must be a whole number from 1, not {:?}",
                    crate::error::clip(v)
                ))
            })
        })
        .transpose()
}

/// `GET …/instances/{id}/step?name=&count=&type=&attempt=`: one step's whole output (the
/// details view cuts outputs over 4 KiB), as the JSON it is stored as (byte sequences in
/// it as `{"$bytes":"<base64>"}`); the bytes themselves, as `application/octet-stream`, for
/// a stream step or an output that is one byte sequence; `"[REDACTED]"` for a sensitive
/// step.
async fn step_output(
    State(engine): State<Engine>,
    Path((name, id)): Path<(String, String)>,
    query: Result<Query<StepQuery>, QueryRejection>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let step = q
        .name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("which step: ?name=<step name>[&count=N]"))?;
    let kind = match q.kind.as_deref() {
        None | Some("") => cairn::StepKind::Run,
        Some(t) => cairn::StepKind::parse(t).ok_or_else(|| {
            ApiError::bad_request(format!(
                "type must be {}, not {:?}",
                cairn::StepKind::NAMES,
                crate::error::clip(t)
            ))
        })?,
    };
    let mut selector = cairn::StepSelector::new(step)
        .count(positive(q.count.as_deref(), "count")?.unwrap_or(1))
        .kind(kind);
    if let Some(attempt) = positive(q.attempt.as_deref(), "attempt")? {
        selector = selector.attempt(attempt);
    }
    let output = workflow(&engine, &name)?
        .get(&id)
        .await?
        .step_output(&selector)
        .await?;
    use axum::http::header::CONTENT_TYPE;
    Ok(match output {
        cairn::StepOutput::Stream(stream) => stream_response(stream),
        cairn::StepOutput::Bytes(bytes) => bytes_response(bytes),
        other => (
            [(CONTENT_TYPE, "application/json")],
            other.to_json().unwrap_or_default(),
        )
            .into_response(),
    })
}

/// A stream step's bytes as `application/octet-stream` with their length, sent chunk by
/// chunk from the store, never whole in memory.
pub(crate) fn stream_response(stream: cairn::StepStream) -> axum::response::Response {
    use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
    use axum::response::IntoResponse;
    let length = stream.len().to_string();
    let body = axum::body::Body::from_stream(futures::StreamExt::map(stream, |chunk| {
        chunk.map_err(|e| std::io::Error::other(e.to_string()))
    }));
    (
        [
            (CONTENT_TYPE, "application/octet-stream".to_owned()),
            (CONTENT_LENGTH, length),
        ],
        body,
    )
        .into_response()
}

/// A step's output that is one byte sequence, as `application/octet-stream`.
pub(crate) fn bytes_response(bytes: Vec<u8>) -> axum::response::Response {
    use axum::http::header::CONTENT_TYPE;
    use axum::response::IntoResponse;
    ([(CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
}

/// Where `GET …/step` serves a step's whole output.
pub(crate) fn step_output_url(
    workflow: &str,
    id: &str,
    step: &str,
    count: u32,
    kind: &str,
) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("name", step)
        .append_pair("count", &count.to_string())
        .append_pair("type", kind)
        .finish();
    let segment = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    format!(
        "/api/workflows/{}/instances/{}/step?{query}",
        segment(workflow),
        segment(id)
    )
}

/// A step entry of the details view whose output is cut short gets the URL of the whole
/// output as `outputUrl`.
fn link_full_outputs(value: &mut Value, name: &str, id: &str) {
    let Some(steps) = value.get_mut("steps").and_then(Value::as_array_mut) else {
        return;
    };
    for step in steps {
        if step.get("outputBytes").is_none() {
            continue;
        }
        let count = step["count"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1);
        step["outputUrl"] = json!(step_output_url(
            name,
            id,
            step["name"].as_str().unwrap_or_default(),
            count,
            step["type"].as_str().unwrap_or("step"),
        ));
    }
}

async fn delete_instance(
    State(engine): State<Engine>,
    Path((name, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let deleted = workflow(&engine, &name)?.get(&id).await?.delete().await;
    crate::audit::request(
        crate::audit::RouteSet::Api,
        &headers,
        "delete",
        &format!("{name}/{id}"),
        &deleted,
    );
    deleted?;
    Ok(Json(json!({})))
}

async fn change_status(
    State(engine): State<Engine>,
    Path((name, id)): Path<(String, String)>,
    headers: HeaderMap,
    payload: Result<Json<Object<crate::actions::StatusChange>>, JsonRejection>,
) -> ApiResult<Json<Value>> {
    let Object(request) = body(payload)?;
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let origin = crate::audit::origin(crate::audit::RouteSet::Api, &headers);
    crate::actions::change_status(&instance, request, &origin).await?;
    Ok(Json(
        json!({ "status": instance.stored_status().await?.status }),
    ))
}

/// `POST …/events/{type}`. With an `Idempotency-Key` header a retried send is recognised
/// and acknowledged once (`{"duplicate": true}`); without one, a retry delivers again.
async fn send_event(
    State(engine): State<Engine>,
    Path((name, id, event_type)): Path<(String, String, String)>,
    headers: axum::http::HeaderMap,
    payload: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let payload = crate::actions::event_payload(&headers, &payload)?;
    // Bad input is reported before any lookup.
    cairn::EventType::new(event_type.as_str()).map_err(cairn::Error::from)?;
    let key = match headers.get("idempotency-key") {
        Some(v) => Some(v.to_str().map_err(|_| {
            cairn::Error::InvalidIdempotencyKey(String::from_utf8_lossy(v.as_bytes()).into())
        })?),
        None => None,
    };
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let duplicate = match key {
        Some(key) => {
            instance
                .send_event_with_key(&event_type, &payload, key)
                .await?
                == cairn::Delivery::Duplicate
        }
        None => {
            instance.send_event(&event_type, &payload).await?;
            false
        }
    };
    Ok(Json(json!({ "duplicate": duplicate })))
}

async fn describe_workflow(
    State(engine): State<Engine>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let workflow = workflow(&engine, &name)?;
    let counts = crate::actions::counts(&workflow).await?;
    let mut described = json!({ "name": name, "instances": counts });
    // A workflow workers run: its versions, and which of them has workers now.
    if let Ok(versions) = engine.workflow_versions(&name).await {
        described["versions"] = json!(versions);
    }
    Ok(Json(described))
}

/// The versions of a workflow workers run, oldest first, with their unfinished instances
/// and connected workers: an old version's workers can go once it has none unfinished.
async fn workflow_versions(
    State(engine): State<Engine>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let versions = engine.workflow_versions(&name).await?;
    Ok(Json(json!({ "workflow": name, "versions": versions })))
}

async fn create_batch(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    payload: Result<Json<Vec<Object<CreateBody>>>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let entries = body(payload)?;
    let workflow = workflow(&engine, &name)?;
    let batch = entries
        .into_iter()
        .map(|Object(e)| e.into_options())
        .collect::<ApiResult<Vec<_>>>()?;
    let result = workflow.create_batch_detailed(batch).await?;
    let created: Vec<&str> = result.created.iter().map(|i| i.id().as_str()).collect();
    Ok((
        StatusCode::CREATED,
        Json(json!({ "created": created, "errors": result.errors })),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteBatchBody {
    instances: Vec<String>,
}

async fn delete_batch(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    headers: HeaderMap,
    payload: Result<Json<Object<DeleteBatchBody>>, JsonRejection>,
) -> ApiResult<Json<Value>> {
    let Object(request) = body(payload)?;
    let ids: Vec<&str> = request.instances.iter().map(String::as_str).collect();
    let result = workflow(&engine, &name)?.delete_batch(&ids).await?;
    crate::audit::started(
        crate::audit::RouteSet::Api,
        &headers,
        "delete batch",
        &format!("{name}: {}", result.deleted.join(", ")),
    );
    Ok(Json(json!(result)))
}

#[derive(Deserialize)]
struct StreamQuery {
    cursor: Option<u64>,
}

async fn workflow_stream(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    streams: crate::stream::StreamExtensions,
    headers: axum::http::HeaderMap,
    query: Result<Query<StreamQuery>, QueryRejection>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse as _;
    let cursor = cursor(&headers, query)?;
    let workflow = workflow(&engine, &name)?;
    let lease = crate::stream::lease(streams)?;
    let commits = workflow.commits();
    Ok(crate::stream::follow_workflow(workflow, cursor, commits, lease).into_response())
}

/// The stream cursor: `Last-Event-ID` (a reconnecting client), else `?cursor=`, else 0.
fn cursor(
    headers: &axum::http::HeaderMap,
    query: Result<Query<StreamQuery>, QueryRejection>,
) -> ApiResult<u64> {
    let Query(query) = query.map_err(|e| rejected(e.status(), e.body_text()))?;
    let from_header = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID must be an event id (a number)")
                })?,
        ),
        None => None,
    };
    Ok(from_header.or(query.cursor).unwrap_or(0))
}

async fn stream(
    State(engine): State<Engine>,
    Path((name, id)): Path<(String, String)>,
    streams: crate::stream::StreamExtensions,
    headers: axum::http::HeaderMap,
    query: Result<Query<StreamQuery>, QueryRejection>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse as _;
    let cursor = cursor(&headers, query)?;
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let lease = crate::stream::lease(streams)?;
    let commits = instance.commits().await?;
    Ok(crate::stream::follow(instance, cursor, commits, lease).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Map;

    /// Random JSON from the bodies' own keys and value kinds, arrays and junk included.
    fn body_like() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            prop::sample::select(vec![-1i64, 0, 1, 7, 1 << 40]).prop_map(Value::from),
            Just(json!(1.5)),
            prop::sample::select(vec!["pause", "restart", "a", "do", ""]).prop_map(Value::from),
        ];
        let key = prop::sample::select(vec![
            "instance_id",
            "params",
            "status",
            "from",
            "rollback",
            "name",
            "count",
            "type",
            "instances",
            "id",
        ]);
        leaf.prop_recursive(3, 24, 5, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(key.clone(), inner, 0..5).prop_map(|m| json!(m)),
            ]
        })
    }

    fn fields<'a>(v: &'a Value, allowed: &[&str]) -> Option<&'a Map<String, Value>> {
        let m = v.as_object()?;
        m.keys().all(|k| allowed.contains(&k.as_str())).then_some(m)
    }

    fn optional(m: &Map<String, Value>, key: &str, ok: impl Fn(&Value) -> bool) -> bool {
        m.get(key).is_none_or(|v| v.is_null() || ok(v))
    }

    /// The documented request bodies, written down without serde.
    fn create_ok(v: &Value) -> bool {
        fields(
            v,
            &["instance_id", "id", "params", "concurrency_key", "priority"],
        )
        .is_some_and(|m| {
            !(m.contains_key("instance_id") && m.contains_key("id"))
                && optional(m, "instance_id", Value::is_string)
                && optional(m, "id", Value::is_string)
                && optional(m, "concurrency_key", Value::is_string)
                && optional(m, "priority", |p| {
                    p.as_i64().is_some_and(|p| i32::try_from(p).is_ok())
                })
        })
    }

    fn status_ok(v: &Value) -> bool {
        let from_ok = |f: &Value| {
            fields(f, &["name", "count", "type"]).is_some_and(|f| {
                f.get("name").is_some_and(Value::is_string)
                    && optional(f, "count", |c| {
                        c.as_u64().is_some_and(|c| c <= u64::from(u32::MAX))
                    })
                    && optional(f, "type", Value::is_string)
            })
        };
        fields(v, &["status", "from", "rollback"]).is_some_and(|m| {
            m.get("status").is_some_and(Value::is_string)
                && optional(m, "from", from_ok)
                && optional(m, "rollback", Value::is_boolean)
        })
    }

    fn delete_ok(v: &Value) -> bool {
        fields(v, &["instances"]).is_some_and(|m| {
            m.get("instances")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().all(Value::is_string))
        })
    }

    fn parses<T: serde::de::DeserializeOwned>(v: &Value) -> bool {
        serde_json::from_str::<Object<T>>(&v.to_string()).is_ok()
    }

    proptest! {
        #[test]
        fn body_parsers_match_the_documented_bodies(v in body_like()) {
            prop_assert_eq!(parses::<CreateBody>(&v), create_ok(&v), "create {}", v);
            prop_assert_eq!(parses::<crate::actions::StatusChange>(&v), status_ok(&v), "status {}", v);
            prop_assert_eq!(parses::<DeleteBatchBody>(&v), delete_ok(&v), "delete {}", v);
            let batch = serde_json::from_str::<Vec<Object<CreateBody>>>(&v.to_string()).is_ok();
            let batch_ok = v.as_array().is_some_and(|a| a.iter().all(create_ok));
            prop_assert_eq!(batch, batch_ok, "batch {}", v);
        }
    }
}
