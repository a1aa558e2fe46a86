//! The instance page's timeline (a Gantt chart): one lane per step, sleep, wait and
//! rollback handler, in start order; a step's attempts as segments (failed ones marked,
//! their error on hover, focus or click) with the retry delays between them; pauses and
//! the rollback phase as bands across every lane. Built from the event log alone, so it
//! shows exactly what was recorded, and drawn as positioned HTML (it reflows to any width).

use cairn::{LogKind, LogRecord, StepKey, StepKind, Timestamp};
use maud::{Markup, html};

/// One lane of the chart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Lane {
    /// `step`, `sleep`, `waitForEvent`, `invoke` or `rollback`.
    pub(crate) kind: &'static str,
    pub(crate) key: StepKey,
    pub(crate) start: Timestamp,
    pub(crate) end: Option<Timestamp>,
    /// `Some(true)` succeeded, `Some(false)` failed (or timed out), `None` in progress.
    pub(crate) ok: Option<bool>,
    pub(crate) segments: Vec<Segment>,
}

/// A part of a lane.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Segment {
    /// `Some(n)` for attempt `n`, `None` for the wait before a retry.
    pub(crate) attempt: Option<u32>,
    pub(crate) start: Timestamp,
    pub(crate) end: Option<Timestamp>,
    pub(crate) ok: Option<bool>,
    pub(crate) error: Option<String>,
}

/// A span across every lane: `paused` or `rollback`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Band {
    pub(crate) kind: &'static str,
    pub(crate) start: Timestamp,
    pub(crate) end: Option<Timestamp>,
}

/// The chart's content.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Timeline {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) bands: Vec<Band>,
    /// The newest lane of each step (and whether it is a rollback handler's): building
    /// stays linear in the log, however many steps an instance has.
    newest: std::collections::HashMap<(StepKey, bool), usize>,
}

