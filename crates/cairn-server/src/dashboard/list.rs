//! `/instances`: the instances of every workflow (or one) by a filter (statuses, creation
//! range, id prefix), newest first, a page at a time by keyset cursor; live while shown;
//! and bulk actions on the selected rows or on everything the filter matches.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use cairn::{Engine, InstanceStatus, Timestamp};
use maud::{Markup, html};

use super::layout::{self, Shell};
use super::{Guard, pairs, value};
use crate::bulk::{Action, Filter, Outcome, Target};

/// Rows per page.
const PAGE: usize = 50;
/// Instances one bulk request acts on between two looks at the filter.
const BULK_PAGE: usize = 1_000;

/// A filter from the list's query: `workflow`, `status` (repeated), `from`, `before`
/// (RFC 3339, or a `datetime-local` value read as UTC), `id` (a prefix).
fn filter(pairs: &[(String, String)]) -> Result<Filter, String> {
    let mut status = Vec::new();
    for (k, v) in pairs {
        if k == "status" && !v.is_empty() {
            let s: InstanceStatus = v.parse()?;
            if !status.contains(&s) {
                status.push(s);
            }
        }
    }
    Ok(Filter {
        workflow: value(pairs, "workflow").map(str::to_owned),
        status,
        created_from: when(value(pairs, "from"), "from")?,
        created_before: when(value(pairs, "before"), "before")?,
        id_prefix: value(pairs, "id").map(str::to_owned),
    })
}

fn when(text: Option<&str>, name: &str) -> Result<Option<Timestamp>, String> {
    let Some(text) = text else { return Ok(None) };
    // `datetime-local` sends `2026-12-01T10:30`: seconds and zone missing.
    let full = if text.len() == 16 {
        format!("{text}:00Z")
    } else {
        text.to_owned()
    };
    humantime::parse_rfc3339_weak(&full)
        .map(|t| Some(Timestamp::from_system_time(t)))
        .map_err(|e| format!("'{name}' is not a time ({e}): use 2026-01-31T12:00:00Z"))
}

/// The query string of `filter` (without a cursor).
fn query_of(filter: &Filter) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    if let Some(w) = &filter.workflow {
        q.append_pair("workflow", w);
    }
    for s in &filter.status {
        q.append_pair("status", s.as_str());
    }
    if let Some(t) = filter.created_from {
        q.append_pair("from", &t.to_rfc3339());
    }
    if let Some(t) = filter.created_before {
        q.append_pair("before", &t.to_rfc3339());
    }
    if let Some(p) = &filter.id_prefix {
        q.append_pair("id", p);
    }
    q.finish()
}

/// The filter in words, for a confirmation.
fn describe(filter: &Filter) -> String {
    let mut parts = Vec::new();
    parts.push(match &filter.workflow {
        Some(w) => format!("workflow {w}"),
        None => "every workflow".to_owned(),
    });
    if !filter.status.is_empty() {
        let names: Vec<_> = filter.status.iter().map(|s| s.as_str()).collect();
        parts.push(format!("status {}", names.join(" or ")));
    }
    if let Some(t) = filter.created_from {
        parts.push(format!("created from {t}"));
    }
    if let Some(t) = filter.created_before {
        parts.push(format!("created before {t}"));
    }
    if let Some(p) = &filter.id_prefix {
        parts.push(format!("id starting with \"{p}\""));
    }
    parts.join(", ")
}

