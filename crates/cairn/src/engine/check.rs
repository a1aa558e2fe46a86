//! The replay check: replays an unfinished instance's journal against the workflow code
//! registered now, without running a step body and without writing, and says in words
//! where the code no longer fits the journal (`Engine::replay_check`).
//!
//! It runs `run` in the same registration mode a rollback uses to rebuild its handlers
//! (`Lifetime::start_registering`): every op answers from the journal and an op with no
//! record parks, so the replay stops where new work would start. The lifetime records what
//! it saw (`lifetime::Seen`): the records taken, the ops reached without a record, the
//! stored outcomes that no longer decode. What is left of the journal afterwards was not
//! reached.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{StepKey, StepKind};
use cairn_store::{InstanceRecord, Lease};

use crate::engine::runtime::Runtime;
use crate::lifetime::Lifetime;
use crate::ops::WorkflowStep;
use crate::workflow::WorkflowEvent;

/// What the replay check found in one instance.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ReplayFindings {
    /// The workflow.
    pub workflow: String,
    /// The instance.
    pub id: String,
    /// Each place where the code no longer fits the journal, in words.
    pub problems: Vec<String>,
}

/// The replay check of every unfinished instance (`Engine::replay_check`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// How many instances were replayed.
    pub checked: usize,
    /// Those whose journal the code no longer fits; empty when the code is compatible.
    pub incompatible: Vec<ReplayFindings>,
}

impl ReplayReport {
    /// Whether every instance replays against the code.
    pub fn compatible(&self) -> bool {
        self.incompatible.is_empty()
    }
}

/// How long a replay may sit with nothing new created or taken before it counts as stopped
/// where new work would start (an await that is not an op may sit in between). Instances
/// are checked several at a time, so this bounds the wall time of a check, not its sum.
const QUIET: Duration = Duration::from_millis(100);

/// [`QUIET`] for a replay on a worker.
const REMOTE_QUIET: Duration = Duration::from_secs(2);

/// How long the check of a worker's instance waits for a free slot on a worker.
const PLACE_WITHIN: Duration = Duration::from_secs(30);

