//! Cloudflare's Workflows REST API, under `/client/v4/accounts/{account_id}/workflows`:
//! what `wrangler workflows …` and Cloudflare's SDKs call, so they drive Cairn unchanged
//! (`CLOUDFLARE_API_BASE_URL=http://HOST:PORT/client/v4`). The handlers call the same
//! engine API as `/api`'s and share its status changes and event reading
//! (`crate::actions`); `shapes.rs` renders Cairn's values in Cloudflare's field names.
//!
//! Every answer is Cloudflare's envelope, `{"success", "errors": [{"code", "message"}],
//! "messages", "result", "result_info"?}`: [`envelope`] rewrites the errors of this path
//! (the handlers', the token check's, axum's own) into it, with Cloudflare's numeric codes.

mod shapes;

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post, put};
use axum::{Extension, Json, Router};
use cairn::{CreateOptions, Engine, InstanceStatus, Timestamp, UntypedWorkflow};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;

type CfResult<T> = Result<T, ApiError>;

/// Where Cloudflare's routes live.
pub(crate) const PREFIX: &str = "/client/v4";

/// How the Cloudflare routes answer: the account they serve and when this server started
/// (a workflow's and its version's `created_on`: the code registered now is the version).
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// The only account id accepted in the path; any, when `None`.
    pub(crate) account_id: Option<String>,
    /// Without an account id configured, the destructive routes (a workflow's delete, the
    /// terminate of all its instances) answer anyway: the operator opted in.
    pub(crate) any_account_destroys: bool,
    pub(crate) started: Timestamp,
    /// The background jobs running (terminate-all, workflow delete), by job and workflow:
    /// one of each per workflow at a time.
    pub(crate) jobs: Jobs,
}

