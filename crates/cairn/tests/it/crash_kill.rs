//! Crash consistency for real: a child process running 50 instances of a multi-step workflow
//! is SIGKILLed at seeded random moments (at least 20 times) and restarted on the same
//! database file. Every instance must complete; no step whose result was committed may run
//! again (side effects are counted outside the engine, in a file); every interrupted attempt
//! must be recorded as failed.
//!
//! The child is this test binary, run again with `CAIRN_CRASH_CHILD` set.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::{InstanceStatus, LogKind};
use serde_json::json;

const INSTANCES: usize = 50;
const STEPS: u64 = 8;
const KILLS: usize = 20;

fn workflow(effects: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let effects = effects.clone();
        async move {
            let id = event.instance_id.to_string();
            let mut total = 0u64;
            for i in 0..STEPS {
                let (effects, id) = (effects.clone(), id.clone());
                let v: u64 = step
                    .run(format!("step {i}"), move |ctx| {
                        crate::support::append_line(
                            &effects,
                            &format!("{id} {} {}", ctx.step.name.replace(' ', "_"), ctx.attempt),
                        );
                        // Widen the window in which a kill lands mid-attempt, and make the whole run
                        // (50 × 8 × 3 ms, serial on one thread) outlast 20 kill intervals of at most 50 ms.
                        std::thread::sleep(Duration::from_millis(3));
                        async move { Ok(i * 10) }
                    })
                    .await?;
                total += v;
            }
            Ok(json!(total))
        }
    })
}

fn expected() -> u64 {
    (0..STEPS).map(|i| i * 10).sum()
}

/// The child: create the instances (idempotently) and run until all are done.
#[test]
fn child_process_entry() {
    let Some(dir) = crate::support::crash_child_dir() else {
        return; // not a child: nothing to do in a normal test run
    };
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.join("cairn.db"))
            .register(workflow(dir.join("effects.txt")))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        crate::support::create_numbered(&client, INSTANCES).await;
        crate::support::wait_numbered(&client, INSTANCES).await;
        engine.shutdown().await;
    });
}

#[test]
fn killed_process_resumes_every_instance_without_rerunning_committed_steps() {
    let seed = crate::support::test_seed("crash_kill");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill::child_process_entry",
        seed,
        KILLS,
        50,
    );
    assert!(kills >= KILLS, "only {kills} kills landed");

    let effects = std::fs::read_to_string(dir.path().join("effects.txt")).unwrap();
    let mut runs: HashMap<(String, String), Vec<u32>> = HashMap::new();
    for line in effects.lines() {
        let mut parts = line.split(' ');
        let (id, step, attempt) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        runs.entry((id.to_owned(), step.replace('_', " ")))
            .or_default()
            .push(attempt.parse().unwrap());
    }

    let rt = crate::support::paused_runtime();
    let interrupted = rt.block_on(async {
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(workflow(dir.path().join("unused.txt")))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        let mut interrupted = 0;
        for i in 0..INSTANCES {
            let instance = client.get(&format!("i{i}")).await.unwrap();
            let status = instance.status().await.unwrap();
            assert_eq!(status.status, InstanceStatus::Complete, "i{i}");
            assert_eq!(status.output, Some(json!(expected())), "i{i}");
            let details = instance.details().await.unwrap();
            assert_eq!(details.steps.len(), STEPS as usize);
            for step in &details.steps {
                let seen = runs.get(&(format!("i{i}"), step.name.clone())).cloned().unwrap_or_default();
                let final_attempt = step.attempts.last().unwrap().attempt;
                let mut sorted = seen.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), seen.len(), "i{i} {}: an attempt number ran twice: {seen:?}", step.name);
                assert!(
                    seen.iter().all(|a| *a <= final_attempt),
                    "i{i} {}: the body ran after its result was committed: ran {seen:?}, succeeded at {final_attempt}",
                    step.name
                );
                assert!(seen.contains(&final_attempt), "i{i} {}: the successful attempt's effect is missing", step.name);
                for a in &step.attempts[..step.attempts.len() - 1] {
                    let error = a.error.as_ref().expect("an earlier attempt failed");
                    assert_eq!(error.name, "WorkflowInternalError");
                    assert_eq!(error.message, "Attempt failed due to internal workflows error");
                    interrupted += 1;
                }
            }
            let starts = crate::support::records(&instance, LogKind::WorkflowStart).await;
            assert_eq!(starts.len(), 1, "i{i} started once");
        }
        engine.shutdown().await;
        interrupted
    });
    eprintln!("{interrupted} interrupted attempts were recorded and retried");
}
