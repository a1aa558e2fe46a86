//! `cairn::testing::Simulation`: a workflow under seeded faults, checked against its
//! fault-free run; the same seed injects the same faults; a workflow that is not
//! deterministic is caught and its seed named; step bodies are counted by the workflow's own
//! ledger, every event sent is accounted for, and crashed engines live on as zombies whose
//! writes the fence refuses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::prelude::*;
use cairn::testing::{Faults, Ledger, Simulation};
use serde_json::{Value, json};

/// How many seeds a simulation test runs: `CAIRN_SIM_SEEDS`, or `default`.
pub(crate) fn seeds(default: u64) -> u64 {
    std::env::var("CAIRN_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Everything the engine journals: retried steps, a parallel pair, a sleep, an event wait,
/// and a failing step whose rollbacks run. Every step body records itself in `ledger`.
fn everything(fail: bool, ledger: Ledger) -> FnWorkflow {
    wf(move |event, step| {
        let ledger = ledger.clone();
        async move {
            let l = ledger.clone();
            let a: u64 = step
                .run("a", move |ctx| {
                    l.record(&ctx);
                    async move {
                        if ctx.attempt == 1 {
                            Err("flaky".into())
                        } else {
                            Ok(1)
                        }
                    }
                })
                .retries(Retries::constant(6, Duration::from_secs(1)))
                .rollback(|_: Rollback<u64>| async { Ok(()) })
                .await?;
            let (lb, lc) = (ledger.clone(), ledger.clone());
            let (b, c): (u64, u64) = futures::try_join!(
                step.run("b", move |ctx| {
                    lb.record(&ctx);
                    async { Ok(10) }
                }),
                step.run("c", move |ctx| {
                    lc.record(&ctx);
                    async { Ok(100) }
                }),
            )?;
            step.sleep("nap", "10 minutes").await?;
            let approval = step
                .wait_for_event::<Value>("approval", "approve")
                .timeout("1 day")
                .await?;
            let l = ledger.clone();
            step.run("d", move |ctx| {
                l.record(&ctx);
                async { Ok(()) }
            })
            .rollback(|_: Rollback<()>| async { Ok(()) })
            .await?;
            if fail || event.payload["fail"] == true {
                let l = ledger.clone();
                step.run("e", move |ctx| {
                    l.record(&ctx);
                    async { Err::<(), _>(NonRetryableError::new("declined").into()) }
                })
                .await?;
            }
            Ok(json!({"sum": a + b + c, "by": approval.payload}))
        }
    })
}

#[tokio::test]
async fn a_workflow_under_seeded_faults_ends_as_its_fault_free_run() {
    let n = seeds(40);
    let ledger = Ledger::new();
    let l = ledger.clone();
    let report = Simulation::new::<FnWorkflow>(json!({}))
        .unwrap()
        .register(move |b| b.register(everything(false, l.clone())))
        .ledger(&ledger)
        .event("approve", json!("ada"))
        .unwrap()
        .seeds(0..n)
        .run()
        .await
        .unwrap();
    eprintln!("{report:?}");
    assert_eq!(report.seeds, n);
    assert!(report.faults >= n, "{report:?}");
    assert!(report.crashes > 0, "{report:?}");
    assert!(report.zombies > 0, "{report:?}");
    assert!(report.zombie_writes_refused > 0, "{report:?}");
}

#[tokio::test]
async fn compensations_under_seeded_faults_run_once_in_reverse_order() {
    let n = seeds(40);
    let ledger = Ledger::new();
    let l = ledger.clone();
    let report = Simulation::new::<FnWorkflow>(json!({"fail": true}))
        .unwrap()
        .register(move |b| b.register(everything(true, l.clone())))
        .ledger(&ledger)
        .event("approve", json!("bob"))
        .unwrap()
        .seeds(1000..1000 + n)
        .run()
        .await
        .unwrap();
    assert!(report.crashes > 0, "{report:?}");
}

/// Waits for three events of one type between steps, and for one of another type that is
/// sent twice: the items arrive in the order sent, and the second note stays buffered.
fn waits(ledger: Ledger) -> FnWorkflow {
    wf(move |_, step| {
        let ledger = ledger.clone();
        async move {
            let mut items = Vec::new();
            for i in 0..3u64 {
                let l = ledger.clone();
                step.run(format!("work {i}"), move |ctx| {
                    l.record(&ctx);
                    async move {
                        if ctx.attempt == 1 && i == 1 {
                            Err("flaky".into())
                        } else {
                            Ok(i)
                        }
                    }
                })
                .retries(Retries::constant(8, Duration::from_secs(1)))
                .await?;
                let item = step
                    .wait_for_event::<Value>(format!("item {i}"), "item")
                    .timeout("1 day")
                    .await?;
                items.push(item.payload);
            }
            let note = step
                .wait_for_event::<Value>("note", "note")
                .timeout("1 day")
                .await?;
            Ok(json!({"items": items, "note": note.payload}))
        }
    })
}

#[tokio::test]
async fn events_under_seeded_faults_are_each_delivered_once_in_the_order_sent() {
    let n = seeds(40);
    let ledger = Ledger::new();
    let l = ledger.clone();
    let mut simulation = Simulation::new::<FnWorkflow>(json!({}))
        .unwrap()
        .register(move |b| b.register(waits(l.clone())))
        .ledger(&ledger);
    for (event_type, payload) in [
        ("item", json!("first")),
        ("note", json!("kept")),
        ("item", json!("second")),
        ("item", json!("third")),
        ("note", json!("left buffered")),
    ] {
        simulation = simulation.event(event_type, payload).unwrap();
    }
    let report = simulation.seeds(2000..2000 + n).run().await.unwrap();
    eprintln!("{report:?}");
    let duplicates = report
        .trace
        .iter()
        .flat_map(|(_, t)| t)
        .filter(|f| f.starts_with("duplicate event"))
        .count();
    assert!(duplicates > 0, "no event was sent twice: {report:?}");
}

#[tokio::test]
async fn a_body_run_the_engine_does_not_count_is_caught_by_the_ledger() {
    // The body records itself twice per call, as a body the engine ran again without
    // counting it would: the engine's own account (one run per attempt) cannot see it.
    let ledger = Ledger::new();
    let l = ledger.clone();
    let err = Simulation::new::<FnWorkflow>(json!({}))
        .unwrap()
        .register(move |b| {
            let l = l.clone();
            b.register(wf(move |_, step| {
                let l = l.clone();
                async move {
                    step.run("charge", move |ctx| {
                        l.record(&ctx);
                        l.record(&ctx);
                        async { Ok(()) }
                    })
                    .await?;
                    Ok(Value::Null)
                }
            }))
        })
        .ledger(&ledger)
        .seeds(0..1)
        .run()
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(
            "by the workflow's ledger, the body of step charge-1 ran 2 times for attempt 1"
        ),
        "{message}"
    );
}

/// One step at a time, so the order of its writes is the code's.
fn sequential() -> FnWorkflow {
    wf(|_, step| async move {
        let mut total = 0u64;
        for i in 0..6u64 {
            total += step
                .run(format!("step {i}"), move |ctx| async move {
                    if ctx.attempt == 1 && i % 2 == 0 {
                        Err("flaky".into())
                    } else {
                        Ok(i)
                    }
                })
                .retries(Retries::constant(8, Duration::from_secs(1)))
                .await?;
        }
        step.sleep("nap", "1 hour").await?;
        let by = step
            .wait_for_event::<Value>("approval", "approve")
            .timeout("1 day")
            .await?;
        Ok(json!({"total": total, "by": by.payload}))
    })
}

#[tokio::test]
async fn the_same_seed_injects_the_same_faults() {
    // Store faults on writes only: how many calls an outage reaches, and when the
    // simulator's own actions come relative to the writes, follow the run's timing.
    let run = |seed| async move {
        Simulation::new::<FnWorkflow>(json!({}))
            .unwrap()
            .register(|b| b.register(sequential()))
            .event("approve", json!("ada"))
            .unwrap()
            .faults(Faults {
                outages: false,
                clock_jumps: false,
                duplicate_events: false,
                pauses: false,
                ..Faults::default()
            })
            .seeds(seed..seed + 8)
            .run()
            .await
            .unwrap()
    };
    // Each seed's store faults land on the same write numbers: one run's list is the start of
    // the other's (a run may make fewer writes than another, as its timing goes).
    let writes = |report: &cairn::testing::SimulationReport| -> Vec<(u64, Vec<String>)> {
        report
            .trace
            .iter()
            .map(|(seed, faults)| {
                let writes = faults.iter().filter(|f| f.starts_with("write")).cloned();
                (*seed, writes.collect())
            })
            .collect()
    };
    for seed in [17, 400, 9000] {
        let (first, second) = (run(seed).await, run(seed).await);
        assert!(first.trace.iter().any(|(_, t)| !t.is_empty()), "{first:?}");
        for ((s, a), (_, b)) in writes(&first).into_iter().zip(writes(&second)) {
            let n = a.len().min(b.len());
            assert_eq!(a[..n], b[..n], "seed {s}");
        }
    }
}

#[tokio::test]
async fn a_workflow_that_is_not_deterministic_is_caught_and_its_seed_named() {
    // Its output counts the lifetimes that ran it: a crash makes it differ.
    let err = Simulation::new::<FnWorkflow>(json!({}))
        .unwrap()
        .world(|| {
            let runs = Arc::new(AtomicU32::new(0));
            move |b: cairn::EngineBuilder| {
                let runs = runs.clone();
                b.register(wf(move |_, step| {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    async move {
                        step.run("a", |_| async { Ok(()) }).await?;
                        step.run("b", |_| async { Ok(()) }).await?;
                        Ok(json!(n))
                    }
                }))
            }
        })
        .faults(Faults {
            rate: 0.5,
            ..Faults::default()
        })
        .seeds(0..50)
        .run()
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with("seed "), "{message}");
    assert!(message.contains("Simulation::seed("), "{message}");
    assert!(message.contains("the fault-free run returned"), "{message}");
}