/// The set of background jobs running; a [`Job`] leaves it when dropped, also when its
/// task panics or is dropped with the runtime.
#[derive(Clone, Debug, Default)]
pub(crate) struct Jobs(std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

pub(crate) struct Job {
    jobs: Jobs,
    key: String,
}

impl Jobs {
    /// Whether job `key` runs now.
    pub(crate) fn running(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(key)
    }

    /// Starts job `key`; `None` when it runs already.
    fn start(&self, key: String) -> Option<Job> {
        let mut running = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        running.insert(key.clone()).then(|| Job {
            jobs: self.clone(),
            key,
        })
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.jobs
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// Most rows a listing may skip to reach a page number: past it, follow the cursor.
const MAX_SKIP: usize = 10_000;
/// Most rows one listing request looks at (a date filter far from the newest rows): past
/// it, the page ends early with a cursor to continue.
const MAX_SCAN: usize = 100_000;

/// The largest page (Cloudflare's limit).
const MAX_PER_PAGE: usize = 100;
/// A page's size when the caller does not say.
const DEFAULT_PER_PAGE: usize = 50;

pub(crate) fn routes() -> Router<Engine> {
    let base = format!("{PREFIX}/accounts/{{account}}/workflows");
    Router::new()
        .route(&base, get(list_workflows))
        .route(
            &format!("{base}/{{name}}"),
            get(get_workflow).put(put_workflow).delete(delete_workflow),
        )
        .route(&format!("{base}/{{name}}/versions"), get(list_versions))
        .route(
            &format!("{base}/{{name}}/versions/{{version}}"),
            get(get_version),
        )
        .route(
            &format!("{base}/{{name}}/versions/{{version}}/graph"),
            get(version_graph),
        )
        .route(
            &format!("{base}/{{name}}/instances"),
            get(list_instances).post(create_instance),
        )
        // wrangler asks for the latest instance with a trailing slash.
        .route(&format!("{base}/{{name}}/instances/"), get(list_instances))
        // Instances may be named `batch` or `terminate` (ids allow it): these routes read
        // them too.
        .route(
            &format!("{base}/{{name}}/instances/batch"),
            post(bulk_create).get(|engine, Path((account, name)), q| {
                get_instance(engine, Path((account, name, "batch".to_owned())), q)
            }),
        )
        .route(
            &format!("{base}/{{name}}/instances/batch/delete"),
            post(bulk_delete),
        )
        .route(
            &format!("{base}/{{name}}/instances/terminate"),
            put(terminate_all).get(|engine, Path((account, name)), q| {
                get_instance(engine, Path((account, name, "terminate".to_owned())), q)
            }),
        )
        .route(
            &format!("{base}/{{name}}/instances/{{id}}"),
            get(get_instance),
        )
        .route(
            &format!("{base}/{{name}}/instances/{{id}}/step"),
            get(step_output),
        )
        .route(
            &format!("{base}/{{name}}/instances/{{id}}/status"),
            patch(change_status),
        )
        .route(
            &format!("{base}/{{name}}/instances/{{id}}/events/{{event_type}}"),
            post(send_event),
        )
}

/// A successful answer in Cloudflare's envelope.
fn ok(result: Value) -> Response {
    Json(json!({ "success": true, "errors": [], "messages": [], "result": result })).into_response()
}

/// A successful list answer with its `result_info`.
fn ok_list(result: Vec<Value>, info: Value) -> Response {
    Json(json!({
        "success": true, "errors": [], "messages": [], "result": result, "result_info": info,
    }))
    .into_response()
}

/// Cloudflare's numeric code for one of Cairn's error codes. Where Cloudflare's own code is
/// known it is used: 10200 workflow not found, 10400 instance not found, 10401 an instance
/// that cannot be terminated, 10405 an id that exists, 10001 internal; 7000/7001 its "no
/// route" and "method not allowed"; 7003 an unknown account. Other refusals of an
/// instance's state or a lookup get a code of their own in the same family (Cairn's
/// choice, listed in `docs/operating.md`), so a client can tell them apart by number; what
/// is wrong with the request itself is 10002 ("workflows.api.error.body"). The message
/// always starts with Cairn's own stable code. Never 10000 or 9106: on those wrangler runs
/// its login check against `/user` endpoints Cairn does not serve.
pub(crate) fn numeric_code(code: &str, status: StatusCode) -> u32 {
    match code {
        "workflow.not_found" => 10200,
        "version.not_found" => 10201,
        "instance.not_found" => 10400,
        "instance.cannot_terminate" => 10401,
        "instance.cannot_pause" => 10402,
        "instance.cannot_resume" => 10403,
        "instance.already_exists" => 10405,
        "instance.cannot_restart" => 10406,
        "instance.cannot_delete" => 10407,
        "instance.finished" => 10408,
        "step.not_found" => 10410,
        "payload.too_large" => 10413,
        "route.not_found" => 7000,
        "method.not_allowed" => 7001,
        "account.not_found" | "account.required" => 7003,
        "auth.unauthorized" | "auth.forbidden" => 9109,
        _ if status.is_server_error() => 10001,
        _ => 10002,
    }
}

/// Rewrites the error answer to a request for `path` into Cloudflare's envelope when the
/// path is under [`PREFIX`] (`{code, message}`, whoever made it); leaves every other answer
/// alone.
pub(crate) async fn envelope(path: &str, response: Response) -> Response {
    if !path.starts_with(PREFIX) {
        return response;
    }
    let status = response.status();
    if status.as_u16() < 400 {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let ours: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let code = ours["code"].as_str().unwrap_or("internal");
    let message = ours["message"].as_str().unwrap_or("error");
    let body = json!({
        "success": false,
        "errors": [{ "code": numeric_code(code, status), "message": format!("{code}: {message}") }],
        "messages": [],
        "result": null,
    });
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    // The Python SDK retries 409s (and 5xx) three times, POST included: a duplicate id
    // is not worth two more tries.
    if status == StatusCode::CONFLICT {
        parts.headers.insert(
            "x-should-retry",
            axum::http::HeaderValue::from_static("false"),
        );
    }
    (parts, Json(body)).into_response()
}

/// Refuses an account id other than the configured one (any is accepted without one).
pub(crate) async fn check_account(
    Extension(config): Extension<Config>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let (Some(expected), Some(given)) = (
        config.account_id.as_deref(),
        req.uri()
            .path()
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.strip_prefix("/accounts/"))
            .and_then(|rest| rest.split('/').next()),
    ) && given != expected
    {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "account.not_found",
            format!(
                "this server serves account {expected:?}, not {:?}: set CLOUDFLARE_ACCOUNT_ID to it",
                crate::error::clip(given)
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// The routes that act on every instance of a workflow (its delete, the terminate of all)
/// answer only where an account id is configured (`cairn serve --account-id`): a client
/// pointed at the wrong server by mistake, with any account id, must not wipe it. An
/// operator may opt out (`--cloudflare-any-account`).
fn destructive(config: &Config, what: &str) -> CfResult<()> {
    if config.account_id.is_some() || config.any_account_destroys {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "account.required",
        format!(
            "{what} needs this server's account id: start cairn serve with --account-id ID (and use that id), or allow any with --cloudflare-any-account"
        ),
    ))
}

/// The job key of a workflow's terminate-all.
pub(crate) fn terminate_job(name: &str) -> String {
    format!("terminate {name}")
}

fn workflow(engine: &Engine, name: &str) -> CfResult<UntypedWorkflow> {
    Ok(engine.workflow_by_name(name)?)
}

/// A positive whole number from a query value; the Python SDK sends `2.0` for 2.
fn whole(query: &HashMap<String, String>, key: &str) -> CfResult<Option<usize>> {
    let Some(text) = query.get(key).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    match text.parse::<f64>() {
        Ok(n) if n >= 1.0 && n.fract() == 0.0 && n <= 1e9 => Ok(Some(n as usize)),
        _ => Err(ApiError::bad_request(format!(
            "{key} must be a whole number of at least 1, not {:?}",
            crate::error::clip(text)
        ))),
    }
}

fn per_page(query: &HashMap<String, String>) -> CfResult<usize> {
    match whole(query, "per_page")? {
        None => Ok(DEFAULT_PER_PAGE),
        Some(n) if n <= MAX_PER_PAGE => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "per_page must be at most {MAX_PER_PAGE}, not {n}"
        ))),
    }
}

/// A time in a query: ISO 8601 in UTC (`Z`, `+00:00`, or no offset).
fn time(query: &HashMap<String, String>, key: &str) -> CfResult<Option<Timestamp>> {
    let Some(text) = query.get(key).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let utc = text
        .strip_suffix("+00:00")
        .map_or_else(|| text.clone(), |t| format!("{t}Z"));
    humantime::parse_rfc3339_weak(&utc)
        .map(|t| Some(Timestamp::from_system_time(t)))
        .map_err(|_| {
            ApiError::bad_request(format!(
                "{key} must be an ISO 8601 time in UTC, e.g. 2026-01-31T00:00:00Z, not {:?}",
                crate::error::clip(text)
            ))
        })
}

type Queried = Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

fn query(q: Queried) -> CfResult<HashMap<String, String>> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

async fn list_workflows(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    q: Queried,
) -> CfResult<Response> {
    let q = query(q)?;
    let page = whole(&q, "page")?.unwrap_or(1);
    let per_page = per_page(&q)?;
    let search = q.get("search").map(String::as_str).unwrap_or("");
    let known = engine.workflow_names();
    let names: Vec<&str> = known
        .iter()
        .map(|n| n.as_str())
        .filter(|n| n.contains(search))
        .collect();
    let mut result = Vec::new();
    for name in names.iter().skip((page - 1) * per_page).take(per_page) {
        result.push(shapes::workflow(&workflow(&engine, name)?, &config).await?);
    }
    let (total, count) = (names.len(), result.len());
    Ok(ok_list(
        result,
        json!({
            "page": page, "per_page": per_page, "count": count,
            "total_count": total, "total_pages": total.div_ceil(per_page),
        }),
    ))
}

async fn get_workflow(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name)): Path<(String, String)>,
) -> CfResult<Response> {
    Ok(ok(
        shapes::workflow(&workflow(&engine, &name)?, &config).await?
    ))
}

