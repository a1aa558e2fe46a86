//! Property: for random plans of sequential and parallel steps, with and without rollback
//! handlers, failing at a random point, the handlers that run are exactly those of the
//! steps that started, in reverse start order. The seed is printed; rerun a failure with
//! `CAIRN_TEST_SEED=<seed>`.

use super::support::{FnWorkflow, Rng, Seen, wf};
use cairn::InstanceStatus;
use cairn::prelude::*;
use serde_json::{Value, json};

/// One step of a plan: its name, whether it has a handler, whether it fails.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlanStep {
    name: String,
    handler: bool,
    fails: bool,
}

/// A plan: groups run one after another; the steps of a group run in parallel.
type Plan = Vec<Vec<PlanStep>>;

fn random_plan(rng: &mut Rng) -> Plan {
    let groups = 1 + rng.below(5);
    let mut n = 0;
    let mut plan: Plan = (0..groups)
        .map(|_| {
            (0..1 + rng.below(3))
                .map(|_| {
                    n += 1;
                    PlanStep {
                        name: format!("s{n}"),
                        handler: rng.below(3) > 0,
                        fails: false,
                    }
                })
                .collect()
        })
        .collect();
    // Fail one step at random, or none (then the workflow fails after its last step).
    let total: usize = plan.iter().map(Vec::len).sum();
    let pick = rng.below(total as u64 + 1) as usize;
    if let Some(step) = plan.iter_mut().flatten().nth(pick) {
        step.fails = true;
    }
    plan
}

fn interpreter(calls: Seen<String>) -> FnWorkflow {
    wf(move |event, step| {
        let calls = calls.clone();
        async move {
            let plan: Plan = serde_json::from_value(event.payload)?;
            for group in plan {
                let ops = group.into_iter().map(|s| {
                    let fails = s.fails;
                    let op = step.run(s.name.clone(), move |_| async move {
                        if fails {
                            Err(NonRetryableError::new("planned failure").into())
                        } else {
                            Ok(1u32)
                        }
                    });
                    if s.handler {
                        let calls = calls.clone();
                        op.rollback(move |rb: Rollback<u32>| {
                            let calls = calls.clone();
                            async move {
                                calls.push(rb.ctx.step.name.clone());
                                Ok(())
                            }
                        })
                    } else {
                        op
                    }
                });
                // Every step of the group runs to its end; then the first error escapes.
                for result in futures::future::join_all(ops).await {
                    result?;
                }
            }
            Err::<Value, _>("planned failure after the last step".into())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn handlers_run_for_exactly_the_started_steps_in_reverse_start_order() {
    let seed = super::support::test_seed("rollback property");
    let mut rng = Rng(seed);
    let calls = Seen::<String>::default();
    let (engine, _dir) = super::support::engine(|b| b.register(interpreter(calls.clone()))).await;
    let client = engine.workflow::<FnWorkflow>();
    for case in 0..40 {
        let plan = random_plan(&mut rng);
        let before = calls.all().len();
        let instance = client
            .create(
                CreateOptions::new(serde_json::to_value(&plan).unwrap()).id(format!("case-{case}")),
            )
            .await
            .unwrap();
        let status = instance.wait().await.unwrap();
        assert_eq!(
            status.status,
            InstanceStatus::Errored,
            "case {case}: {plan:?}"
        );
        // The steps that started, in start order: the journal's order (`seq`, assigned
        // when each op first starts). Log ids follow commit order, which for concurrent
        // starts may differ.
        let started: Vec<String> = instance
            .details()
            .await
            .unwrap()
            .steps
            .into_iter()
            .filter(|s| s.kind == "step")
            .map(|s| s.name)
            .collect();
        // Started = every step of every group up to and including the failing one.
        let mut expected_started = Vec::new();
        for group in &plan {
            expected_started.extend(group.iter().map(|s| s.name.clone()));
            if group.iter().any(|s| s.fails) {
                break;
            }
        }
        let mut sorted_started = started.clone();
        sorted_started.sort();
        expected_started.sort();
        assert_eq!(sorted_started, expected_started, "case {case}: {plan:?}");
        let with_handler: std::collections::HashSet<&str> = plan
            .iter()
            .flatten()
            .filter(|s| s.handler)
            .map(|s| s.name.as_str())
            .collect();
        let expected: Vec<String> = started
            .iter()
            .rev()
            .filter(|n| with_handler.contains(n.as_str()))
            .cloned()
            .collect();
        let ran = calls.all()[before..].to_vec();
        assert_eq!(ran, expected, "case {case}: {plan:?}");
        let rollback = status.rollback;
        assert_eq!(
            rollback.map(|r| r.outcome),
            (!expected.is_empty()).then(|| "completed".to_string())
        );
    }
    engine.shutdown().await;
}

#[test]
fn plans_cover_the_interesting_shapes() {
    // The generator makes parallel groups, handler-less steps and both failure kinds.
    let mut rng = Rng(42);
    let plans: Vec<Plan> = (0..200).map(|_| random_plan(&mut rng)).collect();
    assert!(plans.iter().any(|p| p.iter().any(|g| g.len() > 1)));
    assert!(plans.iter().any(|p| p.iter().flatten().any(|s| !s.handler)));
    assert!(plans.iter().any(|p| p.iter().flatten().all(|s| !s.fails)));
    assert!(
        plans
            .iter()
            .any(|p| p.iter().any(|g| g.len() > 1 && g.iter().any(|s| s.fails)))
    );
    let _ = json!(null);
}