/// Replays `record`'s journal against the registered code; the problems, in words.
pub(crate) async fn check(
    inner: &Arc<Runtime>,
    record: &InstanceRecord,
) -> Result<Vec<String>, cairn_store::Error> {
    // A worker's ops come over the network: give its replay longer to make the next.
    let mut quiet = QUIET;
    let workflow: Arc<dyn crate::workflow::ErasedWorkflow> = match inner
        .workflows
        .get(&record.workflow)
    {
        Some(workflow) => Arc::clone(workflow),
        None if inner.env.remote.knows(&record.workflow) => {
            // A worker's workflow: replayed on a worker of the instance's version, in
            // check mode (`docs/worker-protocol.md`).
            let version = record.version.as_deref();
            let placed =
                tokio::time::timeout(PLACE_WITHIN, inner.workers.place(&record.workflow, version))
                    .await;
            match placed {
                Ok(Some((slot, version))) => {
                    quiet = REMOTE_QUIET;
                    Arc::new(crate::engine::workers::run::RemoteRun::new(slot, version))
                }
                _ => {
                    return Ok(vec![format!(
                        "runs on workers (version {}): no worker of it is connected to this engine to replay it",
                        version.unwrap_or("any")
                    )]);
                }
            }
        }
        None => {
            return Ok(vec![format!(
                "workflow {} is not registered with this engine",
                record.workflow
            )]);
        }
    };
    let journal = inner.env.store.journal(record.instance).await?;
    let by_key: HashMap<StepKey, bool> = journal
        .iter()
        .map(|r| (r.key.clone(), r.has_rollback))
        .collect();
    let state = Arc::new(Lifetime::new(
        Arc::clone(&inner.env),
        // Never used to write: in registration mode no op commits.
        Lease {
            instance: record.instance,
            epoch: 0,
        },
        inner.env.clock.now(),
        record.workflow.clone(),
        record.id.clone(),
        record.created_at,
    ));
    state.load_journal(journal);
    state.start_checking();
    let params: serde_json::Value = match serde_json::from_str(&record.params) {
        Ok(p) => p,
        Err(e) => return Ok(vec![format!("the stored params are not JSON: {e}")]),
    };
    if let Err(reason) = workflow.check_params(&params) {
        return Ok(vec![format!(
            "the stored params no longer decode as the workflow's params: {reason}"
        )]);
    }
    let event = WorkflowEvent {
        payload: params,
        timestamp: record.created_at,
        instance_id: record.id.clone(),
        workflow_name: record.workflow.clone(),
    };
    let handlers = Arc::new(crate::ops::handler::Handlers::default());
    let step = WorkflowStep {
        lifetime: Arc::clone(&state),
        handlers: Arc::clone(&handlers),
    };
    let current = (record.workflow.clone(), record.id.clone());
    let mut replay = std::pin::pin!(
        crate::lifetime::CURRENT
            .scope(current, crate::panic::guarded(|| workflow.run(event, step)))
    );
    let mut problems = Vec::new();
    // Until `run` returns, or every op is parked (where new work would start) and nothing
    // moves for a while (an await that is not an op may sit in between).
    let mut progress = usize::MAX;
    loop {
        tokio::select! {
            biased;
            outcome = replay.as_mut() => {
                if let Err(panic) = outcome {
                    problems.push(format!(
                        "the workflow panicked while replaying: {}",
                        crate::panic::message(&*panic)
                    ));
                }
                break;
            }
            () = tokio::time::sleep(quiet) => {
                let now = state.progress();
                if now == progress {
                    break;
                }
                progress = now;
            }
        }
    }
    let (seen, untaken) = state.take_seen();
    for (key, message) in &seen.mismatches {
        problems.push(format!("{} {}: {message}", label(key.kind), quoted(key)));
    }
    let mut untaken: Vec<_> = untaken
        .into_iter()
        .filter(|r| r.key.kind != StepKind::Rollback)
        .collect();
    untaken.sort_by_key(|r| r.seq);
    if let (Some(first_new), false) = (seen.new_work.first(), untaken.is_empty()) {
        problems.push(format!(
            "the replay stops at {} {}, which has no record (new work), while the journal has steps after it",
            label(first_new.kind),
            quoted(first_new)
        ));
    }
    for rec in &untaken {
        let now = seen
            .new_work
            .iter()
            .find(|k| k.name == rec.key.name && k.count == rec.key.count && k.kind != rec.key.kind);
        problems.push(match now {
            Some(k) => format!(
                "{} was a {} and is now a {}: the journal's outcome does not apply",
                quoted(&rec.key),
                label(rec.key.kind),
                label(k.kind)
            ),
            None => format!(
                "{} {} is in the journal, but the code no longer reaches it (renamed, removed, or moved behind a step that has not run yet)",
                label(rec.key.kind),
                quoted(&rec.key)
            ),
        });
    }
    for (key, _) in &seen.taken {
        if key.kind == StepKind::Run
            && by_key.get(key).copied().unwrap_or(false)
            && handlers.get(key).is_none()
        {
            problems.push(format!(
                "step {} declared a rollback handler when it ran; the code no longer declares one, so it would not be compensated",
                quoted(key)
            ));
        }
    }
    Ok(problems)
}

fn label(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Run => "step",
        StepKind::Sleep => "sleep",
        StepKind::WaitForEvent => "wait for event",
        StepKind::Rollback => "rollback",
        StepKind::Invoke => "invoke",
    }
}

fn quoted(key: &StepKey) -> String {
    if key.count > 1 {
        format!("\"{}\" #{}", key.name, key.count)
    } else {
        format!("\"{}\"", key.name)
    }
}
