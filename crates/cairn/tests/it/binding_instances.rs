//! SPEC §7.7/7.8/7.11: creating and reading instances, validation, batches; parallel steps.

use std::time::Duration;

use super::support::{Counter, FnWorkflow, Seen, engine, named, records, run_to_end, wf};
use cairn::prelude::*;
use cairn::{Error, InstanceStatus, LogKind};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    item: String,
    qty: u32,
}

struct Echo;

impl Workflow for Echo {
    const NAME: &'static str = "echo";
    type Params = Order;
    type Output = (Order, String, String);

    async fn run(
        &self,
        event: WorkflowEvent<Order>,
        step: WorkflowStep,
    ) -> Result<Self::Output, WorkflowError> {
        let copy = step
            .run("copy", |_| {
                let o = event.payload.clone();
                async move { Ok(o) }
            })
            .await?;
        Ok((
            copy,
            event.workflow_name.to_string(),
            event.instance_id.to_string(),
        ))
    }
}

fn echo_order() -> Order {
    Order {
        item: "book".into(),
        qty: 2,
    }
}

#[tokio::test(start_paused = true)]
async fn b1_create_returns_the_id_and_params_arrive_as_the_payload() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let instance = engine
        .workflow::<Echo>()
        .create(CreateOptions::new(echo_order()).id("order-1"))
        .await
        .unwrap();
    assert_eq!(instance.id().as_str(), "order-1");
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output.unwrap().0, echo_order());
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b2_the_event_carries_the_workflow_name() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let instance = engine
        .workflow::<Echo>()
        .create(CreateOptions::new(echo_order()).id("x"))
        .await
        .unwrap();
    let (_, workflow, id) = instance.wait().await.unwrap().output.unwrap();
    assert_eq!((workflow.as_str(), id.as_str()), ("echo", "x"));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b3_create_without_id_generates_one_and_completes() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let instance = engine
        .workflow::<Echo>()
        .create(CreateOptions::new(echo_order()))
        .await
        .unwrap();
    assert!(!instance.id().as_str().is_empty());
    assert_eq!(
        instance.wait().await.unwrap().status,
        InstanceStatus::Complete
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b4_an_invalid_id_is_rejected() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    for bad in ["", "has space", "a/b", "-lead", &"x".repeat(101)] {
        let err = engine
            .workflow::<Echo>()
            .create(CreateOptions::new(echo_order()).id(bad))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "instance.invalid_id", "{bad:?}");
        assert!(
            err.to_string().contains("Workflow instance has invalid id"),
            "{err}"
        );
    }
    assert!(
        engine
            .workflow::<Echo>()
            .untyped()
            .create_batch(vec![CreateOptions::new(json!({}))])
            .await
            .is_err()
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_existing_id_is_already_exists_and_nothing_changes() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let client = engine.workflow::<Echo>();
    let first = client
        .create(CreateOptions::new(echo_order()).id("dup"))
        .await
        .unwrap();
    first.wait().await.unwrap();
    let other = Order {
        item: "pen".into(),
        qty: 9,
    };
    let err = client
        .create(CreateOptions::new(other).id("dup"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "instance.already_exists");
    assert!(err.to_string().contains("\"dup\""), "{err}");
    assert_eq!(
        first.status().await.unwrap().output.unwrap().0,
        echo_order(),
        "the original is untouched"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b16_create_batch_creates_all_in_input_order_and_each_completes() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let batch = (0..5)
        .map(|i| {
            CreateOptions::new(Order {
                item: format!("i{i}"),
                qty: i,
            })
            .id(format!("b{i}"))
        })
        .collect();
    let created = engine.workflow::<Echo>().create_batch(batch).await.unwrap();
    let ids: Vec<_> = created.iter().map(|i| i.id().to_string()).collect();
    assert_eq!(ids, ["b0", "b1", "b2", "b3", "b4"]);
    for (i, instance) in created.iter().enumerate() {
        assert_eq!(
            instance.wait().await.unwrap().output.unwrap().0.qty,
            i as u32
        );
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn b17_an_empty_batch_is_an_error_and_so_is_one_over_a_hundred() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let err = engine
        .workflow::<Echo>()
        .create_batch(vec![])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "batch.empty");
    assert_eq!(
        err.to_string(),
        "batchCreate should have at least 1 instance"
    );
    let too_many = (0..101).map(|_| CreateOptions::new(echo_order())).collect();
    let err = engine
        .workflow::<Echo>()
        .create_batch(too_many)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "batch.too_large");
    assert!(err.to_string().contains("100") && err.to_string().contains("101"));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn f3_batch_entries_run_independently_and_existing_ids_are_skipped() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let client = engine.workflow::<Echo>();
    client
        .create(CreateOptions::new(echo_order()).id("user2"))
        .await
        .unwrap();
    let batch = ["user1", "user2", "user3"]
        .iter()
        .map(|id| {
            CreateOptions::new(Order {
                item: (*id).into(),
                qty: 1,
            })
            .id(*id)
        })
        .collect();
    let created = client.create_batch(batch).await.unwrap();
    let ids: Vec<_> = created.iter().map(|i| i.id().to_string()).collect();
    assert_eq!(
        ids,
        ["user1", "user3"],
        "the existing id is skipped, not an error"
    );
    for instance in &created {
        let out = instance.wait().await.unwrap().output.unwrap();
        assert_eq!(
            out.0.item,
            instance.id().as_str(),
            "each got its own params"
        );
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn detailed_batch_reports_existing_repeated_and_invalid_entries() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let client = engine.workflow::<Echo>();
    client
        .create(CreateOptions::new(echo_order()).id("taken"))
        .await
        .unwrap();
    let batch = vec![
        CreateOptions::new(echo_order()).id("fresh"),
        CreateOptions::new(echo_order()).id("taken"),
        CreateOptions::new(echo_order()).id("fresh"),
        CreateOptions::new(echo_order()).id("bad id"),
        CreateOptions::new(echo_order()),
    ];
    let result = client.create_batch_detailed(batch).await.unwrap();
    assert_eq!(result.created.len(), 2);
    assert_eq!(result.created[0].id().as_str(), "fresh");
    let errors: Vec<_> = result
        .errors
        .iter()
        .map(|e| (e.index, e.code.as_str()))
        .collect();
    assert_eq!(
        errors,
        [
            (1, "instance.already_exists"),
            (2, "instance.already_exists"),
            (3, "instance.invalid_id")
        ]
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn f2_get_of_an_unknown_id_is_not_found() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let err = engine.workflow::<Echo>().get("nobody").await.unwrap_err();
    assert_eq!(err.code(), "instance.not_found");
    assert!(err.to_string().contains("nobody"));
    assert_eq!(
        engine
            .workflow::<Echo>()
            .get("bad id!")
            .await
            .unwrap_err()
            .code(),
        "instance.invalid_id"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn f10_two_workflows_can_each_have_an_instance_with_the_same_id() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, _| async { Ok(json!("first")) }))
            .register(named::<1, _, _>(|_, _| async { Ok(json!("second")) }))
    })
    .await;
    let a = engine
        .workflow::<FnWorkflow<0>>()
        .create(CreateOptions::new(json!({})).id("same"))
        .await
        .unwrap();
    let b = engine
        .workflow::<FnWorkflow<1>>()
        .create(CreateOptions::new(json!({})).id("same"))
        .await
        .unwrap();
    assert_eq!(a.wait().await.unwrap().output, Some(json!("first")));
    assert_eq!(b.wait().await.unwrap().output, Some(json!("second")));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn h2_a_complete_instance_has_its_output_and_no_error() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(json!({"ok": true})) }))).await;
    let status = run_to_end(&engine, json!({})).await.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete);
    assert_eq!(status.output, Some(json!({"ok": true})));
    assert_eq!(status.error, None);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn h3_an_errored_instance_has_the_thrown_message_and_no_output() {
    let (engine, _dir) =
        engine(|b| b.register(wf(|_, _| async { Err::<Value, _>("boom".into()) }))).await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(status.error, Some(cairn::ErrorInfo::new("Error", "boom")));
    assert_eq!(status.output, None);
    let kinds = super::support::kinds(&instance).await;
    assert_eq!(
        kinds,
        [
            LogKind::WorkflowQueued,
            LogKind::WorkflowStart,
            LogKind::WorkflowFailure
        ]
    );
    engine.shutdown().await;
}

