//! Parents and children (`step.invoke`): the management requests that reach from a parent
//! to its children, and what happens to the one when the other ends.
//!
//! The store keeps the link (`ParentLink`) and wakes a hibernated parent in the transaction
//! that ends a child; everything here is the policy above it:
//! - a child still running when its parent ends (completes, errors, is terminated or
//!   deleted) is terminated, unless it was started detached; terminating a parent *with
//!   rollback* terminates its children with rollback too, so their compensations run;
//! - restarting a parent restarts the children of the steps that run again (first, so the
//!   parent's new run finds them restarted, not their old outcome);
//! - a child that finds its parent ended or gone when it is claimed terminates itself,
//!   which covers a crash between the parent's end and the cascade.

use std::collections::HashSet;
use std::sync::Arc;

use cairn_core::{InstanceId, InstanceStatus, StepKey, WorkflowName};
use cairn_store::{ControlOutcome, ControlRequest, InstanceRecord, InstanceRef, ParentLink};
use futures::future::BoxFuture;

use crate::engine::runtime::Runtime;

/// Applies a management request to an instance, stops or nudges its lifetime in memory,
/// and carries the request on to its children (see the module's policy).
pub(crate) fn control<'a>(
    inner: &'a Arc<Runtime>,
    workflow: &'a WorkflowName,
    id: &'a InstanceId,
    request: ControlRequest,
) -> BoxFuture<'a, Result<ControlOutcome, cairn_store::Error>> {
    Box::pin(async move {
        let store = &inner.env.store;
        let reaches_children = matches!(
            request,
            ControlRequest::Terminate { .. }
                | ControlRequest::Restart { .. }
                | ControlRequest::Delete
        );
        let before = if reaches_children {
            store.instance(workflow, id).await?
        } else {
            None
        };
        let children = match &before {
            Some(record) => store.children(record.instance).await?,
            None => Vec::new(),
        };
        if let (ControlRequest::Restart { from, .. }, Some(record)) = (&request, &before)
            && !children.is_empty()
        {
            restart_children(inner, record, from.as_ref(), &children).await?;
        }
        let outcome = store.control(workflow, id, request.clone()).await?;
        let ControlOutcome::Done {
            instance,
            to,
            epoch,
            ..
        } = outcome
        else {
            return Ok(outcome);
        };
        // Only a lifetime that predates the transition: the scheduler may already have
        // claimed the instance again (after a restart) and started a new one.
        let live = inner.live.fenced_by(instance, epoch);
        match request {
            ControlRequest::Pause { .. } | ControlRequest::Resume { .. } => {
                if let Some(state) = live {
                    state.observe(to);
                }
            }
            ControlRequest::Terminate { .. }
            | ControlRequest::Restart { .. }
            | ControlRequest::Delete => {
                if let Some(state) = live {
                    state.abort(crate::lifetime::Abort::Stopped);
                }
            }
        }
        match request {
            _ if to == InstanceStatus::Terminated => {
                crate::telemetry::finished(inner.env.seen(), workflow, to, None);
            }
            ControlRequest::Restart { .. } => {
                crate::telemetry::restarted(inner.env.seen(), workflow);
            }
            _ => {}
        }
        inner.env.wake.notify_one();
        inner.status_changed(instance);
        let ended = to == InstanceStatus::Terminated
            || matches!(request, ControlRequest::Delete) && !to.is_terminal();
        if ended && let Some(parent) = before.as_ref().and_then(|r| r.parent.as_ref()) {
            // The store woke the parent if it hibernates; one in memory learns it here.
            inner.event_sent(parent.instance);
        }
        let cascade = match request {
            ControlRequest::Terminate { at, rollback } => {
                Some(ControlRequest::Terminate { at, rollback })
            }
            ControlRequest::Delete => Some(ControlRequest::Terminate {
                at: inner.env.clock.now(),
                rollback: None,
            }),
            _ => None,
        };
        if let Some(cascade) = cascade {
            end_children(inner, &children, cascade).await;
        }
        Ok(outcome)
    })
}

/// Ends the children in `children` that are still running and not detached. One that is
/// already being rolled back (terminated with rollback) is left to end by itself: a plain
/// terminate would cut its compensation short.
async fn end_children(inner: &Arc<Runtime>, children: &[InstanceRecord], request: ControlRequest) {
    for child in children {
        if child.status.is_terminal()
            || child.rollback_trigger.is_some()
            || child.parent.as_ref().is_some_and(|p| p.detached)
        {
            continue;
        }
        if let Err(e) = control(inner, &child.workflow, &child.id, request.clone()).await {
            // Its next claim finds the parent ended and terminates it (`orphaned`).
            tracing::warn!(workflow = %child.workflow, instance = %child.id, error = %e, "could not end a child with its parent");
        }
    }
}

/// Restarts the children of the steps a restart of their parent runs again: all of them,
/// or (restarting from a step) those of that step and of every step started after it.
async fn restart_children(
    inner: &Arc<Runtime>,
    parent: &InstanceRecord,
    from: Option<&StepKey>,
    children: &[InstanceRecord],
) -> Result<(), cairn_store::Error> {
    let again: Option<HashSet<StepKey>> = match from {
        None => None,
        Some(from) => {
            let mut journal = inner.env.store.journal(parent.instance).await?;
            journal.sort_by_key(|s| s.seq);
            let first = journal
                .iter()
                .filter(|s| s.key.kind == from.kind && s.key.name == from.name)
                .nth(from.count.max(1) as usize - 1)
                .map(|s| s.seq);
            let Some(first) = first else {
                // The store answers "no such step"; nothing to restart.
                return Ok(());
            };
            Some(
                journal
                    .into_iter()
                    .filter(|s| s.seq >= first)
                    .map(|s| s.key)
                    .collect(),
            )
        }
    };
    for child in children {
        let Some(link) = &child.parent else { continue };
        if again
            .as_ref()
            .is_some_and(|keys| !keys.contains(&link.step))
        {
            continue;
        }
        let request = ControlRequest::Restart {
            at: inner.env.clock.now(),
            from: None,
        };
        control(inner, &child.workflow, &child.id, request).await?;
    }
    Ok(())
}

/// After an instance's end is committed: a parent in memory learns that its child ended
/// (the store woke it if it hibernates), and children still running end with it.
pub(crate) async fn ended(
    inner: &Arc<Runtime>,
    instance: InstanceRef,
    parent: Option<&ParentLink>,
    invoked: bool,
) {
    if let Some(parent) = parent {
        inner.event_sent(parent.instance);
    }
    if !invoked {
        return;
    }
    match inner.env.store.children(instance).await {
        Ok(children) => {
            let request = ControlRequest::Terminate {
                at: inner.env.clock.now(),
                rollback: None,
            };
            end_children(inner, &children, request).await;
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read the children of an instance that ended");
        }
    }
}

/// Whether `record` is a child (not detached) whose parent has ended or is gone: it must
/// not run on. Store errors answer `false`; the next claim looks again.
pub(crate) async fn orphaned(inner: &Runtime, record: &InstanceRecord) -> bool {
    let Some(link) = record.parent.as_ref().filter(|p| !p.detached) else {
        return false;
    };
    if record.rollback_trigger.is_some() {
        // Being compensated: it ends by itself when its rollback is done.
        return false;
    }
    match inner.env.store.instance(&link.workflow, &link.id).await {
        Ok(Some(parent)) => parent.instance != link.instance || parent.status.is_terminal(),
        Ok(None) => true,
        Err(_) => false,
    }
}
