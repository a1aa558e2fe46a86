//! Regression tests for the defects of the reliability review (issue 9), one per defect,
//! each named after it.

use std::time::Duration;

use crate::support::{
    Counter, Seen, engine, records, run_to_end, targets, until_none_live, until_status, wf,
};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind};
use serde_json::{Value, json};

/// A body that panics while *building* its future (not inside it) on attempt 1 is an
/// attempt failure, retried per its config; before, the panic escaped the step, errored the
/// whole workflow and left the step row in flight forever.
#[tokio::test(start_paused = true)]
async fn a_panic_while_building_a_step_future_is_a_retried_attempt_failure() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let n = step
                .run("builds", |ctx| {
                    assert!(ctx.attempt > 1, "no future on attempt {}", ctx.attempt);
                    async move { Ok(ctx.attempt) }
                })
                .retries(Retries::constant(3, Duration::from_secs(1)))
                .await?;
            Ok(json!(n))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(status.output, Some(json!(2)));
    let failures = records(&instance, LogKind::AttemptFailure).await;
    assert_eq!(failures.len(), 1);
    let message = failures[0].entry.meta["error"]["message"].as_str().unwrap();
    assert!(message.contains("no future on attempt 1"), "{message}");
    let details = instance.details().await.unwrap();
    assert!(
        details.steps.iter().all(|s| s.end.is_some()),
        "nothing left in flight"
    );
    engine.shutdown().await;
}

/// A delay function that panics fails the step like one that returns an error, with the
/// panic's message; before, the panic escaped and errored the workflow as a whole.
#[tokio::test(start_paused = true)]
async fn a_panicking_delay_function_fails_the_step_with_its_message() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let caught = step
                .run("s", |_| async { Err::<(), _>("first".into()) })
                .retries(Retries {
                    limit: 3,
                    delay: Delay::function(
                        |_ctx| -> std::future::Ready<Result<Duration, cairn::BoxError>> {
                            panic!("delay exploded")
                        },
                    ),
                    backoff: None,
                })
                .await;
            let error = caught.unwrap_err();
            Ok(json!(error.message()))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    let message = status.output.unwrap();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("threw an error: panicked: delay exploded"),
        "{message}"
    );
    engine.shutdown().await;
}