/// A workflow type per name: names are compile-time constants in Rust.
macro_rules! named_workflow {
    ($ty:ident, $name:expr) => {
        struct $ty;
        impl Workflow for $ty {
            const NAME: &'static str = $name;
            type Params = Value;
            type Output = Value;
            async fn run(
                &self,
                _: WorkflowEvent<Value>,
                _: WorkflowStep,
            ) -> Result<Value, WorkflowError> {
                Ok(Value::Null)
            }
        }
    };
}

named_workflow!(Empty, "");
named_workflow!(Blank, " ");
named_workflow!(Spaced, "a b");
named_workflow!(Newline, "\nname");
named_workflow!(
    TooLong,
    "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
);
named_workflow!(Dotted, "dot.ted");
named_workflow!(Leading, "-lead");
named_workflow!(Plain, "abc");
named_workflow!(Mixed, "NAME_123-hello");
named_workflow!(
    Longest,
    "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
);

async fn start_with<W: Workflow>(w: W) -> Result<cairn::Engine, Error> {
    let (dir, path) = super::support::temp_db();
    let result = super::support::builder_at(&path).register(w).start().await;
    std::mem::forget(dir); // kept until the process ends: the engine may still use it
    result
}

#[tokio::test(start_paused = true)]
async fn v1_workflow_names_are_validated() {
    let rejected = [
        (start_with(Empty).await, ""),
        (start_with(Blank).await, " "),
        (start_with(Spaced).await, "a b"),
        (start_with(Newline).await, "\nname"),
        (start_with(TooLong).await, TooLong::NAME),
        (start_with(Dotted).await, "dot.ted"),
        (start_with(Leading).await, "-lead"),
    ];
    for (result, name) in rejected {
        let err = result.expect_err(name);
        assert_eq!(err.code(), "engine.config", "{name:?}");
        assert!(err.to_string().contains(&format!("{name:?}")), "{err}");
    }
    assert_eq!(Longest::NAME.len(), 64);
    for engine in [
        start_with(Plain).await,
        start_with(Mixed).await,
        start_with(Longest).await,
    ] {
        let engine = engine.unwrap();
        assert!(
            engine
                .workflow_by_name(engine.workflow_names()[0].as_str())
                .is_ok()
        );
        engine.shutdown().await;
    }
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    assert_eq!(
        engine.workflow_by_name("missing").unwrap_err().code(),
        "workflow.not_found"
    );
    assert_eq!(
        engine.workflow_by_name("bad name").unwrap_err().code(),
        "workflow.invalid_name"
    );
    let unregistered = engine
        .workflow::<Plain>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap_err();
    assert_eq!(unregistered.code(), "workflow.not_found");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn v2_instance_ids_are_validated() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(Value::Null) }))).await;
    let client = engine.workflow::<FnWorkflow>();
    for bad in [
        "",
        " ",
        "a\n",
        "new\nline",
        &"x".repeat(101),
        "semi;colon",
        "ü",
    ] {
        let err = client
            .create(CreateOptions::new(json!({})).id(bad))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "instance.invalid_id", "{bad:?}");
    }
    for good in ["a", "_", "A-b_c-9", &"x".repeat(100)] {
        client
            .create(CreateOptions::new(json!({})).id(good))
            .await
            .unwrap();
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn v4_step_names_are_validated() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let ok = step.run("spaces are fine", |_| async { Ok(1) }).await?;
            let long_ok = step.run("n".repeat(256), |_| async { Ok(2) }).await?;
            let too_long = step
                .run("n".repeat(257), |_| async { Ok(3) })
                .await
                .unwrap_err();
            let control = step
                .run("tab\there", |_| async { Ok(4) })
                .await
                .unwrap_err();
            Ok(json!([ok, long_ok, too_long.message(), control.message()]))
        }))
    })
    .await;
    let output = run_to_end(&engine, json!({}))
        .await
        .status()
        .await
        .unwrap()
        .output
        .unwrap();
    assert_eq!((output[0].clone(), output[1].clone()), (json!(1), json!(2)));
    for i in [2, 3] {
        assert!(
            output[i]
                .as_str()
                .unwrap()
                .contains("exceeds max length (256 chars) or invalid characters found")
        );
    }
    engine.shutdown().await;
}

