//! SPEC §7.1: non-retryable errors, delay functions, restarts and the step limit.

use std::time::Duration;

use super::support::{Counter, Seen, engine, records, run_to_end, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind, StepKind};
use serde_json::{Value, json};

#[tokio::test(start_paused = true)]
async fn e1_non_retryable_error_runs_once() {
    let calls = Counter::default();
    let c = calls.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let c = c.clone();
            async move {
                step.run("charge", |_| {
                    let c = c.clone();
                    async move {
                        c.bump();
                        Err::<(), _>(NonRetryableError::new("card declined").into())
                    }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(
        calls.get(),
        1,
        "a non-retryable error is attempted exactly once"
    );
    assert_eq!(records(&instance, LogKind::AttemptStart).await.len(), 1);
    assert_eq!(records(&instance, LogKind::StepFailure).await.len(), 1);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e2_non_retryable_message_is_preserved_in_instance_and_attempt_errors() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("s", |_| async {
                Err::<(), _>(NonRetryableError::new("original message").into())
            })
            .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let error = instance.status().await.unwrap().error.unwrap();
    assert_eq!(
        error,
        cairn::ErrorInfo::new("NonRetryableError", "original message")
    );
    let failure = &records(&instance, LogKind::AttemptFailure).await[0];
    assert_eq!(
        failure.entry.meta["error"],
        json!({"name": "NonRetryableError", "message": "original message"})
    );
    assert!(failure.entry.meta.get("retryDelayMs").is_none());
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e3_exhausted_step_caught_by_user_code_does_not_fail_the_instance() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let caught = step
                .run("flaky", |_| async { Err::<(), _>("always".into()) })
                .retries(Retries::none())
                .await;
            let error = caught.expect_err("the step fails");
            Ok(json!({ "caught": error.message() }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete);
    assert_eq!(status.output, Some(json!({"caught": "always"})));
    assert_eq!(records(&instance, LogKind::AttemptFailure).await.len(), 1);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e4_delay_function_value_is_the_retry_delay() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let v: u32 = step
                .run("eventually", |ctx| async move {
                    if ctx.attempt < 3 {
                        Err("not yet".into())
                    } else {
                        Ok(ctx.attempt)
                    }
                })
                .retries(Retries::constant(
                    5,
                    Delay::sync(|d: &DelayContext| {
                        Duration::from_millis(250 * u64::from(d.ctx.attempt))
                    }),
                ))
                .await?;
            Ok(json!(v))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(3)));
    let delays: Vec<Value> = records(&instance, LogKind::AttemptFailure)
        .await
        .iter()
        .map(|r| r.entry.meta["retryDelayMs"].clone())
        .collect();
    assert_eq!(
        delays,
        [json!(250), json!(500)],
        "constant back-off uses the returned value as is"
    );
    let config = &instance.details().await.unwrap().steps[0].config;
    assert_eq!(config["retries"]["delay"], "[dynamic]");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e4_delay_function_result_is_the_base_of_the_backoff() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("grows", |ctx| async move {
                if ctx.attempt < 4 {
                    Err("no".into())
                } else {
                    Ok(())
                }
            })
            .retries(Retries::exponential(
                5,
                Delay::sync(|_: &DelayContext| "1 second"),
            ))
            .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let delays: Vec<Value> = records(&instance, LogKind::AttemptFailure)
        .await
        .iter()
        .map(|r| r.entry.meta["retryDelayMs"].clone())
        .collect();
    assert_eq!(delays, [json!(1000), json!(2000), json!(4000)]);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e5_throwing_delay_function_fails_the_step_after_one_attempt() {
    let calls = Counter::default();
    let c = calls.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let c = c.clone();
            async move {
                step.run("s", |_| {
                    c.bump();
                    async { Err::<(), _>("first failure".into()) }
                })
                .retries(Retries::new(
                    5,
                    Delay::function(|_| async { Err::<Duration, _>("delay exploded") }),
                ))
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(calls.get(), 1);
    let error = instance.status().await.unwrap().error.unwrap();
    assert_eq!(error.name, "NonRetryableDelayError");
    assert!(error.message.contains("delay function"), "{error}");
    assert!(error.message.contains("delay exploded"), "{error}");
    assert!(error.message.contains("\"s-1\""), "{error}");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e5_delay_function_returning_an_invalid_duration_or_hanging_fails_the_step() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let invalid = step
                .run("invalid", |_| async { Err::<(), _>("x".into()) })
                .retries(Retries::new(3, Delay::sync(|_: &DelayContext| "soon-ish")))
                .await
                .expect_err("fails");
            let hanging = step
                .run("hanging", |_| async { Err::<(), _>("x".into()) })
                .retries(Retries::new(
                    3,
                    Delay::function(|_| async {
                        std::future::pending::<()>().await;
                        Ok::<_, cairn::BoxError>(Duration::ZERO)
                    }),
                ))
                .await
                .expect_err("fails");
            Ok(json!([invalid.message(), hanging.message()]))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let output = instance.status().await.unwrap().output.unwrap();
    assert!(
        output[0]
            .as_str()
            .unwrap()
            .contains("returned an invalid delay value"),
        "{output}"
    );
    assert!(
        output[1]
            .as_str()
            .unwrap()
            .contains("did not return within 5 seconds"),
        "{output}"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e6_context_config_has_no_delay_for_a_function_and_the_exact_value_otherwise() {
    let seen = Seen::default();
    let s = seen.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let s = s.clone();
            async move {
                let s1 = s.clone();
                step.run("dynamic", move |ctx| {
                    s1.push(ctx.config.to_context_json());
                    async { Ok(()) }
                })
                .retries(Retries::new(
                    2,
                    Delay::sync(|_: &DelayContext| Duration::from_secs(1)),
                ))
                .await?;
                let s2 = s.clone();
                step.run("fixed", move |ctx| {
                    s2.push(ctx.config.to_context_json());
                    async { Ok(()) }
                })
                .retries(Retries::new(2, Duration::from_millis(1500)))
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    run_to_end(&engine, json!({})).await;
    let configs = seen.all();
    assert!(
        configs[0]["retries"].get("delay").is_none(),
        "{}",
        configs[0]
    );
    assert_eq!(configs[1]["retries"]["delay"], 1500);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e10_m2_identity_status_and_log_survive_an_engine_restart() {
    let (dir, path) = super::support::temp_db();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let first = {
        let gate = gate.clone();
        super::support::builder_at(&path)
            .register(wf(move |_, step| {
                let gate = gate.clone();
                async move {
                    step.run("block", |_| {
                        let gate = gate.clone();
                        async move {
                            gate.notify_one();
                            std::future::pending::<()>().await;
                            Ok(())
                        }
                    })
                    .await?;
                    Ok(Value::Null)
                }
            }))
            .start()
            .await
            .unwrap()
    };
    let created = first
        .workflow::<super::support::FnWorkflow>()
        .create(CreateOptions::new(json!({"k": 1})).id("survivor"))
        .await
        .unwrap();
    gate.notified().await;
    first.shutdown().await;

    let second = super::support::builder_at(&path)
        .register(wf(|_, step| async move {
            step.run("block", |_| async { Ok(()) }).await?;
            Ok(json!("done"))
        }))
        .start()
        .await
        .unwrap();
    let instance = second
        .workflow::<super::support::FnWorkflow>()
        .get("survivor")
        .await
        .unwrap();
    assert_eq!(instance.id(), created.id());
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!("done")));
    assert_eq!(
        records(&instance, LogKind::WorkflowStart).await.len(),
        1,
        "one WORKFLOW_START across both lifetimes"
    );
    let details = instance.details().await.unwrap();
    assert_eq!(details.params, json!({"k": 1}));
    assert_eq!(
        details.steps[0].attempts.len(),
        2,
        "the interrupted attempt is recorded, then retried"
    );
    assert_eq!(
        details.steps[0].attempts[0]
            .error
            .as_ref()
            .map(|e| e.name.as_str()),
        Some("WorkflowInternalError")
    );
    second.shutdown().await;
    drop(dir);
}

fn many_steps(n: usize) -> super::support::FnWorkflow {
    wf(move |_, step| async move {
        for i in 0..n {
            step.run(format!("step {i}"), |_| async move { Ok(i) })
                .await?;
        }
        Ok(json!(n))
    })
}

#[tokio::test(start_paused = true)]
async fn e13_a_step_over_the_limit_fails_the_instance() {
    let (engine, _dir) = engine(|b| b.step_limit(3).register(many_steps(4))).await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert!(
        status
            .error
            .unwrap()
            .message
            .contains("The limit of 3 steps has been reached")
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e14_exactly_the_limit_of_steps_completes() {
    let (engine, _dir) = engine(|b| b.step_limit(3).register(many_steps(4))).await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(records(&instance, LogKind::StepSuccess).await.len(), 3);
    let (engine3, _dir3) =
        super::support::engine(|b| b.step_limit(3).register(many_steps(3))).await;
    let ok = run_to_end(&engine3, json!({})).await;
    assert_eq!(
        super::support::status_of(&ok).await,
        InstanceStatus::Complete
    );
    engine.shutdown().await;
    engine3.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e15_the_default_step_limit_is_ten_thousand() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            // Created in one go, so the claims happen in order and the commits group.
            let ops: Vec<_> = (0..10_001u32)
                .map(|i| step.run("same name", move |_| async move { Ok(i) }))
                .collect();
            let results = futures::future::join_all(ops).await;
            let ok = results.iter().filter(|r| r.is_ok()).count();
            let last = results
                .last()
                .unwrap()
                .as_ref()
                .expect_err("the 10,001st fails");
            Ok(json!({ "ok": ok, "error": last.message() }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let output = instance.status().await.unwrap().output.unwrap();
    assert_eq!(output["ok"], 10_000);
    assert!(
        output["error"]
            .as_str()
            .unwrap()
            .contains("The limit of 10000 steps")
    );
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps.len(), 10_000);
    assert!(
        details
            .steps
            .iter()
            .all(|s| s.name == "same name" && s.count >= 1)
    );
    assert_eq!(details.steps.last().unwrap().count, 10_000);
    let _ = StepKind::Run;
    engine.shutdown().await;
}

/// `wait_timeout` gives up at its deadline and returns the status once finished.
#[tokio::test(start_paused = true)]
async fn wait_timeout_returns_none_at_the_deadline() {
    let (engine, _dir) = super::support::engine(|b| {
        b.register(super::support::wf(|_, step| async move {
            step.sleep("nap", Duration::from_secs(60)).await?;
            Ok(serde_json::Value::Null)
        }))
    })
    .await;
    let instance = engine
        .workflow::<super::support::FnWorkflow>()
        .create(cairn::CreateOptions::new(serde_json::json!({})))
        .await
        .unwrap();
    assert!(
        instance
            .wait_timeout(Duration::from_secs(10))
            .await
            .unwrap()
            .is_none()
    );
    let done = instance
        .wait_timeout(Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(
        done.map(|s| s.status),
        Some(cairn::InstanceStatus::Complete)
    );
    engine.shutdown().await;
}
