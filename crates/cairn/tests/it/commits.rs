//! What each commit carries (issue 34): a step's success rides with the lifetime's next
//! commit instead of one of its own, and the instance's start with its first. These tests
//! hold the rule that makes that safe, seen from inside the bodies: when a body runs, its
//! own start is durable, and so is the success of every step the code awaited before it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn::prelude::*;
use cairn::store::Store;
use cairn::{InstanceStatus, LogKind, StepState};
use serde_json::{Value, json};

use super::support::{BACKEND, kinds, raw_store_on, temp_db, wf};

/// What one body saw in the store when it ran: each step's state and whether an attempt
/// of it was in flight.
type Seen = Arc<Mutex<HashMap<String, HashMap<String, (StepState, bool)>>>>;

/// The store's view of instance `x`'s steps, by name.
async fn stored_steps(store: &dyn Store) -> HashMap<String, (StepState, bool)> {
    super::support::journal_of(store, "test", "x")
        .await
        .into_iter()
        .map(|s| (s.key.name, (s.state, s.in_flight)))
        .collect()
}

/// A second engine on `store`, running `workflow`, takes instance `x` over: the engine, the
/// instance and how it ended.
async fn x_run_to_its_end_again(
    store: &Arc<dyn Store>,
    workflow: super::support::FnWorkflow,
) -> (cairn::Engine, cairn::Instance<Value>, cairn::Status<Value>) {
    let engine = cairn::Engine::builder()
        .store(Arc::clone(store))
        .register(workflow)
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .get("x")
        .await
        .unwrap();
    let status = instance.wait().await.unwrap();
    (engine, instance, status)
}

/// A body that notes what the store holds when it runs, then returns `n`.
fn noting(
    store: &Arc<dyn Store>,
    seen: &Seen,
    name: &'static str,
    n: u64,
) -> impl FnMut(
    cairn::StepContext,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64, StepError>> + Send>>
+ Send
+ 'static {
    let (store, seen) = (Arc::clone(store), Arc::clone(seen));
    move |_| {
        let (store, seen) = (Arc::clone(&store), Arc::clone(&seen));
        Box::pin(async move {
            let steps = stored_steps(&*store).await;
            seen.lock().unwrap().insert(name.to_owned(), steps);
            Ok(n)
        })
    }
}

/// SPEC A.7 with one commit per step: sequential steps, a pair run together, a sleep and
/// an event wait between them. Each body finds its own attempt durable and in flight, and
/// every step awaited before it durable as succeeded, although no success was committed
/// alone; the instance's log still reads in the order things happened.
#[tokio::test]
async fn a7_a_steps_success_is_durable_before_the_next_body_runs_and_its_start_before_its_own()
{
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let seen = Seen::default();
    let (s, n) = (Arc::clone(&store), Arc::clone(&seen));
    let engine = cairn::Engine::builder()
        .store(Arc::clone(&store))
        .register(wf(move |_, step| {
            let (s, n) = (Arc::clone(&s), Arc::clone(&n));
            async move {
                let a = step.run("a", noting(&s, &n, "a", 1)).await?;
                let b = step.run("b", noting(&s, &n, "b", 2)).await?;
                let (c, d) = futures::try_join!(
                    step.run("c", noting(&s, &n, "c", 3)),
                    step.run("d", noting(&s, &n, "d", 4)),
                )?;
                step.sleep("nap", std::time::Duration::from_millis(1))
                    .await?;
                let e = step.run("e", noting(&s, &n, "e", 5)).await?;
                let event = step
                    .wait_for_event::<u64>("go", "go")
                    .timeout("1 hour")
                    .await?;
                let f = step.run("f", noting(&s, &n, "f", 6)).await?;
                Ok(json!(a + b + c + d + e + event.payload + f))
            }
        }))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    instance.send_event("go", &100).await.unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(status.output, Some(json!(121)));

    let seen = seen.lock().unwrap().clone();
    let before: [(&str, &[&str]); 6] = [
        ("a", &[]),
        ("b", &["a"]),
        ("c", &["a", "b"]),
        ("d", &["a", "b"]),
        ("e", &["a", "b", "c", "d", "nap"]),
        ("f", &["a", "b", "c", "d", "nap", "e", "go"]),
    ];
    for (body, done) in before {
        let steps = &seen[body];
        assert_eq!(
            steps.get(body),
            Some(&(StepState::Running, true)),
            "step {body}'s start is durable, its attempt in flight, when its body runs: {steps:?}"
        );
        for earlier in done {
            assert_eq!(
                steps.get(*earlier).map(|s| s.0),
                Some(StepState::Succeeded),
                "{earlier} was awaited before {body} started: its success is durable when {body}'s body runs: {steps:?}"
            );
        }
    }
    let log: Vec<LogKind> = kinds(&instance)
        .await
        .into_iter()
        .filter(|k| {
            matches!(
                k,
                LogKind::WorkflowStart
                    | LogKind::StepStart
                    | LogKind::StepSuccess
                    | LogKind::WorkflowSuccess
            )
        })
        .collect();
    assert_eq!(log.first(), Some(&LogKind::WorkflowStart), "{log:?}");
    assert_eq!(log.last(), Some(&LogKind::WorkflowSuccess), "{log:?}");
    assert_eq!(
        log.iter().filter(|k| **k == LogKind::StepSuccess).count(),
        6,
        "{log:?}"
    );
    engine.shutdown().await;
}

/// A step that succeeds and the workflow's failure right after it: the handler of the
/// step's rollback gets the step's output, although the success was not committed alone
/// (the rollback reads the journal from the store).
#[tokio::test]
async fn r_a_rollback_right_after_a_step_gets_the_output_its_success_had_not_committed_alone() {
    let got: Arc<Mutex<Option<Option<u64>>>> = Arc::default();
    let g = Arc::clone(&got);
    let (engine, _dir) = super::support::engine(move |b| {
        b.register(wf(move |_, step| {
            let g = Arc::clone(&g);
            async move {
                step.run("pay", |_| async { Ok(42u64) })
                    .rollback(move |r: cairn::Rollback<u64>| {
                        let g = Arc::clone(&g);
                        async move {
                            *g.lock().unwrap() = Some(r.output);
                            Ok(())
                        }
                    })
                    .await?;
                Err::<Value, _>(WorkflowError::new("Error", "then it fails"))
            }
        }))
    })
    .await;
    let instance = super::support::run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().status,
        InstanceStatus::Errored
    );
    assert_eq!(*got.lock().unwrap(), Some(Some(42)));
    engine.shutdown().await;
}

