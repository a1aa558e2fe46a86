//! Saga rollbacks (SPEC §4): compensation handlers declared on `step.run`, run one at a time
//! in reverse step-start order when an instance is about to fail (or is terminated with
//! rollback), each as a durable rollback step with its own retries.

use std::collections::HashMap;
use std::sync::Arc;

use cairn_core::{ErrorInfo, LogKind, ResolvedConfig, StepKey, StepKind, StepRecord, StepState};
use serde_json::json;

use crate::context::{StepContext, StepId};
use crate::failure::WorkflowError;
use crate::lifetime::Lifetime;
use crate::ops::attempt::{Execution, LogKinds};
use crate::ops::handler::{Handler, Handlers, RollbackInput};

/// What triggered a rollback; persisted so a crash in the middle resumes it.
pub use cairn_core::RollbackStatus;

/// What triggered a rollback (stored with the instance).
pub(crate) type Trigger = cairn_core::RollbackTrigger;

const ROLLBACK_KINDS: LogKinds = LogKinds {
    step_start: LogKind::RollbackStepStart,
    attempt_start: LogKind::RollbackAttemptStart,
    attempt_success: LogKind::RollbackAttemptSuccess,
    attempt_failure: LogKind::RollbackAttemptFailure,
    step_success: LogKind::RollbackStepSuccess,
    step_failure: LogKind::RollbackStepFailure,
};

/// Runs the rollback of every eligible step, in reverse start order, stopping at the first
/// handler that finally fails. `journal` is the instance's current journal. The first time
/// (`trigger.started` unset) `ROLLBACK_START` and the trigger are recorded, so a crash in
/// the middle resumes the rollback. Returns `None` when no step is eligible.
pub(crate) async fn roll_back(
    state: &Arc<Lifetime>,
    handlers: &Handlers,
    trigger: &Trigger,
    journal: Vec<StepRecord>,
) -> Option<RollbackStatus> {
    let done: HashMap<(String, u32), StepRecord> = journal
        .iter()
        .filter(|r| r.key.kind == StepKind::Rollback)
        .map(|r| ((r.key.name.clone(), r.key.count), r.clone()))
        .collect();
    // The first op the replay reached and found unfinished: it stopped there (its outcome
    // is unknown). Unreached ones do not count: ops of parallel branches the run never got
    // back to may have run their bodies.
    let first_unfinished = journal
        .iter()
        .filter(|r| r.key.kind != StepKind::Rollback && r.state == StepState::Running)
        .filter(|r| !state.unreached(&r.key))
        .map(|r| r.seq)
        .min();
    let mut eligible: Vec<StepRecord> = journal
        .into_iter()
        .filter(|r| r.key.kind == StepKind::Run && r.has_rollback)
        .collect();
    eligible.sort_by_key(|r| std::cmp::Reverse(r.seq));
    if eligible.is_empty() {
        return None;
    }
    let total = eligible.len();
    state.enter_rollback_phase();
    if !trigger.started {
        let started = Trigger {
            started: true,
            ..trigger.clone()
        };
        state
            .commit(vec![
                cairn_store::Write::RollbackTrigger(started),
                state.log(
                    LogKind::RollbackStart,
                    None,
                    json!({ "triggerError": trigger.error, "totalSteps": total }),
                ),
            ])
            .await;
    }
    let mut completed = 0;
    for forward in eligible {
        let key = StepKey {
            kind: StepKind::Rollback,
            name: forward.key.name.clone(),
            count: forward.key.count,
        };
        match done
            .get(&(key.name.clone(), key.count))
            .map(|r| (r.state, r.error.clone()))
        {
            Some((StepState::Succeeded, _)) => {
                completed += 1;
                continue;
            }
            Some((StepState::Failed, error)) => {
                // A handler already failed finally: the chain stopped there.
                let error = error.unwrap_or_else(|| ErrorInfo::new("Error", "rollback failed"));
                return Some(finish(state, total, completed, Some(error)));
            }
            _ => {}
        }
        let result = match handlers.get(&forward.key) {
            Some(handler) => run_handler(state, trigger, &forward, key, handler).await,
            None if never_ran(state, &forward, first_unfinished) => {
                tracing::debug!(step = %forward.key.target(), "nothing to compensate: its start landed, its body never ran");
                completed += 1;
                continue;
            }
            None => missing(state, &forward, key).await,
        };
        match result {
            Ok(()) => completed += 1,
            Err(e) => return Some(finish(state, total, completed, Some(e.into_info()))),
        }
    }
    Some(finish(state, total, completed, None))
}