/// A rollback handler that panics synchronously (before returning its future) is a failed
/// rollback attempt, retried; before, the instance stayed `running` forever with no live
/// lifetime, also after a restart.
#[tokio::test(start_paused = true)]
async fn a_rollback_handler_that_panics_synchronously_is_an_attempt_failure() {
    let calls = Counter::default();
    let c = calls.clone();
    let (engine, _dir) = engine(move |b| {
        let c = c.clone();
        b.register(wf(move |_, step| {
            let c = c.clone();
            async move {
                step.run("reserve", |_| async { Ok(1u32) })
                    .rollback(move |_: Rollback<u32>| {
                        assert!(c.bump() > 1, "handler cannot start");
                        async { Ok(()) }
                    })
                    .rollback_config(&StepConfig {
                        retries: Some(Retries::constant(2, Duration::from_secs(1))),
                        ..StepConfig::default()
                    })
                    .await?;
                Err::<Value, _>("boom".into())
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(status.rollback.unwrap().outcome, "completed");
    assert_eq!(calls.get(), 2);
    let failures = records(&instance, LogKind::RollbackAttemptFailure).await;
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].entry.meta["error"]["message"]
            .as_str()
            .unwrap()
            .contains("handler cannot start")
    );
    until_none_live(&engine).await;
    engine.shutdown().await;
}

/// `Workflow::run` that panics while building its future errors the instance with the
/// message instead of taking the driver down with it.
#[tokio::test(start_paused = true)]
async fn a_workflow_that_panics_while_building_its_future_errors_with_the_message() {
    struct Eager;
    impl cairn::Workflow for Eager {
        const NAME: &'static str = "eager";
        type Params = Value;
        type Output = Value;
        #[allow(unreachable_code)]
        fn run(
            &self,
            _: cairn::WorkflowEvent<Value>,
            _: cairn::WorkflowStep,
        ) -> impl std::future::Future<Output = Result<Value, cairn::WorkflowError>> + Send {
            panic!("run cannot start");
            std::future::pending()
        }
    }
    let (engine, _dir) = engine(|b| b.register(Eager)).await;
    let instance = engine
        .workflow::<Eager>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    instance.wait().await.unwrap();
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert!(status.error.unwrap().message.contains("run cannot start"));
    until_none_live(&engine).await;
    engine.shutdown().await;
}

/// Error messages are capped (8 KiB and a marker) where they are stored, once per attempt.
#[tokio::test(start_paused = true)]
async fn error_messages_are_capped_once_per_attempt() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("s", |_| async { Err::<(), _>("x".repeat(100_000).into()) })
                .retries(Retries::none())
                .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    let message = status.error.unwrap().message;
    assert!(
        message.len() <= cairn::MAX_ERROR_MESSAGE + 64,
        "{}",
        message.len()
    );
    assert!(
        message.ends_with("more bytes truncated]"),
        "{}",
        &message[8000..]
    );
    for r in records(&instance, LogKind::AttemptFailure).await {
        assert!(r.entry.meta.to_string().len() < 10_000);
    }
    engine.shutdown().await;
}

/// A panic in engine code (here: the store call that loads the journal, made on the
/// driver's task when the instance wakes from its wait for an event; a new instance has
/// none to load) releases the instance, recorded in its log, and a later lifetime finishes
/// it; before, the panic was dropped by the scheduler's `JoinSet` and the instance stayed
/// leased with no lifetime forever (leases do not expire on SQLite).
///
/// The system clock: with the virtual clock every store call runs on a blocking thread,
/// where a panic becomes `store.unavailable` instead.
#[tokio::test]
async fn a_panic_in_engine_code_releases_the_instance() {
    let (_dir, path) = crate::support::temp_db();
    let journal_calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let calls = std::sync::Arc::clone(&journal_calls);
    let engine = crate::support::hooked_builder(&path, move |method| {
        if method == "journal" && calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            panic!("injected engine bug");
        }
        Ok(())
    })
    .hibernate_after(Duration::ZERO)
    .register(wf(|_, step| async move {
        step.wait_for_event::<Value>("wait", "go").await?;
        let n: u32 = step.run("s", |_| async { Ok(7) }).await?;
        Ok(json!(n))
    }))
    .start()
    .await
    .unwrap();
    let (instance, status) = woken_to_its_end(&engine).await;
    assert_eq!(status.status, InstanceStatus::Complete);
    assert_eq!(status.output, Some(json!(7)));
    let waiting = records(&instance, LogKind::WorkflowWaiting).await;
    assert!(
        waiting
            .iter()
            .any(|r| r.entry.meta["enginePanic"] == "injected engine bug"),
        "{waiting:?}"
    );
    engine.shutdown().await;
}

/// Review finding: a stream chunk the store could not give back whole (missing, or of the
/// wrong size: `Error::Corrupt`) to workflow code stopped the lifetime and left the
/// instance leased and `running` with nothing running it, for good on SQLite (whose
/// leases never run out). It is now released as after an engine panic: recorded, and
/// claimed again after a back-off, here to find the chunk whole.
#[tokio::test]
async fn a_corrupt_stream_read_releases_the_instance_to_be_tried_again() {
    let (_dir, path) = crate::support::temp_db();
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = std::sync::Arc::clone(&reads);
    let engine = crate::support::hooked_builder(&path, move |method| {
        if method == "stream_chunk" && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            return Err(cairn::store::Error::Corrupt("chunk 0 is missing".into()));
        }
        Ok(())
    })
    .hibernate_after(Duration::ZERO)
    .register(wf(|_, step| async move {
        let stream = step
            .run_stream("export", |_| async {
                Ok(futures::stream::iter(vec![Ok::<_, std::io::Error>(
                    vec![7u8; 1000],
                )]))
            })
            .await?;
        step.wait_for_event::<Value>("wait", "go").await?;
        Ok(json!(stream.read_to_end().await?.len()))
    }))
    .start()
    .await
    .unwrap();
    let (instance, status) = woken_to_its_end(&engine).await;
    assert_eq!(
        status.status,
        InstanceStatus::Complete,
        "{:?}",
        status.error
    );
    assert_eq!(status.output, Some(json!(1000)));
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);
    let waiting = records(&instance, LogKind::WorkflowWaiting).await;
    assert!(
        waiting
            .iter()
            .any(|r| r.entry.meta["storeCorrupt"] == "stored data is corrupt: chunk 0 is missing"),
        "{waiting:?}"
    );
    engine.shutdown().await;
}