/// A step's success rides with the next commit; here that commit (step `b`'s start, made
/// first of the two the pair starts) does not land, while the one after it (step `c`'s
/// start) does and answers first. `c` was started with `a`'s output, so its body must not
/// run: the commit of its start answers success only once the commit carrying `a`'s
/// success is known to have landed. The run stops instead, and a new engine finishes the
/// instance, running `a` again. Before, `c`'s body ran while `a`'s success was nowhere.
#[tokio::test]
async fn a7_no_body_runs_after_the_commit_carrying_an_earlier_success_failed_alone() {
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = super::support::Gates::default();
    let seen = Seen::default();
    let started: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    // A third branch the test completes, and hears back from: the workflow has been polled
    // since (`c`'s op with it, in the same poll).
    let (poke, poked) = tokio::sync::oneshot::channel::<()>();
    let (heard, hear) = tokio::sync::oneshot::channel::<()>();
    let probe = Arc::new(Mutex::new(Some((poked, heard))));
    let workflow = |store: &Arc<dyn Store>, seen: &Seen| {
        let (s, n, started, probe) = (
            Arc::clone(store),
            Arc::clone(seen),
            Arc::clone(&started),
            Arc::clone(&probe),
        );
        wf(move |_, step| {
            let (s, n, started) = (Arc::clone(&s), Arc::clone(&n), Arc::clone(&started));
            let probe = probe.lock().unwrap().take();
            async move {
                let body = |name: &'static str, out: u64| {
                    let (s, n, started) = (Arc::clone(&s), Arc::clone(&n), Arc::clone(&started));
                    move |_: cairn::StepContext| {
                        // Seen at once, in the poll that starts the body.
                        started.lock().unwrap().push(name);
                        let (s, n) = (Arc::clone(&s), Arc::clone(&n));
                        async move {
                            let steps = stored_steps(&*s).await;
                            n.lock().unwrap().insert(name.to_owned(), steps);
                            Ok::<u64, StepError>(out)
                        }
                    }
                };
                let probe = async move {
                    if let Some((poked, heard)) = probe {
                        let _ = poked.await;
                        let _ = heard.send(());
                    }
                    Ok::<(), WorkflowError>(())
                };
                // An attempt interrupted by the stop is retried at once.
                let quick = cairn::Retries::constant(3, std::time::Duration::ZERO);
                let a = step.run("a", body("a", 1)).retries(quick.clone()).await?;
                let (b, c, ()) = futures::try_join!(
                    step.run("b", body("b", a + 1)).retries(quick.clone()),
                    step.run("c", body("c", a + 2)).retries(quick),
                    probe,
                )?;
                Ok(json!(a + b + c))
            }
        })
    };
    let first = super::support::gated_builder_on(Arc::clone(&store), gates.clone())
        .register(workflow(&store, &seen))
        .start()
        .await
        .unwrap();
    // The first commit (the instance's start with `a`'s) is held until the next two are
    // armed: `b`'s start, carrying `a`'s success, never lands; `c`'s lands, its answer held.
    let first_commit = gates.arm("commit");
    let instance = first
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    first_commit.arrived().await;
    let carrying = gates.arm_failing("commit");
    let after_it = gates.arm("commit");
    first_commit.release();
    carrying.arrived().await;
    after_it.arrived().await;
    while !stored_steps(&*store).await.contains_key("c") {
        tokio::task::yield_now().await;
    }
    // `c`'s start has landed: let its answer through, then hear from the workflow.
    after_it.release();
    poke.send(()).unwrap();
    hear.await.unwrap();
    assert_eq!(
        *started.lock().unwrap(),
        ["a"],
        "c's body started while the commit carrying a's success had not landed"
    );
    carrying.release();
    first.shutdown().await;
    drop(instance);

    // A new engine finishes it; every body it runs finds what came before it durable.
    seen.lock().unwrap().clear();
    drop(store);
    let store = raw_store_on(BACKEND, &path).await;
    let (second, _, status) = x_run_to_its_end_again(&store, workflow(&store, &seen)).await;
    assert_eq!(status.output, Some(json!(1 + 2 + 3)), "{status:?}");
    let seen = seen.lock().unwrap().clone();
    for body in ["b", "c"] {
        assert_eq!(
            seen[body].get("a").map(|s| s.0),
            Some(StepState::Succeeded),
            "{body}: {seen:?}"
        );
    }
    second.shutdown().await;
}

/// Starts `builder`'s engine and creates instance `x` of its workflow `FnWorkflow<0>`,
/// whose first commit (its first step's start) is held at the returned gate.
async fn started_with_its_first_commit_held(
    builder: cairn::EngineBuilder,
    gates: &super::support::Gates,
) -> (
    cairn::Engine,
    cairn::Instance<Value>,
    super::support::Gate,
) {
    let engine = builder.start().await.unwrap();
    let start = gates.arm("commit");
    let instance = engine
        .workflow::<super::support::FnWorkflow<0>>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    start.arrived().await;
    (engine, instance, start)
}

/// Step `a`, whose output counts its runs (1, then 2 once a lost success runs it again),
/// then an await that is not an op: the driver flushes `a`'s success meanwhile. The lost
/// success leaves `a`'s first attempt interrupted, retried at once (the default back-off
/// would make the test wait 10 s of wall time for the second).
async fn counted_then_flushed(
    step: &WorkflowStep,
    runs: &Arc<std::sync::atomic::AtomicU64>,
) -> Result<u64, WorkflowError> {
    let runs = Arc::clone(runs);
    let a = step
        .run("a", move |_| {
            let n = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move { Ok(n) }
        })
        .retries(cairn::Retries::constant(3, std::time::Duration::ZERO))
        .await?;
    tokio::task::yield_now().await;
    Ok(a)
}

/// Lets the held first commit (`a`'s start) through, fails the next one (the driver's
/// flush of `a`'s success), and once the workflow says it got as far as the commit under
/// test (`reached`), asserts that this commit, `what`, was not sent while the flush was
/// on its way. This test's runtime has one thread: the driver has gone on as far as it
/// could in the poll that sent the signal.
async fn sent_only_after_the_failing_flush(
    gates: &super::support::Gates,
    start: super::support::Gate,
    reached: tokio::sync::oneshot::Receiver<()>,
    what: &str,
) {
    let flush = gates.arm_failing("commit");
    let next = gates.arm("commit");
    start.release();
    flush.arrived().await;
    reached.await.unwrap();
    tokio::task::yield_now().await;
    assert!(
        !next.has_arrived(),
        "{what} was sent while the commit carrying a's success was on its way"
    );
    next.release();
    flush.release();
}

