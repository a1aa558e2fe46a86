//! Runs one claimed instance: replays `run` against its journal until it returns, then
//! records the outcome. A lifetime whose writes fail is dropped whole and, if the store was
//! merely unavailable, replayed again after a pause.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{ErrorInfo, InstanceStatus, LogKind};
use cairn_store::{Claimed, StatusChange, Write};
use futures::FutureExt;
use serde_json::json;

use crate::engine::EngineInner;
use crate::failure::{ERROR, INTERNAL};
use crate::replay::{Abort, RunState};
use crate::step::WorkflowStep;
use crate::workflow::WorkflowEvent;

pub(crate) async fn drive(inner: Arc<EngineInner>, claimed: Claimed) {
    let mut pause = Duration::from_millis(100);
    loop {
        match run_lifetime(&inner, &claimed).await {
            Ok(()) => break,
            Err(Abort::Store(cairn_store::Error::Unavailable(e))) => {
                tracing::warn!(instance = %claimed.record.id, error = %e, "store unavailable; replaying later");
                inner.shared.clock.sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
            Err(Abort::Store(e)) => {
                // Lease lost, instance deleted or unreadable: this engine is done with it.
                tracing::debug!(instance = %claimed.record.id, error = %e, "stopped running instance");
                break;
            }
        }
    }
    inner.changed();
    inner.wake.notify_one();
}

async fn run_lifetime(inner: &Arc<EngineInner>, claimed: &Claimed) -> Result<(), Abort> {
    let record = &claimed.record;
    let shared = &inner.shared;
    let Some(workflow) = inner.workflows.get(&record.workflow).cloned() else {
        return Ok(());
    };
    let journal = shared
        .store
        .journal(record.instance)
        .await
        .map_err(Abort::Store)?;
    let state = Arc::new(RunState::new(
        Arc::clone(shared),
        claimed.lease,
        record.workflow.clone(),
        record.id.clone(),
        record.created_at,
        journal,
    ));
    if record.status != InstanceStatus::Running {
        let now = shared.clock.now();
        let mut writes = vec![Write::Status(StatusChange {
            started_at: Some(now),
            ..StatusChange::to(InstanceStatus::Running)
        })];
        if record.status == InstanceStatus::Queued {
            writes.push(state.log(LogKind::WorkflowStart, None, json!({})));
        }
        shared
            .store
            .commit(claimed.lease, writes)
            .await
            .map_err(Abort::Store)?;
        inner.changed();
    }

    let params = match serde_json::from_str(&record.params) {
        Ok(p) => p,
        Err(e) => {
            let error = ErrorInfo::new(INTERNAL, format!("the stored params are not JSON: {e}"));
            return finish(&state, Err(error)).await;
        }
    };
    let event = WorkflowEvent {
        payload: params,
        timestamp: record.created_at,
        instance_id: record.id.clone(),
        workflow_name: record.workflow.clone(),
    };
    let step = WorkflowStep {
        run: Arc::clone(&state),
    };
    let mut shutdown = inner.shutdown.subscribe();
    let run = AssertUnwindSafe(workflow.run(event, step)).catch_unwind();
    let result = tokio::select! {
        result = run => result,
        abort = state.aborted() => return Err(abort),
        _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
    };
    let outcome = match result {
        Ok(Ok(output)) => {
            let json = output.to_string();
            let limit = shared.limits.payload_limit;
            if json.len() > limit {
                Err(ErrorInfo::new(
                    INTERNAL,
                    format!(
                        "The workflow's output is too large: {} bytes; the limit is {limit} bytes.",
                        json.len()
                    ),
                ))
            } else {
                Ok(output)
            }
        }
        Ok(Err(error)) => Err(error.into_info()),
        Err(panic) => Err(ErrorInfo::new(
            ERROR,
            format!("the workflow panicked: {}", panic_message(&*panic)),
        )),
    };
    finish(&state, outcome).await
}

async fn finish(
    state: &RunState,
    outcome: Result<serde_json::Value, ErrorInfo>,
) -> Result<(), Abort> {
    let now = state.now();
    let writes = match outcome {
        Ok(output) => vec![
            Write::Status(StatusChange {
                ended_at: Some(now),
                output: Some(output.to_string()),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            }),
            state.log(LogKind::WorkflowSuccess, None, json!({ "result": output })),
        ],
        Err(error) => vec![
            Write::Status(StatusChange {
                ended_at: Some(now),
                error: Some(error.clone()),
                release: true,
                ..StatusChange::to(InstanceStatus::Errored)
            }),
            state.log(LogKind::WorkflowFailure, None, json!({ "error": error })),
        ],
    };
    state
        .shared
        .store
        .commit(state.lease, writes)
        .await
        .map_err(Abort::Store)
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
