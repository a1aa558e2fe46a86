//! SPEC §7.3: the step context and retries; §7.6 sensitive output; limits on outputs.

use std::time::Duration;

use super::support::{Counter, Seen, engine, records, run_to_end, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind, ResolvedConfig};
use serde_json::{Value, json};

#[tokio::test(start_paused = true)]
async fn c1_attempt_is_one_on_a_first_successful_attempt() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let attempt = step.run("s", |ctx| async move { Ok(ctx.attempt) }).await?;
            Ok(json!(attempt))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(1)));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c2_limit_two_means_attempts_one_two_three_then_failure() {
    let seen = Seen::default();
    let s = seen.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let s = s.clone();
            async move {
                step.run("always fails", |ctx| {
                    s.push(ctx.attempt);
                    async { Err::<(), _>("nope".into()) }
                })
                .retries(Retries::new(2, Duration::from_millis(10)))
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(seen.all(), [1, 2, 3]);
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(status.error.unwrap().message, "nope");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c3_retry_delays_are_waited() {
    let times = Seen::default();
    let t = times.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let t = t.clone();
            async move {
                step.run("s", |ctx| {
                    t.push(ctx.attempt);
                    async move {
                        if ctx.attempt == 1 {
                            Err("first".into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .retries(Retries::constant(
                    1,
                    cairn::parse_duration("1 second").unwrap(),
                ))
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let before = engine.clock().now();
    let instance = run_to_end(&engine, json!({})).await;
    let elapsed = engine.clock().now().since(before);
    assert_eq!(times.all(), [1, 2]);
    assert!(
        elapsed >= Duration::from_millis(900),
        "waited {elapsed:?} of virtual time"
    );
    let details = instance.details().await.unwrap();
    let a = &details.steps[0].attempts;
    assert!(a[1].start.since(a[0].end.unwrap()) >= Duration::from_secs(1));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c4_default_ten_second_backoffs_cost_no_wall_time() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let n: u32 = step
                .run("s", |ctx| async move {
                    if ctx.attempt < 3 {
                        Err("again".into())
                    } else {
                        Ok(ctx.attempt)
                    }
                })
                .await?;
            Ok(json!(n))
        }))
    })
    .await;
    let wall = std::time::Instant::now();
    let before = engine.clock().now();
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(3)));
    assert!(
        engine.clock().now().since(before) >= Duration::from_secs(30),
        "10 s + 20 s of virtual back-off"
    );
    assert!(
        wall.elapsed() < Duration::from_secs(5),
        "no real waiting: {:?}",
        wall.elapsed()
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c5_context_names_the_step_with_count_one() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let id = step
                .run("my step", |ctx| async move {
                    Ok((ctx.step.name, ctx.step.count))
                })
                .await?;
            Ok(json!(id))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!(["my step", 1]))
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c6_same_name_steps_count_up_and_other_names_start_at_one() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let mut counts = Vec::new();
            for name in ["a", "a", "b", "a"] {
                counts.push(
                    step.run(name, |ctx| async move { Ok(ctx.step.count) })
                        .await?,
                );
            }
            Ok(json!(counts))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!([1, 2, 1, 3]))
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c7_defaults_are_prods() {
    let seen = Seen::default();
    let s = seen.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let s = s.clone();
            async move {
                step.run("s", |ctx| {
                    s.push(ctx.config.to_context_json());
                    async { Ok(()) }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    run_to_end(&engine, json!({})).await;
    assert_eq!(
        seen.all()[0],
        json!({"retries": {"limit": 5, "delay": 10000, "backoff": "exponential"}, "timeout": "10 minutes"})
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c8_partial_overrides_merge_with_defaults() {
    let seen = Seen::default();
    let s = seen.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let s = s.clone();
            async move {
                step.run("s", |ctx| {
                    s.push(ctx.config);
                    async { Ok(()) }
                })
                .retries(Retries::new(3, Duration::from_millis(500)))
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    run_to_end(&engine, json!({})).await;
    let config: ResolvedConfig = seen.all()[0];
    assert_eq!(config.retries.limit, 3);
    assert_eq!(
        config.retries.backoff,
        Backoff::Exponential,
        "backoff stays the default"
    );
    assert_eq!(config.timeout, Duration::from_secs(600));
    engine.shutdown().await;
}

/// A step's `STEP_START` is committed without its configuration (the step's row beside it
/// holds it) and reads back with it, each step its own, in the log and in the details.
#[tokio::test(start_paused = true)]
async fn each_step_start_reads_back_with_its_own_configuration() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| async move {
            step.run("first", |_| async { Ok(1u32) })
                .retries(Retries::linear(3, Duration::from_millis(500)))
                .await?;
            step.run("second", |_| async { Ok(2u32) })
                .timeout(Duration::from_secs(90))
                .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let starts = records(&instance, LogKind::StepStart).await;
    assert_eq!(starts.len(), 2);
    assert_eq!(
        starts[0].entry.meta["config"]["retries"],
        json!({"limit": 3, "delay": 500, "backoff": "linear"})
    );
    assert_eq!(starts[0].entry.meta["hasRollback"], false);
    assert_eq!(starts[1].entry.meta["config"]["timeout"], "90 seconds");
    assert_ne!(
        starts[0].entry.meta["config"], starts[1].entry.meta["config"],
        "each its own"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn c9_mutating_the_context_config_changes_nothing() {
    let calls = Counter::default();
    let c = calls.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let c = c.clone();
            async move {
                let _ = step
                    .run("s", |mut ctx| {
                        c.bump();
                        ctx.config.retries.limit = 100;
                        async { Err::<(), _>("x".into()) }
                    })
                    .retries(Retries::new(1, Duration::from_millis(1)))
                    .await;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    run_to_end(&engine, json!({})).await;
    assert_eq!(
        calls.get(),
        2,
        "limit 1 means two attempts whatever the body did to its copy"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_shared_step_config_applies_to_every_step_using_it() {
    let calls = Counter::default();
    let c = calls.clone();
    let shared = StepConfig {
        retries: Some(Retries::constant(2, Duration::from_secs(1))),
        timeout: Some(Duration::from_secs(5)),
        ..StepConfig::default()
    };
    let (engine, _dir) = engine(move |b| {
        b.register(wf(move |_, step| {
            let (c, shared) = (c.clone(), shared.clone());
            async move {
                for name in ["one", "two"] {
                    let _ = step
                        .run(name, |_| {
                            c.bump();
                            async { Err::<(), _>("x".into()) }
                        })
                        .config(&shared)
                        .await;
                }
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(calls.get(), 6);
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps[1].config["timeout"], "5 seconds");
    assert_eq!(details.steps[1].config["retries"]["backoff"], "constant");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_timeout_fails_the_attempt_and_is_retried() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let attempt: u32 = step
                .run("slow then fast", |ctx| async move {
                    if ctx.attempt == 1 {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    Ok(ctx.attempt)
                })
                .timeout(Duration::from_secs(2))
                .retries(Retries::new(1, Duration::from_secs(1)))
                .await?;
            Ok(json!(attempt))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(2)));
    let failure = &records(&instance, LogKind::AttemptFailure).await[0];
    assert_eq!(
        failure.entry.meta["error"],
        json!({"name": "WorkflowTimeoutError", "message": "Execution timed out after 2000ms"})
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn x1_sensitive_output_is_redacted_in_logs_but_real_in_code() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let secret: String = step
                .run("token", |_| async { Ok("s3cr3t".to_string()) })
                .sensitive()
                .await?;
            let len: usize = step
                .run("use it", |_| {
                    let n = secret.len();
                    async move { Ok(n) }
                })
                .await?;
            Ok(json!(len))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(
        instance.status().await.unwrap().output,
        Some(json!(6)),
        "downstream code got the real value"
    );
    let success = &records(&instance, LogKind::StepSuccess).await[0];
    assert_eq!(success.entry.meta["result"], "[REDACTED]");
    let everything = serde_json::to_string(&instance.log(0).await.unwrap()).unwrap();
    assert!(
        !everything.contains("s3cr3t"),
        "no log record shows the secret"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn x2_step_details_show_redacted_and_x3_errors_are_not_redacted() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("token", |_| async { Ok("s3cr3t".to_string()) })
                .sensitive()
                .await?;
            let _ = step
                .run("failing secret", |_| async {
                    Err::<String, _>("visible error".into())
                })
                .sensitive()
                .retries(Retries::none())
                .await;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps[0].output, Some(json!("[REDACTED]")));
    assert_eq!(
        details.steps[1].error.as_ref().unwrap().message,
        "visible error"
    );
    assert!(!serde_json::to_string(&details).unwrap().contains("s3cr3t"));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_output_over_the_limit_fails_the_step_at_once_naming_step_size_and_limit() {
    let calls = Counter::default();
    let c = calls.clone();
    let (engine, _dir) = engine(|b| {
        b.payload_limit(1024).register(wf(move |_, step| {
            let c = c.clone();
            async move {
                step.run("big", |_| {
                    c.bump();
                    async { Ok("x".repeat(2000)) }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(calls.get(), 1, "not retried");
    let error = instance.status().await.unwrap().error.unwrap();
    assert_eq!(error.name, "WorkflowInternalError");
    assert!(error.message.contains("big-1"), "{error}");
    assert!(error.message.contains("2002 bytes"), "{error}");
    assert!(error.message.contains("1024"), "{error}");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_default_output_limit_is_one_mebibyte() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let ok: String = step
                .run("just under", |_| async { Ok("x".repeat((1 << 20) - 2)) })
                .await?;
            let over = step
                .run("just over", |_| async { Ok("x".repeat(1 << 20)) })
                .await;
            Ok(json!([
                ok.len(),
                over.expect_err("over the limit").message()
            ]))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let output = instance.status().await.unwrap().output.unwrap();
    assert_eq!(output[0], (1 << 20) - 2);
    assert!(output[1].as_str().unwrap().contains("1MiB"));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_step_body_is_a_retryable_failure() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let attempt: u32 = step
                .run("panics once", |ctx| async move {
                    assert!(ctx.attempt > 1, "first attempt explodes");
                    Ok(ctx.attempt)
                })
                .retries(Retries::new(1, Duration::ZERO))
                .await?;
            Ok(json!(attempt))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!(2)));
    let failure = &records(&instance, LogKind::AttemptFailure).await[0];
    assert!(
        failure.entry.meta["error"]["message"]
            .as_str()
            .unwrap()
            .contains("first attempt explodes")
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn idempotency_key_is_stable_across_attempts_and_replays() {
    let keys = Seen::default();
    let k = keys.clone();
    let (engine, _dir) = engine(|b| {
        b.register(wf(move |_, step| {
            let k = k.clone();
            async move {
                step.run("charge", |ctx| {
                    k.push(ctx.idempotency_key().to_owned());
                    async move {
                        if ctx.attempt < 3 {
                            Err("flaky".into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .retries(Retries::new(5, Duration::ZERO))
                .await?;
                step.run("other", |ctx| {
                    k.push(ctx.idempotency_key().to_owned());
                    async { Ok(()) }
                })
                .await?;
                Ok(Value::Null)
            }
        }))
    })
    .await;
    let a = run_to_end(&engine, json!({})).await;
    let all = keys.all();
    assert_eq!(all[0], all[1]);
    assert_eq!(all[1], all[2]);
    assert_ne!(all[2], all[3], "another step has another key");
    assert!(all[0].contains(a.id().as_str()) && all[0].contains("charge"));
    run_to_end(&engine, json!({})).await;
    assert_ne!(keys.all()[4], all[0], "another instance has another key");
    engine.shutdown().await;
}

/// Polls the details until `ready` accepts them (virtual time moves five minutes per look).
async fn details_when(
    instance: &cairn::Instance<Value>,
    ready: impl Fn(&cairn::InstanceDetails) -> bool,
) -> cairn::InstanceDetails {
    for _ in 0..10_000 {
        let d = instance.details().await.unwrap();
        if ready(&d) {
            return d;
        }
        tokio::time::sleep(Duration::from_secs(300)).await;
    }
    panic!(
        "the details never got there: {}",
        serde_json::to_string_pretty(&instance.details().await.unwrap()).unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn details_say_when_a_retry_is_due_and_when_a_sleep_or_wait_ends() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run("s", |ctx| async move {
                if ctx.attempt == 1 {
                    Err("first".into())
                } else {
                    Ok(())
                }
            })
            .retries(Retries::constant(1, Duration::from_secs(3600)))
            .await?;
            step.sleep("nap", "1 day").await?;
            let _: StepEvent<Value> = step.wait_for_event("w", "go").await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = engine
        .workflow::<super::support::FnWorkflow<0>>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    let d = details_when(&instance, |d| {
        d.steps.first().is_some_and(|s| s.retries_at.is_some())
    })
    .await;
    let s = &d.steps[0];
    let failed_at = s.attempts[0].end.unwrap();
    assert_eq!(
        s.retries_at.unwrap().since(failed_at),
        Duration::from_secs(3600)
    );
    assert_eq!(s.until, None, "a step retries; it does not wait");

    let d = details_when(&instance, |d| d.steps.len() == 2).await;
    let nap = &d.steps[1];
    assert_eq!(nap.kind, "sleep");
    assert_eq!(nap.retries_at, None, "a sleep does not retry");
    assert_eq!(
        nap.until.unwrap().since(nap.start),
        Duration::from_secs(86_400)
    );

    let d = details_when(&instance, |d| d.steps.len() == 3).await;
    let wait = &d.steps[2];
    assert_eq!(wait.kind, "waitForEvent");
    assert_eq!(wait.retries_at, None);
    assert_eq!(
        wait.until.unwrap().since(wait.start),
        cairn::DEFAULT_EVENT_TIMEOUT,
        "the wait's timeout"
    );
    let json = serde_json::to_value(&d).unwrap();
    assert!(json["steps"][2]["until"].is_string(), "{json}");
    engine.shutdown().await;
}

/// Step settings and a shared `.config()` combine in any order: a setting made one by one
/// wins over the shared config, before or after it. `.rollback_config()` works before
/// `.rollback()` too. Before, `.config()` after `.retries()` dropped the retries and
/// `.rollback_config()` before `.rollback()` was silently ignored.
#[tokio::test(start_paused = true)]
async fn config_methods_combine_in_any_order() {
    let attempts = Seen::default();
    let handler_calls = Counter::default();
    let (a, h) = (attempts.clone(), handler_calls.clone());
    let (engine, _dir) = engine(move |b| {
        let (a, h) = (a.clone(), h.clone());
        b.register(wf(move |_, step| {
            let (a, h) = (a.clone(), h.clone());
            async move {
                let shared = StepConfig {
                    retries: Some(Retries::none()),
                    timeout: Some(Duration::from_secs(30)),
                    ..StepConfig::default()
                };
                step.run("flaky", |ctx| {
                    a.push((ctx.attempt, ctx.config.timeout));
                    async move {
                        if ctx.attempt < 3 {
                            Err::<u32, _>("not yet".into())
                        } else {
                            Ok(1)
                        }
                    }
                })
                .retries(Retries::constant(5, Duration::from_millis(1)))
                .config(&shared)
                .rollback_config(&StepConfig {
                    retries: Some(Retries::constant(3, Duration::from_millis(1))),
                    ..StepConfig::default()
                })
                .rollback(move |_: Rollback<u32>| {
                    let n = h.bump();
                    async move {
                        if n < 3 {
                            Err("handler not yet".into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .await?;
                Err::<Value, _>("fail to roll back".into())
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let attempts = attempts.all();
    assert_eq!(
        attempts.len(),
        3,
        "the step's own retries won: {attempts:?}"
    );
    assert!(
        attempts.iter().all(|(_, t)| *t == Duration::from_secs(30)),
        "the shared timeout applies: {attempts:?}"
    );
    assert_eq!(
        handler_calls.get(),
        3,
        "the rollback config set first applies"
    );
    assert_eq!(
        instance.status().await.unwrap().rollback.unwrap().outcome,
        "completed"
    );
    engine.shutdown().await;
}
