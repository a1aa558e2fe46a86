//! Every example, tested with `cairn::testing` as a user would test it: a test engine,
//! introspection with mocks where the example talks to the outside world or waits on time,
//! and a run through the fault simulator (`CAIRN_SIM_SEEDS` seeds each; `.ci/run` sets 200).

macro_rules! example {
    ($name:ident, $path:literal) => {
        #[allow(dead_code, missing_docs, unreachable_pub)]
        #[path = $path]
        mod $name;
    };
}

example!(idempotent_charge, "../../examples/idempotent_charge.rs");
example!(granular_steps, "../../examples/granular_steps.rs");
example!(state_from_steps, "../../examples/state_from_steps.rs");
example!(deterministic_names, "../../examples/deterministic_names.rs");
example!(race_in_one_step, "../../examples/race_in_one_step.rs");
example!(conditional_steps, "../../examples/conditional_steps.rs");
example!(batch_create, "../../examples/batch_create.rs");
example!(
    large_data_by_reference,
    "../../examples/large_data_by_reference.rs"
);
example!(
    retry_delay_function,
    "../../examples/retry_delay_function.rs"
);
example!(
    caught_non_retryable,
    "../../examples/caught_non_retryable.rs"
);
example!(sleepy_cats, "../../examples/sleepy_cats.rs");
example!(
    sleep_and_sleep_until,
    "../../examples/sleep_and_sleep_until.rs"
);
example!(approval_flow, "../../examples/approval_flow.rs");
example!(stream_export, "../../examples/stream_export.rs");
example!(bank_transfer, "../../examples/bank_transfer.rs");
example!(order_rollback, "../../examples/order_rollback.rs");
example!(
    bank_transfer_before_rollback,
    "../../examples/bank_transfer_before_rollback.rs"
);

use std::sync::Arc;
use std::time::Duration;

use cairn::testing::{Faults, Simulation, SimulationReport, TestEngine};
use cairn::{CreateOptions, InstanceStatus, Timestamp};
use serde_json::json;

use crate::simulate::seeds;

/// Runs `simulation` over the seeds the environment asks for (`default` otherwise).
async fn simulate(simulation: Simulation, default: u64) -> SimulationReport {
    let n = seeds(default);
    let report = simulation
        .seeds(0..n)
        .run()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.seeds, n);
    eprintln!(
        "{n} seeds: {} faults, {} crashes, {} runs whose interrupted attempts used up a step's retries",
        report.faults,
        report.crashes,
        report.exhausted_by_interruptions.len()
    );
    report
}

// idempotent_charge

#[tokio::test]
async fn idempotent_charge_with_the_kit_retries_a_lost_reply_without_charging_twice() {
    let processor = Arc::new(idempotent_charge::PaymentProcessor::default());
    let p = processor.clone();
    let t = TestEngine::start(move |b| {
        b.register(idempotent_charge::MonthlyCharge {
            processor: p.clone(),
        })
    })
    .await
    .unwrap();
    let step = "charge 42 for its monthly subscription";
    let charge = t
        .introspect::<idempotent_charge::MonthlyCharge>("charge-42")
        .unwrap();
    // The first attempt's reply is lost: the retry must see the charge and not repeat it.
    charge
        .modify()
        .disable_retry_delays()
        .mock_step_error(step, "connection reset", Some(1))
        .unwrap();
    t.workflow::<idempotent_charge::MonthlyCharge>()
        .create(CreateOptions::new(42).id("charge-42"))
        .await
        .unwrap();
    charge
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(
        charge.output::<String>().await.unwrap(),
        "charged (attempt 2)"
    );
}

#[tokio::test]
async fn idempotent_charge_under_the_simulator() {
    simulate(
        Simulation::new::<idempotent_charge::MonthlyCharge>(123_456)
            .unwrap()
            .world(|| {
                let processor = Arc::new(idempotent_charge::PaymentProcessor::default());
                move |b: cairn::EngineBuilder| {
                    b.register(idempotent_charge::MonthlyCharge {
                        processor: processor.clone(),
                    })
                }
            })
            // It returns the attempt that charged.
            .output_depends_on_attempts(),
        25,
    )
    .await;
}

