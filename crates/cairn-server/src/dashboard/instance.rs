//! `/workflows/{name}/instances/{id}`: one instance, live while it runs — status, timings,
//! params, output or error, the timeline, the steps, the event log — and every action on
//! it (pause, resume, terminate with or without rollback, restart, restart from a step,
//! send an event, delete), each answered with its result in words.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use cairn::{Engine, Instance, InstanceDetails, InstanceStatus, LogRecord, StepKind};
use maud::{Markup, html};
use serde_json::Value;

use super::layout::{self, Shell};
use super::timeline::{self, Timeline};
use super::{Guard, pairs, value};

/// The most event-log rows a page shows (the newest).
const LOG_ROWS: usize = 500;

struct Loaded {
    details: InstanceDetails,
    rollback: Option<cairn::RollbackStatus>,
    log: Vec<LogRecord>,
}

async fn load(instance: &Instance<Value>) -> Result<Loaded, cairn::Error> {
    // The log first: the page follows the stream from its last record, so the details
    // read after it are as new as it or newer, and whatever happens after it arrives
    // live. (Read the other way round, a record landing in between left a page showing
    // `waiting` that followed the stream from after the instance's last record: it never
    // updated.)
    let mut log = instance.log(0).await?;
    let details = instance.details().await?;
    let status = instance.stored_status().await?;
    if details.end.is_some() {
        // Finished: no stream follows, so the table shows every record.
        log = instance.log(0).await?;
    }
    Ok(Loaded {
        details,
        rollback: status.rollback,
        log,
    })
}

pub(crate) async fn page(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let csrf = guard.csrf(&headers).unwrap_or_default();
    let pairs = pairs(query.as_deref());
    let title = format!("{name} / {id}");
    let shell = Shell {
        title: &title,
        section: "instances",
        csrf: &csrf,
        logged_in: guard.has_session(&headers),
    };
    let loaded = match find(&engine, &name, &id).await {
        Ok(instance) => load(&instance).await,
        Err(e) => Err(e),
    };
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            let status = crate::error::ApiError::from(e.clone()).status;
            let body = html! {
                div.heading { h1 { (name) " / " (id) } }
                (layout::flash(&guard, &pairs))
                p.flash.error role="alert" { (e.to_string()) }
                p { a href=(format!("/instances?workflow={}", super::encode_segment(&name))) { "All instances of " (name) } }
            };
            return super::html(status, layout::page(&shell, body));
        }
    };
    let full = value(&pairs, "full");
    let body = render(&engine, &guard, &name, &id, &loaded, full, &csrf, &pairs);
    super::html(StatusCode::OK, layout::page(&shell, body))
}

