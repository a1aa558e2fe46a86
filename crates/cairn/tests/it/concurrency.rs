//! Keyed concurrency, rate limits and priority (issue 19, part 3): at most the limit of a
//! key's instances run at once (checked from the event log's timestamps), the waiting ones
//! start by priority, then age, a hibernated instance frees its slot unless the key holds
//! it, the rate holds over a virtual hour, and the limits hold across an engine restart.

use std::collections::HashMap;
use std::time::Duration;

use super::support::{FnWorkflow, builder_at, most_at_once, wf};
use cairn::prelude::*;
use cairn::{Concurrency, InstanceStatus, LogKind};
use serde_json::{Value, json};

/// A step that takes `ms` of (virtual) time.
fn working(ms: u64) -> FnWorkflow {
    wf(move |_, step| async move {
        step.run("work", move |_| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(())
        })
        .await?;
        Ok(Value::Null)
    })
}

/// Each instance's running interval: its `WORKFLOW_START` to its end record.
async fn interval(instance: &cairn::Instance<Value>) -> (i64, i64) {
    let log = instance.log(0).await.unwrap();
    let at = |kinds: &[LogKind]| {
        log.iter()
            .find(|r| kinds.contains(&r.entry.kind))
            .map(|r| r.entry.at)
            .unwrap_or_else(|| panic!("{} has no {kinds:?}", instance.id()))
    };
    (
        at(&[LogKind::WorkflowStart]).as_millis(),
        at(&[LogKind::WorkflowSuccess, LogKind::WorkflowFailure]).as_millis(),
    )
}

async fn create_keyed(
    engine: &Engine,
    n: usize,
    key: impl Fn(usize) -> String,
    priority: impl Fn(usize) -> i32,
) -> Vec<cairn::Instance<Value>> {
    let client = engine.workflow::<FnWorkflow>();
    let mut all = Vec::new();
    for start in (0..n).step_by(100) {
        let batch = (start..n.min(start + 100))
            .map(|i| {
                CreateOptions::new(json!({}))
                    .id(format!("i{i}"))
                    .concurrency_key(key(i))
                    .priority(priority(i))
            })
            .collect();
        all.extend(client.create_batch(batch).await.unwrap());
    }
    all
}