/// `PUT` (deploy): a Cairn workflow is code registered in the engine, so a deploy cannot
/// create or change one. For a registered workflow it answers what is deployed (so a
/// deploy script finds it in place); for another name it says where workflows come from.
async fn put_workflow(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name)): Path<(String, String)>,
) -> CfResult<Response> {
    let workflow = engine.workflow_by_name(&name).map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "workflow.not_found",
            format!(
                "no workflow named {:?} is registered: Cairn's workflows are Rust code registered with Engine::builder().register(..), or TypeScript run by a worker (docs/typescript.md), not deployed over the API",
                crate::error::clip(&name)
            ),
        )
    })?;
    let mut shape = shapes::workflow(&workflow, &config).await?;
    if let Some(map) = shape.as_object_mut() {
        let newest = engine.newest_version(workflow.name());
        map.insert(
            "version_id".into(),
            json!(shapes::version_id(&name, newest.as_deref())),
        );
        map.insert("is_deleted".into(), json!(0));
        map.insert("terminator_running".into(), json!(0));
    }
    Ok(ok(shape))
}

/// `DELETE`: deletes every instance of the workflow; its code stays registered, so new
/// instances can be created at once. It answers once they are all deleted (200), or, past
/// [`DESTROY_WAIT`], 202 while it goes on in the background (the workflow's `instances`
/// counts show the progress). A delete that finds ids it cannot delete stops there and
/// says so (the next `DELETE` tries again).
async fn delete_workflow(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> CfResult<Response> {
    destructive(&config, "deleting every instance of a workflow")?;
    let workflow = workflow(&engine, &name)?;
    crate::audit::started(
        crate::audit::RouteSet::Cloudflare,
        &headers,
        "delete every instance",
        &name,
    );
    let Some(job) = config.jobs.start(format!("delete {name}")) else {
        return Ok(accepted(
            json!({ "status": "already_running", "success": true }),
        ));
    };
    let mut deleting = tokio::spawn(async move {
        let _job = job;
        loop {
            let page = workflow
                .list(&cairn::ListOptions::default().limit(100))
                .await
                .map_err(|e| e.to_string())?;
            if page.instances.is_empty() {
                return Ok(());
            }
            let ids: Vec<&str> = page.instances.iter().map(|i| i.id.as_str()).collect();
            let done = workflow
                .delete_batch(&ids)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(first) = done.errors.first() {
                return Err(format!(
                    "{} instances could not be deleted ({}: {})",
                    done.errors.len(),
                    first.code,
                    first.message
                ));
            }
        }
    });
    match tokio::time::timeout(DESTROY_WAIT, &mut deleting).await {
        Ok(Ok(Ok(()))) => Ok(ok(json!({ "status": "ok", "success": true }))),
        Ok(Ok(Err(reason))) => {
            tracing::warn!(workflow = %name, reason, "deleting the workflow's instances stopped");
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "workflow.delete_incomplete",
                format!("deleting the instances of workflow {name:?} stopped: {reason}"),
            ))
        }
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the delete did not finish: {e}"),
        )),
        // Still going: it finishes on its own.
        Err(_) => Ok(accepted(json!({ "status": "running", "success": true }))),
    }
}