#[allow(clippy::too_many_arguments)]
fn render(
    engine: &Engine,
    guard: &Guard,
    name: &str,
    id: &str,
    loaded: &Loaded,
    full: Option<&str>,
    csrf: &str,
    pairs: &[(String, String)],
) -> Markup {
    let d = &loaded.details;
    let here = super::instance_path(name, id);
    let cursor = loaded.log.last().map_or(0, |r| r.id);
    let stream = format!("{}/stream?cursor={cursor}", api_path(name, id));
    let now = engine.clock().now();
    let end = d.end.unwrap_or(now).max(d.queued);
    let finished = d.end.is_some();
    let full_link = |field: &str| format!("{here}?full={field}#{field}");
    html! {
        div.heading {
            p.crumbs { a href=(format!("/instances?workflow={}", super::encode_segment(name))) { (name) } " /" }
            h1 { (id) }
        }
        (layout::flash(guard, pairs))
        div data-live="instance" data-stream=(if finished { String::new() } else { stream }) {
            dl.facts {
                div { dt { "Status" } dd #status data-status=(d.status.as_str()) { (layout::status(d.status)) } }
                div { dt { "Created" } dd { (layout::time(d.queued)) } }
                div { dt { "Started" } dd { (layout::maybe_time(d.start)) } }
                div { dt { "Ended" } dd { (layout::maybe_time(d.end)) } }
                div { dt { "Ran" } dd {
                    @match d.start { Some(s) => (layout::duration(end.since(s))), None => span.muted { "not started" } }
                } }
                @if let Some(version) = &d.version {
                    div #version { dt { "Version" } dd {
                        code { (version) }
                        @if d.waiting_for_worker.is_some() {
                            span.muted { " · waiting for a worker of this version to connect" }
                        }
                    } }
                }
                @if let Some(key) = &d.concurrency_key {
                    div #key { dt { "Key" } dd {
                        (key)
                        @if let Some(w) = &d.waiting_for_slot {
                            span.muted { " · waiting for a slot, #" (w.position) " in line" }
                        }
                    } }
                }
                @if let Some(p) = &d.parent {
                    div #parent { dt { "Parent" } dd {
                        a href=(super::instance_path(&p.workflow, &p.id)) { (p.workflow) " / " (p.id) }
                        span.muted { " step " (p.step) @if p.count > 1 { " #" (p.count) } }
                    } }
                }
                @if let Some(rb) = &loaded.rollback {
                    div #rollback { dt { "Rollback" } dd {
                        (rb.outcome)
                        @if let Some(e) = &rb.error { ": " code { (e.name) ": " (e.message) } }
                    } }
                }
            }
            section.values {
                div #params {
                    h2 { "Params" }
                    (layout::value(&d.params, Some(&full_link("params")), full == Some("params")))
                }
                @if let Some(output) = &d.output {
                    div #output {
                        h2 { "Output" }
                        (layout::value(output, Some(&full_link("output")), full == Some("output")))
                    }
                }
                @if let Some(error) = &d.error {
                    div #error {
                        h2 { "Error" }
                        p.flash.error { strong { (error.name) } ": " (layout::clip(&error.message, 4096)) }
                    }
                }
            }
            @if !d.children.is_empty() {
                section #children {
                    h2 { "Children" }
                    div.tablewrap { table.steps {
                        thead { tr { th { "Step" } th { "Workflow" } th.wide { "Instance" } th { "Status" } } }
                        tbody { @for c in &d.children {
                            tr data-child=(c.id) {
                                td { (c.step) @if c.count > 1 { " #" (c.count) } }
                                td { (c.workflow) }
                                td.wide { a href=(super::instance_path(&c.workflow, &c.id)) { (c.id) } @if c.detached { span.muted { " (detached)" } } }
                                td { @if let Some(status) = c.status { (layout::status(status)) } }
                            }
                        } }
                    } }
                }
            }
            section {
                h2 { "Timeline" }
                (timeline::render(&Timeline::build(&loaded.log), d.queued, end))
            }
            section {
                h2 { "Steps" }
                @if d.steps.is_empty() { p.empty { "No steps yet." } } @else {
                    div.tablewrap { table.steps {
                        thead { tr { th { "Step" } th { "Type" } th { "Result" } th { "Attempts" } th.wide { "Started" } th { "Took" } th.wide { "Output or error" } } }
                        tbody { @for s in &d.steps {
                            tr data-step=(s.name) {
                                td { (s.name) @if s.count > 1 { " #" (s.count) } }
                                td { (s.kind) }
                                td { @match s.success { Some(true) => span.ok { "succeeded" }, Some(false) => span.failed { @if s.cancelled { "cancelled" } @else { "failed" } }, None => span.muted { "running" } } }
                                td { (s.attempts.len()) }
                                td.wide { (layout::time(s.start)) }
                                td { @match s.end { Some(e) => (layout::duration(e.since(s.start))), None => span.muted { "—" } } }
                                td.wide {
                                    @let failed: Vec<_> = s.attempts.iter().filter(|a| a.error.is_some()).collect();
                                    @if !failed.is_empty() && (s.error.is_none() || failed.len() > 1) {
                                        // Each failed attempt's error: why it was retried.
                                        ol.attempt-errors { @for a in &failed { @if let Some(e) = &a.error {
                                            li data-attempt=(a.attempt) { "attempt " (a.attempt) ": " span.failed { (e.name) ": " (layout::clip(&e.message, 300)) } }
                                        } } }
                                    }
                                    @if let Some(e) = &s.error { span.failed { (e.name) ": " (layout::clip(&e.message, 300)) } }
                                    @else if let Some(o) = &s.output {
                                        @let shown = o.to_string();
                                        code { (layout::clip(&shown, 160)) }
                                        @if s.output_bytes.is_some() || shown.chars().count() > 160 {
                                            " " a.small href=(crate::routes::step_output_url(name, id, &s.name, s.count, s.kind)) { "whole output" }
                                        }
                                    }
                                }
                            }
                        } }
                    } }
                }
            }
            section {
                h2 { "Event log" }
                @let shown = &loaded.log[loaded.log.len().saturating_sub(LOG_ROWS)..];
                @if shown.len() < loaded.log.len() {
                    p.muted.small {
                        "The last " (LOG_ROWS) " of " (loaded.log.len()) " records; all of them: "
                        code { "cairn instances describe " (name) " " (id) " --json" } "."
                    }
                }
                div.tablewrap { table.log {
                    thead { tr { th { "#" } th { "Record" } th { "At" } th { "Step" } th.wide { "Details" } } }
                    tbody { @for r in shown {
                        tr {
                            td { (r.id) }
                            td { code { (r.entry.kind.as_str()) } }
                            td { (layout::time(r.entry.at)) }
                            td { @if let Some(k) = &r.entry.step { (k.name) @if k.count > 1 { " #" (k.count) } } }
                            td.wide { @if r.entry.meta.as_object().is_some_and(|m| !m.is_empty()) { code { (layout::clip(&r.entry.meta.to_string(), 300)) } } }
                        }
                    } }
                } }
            }
        }
        (actions(name, id, d, csrf))
    }
}

