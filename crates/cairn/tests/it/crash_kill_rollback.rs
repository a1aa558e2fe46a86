//! Crash consistency of rollbacks: a child process running 20 instances, each with four
//! compensated steps and then a failure, is SIGKILLed at seeded random moments (at least 20
//! times): during forward steps, during handlers and between them. After the last run every
//! instance is errored with its rollback completed; each step was compensated (recorded)
//! exactly once, in reverse start order; a handler ran again only for an attempt recorded as
//! interrupted; and each compensation's effect (idempotent by key) happened once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind};
use serde_json::Value;

const INSTANCES: usize = 20;
const STEPS: usize = 4;
const KILLS: usize = 20;

fn workflow(dir: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let dir = dir.clone();
        async move {
            let id = event.instance_id.to_string();
            for i in 0..STEPS {
                let (dir, id) = (dir.clone(), id.clone());
                step.run(format!("s{i}"), |_| async {
                    std::thread::sleep(Duration::from_millis(3));
                    Ok(i)
                })
                .rollback(move |rb: Rollback<usize>| {
                    let (dir, id) = (dir.clone(), id.clone());
                    async move {
                        // Every execution is counted; the effect is applied once per key.
                        crate::support::append_line(
                            &dir.join("executions.txt"),
                            &format!("{id} {}", rb.ctx.step.name),
                        );
                        std::thread::sleep(Duration::from_millis(6));
                        let key = format!("{id} {}", rb.ctx.step.name);
                        let effects = dir.join("effects.txt");
                        let done = std::fs::read_to_string(&effects).unwrap_or_default();
                        if !done.lines().any(|l| l == key) {
                            crate::support::append_line(&effects, &key);
                        }
                        Ok(())
                    }
                })
                .await?;
            }
            Err::<Value, _>("the last step failed".into())
        }
    })
}

#[test]
fn child_process_entry_rollback() {
    let Some(dir) = crate::support::crash_child_dir() else {
        return; // not a child: nothing to do in a normal test run
    };
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.join("cairn.db"))
            .register(workflow(dir.clone()))
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
fn killed_during_rollbacks_every_compensation_completes_once_in_order() {
    let seed = crate::support::test_seed("crash_kill_rollback");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_rollback::child_process_entry_rollback",
        seed,
        KILLS,
        25,
    );
    assert!(kills >= KILLS, "only {kills} kills landed");

    let mut executions: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(dir.path().join("executions.txt"))
        .unwrap()
        .lines()
    {
        *executions.entry(line.to_owned()).or_default() += 1;
    }
    let effects = std::fs::read_to_string(dir.path().join("effects.txt")).unwrap();
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(workflow(dir.path().join("unused")))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        let mut interrupted_total = 0;
        for i in 0..INSTANCES {
            let id = format!("i{i}");
            let instance = client.get(&id).await.unwrap();
            let status = instance.status().await.unwrap();
            assert_eq!(status.status, InstanceStatus::Errored, "{id}");
            assert_eq!(
                status.error.unwrap().message,
                "the last step failed",
                "{id}"
            );
            assert_eq!(status.rollback.unwrap().outcome, "completed", "{id}");
            let log = instance.log(0).await.unwrap();
            let compensated: Vec<String> = log
                .iter()
                .filter(|r| r.entry.kind == LogKind::RollbackStepSuccess)
                .map(|r| r.entry.step.as_ref().unwrap().name.clone())
                .collect();
            assert_eq!(
                compensated,
                ["s3", "s2", "s1", "s0"],
                "{id}: once each, reverse start order"
            );
            assert_eq!(
                log.iter()
                    .filter(|r| r.entry.kind == LogKind::RollbackStart)
                    .count(),
                1,
                "{id}"
            );
            assert_eq!(
                log.iter()
                    .filter(|r| r.entry.kind == LogKind::RollbackComplete)
                    .count(),
                1,
                "{id}"
            );
            for s in 0..STEPS {
                let name = format!("s{s}");
                let interrupted = log
                    .iter()
                    .filter(|r| {
                        r.entry.kind == LogKind::RollbackAttemptFailure
                            && r.entry.step.as_ref().is_some_and(|k| k.name == name)
                    })
                    .count();
                interrupted_total += interrupted;
                let ran = executions
                    .get(&format!("{id} {name}"))
                    .copied()
                    .unwrap_or(0);
                assert!(
                    ran >= 1 && ran <= 1 + interrupted,
                    "{id} {name}: ran {ran} times, {interrupted} interrupted"
                );
                let effect_lines = effects
                    .lines()
                    .filter(|l| *l == format!("{id} {name}"))
                    .count();
                assert_eq!(
                    effect_lines, 1,
                    "{id} {name}: the compensation's effect happened once"
                );
            }
        }
        eprintln!("{interrupted_total} interrupted rollback attempts were recorded and retried");
        engine.shutdown().await;
    });
}