/// The driver's flush carries `a`'s success (the workflow awaited something that is not
/// an op) and is still on its way when the workflow invokes a child made from `a`'s output.
/// The child's creation is sent only once that flush has landed. Here it never lands: the
/// next run runs `a` again, gets another output, and the child is made from that one.
/// Before, the child was created at once from the first output, which the failed flush
/// left in no journal: the parent went on with the second output, the child with the first.
#[tokio::test]
async fn a7_a_child_made_from_an_output_is_created_only_once_the_commit_carrying_it_landed() {
    use super::support::{FnWorkflow, Gates, gated_builder, named};
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (polled, has_polled) = tokio::sync::oneshot::channel::<()>();
    let polled = Arc::new(Mutex::new(Some(polled)));
    let parent = named::<0, _, _>(move |_, step| {
        let (runs, polled) = (Arc::clone(&runs), polled.lock().unwrap().take());
        async move {
            let a = counted_then_flushed(&step, &runs).await?;
            let mut child = std::pin::pin!(futures::future::maybe_done(
                step.invoke::<FnWorkflow<1>>("child", json!({ "a": a }))
            ));
            // Polled once: its commit is sent, or waits for the flush to land.
            let _ = futures::poll!(child.as_mut());
            if let Some(polled) = polled {
                let _ = polled.send(());
            }
            child.as_mut().await;
            let child = child.as_mut().take_output().unwrap()?;
            Ok(json!({ "a": a, "child": child }))
        }
    });
    let child = named::<1, _, _>(|event, _| async move { Ok(event.payload) });
    let builder = gated_builder(BACKEND, &path, gates.clone()).await;
    let (engine, instance, start) =
        started_with_its_first_commit_held(builder.register(parent).register(child), &gates)
            .await;
    sent_only_after_the_failing_flush(&gates, start, has_polled, "the child's creation").await;
    let status = instance.wait().await.unwrap();
    assert_eq!(
        status.output,
        Some(json!({ "a": 2, "child": { "a": 2 } })),
        "{status:?}"
    );
    engine.shutdown().await;
}

/// As for a child, so for anything else made from an output but an attempt's start: here
/// a sleep whose length is `a`'s output in hours. The flush carrying `a`'s success is on
/// its way when the sleep starts; its start (the wake-up time, kept by every replay) is
/// sent only once that flush has landed. The flush fails: the next run runs `a` again,
/// gets 2, and sleeps two hours. When only a child's creation and the end waited (5328b58),
/// the sleep's start landed at once, and the replay kept one hour from an output no
/// journal held.
#[tokio::test]
async fn a7_a_sleep_made_from_an_output_is_started_only_once_the_commit_carrying_it_landed() {
    use super::support::{Gates, gated_builder_on, journal_of, named};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (polled, has_polled) = tokio::sync::oneshot::channel::<()>();
    let polled = Arc::new(Mutex::new(Some(polled)));
    let workflow = named::<0, _, _>(move |_, step| {
        let (runs, polled) = (Arc::clone(&runs), polled.lock().unwrap().take());
        async move {
            let a = counted_then_flushed(&step, &runs).await?;
            let mut nap = std::pin::pin!(futures::future::maybe_done(
                step.sleep("nap", std::time::Duration::from_secs(3600 * a))
            ));
            // Polled once: its start is sent, or waits for the flush to land.
            let _ = futures::poll!(nap.as_mut());
            if let Some(polled) = polled {
                let _ = polled.send(());
            }
            nap.as_mut().await;
            nap.as_mut().take_output().unwrap()?;
            Ok(json!(a))
        }
    });
    let builder = gated_builder_on(Arc::clone(&store), gates.clone());
    let (engine, _instance, start) =
        started_with_its_first_commit_held(builder.register(workflow), &gates).await;
    sent_only_after_the_failing_flush(&gates, start, has_polled, "the sleep's start").await;
    let nap = loop {
        let journal = journal_of(&*store, "test", "x").await;
        if let Some(nap) = journal.into_iter().find(|s| s.key.name == "nap") {
            break nap;
        }
        tokio::task::yield_now().await;
    };
    let hours = (nap.wake_at.unwrap().as_millis() - nap.started_at.as_millis()) / 3_600_000;
    assert_eq!(hours, 2, "the sleep was made from a's lost output: {nap:?}");
    engine.shutdown().await;
}

/// The instance's end, made from an output whose flush is on its way, is sent only once
/// that flush has landed. It fails: the next run runs `a` again, and the instance ends
/// with the output `a` gives then, the one its journal holds.
#[tokio::test]
async fn a7_the_end_made_from_an_output_is_committed_only_once_the_commit_carrying_it_landed() {
    use super::support::{Gates, gated_builder, named};
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (returned, has_returned) = tokio::sync::oneshot::channel::<()>();
    let returned = Arc::new(Mutex::new(Some(returned)));
    let workflow = named::<0, _, _>(move |_, step| {
        let (runs, returned) = (Arc::clone(&runs), returned.lock().unwrap().take());
        async move {
            let a = counted_then_flushed(&step, &runs).await?;
            if let Some(returned) = returned {
                let _ = returned.send(());
            }
            Ok(json!(a))
        }
    });
    let builder = gated_builder(BACKEND, &path, gates.clone()).await;
    let (engine, instance, start) =
        started_with_its_first_commit_held(builder.register(workflow), &gates).await;
    sent_only_after_the_failing_flush(&gates, start, has_returned, "the instance's end").await;
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!(2)), "{status:?}");
    engine.shutdown().await;
}

/// An op the workflow drops while its start has landed and its answer waits for the
/// commit carrying an earlier success is recorded as cancelled (the losing branch of a
/// `select!`), as one dropped while its attempt ran. Before, it was left running in a
/// finished instance: its record was marked in progress only once the answer came.
#[tokio::test]
async fn an_op_dropped_while_its_start_waits_for_an_earlier_commit_is_recorded_as_cancelled() {
    use super::support::{Gates, gated_builder_on, journal_of, named};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let (drop_it, dropped) = tokio::sync::oneshot::channel::<()>();
    let dropped = Arc::new(Mutex::new(Some(dropped)));
    let workflow = named::<0, _, _>(move |_, step| {
        let dropped = dropped.lock().unwrap().take();
        async move {
            step.run("a", |_| async { Ok(1u64) }).await?;
            // Not an op: the driver flushes `a`'s success meanwhile.
            tokio::task::yield_now().await;
            let Some(dropped) = dropped else {
                return Ok(json!("again"));
            };
            tokio::select! {
                biased;
                _ = dropped => {}
                x = step.run("x", |_| async { Ok(2u64) }) => { x?; }
            }
            Ok(json!("done"))
        }
    });
    let builder = gated_builder_on(Arc::clone(&store), gates.clone());
    let (engine, instance, start) =
        started_with_its_first_commit_held(builder.register(workflow), &gates).await;
    let flush = gates.arm("commit");
    start.release();
    flush.arrived().await;
    // `x`'s start is sent at once and lands; its answer waits for the flush.
    while !stored_steps(&*store).await.contains_key("x") {
        tokio::task::yield_now().await;
    }
    drop_it.send(()).unwrap();
    flush.release();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!("done")), "{status:?}");
    let x = journal_of(&*store, "test", "x")
        .await
        .into_iter()
        .find(|s| s.key.name == "x")
        .unwrap();
    assert_eq!(x.state, StepState::Cancelled, "{x:?}");
    engine.shutdown().await;
}

