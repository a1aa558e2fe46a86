//! `cairn::testing`: the test engine, introspection with mocks (SPEC §7 I1–I7) and the
//! waiters, on the kit's own engine (temporary SQLite, virtual clock).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::{FnWorkflow, kinds, wf};
use cairn::prelude::*;
use cairn::testing::{Step, TestEngine};
use cairn::{ErrorInfo, LogKind};
use serde_json::{Value, json};

/// A workflow that charges a card (counting real charges), sleeps a month, then ships.
fn shop(charges: Arc<AtomicU32>) -> FnWorkflow {
    wf(move |event, step| {
        let charges = charges.clone();
        async move {
            let charge: Value = step
                .run("charge card", |_| {
                    charges.fetch_add(1, Ordering::SeqCst);
                    async { Ok(json!({"id": "ch_live"})) }
                })
                .retries(Retries::constant(5, Duration::from_secs(60)))
                .await?;
            step.sleep("cool off", "30 days").await?;
            let label: String = step
                .run("ship", |_| async { Ok("label-1".to_string()) })
                .await?;
            Ok(json!({"charge": charge, "label": label, "order": event.payload}))
        }
    })
}

async fn create(t: &TestEngine, id: &str) -> cairn::Instance<Value> {
    t.workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!(7)).id(id))
        .await
        .unwrap()
}