fn api_path(name: &str, id: &str) -> String {
    format!("/api{}", super::instance_path(name, id))
}

/// The buttons valid for an instance in `status`: pause while it can still run, resume
/// while paused, terminate until it has ended; restart always, and delete always to a
/// session whose token has the `admin` scope.
fn valid_actions(status: InstanceStatus) -> Vec<(&'static str, &'static str, bool)> {
    let mut buttons = Vec::new();
    let paused = matches!(
        status,
        InstanceStatus::Paused | InstanceStatus::WaitingForPause
    );
    if !status.is_terminal() && !paused {
        buttons.push(("pause", "Pause", false));
    }
    if paused {
        buttons.push(("resume", "Resume", false));
    }
    if !status.is_terminal() {
        buttons.push(("terminate", "Terminate", true));
        buttons.push(("terminate-rollback", "Terminate with rollback", true));
    }
    buttons.push(("restart", "Restart", true));
    if crate::auth::may(crate::auth::Scope::Admin) {
        buttons.push(("delete", "Delete", true));
    }
    buttons
}

fn actions(name: &str, id: &str, d: &InstanceDetails, csrf: &str) -> Markup {
    if !crate::auth::may(crate::auth::Scope::Operate) {
        return html! {
            section.actions aria-labelledby="actions-title" {
                h2 #actions-title { "Actions" }
                p.muted { "This session's token may only read." }
            }
        };
    }
    let here = super::instance_path(name, id);
    let action = format!("{here}/action");
    let button = |value: &str, label: &str, danger: bool| {
        html! {
            form.inline method="post" action=(action) {
                input type="hidden" name="csrf" value=(csrf);
                button type="submit" name="action" value=(value) class=(if danger { "danger" } else { "" }) { (label) }
            }
        }
    };
    html! {
        section.actions aria-labelledby="actions-title" {
            h2 #actions-title { "Actions" }
            div.buttons {
                @for (value, label, danger) in valid_actions(d.status) {
                    (button(value, label, danger))
                }
            }
            @if !d.steps.is_empty() {
                form.row method="post" action=(action) {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="action" value="restart-from";
                    label {
                        "Restart from "
                        select name="from" {
                            @for s in &d.steps {
                                option value=(format!("{}|{}|{}", s.kind, s.count, s.name)) {
                                    (s.name) @if s.count > 1 { " #" (s.count) } " (" (s.kind) ")"
                                }
                            }
                        }
                    }
                    button type="submit" { "Restart from this step" }
                }
            }
            form.event method="post" action=(format!("{here}/event")) {
                input type="hidden" name="csrf" value=(csrf);
                h3 { "Send an event" }
                label { "Type " input type="text" name="type" required placeholder="approved" autocomplete="off"; }
                label { "Payload (JSON) " textarea name="payload" rows="3" placeholder="{\"by\": \"ada\"}" data-json {} }
                button type="submit" { "Send event" }
            }
        }
    }
}

/// The instance `id` of workflow `name`.
async fn find(engine: &Engine, name: &str, id: &str) -> Result<Instance<Value>, cairn::Error> {
    engine.workflow_by_name(name)?.get(id).await
}

pub(crate) async fn action(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let form = match super::guard::posted_form(&guard, &headers, &body) {
        Ok(form) => form,
        Err(refused) => return refused,
    };
    let here = super::instance_path(&name, &id);
    let needs = match value(&form, "action") {
        Some("delete") => crate::auth::Scope::Admin,
        _ => crate::auth::Scope::Operate,
    };
    if let Err(refused) = super::allowed(&guard, &here, needs) {
        return refused;
    }
    let instance = match find(&engine, &name, &id).await {
        Ok(i) => i,
        Err(e) => return super::back(&guard, &here, Err(e.to_string())),
    };
    if value(&form, "confirmed").is_none()
        && let Some(consequence) = consequence(value(&form, "action"), value(&form, "from"))
    {
        return confirm(&guard, &headers, &name, &id, &form, consequence);
    }
    let done = match value(&form, "action") {
        Some("pause") => instance
            .pause()
            .await
            .map(|()| "Pause requested.".to_owned()),
        Some("resume") => instance.resume().await.map(|()| "Resumed.".to_owned()),
        Some("terminate") => instance
            .terminate()
            .await
            .map(|()| "Terminated.".to_owned()),
        Some("terminate-rollback") => instance
            .terminate_with_rollback()
            .await
            .map(|()| "Terminated; its rollback runs now.".to_owned()),
        Some("restart") => instance
            .restart()
            .await
            .map(|()| "Restarted from the beginning.".to_owned()),
        Some("restart-from") => {
            let Some((kind, count, step)) = value(&form, "from").and_then(|f| {
                let mut parts = f.splitn(3, '|');
                Some((
                    parts.next()?,
                    parts.next()?.parse::<u32>().ok()?,
                    parts.next()?,
                ))
            }) else {
                return super::back(
                    &guard,
                    &here,
                    Err("Choose the step to restart from.".into()),
                );
            };
            let Some(kind) = StepKind::parse(kind) else {
                return super::back(&guard, &here, Err(format!("unknown step type {kind:?}")));
            };
            instance
                .restart_from(kind, step, count)
                .await
                .map(|()| format!("Restarted from step \"{step}\"."))
        }
        Some("delete") => {
            let deleted = instance.delete().await;
            crate::audit::control("dashboard", "delete", &format!("{name}/{id}"), &deleted);
            return match deleted {
                Ok(()) => super::back(
                    &guard,
                    &format!("/instances?workflow={}", super::encode_segment(&name)),
                    Ok(format!("Deleted {name}/{id}.")),
                ),
                Err(e) => super::back(&guard, &here, Err(e.to_string())),
            };
        }
        other => {
            return super::back(
                &guard,
                &here,
                Err(format!("unknown action {:?}", other.unwrap_or(""))),
            );
        }
    };
    crate::audit::control(
        "dashboard",
        value(&form, "action").unwrap_or(""),
        &format!("{name}/{id}"),
        &done.as_ref().map(drop),
    );
    super::back(&guard, &here, done.map_err(|e| e.to_string()))
}