/// Two steps started side by side as a new instance's first ops: the first's start
/// carries the instance's first start; the second's is not sent before that has landed.
/// Here that commit fails alone: nothing of the run is stored, and the next lifetime,
/// which reads no journal for an instance never started, runs both afresh, each started
/// once. Before, the second start was sent at once and could land alone: the next
/// lifetime, taking the instance for a new one, started that step a second time (a second
/// `STEP_START`, and its interrupted attempt not counted).
#[tokio::test]
async fn a7_no_step_start_lands_before_the_instances_first_start() {
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = super::support::Gates::default();
    let workflow = || {
        wf(|_, step| async move {
            let (a, b) = futures::try_join!(
                step.run("a", |_| async { Ok(1u64) }),
                step.run("b", |_| async { Ok(2u64) }),
            )?;
            Ok(json!(a + b))
        })
    };
    let first = super::support::gated_builder_on(Arc::clone(&store), gates.clone())
        .register(workflow())
        .start()
        .await
        .unwrap();
    let carrying = gates.arm_failing("commit");
    let beside = gates.arm("commit");
    let instance = first
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    carrying.arrived().await;
    // The lifetime's poll that sent `a`'s start is over (this runtime has one thread).
    assert!(
        !beside.has_arrived(),
        "b's start was sent while the commit carrying the instance's first start was on its way"
    );
    carrying.release();
    first.shutdown().await;
    beside.release();
    drop(instance);
    drop(store);
    let store = raw_store_on(BACKEND, &path).await;
    assert!(stored_steps(&*store).await.is_empty());
    let (second, instance, status) = x_run_to_its_end_again(&store, workflow()).await;
    assert_eq!(status.output, Some(json!(3)), "{status:?}");
    let starts: Vec<String> = super::support::records(&instance, LogKind::StepStart)
        .await
        .into_iter()
        .filter_map(|r| r.entry.step.map(|k| k.name))
        .collect();
    assert_eq!(starts.len(), 2, "each step started once: {starts:?}");
    second.shutdown().await;
}

/// A step dropped while its start, carrying the step before's success, is on its way (the
/// losing branch of a `select!`), and then an await that is not an op: the driver, which
/// makes no commit while one is on its way, is woken once that start has landed and
/// commits the dropped step's cancel, while the workflow still waits. Nothing else would
/// wake it: the start is followed to its end on a task of its own.
#[tokio::test]
async fn a7_the_driver_waiting_for_a_dropped_steps_start_is_woken_once_it_landed() {
    use super::support::{Gates, gated_builder_on, named};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let (drop_it, dropped) = tokio::sync::oneshot::channel::<()>();
    let (go_on, proceed) = tokio::sync::oneshot::channel::<()>();
    let held = Arc::new(Mutex::new(Some((dropped, proceed))));
    let workflow = named::<0, _, _>(move |_, step| {
        let held = held.lock().unwrap().take();
        async move {
            step.run("a", |_| async { Ok(1u64) }).await?;
            let Some((dropped, proceed)) = held else {
                return Ok(json!("again"));
            };
            tokio::select! {
                biased;
                _ = dropped => {}
                x = step.run("x", |_| async { Ok(2u64) }) => { x?; }
            }
            // Not an op, and nothing the engine wakes.
            let _ = proceed.await;
            Ok(json!("done"))
        }
    });
    let builder = gated_builder_on(Arc::clone(&store), gates.clone());
    let (engine, instance, start) =
        started_with_its_first_commit_held(builder.register(workflow), &gates).await;
    // `x`'s start, which carries `a`'s success, is held on its way.
    let x_start = gates.arm("commit");
    start.release();
    x_start.arrived().await;
    drop_it.send(()).unwrap();
    x_start.release();
    let cancelled = async {
        while stored_steps(&*store).await.get("x").map(|(state, _)| *state)
            != Some(StepState::Cancelled)
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), cancelled)
        .await
        .expect("the driver commits the dropped step's cancel while the workflow waits");
    go_on.send(()).unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!("done")), "{status:?}");
    assert_eq!(stored_steps(&*store).await["a"].0, StepState::Succeeded);
    engine.shutdown().await;
}

/// The driver's flush carries `pay`'s success and is still on its way when the workflow
/// fails right after: the rollback reads the journal (for the handlers' outputs) only
/// once that commit has landed. Before, the flush was dropped with the workflow and the
/// read went ahead of it: the handler could find `pay` still running, and no output.
#[tokio::test]
async fn r_a_rollback_reads_the_journal_only_once_the_commit_carrying_the_last_success_landed()
{
    use super::support::{Gates, gated_builder, named};
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let got: Arc<Mutex<Option<Option<u64>>>> = Arc::default();
    let (failing, has_failed) = tokio::sync::oneshot::channel::<()>();
    let failing = Arc::new(Mutex::new(Some(failing)));
    let g = Arc::clone(&got);
    let workflow = named::<0, _, _>(move |_, step| {
        let (g, failing) = (Arc::clone(&g), failing.lock().unwrap().take());
        async move {
            step.run("pay", |_| async { Ok(42u64) })
                .rollback(move |r: cairn::Rollback<u64>| {
                    let g = Arc::clone(&g);
                    async move {
                        *g.lock().unwrap() = Some(r.output);
                        Ok(())
                    }
                })
                .await?;
            // Not an op: the driver flushes `pay`'s success meanwhile.
            tokio::task::yield_now().await;
            if let Some(failing) = failing {
                let _ = failing.send(());
            }
            Err::<Value, _>(WorkflowError::new("Error", "then it fails"))
        }
    });
    let builder = gated_builder(BACKEND, &path, gates.clone()).await;
    let (engine, instance, start) =
        started_with_its_first_commit_held(builder.register(workflow), &gates).await;
    // The flush lands; its answer is held. The journal read is held if it comes.
    let flush = gates.arm("commit");
    let journal = gates.arm("journal");
    start.release();
    flush.arrived().await;
    // The workflow has returned its error, and the driver gone on as far as it could in
    // the same poll (this test's runtime has one thread).
    has_failed.await.unwrap();
    assert!(
        !journal.has_arrived(),
        "the rollback read the journal while the commit carrying pay's success was on its way"
    );
    journal.release();
    flush.release();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored, "{status:?}");
    assert_eq!(*got.lock().unwrap(), Some(Some(42)));
    engine.shutdown().await;
}