/// Creates an instance of the workflow that waits for a `go` event; once it has let go of
/// its lifetime to wait (its `WORKFLOW_WAITING` record is committed with its
/// hibernation), sends the event, which wakes it in a new lifetime; waits for its end.
async fn woken_to_its_end(
    engine: &cairn::Engine,
) -> (cairn::Instance<Value>, cairn::Status<Value>) {
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    let waiting = async {
        while records(&instance, LogKind::WorkflowWaiting)
            .await
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the instance hibernated");
    instance.send_event("go", &json!({})).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), instance.wait())
        .await
        .expect("the instance finished")
        .unwrap();
    (instance, status)
}

/// A new instance's first lifetime has no journal to load and reads none: one read, and a
/// round trip to a reader thread, fewer per instance. A lifetime that resumes an instance,
/// here woken from a wait it hibernated through, reads it, and answers the step before the
/// wait from it instead of running its body again.
#[tokio::test]
async fn a_new_instance_loads_no_journal_and_a_woken_one_does() {
    let (_dir, path) = crate::support::temp_db();
    let journal_reads = Counter::default();
    let reads = journal_reads.clone();
    let before_ran = Counter::default();
    let ran = before_ran.clone();
    let engine = crate::support::hooked_builder(&path, move |method| {
        if method == "journal" {
            reads.bump();
        }
        Ok(())
    })
    .hibernate_after(Duration::ZERO)
    .register(wf(move |_, step| {
        let ran = ran.clone();
        async move {
            let a: u32 = step
                .run("before", |_| {
                    ran.bump();
                    async { Ok(1) }
                })
                .await?;
            step.wait_for_event::<Value>("wait", "go").await?;
            let b: u32 = step.run("after", |_| async { Ok(2) }).await?;
            Ok(json!(a + b))
        }
    }))
    .start()
    .await
    .unwrap();
    let (instance, status) = woken_to_its_end(&engine).await;
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(status.output, Some(json!(3)));
    assert!(
        records(&instance, LogKind::WorkflowWaiting).await.len() == 1,
        "it hibernated through its wait once"
    );
    assert_eq!(
        journal_reads.get(),
        1,
        "read once: by the lifetime that woke it"
    );
    assert_eq!(
        before_ran.get(),
        1,
        "the woken lifetime replayed `before` from the journal"
    );
    engine.shutdown().await;
}

