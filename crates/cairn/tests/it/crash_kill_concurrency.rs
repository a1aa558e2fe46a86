//! Keyed concurrency across crashes: a child process running 60 instances over 3 keys with
//! a limit of 2 per key is SIGKILLed at seeded random moments (at least 10 times) and
//! restarted on the same database. After the last run every instance completed, and no key
//! ever ran more than 2 at once (from the event log: a slot stays with its instance across
//! a crash and, held while waiting, through the back-off of an interrupted attempt, so an
//! instance's interval runs from its start to its end).
//!
//! The child is this test binary, run again with `CAIRN_CRASH_CHILD` set.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::prelude::*;
use cairn::{Clock, Concurrency, InstanceStatus, LogKind};
use serde_json::{Value, json};

const INSTANCES: usize = 60;
const KILLS: usize = 10;

fn workflow() -> FnWorkflow {
    wf(|_, step| async move {
        for i in 0..2 {
            step.run(format!("work {i}"), |_| async {
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            })
            .await?;
        }
        Ok(Value::Null)
    })
}

/// Two per key, held through hibernation: an attempt a kill interrupts is retried after a
/// back-off, and the instance keeps its slot meanwhile, so its start-to-end interval is
/// the time it holds a slot.
fn limits() -> Concurrency {
    Concurrency::limit(2).hold_while_waiting()
}

fn key(i: usize) -> String {
    format!("k{}", i % 3)
}

#[test]
fn child_process_entry_concurrency() {
    let Some(dir) = crate::support::crash_child_dir() else {
        return; // not a child: nothing to do in a normal test run
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.join("cairn.db"))
            .clock(Clock::system())
            .register(workflow())
            .concurrency("test", limits())
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        for i in 0..INSTANCES {
            let options = CreateOptions::new(json!({}))
                .id(format!("i{i}"))
                .concurrency_key(key(i));
            let _ = client.create(options).await; // exists after an earlier run
        }
        for i in 0..INSTANCES {
            client
                .get(&format!("i{i}"))
                .await
                .unwrap()
                .wait()
                .await
                .unwrap();
        }
        engine.shutdown().await;
    });
}

#[test]
fn killed_while_keyed_instances_run_no_key_exceeds_its_limit() {
    let seed = crate::support::test_seed("crash_kill_concurrency");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_concurrency::child_process_entry_concurrency",
        seed,
        KILLS,
        40,
    );
    assert!(kills >= KILLS, "only {kills} kills landed");
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(workflow())
            .concurrency("test", limits())
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        let mut by_key: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
        for i in 0..INSTANCES {
            let instance = client.get(&format!("i{i}")).await.unwrap();
            assert_eq!(
                instance.status().await.unwrap().status,
                InstanceStatus::Complete,
                "i{i}"
            );
            let log = instance.log(0).await.unwrap();
            let at = |kind| {
                log.iter()
                    .find(|r| r.entry.kind == kind)
                    .map(|r| r.entry.at.as_millis())
                    .unwrap()
            };
            by_key
                .entry(key(i))
                .or_default()
                .push((at(LogKind::WorkflowStart), at(LogKind::WorkflowSuccess)));
        }
        for (key, intervals) in &by_key {
            let most = crate::support::most_at_once(intervals);
            assert!(most <= 2, "{key}: {most} ran at once");
        }
        engine.shutdown().await;
    });
}
