//! Parents and children (`step.invoke`): the management requests that reach from a parent
//! to its children, and what happens to the one when the other ends.
//!
//! The store keeps the link (`ParentLink`) and wakes a hibernated parent in the transaction
//! that ends a child; everything here is the policy above it:
//! - a child still running when its parent ends (completes, errors, is terminated or
//!   deleted) is terminated, unless it was started detached; terminating a parent *with
//!   rollback* terminates its children with rollback too, so their compensations run;
//! - a child that finds its parent ended or gone when it is claimed terminates itself,
//!   which covers a crash between the parent's end and the cascade.
//!
//! Restarting a parent needs nothing here: its new run's `invoke` finds each child started
//! before the step's new record and restarts it (`ops/invoke.rs`), so a crash in between
//! cannot leave a stale outcome behind.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::{InstanceId, InstanceStatus, WorkflowName};
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
            ControlRequest::Terminate { .. } | ControlRequest::Delete
        );
        let before = if reaches_children {
            store.instance(workflow, id).await?
        } else {
            None
        };
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
                // Not from this answer: another caller's pause or resume, landed just
                // before or after this one, may be told first or last. A read begun once
                // this one is told (`Lifetime::learn_control`) is newer than both. On a
                // task of its own: told even if this request's caller stops waiting.
                if let Some(state) = live {
                    let pause = matches!(request, ControlRequest::Pause { .. });
                    let telling =
                        tokio::spawn(async move { state.learn_control(Some(pause)).await });
                    let _ = telling.await;
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
            // Read after the transition, which fenced the parent's lifetime off: a child its
            // last commit created is among them. The transition is done whatever happens
            // next: a store error here is tried again, not the caller's to see.
            cascade_or_retry(inner, instance, epoch, cascade).await;
        }
        Ok(outcome)
    })
}

/// How many times a cascade that met a store error is tried again, the first after
/// [`CASCADE_RETRY`], doubling (about two minutes in all).
const CASCADE_TRIES: u32 = 10;
const CASCADE_RETRY: Duration = Duration::from_millis(100);

