//! `step.invoke`: start a child workflow instance and wait, durably, for its outcome.
//!
//! The child is created in the same commit that journals the step (`CHILD_START`), under
//! the parent's lease, with an id derived from the parent and the step: a crash before that
//! commit leaves neither, one after it leaves both, and every replay finds the same child.
//! The wait then reads the child's row: ended → the outcome is journaled in the parent
//! (`CHILD_COMPLETE` or `CHILD_FAILURE`) and returned on every replay, even after the child
//! is purged; still running → a durable wait that lets the parent hibernate. The store wakes
//! a hibernated parent in the transaction that ends the child, and a hibernation checks
//! the children it waits for in its own transaction, so an end is never missed.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cairn_core::{
    ErrorInfo, InstanceId, InstanceStatus, LogEntry, LogKind, StepKey, StepKind, StepRecord,
    StepState, WorkflowName,
};
use cairn_store::{ControlRequest, InstanceRecord, NewInstance, ParentLink, Write};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::Instrument;

use crate::failure::{CHILD_DELETED, CHILD_TERMINATED, ERROR, INTERNAL, WorkflowError};
use crate::lifetime::{Lifetime, Wait};
use crate::ops::WorkflowStep;
use crate::ops::sleep::MAX_SLEEP;

type Started<T> = BoxFuture<'static, Result<T, WorkflowError>>;
type Start<T> = Box<dyn FnOnce(bool) -> Started<T> + Send>;

/// A `step.invoke` op: awaiting it starts the child (once) and returns its output, or its
/// end as the step's error. Made by [`WorkflowStep::invoke`].
///
/// # Cancel safety
/// Dropping it loses nothing and stops nothing: the child, once created, runs on (and is
/// ended with the parent unless detached); a later replay of the same step finds it.
#[must_use = "an invoke does nothing unless awaited"]
pub struct InvokeOp<T> {
    detached: bool,
    start: Option<Start<T>>,
    running: Option<Started<T>>,
    _output: PhantomData<fn() -> T>,
}

impl<T> InvokeOp<T> {
    /// Lets the child outlive this instance: by default a child still running when its
    /// parent ends (completes, errors, is terminated or deleted) is terminated with it.
    /// A detached child is left to finish on its own. Decided when the child is created;
    /// a replay keeps what the first run decided.
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }
}

impl<T> Future for InvokeOp<T> {
    type Output = Result<T, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _engine = crate::panic::EngineCode::enter();
        let this = self.get_mut();
        if let Some(start) = this.start.take() {
            this.running = Some(start(this.detached));
        }
        match this.running.as_mut() {
            Some(running) => running.as_mut().poll(cx),
            None => Poll::Ready(Err(WorkflowError::new(
                INTERNAL,
                "invoke polled after completion",
            ))),
        }
    }
}

/// What to start: the child's workflow and its params as JSON (or why they are not).
pub(crate) struct Child {
    pub(crate) workflow: String,
    pub(crate) params: Result<String, String>,
}

impl WorkflowStep {
    /// The erased form of [`WorkflowStep::invoke`], which names the child's workflow type.
    pub(crate) fn invoke_child<T>(&self, name: String, child: Child) -> InvokeOp<T>
    where
        T: DeserializeOwned + Send + 'static,
    {
        let state = Arc::clone(&self.lifetime);
        let key = self.lifetime.claim(StepKind::Invoke, name);
        InvokeOp {
            detached: false,
            start: Some(Box::new(move |detached| {
                Box::pin(async move {
                    let key = key?;
                    state.pause_gate().await;
                    let result = invoke(Arc::clone(&state), &key, child, detached).await;
                    state.pause_gate().await;
                    let output = result?;
                    // `T`'s Deserialize impl is user code.
                    crate::panic::from_json(&output).map_err(|e| {
                        let error = WorkflowError::new(
                            INTERNAL,
                            format!(
                                "the output of the child of invoke \"{}\" does not decode as the child's output type: {e}",
                                key.target()
                            ),
                        );
                        if state.registering() {
                            state.note_mismatch(&key, error.message().to_owned());
                        }
                        error
                    })
                })
            })),
            running: None,
            _output: PhantomData,
        }
    }
}

