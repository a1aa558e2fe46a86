//! Keyed concurrency, rate limits and priority (issue 19, part 3): at most the limit of a
//! key's instances run at once (checked from the event log's timestamps), the waiting ones
//! start by priority, then age, a hibernated instance frees its slot unless the key holds
//! it, the rate holds over a virtual hour, and the limits hold across an engine restart.
//! A slot holder that is terminated, restarted, deleted or paused gives its slot to the
//! next waiter at once (one terminated with rollback when its rollback ends); a waiter that
//! is terminated, restarted, deleted or paused leaves the line without taking a slot.

use std::collections::HashMap;
use std::time::Duration;

use super::support::{FnWorkflow, builder_at, most_at_once, status_of, wf};
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

// Management requests on slot holders and waiters (issue 30 §6).

/// Waits for the event `go` when its params say `block` (holding its slot: the key holds
/// slots while waiting), then runs one step with a rollback.
fn blocking_on_go() -> FnWorkflow {
    wf(|event, step| async move {
        step.run("prepare", |_| async { Ok(()) })
            .rollback(|_: Rollback<()>| async { Ok(()) })
            .await?;
        if event.payload["block"] == true {
            let _: StepEvent<Value> = step
                .wait_for_event("go", "go")
                .timeout("365 days")
                .await?;
        }
        step.run("work", |_| async { Ok(()) }).await?;
        Ok(Value::Null)
    })
}

/// An engine whose key `k` has one slot, held while waiting.
async fn one_slot(dir: &tempfile::TempDir) -> Engine {
    builder_at(&dir.path().join("cairn.db"))
        .register(blocking_on_go())
        .concurrency("test", Concurrency::limit(1).hold_while_waiting())
        .start()
        .await
        .unwrap()
}

async fn keyed(engine: &Engine, id: &str, block: bool) -> cairn::Instance<Value> {
    engine
        .workflow::<FnWorkflow>()
        .create(
            CreateOptions::new(json!({ "block": block }))
                .id(id)
                .concurrency_key("k"),
        )
        .await
        .unwrap()
}

/// A bound on waits for what must happen at once: an hour of virtual time, in which the
/// engine looks for claimable instances many times over.
const AT_ONCE: Duration = Duration::from_secs(3600);

/// Waits (within [`AT_ONCE`]) until `instance` has `status`.
async fn reaches(instance: &cairn::Instance<Value>, status: InstanceStatus) {
    let reached = tokio::time::timeout(AT_ONCE, instance.wait_for(|s| s.status == status)).await;
    assert!(
        reached.is_ok(),
        "{} did not reach {status} (it is {})",
        instance.id(),
        instance.status().await.unwrap().status
    );
}

