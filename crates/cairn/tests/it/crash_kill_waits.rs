//! Crash consistency through sleeps and event waits: a child process running 40 instances of
//! "step, sleep 10 minutes, wait for an event, step" is SIGKILLed at seeded random moments
//! (at least 20 times) and restarted on the same database. The child sends each instance its
//! event itself, so kills also land between a send and its delivery. After the last run:
//! every instance completed, every sleep woke exactly at its original time (virtual clock),
//! every wait took exactly one event, and no committed step body ran again.
//!
//! The child is this test binary, run again with `CAIRN_CRASH_CHILD` set.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind};
use serde_json::json;

const INSTANCES: usize = 40;
const KILLS: usize = 20;

fn workflow(effects: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let effects = effects.clone();
        async move {
            let id = event.instance_id.to_string();
            let body = |name: &'static str| {
                let (effects, id) = (effects.clone(), id.clone());
                move |ctx: StepContext| {
                    crate::support::append_line(&effects, &format!("{id} {name} {}", ctx.attempt));
                    // 40 instances × 2 bodies × 8 ms, serial on one thread, outlast 20 kill
                    // intervals of at most 25 ms.
                    std::thread::sleep(Duration::from_millis(8));
                    async move { Ok(name.len()) }
                }
            };
            let a: usize = step.run("before", body("before")).await?;
            step.sleep("nap", "10 minutes").await?;
            let go: StepEvent<u32> = step.wait_for_event("go", "go").timeout("1 hour").await?;
            let b: usize = step.run("after", body("after")).await?;
            Ok(json!([a, go.payload, b]))
        }
    })
}

#[test]
fn child_process_entry_waits() {
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
        for i in 0..INSTANCES {
            // Sent at most once per marker; a kill between the send and the marker sends twice.
            let marker = dir.join(format!("sent-{i}"));
            if !marker.exists() {
                let instance = client.get(&format!("i{i}")).await.unwrap();
                if instance.send_event("go", &(i as u32)).await.is_ok() {
                    std::fs::write(&marker, b"").unwrap();
                }
            }
        }
        crate::support::wait_numbered(&client, INSTANCES).await;
        engine.shutdown().await;
    });
}

#[test]
fn killed_during_sleeps_and_event_waits_every_timer_and_event_survives() {
    let seed = crate::support::test_seed("crash_kill_waits");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_waits::child_process_entry_waits",
        seed,
        KILLS,
        25,
    );
    assert!(kills >= KILLS, "only {kills} kills landed");

    let runs = crate::support::read_effects(&dir.path().join("effects.txt"));
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(workflow(dir.path().join("unused.txt")))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        for i in 0..INSTANCES {
            let instance = client.get(&format!("i{i}")).await.unwrap();
            let status = instance.status().await.unwrap();
            assert_eq!(status.status, InstanceStatus::Complete, "i{i}");
            assert_eq!(
                status.output,
                Some(json!([6, i, 5])),
                "i{i} got its own event"
            );
            let log = instance.log(0).await.unwrap();
            let at = |kind| {
                log.iter()
                    .find(|r| r.entry.kind == kind)
                    .map(|r| r.entry.at)
                    .unwrap()
            };
            // The completion of the sleep rides with a later commit: once, and before the
            // records of what came after it.
            let kinds: Vec<LogKind> = log.iter().map(|r| r.entry.kind).collect();
            let pos = |kind| kinds.iter().position(|k| *k == kind).unwrap();
            assert_eq!(
                kinds
                    .iter()
                    .filter(|k| **k == LogKind::SleepComplete)
                    .count(),
                1,
                "i{i}: {kinds:?}"
            );
            assert!(
                pos(LogKind::SleepComplete) < pos(LogKind::WaitComplete),
                "i{i}: {kinds:?}"
            );
            let slept = at(LogKind::SleepComplete).since(at(LogKind::SleepStart));
            assert!(
                slept >= Duration::from_secs(600) && slept < Duration::from_secs(601),
                "i{i} slept {slept:?}: not at its original wake time"
            );
            assert_eq!(
                log.iter()
                    .filter(|r| r.entry.kind == LogKind::WaitComplete)
                    .count(),
                1,
                "i{i}"
            );
            crate::support::assert_no_body_reran(&runs, &instance.details().await.unwrap());
        }
        engine.shutdown().await;
    });
}
