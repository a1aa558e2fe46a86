//! `/`: every registered workflow with its instance counts by status and charts of the
//! last hour (instances per minute; step attempts and failures per minute).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use cairn::telemetry::{ActivityMinute, MinuteCounts};
use cairn::{Engine, InstanceStatus, WorkflowName};
use maud::{Markup, html};

use super::Guard;
use super::layout::{self, Shell};

/// The minutes a chart shows.
const MINUTES: i64 = 60;

pub(crate) async fn page(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let pairs = super::pairs(query.as_deref());
    let csrf = guard.csrf(&headers).unwrap_or_default();
    let now = engine.clock().now();
    let this_minute = now.as_millis().div_euclid(60_000) * 60_000;
    let first = cairn::Timestamp::from_millis(this_minute - (MINUTES - 1) * 60_000);
    let activity = engine.activity(first);
    let mut cards = Vec::new();
    let mut total = 0u64;
    for name in engine.workflow_names() {
        let counts = match engine.workflow_by_name(name.as_str()) {
            Ok(w) => crate::actions::counts(&w).await,
            Err(e) => Err(e.into()),
        };
        match counts {
            Ok(counts) => {
                let counts: Vec<(InstanceStatus, u64)> = InstanceStatus::ALL
                    .into_iter()
                    .map(|s| {
                        (
                            s,
                            counts.get(s.as_str()).and_then(|v| v.as_u64()).unwrap_or(0),
                        )
                    })
                    .collect();
                total += counts.iter().map(|(_, n)| n).sum::<u64>();
                let versions = engine
                    .workflow_versions(name.as_str())
                    .await
                    .unwrap_or_default();
                cards.push(card(&name, &counts, &versions, &activity, first));
            }
            Err(e) => cards.push(html! {
                section.card { h2 { (name.as_str()) } p.flash.error { (e.message) } }
            }),
        }
    }
    let example = engine
        .workflow_names()
        .first()
        .map_or("greet", |w| w.as_str())
        .to_owned();
    let body = html! {
        div.heading {
            h1 { "Workflows" }
            p.muted { (engine.workflow_names().len()) " registered · " (total) " instances stored" }
        }
        (layout::flash(&guard, &pairs))
        @if total == 0 {
            p.empty {
                "No instances yet — trigger one with "
                code { "cairn workflows trigger " (example) }
                " or " code { "curl -X POST localhost:8787/api/workflows/" (example) "/instances" } "."
            }
        }
        div.cards data-live="overview" { @for c in &cards { (c) } }
        p.muted.small {
            "Charts: the last hour of this server's activity, per minute (kept in memory since it started). "
            "Counts: every instance stored."
        }
        (schedules(&engine, &csrf).await)
    };
    super::html(
        StatusCode::OK,
        layout::page(
            &Shell {
                title: "Workflows",
                section: "overview",
                csrf: &csrf,
                logged_in: guard.has_session(&headers),
            },
            body,
        ),
    )
}