/// What a destructive action will do, in words for its confirmation; `None` for the
/// others (pause, resume), which act at once.
fn consequence(action: Option<&str>, from: Option<&str>) -> Option<(&'static str, String)> {
    let step = from.and_then(|f| f.splitn(3, '|').nth(2)).unwrap_or("?");
    Some(match action? {
        "terminate" => (
            "Terminate",
            "It stops for good: the step in flight is abandoned and nothing runs again.".into(),
        ),
        "terminate-rollback" => (
            "Terminate with rollback",
            "It stops for good, and the rollback handlers of its completed steps run, newest first.".into(),
        ),
        "restart" => (
            "Restart",
            "Its steps' results are discarded and it runs again from the beginning: completed steps run again.".into(),
        ),
        "restart-from" => (
            "Restart from this step",
            format!("The results of step \"{step}\" and every later op are discarded, and they run again."),
        ),
        "delete" => (
            "Delete",
            "The instance, its steps and its event log are removed; this cannot be undone.".into(),
        ),
        _ => return None,
    })
}

/// Asks before a destructive action: what will happen, to which instance; confirming posts
/// the same form again with `confirmed`.
fn confirm(
    guard: &Guard,
    headers: &HeaderMap,
    name: &str,
    id: &str,
    form: &[(String, String)],
    (verb, what): (&str, String),
) -> Response {
    let here = super::instance_path(name, id);
    let csrf = guard.csrf(headers).unwrap_or_default();
    let body = html! {
        div.confirm role="alertdialog" aria-labelledby="confirm-title" {
            h1 #confirm-title { (verb) " " code { (name) "/" (id) } "?" }
            p { (what) }
            form method="post" action=(format!("{here}/action")) {
                @for (k, v) in form {
                    @if k != "confirmed" { input type="hidden" name=(k) value=(v); }
                }
                input type="hidden" name="confirmed" value="1";
                button.danger type="submit" autofocus { (verb) }
                " "
                a href=(here) { "Cancel" }
            }
        }
    };
    super::html(
        StatusCode::OK,
        layout::page(
            &Shell {
                title: "Confirm",
                section: "instances",
                csrf: &csrf,
                logged_in: guard.has_session(headers),
            },
            body,
        ),
    )
}

pub(crate) async fn event(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let form = match super::guard::posted_form(&guard, &headers, &body) {
        Ok(form) => form,
        Err(refused) => return refused,
    };
    let here = super::instance_path(&name, &id);
    if let Err(refused) = super::allowed(&guard, &here, crate::auth::Scope::Operate) {
        return refused;
    }
    let Some(kind) = value(&form, "type") else {
        return super::back(&guard, &here, Err("Give the event a type.".into()));
    };
    let text = value(&form, "payload").unwrap_or("").trim();
    let payload: Value = if text.is_empty() {
        Value::Null
    } else {
        match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return super::back(
                    &guard,
                    &here,
                    Err(format!("The payload is not JSON ({e}); nothing was sent.")),
                );
            }
        }
    };
    let sent = match find(&engine, &name, &id).await {
        Ok(instance) => instance.send_event(kind, &payload).await,
        Err(e) => Err(e),
    };
    super::back(
        &guard,
        &here,
        sent.map(|_| format!("Sent a \"{kind}\" event."))
            .map_err(|e| e.to_string()),
    )
}