pub(crate) async fn page(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let csrf = guard.csrf(&headers).unwrap_or_default();
    let pairs = pairs(query.as_deref());
    let started = std::time::Instant::now();
    let (filter, problem) = match filter(&pairs) {
        Ok(f) => (f, None),
        Err(e) => (Filter::default(), Some(e)),
    };
    let cursor = value(&pairs, "cursor").map(str::to_owned);
    // The stream cursor, read before the rows: the rows are at least this new, and what
    // lands after it arrives live (read after them, a change in between would be lost).
    let head = engine.log_head().await.unwrap_or(0);
    let listed = engine
        .list_instances(
            filter.workflow.as_deref(),
            &filter.options(cursor.clone(), PAGE),
        )
        .await;
    let streams: Vec<String> = match &filter.workflow {
        Some(w) => vec![format!(
            "/api/workflows/{}/stream?cursor={head}",
            super::encode_segment(w)
        )],
        None => vec![format!("/live?cursor={head}")],
    };
    let q = query_of(&filter);
    let filtered =
        !q.is_empty() && q != format!("workflow={}", filter.workflow.as_deref().unwrap_or(""));
    let body = html! {
        div.heading {
            h1 { "Instances" }
        }
        (layout::flash(&guard, &pairs))
        @if let Some(problem) = &problem { p.flash.error role="alert" { (problem) } }
        (filter_form(&engine, &filter))
        @match &listed {
            Err(e) => p.flash.error role="alert" { (e.to_string()) },
            Ok(page) => {
                // With a filter it could not read, "all matching" would be everything.
                @if problem.is_none() {
                form #bulk method="post" action="/instances/bulk" {
                    input type="hidden" name="csrf" value=(csrf);
                    (hidden_filter(&filter))
                    div.bulkbar role="group" aria-label="Bulk actions" {
                        span { "With " }
                        label { input type="radio" name="scope" value="selected" checked; " the selected" }
                        label { input type="radio" name="scope" value="filter"; " all matching the filter" }
                        @for (action, label) in [("pause", "Pause"), ("resume", "Resume"), ("terminate", "Terminate"), ("terminate-rollback", "Terminate with rollback"), ("restart", "Restart"), ("delete", "Delete")]
                            .into_iter()
                            .filter(|(action, _)| crate::auth::may(if *action == "delete" { crate::auth::Scope::Admin } else { crate::auth::Scope::Operate })) {
                            button type="submit" name="action" value=(action) class=(if action.starts_with("terminate") || action == "delete" { "danger" } else { "" }) { (label) }
                        }
                    }
                    div.tablewrap data-live="list" data-streams=(streams.join(" ")) {
                        @if page.instances.is_empty() {
                            p.empty {
                                @if cursor.is_some() { "No more instances." }
                                @else if filtered { "No instances match this filter. " a href="/instances" { "Clear the filter" } }
                                @else {
                                    "No instances yet — trigger one with "
                                    code { "cairn workflows trigger " (engine.workflow_names().first().map_or("greet", |w| w.as_str())) }
                                    "."
                                }
                            }
                        } @else {
                            table.list {
                                thead { tr {
                                    th scope="col" { input #select-all type="checkbox" aria-label="Select every row on this page"; }
                                    th scope="col" { "Workflow" }
                                    th scope="col" { "Instance" }
                                    th scope="col" { "Status" }
                                    th scope="col" { "Created" }
                                    th.wide scope="col" { "Started" }
                                    th.wide scope="col" { "Ran" }
                                    th.wide scope="col" { "Error" }
                                } }
                                tbody {
                                    @for i in &page.instances {
                                        @let key = format!("{}/{}", i.workflow, i.id);
                                        tr data-instance=(key) data-status=(i.status.as_str()) {
                                            td { input type="checkbox" name="sel" value=(key) aria-label=(format!("Select {key}")); }
                                            td { (i.workflow.as_str()) }
                                            td { a href=(super::instance_path(i.workflow.as_str(), i.id.as_str())) { (i.id.as_str()) } }
                                            td { (layout::status(i.status)) }
                                            td { (layout::time(i.created)) }
                                            td.wide { (layout::maybe_time(i.started)) }
                                            td.wide {
                                                @match (i.started, i.ended) {
                                                    (Some(s), Some(e)) => (layout::duration(e.since(s))),
                                                    _ => span.muted { "—" },
                                                }
                                            }
                                            td.wide.error {
                                                @if let Some(e) = &i.error { span.failed { (e.name) ": " (layout::clip(&e.message, 120)) } }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                }
                // Live too: after a refresh, "Older" goes on from the rows shown.
                nav.pager aria-label="Pages" data-live="pager" {
                    @if cursor.is_some() { a href=(format!("/instances?{q}")) { "← Newest" } }
                    @if let Some(next) = &page.cursor {
                        a href=(format!("/instances?{q}{}cursor={next}", if q.is_empty() { "" } else { "&" })) rel="next" { "Older →" }
                    }
                    span.muted.small { "served in " (format!("{:.1}", started.elapsed().as_secs_f64() * 1e3)) " ms" }
                }
            }
        }
    };
    super::html(
        StatusCode::OK,
        layout::page(
            &Shell {
                title: "Instances",
                section: "instances",
                csrf: &csrf,
                logged_in: guard.has_session(&headers),
            },
            body,
        ),
    )
}

fn filter_form(engine: &Engine, filter: &Filter) -> Markup {
    let local = |t: Option<Timestamp>| {
        t.map(|t| t.to_rfc3339().chars().take(16).collect::<String>())
            .unwrap_or_default()
    };
    html! {
        form.filter #filter method="get" action="/instances" role="search" {
            label {
                "Workflow "
                select name="workflow" {
                    option value="" { "every workflow" }
                    @for w in engine.workflow_names() {
                        option value=(w.as_str()) selected[filter.workflow.as_deref() == Some(w.as_str())] { (w.as_str()) }
                    }
                }
            }
            fieldset.statuses {
                legend { "Status" }
                @for s in InstanceStatus::ALL {
                    label { input type="checkbox" name="status" value=(s.as_str()) checked[filter.status.contains(&s)]; " " (s.as_str()) }
                }
            }
            label { "Created from " input type="datetime-local" name="from" data-utc=(filter.created_from.map(|t| t.to_rfc3339()).unwrap_or_default()) value=(local(filter.created_from)); }
            label { "Created before " input type="datetime-local" name="before" data-utc=(filter.created_before.map(|t| t.to_rfc3339()).unwrap_or_default()) value=(local(filter.created_before)); }
            label { "Id starts with " input type="search" name="id" value=(filter.id_prefix.as_deref().unwrap_or("")) autocomplete="off"; }
            button type="submit" { "Filter" }
            a href="/instances" { "Clear" }
        }
    }
}

fn hidden_filter(filter: &Filter) -> Markup {
    html! {
        @if let Some(w) = &filter.workflow { input type="hidden" name="workflow" value=(w); }
        @for s in &filter.status { input type="hidden" name="status" value=(s.as_str()); }
        @if let Some(t) = filter.created_from { input type="hidden" name="from" value=(t.to_rfc3339()); }
        @if let Some(t) = filter.created_before { input type="hidden" name="before" value=(t.to_rfc3339()); }
        @if let Some(p) = &filter.id_prefix { input type="hidden" name="id" value=(p); }
    }
}

/// `POST /instances/bulk`: first a confirmation that says how many, then (with
/// `confirmed`) the action, answered by the list with the outcome in words.
pub(crate) async fn bulk(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form = match super::guard::posted_form(&guard, &headers, &body) {
        Ok(form) => form,
        Err(refused) => return refused,
    };
    let filter = match filter(&form) {
        Ok(f) => f,
        Err(e) => return super::back(&guard, "/instances", Err(e)),
    };
    let list = format!("/instances?{}", query_of(&filter));
    let (action, rollback) = match value(&form, "action") {
        Some("terminate-rollback") => (Action::Terminate, true),
        Some(name) => match Action::parse(name) {
            Some(a) => (a, false),
            None => return super::back(&guard, &list, Err(format!("unknown action {name:?}"))),
        },
        None => return super::back(&guard, &list, Err("choose an action".into())),
    };
    let needs = if action == Action::Delete {
        crate::auth::Scope::Admin
    } else {
        crate::auth::Scope::Operate
    };
    if let Err(refused) = super::allowed(&guard, &list, needs) {
        return refused;
    }
    let everything = value(&form, "scope") == Some("filter");
    let mut selected: Vec<Target> = Vec::new();
    for (w, id) in form
        .iter()
        .filter(|(k, _)| k == "sel")
        .filter_map(|(_, v)| v.split_once('/'))
    {
        let target = Target {
            workflow: w.to_owned(),
            id: id.to_owned(),
        };
        if !selected.contains(&target) {
            selected.push(target);
        }
    }
    if !everything && selected.is_empty() {
        return super::back(
            &guard,
            &list,
            Err("Select instances first, or choose \"all matching the filter\".".into()),
        );
    }
    let verb = match (action, rollback) {
        (Action::Terminate, true) => "Terminate with rollback",
        (Action::Pause, _) => "Pause",
        (Action::Resume, _) => "Resume",
        (Action::Terminate, _) => "Terminate",
        (Action::Restart, _) => "Restart",
        (Action::Delete, _) => "Delete",
    };
    if value(&form, "confirmed").is_none() {
        let mut start = None;
        let (count, what) = if everything {
            // The action starts at the newest instance matching now: one created after
            // the confirmation is not part of what was confirmed.
            // The count is of exactly the instances the action will go through: the
            // newest one matching now and those older.
            match crate::bulk::pin(&engine, &filter).await {
                Ok((from, n)) => {
                    start = from;
                    (n, format!("every instance matching: {}", describe(&filter)))
                }
                Err(e) => return super::back(&guard, &list, Err(e.message)),
            }
        } else {
            (selected.len() as u64, "the selected instances".to_owned())
        };
        let csrf = guard.csrf(&headers).unwrap_or_default();
        let body = html! {
            div.confirm role="alertdialog" aria-labelledby="confirm-title" {
                h1 #confirm-title { (verb) " " (count) " instance" @if count != 1 { "s" } "?" }
                p { "This acts on " (what) "." }
                @if !everything {
                    ul.selected { @for t in &selected { li { code { (t.workflow) "/" (t.id) } } } }
                }
                @if action == Action::Delete { p.flash.error { "Deleted instances cannot be recovered." } }
                form method="post" action="/instances/bulk" {
                    @for (k, v) in &form {
                        @if k != "confirmed" && k != "start" { input type="hidden" name=(k) value=(v); }
                    }
                    @if let Some(start) = &start { input type="hidden" name="start" value=(start); }
                    input type="hidden" name="confirmed" value="1";
                    button.danger type="submit" autofocus { (verb) " " (count) }
                    " "
                    a href=(list) { "Cancel" }
                }
            }
        };
        return super::html(
            StatusCode::OK,
            layout::page(
                &Shell {
                    title: "Confirm",
                    section: "instances",
                    csrf: &csrf,
                    logged_in: guard.has_session(&headers),
                },
                body,
            ),
        );
    }
    let mut tally = Tally::default();
    if everything {
        let Some(start) = value(&form, "start").map(str::to_owned) else {
            // Nothing matched at the confirmation.
            return super::back(&guard, &list, summary(verb, &tally));
        };
        let mut cursor = Some(start);
        loop {
            match crate::bulk::act_on_filter(
                &engine,
                action,
                rollback,
                &filter,
                cursor,
                BULK_PAGE,
                "dashboard",
            )
            .await
            {
                Ok((page, next)) => {
                    page.iter().for_each(|o| tally.add(o));
                    match next {
                        Some(next) => cursor = Some(next),
                        None => break,
                    }
                }
                Err(e) => {
                    return super::back(
                        &guard,
                        &list,
                        Err(format!(
                            "Stopped after {} instances: {}",
                            tally.done + tally.failed,
                            e.message
                        )),
                    );
                }
            }
        }
    } else {
        for target in &selected {
            tally.add(&crate::bulk::act(&engine, action, rollback, target, "dashboard").await);
        }
    }
    super::back(&guard, &list, summary(verb, &tally))
}

/// How a bulk action went: counts, and the first failures in words (a run over 100,000
/// instances keeps no more than that).
#[derive(Default)]
struct Tally {
    done: usize,
    failed: usize,
    first_failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome) {
        match &outcome.result {
            Ok(()) => self.done += 1,
            Err(e) => {
                self.failed += 1;
                if self.first_failures.len() < 5 {
                    self.first_failures.push(format!(
                        "{}/{}: {}",
                        outcome.target.workflow, outcome.target.id, e.message
                    ));
                }
            }
        }
    }
}

/// The outcome of a bulk action in words: how many worked, and the first failures.
fn summary(verb: &str, tally: &Tally) -> Result<String, String> {
    let total = tally.done + tally.failed;
    if tally.failed == 0 {
        return Ok(format!(
            "{verb}: done for {} of {total} instances.",
            tally.done
        ));
    }
    let more = if tally.failed > tally.first_failures.len() {
        format!(" (and {} more)", tally.failed - tally.first_failures.len())
    } else {
        String::new()
    };
    Err(format!(
        "{verb}: done for {} of {total}; {} failed — {}{more}",
        tally.done,
        tally.failed,
        tally.first_failures.join("; ")
    ))
}