/// Waits (within [`AT_ONCE`]) until `instance` waits for a slot of its key.
async fn parked(instance: &cairn::Instance<Value>) {
    let waiting = tokio::time::timeout(AT_ONCE, async {
        while instance.details().await.unwrap().waiting_for_slot.is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waiting.is_ok(), "{} never waited for a slot", instance.id());
}

/// A holder of the key's one slot, blocked on `go`, and a waiter in line behind it.
async fn holder_and_waiter(engine: &Engine) -> (cairn::Instance<Value>, cairn::Instance<Value>) {
    let holder = keyed(engine, "holder", true).await;
    reaches(&holder, InstanceStatus::Waiting).await;
    let waiter = keyed(engine, "waiter", false).await;
    parked(&waiter).await;
    (holder, waiter)
}

#[tokio::test(start_paused = true)]
async fn terminating_a_slot_holder_gives_its_slot_to_the_next_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_slot(&dir).await;
    let (holder, waiter) = holder_and_waiter(&engine).await;
    holder.terminate().await.unwrap();
    reaches(&waiter, InstanceStatus::Complete).await;
    assert_eq!(holder.status().await.unwrap().status, InstanceStatus::Terminated);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn terminating_a_slot_holder_with_rollback_gives_its_slot_back_when_the_rollback_ends() {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_slot(&dir).await;
    let (holder, waiter) = holder_and_waiter(&engine).await;
    holder.terminate_with_rollback().await.unwrap();
    reaches(&holder, InstanceStatus::Terminated).await;
    assert_eq!(
        super::support::targets(&holder, LogKind::RollbackStepSuccess).await,
        ["prepare-1"],
        "its compensation ran"
    );
    reaches(&waiter, InstanceStatus::Complete).await;
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deleting_a_slot_holder_gives_its_slot_to_the_next_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_slot(&dir).await;
    let (holder, waiter) = holder_and_waiter(&engine).await;
    holder.delete().await.unwrap();
    reaches(&waiter, InstanceStatus::Complete).await;
    assert_eq!(
        holder.status().await.unwrap_err().code(),
        "instance.not_found"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn pausing_a_slot_holder_gives_its_slot_to_the_next_waiter_and_its_resume_waits_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_slot(&dir).await;
    let (holder, waiter) = holder_and_waiter(&engine).await;
    holder.pause().await.unwrap();
    reaches(&holder, InstanceStatus::Paused).await;
    reaches(&waiter, InstanceStatus::Complete).await;
    // Resumed, it takes the free slot again and goes back to its wait, holding it.
    holder.resume().await.unwrap();
    reaches(&holder, InstanceStatus::Waiting).await;
    let next = keyed(&engine, "next", false).await;
    parked(&next).await;
    holder.send_event("go", &json!(1)).await.unwrap();
    reaches(&holder, InstanceStatus::Complete).await;
    reaches(&next, InstanceStatus::Complete).await;
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn restarting_a_slot_holder_gives_its_slot_to_the_waiter_ahead_and_the_new_run_waits() {
    let dir = tempfile::tempdir().unwrap();
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let permits = release.clone();
    // One slot, let go while hibernating: `napper` naps (giving its slot back), `holder`
    // holds the slot in a step until the test lets it finish.
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(wf(move |event, step| {
            let permits = permits.clone();
            async move {
                if event.payload["nap"] == true {
                    step.sleep("nap", "1 minute").await?;
                }
                step.run("work", move |_| {
                    let permits = permits.clone();
                    let hold = event.payload["hold"] == true;
                    async move {
                        if hold {
                            permits.acquire().await.unwrap().forget();
                        }
                        Ok(())
                    }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
        .concurrency("test", Concurrency::limit(1))
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let create = |id: &'static str, params: Value| {
        let client = client.clone();
        async move {
            client
                .create(CreateOptions::new(params).id(id).concurrency_key("k"))
                .await
                .unwrap()
        }
    };
    let napper = create("napper", json!({ "nap": true })).await;
    reaches(&napper, InstanceStatus::Waiting).await;
    let holder = create("holder", json!({ "hold": true })).await;
    // The napper wakes and waits for the slot the holder holds: it is ahead of any run
    // that starts after it (it ran before, and is older).
    parked(&napper).await;
    assert_eq!(status_of(&holder).await, InstanceStatus::Running);
    holder.restart().await.unwrap();
    // The restart gave the slot back: the napper takes it, and the new run waits for it.
    reaches(&napper, InstanceStatus::Complete).await;
    release.add_permits(1);
    reaches(&holder, InstanceStatus::Complete).await;
    let (napped, held) = (interval(&napper).await, interval(&holder).await);
    assert!(
        napped.1 <= held.0,
        "the new run started after the napper ended: {napped:?} {held:?}"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_terminated_restarted_deleted_or_paused_leaves_the_line_without_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_slot(&dir).await;
    let holder = keyed(&engine, "holder", true).await;
    reaches(&holder, InstanceStatus::Waiting).await;
    let mut line = Vec::new();
    for id in ["terminated", "rolled-back", "deleted", "paused", "restarted", "last"] {
        let waiter = keyed(&engine, id, false).await;
        parked(&waiter).await;
        line.push(waiter);
    }
    let [terminated, rolled_back, deleted, paused, restarted, last] = &line[..] else {
        unreachable!()
    };
    terminated.terminate().await.unwrap();
    // Terminating with rollback does not wait for a slot: it ends while the holder holds it.
    rolled_back.terminate_with_rollback().await.unwrap();
    reaches(rolled_back, InstanceStatus::Terminated).await;
    deleted.delete().await.unwrap();
    paused.pause().await.unwrap();
    restarted.restart().await.unwrap();
    assert_eq!(terminated.status().await.unwrap().status, InstanceStatus::Terminated);
    assert_eq!(paused.status().await.unwrap().status, InstanceStatus::Paused);
    assert_eq!(
        holder.status().await.unwrap().status,
        InstanceStatus::Waiting,
        "no waiter took the holder's slot"
    );
    // The holder ends: the slot goes down the line, past the ones that left it.
    holder.send_event("go", &json!(1)).await.unwrap();
    reaches(&holder, InstanceStatus::Complete).await;
    reaches(restarted, InstanceStatus::Complete).await;
    reaches(last, InstanceStatus::Complete).await;
    assert_eq!(paused.status().await.unwrap().status, InstanceStatus::Paused);
    paused.resume().await.unwrap();
    reaches(paused, InstanceStatus::Complete).await;
    let mut intervals = Vec::new();
    for instance in [&holder, restarted, last, paused] {
        intervals.push(interval(instance).await);
    }
    // At most one: on the virtual clock all four may run within one millisecond (seen
    // under a loaded machine), and intervals that only touch do not overlap.
    assert!(
        most_at_once(&intervals) <= 1,
        "one at a time: {intervals:?}"
    );
    engine.shutdown().await;
}

/// Bodies of a key's instances running now, and the most ever at once.
#[derive(Clone, Default)]
struct AtOnce(std::sync::Arc<(std::sync::atomic::AtomicU32, std::sync::atomic::AtomicU32)>);

impl AtOnce {
    async fn inside<T>(&self, body: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.0.0.fetch_add(1, SeqCst) + 1;
        self.0.1.fetch_max(now, SeqCst);
        let out = body.await;
        self.0.0.fetch_sub(1, SeqCst);
        out
    }

    fn most(&self) -> u32 {
        self.0.1.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A failed instance's rollback is the instance's work like any other: when it lets its
/// slot go (it hibernates while a compensation waits to be retried) it takes one again
/// before it goes on. Only a terminate with rollback compensates without a slot. Before,
/// any rollback was exempt, so the second compensation attempt ran beside the instance
/// that had taken the slot meanwhile: two at once under a limit of 1.
#[tokio::test(start_paused = true)]
async fn a_failed_instance_rolling_back_after_a_hibernation_waits_for_a_slot_again() {
    let dir = tempfile::tempdir().unwrap();
    let at_once = AtOnce::default();
    let seen = at_once.clone();
    // Compensation calls, across the instance's lifetimes: the first one fails.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(wf(move |event, step| {
            let (at_once, calls) = (seen.clone(), calls.clone());
            async move {
                if event.payload["fail"] != true {
                    let busy = at_once.clone();
                    step.run("work", move |_| {
                        let busy = busy.clone();
                        async move {
                            busy.inside(tokio::time::sleep(Duration::from_secs(8 * 60)))
                                .await;
                            Ok(())
                        }
                    })
                    .await?;
                    return Ok(Value::Null);
                }
                let (handler, calls) = (at_once.clone(), calls.clone());
                step.run("prepare", |_| async { Ok(()) })
                    .rollback_config(&StepConfig {
                        retries: Some(Retries::constant(3, Duration::from_secs(5 * 60))),
                        ..StepConfig::default()
                    })
                    .rollback(move |_: Rollback<()>| {
                        let handler = handler.clone();
                        let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                        async move {
                            handler
                                .inside(async {
                                    if first {
                                        Err("not yet".into())
                                    } else {
                                        Ok(())
                                    }
                                })
                                .await
                        }
                    })
                    .await?;
                Err("boom".into())
            }
        }))
        .concurrency("test", Concurrency::limit(1))
        .hibernate_after(Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let failing = client
        .create(CreateOptions::new(json!({ "fail": true })).id("a").concurrency_key("k"))
        .await
        .unwrap();
    let working = client
        .create(CreateOptions::new(json!({})).id("b").concurrency_key("k"))
        .await
        .unwrap();
    reaches(&working, InstanceStatus::Complete).await;
    reaches(&failing, InstanceStatus::Errored).await;
    assert_eq!(
        failing.status().await.unwrap().rollback.unwrap().outcome,
        "completed"
    );
    assert_eq!(at_once.most(), 1, "a compensation ran beside the slot's holder");
    engine.shutdown().await;
}

/// A key's limit raised (the engine restarted with a higher one): the instances already
/// waiting get the new slots, not only the instance whose create wrote the new limit.
/// Before, they were woken only when a holder let a slot go, so free slots sat unused
/// while older instances waited, and newer ones went ahead of them.
#[tokio::test(start_paused = true)]
async fn a_raised_limit_gives_its_new_slots_to_the_instances_already_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_slot(&dir).await;
    let (holder, waiter) = holder_and_waiter(&engine).await;
    let second = keyed(&engine, "second", false).await;
    parked(&second).await;
    engine.shutdown().await;
    drop(engine);
    let engine = builder_at(&dir.path().join("cairn.db"))
        .register(blocking_on_go())
        .concurrency("test", Concurrency::limit(3).hold_while_waiting())
        .start()
        .await
        .unwrap();
    let newer = keyed(&engine, "newer", true).await;
    let client = engine.workflow::<FnWorkflow>();
    for earlier in [&waiter, &second] {
        let earlier = client.get(earlier.id().as_str()).await.unwrap();
        reaches(&earlier, InstanceStatus::Complete).await;
    }
    reaches(&newer, InstanceStatus::Waiting).await;
    let holder = client.get(holder.id().as_str()).await.unwrap();
    assert_eq!(holder.status().await.unwrap().status, InstanceStatus::Waiting);
    engine.shutdown().await;
}
