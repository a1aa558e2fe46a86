//! SPEC §3.8–3.10, §7.1/7.7/7.10: pause, resume, terminate, restart and delete.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::support::{
    Counter, FnWorkflow, engine, records, run_to_end, until_logged, until_status, wf,
};
use cairn::prelude::*;
use cairn::{Instance, InstanceStatus, LogKind, StepKind};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

async fn create(engine: &cairn::Engine, id: &str) -> Instance<Value> {
    engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id(id))
        .await
        .unwrap()
}

/// Two steps; the first holds until `gate` gets a permit. Counts how often "second" runs.
fn gated(gate: Arc<Semaphore>, second_runs: Counter) -> FnWorkflow {
    wf(move |_, step| {
        let (gate, second_runs) = (gate.clone(), second_runs.clone());
        async move {
            let first: u32 = step
                .run("first", |_| {
                    let gate = gate.clone();
                    async move {
                        gate.acquire().await.map_err(|e| e.to_string())?.forget();
                        Ok(1)
                    }
                })
                .await?;
            let second: u32 = step
                .run("second", |_| {
                    second_runs.bump();
                    async { Ok(2) }
                })
                .await?;
            Ok(json!(first + second))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn e21_h10_h12_pause_lets_the_step_in_flight_finish_and_stops_before_the_next() {
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let (engine, _dir) = engine(|b| b.register(gated(gate.clone(), second.clone()))).await;
    let instance = create(&engine, "p").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.pause().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::WaitingForPause,
        "H12"
    );
    gate.add_permits(1);
    until_status(&instance, InstanceStatus::Paused).await;
    assert_eq!(
        records(&instance, LogKind::StepSuccess).await.len(),
        1,
        "the in-flight step was recorded"
    );
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(second.get(), 0, "the next step never ran");
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn h11_m3_resume_after_pause_completes_with_the_right_output() {
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let (engine, _dir) = engine(|b| b.register(gated(gate.clone(), second.clone()))).await;
    let instance = create(&engine, "p").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.pause().await.unwrap();
    gate.add_permits(1);
    until_status(&instance, InstanceStatus::Paused).await;
    instance.resume().await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
    assert_eq!(second.get(), 1);
    assert_eq!(records(&instance, LogKind::WorkflowStart).await.len(), 1);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e22_pause_with_two_steps_in_flight_waits_for_both() {
    let gate = Arc::new(Semaphore::new(0));
    let after = Counter::default();
    let (g, a) = (gate.clone(), after.clone());
    let (engine, _dir) = engine(move |b| {
        b.register(wf(move |_, step| {
            let (g1, g2, a) = (g.clone(), g.clone(), a.clone());
            async move {
                let (x, y): (u32, u32) = futures::try_join!(
                    step.run("left", move |_| {
                        let g = g1.clone();
                        async move {
                            g.acquire().await.map_err(|e| e.to_string())?.forget();
                            Ok(1)
                        }
                    }),
                    step.run("right", move |_| {
                        let g = g2.clone();
                        async move {
                            g.acquire().await.map_err(|e| e.to_string())?.forget();
                            Ok(2)
                        }
                    }),
                )?;
                step.run("after", |_| {
                    a.bump();
                    async { Ok(()) }
                })
                .await?;
                Ok(json!(x + y))
            }
        }))
    })
    .await;
    let instance = create(&engine, "two").await;
    until_logged(&instance, LogKind::AttemptStart, 2).await;
    instance.pause().await.unwrap();
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::WaitingForPause,
        "one still in flight"
    );
    gate.add_permits(1);
    until_status(&instance, InstanceStatus::Paused).await;
    assert_eq!(records(&instance, LogKind::StepSuccess).await.len(), 2);
    assert_eq!(after.get(), 0);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e23_resume_while_waiting_for_pause_cancels_the_pause() {
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let (engine, _dir) = engine(|b| b.register(gated(gate.clone(), second.clone()))).await;
    let instance = create(&engine, "p").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.pause().await.unwrap();
    instance.resume().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Running,
        "running right away"
    );
    gate.add_permits(1);
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
    assert_eq!(second.get(), 1);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e24_pause_during_a_sleep_is_immediate_and_the_sleep_resumes_after() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.sleep("nap", "1 hour").await?;
            step.run("after nap", |_| async { Ok("rested".to_string()) })
                .await
                .map(|s| json!(s))
        }))
    })
    .await;
    let instance = create(&engine, "s").await;
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.pause().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused,
        "at once"
    );
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await; // paused for two hours
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused
    );
    instance.resume().await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!("rested")));
    let start = records(&instance, LogKind::SleepStart).await[0].entry.at;
    let end = records(&instance, LogKind::SleepComplete).await[0].entry.at;
    let slept = end.since(start);
    assert!(
        slept >= Duration::from_secs(3 * 3600),
        "the paused time did not count: {slept:?}"
    );
    assert!(slept < Duration::from_secs(3 * 3600 + 60), "{slept:?}");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e25_pause_during_a_wait_then_an_event_after_resume_is_delivered() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let e: StepEvent<String> = step.wait_for_event("approval", "approve").await?;
            Ok(json!(e.payload))
        }))
    })
    .await;
    let instance = create(&engine, "w").await;
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.pause().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused
    );
    instance.resume().await.unwrap();
    instance.send_event("approve", &"yes").await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!("yes")));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn events_sent_while_paused_wait_for_the_resume() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let e: StepEvent<u32> = step.wait_for_event("w", "n").await?;
            Ok(json!(e.payload))
        }))
    })
    .await;
    let instance = create(&engine, "w").await;
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.pause().await.unwrap();
    instance.send_event("n", &5).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused,
        "an event does not unpause"
    );
    instance.resume().await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(5)));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e26_an_engine_starting_on_waiting_for_pause_moves_it_to_paused_without_running() {
    let (dir, path) = super::support::temp_db();
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let first = super::support::builder_at(&path)
        .register(gated(gate.clone(), second.clone()))
        .start()
        .await
        .unwrap();
    let instance = create(&first, "p").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.pause().await.unwrap();
    first.shutdown().await; // dies with the attempt in flight, waiting for pause
    let runs = Counter::default();
    let second_engine = super::support::builder_at(&path)
        .register(gated(Arc::new(Semaphore::new(10)), runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = second_engine
        .workflow::<FnWorkflow>()
        .get("p")
        .await
        .unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(runs.get(), 0);
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused
    );
    second_engine.shutdown().await;
    drop(dir);
}

#[tokio::test(start_paused = true)]
async fn pausing_twice_and_resuming_a_running_instance_are_no_ops() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.sleep("s", "1 day").await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = create(&engine, "x").await;
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.resume().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Waiting
    );
    instance.pause().await.unwrap();
    instance.pause().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Paused
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn h5_m4_terminate_a_running_instance() {
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let (engine, _dir) = engine(|b| b.register(gated(gate.clone(), second.clone()))).await;
    let instance = create(&engine, "t").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.terminate().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Terminated
    );
    gate.add_permits(5);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(second.get(), 0, "nothing runs after terminate");
    let kinds = super::support::kinds(&instance).await;
    assert_eq!(kinds.last(), Some(&LogKind::WorkflowTerminated));
    assert_eq!(
        records(&instance, LogKind::StepSuccess).await.len(),
        0,
        "the cancelled attempt is not recorded as a success"
    );
    assert_eq!(instance.details().await.unwrap().success, Some(false));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn h8_terminate_while_waiting_for_an_event() {
    let ran = Counter::default();
    let r = ran.clone();
    let (engine, _dir) = engine(move |b| {
        b.register(wf(move |_, step| {
            let r = r.clone();
            async move {
                step.wait_for_event::<Value>("w", "go").await?;
                step.run("next", |_| {
                    r.bump();
                    async { Ok(()) }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = create(&engine, "t").await;
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.terminate().await.unwrap();
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Terminated
    );
    assert_eq!(
        records(&instance, LogKind::WorkflowTerminated).await.len(),
        1
    );
    assert_eq!(
        instance.send_event("go", &1).await.unwrap_err().code(),
        "instance.finished"
    );
    tokio::time::sleep(Duration::from_secs(3600 * 48)).await;
    assert_eq!(ran.get(), 0);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e16_terminating_a_finished_instance_is_an_error() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|event, _| async move {
            if event.payload["fail"] == true {
                Err("boom".into())
            } else {
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let complete = run_to_end(&engine, json!({})).await;
    let errored = run_to_end(&engine, json!({"fail": true})).await;
    let terminated = run_to_end(&engine, json!({})).await;
    terminated.restart().await.unwrap();
    let _ = terminated.terminate().await;
    for (instance, status) in [
        (&complete, "complete"),
        (&errored, "errored"),
        (&terminated, ""),
    ] {
        let s = super::support::status_of(instance).await;
        let err = instance.terminate().await.unwrap_err();
        assert_eq!(err.code(), "instance.cannot_terminate", "{s}");
        assert!(
            err.to_string().contains("Cannot terminate instance"),
            "{err}"
        );
        assert!(err.to_string().contains(s.as_str()), "{err} {status}");
    }
    assert_eq!(
        complete.pause().await.unwrap_err().code(),
        "instance.cannot_pause"
    );
    assert_eq!(
        complete.resume().await.unwrap_err().code(),
        "instance.cannot_resume"
    );
    engine.shutdown().await;
}

/// Counts runs of its step; while `first_round` is set, `fail` instances fail and `hold`
/// instances sleep for 30 days, so a restart (after clearing it) has something to change.
fn counting_workflow(runs: Counter, first_round: Arc<AtomicBool>) -> FnWorkflow {
    wf(move |event, step| {
        let (runs, first_round) = (runs.clone(), first_round.clone());
        async move {
            let n: u32 = step
                .run("count", |_| {
                    let n = runs.bump();
                    async move { Ok(n) }
                })
                .await?;
            let first = first_round.load(Ordering::SeqCst);
            if event.payload["fail"] == true && first {
                return Err("first run fails".into());
            }
            if event.payload["hold"] == true && first {
                step.sleep("hold", "30 days").await?;
            }
            Ok(json!(n))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn e17_restart_reruns_from_scratch_from_every_status() {
    let runs = Counter::default();
    let first_round = Arc::new(AtomicBool::new(true));
    let (engine, _dir) =
        engine(|b| b.register(counting_workflow(runs.clone(), first_round.clone()))).await;
    let client = engine.workflow::<FnWorkflow>();
    let complete = run_to_end(&engine, json!({})).await;
    let errored = run_to_end(&engine, json!({"fail": true})).await;
    assert_eq!(
        super::support::status_of(&errored).await,
        InstanceStatus::Errored
    );
    let held = |id: &str| client.create(CreateOptions::new(json!({"hold": true})).id(id));
    let terminated = held("t").await.unwrap();
    until_status(&terminated, InstanceStatus::Waiting).await;
    terminated.terminate().await.unwrap();
    let waiting = held("w").await.unwrap();
    until_status(&waiting, InstanceStatus::Waiting).await;
    let paused = held("p").await.unwrap();
    until_status(&paused, InstanceStatus::Waiting).await;
    paused.pause().await.unwrap();
    first_round.store(false, Ordering::SeqCst);
    for instance in [&complete, &errored, &terminated, &waiting, &paused] {
        let first_output =
            records(instance, LogKind::StepSuccess).await[0].entry.meta["result"].clone();
        instance.restart().await.unwrap();
        let status = instance.wait().await.unwrap();
        assert_eq!(status.status, InstanceStatus::Complete, "{}", instance.id());
        assert_eq!(
            records(instance, LogKind::WorkflowStart).await.len(),
            1,
            "a fresh log"
        );
        assert_eq!(
            records(instance, LogKind::StepStart).await.len(),
            1,
            "the step ran again"
        );
        assert_ne!(
            status.output,
            Some(first_output),
            "a new run, not the cached one"
        );
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn h9_m11_restart_shows_running_at_once_and_completes() {
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let (engine, _dir) = engine(|b| b.register(gated(gate.clone(), second.clone()))).await;
    let instance = create(&engine, "r").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.restart().await.unwrap(); // M11: while running
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Running,
        "H9"
    );
    gate.add_permits(2);
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
    assert_eq!(second.get(), 1);
    let attempts = records(&instance, LogKind::AttemptStart).await;
    assert_eq!(
        attempts.len(),
        2,
        "the restarted run's two steps, none from before"
    );
    engine.shutdown().await;
}

fn three_steps(runs: Counter) -> FnWorkflow {
    wf(move |_, step| {
        let runs = runs.clone();
        async move {
            let a: u32 = step
                .run("step-a", |_| {
                    let n = runs.bump();
                    async move { Ok(n) }
                })
                .await?;
            step.sleep("checkpoint", "1 second").await?;
            let b: u32 = step
                .run("checkpoint", |_| {
                    let n = runs.bump();
                    async move { Ok(n) }
                })
                .await?;
            let c: u32 = step
                .run("step-c", |_| {
                    let n = runs.bump();
                    async move { Ok(n) }
                })
                .await?;
            Ok(json!([a, b, c]))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn e18_e19_restart_from_a_step_keeps_earlier_results_and_reruns_the_rest() {
    let runs = Counter::default();
    let (engine, _dir) = engine(|b| b.register(three_steps(runs.clone()))).await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!([1, 2, 3]))
    );
    // E19: no kind means the `run` named "checkpoint", not the sleep of the same name.
    instance
        .restart_from(StepKind::Run, "checkpoint", 1)
        .await
        .unwrap();
    assert_eq!(
        instance.wait().await.unwrap().output,
        Some(json!([1, 4, 5]))
    );
    assert_eq!(
        records(&instance, LogKind::SleepStart).await.len(),
        1,
        "the sleep before it was kept"
    );
    assert_eq!(
        records(&instance, LogKind::WorkflowStart).await.len(),
        1,
        "no new start record"
    );
    // E18: from the sleep named "checkpoint": the step before keeps its result.
    instance
        .restart_from(StepKind::Sleep, "checkpoint", 1)
        .await
        .unwrap();
    assert_eq!(
        instance.wait().await.unwrap().output,
        Some(json!([1, 6, 7]))
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e20_restart_from_an_unknown_step_is_an_error() {
    let runs = Counter::default();
    let (engine, _dir) = engine(|b| b.register(three_steps(runs.clone()))).await;
    let instance = run_to_end(&engine, json!({})).await;
    for (kind, name, count) in [
        (StepKind::Run, "nope", 1),
        (StepKind::Run, "step-a", 2),
        (StepKind::WaitForEvent, "step-a", 1),
    ] {
        let err = instance.restart_from(kind, name, count).await.unwrap_err();
        assert_eq!(err.code(), "instance.cannot_restart");
        assert_eq!(
            err.to_string(),
            format!("Step {name:?} not found in execution history")
        );
    }
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!([1, 2, 3])),
        "nothing changed"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn f7_restarted_instance_completes_after_a_new_event() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let e: StepEvent<u32> = step.wait_for_event("w", "go").await?;
            Ok(json!(e.payload))
        }))
    })
    .await;
    let instance = create(&engine, "f7").await;
    instance.send_event("go", &1).await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(1)));
    instance.restart().await.unwrap();
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.send_event("go", &2).await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(2)));
    engine.shutdown().await;
}

/// Sleeps a day (hibernating), then returns `"done"`.
fn sleeps_a_day() -> FnWorkflow {
    wf(|_, step| async move {
        step.sleep("s", "1 day").await?;
        Ok(json!("done"))
    })
}

#[tokio::test(start_paused = true)]
async fn b7_m5_m8_delete_removes_the_instance_and_frees_its_id() {
    let (engine, _dir) = engine(|b| b.register(sleeps_a_day())).await;
    let instance = create(&engine, "d").await;
    until_status(&instance, InstanceStatus::Waiting).await;
    instance.delete().await.unwrap();
    let client = engine.workflow::<FnWorkflow>();
    assert_eq!(
        client.get("d").await.unwrap_err().code(),
        "instance.not_found"
    );
    assert_eq!(
        instance.delete().await.unwrap_err().code(),
        "instance.not_found"
    );
    let again = create(&engine, "d").await; // M8
    assert_eq!(again.wait().await.unwrap().output, Some(json!("done")));
    assert_eq!(
        records(&again, LogKind::WorkflowQueued).await.len(),
        1,
        "nothing of the deleted one remains"
    );
    engine.shutdown().await;
}

/// A handle from `create` watches the row it wrote; once that row is deleted and the id
/// created again, a wait on the old handle follows the id to the new row.
#[tokio::test(start_paused = true)]
async fn m8_a_wait_on_a_created_handle_follows_its_id_deleted_and_created_again() {
    let (engine, _dir) = engine(|b| b.register(sleeps_a_day())).await;
    let first = create(&engine, "d").await;
    until_status(&first, InstanceStatus::Waiting).await;
    first.delete().await.unwrap();
    let again = create(&engine, "d").await;
    until_status(&again, InstanceStatus::Waiting).await;
    let status = first.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete);
    assert_eq!(status.output, Some(json!("done")));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deleting_a_running_instance_stops_it() {
    let gate = Arc::new(Semaphore::new(0));
    let second = Counter::default();
    let (engine, _dir) = engine(|b| b.register(gated(gate.clone(), second.clone()))).await;
    let instance = create(&engine, "x").await;
    until_logged(&instance, LogKind::AttemptStart, 1).await;
    instance.delete().await.unwrap();
    gate.add_permits(5);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(second.get(), 0);
    assert_eq!(engine.live_instances(), 0);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b8_b15_delete_validates_its_input() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(Value::Null) }))).await;
    let untyped = engine.workflow_by_name("test").unwrap();
    assert_eq!(
        untyped.get("").await.unwrap_err().code(),
        "instance.invalid_id"
    );
    let empty = untyped.delete_batch(&[]).await.unwrap_err();
    assert_eq!(empty.code(), "batch.empty");
    assert!(
        empty
            .to_string()
            .contains("batchDeleteInstances should have at least 1 instance")
    );
    let ids: Vec<String> = (0..101).map(|i| format!("i{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(
        untyped.delete_batch(&refs).await.unwrap_err().code(),
        "batch.too_large"
    );
    assert_eq!(
        untyped
            .delete_batch(&["ok", "not ok!"])
            .await
            .unwrap_err()
            .code(),
        "instance.invalid_id"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b11_b12_delete_batch_reports_per_position() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(Value::Null) }))).await;
    for id in ["a", "b"] {
        create(&engine, id).await.wait().await.unwrap();
    }
    let untyped = engine.workflow_by_name("test").unwrap();
    let result = untyped
        .delete_batch(&["a", "missing", "b", "a", "missing"])
        .await
        .unwrap();
    assert_eq!(
        result.deleted,
        ["a", "b", "a"],
        "duplicates deleted once, reported per position"
    );
    let errors: Vec<_> = result
        .errors
        .iter()
        .map(|e| (e.index, e.code.as_str()))
        .collect();
    assert_eq!(
        errors,
        [(1, "instance.not_found"), (4, "instance.not_found")]
    );
    assert_eq!(
        untyped.get("a").await.unwrap_err().code(),
        "instance.not_found"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn v3_b9_cron_style_ids_are_accepted_by_lookups_and_are_not_found() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(Value::Null) }))).await;
    let untyped = engine.workflow_by_name("test").unwrap();
    for id in [
        "*/30 * * * *-1786001400000",
        "0 0 * * MON#2-1786001400000",
        "0 0 1,15 * *-1786001400000",
        "NAME_123-/cron",
    ] {
        assert_eq!(
            untyped.get(id).await.unwrap_err().code(),
            "instance.not_found",
            "{id:?}"
        );
    }
    for id in ["", "invalid!", "what?", &"1".repeat(272)] {
        assert_eq!(
            untyped.get(id).await.unwrap_err().code(),
            "instance.invalid_id",
            "{id:?}"
        );
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn m10_delete_batch_with_duplicates_and_a_missing_cron_id() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(Value::Null) }))).await;
    create(&engine, "x").await.wait().await.unwrap();
    let untyped = engine.workflow_by_name("test").unwrap();
    let result = untyped
        .delete_batch(&["x", "x", "*/5 * * * *-1"])
        .await
        .unwrap();
    assert_eq!(result.deleted, ["x", "x"]);
    assert_eq!(result.errors.len(), 1);
    assert_eq!(
        (result.errors[0].index, result.errors[0].code.as_str()),
        (2, "instance.not_found")
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b6_a_handle_has_its_id_status_and_every_action() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.sleep("s", "1 day").await?;
            Ok(Value::Null)
        }))
    })
    .await;
    create(&engine, "h").await;
    let handle = engine.workflow::<FnWorkflow>().get("h").await.unwrap();
    assert_eq!(handle.id().as_str(), "h");
    until_status(&handle, InstanceStatus::Waiting).await;
    handle.pause().await.unwrap();
    handle.resume().await.unwrap();
    handle.restart().await.unwrap();
    handle.terminate().await.unwrap();
    assert_eq!(
        super::support::status_of(&handle).await,
        InstanceStatus::Terminated
    );
    handle.delete().await.unwrap();
    assert_eq!(
        handle.status().await.unwrap_err().code(),
        "instance.not_found"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b10_m9_a_workflow_deleting_its_own_instance_stops_at_that_call() {
    let engine_slot: Arc<std::sync::OnceLock<cairn::Engine>> = Arc::default();
    let after = Counter::default();
    let (slot, a) = (engine_slot.clone(), after.clone());
    let (engine, _dir) = engine(move |b| {
        b.register(wf(move |event, step| {
            let (slot, a) = (slot.clone(), a.clone());
            async move {
                step.wait_for_event::<Value>("go", "delete-yourself")
                    .await?;
                let engine = slot.get().expect("set after start").clone();
                let me = engine
                    .workflow::<FnWorkflow>()
                    .get(event.instance_id.as_str())
                    .await?;
                me.delete().await?;
                a.bump(); // never reached
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let _ = engine_slot.set(engine.clone());
    let instance = create(&engine, "self").await;
    instance
        .send_event("delete-yourself", &json!({}))
        .await
        .unwrap();
    while engine.workflow::<FnWorkflow>().get("self").await.is_ok() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(after.get(), 0, "code after the delete call never ran");
    assert_eq!(engine.live_instances(), 0);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_step_dropped_mid_attempt_does_not_block_a_later_pause() {
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let (engine, _dir) = engine(move |b| {
        b.hibernate_after(Duration::from_secs(3600))
            .register(wf(move |_, step| {
                let g = g.clone();
                async move {
                    // The slow step loses the race and is dropped with its attempt in flight.
                    tokio::select! {
                        _ = step.run("slow", |_| async {
                            std::future::pending::<()>().await;
                            Ok(())
                        }) => {}
                        _ = step.sleep("short", "5 seconds") => {}
                    }
                    step.run("next", |_| {
                        let g = g.clone();
                        async move {
                            g.acquire().await.map_err(|e| e.to_string())?.forget();
                            Ok(())
                        }
                    })
                    .await?;
                    step.run("after", |_| async { Ok(()) }).await?;
                    Ok(Value::Null)
                }
            }))
    })
    .await;
    let instance = create(&engine, "dropped").await;
    until_logged(&instance, LogKind::AttemptStart, 2).await;
    instance.pause().await.unwrap();
    gate.add_permits(1);
    until_status(&instance, InstanceStatus::Paused).await;
    assert!(
        records(&instance, LogKind::StepStart)
            .await
            .iter()
            .all(|r| r.entry.step.as_ref().unwrap().name != "after"),
        "paused before the next step"
    );
    engine.shutdown().await;
}

/// Review finding: an op the workflow dropped when it failed (a `try_join!` partner) is
/// recorded as cancelled, and a restart from a later step kept that record: the new run
/// awaited the op again and it never finished, so the instance hung. A restart from a
/// step drops cancelled ops wherever they are; the new run makes them again.
#[tokio::test(start_paused = true)]
async fn a_restart_from_a_step_makes_again_an_op_the_failed_run_dropped() {
    let fail = Arc::new(AtomicBool::new(true));
    let f = fail.clone();
    let (engine, _dir) = engine(move |b| {
        b.register(wf(move |_, step| {
            let f = f.clone();
            async move {
                let kyc = step
                    .run("kyc", move |_| {
                        let f = f.clone();
                        async move {
                            if f.load(Ordering::SeqCst) {
                                Err::<u32, _>("documents missing".into())
                            } else {
                                Ok(1)
                            }
                        }
                    })
                    .retries(Retries::new(
                        0,
                        Delay::sync(|_: &DelayContext| Duration::from_secs(1)),
                    ));
                let ((), checked) = tokio::try_join!(step.sleep("cooling off", "1 hour"), kyc)?;
                Ok(json!(checked))
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        super::support::status_of(&instance).await,
        InstanceStatus::Errored
    );
    fail.store(false, Ordering::SeqCst);
    instance
        .restart_from(StepKind::Run, "kyc", 1)
        .await
        .unwrap();
    super::support::until_status_within_hours(&instance, InstanceStatus::Complete, 48).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(1)));
    engine.shutdown().await;
}