/// How long a destructive route works before it answers 202 and goes on in the background.
const DESTROY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A `202 Accepted` in Cloudflare's envelope: the job goes on.
fn accepted(result: Value) -> Response {
    let mut response = ok(result);
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

async fn list_versions(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name)): Path<(String, String)>,
    q: Queried,
) -> CfResult<Response> {
    let q = query(q)?;
    let workflow = workflow(&engine, &name)?;
    let page = whole(&q, "page")?.unwrap_or(1);
    let per_page = per_page(&q)?;
    let all = versions(&engine, &workflow, &config).await?;
    let total = all.len();
    let result: Vec<Value> = all
        .into_iter()
        .skip((page - 1).saturating_mul(per_page))
        .take(per_page)
        .collect();
    let count = result.len();
    Ok(ok_list(
        result,
        json!({
            "page": page, "per_page": per_page, "count": count,
            "total_count": total, "total_pages": total.div_ceil(per_page.max(1)),
        }),
    ))
}

/// Every version of a workflow, newest first: one for a workflow in Rust (the code running
/// now), each version its workers registered for one run by workers.
async fn versions(
    engine: &Engine,
    workflow: &cairn::UntypedWorkflow,
    config: &Config,
) -> CfResult<Vec<Value>> {
    let name = workflow.name().as_str();
    let registered = engine.workflow_versions(name).await?;
    if registered.is_empty() {
        return Ok(vec![shapes::version(workflow, config)]);
    }
    Ok(registered
        .iter()
        .rev()
        .map(|v| shapes::worker_version(name, v))
        .collect())
}

async fn get_version(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name, version)): Path<(String, String, String)>,
) -> CfResult<Response> {
    Ok(ok(find_version(&engine, &config, &name, &version).await?))
}

/// The version `version` (its Cloudflare id) of workflow `name`.
async fn find_version(
    engine: &Engine,
    config: &Config,
    name: &str,
    version: &str,
) -> CfResult<Value> {
    let workflow = workflow(engine, name)?;
    let all = versions(engine, &workflow, config).await?;
    let ids: Vec<&str> = all.iter().filter_map(|v| v["id"].as_str()).collect();
    match all.iter().find(|v| v["id"] == version) {
        Some(found) => Ok(found.clone()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "version.not_found",
            format!(
                "workflow {name:?} has no version {:?}; its versions: {}",
                crate::error::clip(version),
                ids.join(", ")
            ),
        )),
    }
}