/// Ends the children of `parent`'s run that ended at lease epoch `epoch` with `request`
/// (see [`end_children`]); when a store call fails, tries the whole cascade again in the
/// background, backing off, until it goes through, [`CASCADE_TRIES`] have failed, or the
/// engine shuts down. Each try reads the children afresh, and leaves alone a child the
/// parent's later run has adopted meanwhile (restarted), as one detached or being
/// compensated.
///
/// Why: a child its parent's end does not reach runs on as if its parent still waited for
/// it. One that hibernates finds out when it is next claimed (`orphaned`), and on
/// PostgreSQL one running on finds out at its next lease renewal (the store leaves its
/// lease be); on SQLite a child that never hibernates (one long step) had nothing else to
/// tell it, and ran to its end.
async fn cascade_or_retry(
    inner: &Arc<Runtime>,
    parent: InstanceRef,
    epoch: u64,
    request: ControlRequest,
) {
    if cascade(inner, parent, epoch, &request).await.is_ok() {
        return;
    }
    let inner = Arc::clone(inner);
    tokio::spawn(async move {
        let mut shutdown = inner.shutdown.subscribe();
        let mut pause = CASCADE_RETRY;
        for _ in 0..CASCADE_TRIES {
            tokio::select! {
                () = inner.env.clock.sleep(pause) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            if cascade(&inner, parent, epoch, &request).await.is_ok() {
                return;
            }
            pause = (pause * 2).min(Duration::from_secs(30));
        }
        // Each child finds out at its next claim (or, on PostgreSQL, lease renewal).
        tracing::error!(
            parent = parent.0,
            "gave up ending the children of an instance that ended"
        );
    });
}

/// One try of a cascade: `Err` when a store call failed (each failure is logged).
async fn cascade(
    inner: &Arc<Runtime>,
    parent: InstanceRef,
    epoch: u64,
    request: &ControlRequest,
) -> Result<(), ()> {
    let children = inner.env.store.children(parent).await.map_err(|e| {
        tracing::warn!(error = %e, "could not read the children of an instance that ended");
    })?;
    end_children(inner, &children, epoch, request).await
}

/// Ends the children in `children` that are still running, not detached, and started by
/// the parent's run at lease epoch `epoch` or before: one a later run of the parent adopted
/// (after a restart) is that run's. One that is already being rolled back (terminated with
/// rollback) is left to end by itself: a plain terminate would cut its compensation short.
/// `Err` when the store failed one of them (the others are ended all the same).
async fn end_children(
    inner: &Arc<Runtime>,
    children: &[InstanceRecord],
    epoch: u64,
    request: &ControlRequest,
) -> Result<(), ()> {
    let mut failed = false;
    for child in children {
        if child.status.is_terminal()
            || child.rollback_trigger.is_some()
            || child
                .parent
                .as_ref()
                .is_some_and(|p| p.detached || p.run.is_some_and(|run| run > epoch))
        {
            continue;
        }
        if let Err(e) = control(inner, &child.workflow, &child.id, request.clone()).await {
            tracing::warn!(workflow = %child.workflow, instance = %child.id, error = %e, "could not end a child with its parent");
            failed = true;
        }
    }
    if failed { Err(()) } else { Ok(()) }
}

/// After an instance's end is committed: a parent in memory learns that its child ended
/// (the store woke it if it hibernates), and children still running end with it.
pub(crate) async fn ended(
    inner: &Arc<Runtime>,
    lease: cairn_store::Lease,
    status: InstanceStatus,
    parent: Option<&ParentLink>,
    invoked: bool,
) {
    if let Some(parent) = parent {
        inner.event_sent(parent.instance);
    }
    if !invoked {
        return;
    }
    // A parent that failed, or was terminated with rollback (the only termination that
    // ends in a driver), compensated its own steps: its children compensate theirs (a
    // child asked already is left alone by the store). One that completed ends the rest
    // plainly.
    let rollback = matches!(status, InstanceStatus::Errored | InstanceStatus::Terminated)
        .then(cairn_core::RollbackTrigger::terminate);
    let request = ControlRequest::Terminate {
        at: inner.env.clock.now(),
        rollback,
    };
    cascade_or_retry(inner, lease.instance, lease.epoch, request).await;
}

/// How a child whose parent has ended (or is gone) ends, found as it is claimed: the
/// cascade from its parent did not reach it (the engine stopped after the parent's end
/// committed, or the store failed). `None` when it may run on: not a child, detached,
/// already being compensated, or its parent still running. A child an operator restarted
/// after its parent ended was detached by that restart (the store decides it in the
/// restart's transaction, from the parent's row), so no time written by another engine's
/// clock is compared here. A store error is the caller's: its driver backs off and looks
/// again, rather than run the child's body (on PostgreSQL, a lease renewal would stop it
/// again, and each such round would cost an interrupted attempt).
pub(crate) async fn orphaned(
    inner: &Runtime,
    record: &InstanceRecord,
) -> Result<Option<ControlRequest>, cairn_store::Error> {
    let Some(link) = record.parent.as_ref().filter(|p| !p.detached) else {
        return Ok(None);
    };
    if record.rollback_trigger.is_some() {
        // Being compensated: it ends by itself when its rollback is done.
        return Ok(None);
    }
    // A link stored before runs were recorded may predate that rule: such a child
    // (re)started after its parent ended was restarted on purpose.
    let legacy_start = link
        .run
        .is_none()
        .then(|| record.started_at.unwrap_or(record.created_at));
    let parent = inner.env.store.instance(&link.workflow, &link.id).await?;
    // The same end the cascade gives: with rollback after a parent that failed or was
    // terminated with rollback (it compensated its own steps: `ended`), plainly after one
    // that completed, was terminated plainly, or is gone (deleted: `control`).
    let rollback = match parent {
        Some(parent) if parent.instance == link.instance => {
            let ended = parent.status.is_terminal()
                && legacy_start
                    .is_none_or(|started| parent.ended_at.is_none_or(|end| end >= started));
            if !ended {
                return Ok(None);
            }
            (parent.status == InstanceStatus::Errored || parent.rollback_trigger.is_some())
                .then(cairn_core::RollbackTrigger::terminate)
        }
        _ => None,
    };
    Ok(Some(ControlRequest::Terminate {
        at: inner.env.clock.now(),
        rollback,
    }))
}