#[test]
fn v5_step_configs_are_validated() {
    for bad in [
        r#"{"retries": {"limit": 1}}"#,
        r#"{"retries": {"delay": 1}}"#,
        r#"{"retries": {"limit": 1, "delay": 1, "extra": 1}}"#,
        r#"{"retries": {"limit": 1, "delay": "whenever"}}"#,
        r#"{"timeout": 0}"#,
        r#"{"sensitive": "input"}"#,
        r#"{"retries": {"limit": 10001, "delay": 1}}"#,
    ] {
        let err = StepConfig::from_json(bad).unwrap_err();
        assert!(!err.to_string().is_empty(), "{bad}");
    }
    for good in [
        r#"{"retries": {"limit": 0, "delay": 0}}"#,
        r#"{"retries": {"limit": 3, "delay": "10 seconds", "backoff": "linear"}, "timeout": "30 minutes"}"#,
        r#"{"sensitive": "output"}"#,
    ] {
        StepConfig::from_json(good).unwrap();
    }
    let c = StepConfig::from_json(r#"{"retries": {"limit": 3, "delay": 250}}"#).unwrap();
    assert_eq!(c.retries.unwrap().limit, 3);
}

#[tokio::test(start_paused = true)]
async fn a_config_over_the_retry_limit_fails_the_step_naming_it() {
    let calls = Counter::default();
    let c = calls.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let c = c.clone();
            async move {
                let err = step
                    .run("greedy", |_| {
                        c.bump();
                        async { Ok(()) }
                    })
                    .retries(Retries::new(20_000, Duration::ZERO))
                    .await
                    .unwrap_err();
                Ok(json!(err.message()))
            }
        }))
    })
    .await;
    let output = run_to_end(&engine, json!({}))
        .await
        .status()
        .await
        .unwrap()
        .output
        .unwrap();
    let message = output.as_str().unwrap();
    assert!(
        message.contains("Step config for \"greedy\" is in a invalid format")
            && message.contains("10000"),
        "{message}"
    );
    assert_eq!(calls.get(), 0, "an invalid config runs nothing");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn f4_a_plain_error_with_limit_three_runs_four_times() {
    for message in ["failing", ""] {
        let calls = Counter::default();
        let c = calls.clone();
        let (engine, _dir) = engine(move |b| {
            b.register(wf(move |_, step| {
                let c = c.clone();
                async move {
                    step.run("s", |_| {
                        c.bump();
                        async move { Err::<(), _>(message.into()) }
                    })
                    .retries(Retries::new(3, Duration::from_millis(100)))
                    .await?;
                    Ok(Value::Null)
                }
            }))
        })
        .await;
        let instance = run_to_end(&engine, json!({})).await;
        assert_eq!(calls.get(), 4, "message {message:?}");
        assert_eq!(
            instance.status().await.unwrap().error.unwrap().message,
            message
        );
        engine.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn f5_a_non_retryable_error_runs_once_even_with_an_empty_message() {
    for message in ["stop", ""] {
        let calls = Counter::default();
        let c = calls.clone();
        let (engine, _dir) = engine(move |b| {
            b.register(wf(move |_, step| {
                let c = c.clone();
                async move {
                    step.run("s", |_| {
                        c.bump();
                        async move { Err::<(), _>(NonRetryableError::new(message).into()) }
                    })
                    .retries(Retries::new(3, Duration::from_millis(100)))
                    .await?;
                    Ok(Value::Null)
                }
            }))
        })
        .await;
        let instance = run_to_end(&engine, json!({})).await;
        assert_eq!(calls.get(), 1, "message {message:?}");
        assert_eq!(
            instance.status().await.unwrap().error.unwrap().name,
            "NonRetryableError"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn untyped_creation_checks_params_and_size() {
    let (engine, _dir) = engine(|b| b.payload_limit(200).register(Echo)).await;
    let echo = engine.workflow_by_name("echo").unwrap();
    let err = echo
        .create(CreateOptions::new(json!({"item": 5})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "params.invalid");
    let err = echo
        .create(CreateOptions::new(
            json!({"item": "x".repeat(300), "qty": 1}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "payload.too_large");
    assert!(err.to_string().contains("200"), "{err}");
    let ok = echo
        .create(CreateOptions::new(json!({"item": "x", "qty": 1})))
        .await
        .unwrap();
    assert_eq!(ok.wait().await.unwrap().status, InstanceStatus::Complete);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn parallel_steps_run_concurrently_and_replay_deterministically() {
    let (dir, path) = super::support::temp_db();
    let both_started = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let make = |barrier: std::sync::Arc<tokio::sync::Barrier>, crash: bool| {
        wf(move |_, step| {
            let (b1, b2) = (barrier.clone(), barrier.clone());
            async move {
                let (a, b) = futures::try_join!(
                    step.run("fetch", move |ctx| {
                        let br = b1.clone();
                        async move {
                            br.wait().await;
                            Ok(ctx.step.count * 10)
                        }
                    }),
                    step.run("fetch", move |ctx| {
                        let br = b2.clone();
                        async move {
                            br.wait().await;
                            Ok(ctx.step.count * 10)
                        }
                    }),
                )?;
                if crash {
                    std::future::pending::<()>().await;
                }
                let c: u32 = step
                    .run("fetch", |ctx| async move { Ok(ctx.step.count * 10) })
                    .await?;
                Ok(json!([a, b, c]))
            }
        })
    };
    let first = super::support::builder_at(&path)
        .register(make(both_started.clone(), true))
        .start()
        .await
        .unwrap();
    let created = first
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("p"))
        .await
        .unwrap();
    created.wait_for(|_| true).await.unwrap();
    // Wait until both parallel steps are committed (they only finish together: the barrier).
    loop {
        let d = created.details().await.unwrap();
        if d.steps.iter().filter(|s| s.success == Some(true)).count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    first.shutdown().await;
    let second = super::support::builder_at(&path)
        .register(make(
            std::sync::Arc::new(tokio::sync::Barrier::new(1)),
            false,
        ))
        .start()
        .await
        .unwrap();
    let instance = second.workflow::<FnWorkflow>().get("p").await.unwrap();
    assert_eq!(
        instance.wait().await.unwrap().output,
        Some(json!([10, 20, 30]))
    );
    assert_eq!(
        records(&instance, LogKind::StepStart).await.len(),
        3,
        "the parallel steps did not run again"
    );
    second.shutdown().await;
    drop(dir);
}

#[tokio::test(start_paused = true)]
async fn dynamic_step_names_from_step_outputs_replay() {
    let fetched = Seen::default();
    let f = fetched.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let f = f.clone();
            async move {
                let cats: Vec<String> = step
                    .run("get cat list", |_| async {
                        Ok(vec!["tom".to_string(), "felix".to_string()])
                    })
                    .await?;
                let mut out = Vec::new();
                for cat in &cats {
                    let f = f.clone();
                    out.push(
                        step.run(format!("get cat: {cat}"), |ctx| {
                            f.push(ctx.step.name.clone());
                            let c = cat.clone();
                            async move { Ok(c.to_uppercase()) }
                        })
                        .await?,
                    );
                }
                Ok(json!(out))
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!(["TOM", "FELIX"]))
    );
    assert_eq!(fetched.all(), ["get cat: tom", "get cat: felix"]);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn instances_beyond_the_concurrency_limit_stay_queued() {
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let r = release.clone();
    let (engine, _dir) = engine(move |b| {
        b.max_running(2).register(wf(move |_, step| {
            let r = r.clone();
            async move {
                step.run("hold", |_| {
                    let r = r.clone();
                    async move {
                        r.acquire()
                            .await
                            .map(|p| p.forget())
                            .map_err(|e| e.to_string())?;
                        Ok(())
                    }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let client = engine.workflow::<FnWorkflow>();
    let batch = (0..5)
        .map(|i| CreateOptions::new(json!({})).id(format!("q{i}")))
        .collect();
    let instances = client.create_batch(batch).await.unwrap();
    for i in &instances[..2] {
        i.wait_for(|s| s.status == InstanceStatus::Running)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in &instances[2..] {
        assert_eq!(
            super::support::status_of(i).await,
            InstanceStatus::Queued,
            "{}",
            i.id()
        );
    }
    release.add_permits(5);
    for i in &instances {
        assert_eq!(i.wait().await.unwrap().status, InstanceStatus::Complete);
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn details_show_steps_attempts_and_timings_in_start_order() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("first", |_| async { Ok("one".to_string()) })
                .await?;
            step.run("second", |ctx| async move {
                if ctx.attempt == 1 {
                    Err("retry me".into())
                } else {
                    Ok("two".to_string())
                }
            })
            .retries(Retries::constant(2, Duration::from_secs(5)))
            .await?;
            Ok(json!("done"))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({"p": 1})).await;
    let d = instance.details().await.unwrap();
    assert_eq!(d.status, InstanceStatus::Complete);
    assert_eq!(d.success, Some(true));
    assert_eq!(d.params, json!({"p": 1}));
    assert_eq!(d.output, Some(json!("done")));
    assert!(d.start.is_some() && d.end.is_some());
    let names: Vec<_> = d.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
    let second = &d.steps[1];
    assert_eq!(second.output, Some(json!("two")));
    assert_eq!(second.attempts.len(), 2);
    assert_eq!(second.attempts[0].success, Some(false));
    assert_eq!(second.attempts[0].retry_delay_ms, Some(5000));
    assert_eq!(
        second.attempts[0].error.as_ref().unwrap().message,
        "retry me"
    );
    assert_eq!(second.attempts[1].success, Some(true));
    assert_eq!(second.config["retries"]["limit"], 2);
    let json = serde_json::to_value(&d).unwrap();
    assert!(
        json["queued"].as_str().unwrap().ends_with('Z'),
        "ISO-8601 timestamps: {}",
        json["queued"]
    );
    assert_eq!(json["steps"][1]["type"], "step");
    let ids: Vec<u64> = instance
        .log(0)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "monotonic log ids");
    let tail = instance.log(ids[2]).await.unwrap();
    assert_eq!(
        tail.first().map(|r| r.id),
        Some(ids[3]),
        "cursor resumes strictly after"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn try_join_works_with_step_bodies_that_borrow_workflow_locals() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|event, step| async move {
            let words: Vec<String> = serde_json::from_value(event.payload["words"].clone())?;
            // Both bodies borrow `words`, a local of the workflow future.
            let (count, longest) = futures::try_join!(
                step.run("count", |_| {
                    let n = words.len();
                    async move { Ok(n) }
                }),
                step.run("longest", |_| {
                    let l = words.iter().map(String::len).max().unwrap_or(0);
                    async move { Ok(l) }
                }),
            )?;
            Ok(json!([count, longest]))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({"words": ["a", "abc", "ab"]})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!([3, 3])));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn commits_announces_the_engines_writes_and_not_refused_requests() {
    let (engine, _dir) = engine(|b| b.register(Echo)).await;
    let mut commits = engine.commits();
    commits.borrow_and_update();
    let err = engine
        .workflow::<Echo>()
        .create(CreateOptions::new(echo_order()).id("bad id"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "instance.invalid_id");
    assert!(
        !commits.has_changed().unwrap(),
        "a refused create wrote nothing"
    );
    let instance = engine
        .workflow::<Echo>()
        .create(CreateOptions::new(echo_order()).id("c"))
        .await
        .unwrap();
    assert!(commits.has_changed().unwrap(), "the create was announced");
    // Every record that reaches the log is announced: wait on `commits` alone, re-reading
    // the log after each wake, until the terminal record appears.
    loop {
        commits.borrow_and_update();
        let log = instance.log(0).await.unwrap();
        if log.iter().any(|r| r.entry.kind == LogKind::WorkflowSuccess) {
            break;
        }
        tokio::time::timeout(Duration::from_secs(3600), commits.changed())
            .await
            .expect("a commit is announced before an hour of virtual time passes")
            .unwrap();
    }
    engine.shutdown().await;
}