// granular_steps

fn cats(services: Arc<granular_steps::Services>) -> granular_steps::CatWorkflow {
    granular_steps::CatWorkflow { services }
}

#[tokio::test]
async fn granular_steps_with_the_kit_mock_the_image_service() {
    let services = Arc::new(granular_steps::Services::default());
    let s = services.clone();
    let t = TestEngine::start(move |b| b.register(cats(s.clone())))
        .await
        .unwrap();
    let run = t
        .introspect::<granular_steps::CatWorkflow>("cats-1")
        .unwrap();
    run.modify()
        .mock_step_result("fetch cat image from http.cat", "<mocked cat>")
        .unwrap();
    t.workflow::<granular_steps::CatWorkflow>()
        .create(CreateOptions::new(()).id("cats-1"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert_eq!(run.output::<String>().await.unwrap(), "<mocked cat>");
    assert_eq!(
        run.wait_for_step_result::<String>("get cutest cat from KV")
            .await
            .unwrap(),
        "418"
    );
    use std::sync::atomic::Ordering;
    assert_eq!(services.image_fetches.load(Ordering::SeqCst), 0);
    assert_eq!(services.kv_reads.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn granular_steps_under_the_simulator() {
    simulate(
        Simulation::new::<granular_steps::CatWorkflow>(())
            .unwrap()
            .world(|| {
                let services = Arc::new(granular_steps::Services::default());
                move |b: cairn::EngineBuilder| b.register(cats(services.clone()))
            }),
        25,
    )
    .await;
}

// state_from_steps

#[tokio::test]
async fn state_from_steps_with_the_kit_is_rebuilt_after_a_reopen() {
    let mut t = TestEngine::start(|b| b.register(state_from_steps::PickCat { stop_here: None }))
        .await
        .unwrap();
    let pick = t.introspect::<state_from_steps::PickCat>("cats").unwrap();
    pick.modify()
        .mock_step_result("get second cutest cat from KV", "cat-mocked")
        .unwrap();
    t.workflow::<state_from_steps::PickCat>()
        .create(CreateOptions::new(()).id("cats"))
        .await
        .unwrap();
    pick.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    t.reopen().await.unwrap();
    assert_eq!(
        pick.output::<String>().await.unwrap(),
        r#"downloaded cat-mocked of ["cat-1", "cat-mocked"]"#
    );
}

#[tokio::test]
async fn state_from_steps_under_the_simulator() {
    simulate(
        Simulation::new::<state_from_steps::PickCat>(())
            .unwrap()
            .register(|b| b.register(state_from_steps::PickCat { stop_here: None })),
        25,
    )
    .await;
}

// deterministic_names

#[tokio::test]
async fn deterministic_names_with_the_kit_name_each_dynamic_step() {
    let t = TestEngine::start(|b| b.register(deterministic_names::CatList))
        .await
        .unwrap();
    let list = t
        .introspect::<deterministic_names::CatList>("cats")
        .unwrap();
    list.modify()
        .mock_step_result("get cat list from KV", ["nala", "simba"])
        .unwrap();
    t.workflow::<deterministic_names::CatList>()
        .create(CreateOptions::new(()).id("cats"))
        .await
        .unwrap();
    let simba: String = list.wait_for_step_result("get cat: simba").await.unwrap();
    assert_eq!(simba, r#"simba (step "get cat: simba" #1)"#);
    list.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(list.output::<Vec<String>>().await.unwrap().len(), 2);
}

#[tokio::test]
async fn deterministic_names_under_the_simulator() {
    simulate(
        Simulation::new::<deterministic_names::CatList>(())
            .unwrap()
            .register(|b| b.register(deterministic_names::CatList)),
        25,
    )
    .await;
}

// race_in_one_step

#[tokio::test]
async fn race_in_one_step_with_the_kit_keeps_the_winner() {
    let t = TestEngine::start(|b| {
        b.register(race_in_one_step::Race {
            stop_after_race: None,
        })
    })
    .await
    .unwrap();
    let race = t.introspect::<race_in_one_step::Race>("race-1").unwrap();
    t.workflow::<race_in_one_step::Race>()
        .create(CreateOptions::new(()).id("race-1"))
        .await
        .unwrap();
    assert_eq!(
        race.wait_for_step_result::<String>("race step")
            .await
            .unwrap(),
        "second"
    );
    race.wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(
        race.output::<String>().await.unwrap(),
        "the race was won by second"
    );
}

#[tokio::test]
async fn race_in_one_step_under_the_simulator() {
    simulate(
        Simulation::new::<race_in_one_step::Race>(())
            .unwrap()
            .register(|b| {
                b.register(race_in_one_step::Race {
                    stop_after_race: None,
                })
            }),
        25,
    )
    .await;
}

// conditional_steps

fn premium() -> conditional_steps::Params {
    conditional_steps::Params {
        user_type: "premium".into(),
    }
}

#[tokio::test]
async fn conditional_steps_with_the_kit_pin_the_random_decision() {
    let t = TestEngine::start(|b| b.register(conditional_steps::Conditional))
        .await
        .unwrap();
    let all = t
        .introspect_workflow::<conditional_steps::Conditional>()
        .await
        .unwrap();
    all.modify()
        .mock_step_result("decide randomly", true)
        .unwrap();
    let client = t.workflow::<conditional_steps::Conditional>();
    client
        .create(CreateOptions::new(premium()).id("premium"))
        .await
        .unwrap();
    client
        .create(
            CreateOptions::new(conditional_steps::Params {
                user_type: "free".into(),
            })
            .id("free"),
        )
        .await
        .unwrap();
    let runs = all.instances().await.unwrap();
    let mut outputs = Vec::new();
    for run in &runs {
        run.wait_for_status(InstanceStatus::Complete).await.unwrap();
        outputs.push(run.output::<Vec<String>>().await.unwrap());
    }
    assert_eq!(
        outputs,
        [
            vec![
                "send email",
                "premium processing",
                "conditionally do something"
            ],
            vec!["send email", "conditionally do something"],
        ]
    );
}

#[tokio::test]
async fn conditional_steps_under_the_simulator() {
    simulate(
        Simulation::new::<conditional_steps::Conditional>(premium())
            .unwrap()
            .register(|b| b.register(conditional_steps::Conditional))
            // Random in every run: pinned, so runs compare.
            .mock(|m| m.mock_step_result("decide randomly", false).map(|_| ())),
        25,
    )
    .await;
}

// batch_create

fn user(name: &str) -> batch_create::User {
    serde_json::from_value(json!({"name": name})).unwrap()
}

#[tokio::test]
async fn batch_create_with_the_kit_sees_every_instance_of_the_batch() {
    let t = TestEngine::start(|b| b.register(batch_create::Welcome))
        .await
        .unwrap();
    let all = t
        .introspect_workflow::<batch_create::Welcome>()
        .await
        .unwrap();
    t.workflow::<batch_create::Welcome>()
        .create_batch(vec![
            CreateOptions::new(user("ada")).id("user1"),
            CreateOptions::new(user("bob")).id("user2"),
        ])
        .await
        .unwrap();
    let runs = all.instances().await.unwrap();
    assert_eq!(runs.len(), 2);
    for (run, name) in runs.iter().zip(["ada", "bob"]) {
        assert_eq!(
            run.wait_for_step_result::<String>("greet").await.unwrap(),
            format!("Welcome, {name}!")
        );
    }
}

#[tokio::test]
async fn batch_create_under_the_simulator() {
    simulate(
        Simulation::new::<batch_create::Welcome>(user("ada"))
            .unwrap()
            .register(|b| b.register(batch_create::Welcome)),
        25,
    )
    .await;
}

// large_data_by_reference

#[tokio::test]
async fn large_data_by_reference_with_the_kit_mocks_the_stored_reference() {
    let t = TestEngine::start(|b| {
        b.register(large_data_by_reference::LargeData {
            blobs: Arc::default(),
        })
    })
    .await
    .unwrap();
    let run = t
        .introspect::<large_data_by_reference::LargeData>("data")
        .unwrap();
    // The processing step reads the blob the reference names: mocked, it needs none.
    run.modify().mock_step_result("process dataset", 6).unwrap();
    t.workflow::<large_data_by_reference::LargeData>()
        .create(CreateOptions::new(()).id("data"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    let (error, sum): (String, u64) = run.output().await.unwrap();
    assert!(error.contains("output is too large"), "{error}");
    assert_eq!(sum, 6);
}

#[tokio::test]
async fn large_data_by_reference_under_the_simulator() {
    // Each run moves 2.7 MB through a step: a tenth of the seeds.
    simulate(
        Simulation::new::<large_data_by_reference::LargeData>(())
            .unwrap()
            .world(|| {
                let blobs = Arc::new(large_data_by_reference::BlobStore::default());
                move |b: cairn::EngineBuilder| {
                    b.register(large_data_by_reference::LargeData {
                        blobs: blobs.clone(),
                    })
                }
            }),
        (seeds(25) / 10).max(2),
    )
    .await;
}

// retry_delay_function

#[tokio::test]
async fn retry_delay_function_with_the_kit_skips_the_waits() {
    let t = TestEngine::start(|b| {
        b.register(retry_delay_function::SyncCustomer {
            api: Arc::default(),
        })
    })
    .await
    .unwrap();
    let run = t
        .introspect::<retry_delay_function::SyncCustomer>("sync")
        .unwrap();
    run.modify().disable_retry_delays();
    let started = t.clock().now();
    t.workflow::<retry_delay_function::SyncCustomer>()
        .create(CreateOptions::new(()).id("sync"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert_eq!(run.output::<u32>().await.unwrap(), 4);
    assert!(t.clock().now().since(started) < Duration::from_secs(1));
}

#[tokio::test]
async fn retry_delay_function_under_the_simulator() {
    simulate(
        Simulation::new::<retry_delay_function::SyncCustomer>(())
            .unwrap()
            .world(|| {
                let api = Arc::new(retry_delay_function::CustomerApi::default());
                move |b: cairn::EngineBuilder| {
                    b.register(retry_delay_function::SyncCustomer { api: api.clone() })
                }
            })
            // It returns the attempt that succeeded.
            .output_depends_on_attempts(),
        25,
    )
    .await;
}

// caught_non_retryable

#[tokio::test]
async fn caught_non_retryable_with_the_kit_takes_the_other_branch_when_the_task_works() {
    let t = TestEngine::start(|b| b.register(caught_non_retryable::Tolerant))
        .await
        .unwrap();
    let run = t
        .introspect::<caught_non_retryable::Tolerant>("tolerant")
        .unwrap();
    run.modify()
        .mock_step_result("non-retryable-task", ())
        .unwrap();
    t.workflow::<caught_non_retryable::Tolerant>()
        .create(CreateOptions::new(()).id("tolerant"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert_eq!(
        run.output::<Vec<String>>().await.unwrap(),
        ["task done", "next task done"]
    );
}

#[tokio::test]
async fn caught_non_retryable_under_the_simulator() {
    simulate(
        Simulation::new::<caught_non_retryable::Tolerant>(())
            .unwrap()
            .register(|b| b.register(caught_non_retryable::Tolerant)),
        25,
    )
    .await;
}

// sleepy_cats

#[tokio::test]
async fn sleepy_cats_with_the_kit_skip_the_nap() {
    let t = TestEngine::start(|b| b.register(sleepy_cats::SleepyCats))
        .await
        .unwrap();
    let run = t.introspect::<sleepy_cats::SleepyCats>("sleepy").unwrap();
    run.modify().disable_sleeps_of(["💤💤💤💤"]);
    let started = t.clock().now();
    t.workflow::<sleepy_cats::SleepyCats>()
        .create(CreateOptions::new(()).id("sleepy"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert!(t.clock().now().since(started) < Duration::from_secs(60));
    assert!(
        run.output::<String>()
            .await
            .unwrap()
            .starts_with("downloaded cat-")
    );
}

#[tokio::test]
async fn sleepy_cats_under_the_simulator() {
    simulate(
        Simulation::new::<sleepy_cats::SleepyCats>(())
            .unwrap()
            .register(|b| b.register(sleepy_cats::SleepyCats)),
        25,
    )
    .await;
}

// sleep_and_sleep_until

/// Launch day, 10:00 UTC: three hours before the launch.
fn launch_morning() -> Timestamp {
    Timestamp::from_system_time(sleep_and_sleep_until::launch() - Duration::from_secs(3 * 3600))
}

#[tokio::test]
async fn sleep_and_sleep_until_with_the_kit_reach_the_launch_in_no_wall_time() {
    let t = TestEngine::start_at(launch_morning(), |b| {
        b.register(sleep_and_sleep_until::Launch)
    })
    .await
    .unwrap();
    let run = t
        .introspect::<sleep_and_sleep_until::Launch>("launch")
        .unwrap();
    t.workflow::<sleep_and_sleep_until::Launch>()
        .create(CreateOptions::new(()).id("launch"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert!(
        t.clock().now() >= Timestamp::from_system_time(sleep_and_sleep_until::launch()),
        "{}",
        t.clock().now()
    );
}

#[tokio::test]
async fn sleep_and_sleep_until_under_the_simulator() {
    simulate(
        Simulation::new::<sleep_and_sleep_until::Launch>(())
            .unwrap()
            .register(|b| b.register(sleep_and_sleep_until::Launch))
            .start_at(launch_morning())
            // A clock that jumps past the launch before `sleep_until` starts makes it a
            // sleep into the past, an error by design: not a fault this workflow survives.
            .faults(Faults {
                clock_jumps: false,
                ..Faults::default()
            }),
        25,
    )
    .await;
}

// approval_flow

fn expense() -> approval_flow::Expense {
    approval_flow::Expense {
        employee: "ada".into(),
        amount: 4_200,
    }
}

#[tokio::test]
async fn approval_flow_with_the_kit_mocks_the_answer_and_forces_the_timeout() {
    let t = TestEngine::start(|b| b.register(approval_flow::ExpenseApproval))
        .await
        .unwrap();
    let answered = t
        .introspect::<approval_flow::ExpenseApproval>("expense-1")
        .unwrap();
    answered
        .modify()
        .mock_event("approval", json!({"approver": "carol", "approved": true}))
        .unwrap();
    let ignored = t
        .introspect::<approval_flow::ExpenseApproval>("expense-2")
        .unwrap();
    ignored.modify().force_event_timeout("wait for approval");
    let client = t.workflow::<approval_flow::ExpenseApproval>();
    for id in ["expense-1", "expense-2"] {
        client
            .create(CreateOptions::new(expense()).id(id))
            .await
            .unwrap();
    }
    for run in [&answered, &ignored] {
        run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    }
    assert_eq!(
        answered.output::<String>().await.unwrap(),
        "approved by carol"
    );
    assert_eq!(
        ignored.output::<String>().await.unwrap(),
        "escalated: Execution timed out after 86400000ms"
    );
    assert_eq!(
        answered
            .wait_for_step_result::<String>("reimburse")
            .await
            .unwrap(),
        "reimbursed 4200 cents"
    );
}

#[tokio::test]
async fn approval_flow_under_the_simulator_approved() {
    simulate(
        Simulation::new::<approval_flow::ExpenseApproval>(expense())
            .unwrap()
            .register(|b| b.register(approval_flow::ExpenseApproval))
            .event("approval", json!({"approver": "carol", "approved": true}))
            .unwrap(),
        25,
    )
    .await;
}

#[tokio::test]
async fn approval_flow_under_the_simulator_unanswered() {
    simulate(
        Simulation::new::<approval_flow::ExpenseApproval>(expense())
            .unwrap()
            .register(|b| b.register(approval_flow::ExpenseApproval)),
        25,
    )
    .await;
}

// bank_transfer

fn transfer(fail_notify: bool) -> bank_transfer::Transfer {
    bank_transfer::Transfer {
        from: "alice".into(),
        to: "bob".into(),
        amount: 2_500,
        fail_notify,
    }
}

fn banks() -> impl Fn(cairn::EngineBuilder) -> cairn::EngineBuilder + Send + Sync + 'static {
    let (bank_a, bank_b) = (
        bank_transfer::Bank::with("alice", 10_000),
        bank_transfer::Bank::with("bob", 0),
    );
    move |b| {
        b.register(bank_transfer::BankTransfer {
            bank_a: bank_a.clone(),
            bank_b: bank_b.clone(),
        })
    }
}

#[tokio::test]
async fn bank_transfer_with_the_kit_rolls_back_when_the_notification_fails() {
    let (bank_a, bank_b) = (
        bank_transfer::Bank::with("alice", 10_000),
        bank_transfer::Bank::with("bob", 0),
    );
    let (a, b2) = (bank_a.clone(), bank_b.clone());
    let t = TestEngine::start(move |b| {
        b.register(bank_transfer::BankTransfer {
            bank_a: a.clone(),
            bank_b: b2.clone(),
        })
    })
    .await
    .unwrap();
    let run = t
        .introspect::<bank_transfer::BankTransfer>("transfer")
        .unwrap();
    // The mail server fails every attempt: the transfer fails and is compensated.
    run.modify()
        .disable_retry_delays()
        .mock_step_error("notify", "mail server down", None)
        .unwrap();
    t.workflow::<bank_transfer::BankTransfer>()
        .create(CreateOptions::new(transfer(false)).id("transfer"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Errored).await.unwrap();
    assert_eq!(run.error().await.unwrap().message, "mail server down");
    assert_eq!(
        (bank_a.balance("alice"), bank_b.balance("bob")),
        (10_000, 0)
    );
    let status = run.instance().status().await.unwrap();
    assert_eq!(status.rollback.unwrap().outcome, "completed");
}

#[tokio::test]
async fn bank_transfer_under_the_simulator() {
    simulate(
        Simulation::new::<bank_transfer::BankTransfer>(transfer(false))
            .unwrap()
            .world(banks),
        25,
    )
    .await;
}

#[tokio::test]
async fn bank_transfer_rollback_under_the_simulator() {
    simulate(
        Simulation::new::<bank_transfer::BankTransfer>(transfer(true))
            .unwrap()
            .world(banks),
        25,
    )
    .await;
}

// order_rollback

#[tokio::test]
async fn order_rollback_with_the_kit_completes_when_the_charge_is_mocked() {
    let inventory = order_rollback::Inventory::with("book", 3);
    let i = inventory.clone();
    let t = TestEngine::start(move |b| {
        b.register(order_rollback::OrderWorkflow {
            inventory: i.clone(),
        })
    })
    .await
    .unwrap();
    let run = t
        .introspect::<order_rollback::OrderWorkflow>("order-1")
        .unwrap();
    run.modify().mock_step_result("charge card", ()).unwrap();
    t.workflow::<order_rollback::OrderWorkflow>()
        .create(CreateOptions::new("book".to_string()).id("order-1"))
        .await
        .unwrap();
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert_eq!(inventory.stock("book"), 2, "reserved, and kept");
}

#[tokio::test]
async fn order_rollback_under_the_simulator() {
    simulate(
        Simulation::new::<order_rollback::OrderWorkflow>("book".to_string())
            .unwrap()
            .world(|| {
                let inventory = order_rollback::Inventory::with("book", 3);
                move |b: cairn::EngineBuilder| {
                    b.register(order_rollback::OrderWorkflow {
                        inventory: inventory.clone(),
                    })
                }
            }),
        25,
    )
    .await;
}

// bank_transfer_before_rollback

#[tokio::test]
async fn bank_transfer_before_rollback_with_the_kit_moves_the_money_when_notify_works() {
    let ledger = Arc::new(bank_transfer_before_rollback::Ledger {
        balances: std::sync::Mutex::new((10_000, 0)),
    });
    let l = ledger.clone();
    let t = TestEngine::start(move |b| {
        b.register(bank_transfer_before_rollback::ManualTransfer { ledger: l.clone() })
    })
    .await
    .unwrap();
    let all = t
        .introspect_workflow::<bank_transfer_before_rollback::ManualTransfer>()
        .await
        .unwrap();
    all.modify().mock_step_result("notify", ()).unwrap();
    t.workflow::<bank_transfer_before_rollback::ManualTransfer>()
        .create(CreateOptions::new(2_500))
        .await
        .unwrap();
    let runs = all.instances().await.unwrap();
    runs[0]
        .wait_for_status(InstanceStatus::Complete)
        .await
        .unwrap();
    assert_eq!(*ledger.balances.lock().unwrap(), (7_500, 2_500));
}

#[tokio::test]
async fn bank_transfer_before_rollback_under_the_simulator() {
    simulate(
        Simulation::new::<bank_transfer_before_rollback::ManualTransfer>(2_500)
            .unwrap()
            .world(|| {
                let ledger = Arc::new(bank_transfer_before_rollback::Ledger {
                    balances: std::sync::Mutex::new((10_000, 0)),
                });
                move |b: cairn::EngineBuilder| {
                    b.register(bank_transfer_before_rollback::ManualTransfer {
                        ledger: ledger.clone(),
                    })
                }
            }),
        25,
    )
    .await;
}

// stream_export

#[tokio::test]
async fn stream_export_with_the_kit_mocks_the_export_stream() {
    let t = TestEngine::start(|b| b.register(stream_export::StreamExport))
        .await
        .unwrap();
    let run = t
        .introspect::<stream_export::StreamExport>("export")
        .unwrap();
    run.modify()
        .mock_stream_result("export orders", "1,a,1.00\n2,b,2.00\n")
        .unwrap();
    t.workflow::<stream_export::StreamExport>()
        .create(CreateOptions::new(1_000_000).id("export"))
        .await
        .unwrap();
    let stored = run.wait_for_step_stream("export orders").await.unwrap();
    assert_eq!(stored.len(), 18);
    run.wait_for_status(InstanceStatus::Complete).await.unwrap();
    assert_eq!(
        run.output::<stream_export::Uploaded>().await.unwrap(),
        stream_export::Uploaded { rows: 2, bytes: 18 }
    );
}

#[tokio::test]
async fn stream_export_under_the_simulator() {
    // 20,000 rows: about 500 KB, two chunks and a part, through every fault.
    simulate(
        Simulation::new::<stream_export::StreamExport>(20_000)
            .unwrap()
            .register(|b| b.register(stream_export::StreamExport)),
        25,
    )
    .await;
}

#[test]
fn every_example_has_a_kit_test() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let this = include_str!("examples_kit.rs");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name();
        let stem = name.to_string_lossy().trim_end_matches(".rs").to_owned();
        assert!(
            this.contains(&format!("async fn {stem}_with_the_kit"))
                && this.contains(&format!("async fn {stem}_under_the_simulator")),
            "example {stem} has no kit test or no simulation in examples_kit.rs"
        );
    }
}
