//! The engine's spans, captured by a test subscriber: one `workflow.run` per lifetime, a
//! span per durable op with its attempts under it, and no span for work answered from the
//! journal (a replay after hibernation reports no attempt twice).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::prelude::*;
use serde_json::{Value, json};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use super::support::{FnWorkflow, engine};

/// A span as the subscriber saw it; `serial` is unique (the registry reuses ids).
#[derive(Debug, Clone)]
struct Captured {
    serial: u64,
    name: &'static str,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Captured>>>,
    next: Arc<AtomicU64>,
}

struct Serial(u64);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let serial = self.next.fetch_add(1, Ordering::SeqCst);
        let Some(span) = ctx.span(id) else { return };
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Serial>().map(|s| s.0));
        span.extensions_mut().insert(Serial(serial));
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.spans.lock().unwrap().push(Captured {
            serial,
            name: attrs.metadata().name(),
            parent,
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(serial) = ctx
            .span(id)
            .and_then(|s| s.extensions().get::<Serial>().map(|s| s.0))
        else {
            return;
        };
        let mut spans = self.spans.lock().unwrap();
        if let Some(span) = spans.iter_mut().find(|s| s.serial == serial) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn spans_of_an_instance_that_retries_hibernates_and_completes_report_each_attempt_once() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    // With a single registered dispatcher, tracing caches a callsite's interest from the
    // default of whichever thread hits it first: another test's thread (no subscriber)
    // would switch this test's spans off for good. A second live dispatcher, registered
    // before this test's own, makes the interest the union of all of them, decided per
    // thread when the span is created.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    // This test's thread only: the engine's tasks run on it (current-thread runtime).
    let _guard = tracing::subscriber::set_default(subscriber);

    let (engine, _dir) = engine(|b| {
        b.register(super::support::wf(|_, step| async move {
            let retry = StepConfig {
                // Ten seconds of back-off: the instance hibernates through it.
                retries: Some(Retries::constant(2, Duration::from_secs(10))),
                ..StepConfig::default()
            };
            step.run("flaky", |ctx| async move {
                if ctx.attempt == 1 {
                    Err::<u32, _>("not yet".into())
                } else {
                    Ok(ctx.attempt)
                }
            })
            .config(&retry)
            .await?;
            step.sleep("nap", "1 hour").await?;
            step.run("after", |_| async { Ok(7) }).await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = engine
        .workflow::<FnWorkflow<0>>()
        .create(cairn::CreateOptions::new(json!({})).id("traced"))
        .await
        .unwrap();
    instance.wait().await.unwrap();
    engine.shutdown().await;

    let spans = capture.spans.lock().unwrap().clone();
    let named = |name: &str| {
        spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect::<Vec<_>>()
    };
    let runs = named("workflow.run");
    // Three lifetimes: until the back-off, until the sleep, to the end.
    assert_eq!(runs.len(), 3, "{runs:#?}");
    for run in &runs {
        assert_eq!(run.fields["workflow.name"], "test");
        assert_eq!(run.fields["workflow.id"], "traced");
        assert_eq!(run.parent, None);
    }
    assert_eq!(
        runs.iter()
            .map(|r| r.fields["resumed"].as_str())
            .collect::<Vec<_>>(),
        ["false", "true", "true"]
    );
    let run_serials: Vec<u64> = runs.iter().map(|r| r.serial).collect();

    // Every op span hangs under a lifetime's span, every attempt under its step's span.
    let steps = named("step.do");
    for op in steps.iter().chain(&named("step.sleep")) {
        assert!(
            op.parent.is_some_and(|p| run_serials.contains(&p)),
            "{op:?} is not under a workflow.run span"
        );
    }
    let attempts = named("step.attempt");
    let attempts_of = |step: &str| {
        let serials: Vec<u64> = steps
            .iter()
            .filter(|s| s.fields["step.name"] == step)
            .map(|s| s.serial)
            .collect();
        attempts
            .iter()
            .filter(|a| a.parent.is_some_and(|p| serials.contains(&p)))
            .map(|a| (a.fields["attempt"].clone(), a.fields["outcome"].clone()))
            .collect::<Vec<_>>()
    };
    // Attempt 1 failed in the first lifetime, attempt 2 succeeded in the second; the third
    // lifetime replays `flaky` from the journal and reports neither again.
    assert_eq!(
        attempts_of("flaky"),
        [("1".into(), "error".into()), ("2".into(), "success".into())]
    );
    assert_eq!(attempts_of("after"), [("1".into(), "success".into())]);
    assert_eq!(
        attempts.len(),
        3,
        "no attempt outside a step: {attempts:#?}"
    );
    // `flaky` has a span in the two lifetimes that worked on it, `after` in the last only.
    let lifetimes_of = |step: &str| {
        steps
            .iter()
            .filter(|s| s.fields["step.name"] == step)
            .map(|s| {
                run_serials
                    .iter()
                    .position(|r| Some(*r) == s.parent)
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(lifetimes_of("flaky"), [0, 1]);
    assert_eq!(lifetimes_of("after"), [2]);
    let flaky_outcomes: Vec<&str> = steps
        .iter()
        .filter(|s| s.fields["step.name"] == "flaky")
        .map(|s| s.fields.get("outcome").map_or("(none)", String::as_str))
        .collect();
    // The first lifetime let go in the back-off: its step span ends without an outcome.
    assert_eq!(flaky_outcomes, ["(none)", "success"]);
    // The sleep: begun in the second lifetime, finished in the third.
    let sleeps = named("step.sleep");
    assert_eq!(sleeps.len(), 2, "{sleeps:#?}");
    assert!(sleeps.iter().all(|s| s.fields["step.name"] == "nap"));
}

#[tokio::test(start_paused = true)]
async fn spans_of_an_event_wait_a_failing_step_and_its_rollback() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    // See the first test: keeps callsite interest per thread.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _guard = tracing::subscriber::set_default(subscriber);

    let (engine, _dir) = engine(|b| {
        b.register(super::support::wf(|_, step| async move {
            step.run("reserve", |_| async { Ok(1u32) })
                .rollback(|_: Rollback<u32>| async { Ok(()) })
                .await?;
            let _: StepEvent<Value> = step.wait_for_event("approval", "approved").await?;
            let no_retry = StepConfig {
                retries: Some(Retries::none()),
                ..StepConfig::default()
            };
            step.run("charge", |_| async { Err::<u32, _>("declined".into()) })
                .config(&no_retry)
                .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = engine
        .workflow::<FnWorkflow<0>>()
        .create(cairn::CreateOptions::new(json!({})).id("saga"))
        .await
        .unwrap();
    instance
        .send_event("approved", &json!({"by": "ada"}))
        .await
        .unwrap();
    let _ = instance.wait().await;
    engine.shutdown().await;

    let spans = capture.spans.lock().unwrap().clone();
    let one = |name: &str, step: &str| {
        let found: Vec<Captured> = spans
            .iter()
            .filter(|s| {
                s.name == name && s.fields.get("step.name").map(String::as_str) == Some(step)
            })
            .cloned()
            .collect();
        assert_eq!(found.len(), 1, "{name} {step}: {spans:#?}");
        found.into_iter().next().unwrap()
    };
    let wait = one("step.wait_for_event", "approval");
    assert_eq!(wait.fields["event_type"], "approved");
    assert_eq!(wait.fields["outcome"], "received");
    let charge = one("step.do", "charge");
    assert_eq!(charge.fields["outcome"], "error");
    assert_eq!(charge.fields["otel.status_code"], "ERROR");
    let attempt = spans
        .iter()
        .find(|s| s.name == "step.attempt" && s.parent == Some(charge.serial))
        .unwrap();
    assert_eq!(attempt.fields["outcome"], "error");
    // The compensation of `reserve`, with its attempt under it, in the same lifetime.
    let rollback = one("step.rollback", "reserve");
    assert_eq!(rollback.fields["outcome"], "success");
    assert_eq!(
        rollback.parent, charge.parent,
        "both under the one workflow.run"
    );
    assert!(
        spans
            .iter()
            .any(|s| s.name == "step.attempt" && s.parent == Some(rollback.serial)),
        "{spans:#?}"
    );
}