/// The child's id: readable (the parent's id, the step's name and count) and unique (a
/// hash of the parent's store reference, which is never reused, and the step), cut to the
/// 100 characters an id may have.
pub(crate) fn child_id(parent: &Lifetime, key: &StepKey) -> InstanceId {
    let hash = fnv1a(&format!(
        "{}/{}/{}/{}",
        parent.lease.instance.0, parent.workflow, key.name, key.count
    ));
    let slug: String = key
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let tail = format!("-{slug}-{}-{hash:08x}", key.count);
    let room = cairn_core::MAX_INSTANCE_ID_LEN.saturating_sub(tail.len());
    let head: String = parent.instance_id.as_str().chars().take(room).collect();
    InstanceId::new(format!("{head}{tail}"))
        .or_else(|_| InstanceId::new(format!("c{tail}")))
        .unwrap_or_else(|_| InstanceId::new(format!("c-{hash:08x}")).expect("a valid id"))
}

/// FNV-1a, folded to 32 bits: stable across builds (the id must not change on upgrade).
fn fnv1a(text: &str) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash ^ (hash >> 32)) as u32
}

/// What the step's journal entry records about its child, and the run of the step (the
/// parent's lease epoch when it was journaled), which the child's link names too.
fn config(workflow: &WorkflowName, id: &InstanceId, detached: bool, run: u64) -> serde_json::Value {
    json!({ "workflow": workflow, "id": id, "detached": detached, "run": run })
}

fn child_of(record: &StepRecord) -> Option<(WorkflowName, InstanceId)> {
    let workflow = record.config.get("workflow")?.as_str()?;
    let id = record.config.get("id")?.as_str()?;
    Some((WorkflowName::new(workflow).ok()?, InstanceId::new(id).ok()?))
}

fn answer(record: StepRecord) -> Result<String, WorkflowError> {
    match record.state {
        StepState::Succeeded => Ok(record.output.unwrap_or_else(|| "null".into())),
        _ => {
            Err(WorkflowError::from_info(record.error.unwrap_or_else(
                || ErrorInfo::new(ERROR, "the child failed"),
            )))
        }
    }
}

/// Runs the op: the child's output as JSON text, or the step's error.
async fn invoke(
    state: Arc<Lifetime>,
    key: &StepKey,
    child: Child,
    detached: bool,
) -> Result<String, WorkflowError> {
    if state.registering() {
        // Replaying only to register rollback handlers: a finished invoke answers from the
        // journal; anything else starts nothing and never returns.
        return match state.take_record(key) {
            Some(rec) if rec.state != StepState::Running => answer(rec),
            Some(_) => std::future::pending().await,
            None => {
                state.note_new_work(key);
                std::future::pending().await
            }
        };
    }
    let mut activity = state.activity();
    let mut record = match state.take_record(key) {
        Some(rec) if rec.state != StepState::Running => return answer(rec),
        Some(rec) => rec,
        None => start(&state, key, child, detached).await?,
    };
    let Some((workflow, id)) = child_of(&record) else {
        return Err(WorkflowError::new(
            INTERNAL,
            format!(
                "invoke \"{}\" has no child in its journal entry",
                key.target()
            ),
        ));
    };
    state.set_invoked();
    let span = tracing::info_span!(
        "step.invoke",
        step.name = %key.name,
        step.count = key.count,
        child.workflow = %workflow,
        child.id = %id,
        outcome = tracing::field::Empty,
    );
    async {
        loop {
            // Listen before looking, so an end announced in between is not missed.
            let ended = state.events.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let found = match state.env.store.instance(&workflow, &id).await {
                Ok(found) => found,
                Err(e) => {
                    state.abort(crate::lifetime::Abort::Store(e));
                    return std::future::pending().await;
                }
            };
            if let Some(c) = found
                .as_ref()
                .filter(|c| is_child(c, &state, key) && stale(c, &record))
            {
                // Started by an earlier run of this step (the parent was restarted since):
                // its outcome is not this run's. Run it again as this run's, then wait.
                let request = ControlRequest::Restart {
                    at: state.now(),
                    from: None,
                    adopt: Some(cairn_store::Adopt {
                        parent: state.lease,
                        run: run_of(&record).unwrap_or(state.lease.epoch),
                        detached: record.config["detached"].as_bool().unwrap_or(false),
                    }),
                };
                if let Err(e) = state.env.store.control(&c.workflow, &c.id, request).await {
                    state.abort(crate::lifetime::Abort::Store(e));
                    return std::future::pending().await;
                }
                state.env.wake.notify_one();
                continue;
            }
            let outcome = match &found {
                Some(c) if !is_child(c, &state, key) => Some(Err(ErrorInfo::new(
                    ERROR,
                    format!(
                        "invoke \"{}\": instance {id} of workflow {workflow} already exists and was not started by this step",
                        key.target()
                    ),
                ))),
                Some(c) => ended_with(c),
                None => Some(Err(ErrorInfo::new(
                    CHILD_DELETED,
                    format!("child {workflow}/{id} was deleted before it finished"),
                ))),
            };
            if let Some(outcome) = outcome {
                let span = tracing::Span::current();
                span.record("outcome", if outcome.is_ok() { "complete" } else { "failed" });
                return record_outcome(&state, &mut record, &workflow, &id, outcome).await;
            }
            let child = found.map(|c| c.instance);
            // No timer of its own: look again a year on, which keeps hibernation's wake-up
            // finite; the child's end wakes the parent long before.
            let wake_at = state.now().saturating_add(MAX_SLEEP);
            activity
                .wait_on(
                    Wait {
                        wake_at,
                        event_type: None,
                        child,
                    },
                    ended,
                )
                .await;
        }
    }
    .instrument(span)
    .await
}

