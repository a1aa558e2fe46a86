//! Cron schedules across real crashes: a child process running a schedule of every second
//! (on the real clock) is SIGKILLed at seeded random moments and restarted on the same
//! database file. With `RunAll` catch-up and overlapping runs allowed, every second from
//! the first tick to the last must have fired exactly once, and every run completed, its
//! step's effect committed once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::{CatchUp, Clock, InstanceStatus, ListOptions, Overlap, Schedule};
use serde_json::{Value, json};

/// Ticks the child waits for before it stops by itself.
const TICKS: usize = 10;
const KILLS: usize = 6;

fn workflow(effects: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let effects = effects.clone();
        async move {
            let id = event.instance_id.to_string();
            step.run("effect", move |ctx| {
                crate::support::append_line(&effects, &format!("{id} {}", ctx.attempt));
                async move { Ok(1) }
            })
            .await?;
            Ok(Value::Null)
        }
    })
}

fn schedule() -> Schedule {
    Schedule::new::<FnWorkflow>("sec", "* * * * * *", json!({}))
        .unwrap()
        .overlap(Overlap::Allow)
        .catch_up(CatchUp::RunAll(1_000))
}

async fn ticks(engine: &cairn::Engine) -> Vec<String> {
    let page = engine
        .list_instances(
            Some("test"),
            &ListOptions::default().id_prefix("sec-").limit(1_000),
        )
        .await
        .unwrap();
    let mut ids: Vec<String> = page.instances.iter().map(|i| i.id.to_string()).collect();
    ids.sort();
    ids
}

/// The child: run the schedule until `TICKS` ticks have fired and completed.
#[test]
fn child_process_entry_schedule() {
    let Some(dir) = crate::support::crash_child_dir() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.join("cairn.db"))
            .clock(Clock::system())
            .register(workflow(dir.join("effects.txt")))
            .min_schedule_interval(Duration::from_secs(1))
            .schedule(schedule())
            .start()
            .await
            .unwrap();
        loop {
            let ids = ticks(&engine).await;
            if ids.len() >= TICKS {
                let client = engine.workflow::<FnWorkflow>();
                for id in &ids {
                    client.get(id).await.unwrap().wait().await.unwrap();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        engine.shutdown().await;
    });
}

#[test]
fn killed_around_ticks_a_schedule_fires_every_second_once() {
    let seed = crate::support::test_seed("crash_kill_schedule");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_schedule::child_process_entry_schedule",
        seed,
        KILLS,
        1_500,
    );
    let effects = std::fs::read_to_string(dir.path().join("effects.txt")).unwrap_or_default();
    let mut attempts: HashMap<String, Vec<u32>> = HashMap::new();
    for line in effects.lines() {
        let (id, attempt) = line.split_once(' ').unwrap();
        attempts
            .entry(id.to_owned())
            .or_default()
            .push(attempt.parse().unwrap());
    }
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(workflow(dir.path().join("unused.txt")))
            .start()
            .await
            .unwrap();
        let ids = ticks(&engine).await;
        assert!(ids.len() >= TICKS, "{ids:?}");
        // Consecutive seconds from the first tick to the last: none skipped by a kill.
        let seconds: Vec<i64> = ids
            .iter()
            .map(|id| {
                let t = chrono::NaiveDateTime::parse_from_str(&id[4..], "%Y%m%d%H%M%S").unwrap();
                t.and_utc().timestamp()
            })
            .collect();
        for pair in seconds.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                1,
                "a tick was skipped ({kills} kills): {ids:?}"
            );
        }
        let client = engine.workflow::<FnWorkflow>();
        for id in &ids {
            let instance = client.get(id).await.unwrap();
            assert_eq!(
                instance.status().await.unwrap().status,
                InstanceStatus::Complete,
                "{id}"
            );
            // The step's effect: each attempt number once; the last one is the committed one.
            let seen = attempts.get(id).cloned().unwrap_or_default();
            let mut unique = seen.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(
                unique.len(),
                seen.len(),
                "{id}: an attempt ran twice: {seen:?}"
            );
            let details = instance.details().await.unwrap();
            let committed = details.steps[0].attempts.last().unwrap().attempt;
            assert!(
                seen.iter().all(|a| *a <= committed),
                "{id}: ran after its commit: {seen:?}"
            );
        }
        engine.shutdown().await;
    });
}
