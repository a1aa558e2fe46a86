//! Each seed example, run as a test: the examples' own `demo` functions on a temporary
//! database with the virtual clock, with their outcomes asserted.

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

use cairn::{Clock, InstanceStatus};

fn builder() -> (tempfile::TempDir, cairn::EngineBuilder) {
    let (dir, path) = super::support::temp_db();
    (dir, super::support::builder_at(&path))
}

#[tokio::test(start_paused = true)]
async fn idempotent_charge_charges_once_despite_a_lost_reply() {
    let (_dir, b) = builder();
    let (output, charged) = idempotent_charge::demo(b).await.unwrap();
    assert_eq!(output, "already charged (attempt 2)");
    assert_eq!(charged, 1);
}

#[tokio::test(start_paused = true)]
async fn granular_steps_retry_independently() {
    let (_dir, b) = builder();
    let (output, kv, images) = granular_steps::demo(b).await.unwrap();
    assert_eq!(output, "<image of cat 418>");
    assert_eq!((kv, images), (1, 3));
}

#[tokio::test(start_paused = true)]
async fn state_from_steps_is_rebuilt_after_a_restart() {
    let (_dir, path) = super::support::temp_db();
    let output = state_from_steps::demo(&path, Clock::virtual_now())
        .await
        .unwrap();
    assert_eq!(output, r#"downloaded cat-2 of ["cat-1", "cat-2"]"#);
}

#[tokio::test(start_paused = true)]
async fn deterministic_names_come_from_a_step_output() {
    let (_dir, b) = builder();
    let names = deterministic_names::demo(b).await.unwrap();
    assert_eq!(
        names,
        [
            "get cat list from KV",
            "get cat: tom",
            "get cat: felix",
            "get cat: garfield"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_race_inside_one_step_keeps_its_winner_across_a_restart() {
    let (_dir, path) = super::support::temp_db();
    let output = race_in_one_step::demo(&path, Clock::virtual_now())
        .await
        .unwrap();
    assert_eq!(output, "the race was won by second");
}

#[tokio::test(start_paused = true)]
async fn conditions_on_step_outputs_and_payload() {
    let (_dir, b) = builder();
    let outputs = conditional_steps::demo(b).await.unwrap();
    assert_eq!(outputs[0][..2], ["send email", "premium processing"]);
    assert_eq!(outputs[1][0], "send email");
    assert!(!outputs[1].contains(&"premium processing".to_string()));
}

#[tokio::test(start_paused = true)]
async fn batch_create_is_idempotent() {
    let (_dir, b) = builder();
    let (created, again) = batch_create::demo(b).await.unwrap();
    assert_eq!(created, ["user1", "user2", "user3", "user4"]);
    assert!(again.is_empty());
}

#[tokio::test(start_paused = true)]
async fn large_data_goes_by_reference() {
    let (_dir, b) = builder();
    let (error, sum) = large_data_by_reference::demo(b).await.unwrap();
    assert!(error.contains("output is too large"), "{error}");
    assert_eq!(sum, (0..400_000u64).sum::<u64>());
}

#[tokio::test(start_paused = true)]
async fn the_delay_function_decides_each_wait() {
    let (_dir, b) = builder();
    let delays = retry_delay_function::demo(b).await.unwrap();
    assert_eq!(delays, [30_000, 120_000, 40_000]);
}

#[tokio::test(start_paused = true)]
async fn a_caught_non_retryable_error_lets_the_workflow_continue() {
    let (_dir, b) = builder();
    let (log, status) = caught_non_retryable::demo(b).await.unwrap();
    assert_eq!(
        log,
        [
            "task done",
            "Step failed: oh no",
            "cleaned up",
            "next task done"
        ]
    );
    assert_eq!(status, InstanceStatus::Complete);
}

#[tokio::test(start_paused = true)]
async fn sleepy_cats_hibernate_through_three_hours_and_keep_their_list() {
    let (_dir, b) = builder();
    let (status, in_memory, output) = sleepy_cats::demo(b).await.unwrap();
    assert_eq!(status, InstanceStatus::Waiting);
    assert_eq!(in_memory, 0);
    assert!(
        output.starts_with("downloaded cat-") && output.ends_with(r#"from ["cat-1", "cat-2"]"#),
        "{output}"
    );
}

#[tokio::test(start_paused = true)]
async fn sleep_then_sleep_until_the_launch() {
    let (_dir, path) = super::support::temp_db();
    let ends = sleep_and_sleep_until::demo(&path).await.unwrap();
    let rfc: Vec<String> = ends.iter().map(|t| t.to_rfc3339()).collect();
    assert_eq!(
        rfc,
        ["2024-10-24T11:00:00.000Z", "2024-10-24T13:00:00.000Z"]
    );
}

#[tokio::test(start_paused = true)]
async fn approval_flow_approves_one_and_escalates_the_other() {
    let (_dir, b) = builder();
    let outputs = approval_flow::demo(b).await.unwrap();
    assert_eq!(
        outputs,
        [
            "approved by carol",
            "escalated: Execution timed out after 86400000ms"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_bank_transfer_restores_both_balances() {
    let (_dir, b) = builder();
    let (balances, outcome) = bank_transfer::demo(b).await.unwrap();
    assert_eq!(
        balances,
        [(7_500, 2_500), (7_500, 2_500)],
        "the failed transfer left no trace"
    );
    assert_eq!(outcome, "completed");
}

#[tokio::test(start_paused = true)]
async fn a_rejected_charge_releases_the_reservation() {
    let (_dir, b) = builder();
    let (before, after, status, error, rollback) = order_rollback::demo(b).await.unwrap();
    assert_eq!((before, after), (3, 3));
    assert_eq!(status, InstanceStatus::Errored);
    assert_eq!(
        error,
        "NonRetryableError: payment processor rejected the charge"
    );
    assert_eq!(rollback, "completed");
}

#[tokio::test(start_paused = true)]
async fn the_hand_written_undo_reaches_the_same_balances() {
    let (_dir, b) = builder();
    assert_eq!(
        bank_transfer_before_rollback::demo(b).await.unwrap(),
        (10_000, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_export_goes_by_stream_and_is_read_back_whole() {
    let (_dir, b) = builder();
    let (output, stored) = stream_export::demo(b).await.unwrap();
    assert_eq!(output.rows, 200_000);
    assert_eq!(output.bytes, stored);
    assert!(stored > 5_000_000, "{stored}");
}