/// `GET …/versions/{id}/graph`: Cloudflare parses a version's code into a step graph; Cairn
/// runs compiled Rust and workers' code it never reads, so the version is answered with
/// `graph: null` (the field is nullable in Cloudflare's API), not a 404 that a client
/// would take for a missing version.
async fn version_graph(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name, version)): Path<(String, String, String)>,
) -> CfResult<Response> {
    let found = find_version(&engine, &config, &name, &version).await?;
    Ok(ok(json!({
        "id": found["id"],
        "class_name": found["class_name"],
        "created_on": found["created_on"],
        "graph": null,
    })))
}

/// A create request: Cloudflare's fields. Unknown keys are ignored (newer clients send
/// more); `location_hint` is accepted and has no meaning on one database.
#[derive(Deserialize, Default)]
struct CreateBody {
    instance_id: Option<String>,
    params: Option<Value>,
    instance_retention: Option<crate::actions::Retention>,
    #[allow(dead_code)]
    location_hint: Option<String>,
}

impl CreateBody {
    fn options(self) -> CfResult<CreateOptions<Value>> {
        // The SDKs type `params` as JSON text; wrangler sends the value. Text that is a
        // JSON object or array is that value; any other text is a string param.
        let params = match self.params {
            None => json!({}),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
                Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
                _ => Value::String(text),
            },
            Some(v) => v,
        };
        let mut options = CreateOptions::new(params);
        options.id = self.instance_id;
        match &self.instance_retention {
            Some(retention) => retention.apply(options),
            None => Ok(options),
        }
    }
}

/// A request object, or `T::default()` when there is no body (every field is optional).
fn parse_body<T: serde::de::DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: &[u8],
) -> CfResult<T> {
    match crate::actions::json_body(headers, body)? {
        None => Ok(T::default()),
        Some(value) => crate::actions::object(value),
    }
}