/// Rollback registration replay goes past awaits that are not steps: `reserve` (with a
/// handler), `yield_now`, `charge` (with a handler), a 30-day sleep (hibernated), then
/// `terminate_with_rollback`. Before, registration stopped at the `yield_now`, `charge`'s
/// handler was missing and no handler ran (`RollbackMissing`).
#[tokio::test(start_paused = true)]
async fn rollback_registration_replay_survives_awaits_that_are_not_steps() {
    let ran = Seen::<String>::default();
    let r = ran.clone();
    let (engine, _dir) = engine(move |b| {
        let r = r.clone();
        b.register(wf(move |_, step| {
            let r = r.clone();
            async move {
                let (r1, r2) = (r.clone(), r.clone());
                step.run("reserve", |_| async { Ok(1u32) })
                    .rollback(move |_: Rollback<u32>| {
                        r1.push("reserve".to_owned());
                        async { Ok(()) }
                    })
                    .await?;
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
                step.run("charge", |_| async { Ok(2u32) })
                    .rollback(move |_: Rollback<u32>| {
                        r2.push("charge".to_owned());
                        async { Ok(()) }
                    })
                    .await?;
                step.sleep("a month", Duration::from_secs(30 * 86_400))
                    .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    until_status(&instance, InstanceStatus::Waiting).await;
    until_none_live(&engine).await; // hibernated
    instance.terminate_with_rollback().await.unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Terminated);
    assert_eq!(status.rollback.unwrap().outcome, "completed");
    assert_eq!(ran.all(), ["charge", "reserve"]);
    engine.shutdown().await;
}

/// Two steps with handlers, then a failure; `reserve`'s handler takes 5 s and
/// `charge`'s handler first fails with `delay` as its retry back-off.
fn slow_rollback(ran: Seen<String>, delay: Duration) -> crate::support::FnWorkflow {
    wf(move |_, step| {
        let ran = ran.clone();
        async move {
            let (r1, r2) = (ran.clone(), ran.clone());
            step.run("reserve", |_| async { Ok(1u32) })
                .rollback(move |_: Rollback<u32>| {
                    let r1 = r1.clone();
                    async move {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        r1.push("reserve".to_owned());
                        Ok(())
                    }
                })
                .await?;
            step.run("charge", |_| async { Ok(2u32) })
                .rollback(move |rb: Rollback<u32>| {
                    let r2 = r2.clone();
                    async move {
                        let _ = rb;
                        let calls = r2.all().iter().filter(|c| c.starts_with("charge")).count();
                        r2.push(format!("charge call {}", calls + 1));
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        if calls == 0 {
                            return Err("card service down".into());
                        }
                        Ok(())
                    }
                })
                .rollback_config(&StepConfig {
                    retries: Some(Retries::constant(2, delay)),
                    ..StepConfig::default()
                })
                .await?;
            Err::<Value, _>("boom".into())
        }
    })
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3 * 3600), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

/// A pause requested while a rollback handler runs takes effect once that handler's
/// attempt is recorded; resume continues the rollback where it stopped. Before, the status
/// stayed `waitingForPause` and the lifetime held its slot forever.
#[tokio::test(start_paused = true)]
async fn a_pause_during_a_rollback_takes_effect_and_resume_continues_it() {
    let ran = Seen::<String>::default();
    let (engine, _dir) =
        engine(|b| b.register(slow_rollback(ran.clone(), Duration::from_millis(100)))).await;
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    within(
        "the rollback start",
        crate::support::until_logged(&instance, LogKind::RollbackStart, 1),
    )
    .await;
    instance.pause().await.unwrap();
    within("the pause", until_status(&instance, InstanceStatus::Paused)).await;
    until_none_live(&engine).await; // a paused rollback holds no slot
    let before = ran.all();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(ran.all(), before, "nothing runs while paused");
    instance.resume().await.unwrap();
    let status = within("the end", instance.wait()).await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(status.rollback.unwrap().outcome, "completed");
    assert_eq!(ran.all(), ["charge call 1", "charge call 2", "reserve"]);
    assert_eq!(records(&instance, LogKind::WorkflowPaused).await.len(), 1);
    engine.shutdown().await;
}

/// A long back-off of a rollback handler hibernates the instance like any durable wait.
#[tokio::test(start_paused = true)]
async fn a_long_back_off_in_a_rollback_hibernates() {
    let ran = Seen::<String>::default();
    let (engine, _dir) =
        engine(|b| b.register(slow_rollback(ran.clone(), Duration::from_secs(3600)))).await;
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    within(
        "the first handler failure",
        crate::support::until_logged(&instance, LogKind::RollbackAttemptFailure, 1),
    )
    .await;
    within(
        "hibernation",
        until_status(&instance, InstanceStatus::Waiting),
    )
    .await;
    until_none_live(&engine).await; // hibernated through the back-off
    let status = within("the end", instance.wait()).await.unwrap();
    assert_eq!(status.rollback.unwrap().outcome, "completed");
    assert_eq!(ran.all(), ["charge call 1", "charge call 2", "reserve"]);
    engine.shutdown().await;
}

/// The losing step of a `select!` (dropped by the workflow mid-attempt) is recorded as
/// cancelled, with its own error, and shown so; on replay it never completes, so the race
/// goes the same way and its body does not run again. Before, it was logged as
/// `WorkflowInternalError` (as if the process had crashed), the finished instance showed it
/// unfinished with a `retriesAt`, and a replay ran its body again.
#[tokio::test(start_paused = true)]
async fn a_step_dropped_by_the_workflow_is_recorded_as_cancelled() {
    let slow_runs = Counter::default();
    let s = slow_runs.clone();
    let (engine, _dir) = engine(move |b| {
        let s = s.clone();
        b.register(wf(move |_, step| {
            let s = s.clone();
            async move {
                let slow = step.run("slow", |_| {
                    s.bump();
                    async {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Ok("slow".to_owned())
                    }
                });
                let timeout = step.sleep("timeout", Duration::from_millis(500));
                let winner = tokio::select! {
                    biased;
                    r = slow => r?,
                    r = timeout => { r?; "timeout".to_owned() }
                };
                // A long sleep: the instance hibernates and replays the race on waking.
                step.sleep("a day", Duration::from_secs(86_400)).await?;
                Ok(json!(winner))
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.output, Some(json!("timeout")), "{status:?}");
    assert_eq!(
        slow_runs.get(),
        1,
        "the replay did not run the cancelled body again"
    );
    let details = instance.details().await.unwrap();
    let slow = details.steps.iter().find(|s| s.name == "slow").unwrap();
    assert!(slow.cancelled, "{slow:?}");
    assert_eq!(slow.success, Some(false));
    assert!(slow.end.is_some() && slow.retries_at.is_none(), "{slow:?}");
    assert_eq!(slow.error.as_ref().unwrap().name, "StepCancelled");
    assert_eq!(slow.attempts.len(), 1);
    assert_eq!(
        slow.attempts[0].error.as_ref().unwrap().name,
        "StepCancelled"
    );
    let log = instance.log(0).await.unwrap();
    assert!(
        !log.iter()
            .any(|r| r.entry.meta.to_string().contains("WorkflowInternalError")),
        "no crash is reported"
    );
    engine.shutdown().await;
}

/// Shutdown drains: the attempt in flight finishes and its outcome is committed, so a
/// routine deploy does not charge a failure (with `Retries::none()` it used to fail the step
/// and trigger the rollback). The next engine finishes the instance without running the
/// step again. An attempt still running at the drain deadline is dropped and recorded as
/// interrupted by the next engine.
#[tokio::test(start_paused = true)]
async fn shutdown_drains_attempts_in_flight_until_the_deadline() {
    let (_dir, path) = crate::support::temp_db();
    let runs = Seen::<String>::default();
    let workflow = |runs: Seen<String>| {
        wf(move |_, step| {
            let runs = runs.clone();
            async move {
                let (r1, r2) = (runs.clone(), runs.clone());
                step.run("two seconds", move |_| {
                    r1.push("two seconds".to_owned());
                    async {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        Ok(())
                    }
                })
                .retries(Retries::none())
                .await?;
                step.run("five minutes", move |_| {
                    r2.push("five minutes".to_owned());
                    async {
                        tokio::time::sleep(Duration::from_secs(300)).await;
                        Ok(())
                    }
                })
                .retries(Retries::constant(1, Duration::from_secs(1)))
                .await?;
                Ok(Value::Null)
            }
        })
    };
    let engine = crate::support::builder_at(&path)
        .drain_timeout(Duration::from_secs(60))
        .register(workflow(runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})).id("deploy"))
        .await
        .unwrap();
    crate::support::until_logged(&instance, LogKind::AttemptStart, 1).await;
    let started = tokio::time::Instant::now();
    engine.shutdown().await;
    // The first step finished within the drain; the second never started (the gate held
    // it), so shutdown did not wait for it.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(runs.all(), ["two seconds"]);

    let engine = crate::support::builder_at(&path)
        .drain_timeout(Duration::from_secs(1))
        .register(workflow(runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .get("deploy")
        .await
        .unwrap();
    crate::support::until_logged(&instance, LogKind::AttemptStart, 2).await;
    let log = instance.log(0).await.unwrap();
    assert!(
        !log.iter()
            .any(|r| r.entry.meta.to_string().contains("WorkflowInternalError")),
        "the drained attempt was recorded, not interrupted"
    );
    assert_eq!(
        targets(&instance, LogKind::StepSuccess).await,
        ["two seconds-1"]
    );
    // The five-minute attempt is in flight: the deadline drops it.
    let started = tokio::time::Instant::now();
    engine.shutdown().await;
    assert!(
        started.elapsed() <= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let engine = crate::support::builder_at(&path)
        .register(workflow(runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .get("deploy")
        .await
        .unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(runs.all(), ["two seconds", "five minutes", "five minutes"]);
    let interrupted = records(&instance, LogKind::AttemptFailure).await;
    assert_eq!(interrupted.len(), 1);
    assert!(
        interrupted[0]
            .entry
            .meta
            .to_string()
            .contains("WorkflowInternalError")
    );
    engine.shutdown().await;
}

/// A commit wakes only the views of its own instance and workflow. Before, every commit
/// woke every open stream, and each re-read the store: 200 idle streams halved creates.
#[tokio::test(start_paused = true)]
async fn commits_wake_only_the_views_of_their_instance_and_workflow() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("s", |_| async { Ok(1u32) }).await?;
            Ok(Value::Null)
        }))
        .register(crate::support::named::<1, _, _>(|_, step| async move {
            step.wait_for_event::<Value>("wait", "go").await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let idle = engine
        .workflow::<crate::support::FnWorkflow<1>>()
        .create(cairn::CreateOptions::new(json!({})).id("idle"))
        .await
        .unwrap();
    until_status(&idle, InstanceStatus::Waiting).await;
    let mut idle_view = idle.commits().await.unwrap();
    let mut idle_workflow_view = engine
        .workflow::<crate::support::FnWorkflow<1>>()
        .untyped()
        .commits();
    let busy = engine.workflow::<crate::support::FnWorkflow>();
    let busy_workflow_view = busy.untyped().commits();
    idle_view.borrow_and_update();
    idle_workflow_view.borrow_and_update();
    let instance = busy
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    instance.wait().await.unwrap();
    assert!(
        busy_workflow_view.has_changed().unwrap(),
        "its workflow's view is woken"
    );
    assert!(
        !idle_view.has_changed().unwrap(),
        "another instance's view is not"
    );
    assert!(
        !idle_workflow_view.has_changed().unwrap(),
        "another workflow's view is not"
    );
    idle.send_event("go", &json!({})).await.unwrap();
    idle.wait().await.unwrap();
    assert!(idle_view.has_changed().unwrap());
    assert!(idle_workflow_view.has_changed().unwrap());
    engine.shutdown().await;
}

/// A step dropped by the workflow while it waits to retry is cancelled too; before, the
/// finished instance showed it unfinished with a `retriesAt` forever.
#[tokio::test(start_paused = true)]
async fn a_step_dropped_while_waiting_to_retry_is_recorded_as_cancelled() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let flaky = step
                .run("flaky", |_| async { Err::<String, _>("down".into()) })
                .retries(Retries::constant(3, Duration::from_secs(60)));
            let timeout = step.sleep("timeout", Duration::from_secs(5));
            let winner = tokio::select! {
                biased;
                r = flaky => r?,
                r = timeout => { r?; "timeout".to_owned() }
            };
            Ok(json!(winner))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!("timeout"))
    );
    let details = instance.details().await.unwrap();
    let flaky = details.steps.iter().find(|s| s.name == "flaky").unwrap();
    assert!(
        flaky.cancelled && flaky.retries_at.is_none() && flaky.end.is_some(),
        "{flaky:?}"
    );
    assert!(
        flaky
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("waited to retry"),
        "{flaky:?}"
    );
    assert_eq!(flaky.attempts.len(), 1, "{flaky:?}");
    engine.shutdown().await;
}

/// A panic in an op's engine code (here the store call that takes an event, made by the
/// wait inside the workflow's future) releases the instance like any engine panic; before,
/// it was reported as "the workflow panicked" and failed the instance for good.
#[tokio::test]
async fn a_panic_in_an_ops_engine_code_releases_the_instance() {
    let (_dir, path) = crate::support::temp_db();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = std::sync::Arc::clone(&calls);
    let engine = crate::support::hooked_builder(&path, move |method| {
        if method == "take_event" && c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            panic!("injected bug in an op");
        }
        Ok(())
    })
    .register(wf(|_, step| async move {
        let e: StepEvent<Value> = step.wait_for_event("wait", "go").await?;
        Ok(e.payload)
    }))
    .start()
    .await
    .unwrap();
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    instance
        .send_event("go", &json!({"ok": true}))
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), instance.wait())
        .await
        .expect("released and finished")
        .unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(status.output, Some(json!({"ok": true})));
    let waiting = records(&instance, LogKind::WorkflowWaiting).await;
    assert!(
        waiting
            .iter()
            .any(|r| r.entry.meta["enginePanic"] == "injected bug in an op"),
        "{waiting:?}"
    );
    engine.shutdown().await;
}

/// A step the workflow dropped is recorded as cancelled even when the next thing that
/// happens is a graceful shutdown (the drain commits the queued record); before, the next
/// engine saw it in flight, recorded it as interrupted and ran it again.
#[tokio::test(start_paused = true)]
async fn a_cancelled_step_is_recorded_across_a_graceful_shutdown() {
    let (_dir, path) = crate::support::temp_db();
    let slow_runs = Counter::default();
    let workflow = |s: Counter| {
        wf(move |_, step| {
            let s = s.clone();
            async move {
                let slow = step.run("slow", |_| {
                    s.bump();
                    async {
                        tokio::time::sleep(Duration::from_secs(300)).await;
                        Ok(1u32)
                    }
                });
                let quick = step.sleep("quick", Duration::from_millis(100));
                tokio::select! {
                    biased;
                    r = slow => { r?; }
                    r = quick => r?,
                }
                // Not a step: no commit follows the drop before the shutdown.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Value::Null)
            }
        })
    };
    let engine = crate::support::builder_at(&path)
        .register(workflow(slow_runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(json!({})).id("c"))
        .await
        .unwrap();
    crate::support::until_logged(&instance, LogKind::StepStart, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    engine.shutdown().await;
    let engine = crate::support::builder_at(&path)
        .register(workflow(slow_runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<crate::support::FnWorkflow>()
        .get("c")
        .await
        .unwrap();
    let details = instance.details().await.unwrap();
    let slow = details.steps.iter().find(|s| s.name == "slow").unwrap();
    assert!(slow.cancelled, "{slow:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(slow_runs.get(), 1, "the cancelled step did not run again");
    let log = instance.log(0).await.unwrap();
    assert!(
        !log.iter()
            .any(|r| r.entry.meta.to_string().contains("WorkflowInternalError"))
    );
    engine.shutdown().await;
}

/// After a store outage the driver replays from the record as stored now, not from the
/// claim: the instance was started by the lifetime that failed, so the replay writes no
/// second `WORKFLOW_START`. Before, it reused the stale claimed record and logged it twice.
#[tokio::test(start_paused = true)]
async fn a_store_outage_replays_from_the_stored_record() {
    let (_dir, path) = crate::support::temp_db();
    let commits = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = std::sync::Arc::clone(&commits);
    let engine = crate::support::hooked_builder(&path, move |method| {
        // The commit after the one that starts the instance fails once.
        if method == "commit" && c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            return Err(cairn::store::Error::Unavailable("injected outage".into()));
        }
        Ok(())
    })
    .clock(cairn::Clock::virtual_now())
    .register(wf(|_, step| async move {
        let n: u32 = step.run("s", |_| async { Ok(3) }).await?;
        Ok(json!(n))
    }))
    .start()
    .await
    .unwrap();
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(3)));
    assert!(
        commits.load(std::sync::atomic::Ordering::SeqCst) > 2,
        "the outage happened"
    );
    assert_eq!(records(&instance, LogKind::WorkflowStart).await.len(), 1);
    engine.shutdown().await;
}

/// The end of a rollback is recorded in the same commit as the end of the instance: a
/// failure of any commit after the last handler (a crash there, in the SIGKILL test) never
/// logs `ROLLBACK_COMPLETE` twice. Found by `crash_kill_rollback` (seed
/// 1796073503009936523): before, the rollback's end was committed on its own, and a crash
/// before the instance's end made the next lifetime end the rollback again.
#[tokio::test(start_paused = true)]
async fn a_rollback_ends_once_whichever_commit_after_it_fails() {
    for failing in 1..=3u32 {
        let (_dir, path) = crate::support::temp_db();
        let handled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let after = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (h, a) = (
            std::sync::Arc::clone(&handled),
            std::sync::Arc::clone(&after),
        );
        let flag = std::sync::Arc::clone(&handled);
        let engine = crate::support::hooked_builder(&path, move |method| {
            use std::sync::atomic::Ordering::SeqCst;
            if method == "commit" && h.load(SeqCst) && a.fetch_add(1, SeqCst) + 1 == failing {
                return Err(cairn::store::Error::Unavailable("injected".into()));
            }
            Ok(())
        })
        .clock(cairn::Clock::virtual_now())
        .register(wf(move |_, step| {
            let flag = std::sync::Arc::clone(&flag);
            async move {
                step.run("reserve", |_| async { Ok(1u32) })
                    .rollback(move |_: Rollback<u32>| {
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        async { Ok(()) }
                    })
                    .await?;
                Err::<Value, _>("boom".into())
            }
        }))
        .start()
        .await
        .unwrap();
        let instance = run_to_end(&engine, json!({})).await;
        let status = instance.status().await.unwrap();
        assert_eq!(
            status.rollback.unwrap().outcome,
            "completed",
            "commit {failing}"
        );
        assert_eq!(
            records(&instance, LogKind::RollbackComplete).await.len(),
            1,
            "commit {failing} after the handler failed"
        );
        assert_eq!(records(&instance, LogKind::WorkflowFailure).await.len(), 1);
        engine.shutdown().await;
    }
}

// The database file (SQLite only).

/// A second engine on a database another engine holds fails with its own code, not the
/// generic `engine.config`.
#[tokio::test]
async fn a_database_in_use_has_its_own_code() {
    let (_dir, path) = crate::support::temp_db();
    let first = crate::support::builder_at(&path).start().await.unwrap();
    let err = crate::support::builder_at(&path)
        .sqlite_options(cairn::sqlite::Options::default().lock_timeout(Duration::from_millis(50)))
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.code(), "store.in_use", "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    first.shutdown().await;
}

/// A configuration error keeps the error underneath as its `source()`.
#[tokio::test]
async fn a_config_error_keeps_its_source() {
    let err = cairn::Engine::builder()
        .sqlite("/nonexistent-dir-for-cairn/sub/cairn.db")
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.code(), "engine.config");
    let source = std::error::Error::source(&err).expect("the open error is kept");
    assert!(
        err.to_string().contains(&source.to_string()),
        "{err} / {source}"
    );
}

/// Issue 34: a step costs one commit. A 10-step instance makes 11 lifetime commits: one
/// per step (its start, carrying the success before it, the first one the instance's
/// start) and its end (carrying the last success). Before, 22: the start of the instance
/// and two per step, then the end.
#[tokio::test]
async fn a_ten_step_instance_costs_one_commit_per_step_and_one_more() {
    let (_dir, path) = crate::support::temp_db();
    let commits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&commits);
    let engine = crate::support::hooked_builder(&path, move |call| {
        if call == "commit" {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    })
    .register(wf(|_, step| async move {
        for i in 0..10u32 {
            step.run(format!("step {i}"), move |_| async move { Ok(i) })
                .await?;
        }
        Ok(json!(10))
    }))
    .start()
    .await
    .unwrap();
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().status,
        InstanceStatus::Complete
    );
    assert_eq!(
        commits.load(std::sync::atomic::Ordering::SeqCst),
        11,
        "the lifetime's commits for 10 steps"
    );
    assert_eq!(records(&instance, LogKind::StepSuccess).await.len(), 10);
    engine.shutdown().await;
}