/// Two branches after a step: `a` runs ten steps back to back, `b` one. `b`'s start waits
/// for the commit carrying the first step's success (it may depend on it), not for the
/// commits carrying `a`'s later successes, which were deferred after it was made: its
/// body runs while `a` is still at its first steps. A wait for whichever commit carried
/// deferred writes last held `b` back until `a` had run all ten.
#[tokio::test]
async fn a7_a_branch_running_steps_back_to_back_does_not_hold_another_branchs_commit_back() {
    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let o = Arc::clone(&order);
    let (engine, _dir) = super::support::engine(move |b| {
        b.register(wf(move |_, step| {
            let o = Arc::clone(&o);
            async move {
                let body = |name: String| {
                    let o = Arc::clone(&o);
                    move |_: cairn::StepContext| {
                        o.lock().unwrap().push(name.clone());
                        async { Ok::<u64, StepError>(1) }
                    }
                };
                step.run("first", body("first".into())).await?;
                let a = async {
                    for i in 0..10 {
                        step.run(format!("a{i}"), body(format!("a{i}"))).await?;
                    }
                    Ok::<(), WorkflowError>(())
                };
                let b = step.run("b", body("b".into()));
                let (a, b) = futures::join!(a, b);
                a?;
                b?;
                Ok(json!({}))
            }
        }))
    })
    .await;
    let instance = super::support::run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().status,
        InstanceStatus::Complete
    );
    let order = order.lock().unwrap().clone();
    let b = order.iter().position(|s| s == "b").unwrap();
    let a5 = order.iter().position(|s| s == "a5").unwrap();
    assert!(b < a5, "b's body waited for a's steps: {order:?}");
    engine.shutdown().await;
}

/// Each body's name and `a`'s state in the store when it ran.
type Ran = Arc<Mutex<Vec<(&'static str, Option<StepState>)>>>;

/// `instance`'s status once it has ended; a guard, not a wait: an instance with a step
/// kept unpolled completes in milliseconds or never.
async fn ended_despite_the_kept_step(instance: &cairn::Instance<Value>) -> cairn::Status<Value> {
    tokio::time::timeout(std::time::Duration::from_secs(60), instance.wait())
        .await
        .expect("the instance hung behind the step kept unpolled")
        .unwrap()
}

/// (defect) A step polled once, its start sent carrying the last step's success, then kept
/// unpolled while the workflow runs another step (a `select!` that another branch won, a
/// `futures::poll!`): the other step's commit waited for the kept one's to be known landed,
/// which only the kept op learnt, when polled again, so the instance hung for good (and again
/// on every replay). Whoever waits for a carrying commit now drives it.
#[tokio::test]
async fn a7_a_step_kept_unpolled_after_its_start_does_not_hold_the_next_steps_back() {
    let (engine, _dir) = super::support::engine(|b| {
        b.register(wf(|_, step| async move {
            let a: u64 = step.run("a", |_| async { Ok(1) }).await?;
            let mut kept = std::pin::pin!(futures::future::maybe_done(
                step.run("kept", |_| async { Ok::<u64, StepError>(2) })
            ));
            // Polled once: its start is sent, carrying a's success (it may even be done).
            let _ = futures::poll!(kept.as_mut());
            let c: u64 = step.run("c", |_| async { Ok(3) }).await?;
            step.sleep("nap", std::time::Duration::from_millis(1)).await?;
            kept.as_mut().await;
            let kept = kept.as_mut().take_output().unwrap()?;
            Ok(json!([a, kept, c]))
        }))
    })
    .await;
    let instance = engine
        .workflow::<super::support::FnWorkflow<0>>()
        .create(cairn::CreateOptions::new(json!({})))
        .await
        .unwrap();
    let status = ended_despite_the_kept_step(&instance).await;
    assert_eq!(status.output, Some(json!([1, 2, 3])), "{status:?}");
    engine.shutdown().await;
}

/// The step kept unpolled carries the last step's success, and its commit fails alone
/// while the next step's start lands. Nobody but the next step's commit waits for it now:
/// that commit must learn the failure and stop the run, not run its body on a success
/// that is nowhere. The engine replays the instance: `a` runs again, and every later body
/// finds `a`'s success durable when it runs.
#[tokio::test]
async fn a7_a_kept_steps_commit_failing_alone_stops_the_next_body() {
    use super::support::{Gates, gated_builder_on};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ran = Ran::default();
    let (s, r) = (Arc::clone(&store), Arc::clone(&ran));
    let workflow = wf(move |_, step| {
        let (s, r, runs) = (Arc::clone(&s), Arc::clone(&r), Arc::clone(&runs));
        async move {
            let noting = |name: &'static str, out: u64| {
                let (s, r) = (Arc::clone(&s), Arc::clone(&r));
                move |_: cairn::StepContext| {
                    let (s, r) = (Arc::clone(&s), Arc::clone(&r));
                    async move {
                        let a = stored_steps(&*s).await.get("a").map(|a| a.0);
                        r.lock().unwrap().push((name, a));
                        Ok::<u64, StepError>(out)
                    }
                }
            };
            let quick = cairn::Retries::constant(3, std::time::Duration::ZERO);
            let a = step
                .run("a", move |_| {
                    let n = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    async move { Ok::<u64, StepError>(n) }
                })
                .retries(quick.clone())
                .await?;
            let mut kept = std::pin::pin!(futures::future::maybe_done(
                step.run("kept", noting("kept", 2)).retries(quick.clone())
            ));
            // Polled once: its start is sent, carrying a's success.
            let _ = futures::poll!(kept.as_mut());
            let c = step.run("c", noting("c", 3)).retries(quick).await?;
            kept.as_mut().await;
            let kept = kept.as_mut().take_output().unwrap()?;
            Ok(json!({ "a": a, "kept": kept, "c": c }))
        }
    });
    let engine = gated_builder_on(Arc::clone(&store), gates.clone())
        .register(workflow)
        .start()
        .await
        .unwrap();
    // The first commit (the start with `a`'s) is held until the next two are armed: the
    // kept step's start, carrying `a`'s success, fails; `c`'s start lands.
    let first_commit = gates.arm("commit");
    let instance = engine
        .workflow::<super::support::FnWorkflow<0>>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    first_commit.arrived().await;
    let carrying = gates.arm_failing("commit");
    let after_it = gates.arm("commit");
    first_commit.release();
    carrying.arrived().await;
    after_it.arrived().await;
    carrying.release();
    after_it.release();
    let status = ended_despite_the_kept_step(&instance).await;
    assert_eq!(
        status.output,
        Some(json!({ "a": 2, "kept": 2, "c": 3 })),
        "{status:?}"
    );
    let ran = ran.lock().unwrap().clone();
    assert!(ran.iter().any(|(name, _)| *name == "c"), "{ran:?}");
    for (name, a) in &ran {
        assert_eq!(
            *a,
            Some(StepState::Succeeded),
            "{name}'s body ran while a's success was not durable: {ran:?}"
        );
    }
    engine.shutdown().await;
}