/// Whether `found` is the child this step started (and not an instance someone else
/// created under the same id).
fn is_child(found: &InstanceRecord, state: &Lifetime, key: &StepKey) -> bool {
    found
        .parent
        .as_ref()
        .is_some_and(|p| p.instance == state.lease.instance && &p.step == key)
}

/// Whether `child` belongs to an earlier run of this step (the run before a restart of the
/// parent), by identity: the run its link names is not the step's. Never by comparing
/// times, which different engines' clocks wrote (one behind would make the parent restart
/// the child it is waiting for, or one an operator restarted).
///
/// Only a journal entry from before runs were recorded falls back to times: such a child
/// started before the entry's run if its (re)start is older than the entry.
fn stale(child: &InstanceRecord, record: &StepRecord) -> bool {
    match run_of(record) {
        Some(run) => child.parent.as_ref().and_then(|p| p.run) != Some(run),
        None => child.started_at.unwrap_or(child.created_at) < record.started_at,
    }
}

/// The run of an `invoke` step's journal entry (see [`config`]).
fn run_of(record: &StepRecord) -> Option<u64> {
    record.config.get("run").and_then(serde_json::Value::as_u64)
}

/// The child's outcome once it has ended: its output, or the step's error.
fn ended_with(child: &InstanceRecord) -> Option<Result<String, ErrorInfo>> {
    let name = format!("{}/{}", child.workflow, child.id);
    match child.status {
        InstanceStatus::Complete => Some(Ok(child.output.clone().unwrap_or_else(|| "null".into()))),
        InstanceStatus::Errored => {
            let error = child
                .error
                .clone()
                .unwrap_or_else(|| ErrorInfo::new(ERROR, "errored"));
            Some(Err(ErrorInfo::new(
                error.name,
                format!("child {name} errored: {}", error.message),
            )))
        }
        InstanceStatus::Terminated => Some(Err(ErrorInfo::new(
            CHILD_TERMINATED,
            format!("child {name} was terminated"),
        ))),
        _ => None,
    }
}