#[tokio::test(start_paused = true)]
async fn a_limit_of_2_per_key_holds_for_1000_instances_over_10_keys_and_all_complete() {
    let dir = tempfile::tempdir().unwrap();
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(working(50))
        .concurrency("test", Concurrency::limit(2))
        .start()
        .await
        .unwrap();
    let all = create_keyed(&engine, 1000, |i| format!("k{}", i % 10), |_| 0).await;
    let mut by_key: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for (i, instance) in all.iter().enumerate() {
        assert_eq!(instance.wait().await.unwrap().status, InstanceStatus::Complete);
        by_key
            .entry(format!("k{}", i % 10))
            .or_default()
            .push(interval(instance).await);
    }
    for (key, intervals) in &by_key {
        assert_eq!(most_at_once(intervals), 2, "{key}: never more than 2, and 2 used");
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn waiting_instances_start_by_priority_then_age_and_say_why_they_wait() {
    let dir = tempfile::tempdir().unwrap();
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(wf(|event, step| async move {
            if event.payload["block"] == true {
                let _: StepEvent<Value> = step.wait_for_event("go", "go").await?;
            }
            step.run("work", |_| async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(())
            })
            .await?;
            Ok(Value::Null)
        }))
        .concurrency("test", Concurrency::limit(1).hold_while_waiting())
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let blocker = client
        .create(
            CreateOptions::new(json!({ "block": true }))
                .id("blocker")
                .concurrency_key("k"),
        )
        .await
        .unwrap();
    super::support::until_status(&blocker, InstanceStatus::Waiting).await;
    let mut waiting = Vec::new();
    for (id, priority) in [("low1", 0), ("low2", 0), ("high1", 10), ("low3", 0), ("high2", 10)] {
        waiting.push(
            client
                .create(
                    CreateOptions::new(json!({}))
                        .id(id)
                        .concurrency_key("k")
                        .priority(priority),
                )
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d = waiting[1].details().await.unwrap();
    assert_eq!(d.status, InstanceStatus::Queued);
    let why = d.waiting_for_slot.expect("it says why it waits");
    assert_eq!((why.key.as_str(), why.position), ("k", 4), "behind high1, high2, low1");
    assert_eq!(d.concurrency_key.as_deref(), Some("k"));

    blocker.send_event("go", &json!(1)).await.unwrap();
    let mut starts = Vec::new();
    for w in &waiting {
        assert_eq!(w.wait().await.unwrap().status, InstanceStatus::Complete);
        starts.push((interval(w).await.0, w.id().to_string()));
    }
    starts.sort();
    let order: Vec<&str> = starts.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(order, ["high1", "high2", "low1", "low2", "low3"]);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_hibernated_instance_frees_its_slot_unless_the_key_holds_it() {
    for hold in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let limits = if hold {
            Concurrency::limit(1).hold_while_waiting()
        } else {
            Concurrency::limit(1)
        };
        let engine = builder_at(&dir.path().join("cairn.db"))
            .register(wf(|event, step| async move {
                if event.payload["nap"] == true {
                    step.sleep("nap", "1 hour").await?;
                }
                Ok(Value::Null)
            }))
            .concurrency("test", limits)
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        let napper = client
            .create(CreateOptions::new(json!({ "nap": true })).concurrency_key("k"))
            .await
            .unwrap();
        super::support::until_status(&napper, InstanceStatus::Waiting).await;
        let quick = client
            .create(CreateOptions::new(json!({})).concurrency_key("k"))
            .await
            .unwrap();
        quick.wait().await.unwrap();
        napper.wait().await.unwrap();
        let (napped, quick_end) = (interval(&napper).await.1, interval(&quick).await.1);
        if hold {
            assert!(quick_end >= napped, "the napper held the slot");
        } else {
            assert!(quick_end < napped, "the napper's hibernation freed the slot");
        }
        engine.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_of_5_starts_per_10_minutes_holds_over_a_virtual_hour() {
    let dir = tempfile::tempdir().unwrap();
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(working(10))
        .concurrency(
            "test",
            Concurrency::limit(100).rate(5, Duration::from_secs(600)),
        )
        .start()
        .await
        .unwrap();
    let all = create_keyed(&engine, 20, |_| "k".to_owned(), |_| 0).await;
    let mut starts = Vec::new();
    for instance in &all {
        assert_eq!(instance.wait().await.unwrap().status, InstanceStatus::Complete);
        starts.push(interval(instance).await.0);
    }
    starts.sort_unstable();
    let first = starts[0];
    let span = starts[19] - first;
    assert!(span >= 30 * 60_000, "20 starts at 5 per 10 minutes take 30 minutes: {span}");
    for window in starts.windows(6) {
        assert!(
            window[5] - window[0] >= 600_000,
            "6 starts within 10 minutes: {window:?}"
        );
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_limit_holds_across_an_engine_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    let start = || {
        builder_at(&path)
            .register(working(100))
            .concurrency("test", Concurrency::limit(2))
            .start()
    };
    let engine = start().await.unwrap();
    let all = create_keyed(&engine, 60, |i| format!("k{}", i % 3), |_| 0).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    engine.shutdown().await;
    let engine = start().await.unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let mut by_key: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for (i, instance) in all.iter().enumerate() {
        let instance = client.get(instance.id().as_str()).await.unwrap();
        assert_eq!(instance.wait().await.unwrap().status, InstanceStatus::Complete);
        by_key
            .entry(format!("k{}", i % 3))
            .or_default()
            .push(interval(&instance).await);
    }
    for (key, intervals) in &by_key {
        assert!(most_at_once(intervals) <= 2, "{key}");
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_key_needs_a_configured_limit_and_a_valid_name() {
    let dir = tempfile::tempdir().unwrap();
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(working(1))
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let e = client
        .create(CreateOptions::new(json!({})).concurrency_key("k"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "concurrency.not_configured");
    engine.shutdown().await;
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(working(1))
        .concurrency("test", Concurrency::limit(1))
        .start()
        .await
        .unwrap();
    for bad in [String::new(), "x".repeat(101), "a\nb".to_owned()] {
        let e = engine
            .workflow::<FnWorkflow>()
            .create(CreateOptions::new(json!({})).concurrency_key(bad))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "concurrency.invalid_key");
    }
    engine.shutdown().await;
}