/// The cron schedules: expression, zone, last tick fired (a link to its run), next tick,
/// and a button to start a run now.
async fn schedules(engine: &Engine, csrf: &str) -> Markup {
    let mut rows = Vec::new();
    let listed = match engine.list_schedules().await {
        Ok(listed) => listed,
        Err(e) => {
            return html! { p.flash.error { "The schedules could not be read: " (e.to_string()) } };
        }
    };
    for entry in &listed {
        let ticks = engine.ticks_of(&entry.schedule).await;
        rows.push((&entry.schedule, entry.paused, ticks));
    }
    html! {
        @if !rows.is_empty() {
            section.schedules aria-labelledby="schedules-title" {
                h2 #schedules-title { "Schedules" }
                div.tablewrap { table {
                    thead { tr { th { "Schedule" } th { "Workflow" } th { "Cron" } th.wide { "Last tick" } th { "Next tick" } th { span.muted { "Actions" } } } }
                    tbody {
                        @for (s, paused, ticks) in &rows {
                            tr data-schedule=(s.name()) data-paused=(paused) {
                                td { (s.name()) }
                                td { a href=(format!("/instances?workflow={}&id={}-", super::encode_segment(s.workflow()), super::encode_segment(s.name()))) { (s.workflow()) } }
                                td { code { (s.expression()) } " " span.muted { (s.zone()) } }
                                @match ticks {
                                    Ok((last, next)) => {
                                        td.wide {
                                            @match last {
                                                Some(t) => a href=(super::instance_path(s.workflow(), &s.tick_id(*t))) { (layout::time(*t)) },
                                                None => span.muted { "not yet" },
                                            }
                                        }
                                        td { @if *paused { span.muted { "paused" } } @else { (layout::maybe_time(*next)) } }
                                    }
                                    Err(e) => td colspan="2" { span.failed { (e.to_string()) } },
                                }
                                td {
                                    @if crate::auth::may(crate::auth::Scope::Admin) {
                                    form.inline method="post" action=(format!("/schedules/{}/trigger", super::encode_segment(s.name()))) {
                                        input type="hidden" name="csrf" value=(csrf);
                                        button type="submit" { "Trigger" }
                                    }
                                    " "
                                    @let (verb, label) = if *paused { ("resume", "Resume") } else { ("pause", "Pause") };
                                    form.inline method="post" action=(format!("/schedules/{}/{verb}", super::encode_segment(s.name()))) {
                                        input type="hidden" name="csrf" value=(csrf);
                                        button type="submit" value=(verb) { (label) }
                                    }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}

/// `POST /schedules/{name}/trigger`: a run of the schedule now; answered by its page.
pub(crate) async fn trigger(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = super::guard::posted_form(&guard, &headers, &body) {
        return refused;
    }
    if let Err(refused) = super::allowed(&guard, "/", crate::auth::Scope::Admin) {
        return refused;
    }
    let triggered = engine.trigger_schedule(&name).await;
    crate::audit::control(
        "dashboard",
        "trigger schedule",
        &name,
        &triggered.as_ref().map(drop),
    );
    match triggered {
        Ok(instance) => super::back(
            &guard,
            &super::instance_path(instance.workflow().as_str(), instance.id().as_str()),
            Ok(format!("Started a run of schedule \"{name}\".")),
        ),
        Err(e) => super::back(&guard, "/", Err(e.to_string())),
    }
}

/// `POST /schedules/{name}/pause` and `…/resume`; answered by the overview.
pub(crate) async fn pause_or_resume(
    State(engine): State<Engine>,
    Extension(guard): Extension<Arc<Guard>>,
    headers: HeaderMap,
    axum::extract::Path((name, verb)): axum::extract::Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = super::guard::posted_form(&guard, &headers, &body) {
        return refused;
    }
    if let Err(refused) = super::allowed(&guard, "/", crate::auth::Scope::Admin) {
        return refused;
    }
    let done = match verb.as_str() {
        "pause" => engine.pause_schedule(&name).await.map(|()| "Paused"),
        "resume" => engine.resume_schedule(&name).await.map(|()| "Resumed"),
        _ => return super::back(&guard, "/", Err(format!("unknown action {verb:?}"))),
    };
    crate::audit::control(
        "dashboard",
        &format!("{verb} schedule"),
        &name,
        &done.as_ref().map(drop),
    );
    match done {
        Ok(done) => super::back(&guard, "/", Ok(format!("{done} schedule \"{name}\"."))),
        Err(e) => super::back(&guard, "/", Err(e.to_string())),
    }
}

fn card(
    name: &WorkflowName,
    counts: &[(InstanceStatus, u64)],
    versions: &[cairn::VersionInfo],
    activity: &[ActivityMinute],
    first: cairn::Timestamp,
) -> Markup {
    let list = format!(
        "/instances?workflow={}",
        super::encode_segment(name.as_str())
    );
    let per_minute: Vec<(cairn::Timestamp, MinuteCounts)> = (0..MINUTES)
        .map(|i| {
            let minute = cairn::Timestamp::from_millis(first.as_millis() + i * 60_000);
            let counts = activity
                .iter()
                .find(|m| m.minute == minute)
                .and_then(|m| m.workflows.get(name))
                .copied()
                .unwrap_or_default();
            (minute, counts)
        })
        .collect();
    let hour: MinuteCounts = per_minute
        .iter()
        .fold(MinuteCounts::default(), |mut a, (_, c)| {
            a.started += c.started;
            a.completed += c.completed;
            a.errored += c.errored + c.terminated;
            a.attempts += c.attempts;
            a.failed_attempts += c.failed_attempts;
            a
        });
    html! {
        section.card data-workflow=(name.as_str()) {
            h2 { a href=(list) { (name.as_str()) } }
            // A workflow run by workers: its versions, and which have workers now.
            @if !versions.is_empty() {
                p.versions.muted.small {
                    "on workers · "
                    @for (i, v) in versions.iter().rev().enumerate() {
                        @if i > 0 { " · " }
                        span data-version=(v.version) {
                            "version " code { (v.version) }
                            @if v.newest { " (new instances)" }
                            ": " (v.workers) @if v.workers == 1 { " worker" } @else { " workers" }
                            @if v.unfinished > 0 { ", " (v.unfinished) " unfinished" }
                        }
                    }
                }
            }
            ul.counts {
                @for (status, n) in counts {
                    li {
                        a href=(format!("{list}&status={}", status.as_str())) {
                            (layout::status(*status)) " " span.n data-status=(status.as_str()) { (n) }
                        }
                    }
                }
            }
            figure {
                figcaption {
                    "Instances per minute · last hour: "
                    span.k-started { (hour.started) " started" } ", "
                    span.k-completed { (hour.completed) " completed" } ", "
                    span.k-errored { (hour.errored) " errored or terminated" }
                }
                (chart(&per_minute, &[
                    ("started", |c: &MinuteCounts| c.started),
                    ("completed", |c: &MinuteCounts| c.completed),
                    ("errored", |c: &MinuteCounts| c.errored + c.terminated),
                ]))
            }
            figure {
                figcaption {
                    "Step attempts per minute: "
                    span.k-attempts { (hour.attempts) " attempts" } ", "
                    span.k-failed { (hour.failed_attempts) " failed" }
                }
                (chart(&per_minute, &[
                    ("attempts", |c: &MinuteCounts| c.attempts),
                    ("failed", |c: &MinuteCounts| c.failed_attempts),
                ]))
            }
        }
    }
}

/// A chart's series: its name (a CSS class `k-…`) and its value in a minute.
type Series = (&'static str, fn(&MinuteCounts) -> u64);

/// A bar chart of one minute per slot: each series a bar side by side within the minute,
/// scaled to the largest value; each minute's numbers on hover.
fn chart(minutes: &[(cairn::Timestamp, MinuteCounts)], series: &[Series]) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 80.0;
    let max = minutes
        .iter()
        .flat_map(|(_, c)| series.iter().map(move |(_, f)| f(c)))
        .max()
        .unwrap_or(0)
        .max(1);
    let slot = W / minutes.len().max(1) as f64;
    let bar = (slot - 1.0) / series.len() as f64;
    let label = series
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ");
    html! {
        svg.chart viewBox=(format!("0 0 {W} {}", H + 14.0)) role="img"
            aria-label=(format!("{label} per minute over the last hour, at most {max} in a minute")) {
            line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
            @for (i, (minute, counts)) in minutes.iter().enumerate() {
                g {
                    title {
                        (minute.to_rfc3339()) ": "
                        (series.iter().map(|(n, f)| format!("{} {n}", f(counts))).collect::<Vec<_>>().join(", "))
                    }
                    rect.hit x=(format!("{:.1}", i as f64 * slot)) y="0" width=(format!("{slot:.1}")) height=(H) {}
                    @for (j, (name, f)) in series.iter().enumerate() {
                        @let v = f(counts);
                        @if v > 0 {
                            @let h = (v as f64 / max as f64 * (H - 4.0)).max(1.5);
                            rect class=(format!("col k-{name}"))
                                x=(format!("{:.1}", i as f64 * slot + j as f64 * bar))
                                y=(format!("{:.1}", H - h))
                                width=(format!("{:.1}", bar.max(1.0)))
                                height=(format!("{h:.1}")) {}
                        }
                    }
                }
            }
            text.tick x="0" y=(H + 12.0) { "−60 min" }
            text.tick x=(W) y=(H + 12.0) text-anchor="end" { "now" }
            text.tick x=(W) y="10" text-anchor="end" { (max) }
        }
    }
}