/// With a step kept unpolled after its start, the next step's success is still flushed
/// while the workflow awaits something that is not an op: the kept step's commit, once a
/// later commit has learnt that it landed, no longer counts as on its way for the driver.
#[tokio::test]
async fn a7_a_step_kept_unpolled_does_not_keep_the_next_success_from_being_flushed() {
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let (go, gone) = tokio::sync::oneshot::channel::<()>();
    let gone = Arc::new(Mutex::new(Some(gone)));
    let workflow = wf(move |_, step| {
        let gone = gone.lock().unwrap().take();
        async move {
            step.run("a", |_| async { Ok::<u64, StepError>(1) }).await?;
            let mut kept = std::pin::pin!(futures::future::maybe_done(
                step.run("kept", |_| async { Ok::<u64, StepError>(2) })
            ));
            let _ = futures::poll!(kept.as_mut());
            step.run("c", |_| async { Ok::<u64, StepError>(3) }).await?;
            // Not an op: the driver flushes c's success meanwhile, or nobody does.
            if let Some(gone) = gone {
                let _ = gone.await;
            }
            kept.as_mut().await;
            kept.as_mut().take_output().unwrap()?;
            Ok(json!({}))
        }
    });
    let engine = cairn::Engine::builder()
        .store(Arc::clone(&store))
        .register(workflow)
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<super::support::FnWorkflow<0>>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    let flushed = async {
        while stored_steps(&*store).await.get("c").map(|c| c.0) != Some(StepState::Succeeded) {
            tokio::task::yield_now().await;
        }
    };
    // A guard, not a wait: the flush comes at once or never.
    tokio::time::timeout(std::time::Duration::from_secs(60), flushed)
        .await
        .expect("c's success was never flushed while the kept step's commit counted as on its way");
    go.send(()).unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    engine.shutdown().await;
}

/// (defect, found by an outside review) Two steps started together as a new instance's
/// first ops, raced by a `select`: `a`'s start carries the instance's first start, `b`
/// waits for it to land. `a` wins, and `b`, kept by the workflow, is not polled again until
/// `c` has run. `c` waited for its turn behind `b`, which only `b`'s next poll would give
/// up: the instance hung for good. A step now waits for the steps started before it only on
/// a worker, whose ops are all polled whenever they are woken.
#[tokio::test]
async fn a7_a_step_a_select_left_waiting_for_the_first_start_does_not_hold_the_next_step_back()
{
    let (engine, _dir) = super::support::engine(|b| {
        b.register(wf(|_, step| async move {
            let a = std::pin::pin!(step.run("a", |_| async { Ok::<u64, StepError>(1) }));
            let b = std::pin::pin!(step.run("b", |_| async { Ok::<u64, StepError>(2) }));
            let (first, kept) = match futures::future::select(a, b).await {
                futures::future::Either::Left((a, b)) => (a?, b),
                futures::future::Either::Right(_) => {
                    return Err(WorkflowError::new("test.order", "b won the race"));
                }
            };
            let c: u64 = step.run("c", |_| async { Ok(3) }).await?;
            let b = kept.await?;
            Ok(json!([first, b, c]))
        }))
    })
    .await;
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    let status = ended_despite_the_kept_step(&instance).await;
    assert_eq!(status.output, Some(json!([1, 2, 3])), "{status:?}");
    engine.shutdown().await;
}

/// (defect, found by an outside review) A pause requested while a step started beside a
/// new instance's first one waits for the commit carrying the first start: once that
/// commit had landed, the waiting step started its attempt all the same, under the pending
/// pause, and the pause waited for its body too. It waits at the pause gate now: the pause
/// takes effect once the step in flight is done, and the other starts after the resume.
#[tokio::test]
async fn e21_h10_a_step_waiting_for_the_first_start_starts_no_attempt_under_a_pending_pause() {
    use super::support::{Counter, Gates, gated_builder_on, until_status};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let ran_b = Counter::default();
    let counted = ran_b.clone();
    let builder = gated_builder_on(Arc::clone(&store), gates.clone()).register(wf(
        move |_, step| {
            let counted = counted.clone();
            async move {
                let (a, b) = futures::try_join!(
                    step.run("a", |_| async { Ok(1u64) }),
                    step.run("b", move |_| {
                        counted.bump();
                        async { Ok(2u64) }
                    }),
                )?;
                Ok(json!(a + b))
            }
        },
    ));
    let (engine, instance, carrying) = started_with_its_first_commit_held(builder, &gates).await;
    instance.pause().await.unwrap();
    carrying.release();
    until_status(&instance, InstanceStatus::Paused).await;
    assert_eq!(ran_b.get(), 0, "b's body ran under the pending pause");
    let starts: Vec<String> = super::support::records(&instance, LogKind::StepStart)
        .await
        .into_iter()
        .filter_map(|r| r.entry.step.map(|k| k.name))
        .collect();
    assert_eq!(starts, ["a"], "only the step in flight started");
    instance.resume().await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
    assert_eq!(ran_b.get(), 1, "b ran once, after the resume");
    engine.shutdown().await;
}