async fn create_instance(
    State(engine): State<Engine>,
    Path((_, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> CfResult<Response> {
    let body: CreateBody = parse_body(&headers, &body)?;
    let workflow = workflow(&engine, &name)?;
    let instance = workflow.create(body.options()?).await?;
    let status = instance.stored_status().await?.status;
    let version = engine.newest_version(workflow.name());
    Ok(ok(shapes::created(
        &name,
        instance.id().as_str(),
        status,
        version.as_deref(),
    )))
}

async fn bulk_create(
    State(engine): State<Engine>,
    Path((_, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> CfResult<Response> {
    let Some(Value::Array(entries)) = crate::actions::json_body(&headers, &body)? else {
        return Err(ApiError::bad_request(
            "the body must be an array of instances",
        ));
    };
    let workflow = workflow(&engine, &name)?;
    let mut batch = Vec::with_capacity(entries.len());
    for entry in entries {
        let options = crate::actions::object::<CreateBody>(entry)?.options()?;
        // Bad input fails the whole request, before anything is created.
        if let Some(id) = &options.id {
            cairn::InstanceId::new(id.as_str()).map_err(cairn::Error::from)?;
        }
        batch.push(options);
    }
    let result = workflow.create_batch_detailed(batch).await?;
    let version = engine.newest_version(workflow.name());
    let created: Vec<Value> = result
        .created
        .iter()
        .map(|i| {
            shapes::created(
                &name,
                i.id().as_str(),
                InstanceStatus::Queued,
                version.as_deref(),
            )
        })
        .collect();
    // Cloudflare skips ids that exist; Cairn says which it skipped, as messages.
    let messages: Vec<Value> = result
        .errors
        .iter()
        .map(|e| {
            json!({
                "code": numeric_code(&e.code, StatusCode::CONFLICT),
                "message": format!("{}: {} (entry {})", e.code, e.message, e.index),
            })
        })
        .collect();
    Ok(
        Json(json!({ "success": true, "errors": [], "messages": messages, "result": created }))
            .into_response(),
    )
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DeleteBody {
    instances: Vec<String>,
}

async fn bulk_delete(
    State(engine): State<Engine>,
    Path((_, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> CfResult<Response> {
    let body: DeleteBody = parse_body(&headers, &body)?;
    let ids: Vec<&str> = body.instances.iter().map(String::as_str).collect();
    let result = workflow(&engine, &name)?.delete_batch(&ids).await?;
    crate::audit::started(
        crate::audit::RouteSet::Cloudflare,
        &headers,
        "delete batch",
        &format!("{name}: {}", result.deleted.join(", ")),
    );
    let deleted: Vec<Value> = result
        .deleted
        .iter()
        .map(|id| json!({ "id": id }))
        .collect();
    let errors: Vec<Value> = result
        .errors
        .iter()
        .map(|e| {
            json!({
                "id": e.id.clone().or_else(|| body.instances.get(e.index).cloned()),
                "code": numeric_code(&e.code, crate::error::status_of_code(&e.code)),
                "message": format!("{}: {}", e.code, e.message),
            })
        })
        .collect();
    Ok(ok(json!({ "deleted": deleted, "errors": errors })))
}

/// The body `PUT …/instances/terminate` may have: the status to terminate (as the query's
/// `status`), and the ids to terminate (only those); anything else is refused, not ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TerminateBody {
    status: Option<String>,
    #[serde(alias = "instance_ids", alias = "instanceIds")]
    ids: Option<Vec<String>>,
}

/// `PUT …/instances/terminate[?status=S]`: terminates every unfinished instance (or those
/// in status S, or the ids of the body) in the background and answers 202 at once, as
/// Cloudflare's job does; the workflow's `terminator_running` says whether it still runs,
/// and a second request meanwhile answers `already_running`. One walk over the listing,
/// newest first: an instance that changes status meanwhile is still met once.
async fn terminate_all(
    State(engine): State<Engine>,
    Extension(config): Extension<Config>,
    Path((_, name)): Path<(String, String)>,
    q: Queried,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> CfResult<Response> {
    destructive(&config, "terminating every instance of a workflow")?;
    let q = query(q)?;
    let body: TerminateBody = parse_body(&headers, &body)?;
    let mut only = status_filter(&q)?;
    if let Some(status) = body.status.as_deref() {
        let given = status
            .parse::<InstanceStatus>()
            .map_err(ApiError::bad_request)?;
        if only.is_some_and(|q| q != given) {
            return Err(ApiError::bad_request(
                "the body's status and the query's status differ",
            ));
        }
        only = Some(given);
    }
    if only.is_some_and(InstanceStatus::is_terminal) {
        return Err(ApiError::bad_request(
            "status must be an unfinished one: queued, running, paused, waitingForPause or waiting",
        ));
    }
    let workflow = workflow(&engine, &name)?;
    let Some(job) = config.jobs.start(terminate_job(&name)) else {
        return Ok(accepted(json!({ "status": "already_running" })));
    };
    crate::audit::started(
        crate::audit::RouteSet::Cloudflare,
        &headers,
        "terminate all",
        &format!(
            "{name} (status {:?}, ids {:?})",
            only,
            body.ids.as_ref().map(Vec::len)
        ),
    );
    tokio::spawn(async move {
        let _job = job;
        if let Some(ids) = body.ids {
            for id in ids {
                if let Ok(instance) = workflow.get(&id).await
                    && instance
                        .status()
                        .await
                        .is_ok_and(|s| only.is_none_or(|o| o == s.status))
                {
                    let _ = instance.terminate().await;
                }
            }
            return;
        }
        let mut cursor = None;
        loop {
            let mut options = cairn::ListOptions::default().limit(100);
            options.statuses = only.into_iter().collect();
            options.cursor = cursor.take();
            let page = match workflow.list(&options).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(workflow = %workflow.name(), error = %e, "terminating the workflow's instances failed");
                    return;
                }
            };
            for row in page.instances.iter().filter(|r| !r.status.is_terminal()) {
                if let Ok(instance) = workflow.get(row.id.as_str()).await {
                    // One that finished meanwhile cannot be terminated: fine.
                    let _ = instance.terminate().await;
                }
            }
            match page.cursor {
                Some(next) => cursor = Some(next),
                None => return,
            }
        }
    });
    Ok(accepted(json!({ "status": "ok" })))
}

/// The `status` filter of a query, if any.
fn status_filter(q: &HashMap<String, String>) -> CfResult<Option<InstanceStatus>> {
    match q.get("status").filter(|s| !s.is_empty()) {
        Some(s) => Ok(Some(
            s.parse::<InstanceStatus>().map_err(ApiError::bad_request)?,
        )),
        None => Ok(None),
    }
}

/// `GET …/instances`: newest first, or oldest first with `direction=asc`. wrangler follows
/// `result_info.cursor`; the Python SDK sends `page=2, 3, …` (with the cursor it started
/// from, if any) until a page is empty; both work. `date_start`/`date_end` bound the
/// creation time.
async fn list_instances(
    State(engine): State<Engine>,
    Path((_, name)): Path<(String, String)>,
    q: Queried,
) -> CfResult<Response> {
    let q = query(q)?;
    let workflow = workflow(&engine, &name)?;
    let per_page = per_page(&q)?;
    let page = whole(&q, "page")?.unwrap_or(1);
    let oldest_first = match q.get("direction").map(String::as_str) {
        None | Some("" | "desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "direction must be asc or desc, not {:?}",
                crate::error::clip(other)
            )));
        }
    };
    let status = status_filter(&q)?;
    let (start, end) = (time(&q, "date_start")?, time(&q, "date_end")?);
    if let (Some(s), Some(e)) = (start, end)
        && s > e
    {
        return Err(ApiError::bad_request("date_start is after date_end"));
    }
    let skip = (page - 1)
        .checked_mul(per_page)
        .filter(|n| *n <= MAX_SKIP)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "page {page} of {per_page} is past the {MAX_SKIP} rows a page number may skip: follow result_info.cursor instead"
            ))
        })?;
    // Walk the listing from the cursor: skip `skip` rows, keep `per_page`. A page that
    // fills up ends with the cursor after its last row when more rows may follow; one
    // that looked at MAX_SCAN rows ends early with the cursor after the last row it looked
    // at. The store leaves out rows outside the date range (`date_end` is inclusive), so
    // every row read matches: an oldest-first walk never reads through what comes before
    // `date_start`.
    let mut skipped = 0;
    let mut matched = Vec::new();
    let mut cursor = q.get("cursor").filter(|c| !c.is_empty()).cloned();
    let mut next = None;
    let mut scanned = 0;
    'walk: loop {
        let mut options = cairn::ListOptions::default().limit(per_page.max(50));
        options.statuses = status.into_iter().collect();
        options.cursor = cursor.take();
        options.oldest_first = oldest_first;
        options.created_from = start;
        options.created_before = end.map(|e| e.saturating_add(std::time::Duration::from_millis(1)));
        let listed = workflow.list(&options).await?;
        let rows = listed.instances.len();
        for (i, row) in listed.instances.into_iter().enumerate() {
            scanned += 1;
            let more = i + 1 < rows || listed.cursor.is_some();
            if skipped < skip {
                skipped += 1;
            } else {
                matched.push(row);
                if matched.len() == per_page {
                    next = more.then(|| matched[matched.len() - 1].cursor());
                    break 'walk;
                }
                continue;
            }
            if scanned >= MAX_SCAN {
                next = more.then(|| row.cursor());
                break 'walk;
            }
        }
        match listed.cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let result: Vec<Value> = matched
        .iter()
        .map(|row| shapes::listed(&name, row))
        .collect();
    let total = match (status, start, end) {
        (_, Some(_), _) | (_, _, Some(_)) => None,
        (Some(s), None, None) => Some(workflow.count(s).await?),
        (None, None, None) => Some(
            crate::actions::counts(&workflow)
                .await?
                .values()
                .filter_map(Value::as_u64)
                .sum(),
        ),
    };
    let count = result.len();
    Ok(ok_list(
        result,
        json!({
            "page": page, "per_page": per_page, "count": count,
            "total_count": total, "cursor": next,
        }),
    ))
}

async fn get_instance(
    State(engine): State<Engine>,
    Path((_, name, id)): Path<(String, String, String)>,
    q: Queried,
) -> CfResult<Response> {
    let q = query(q)?;
    let descending = match q.get("order").map(String::as_str) {
        None | Some("" | "asc") => false,
        Some("desc") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "order must be asc or desc, not {:?}",
                crate::error::clip(other)
            )));
        }
    };
    let simple = q.get("simple").is_some_and(|s| s == "true");
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let details = instance.details().await?;
    let status = instance.stored_status().await?;
    Ok(ok(shapes::details(
        &name,
        &details,
        status.rollback.as_ref(),
        descending,
        simple,
    )))
}