#[tokio::test]
async fn i1_mock_step_result_and_disable_sleeps_shape_the_output() {
    let charges = Arc::new(AtomicU32::new(0));
    let c = charges.clone();
    let t = TestEngine::start(move |b| b.register(shop(c.clone())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .modify()
        .disable_sleeps()
        .mock_step_result("charge card", json!({"id": "ch_mock"}))
        .unwrap();
    let started = t.clock().now();
    let instance = create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    let output: Value = order.output().await.unwrap();
    assert_eq!(output["charge"], json!({"id": "ch_mock"}));
    assert_eq!(output["label"], "label-1");
    assert_eq!(
        charges.load(Ordering::SeqCst),
        0,
        "a mocked body never runs"
    );
    // The sleep was disabled: no virtual month passed either.
    assert!(t.clock().now().since(started) < Duration::from_secs(60));
    // The mocked step leaves the records a real one does.
    let log = kinds(&instance).await;
    assert!(log.contains(&LogKind::AttemptSuccess));
    assert!(log.contains(&LogKind::SleepStart) && log.contains(&LogKind::SleepComplete));
}

#[tokio::test]
async fn a_thirty_day_sleep_costs_no_wall_time_on_the_test_engine() {
    let t = TestEngine::start(|b| b.register(shop(Arc::default())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    let wall = std::time::Instant::now();
    let started = t.clock().now();
    create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert!(t.clock().now().since(started) >= Duration::from_secs(30 * 86_400));
    assert!(
        wall.elapsed() < Duration::from_secs(20),
        "{:?}",
        wall.elapsed()
    );
}

#[tokio::test]
async fn i2_mock_step_error_twice_then_result_fails_two_attempts_then_succeeds() {
    let charges = Arc::new(AtomicU32::new(0));
    let c = charges.clone();
    let t = TestEngine::start(move |b| b.register(shop(c.clone())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .modify()
        .disable_sleeps()
        .mock_step_error("charge card", "card network down", Some(2))
        .unwrap()
        .mock_step_result("charge card", json!({"id": "ch_third"}))
        .unwrap();
    let instance = create(&t, "order-1").await;
    let charge: Value = order.wait_for_step_result("charge card").await.unwrap();
    assert_eq!(charge, json!({"id": "ch_third"}));
    order
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    let failures = crate::support::records(&instance, LogKind::AttemptFailure).await;
    assert_eq!(failures.len(), 2);
    for (i, f) in failures.iter().enumerate() {
        assert_eq!(f.entry.meta["attempt"], i + 1);
        assert_eq!(f.entry.meta["error"]["name"], "Error");
        assert_eq!(f.entry.meta["error"]["message"], "card network down");
    }
    assert_eq!(charges.load(Ordering::SeqCst), 0);
    // Mocking an error after the result is refused, as is a second result.
    assert!(
        order
            .modify()
            .mock_step_error("charge card", "x", None)
            .is_err()
    );
    assert!(order.modify().mock_step_result("charge card", 1).is_err());
}

#[tokio::test]
async fn i3_mock_event_is_received_without_a_send() {
    let t = TestEngine::start(|b| {
        b.register(wf(|_, step| async move {
            let approval = step
                .wait_for_event::<Value>("wait for approval", "approval")
                .timeout("1 hour")
                .await?;
            let again = step
                .wait_for_event::<Value>("second look", "approval")
                .timeout("1 hour")
                .await?;
            Ok(json!([
                approval.payload,
                again.payload,
                approval.event_type
            ]))
        }))
    })
    .await
    .unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    flow.modify()
        .mock_event("approval", json!({"by": "ada"}))
        .unwrap()
        .mock_event("approval", json!({"by": "bob"}))
        .unwrap();
    let instance = create(&t, "flow").await;
    flow.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(
        flow.output::<Value>().await.unwrap(),
        json!([{"by": "ada"}, {"by": "bob"}, "approval"])
    );
    let log = kinds(&instance).await;
    assert_eq!(
        log.iter().filter(|k| **k == LogKind::WaitComplete).count(),
        2,
        "{log:?}"
    );
}

#[tokio::test]
async fn i4_disable_retry_delays_lets_mocked_errors_retry_at_once() {
    let t = TestEngine::start(|b| b.register(shop(Arc::default())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .modify()
        .disable_sleeps()
        .disable_retry_delays()
        .mock_step_error("charge card", "flaky", Some(4))
        .unwrap();
    let started = t.clock().now();
    let instance = create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    // Four back-offs of a minute (growing) would be at least 4 virtual minutes.
    assert!(t.clock().now().since(started) < Duration::from_secs(5));
    for f in crate::support::records(&instance, LogKind::AttemptFailure).await {
        assert_eq!(f.entry.meta["retryDelayMs"], 0);
    }
    // The fifth attempt ran the real body.
    let charge: Value = order.wait_for_step_result("charge card").await.unwrap();
    assert_eq!(charge, json!({"id": "ch_live"}));
}

#[tokio::test]
async fn i5_force_event_timeout_errors_the_instance_with_execution_timed_out() {
    let t = TestEngine::start(|b| {
        b.register(wf(|_, step| async move {
            let e = step
                .wait_for_event::<Value>("wait for approval", "approval")
                .timeout("2 hours")
                .await?;
            Ok(e.payload)
        }))
    })
    .await
    .unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    flow.modify().force_event_timeout("wait for approval");
    let instance = create(&t, "flow").await;
    // Sent for real, and still not received: the timeout is forced.
    instance.send_event("approval", &json!(1)).await.unwrap();
    flow.wait_for_status(InstanceStatus::Errored).await.unwrap();
    let error = flow.error().await.unwrap();
    // Over Cloudflare's RPC the name surfaces as "Error"; in Rust it is the real one.
    assert_eq!(error.name, "WorkflowTimeoutError");
    assert!(
        error.message.contains("Execution timed out"),
        "{}",
        error.message
    );
    assert!(error.message.contains("7200000ms"), "{}", error.message);
}

#[tokio::test]
async fn force_step_timeout_fails_attempts_as_timeouts_without_running_the_body() {
    let charges = Arc::new(AtomicU32::new(0));
    let c = charges.clone();
    let t = TestEngine::start(move |b| b.register(shop(c.clone())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .modify()
        .disable_retry_delays()
        .force_step_timeout("charge card", None)
        .unwrap();
    create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Errored)
        .await
        .unwrap();
    let error = order.error().await.unwrap();
    assert_eq!(error.name, "WorkflowTimeoutError");
    assert_eq!(charges.load(Ordering::SeqCst), 0);
    let err = order
        .wait_for_step_result::<Value>("charge card")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("charge card-1 failed"), "{err}");
}

/// A workflow whose step name repeats: the second occurrence is `("call", 2)`.
fn repeated() -> FnWorkflow {
    wf(|_, step| async move {
        let mut seen = Vec::new();
        for i in 0..3u32 {
            let v: u32 = step.run("call", move |_| async move { Ok(i) }).await?;
            seen.push(v);
        }
        Ok(json!(seen))
    })
}

#[tokio::test]
async fn steps_are_named_with_their_count_when_a_name_repeats() {
    let t = TestEngine::start(|b| b.register(repeated())).await.unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    flow.modify()
        .mock_step_result(("call", 2), 42)
        .unwrap()
        .mock_step_error(
            Step::new("call").count(3),
            ErrorInfo::new("Boom", "no"),
            Some(1),
        )
        .unwrap();
    create(&t, "flow").await;
    flow.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(flow.output::<Value>().await.unwrap(), json!([0, 42, 2]));
    assert_eq!(
        flow.wait_for_step_result::<u32>(("call", 3)).await.unwrap(),
        2
    );
}

#[tokio::test]
async fn mocked_results_are_committed_and_replayed_after_a_reopen() {
    let charges = Arc::new(AtomicU32::new(0));
    let c = charges.clone();
    let mut t = TestEngine::start(move |b| b.register(shop(c.clone())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .modify()
        .mock_step_result("charge card", json!({"id": "ch_mock"}))
        .unwrap();
    create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Waiting)
        .await
        .unwrap();
    // The mock is gone; the journal still answers with what it made the step return.
    order.modify().clear();
    t.reopen().await.unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    let output: Value = order.output().await.unwrap();
    assert_eq!(output["charge"], json!({"id": "ch_mock"}));
    assert_eq!(charges.load(Ordering::SeqCst), 0, "the body never ran");
}

#[tokio::test]
async fn a_mocked_result_of_the_wrong_type_fails_the_step_naming_the_mock() {
    let t = TestEngine::start(|b| b.register(repeated())).await.unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    flow.modify()
        .mock_step_result("call", "not a number")
        .unwrap();
    create(&t, "flow").await;
    flow.wait_for_status(InstanceStatus::Errored).await.unwrap();
    let error = flow.error().await.unwrap();
    assert!(
        error.message.contains("mocked result of step call-1"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn i6_workflow_wide_introspection_covers_create_batch_and_restart() {
    let charges = Arc::new(AtomicU32::new(0));
    let c = charges.clone();
    let t = TestEngine::start(move |b| b.register(shop(c.clone())))
        .await
        .unwrap();
    let before = create(&t, "made-before").await;
    let all = t.introspect_workflow::<FnWorkflow>().await.unwrap();
    all.modify()
        .disable_sleeps()
        .mock_step_result("charge card", json!({"id": "ch_all"}))
        .unwrap();
    let client = t.workflow::<FnWorkflow>();
    create(&t, "single").await;
    client
        .create_batch(vec![
            CreateOptions::new(json!(1)).id("batch-1"),
            CreateOptions::new(json!(2)).id("batch-2"),
        ])
        .await
        .unwrap();
    let instances = all.instances().await.unwrap();
    let ids: Vec<&str> = instances.iter().map(|i| i.id().as_str()).collect();
    assert_eq!(ids, ["single", "batch-1", "batch-2"]);
    for i in &instances {
        i.wait_for_status(InstanceStatus::Complete).await.unwrap();
        let output: Value = i.output().await.unwrap();
        assert_eq!(output["charge"], json!({"id": "ch_all"}));
    }
    // Mocks survive a restart of the instance.
    instances[0].instance().restart().await.unwrap();
    instances[0]
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    let output: Value = instances[0].output().await.unwrap();
    assert_eq!(output["charge"], json!({"id": "ch_all"}));
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "only made-before charged"
    );

    // Waiting for paused and terminated resolves after the pause and the terminate.
    let waiting = t.introspect::<FnWorkflow>("made-before").unwrap();
    before.pause().await.unwrap();
    waiting
        .wait_for_status(InstanceStatus::Paused)
        .await
        .unwrap();
    before.terminate().await.unwrap();
    waiting
        .wait_for_status(InstanceStatus::Terminated)
        .await
        .unwrap();
}

#[tokio::test]
async fn i7_wait_for_status_fails_at_once_on_another_final_status() {
    let t = TestEngine::start(|b| {
        b.register(wf(|_, step| async move {
            step.run("fail", |_| async {
                Err::<(), _>(NonRetryableError::new("no way").into())
            })
            .await?;
            Ok(json!(null))
        }))
    })
    .await
    .unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    create(&t, "flow").await;
    let err = flow
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "The instance \"flow\" has reached status 'errored'. This is a finite status that prevents it from ever reaching the expected status of 'complete'."
    );
    // output() needs complete; error() needs errored.
    let err = flow.output::<Value>().await.unwrap_err();
    assert!(
        err.to_string().contains("'errored', not 'complete'"),
        "{err}"
    );
    assert_eq!(flow.error().await.unwrap().message, "no way");
}

#[tokio::test]
async fn a_waiter_on_an_instance_that_can_never_get_there_gives_up_at_once() {
    let t = TestEngine::start(|b| {
        b.register(wf(|_, step| async move {
            step.wait_for_event::<Value>("forever", "never")
                .timeout("365 days")
                .await?;
            Ok(json!(null))
        }))
    })
    .await
    .unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    create(&t, "flow").await;
    flow.instance().pause().await.unwrap();
    let wall = std::time::Instant::now();
    let err = flow
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("did not get there"), "{err}");
    assert!(wall.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_test_engine_says_it_needs_a_current_thread_runtime() {
    let err = TestEngine::start(|b| b).await.unwrap_err();
    assert!(err.to_string().contains("current-thread"), "{err}");
}

#[tokio::test]
async fn a_reopen_keeps_the_virtual_clock_where_it_was() {
    let mut t = TestEngine::start(|b| b.register(shop(Arc::default())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    let after_a_month = t.clock().now();
    t.reopen().await.unwrap();
    assert!(
        t.clock().now() >= after_a_month,
        "time went back at the reopen"
    );
    // The waiters reach the new engine.
    let output: Value = order.output().await.unwrap();
    assert_eq!(output["label"], "label-1");
}

#[tokio::test]
async fn a_second_workflow_introspector_does_not_narrow_the_first() {
    let t = TestEngine::start(|b| b.register(shop(Arc::default())))
        .await
        .unwrap();
    let first = t.introspect_workflow::<FnWorkflow>().await.unwrap();
    first
        .modify()
        .disable_sleeps()
        .mock_step_result("charge card", json!({"id": "first"}))
        .unwrap();
    let early = t.introspect::<FnWorkflow>("early").unwrap();
    create(&t, "early").await;
    early
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    let _second = t.introspect_workflow::<FnWorkflow>().await.unwrap();
    let late = t.introspect::<FnWorkflow>("late").unwrap();
    create(&t, "late").await;
    late.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    for run in [&early, &late] {
        let output: Value = run.output().await.unwrap();
        assert_eq!(output["charge"], json!({"id": "first"}));
    }
    assert_eq!(first.instances().await.unwrap().len(), 2);
}

#[tokio::test]
async fn mocks_refuse_what_they_could_not_honour_and_keep_the_limits() {
    let t = TestEngine::start(|b| b.register(shop(Arc::default())).payload_limit(1024))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    // A result after "every attempt fails" could never be returned.
    order
        .modify()
        .mock_step_error("ship", "down", None)
        .unwrap();
    assert!(order.modify().mock_step_result("ship", "x").is_err());
    // A mocked result is held to the payload limit, as a body's is.
    order
        .modify()
        .disable_sleeps()
        .mock_step_result("charge card", "x".repeat(2000))
        .unwrap();
    create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Errored)
        .await
        .unwrap();
    let error = order.error().await.unwrap();
    assert!(
        error.message.contains("output is too large"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_non_retryable_mocked_error_fails_the_step_at_once() {
    let t = TestEngine::start(|b| b.register(shop(Arc::default())))
        .await
        .unwrap();
    let order = t.introspect::<FnWorkflow>("order-1").unwrap();
    order
        .modify()
        .mock_step_error(
            "charge card",
            cairn::testing::MockError::non_retryable("card declined"),
            Some(1),
        )
        .unwrap();
    let instance = create(&t, "order-1").await;
    order
        .wait_for_status(InstanceStatus::Errored)
        .await
        .unwrap();
    let error = order.error().await.unwrap();
    assert_eq!(
        (error.name.as_str(), error.message.as_str()),
        ("NonRetryableError", "card declined")
    );
    assert_eq!(
        crate::support::records(&instance, LogKind::AttemptFailure)
            .await
            .len(),
        1
    );
}

/// Streams from a body that must not run when its result is mocked, then reads the bytes.
fn exporting(runs: Arc<AtomicU32>) -> FnWorkflow {
    wf(move |_, step| {
        let runs = runs.clone();
        async move {
            let s = step
                .run_stream("export", |_| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async {
                        Ok(futures::stream::iter(vec![Ok::<_, std::io::Error>(
                            b"real".to_vec(),
                        )]))
                    }
                })
                .await?;
            step.sleep("nap", "1 hour").await?;
            let bytes = s.read_to_end().await?;
            Ok(json!(String::from_utf8_lossy(&bytes)))
        }
    })
}

#[tokio::test]
async fn s7_s9_s10_a_mocked_stream_replaces_the_body_survives_a_reopen_and_reads_back() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let mut t = TestEngine::start(move |b| b.register(exporting(r.clone())))
        .await
        .unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    // S10: the mocked bytes replace the body.
    flow.modify()
        .mock_stream_result("export", b"mocked bytes")
        .unwrap();
    create(&t, "flow").await;
    // S9: the step's stream, read back as a replay reads it.
    let stream = flow.wait_for_step_stream("export").await.unwrap();
    assert_eq!(stream.read_to_end().await.unwrap(), b"mocked bytes");
    flow.wait_for_status(InstanceStatus::Waiting).await.unwrap();
    // S7: the mocked stream is persisted and replayed by a new engine.
    flow.modify().clear();
    t.reopen().await.unwrap();
    flow.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(flow.output::<String>().await.unwrap(), "mocked bytes");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body never ran");
}

#[tokio::test]
async fn a_mocked_stream_result_that_is_not_bytes_fails_the_step_saying_so() {
    let t = TestEngine::start(|b| b.register(exporting(Arc::default())))
        .await
        .unwrap();
    let flow = t.introspect::<FnWorkflow>("flow").unwrap();
    flow.modify()
        .mock_step_result("export", json!({"not": "bytes"}))
        .unwrap();
    create(&t, "flow").await;
    flow.wait_for_status(InstanceStatus::Errored).await.unwrap();
    let error = flow.error().await.unwrap();
    assert!(
        error.message.contains("not a string or an array of bytes"),
        "{}",
        error.message
    );
}