/// (defect) A commit's answer read before a pause was made, heard after the pause's own
/// answer had told the lifetime: the stale `running` cancelled the pending pause in memory,
/// and the next step started under it (the pause took effect a step late). Here the first
/// step's start has landed (a `running` instance) when the pause is made, and its answer
/// is held until after.
#[tokio::test]
async fn e21_h10_a_commits_answer_from_before_a_pause_does_not_cancel_it() {
    use super::support::{Counter, Gates, gated_builder_on, until_status};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let ran_second = Counter::default();
    let counted = ran_second.clone();
    let builder = gated_builder_on(Arc::clone(&store), gates.clone()).register(wf(
        move |_, step| {
            let counted = counted.clone();
            async move {
                let a: u64 = step.run("first", |_| async { Ok(1) }).await?;
                let b: u64 = step
                    .run("second", move |_| {
                        counted.bump();
                        async { Ok(2) }
                    })
                    .await?;
                Ok(json!(a + b))
            }
        },
    ));
    // The first commit (the first step's start) is made at once; its answer is held.
    let (engine, instance, answer) = started_with_its_first_commit_held(builder, &gates).await;
    // Sent at once: the store applies it (a running instance), the lifetime has not heard.
    while super::support::status_of(&instance).await != InstanceStatus::Running {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    instance.pause().await.unwrap();
    answer.release();
    until_status(&instance, InstanceStatus::Paused).await;
    assert_eq!(ran_second.get(), 0, "the second step ran under the pending pause");
    instance.resume().await.unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
    assert_eq!(ran_second.get(), 1);
    engine.shutdown().await;
}

/// An instance whose step `first` is running, held until its release, and whose step
/// `second` counts its runs: for the pause tests.
struct FirstStepHeld {
    engine: cairn::Engine,
    instance: cairn::Instance<Value>,
    go: Arc<tokio::sync::Semaphore>,
    ran_second: super::support::Counter,
    /// The database's directory, removed last.
    _dir: tempfile::TempDir,
}

async fn first_step_held(gates: &super::support::Gates) -> FirstStepHeld {
    use super::support::{Counter, gated_builder_on};
    let (dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let (running, go) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let ran_second = Counter::default();
    let (body_running, body_go, counted) = (running.clone(), go.clone(), ran_second.clone());
    let engine = gated_builder_on(Arc::clone(&store), gates.clone())
        .register(wf(move |_, step| {
            let (running, go, counted) = (body_running.clone(), body_go.clone(), counted.clone());
            async move {
                let a: u64 = step
                    .run("first", move |_| {
                        let (running, go) = (running.clone(), go.clone());
                        async move {
                            running.add_permits(1);
                            go.acquire().await.unwrap().forget();
                            Ok(1)
                        }
                    })
                    .await?;
                let b: u64 = step
                    .run("second", move |_| {
                        counted.bump();
                        async { Ok(2) }
                    })
                    .await?;
                Ok(json!(a + b))
            }
        }))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    running.acquire().await.unwrap().forget();
    FirstStepHeld {
        engine,
        instance,
        go,
        ran_second,
        _dir: dir,
    }
}

impl FirstStepHeld {
    /// Lets `first` end under the pause made meanwhile: the instance pauses before
    /// `second` runs (`ran`: the message if it did), then finishes once resumed.
    async fn pauses_before_the_second_step(self, ran: &str) {
        let instance = &self.instance;
        self.go.add_permits(1);
        let status = instance
            .wait_for(|s| s.status == InstanceStatus::Paused || s.status.is_terminal())
            .await
            .unwrap()
            .status;
        assert_eq!(self.ran_second.get(), 0, "{ran}");
        assert_eq!(status, InstanceStatus::Paused);
        instance.resume().await.unwrap();
        assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
        assert_eq!(self.ran_second.get(), 1);
        self.engine.shutdown().await;
    }
}

/// E21/H10, a defect a review found: a resume's own answer told the lifetime `running`
/// after a pause from another caller had been learnt (a pause made once the resume had
/// landed), so the resume cancelled that later pause in memory and the next step started
/// under it. Here the first step is in flight when the instance is paused, resumed (its
/// answer held) and paused again; the resume's answer comes last.
#[tokio::test]
async fn e21_h10_a_resumes_answer_does_not_cancel_a_pause_made_after_it_landed() {
    let gates = super::support::Gates::default();
    let held = first_step_held(&gates).await;
    let instance = &held.instance;
    instance.pause().await.unwrap();
    // The resume lands at once; its answer is held.
    let answer = gates.arm("control");
    let resuming = tokio::spawn({
        let instance = instance.clone();
        async move { instance.resume().await }
    });
    answer.arrived().await;
    while super::support::status_of(instance).await != InstanceStatus::Running {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // Another caller pauses it again, after the resume landed: the last word is a pause.
    instance.pause().await.unwrap();
    answer.release();
    resuming.await.unwrap().unwrap();
    held.pauses_before_the_second_step("the second step ran under the last pause")
        .await;
}

/// E21/H10, the other way round: a commit's answer read before a resume landed says
/// `waitingForPause`; heard after the resume, it must not keep the gate closed until every
/// attempt in flight has ended (here one that never ends on its own). (The driver's next
/// commit would also reopen it here; the unit test
/// `a_pause_read_before_a_resume_learnt_since_does_not_close_the_gate_again` pins the rule.)
/// Branch `a` runs a long step; branch `b`'s first step ends during the pause, and the
/// answer to the commit of its success is held until after the resume.
#[tokio::test]
async fn e21_h10_a_commits_answer_from_before_a_resume_does_not_close_the_gate_again() {
    use super::support::{Gates, gated_builder_on, journal_of};
    use tokio::sync::Semaphore;
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let [long_running, long_go, first_running, first_go, second_started] =
        std::array::from_fn(|_| Arc::new(Semaphore::new(0)));
    let body = {
        let (long_running, long_go) = (long_running.clone(), long_go.clone());
        let (first_running, first_go) = (first_running.clone(), first_go.clone());
        let second_started = second_started.clone();
        move |_: WorkflowEvent<Value>, step: WorkflowStep| {
            let held = |running: &Arc<Semaphore>, go: &Arc<Semaphore>| {
                let (running, go) = (running.clone(), go.clone());
                move |_| {
                    let (running, go) = (running.clone(), go.clone());
                    async move {
                        running.add_permits(1);
                        go.acquire().await.unwrap().forget();
                        Ok(1u64)
                    }
                }
            };
            let long = held(&long_running, &long_go);
            let first = held(&first_running, &first_go);
            let second_started = second_started.clone();
            async move {
                let a = async { step.run("long", long).await };
                let b = async {
                    let one: u64 = step.run("first", first).await?;
                    step.run("second", move |_| {
                        second_started.add_permits(1);
                        async move { Ok(one + 1) }
                    })
                    .await
                };
                let (a, b): (u64, u64) = futures::try_join!(a, b)?;
                Ok(json!(a + b))
            }
        }
    };
    let engine = gated_builder_on(Arc::clone(&store), gates.clone())
        .register(wf(body))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("i"))
        .await
        .unwrap();
    long_running.acquire().await.unwrap().forget();
    first_running.acquire().await.unwrap().forget();
    instance.pause().await.unwrap();
    // The commit of `first`'s success lands during the pause; its answer is held.
    let held = gates.arm("commit");
    first_go.add_permits(1);
    held.arrived().await;
    while !journal_of(store.as_ref(), "test", "i")
        .await
        .iter()
        .any(|s| s.key.name == "first" && s.state == StepState::Succeeded)
    {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    instance.resume().await.unwrap();
    held.release();
    // `long` is still running: only a gate left closed by the stale answer holds
    // `second` back.
    tokio::time::timeout(std::time::Duration::from_secs(60), second_started.acquire())
        .await
        .expect("the second step never started after the resume")
        .unwrap()
        .forget();
    long_go.add_permits(1);
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(3)));
    engine.shutdown().await;
}

/// E21/H10, a defect a review found: a pause learns its instance's status from a read
/// begun once it has landed; when that read failed, the lifetime was told nothing, and
/// the next step started under the pause (its start rode with the first step's success,
/// before any commit's answer could tell it). Not knowing, the gate now closes: the
/// driver's conditional pause opens it again if a resume came last.
#[tokio::test]
async fn e21_h10_a_pause_whose_status_read_fails_still_closes_the_gate() {
    let gates = super::support::Gates::default();
    let held = first_step_held(&gates).await;
    let instance = &held.instance;
    // The pause's own read of the instance, once it has landed, fails.
    let read = gates.arm_failing("instance");
    read.release();
    instance.pause().await.unwrap();
    held.pauses_before_the_second_step("the second step ran under the pause")
        .await;
}

/// E21/H10: a pause whose caller stops waiting once it has landed (an HTTP client that
/// hung up) still tells the lifetime: before, the read that tells it was dropped with the
/// request, and an instance whose code awaits something other than an op (no commit to
/// tell it) stayed `waitingForPause` for good.
#[tokio::test]
async fn e21_h10_a_pause_whose_caller_stops_waiting_still_takes_effect() {
    use super::support::{Gates, gated_builder_on};
    let (_dir, path) = temp_db();
    let store = raw_store_on(BACKEND, &path).await;
    let gates = Gates::default();
    let (reached, go) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let (body_reached, body_go) = (reached.clone(), go.clone());
    let engine = gated_builder_on(Arc::clone(&store), gates.clone())
        .register(wf(move |_, step| {
            let (reached, go) = (body_reached.clone(), body_go.clone());
            async move {
                let a: u64 = step.run("first", |_| async { Ok(1) }).await?;
                // Not an op: nothing commits while the code waits here.
                reached.add_permits(1);
                go.acquire().await.unwrap().forget();
                Ok(json!(a))
            }
        }))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    reached.acquire().await.unwrap().forget();
    // The pause lands; its caller stops waiting while the read that tells the lifetime
    // is on its way.
    let read = gates.arm("instance");
    let pausing = tokio::spawn({
        let instance = instance.clone();
        async move { instance.pause().await }
    });
    read.arrived().await;
    pausing.abort();
    let _ = pausing.await;
    read.release();
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        instance.wait_for(|s| s.status == InstanceStatus::Paused),
    )
    .await
    .expect("the pause never took effect")
    .unwrap();
    instance.resume().await.unwrap();
    go.add_permits(1);
    assert_eq!(instance.wait().await.unwrap().output, Some(json!(1)));
    engine.shutdown().await;
}