/// `GET …/instances/{id}/step?name=&type=&attempt=`: a step's full output (not truncated).
async fn step_output(
    State(engine): State<Engine>,
    Path((_, name, id)): Path<(String, String, String)>,
    q: Queried,
) -> CfResult<Response> {
    let q = query(q)?;
    let step = q
        .get("name")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("name is required: the step's name, e.g. fetch-1"))?;
    let kind = q.get("type").map_or("step", String::as_str);
    if !matches!(kind, "step" | "waitForEvent") {
        return Err(ApiError::bad_request(format!(
            "type must be step or waitForEvent, not {:?}",
            crate::error::clip(kind)
        )));
    }
    let attempt = match q.get("attempt") {
        Some(a) => Some(a.parse::<u32>().map_err(|_| {
            ApiError::bad_request(format!(
                "attempt must be a number, not {:?}",
                crate::error::clip(a)
            ))
        })?),
        None => None,
    };
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let details = instance.details().await?;
    let (mut answer, found) = shapes::step_output(&details, step, kind, attempt)?;
    // The details cut outputs past 4 KiB and show a stream's preview: the whole output
    // comes from the journal (a stream's bytes as they are, as Cloudflare serves them).
    if let Some((step, count)) = found {
        let kind = cairn::StepKind::parse(kind).unwrap_or(cairn::StepKind::Run);
        let selector = cairn::StepSelector::new(step).count(count).kind(kind);
        // The attempt the details were checked against: a restart landing between the two
        // reads must not serve another attempt's bytes (it answers step.not_found).
        let selector = match attempt {
            Some(a) => selector.attempt(a),
            None => selector,
        };
        match instance.step_output(&selector).await? {
            cairn::StepOutput::Stream(stream) => {
                return Ok(crate::routes::stream_response(stream));
            }
            cairn::StepOutput::Bytes(bytes) => return Ok(crate::routes::bytes_response(bytes)),
            whole => {
                if let (Some(json), Some(map)) = (whole.to_json(), answer.as_object_mut()) {
                    map.insert(
                        "output".into(),
                        serde_json::from_str(&json).unwrap_or(Value::Null),
                    );
                }
            }
        }
    }
    Ok(ok(answer))
}