/// Whether `forward`, whose handler the replay did not register, started but never ran its
/// body: it is unfinished, the replay never reached it, and stopped at an op started before
/// it that is unfinished too. That op's success, if it had one, did not land (a commit that failed
/// alone, while this one's start landed: an attempt's start does not wait), and a step's
/// body runs only once what came before it has landed. So there is nothing to undo, and
/// the replay, which stops at the earlier op, cannot reach this one's handler. (A handler
/// missing for another reason, code that no longer declares it, still fails the rollback.)
fn never_ran(state: &Lifetime, forward: &StepRecord, first_unfinished: Option<u32>) -> bool {
    forward.state == StepState::Running
        && first_unfinished.is_some_and(|seq| seq < forward.seq)
        && state.unreached(&forward.key)
}

/// Ends the rollback. Its `ROLLBACK_COMPLETE`/`ROLLBACK_FAILED` record rides with the
/// lifetime's next commit, the one that ends the instance: recorded apart, a crash between
/// the two made the next lifetime run the (finished) rollback again and log its end twice.
/// The rollback's future returns in the same poll that defers it (keep it so: no await
/// after this), so the driver's flush of deferred writes (`engine/driver.rs`, on a pending
/// phase) cannot commit it apart from the end.
fn finish(
    state: &Lifetime,
    total: usize,
    completed: usize,
    error: Option<ErrorInfo>,
) -> RollbackStatus {
    let kind = if error.is_some() {
        LogKind::RollbackFailed
    } else {
        LogKind::RollbackComplete
    };
    state.defer(vec![state.log(
        kind,
        None,
        json!({ "totalSteps": total, "completedSteps": completed }),
    )]);
    RollbackStatus {
        outcome: if error.is_some() {
            "failed"
        } else {
            "completed"
        }
        .into(),
        error,
    }
}

/// The forward step's context, as its handler sees it.
fn forward_context(state: &Lifetime, forward: &StepRecord) -> StepContext {
    let config = ResolvedConfig::from_persisted_json(&forward.config).unwrap_or_default();
    StepContext::new(
        StepId {
            name: forward.key.name.clone(),
            count: forward.key.count,
        },
        forward.attempts,
        config,
        state.idempotency_prefix(),
    )
}

async fn run_handler(
    state: &Arc<Lifetime>,
    trigger: &Trigger,
    forward: &StepRecord,
    key: StepKey,
    handler: Handler,
) -> Result<(), WorkflowError> {
    let ctx = forward_context(state, forward);
    let output = (forward.state == StepState::Succeeded)
        .then(|| forward.output.clone())
        .flatten();
    let step_name = forward.key.target();
    let error = trigger.error.clone();
    let call = handler.call.clone();
    let body = move |_attempt: StepContext| {
        (call)(RollbackInput {
            error: error.clone(),
            output: output.clone(),
            ctx: ctx.clone(),
            step_name: step_name.clone(),
        })
    };
    let mut run = Execution::new(Arc::clone(state), handler.config);
    run.execute_with(key, body, &ROLLBACK_KINDS).await
}

/// A handler that replay no longer reaches: the rollback of that step fails.
async fn missing(
    state: &Lifetime,
    forward: &StepRecord,
    key: StepKey,
) -> Result<(), WorkflowError> {
    let error = ErrorInfo::new(
        "RollbackMissing",
        "Rollback function not available in registry",
    );
    let now = state.now();
    let record = StepRecord {
        key: key.clone(),
        seq: state.next_seq(),
        state: StepState::Failed,
        config: forward.config.clone(),
        attempts: 0,
        in_flight: false,
        wake_at: None,
        output: None,
        error: Some(error.clone()),
        started_at: now,
        ended_at: Some(now),
        has_rollback: false,
    };
    state
        .commit(vec![
            state.log(
                LogKind::RollbackStepFailure,
                Some(&key),
                json!({ "error": error }),
            ),
            cairn_store::Write::Step(record),
        ])
        .await;
    Err(WorkflowError::from_info(error))
}