/// Journals the step and creates the child, in one commit.
async fn start(
    state: &Arc<Lifetime>,
    key: &StepKey,
    child: Child,
    detached: bool,
) -> Result<StepRecord, WorkflowError> {
    let now = state.now();
    let mut record = StepRecord {
        key: key.clone(),
        seq: state.next_seq(),
        state: StepState::Running,
        config: json!({ "workflow": &child.workflow, "detached": detached }).into(),
        attempts: 1,
        in_flight: false,
        wake_at: None,
        output: None,
        error: None,
        started_at: now,
        ended_at: None,
        has_rollback: false,
    };
    let (workflow, target, params) = match checked(state, child) {
        Ok(checked) => checked,
        Err(reason) => {
            // Recorded like any outcome, so that every replay (on any engine, whatever it
            // registers) answers the same.
            let error = ErrorInfo::new(ERROR, format!("invoke \"{}\": {reason}", key.target()));
            record.state = StepState::Failed;
            record.error = Some(error.clone());
            record.ended_at = Some(now);
            let workflow = record.config["workflow"].clone();
            state
                .commit(vec![
                    state.log(
                        LogKind::ChildFailure,
                        Some(key),
                        json!({ "workflow": workflow, "error": error }),
                    ),
                    Write::Step(record),
                ])
                .await;
            return Err(WorkflowError::from_info(error));
        }
    };
    let id = child_id(state, key);
    let run = state.lease.epoch;
    record.config = config(&workflow, &id, detached, run).into();
    let params_value = cairn_core::binary::log_view(&params);
    let new = NewInstance {
        workflow: workflow.clone(),
        id: id.clone(),
        params,
        created_at: now,
        queued: LogEntry {
            kind: LogKind::WorkflowQueued,
            at: now,
            step: None,
            meta: json!({
                "params": params_value,
                "trigger": {
                    "source": "parent",
                    "workflow": state.workflow,
                    "id": state.instance_id,
                    "step": key.name,
                    "count": key.count,
                },
            }),
        },
        retention: target.retention,
        parent: Some(ParentLink {
            instance: state.lease.instance,
            workflow: state.workflow.clone(),
            id: state.instance_id.clone(),
            step: key.clone(),
            detached,
            run: Some(run),
        }),
        priority: 0,
        concurrency: None,
        version: target.version,
    };
    state
        .commit(vec![
            state.log(
                LogKind::ChildStart,
                Some(key),
                json!({ "workflow": workflow, "id": id, "detached": detached }),
            ),
            Write::Step(record.clone()),
            Write::Create(Box::new(new)),
        ])
        .await;
    // The child is claimable now; the scheduler may be asleep with nothing else to do.
    state.env.wake.notify_one();
    Ok(record)
}

/// The child's workflow (registered with this engine, or run by workers), where its
/// instance goes and its params, or why it cannot be started.
fn checked(
    state: &Lifetime,
    child: Child,
) -> Result<(WorkflowName, crate::env::Target, String), String> {
    let workflow = WorkflowName::new(child.workflow).map_err(|e| e.to_string())?;
    let Some(target) = state.env.target(&workflow) else {
        return Err(format!(
            "workflow {workflow} is not registered with this engine"
        ));
    };
    let params = child
        .params
        .map_err(|e| format!("the child's params do not serialise: {e}"))?;
    let limit = state.env.limits.payload_limit;
    let size = cairn_core::binary::size(&params);
    if size > limit {
        return Err(format!(
            "the child's params are {size} bytes; the limit is {limit} bytes"
        ));
    }
    Ok((workflow, target, params))
}

/// Journals the child's outcome in the parent and returns it.
async fn record_outcome(
    state: &Lifetime,
    record: &mut StepRecord,
    workflow: &WorkflowName,
    id: &InstanceId,
    outcome: Result<String, ErrorInfo>,
) -> Result<String, WorkflowError> {
    record.ended_at = Some(state.now());
    record.wake_at = None;
    let key = record.key.clone();
    let log = match &outcome {
        Ok(output) => {
            record.state = StepState::Succeeded;
            record.output = Some(output.clone());
            let value = cairn_core::binary::view(output);
            state.log(
                LogKind::ChildComplete,
                Some(&key),
                json!({ "workflow": workflow, "id": id, "output": value }),
            )
        }
        Err(error) => {
            record.state = StepState::Failed;
            record.error = Some(error.clone());
            state.log(
                LogKind::ChildFailure,
                Some(&key),
                json!({ "workflow": workflow, "id": id, "error": error }),
            )
        }
    };
    state.commit(vec![log, Write::Step(record.clone())]).await;
    outcome.map_err(WorkflowError::from_info)
}