async fn change_status(
    State(engine): State<Engine>,
    Path((_, name, id)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> CfResult<Response> {
    let request: crate::actions::StatusChange = match crate::actions::json_body(&headers, &body)? {
        Some(value) => crate::actions::object(value)?,
        None => {
            return Err(ApiError::bad_request(
                "the body must say the status: {\"status\": \"pause\"}",
            ));
        }
    };
    let instance = workflow(&engine, &name)?.get(&id).await?;
    let origin = crate::audit::origin(crate::audit::RouteSet::Cloudflare, &headers);
    crate::actions::change_status(&instance, request, &origin).await?;
    let status = instance.stored_status().await?.status;
    Ok(ok(json!({ "status": status, "timestamp": now(&engine) })))
}

async fn send_event(
    State(engine): State<Engine>,
    Path((_, name, id, event_type)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> CfResult<Response> {
    let payload = crate::actions::event_payload(&headers, &body)?;
    cairn::EventType::new(event_type.as_str()).map_err(cairn::Error::from)?;
    let instance = workflow(&engine, &name)?.get(&id).await?;
    instance.send_event(&event_type, &payload).await?;
    Ok(ok(json!({ "instanceId": id, "timestamp": now(&engine) })))
}

fn now(engine: &Engine) -> String {
    engine.clock().now().to_rfc3339()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal Cairn can name has a number of its own; only what is wrong with the
    /// request itself shares 10002, and failures of the server 10001.
    #[test]
    fn different_refusals_get_different_numeric_codes() {
        let codes = [
            "workflow.not_found",
            "version.not_found",
            "instance.not_found",
            "instance.cannot_terminate",
            "instance.cannot_pause",
            "instance.cannot_resume",
            "instance.already_exists",
            "instance.cannot_restart",
            "instance.cannot_delete",
            "instance.finished",
            "step.not_found",
            "payload.too_large",
            "route.not_found",
            "method.not_allowed",
            "account.not_found",
            "auth.unauthorized",
        ];
        let mut seen = std::collections::HashMap::new();
        for code in codes {
            let status = crate::error::status_of_code(code);
            let n = numeric_code(code, status);
            assert!(n != 10002 && n != 10001, "{code} has a generic number");
            assert_eq!(seen.insert(n, code), None, "{code} shares {n}");
        }
        assert_eq!(
            numeric_code("request.invalid", StatusCode::BAD_REQUEST),
            10002
        );
        assert_eq!(
            numeric_code("internal", StatusCode::INTERNAL_SERVER_ERROR),
            10001
        );
        for login_check in [10000, 9106] {
            assert!(!seen.contains_key(&login_check));
        }
    }
}