/// Paused and resumed while its first start is deferred (claimed, nothing committed: the
/// store says `waitingForPause`, then `running`), an instance whose lifetime then dies
/// before that first commit lands is started by the next lifetime all the same: its start
/// time is stored and its `WORKFLOW_START` logged. Before, the next claim took the
/// `running` the resume left for a start already recorded.
#[tokio::test]
async fn a_first_start_lost_after_a_pause_and_resume_is_recorded_by_the_next_run() {
    let (_dir, path) = temp_db();
    let gates = super::support::Gates::default();
    let store = raw_store_on(BACKEND, &path).await;
    let workflow = || {
        wf(|_, step| async move {
            step.run("a", |_| async { Ok(1u32) }).await?;
            Ok(json!("done"))
        })
    };
    let first = super::support::gated_builder_on(Arc::clone(&store), gates.clone())
        .register(workflow())
        .start()
        .await
        .unwrap();
    // The first start rides with `a`'s start: that commit never lands.
    let lost = gates.arm_failing("commit");
    let instance = first
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    lost.arrived().await;
    instance.pause().await.unwrap();
    assert_eq!(
        instance.status().await.unwrap().status,
        InstanceStatus::WaitingForPause
    );
    instance.resume().await.unwrap();
    lost.release();
    first.shutdown().await;
    drop(instance);
    drop(store);
    let store = raw_store_on(BACKEND, &path).await;
    let (second, instance, status) = x_run_to_its_end_again(&store, workflow()).await;
    assert_eq!(status.output, Some(json!("done")), "{status:?}");
    let record = store
        .instance(&cairn::WorkflowName::new("test").unwrap(), &cairn::InstanceId::new("x").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(record.started_at.is_some(), "no start time: {record:?}");
    assert_eq!(
        super::support::records(&instance, LogKind::WorkflowStart)
            .await
            .len(),
        1,
        "{:?}",
        kinds(&instance).await
    );
    second.shutdown().await;
}

/// Review finding: `a1`'s success rides on the driver's flush (the workflow awaited
/// something that is not an op), which fails alone, while `a2`'s start (an attempt's start,
/// sent at once) lands. The journal then holds both started and neither finished; `a1` is
/// retried in an hour. A terminate with rollback then: its replay, which registers the
/// handlers, stops at `a1` (unfinished) and never reaches `a2`. Before, `a2`'s missing
/// handler failed the rollback (`RollbackMissing`) before `a1`'s compensation, though
/// `a1`'s body had run. `a2`'s body never ran (it waits for `a1`'s success to land), so
/// nothing of it is undone; `a1`'s handler runs, without an output.
#[tokio::test]
async fn a_rollback_compensates_a_step_whose_success_was_lost_when_the_next_ones_start_landed() {
    use super::support::{Gates, gated_builder};
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let compensated = Arc::new(Mutex::new(Vec::<(String, Option<u32>)>::new()));
    let bodies = Arc::new(Mutex::new(Vec::<String>::new()));
    let (c, b) = (Arc::clone(&compensated), Arc::clone(&bodies));
    let workflow = wf(move |_, step| {
        let (c, b) = (Arc::clone(&c), Arc::clone(&b));
        async move {
            for name in ["a1", "a2"] {
                let (c, b) = (Arc::clone(&c), Arc::clone(&b));
                step.run(name, move |_| {
                    b.lock().unwrap().push(name.to_owned());
                    async { Ok(1u32) }
                })
                .retries(cairn::Retries::constant(3, std::time::Duration::from_secs(3600)))
                .rollback(move |undo: cairn::Rollback<u32>| {
                    let c = Arc::clone(&c);
                    async move {
                        c.lock().unwrap().push((undo.step_name, undo.output));
                        Ok(())
                    }
                })
                .await?;
                // Not an op: the driver flushes `a1`'s success meanwhile.
                tokio::task::yield_now().await;
            }
            Ok(json!("done"))
        }
    });
    let builder = gated_builder(BACKEND, &path, gates.clone()).await;
    let (engine, instance, start) =
        started_with_its_first_commit_held(builder.register(workflow), &gates).await;
    let flush = gates.arm_failing("commit");
    let next_start = gates.arm("commit");
    start.release();
    flush.arrived().await;
    next_start.arrived().await;
    next_start.release();
    flush.release();
    // The next run finds `a1` interrupted and retries it in an hour: it waits.
    super::support::until_status(&instance, InstanceStatus::Waiting).await;
    assert_eq!(*bodies.lock().unwrap(), ["a1"], "a2's body never ran");
    instance.terminate_with_rollback().await.unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Terminated, "{status:?}");
    let rollback = status.rollback.expect("a rollback ran");
    assert_eq!(rollback.outcome, "completed", "{rollback:?}");
    assert_eq!(
        *compensated.lock().unwrap(),
        [("a1-1".to_owned(), None)],
        "a1 compensated (its output lost), a2 not (its body never ran)"
    );
    engine.shutdown().await;
}