fn attempt_number(r: &LogRecord) -> u32 {
    r.entry
        .meta
        .get("attempt")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

fn error_text(r: &LogRecord) -> Option<String> {
    let e = r.entry.meta.get("error")?;
    let name = e.get("name").and_then(|v| v.as_str()).unwrap_or("Error");
    let message = e.get("message").and_then(|v| v.as_str()).unwrap_or("");
    Some(super::layout::clip(&format!("{name}: {message}"), 300))
}

impl Timeline {
    /// The timeline of an event log, oldest record first.
    pub(crate) fn build(log: &[LogRecord]) -> Timeline {
        let mut t = Timeline::default();
        for r in log {
            let at = r.entry.at;
            let step = r.entry.step.as_ref();
            match r.entry.kind {
                LogKind::StepStart
                | LogKind::SleepStart
                | LogKind::WaitStart
                | LogKind::ChildStart => {
                    if let Some(key) = step {
                        let kind = match key.kind {
                            StepKind::Sleep => "sleep",
                            StepKind::WaitForEvent => "waitForEvent",
                            StepKind::Invoke => "invoke",
                            _ => "step",
                        };
                        t.open(kind, key, at);
                    }
                }
                LogKind::RollbackStepStart => {
                    if let Some(key) = step {
                        t.open("rollback", key, at);
                    }
                }
                // A sleep or wait that lost a race ends with its usual record, marked
                // `cancelled`: not a success.
                LogKind::SleepComplete | LogKind::WaitComplete
                    if r.entry.meta.get("cancelled") == Some(&serde_json::Value::Bool(true)) =>
                {
                    t.close(step, at, false, r.entry.kind);
                }
                LogKind::StepSuccess
                | LogKind::SleepComplete
                | LogKind::WaitComplete
                | LogKind::ChildComplete
                | LogKind::RollbackStepSuccess => t.close(step, at, true, r.entry.kind),
                LogKind::StepFailure
                | LogKind::WaitTimedOut
                | LogKind::ChildFailure
                | LogKind::RollbackStepFailure => {
                    t.close(step, at, false, r.entry.kind);
                }
                LogKind::AttemptStart | LogKind::RollbackAttemptStart => {
                    let rollback = r.entry.kind == LogKind::RollbackAttemptStart;
                    if let Some(lane) = t.lane(step, rollback) {
                        if let Some(end) =
                            lane.segments.last().and_then(|p| p.end).filter(|e| *e < at)
                        {
                            lane.segments.push(Segment {
                                attempt: None,
                                start: end,
                                end: Some(at),
                                ok: None,
                                error: None,
                            });
                        }
                        lane.segments.push(Segment {
                            attempt: Some(attempt_number(r)),
                            start: at,
                            end: None,
                            ok: None,
                            error: None,
                        });
                    }
                }
                LogKind::AttemptSuccess
                | LogKind::AttemptFailure
                | LogKind::RollbackAttemptSuccess
                | LogKind::RollbackAttemptFailure => {
                    let rollback = matches!(
                        r.entry.kind,
                        LogKind::RollbackAttemptSuccess | LogKind::RollbackAttemptFailure
                    );
                    let ok = matches!(
                        r.entry.kind,
                        LogKind::AttemptSuccess | LogKind::RollbackAttemptSuccess
                    );
                    let n = attempt_number(r);
                    if let Some(seg) = t.lane(step, rollback).and_then(|lane| {
                        lane.segments
                            .iter_mut()
                            .rev()
                            .find(|s| s.attempt == Some(n) && s.end.is_none())
                    }) {
                        seg.end = Some(at);
                        seg.ok = Some(ok);
                        seg.error = if ok { None } else { error_text(r) };
                    }
                }
                LogKind::WorkflowPaused => t.bands.push(Band {
                    kind: "paused",
                    start: at,
                    end: None,
                }),
                LogKind::WorkflowResumed => t.end_band("paused", at),
                LogKind::RollbackStart => t.bands.push(Band {
                    kind: "rollback",
                    start: at,
                    end: None,
                }),
                LogKind::RollbackComplete | LogKind::RollbackFailed => t.end_band("rollback", at),
                _ => {}
            }
        }
        t
    }

    fn open(&mut self, kind: &'static str, key: &StepKey, at: Timestamp) {
        let rollback = kind == "rollback";
        let open = self
            .newest
            .get(&(key.clone(), rollback))
            .is_some_and(|&i| self.lanes[i].kind == kind && self.lanes[i].end.is_none());
        if !open {
            self.newest
                .insert((key.clone(), rollback), self.lanes.len());
            self.lanes.push(Lane {
                kind,
                key: key.clone(),
                start: at,
                end: None,
                ok: None,
                segments: Vec::new(),
            });
        }
    }

    fn lane(&mut self, step: Option<&StepKey>, rollback: bool) -> Option<&mut Lane> {
        let i = *self.newest.get(&(step?.clone(), rollback))?;
        self.lanes.get_mut(i)
    }

    fn close(&mut self, step: Option<&StepKey>, at: Timestamp, ok: bool, kind: LogKind) {
        let rollback = matches!(
            kind,
            LogKind::RollbackStepSuccess | LogKind::RollbackStepFailure
        );
        if let Some(lane) = self.lane(step, rollback).filter(|l| l.end.is_none()) {
            lane.end = Some(at);
            lane.ok = Some(ok);
        }
    }

    fn end_band(&mut self, kind: &str, at: Timestamp) {
        if let Some(b) = self
            .bands
            .iter_mut()
            .rev()
            .find(|b| b.kind == kind && b.end.is_none())
        {
            b.end = Some(at);
        }
    }
}

/// The most lanes drawn: a chart of thousands of steps would be unreadable and heavy.
const MAX_LANES: usize = 300;

/// The lane's name as users name steps: `name`, `name #2` when the name repeats.
fn label(lane: &Lane) -> String {
    let name = if lane.key.count > 1 {
        format!("{} #{}", lane.key.name, lane.key.count)
    } else {
        lane.key.name.clone()
    };
    if lane.kind == "rollback" {
        format!("↩ {name}")
    } else {
        name
    }
}

/// The chart from `start` (the instance's creation) to `end` (its end, or now).
pub(crate) fn render(t: &Timeline, start: Timestamp, end: Timestamp) -> Markup {
    let span = (end.as_millis() - start.as_millis()).max(1) as f64;
    let pos = |at: Timestamp| {
        ((at.as_millis() - start.as_millis()) as f64 / span * 100.0).clamp(0.0, 100.0)
    };
    let place = |from: Timestamp, to: Option<Timestamp>| {
        let left = pos(from);
        let right = pos(to.unwrap_or(end));
        format!("left:{left:.3}%;width:{:.3}%", (right - left).max(0.25))
    };
    let took = |from: Timestamp, to: Option<Timestamp>| {
        to.map_or_else(
            || "still running".to_owned(),
            |to| super::layout::duration(to.since(from)),
        )
    };
    html! {
        div.timeline data-live="timeline" {
            @if t.lanes.is_empty() {
                p.empty { "No steps yet." }
            } @else {
                div.axis aria-hidden="true" {
                    span { (super::layout::time(start)) }
                    span { (super::layout::duration(end.since(start))) }
                    span { (super::layout::time(end)) }
                }
                div.lanes role="list" aria-label="Steps over time" {
                    // Bands are placed in a box over the tracks only (the label column
                    // excluded), so their percentages are of the same width as the bars'.
                    div.bands aria-hidden="true" {
                        @for b in &t.bands {
                            div class=(format!("band b-{}", b.kind)) style=(place(b.start, b.end))
                                title=(format!("{} from {}{}", if b.kind == "paused" { "Paused" } else { "Rollback" }, b.start, b.end.map(|e| format!(" to {e}")).unwrap_or_else(|| " on".into()))) {}
                        }
                    }
                    @for lane in t.lanes.iter().take(MAX_LANES) {
                        @let state = match lane.ok { Some(true) => "ok", Some(false) => "failed", None => "running" };
                        div.lane role="listitem" data-kind=(lane.kind) data-step=(lane.key.name) data-count=(lane.key.count) data-state=(state) {
                            span.label title=(format!("{} ({}): {}", label(lane), lane.kind, took(lane.start, lane.end))) { (label(lane)) }
                            div.track {
                                span class=(format!("bar k-{} {state}", lane.kind)) style=(place(lane.start, lane.end))
                                    title=(format!("{} {}: {}", lane.kind, label(lane), took(lane.start, lane.end))) {}
                                @for s in &lane.segments {
                                    @match s.attempt {
                                        Some(n) => {
                                            @let st = match s.ok { Some(true) => "ok", Some(false) => "failed", None => "running" };
                                            @let detail = format!("Attempt {n} of {}: {}{}", label(lane),
                                                match s.ok { Some(true) => format!("succeeded in {}", took(s.start, s.end)), Some(false) => format!("failed after {}", took(s.start, s.end)), None => "running".into() },
                                                s.error.as_deref().map(|e| format!(" — {e}")).unwrap_or_default());
                                            button type="button" class=(format!("seg attempt {st}")) data-attempt=(n) style=(place(s.start, s.end))
                                                title=(detail) data-detail=(detail) aria-label=(detail) {}
                                        }
                                        None => {
                                            span.seg.backoff style=(place(s.start, s.end))
                                                title=(format!("Retry delay: {}", took(s.start, s.end))) {}
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if t.lanes.len() > MAX_LANES {
                    p.muted.small { "The first " (MAX_LANES) " of " (t.lanes.len()) " steps are drawn; the table below lists them all." }
                }
                p #seg-detail.muted aria-live="polite" { "Hover or select an attempt to see how it went." }
                ul.legend aria-hidden="true" {
                    li { span.sw.k-step {} "step" }
                    li { span.sw.ok {} "attempt" }
                    li { span.sw.failed {} "failed attempt" }
                    li { span.sw.backoff {} "retry delay" }
                    li { span.sw.k-sleep {} "sleep" }
                    li { span.sw.k-waitForEvent {} "event wait" }
                    li { span.sw.k-invoke {} "child workflow" }
                    li { span.sw.b-rollback {} "rollback" }
                    li { span.sw.b-paused {} "paused" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cairn::{LogEntry, LogKind, LogRecord, StepKey, StepKind, Timestamp};
    use serde_json::json;

    use super::Timeline;

    fn rec(
        id: u64,
        ms: i64,
        kind: LogKind,
        step: Option<(&str, StepKind)>,
        meta: serde_json::Value,
    ) -> LogRecord {
        LogRecord {
            id,
            entry: LogEntry {
                kind,
                at: Timestamp::from_millis(ms),
                step: step.map(|(name, kind)| StepKey {
                    kind,
                    name: name.into(),
                    count: 1,
                }),
                meta,
            },
        }
    }

    #[test]
    fn attempts_retry_delays_pauses_and_the_rollback_are_laid_out() {
        let charge = Some(("charge", StepKind::Run));
        let nap = Some(("nap", StepKind::Sleep));
        let log = vec![
            rec(1, 0, LogKind::WorkflowQueued, None, json!({})),
            rec(2, 10, LogKind::StepStart, charge, json!({})),
            rec(3, 10, LogKind::AttemptStart, charge, json!({"attempt": 1})),
            rec(
                4,
                20,
                LogKind::AttemptFailure,
                charge,
                json!({"attempt": 1, "error": {"name": "Error", "message": "card timeout"}}),
            ),
            rec(5, 120, LogKind::AttemptStart, charge, json!({"attempt": 2})),
            rec(
                6,
                130,
                LogKind::AttemptSuccess,
                charge,
                json!({"attempt": 2}),
            ),
            rec(7, 130, LogKind::StepSuccess, charge, json!({})),
            rec(8, 140, LogKind::WorkflowPaused, None, json!({})),
            rec(9, 150, LogKind::WorkflowResumed, None, json!({})),
            rec(10, 160, LogKind::SleepStart, nap, json!({})),
            rec(11, 200, LogKind::SleepComplete, nap, json!({})),
            rec(12, 210, LogKind::RollbackStart, None, json!({})),
            rec(13, 210, LogKind::RollbackStepStart, charge, json!({})),
            rec(
                14,
                210,
                LogKind::RollbackAttemptStart,
                charge,
                json!({"attempt": 1}),
            ),
            rec(
                15,
                220,
                LogKind::RollbackAttemptSuccess,
                charge,
                json!({"attempt": 1}),
            ),
            rec(16, 220, LogKind::RollbackStepSuccess, charge, json!({})),
            rec(17, 220, LogKind::RollbackComplete, None, json!({})),
        ];
        let t = Timeline::build(&log);
        assert_eq!(t.newest.len(), 3);
        let kinds: Vec<_> = t.lanes.iter().map(|l| l.kind).collect();
        assert_eq!(kinds, ["step", "sleep", "rollback"]);
        let charge = &t.lanes[0];
        assert_eq!(charge.ok, Some(true));
        let segs: Vec<_> = charge.segments.iter().map(|s| (s.attempt, s.ok)).collect();
        assert_eq!(
            segs,
            [(Some(1), Some(false)), (None, None), (Some(2), Some(true))]
        );
        assert_eq!(
            charge.segments[0].error.as_deref(),
            Some("Error: card timeout")
        );
        assert_eq!(t.lanes[2].segments.len(), 1);
        let bands: Vec<_> = t.bands.iter().map(|b| (b.kind, b.end.is_some())).collect();
        assert_eq!(bands, [("paused", true), ("rollback", true)]);
        let html =
            super::render(&t, Timestamp::from_millis(0), Timestamp::from_millis(220)).into_string();
        assert_eq!(html.matches("class=\"lane\"").count(), 3);
        assert!(html.contains("card timeout"));
    }

    /// Review finding: a sleep or wait that lost a race (its end record marked
    /// `cancelled`) was drawn as a success.
    #[test]
    fn a_cancelled_sleep_or_wait_is_no_success() {
        let nap = Some(("nap", StepKind::Sleep));
        let ack = Some(("ack", StepKind::WaitForEvent));
        let cancelled =
            json!({"cancelled": true, "error": {"name": "StepCancelled", "message": "lost"}});
        let log = vec![
            rec(1, 0, LogKind::SleepStart, nap, json!({})),
            rec(2, 0, LogKind::WaitStart, ack, json!({})),
            rec(3, 10, LogKind::WaitComplete, ack, json!({"type": "ack"})),
            rec(4, 10, LogKind::SleepComplete, nap, cancelled),
        ];
        let t = Timeline::build(&log);
        let ok: Vec<_> = t.lanes.iter().map(|l| (l.kind, l.ok)).collect();
        assert_eq!(ok, [("sleep", Some(false)), ("waitForEvent", Some(true))]);
    }
}
