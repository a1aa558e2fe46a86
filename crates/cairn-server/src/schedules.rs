//! `/api/schedules`: the cron schedules, declared in code or created over the API; create,
//! pause, resume, delete and trigger them.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn::json::Object;
use cairn::{CatchUp, Engine, Overlap, Schedule, ScheduleEntry};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, body};

type ApiResult<T> = Result<T, ApiError>;

pub(crate) fn routes() -> Router<Engine> {
    Router::new()
        .route("/api/schedules", get(list).post(create))
        .route("/api/schedules/{schedule}", get(one).delete(delete))
        .route("/api/schedules/{schedule}/pause", post(pause))
        .route("/api/schedules/{schedule}/resume", post(resume))
        .route("/api/schedules/{schedule}/trigger", post(trigger))
}

/// A schedule as the API shows it, with its last tick fired and its next one.
async fn render(engine: &Engine, entry: &ScheduleEntry) -> ApiResult<Value> {
    let s = &entry.schedule;
    // The last run is not the last tick's id: a tick the overlap policy passed over
    // started nothing.
    let (last, last_run) = engine.last_fired_of(s).await?;
    let next = s.next_after(engine.clock().now());
    let catch_up = match s.catch_up_policy() {
        CatchUp::Skip => json!("skip"),
        CatchUp::RunOnce => json!("runOnce"),
        CatchUp::RunAll(n) => json!({ "runAll": n }),
    };
    Ok(json!({
        "name": s.name(),
        "workflow": s.workflow(),
        "cron": s.expression(),
        "timeZone": s.zone(),
        "params": s.params(),
        "overlap": s.overlap_policy().as_str(),
        "catchUp": catch_up,
        "source": if entry.in_code { "code" } else { "api" },
        "paused": entry.paused,
        "lastTick": last.map(|t| t.to_rfc3339()),
        "nextTick": if entry.paused { None } else { next.map(|t| t.to_rfc3339()) },
        "lastInstanceId": last_run,
    }))
}

async fn entry(engine: &Engine, name: &str) -> ApiResult<ScheduleEntry> {
    engine
        .list_schedules()
        .await?
        .into_iter()
        .find(|e| e.schedule.name() == name)
        .ok_or_else(|| cairn::Error::ScheduleNotFound(name.to_owned()).into())
}

/// Every schedule, by name.
async fn list(State(engine): State<Engine>) -> ApiResult<Json<Value>> {
    let mut out = Vec::new();
    for e in engine.list_schedules().await? {
        out.push(render(&engine, &e).await?);
    }
    Ok(Json(json!({ "schedules": out })))
}

async fn one(State(engine): State<Engine>, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    let e = entry(&engine, &name).await?;
    Ok(Json(render(&engine, &e).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateBody {
    name: String,
    cron: String,
    workflow: String,
    params: Option<Value>,
    time_zone: Option<String>,
    overlap: Option<String>,
    /// `"skip"`, `"runOnce"`, `"runAll:N"`, or `{"runAll": N}`.
    catch_up: Option<Value>,
}

fn invalid(e: cairn::ScheduleError) -> ApiError {
    cairn::Error::InvalidSchedule(e.to_string()).into()
}

/// `POST /api/schedules`: a schedule for every engine on the store.
async fn create(
    State(engine): State<Engine>,
    headers: HeaderMap,
    payload: Result<Json<Object<CreateBody>>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let Object(b) = body(payload)?;
    let params = b.params.unwrap_or_else(|| json!({}));
    let mut schedule = Schedule::untyped(&b.name, &b.cron, &b.workflow, params).map_err(invalid)?;
    if let Some(zone) = &b.time_zone {
        schedule = schedule.time_zone(zone).map_err(invalid)?;
    }
    if let Some(overlap) = &b.overlap {
        schedule = schedule.overlap(Overlap::parse(overlap).map_err(invalid)?);
    }
    if let Some(catch_up) = &b.catch_up {
        let name = match catch_up {
            Value::String(s) => s.clone(),
            Value::Object(o) if o.len() == 1 && o.contains_key("runAll") => {
                format!("runAll:{}", o["runAll"])
            }
            other => other.to_string(),
        };
        schedule = schedule.catch_up(CatchUp::parse(&name).map_err(invalid)?);
    }
    let created = engine.create_schedule(schedule).await;
    crate::audit::request(
        crate::audit::RouteSet::Api,
        &headers,
        "create schedule",
        &format!("{} ({} {})", b.name, b.cron, b.workflow),
        &created,
    );
    created?;
    let e = entry(&engine, &b.name).await?;
    Ok((StatusCode::CREATED, Json(render(&engine, &e).await?)))
}

async fn pause(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let paused = engine.pause_schedule(&name).await;
    crate::audit::request(
        crate::audit::RouteSet::Api,
        &headers,
        "pause schedule",
        &name,
        &paused,
    );
    paused?;
    one(State(engine), Path(name)).await
}

async fn resume(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let resumed = engine.resume_schedule(&name).await;
    crate::audit::request(
        crate::audit::RouteSet::Api,
        &headers,
        "resume schedule",
        &name,
        &resumed,
    );
    resumed?;
    one(State(engine), Path(name)).await
}

/// `?forget=true`: the stored state of a schedule once declared in code
/// (`Engine::forget_schedule`).
#[derive(Deserialize)]
struct DeleteQuery {
    #[serde(default)]
    forget: bool,
}

async fn delete(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    Query(query): Query<DeleteQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let deleted = if query.forget {
        engine.forget_schedule(&name).await
    } else {
        engine.delete_schedule(&name).await
    };
    crate::audit::request(
        crate::audit::RouteSet::Api,
        &headers,
        "delete schedule",
        &name,
        &deleted,
    );
    deleted?;
    Ok(Json(json!({ "deleted": name })))
}

/// Starts a run of a schedule now, outside its ticks.
async fn trigger(
    State(engine): State<Engine>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let triggered = engine.trigger_schedule(&name).await;
    crate::audit::request(
        crate::audit::RouteSet::Api,
        &headers,
        "trigger schedule",
        &name,
        &triggered.as_ref().map(drop),
    );
    let instance = triggered?;
    Ok((
        StatusCode::CREATED,
        Json(
            json!({ "workflow": instance.workflow(), "id": instance.id(), "status": instance.stored_status().await?.status }),
        ),
    ))
}
