//! Runs one claimed instance: replays `run` against its journal until it returns, then
//! records the outcome. A lifetime whose writes fail is dropped whole and, if the store was
//! merely unavailable, replayed again after a pause.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use cairn_core::{
    ErrorInfo, InstanceStatus, LogEntry, LogKind, StepKey, StepKind, StepState, Timestamp,
};
use cairn_store::{Claimed, InstanceRecord, Lease, StatusChange, Write};
use serde_json::json;
use tracing::Instrument;

use crate::engine::runtime::Runtime;
use crate::failure::{ERROR, INTERNAL};
use crate::lifetime::{Abort, Hibernation, Lifetime};
use crate::ops::WorkflowStep;
use crate::ops::rollback::{RollbackStatus, Trigger};
use crate::workflow::WorkflowEvent;

/// How long an instance whose lifetime panicked in engine code waits before it is claimed
/// again: long enough not to spin on a deterministic bug, short enough to recover from a
/// passing one.
const PANIC_RETRY: Duration = Duration::from_secs(5);

/// The longest wait after repeated engine panics of one instance (the wait doubles from
/// [`PANIC_RETRY`] with each panic in a row): a deterministic bug costs a retry an hour.
const PANIC_RETRY_MAX: Duration = Duration::from_secs(3600);

/// How long a rollback-registration replay may sit with every op parked and no handler
/// newly registered before it is given up (see `one_lifetime`).
const REGISTRATION_GRACE: Duration = Duration::from_secs(1);

/// The waits between tries while the store is unavailable: 100 ms, doubling up to 30 s.
struct Outage {
    pause: Duration,
}

impl Default for Outage {
    fn default() -> Self {
        Outage {
            pause: Duration::from_millis(100),
        }
    }
}

impl Outage {
    /// How long to wait before the next try.
    fn next(&mut self) -> Duration {
        let pause = self.pause;
        self.pause = (pause * 2).min(Duration::from_secs(30));
        pause
    }
}

/// Runs a claimed instance; `claimed_at` is the time the claim counted its lease from.
/// An instance of a worker's workflow comes with its place among the workers' free slots,
/// held until it is placed on one.
pub(crate) async fn drive(
    inner: Arc<Runtime>,
    claimed: Claimed,
    claimed_at: Timestamp,
    reservation: Option<crate::engine::workers::Reservation>,
) {
    let mut reservation = reservation;
    let mut lease = claimed.lease;
    let mut claimed_at = claimed_at;
    let mut record = claimed.record;
    let mut pause = Outage::default();
    let mut lost_leases = 0u32;
    if record.status == InstanceStatus::Waiting {
        tracing::debug!(workflow = %record.workflow, instance = %record.id, "woken");
    } else {
        tracing::debug!(workflow = %record.workflow, instance = %record.id, status = %record.status, "claimed");
    }
    loop {
        // The lifetime is registered as live before its first await (inside `one_lifetime`),
        // and any panic in it, engine code included, is caught here: it must release the
        // instance, never leave it leased with no lifetime.
        // One span per lifetime: a hibernating instance has one for each time it runs.
        let span = tracing::info_span!(
            "workflow.run",
            workflow.name = %record.workflow,
            workflow.id = %record.id,
            resumed = record.started_at.is_some(),
        );
        let lifetime = crate::panic::guarded(|| {
            one_lifetime(&inner, lease, claimed_at, &record, &mut reservation)
        })
        .instrument(span)
        .await;
        match lifetime {
            Ok(Ok(())) => {
                inner.panics().remove(&lease.instance);
                tracing::debug!(workflow = %record.workflow, instance = %record.id, "lifetime ended");
                break;
            }
            Ok(Err(Abort::Stopped)) => break,
            Ok(Err(Abort::Store(cairn_store::Error::Unavailable(e)))) => {
                tracing::warn!(instance = %record.id, error = %e, "store unavailable; replaying later");
                let mut shutdown = inner.shutdown.subscribe();
                tokio::select! {
                    () = inner.env.clock.sleep(pause.next()) => {}
                    // Shutting down: the next engine replays it.
                    _ = shutdown.wait_for(|stop| *stop) => break,
                }
                // A new epoch first: every write of the last lifetime still on its way
                // (queued in the store's writer) lands before it or is fenced off, so the
                // journal read next has them all and nothing lands behind the replay.
                match reclaim(&inner, lease).await {
                    Some((fresh, at)) => (lease, claimed_at) = (fresh, at),
                    None => break,
                }
                // Replay from what the store holds now, not from the claim: the last
                // lifetime may have started the instance, and it may have been deleted.
                match reread(&inner, lease, &record).await {
                    Some(fresh) => record = fresh,
                    None => break,
                }
            }
            Ok(Err(Abort::Store(cairn_store::Error::LeaseLost(_))))
                if inner.env.leases.expire() =>
            {
                // The lease ran out by this engine's clock (it stalled, or the store was slow
                // to renew), or the store no longer had it. Take it back at a new epoch if no
                // other engine (and no terminate, restart or delete) moved it on meanwhile:
                // an engine woken from a stall runs its work again at once instead of
                // leaving it for a TTL. A second loss in a row waits a little first.
                if lost_leases > 0 {
                    let mut shutdown = inner.shutdown.subscribe();
                    tokio::select! {
                        () = inner.env.clock.sleep(pause.next()) => {}
                        _ = shutdown.wait_for(|stop| *stop) => break,
                    }
                }
                lost_leases += 1;
                match reclaim(&inner, lease).await {
                    Some((fresh, at)) => (lease, claimed_at) = (fresh, at),
                    None => {
                        tracing::debug!(instance = %record.id, "lease lost to another engine or a management request");
                        break;
                    }
                }
                tracing::info!(instance = %record.id, "took back an instance whose lease ran out; replaying it");
                match reread(&inner, lease, &record).await {
                    Some(fresh) => record = fresh,
                    None => break,
                }
            }
            Ok(Err(Abort::WorkerLost)) => {
                // The worker running its code went away: run it again at once on another
                // worker of its version (or park it until one connects). Its attempts in
                // flight are recorded as interrupted by the replay.
                tracing::info!(instance = %record.id, "the worker running the instance went away; running it again");
                match reclaim(&inner, lease).await {
                    Some((fresh, at)) => (lease, claimed_at) = (fresh, at),
                    None => break,
                }
                match reread(&inner, lease, &record).await {
                    Some(fresh) => record = fresh,
                    None => break,
                }
            }
            Ok(Err(Abort::Store(cairn_store::Error::Corrupt(e)))) => {
                // Stored data the lifetime could not read back (a stream chunk missing or
                // of the wrong size): stopping here would leave the instance leased with
                // nothing running it (for good on SQLite, whose leases never run out).
                let message = cairn_store::Error::Corrupt(e).to_string();
                if release_after_fault(&inner, lease, Fault::Corrupt, &message).await {
                    tracing::error!(instance = %record.id, error = %message, "the instance's stored data is corrupt; released it to be tried again later");
                } else {
                    // Its lease moved on: a terminate, restart or delete removed what the
                    // lifetime was reading (a stream's chunks), not a corruption.
                    inner.panics().remove(&lease.instance);
                    tracing::debug!(instance = %record.id, error = %message, "stopped running instance");
                }
                break;
            }
            Ok(Err(Abort::Store(e))) => {
                // Lease lost, instance deleted or gone: this engine is done with it.
                tracing::debug!(instance = %record.id, error = %e, "stopped running instance");
                break;
            }
            Err(panic) => {
                let message = crate::panic::message(&*panic);
                tracing::error!(instance = %record.id, panic = %message, "a lifetime panicked in engine code; releasing the instance");
                let _ = release_after_fault(&inner, lease, Fault::Panic, &message).await;
                break;
            }
            Ok(Err(Abort::Panic(message))) => {
                tracing::error!(instance = %record.id, panic = %message, "an op panicked in engine code; releasing the instance");
                let _ = release_after_fault(&inner, lease, Fault::Panic, &message).await;
                break;
            }
        }
    }
    inner.status_changed(lease.instance);
    inner.env.wake.notify_one();
}

/// The lease at a new epoch (see `Store::reclaim`) and when it was taken; `None` when it is
/// no longer this engine's.
async fn reclaim(inner: &Runtime, lease: Lease) -> Option<(Lease, Timestamp)> {
    let mut pause = Outage::default();
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let now = inner.env.clock.now();
        match inner
            .env
            .store
            .reclaim(&inner.owner, lease, now, inner.env.leases.ttl())
            .await
        {
            Ok(fresh) => return Some((fresh, now)),
            Err(cairn_store::Error::Unavailable(_)) => {
                tokio::select! {
                    () = inner.env.clock.sleep(pause.next()) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return None,
                }
            }
            Err(_) => return None,
        }
    }
}

/// The instance's record as stored now, or `None` when this lifetime must not go on: the
/// instance is gone, finished, or a different instance under the same name.
async fn reread(inner: &Runtime, lease: Lease, stale: &InstanceRecord) -> Option<InstanceRecord> {
    let mut pause = Outage::default();
    loop {
        match inner.env.store.instance(&stale.workflow, &stale.id).await {
            Ok(Some(fresh)) if fresh.instance == lease.instance && !fresh.status.is_terminal() => {
                return Some(fresh);
            }
            Ok(_) => return None,
            Err(cairn_store::Error::Unavailable(_)) => {
                inner.env.clock.sleep(pause.next()).await;
            }
            Err(_) => return None,
        }
    }
}

/// Why a lifetime stopped in a way no replay at once would mend.
#[derive(Clone, Copy)]
enum Fault {
    /// Engine code panicked.
    Panic,
    /// The store gave back data that is not what was written (`Error::Corrupt`).
    Corrupt,
}

/// Records the fault (`enginePanic` or `storeCorrupt` in a `WORKFLOW_WAITING` record) and
/// lets the instance go, claimable again after [`PANIC_RETRY`] (doubling with each fault
/// in a row, up to [`PANIC_RETRY_MAX`]): the next lifetime replays it, and an attempt the
/// fault interrupted is recorded as such. Whether the release landed (not when the lease
/// is no longer this lifetime's).
async fn release_after_fault(inner: &Runtime, lease: Lease, fault: Fault, message: &str) -> bool {
    let key = match fault {
        Fault::Panic => "enginePanic",
        Fault::Corrupt => "storeCorrupt",
    };
    let in_a_row = {
        let mut panics = inner.panics();
        let n = panics.entry(lease.instance).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let wait = PANIC_RETRY
        .saturating_mul(1u32.checked_shl(in_a_row - 1).unwrap_or(u32::MAX))
        .min(PANIC_RETRY_MAX);
    let wake_at = inner.env.clock.now().saturating_add(wait);
    let writes = || {
        vec![
            Write::Log(LogEntry {
                kind: LogKind::WorkflowWaiting,
                at: inner.env.clock.now(),
                step: None,
                meta: json!({
                    "wakeAt": wake_at.as_millis(),
                    "events": [],
                    key: cairn_core::cap_message(message),
                }),
            }),
            Write::Hibernate {
                wake_at,
                event_types: Vec::new(),
                children: Vec::new(),
            },
        ]
    };
    let mut pause = Outage::default();
    for _ in 0..10 {
        match inner.env.store.commit(lease, writes()).await {
            Err(cairn_store::Error::Unavailable(e)) => {
                tracing::warn!(error = %e, "store unavailable while releasing an instance");
                inner.env.clock.sleep(pause.next()).await;
            }
            landed => return landed.is_ok(),
        }
    }
    false
}

async fn one_lifetime(
    inner: &Arc<Runtime>,
    lease: Lease,
    claimed_at: Timestamp,
    record: &InstanceRecord,
    reservation: &mut Option<crate::engine::workers::Reservation>,
) -> Result<(), Abort> {
    let env = &inner.env;
    let rust = inner.workflows.get(&record.workflow).cloned();
    if rust.is_none() && !env.remote.knows(&record.workflow) {
        return Ok(());
    }
    let state = Arc::new(Lifetime::new(
        Arc::clone(env),
        lease,
        claimed_at,
        record.workflow.clone(),
        record.id.clone(),
        record.created_at,
    ));
    // Live before the first await: a terminate, restart or delete from now on aborts this
    // lifetime in memory, not only through the fence at its next commit.
    let _live = inner.live.enter(&state);
    if let Some(request) = crate::engine::family::orphaned(inner, record)
        .await
        .map_err(Abort::Store)?
    {
        // Its parent ended (or is gone) before the cascade reached it: end it now.
        tracing::debug!(workflow = %record.workflow, instance = %record.id, "terminating a child whose parent has ended");
        crate::engine::family::control(inner, &record.workflow, &record.id, request)
            .await
            .map_err(Abort::Store)?;
        return Ok(());
    }
    let mut shutdown = inner.shutdown.subscribe();
    let workflow = match rust {
        Some(workflow) => workflow,
        None => {
            // A worker's workflow: a slot on a worker of the instance's version first.
            let placed = tokio::select! {
                placed = inner.workers.place(&record.workflow, record.version.as_deref()) => placed,
                abort = state.aborted() => return Err(abort),
                () = stopped(&mut shutdown) => return Ok(()),
            };
            drop(reservation.take());
            match placed {
                Some((slot, version)) => {
                    Arc::new(crate::engine::workers::run::RemoteRun::new(slot, version))
                }
                None => return park(inner, &state, record).await,
            }
        }
    };
    let journal = if never_started(record) {
        // Nothing to read: no step's start lands before the instance's first start has
        // (`Lifetime::defer_first_start`), and a restart sets `started_at`. One read and
        // one round trip to a reader thread fewer per new instance.
        Vec::new()
    } else {
        tokio::select! {
            journal = env.store.journal(record.instance) => journal.map_err(Abort::Store)?,
            abort = state.aborted() => return Err(abort),
        }
    };
    // Only a lifetime that resumes a rollback needs to know which handlers to rebuild.
    let needed = if record.rollback_trigger.is_some() {
        handlers_needed(&journal)
    } else {
        Vec::new()
    };
    state.load_journal(journal);
    if let Some(at) = record.started_at {
        state.set_started_at(at);
    }
    // `running` without a start time: paused and resumed while its first start was still
    // deferred, by a lifetime that died before that start landed. It starts now.
    if record.status != InstanceStatus::Running || record.started_at.is_none() {
        let now = env.clock.now();
        let mut writes = vec![Write::Status(StatusChange {
            started_at: Some(now),
            ..StatusChange::to(InstanceStatus::Running)
        })];
        // Only the first start is a WORKFLOW_START; resuming or waking is not.
        if record.started_at.is_none() {
            writes.push(state.log(LogKind::WorkflowStart, None, json!({})));
        }
        if record.status == InstanceStatus::Waiting {
            // Woken: until it is `running` in the store, an event or a child's end would
            // make it claimable again (`send_event` wakes what waits), so say so at once.
            // Its status is learnt by the commit (`Lifetime::observe_read`).
            state.commit_now(writes).await.map_err(Abort::Store)?;
            inner.status_changed(state.lease.instance);
        } else {
            // A first start (or one after a pause): not a commit of its own; the status
            // rides with the lifetime's first commit (the first op's start, a hibernation,
            // the end), which comes before any step body runs. A lifetime that dies before
            // it leaves the instance as it was, to be claimed again. That commit tells
            // status waiters (`announce.rs`). A pause pending when it was claimed holds
            // the first op at its gate (SPEC E26).
            state.defer_first_start(writes);
            state.observe(record.status);
        }
        if record.started_at.is_none() {
            state.set_started_at(now);
            crate::telemetry::started(
                state.env.seen(),
                &record.workflow,
                now.since(record.created_at),
            );
        }
    }

    let params = match serde_json::from_str(&record.params) {
        Ok(p) => p,
        Err(e) => {
            let error = ErrorInfo::new(INTERNAL, format!("the stored params are not JSON: {e}"));
            return finish(inner, &state, record, Err(error), None, false).await;
        }
    };
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
    if let Some(trigger) = record.rollback_trigger.clone() {
        // A rollback to begin (terminate with rollback) or to resume after a crash: its
        // handlers are not in memory, so replay `run` only to register them.
        let current = (record.workflow.clone(), record.id.clone());
        state.start_registering();
        let mut replay = std::pin::pin!(
            crate::lifetime::CURRENT
                .scope(current, crate::panic::guarded(|| workflow.run(event, step)))
        );
        // Registration ends when every needed handler is registered or `run` returns. Other
        // awaits in workflow code (a `yield_now`, a short timer, a lock) may be pending on
        // the way: only once every op is parked and nothing has moved for a grace period is
        // the replay given up, and handlers still missing fail their rollback.
        let registered = futures::future::poll_fn(|cx| match replay.as_mut().poll(cx) {
            Poll::Ready(_) => Poll::Ready(()),
            Poll::Pending if handlers.cover(&needed) => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
        });
        let mut registered = std::pin::pin!(registered);
        loop {
            tokio::select! {
                () = registered.as_mut() => break,
                () = env.clock.sleep(REGISTRATION_GRACE) => {
                    if state.idle() && handlers.take_progress() == 0 {
                        break;
                    }
                }
                abort = state.aborted() => return Err(abort),
                () = stopped(&mut shutdown) => return Ok(()),
            }
        }
        let outcome = Err(trigger.error.clone());
        return roll_back_and_finish(
            inner,
            &state,
            record,
            &handlers,
            &trigger,
            outcome,
            &mut shutdown,
        )
        .await;
    }
    let current = (record.workflow.clone(), record.id.clone());
    let mut run = std::pin::pin!(
        crate::lifetime::CURRENT
            .scope(current, crate::panic::guarded(|| workflow.run(event, step)))
    );
    let Some(result) = run_phase(inner, &state, run.as_mut(), &mut shutdown).await? else {
        return Ok(());
    };
    let outcome = match result {
        Ok(Ok(output)) => {
            let size = cairn_core::binary::size(&output.to_string());
            let limit = env.limits.payload_limit;
            if size > limit {
                Err(ErrorInfo::new(
                    INTERNAL,
                    format!(
                        "The workflow's output is too large: {size} bytes; the limit is {limit} bytes."
                    ),
                ))
            } else {
                Ok(output)
            }
        }
        Ok(Err(error)) => Err(error.into_info()),
        // A panic in the engine's op code is the engine's bug: release, do not fail.
        Err(panic) if crate::panic::take_engine_panic() => {
            return Err(Abort::Panic(crate::panic::message(&*panic)));
        }
        Err(panic) => Err(ErrorInfo::new(
            ERROR,
            format!("the workflow panicked: {}", crate::panic::message(&*panic)),
        )),
    };
    match &outcome {
        Ok(_) => finish(inner, &state, record, outcome, None, false).await,
        Err(error) => {
            let trigger = Trigger::error(error.clone());
            roll_back_and_finish(
                inner,
                &state,
                record,
                &handlers,
                &trigger,
                outcome,
                &mut shutdown,
            )
            .await
        }
    }
}

/// Runs the rollback (if any step is eligible), then records the instance's end.
async fn roll_back_and_finish(
    inner: &Arc<Runtime>,
    state: &Arc<Lifetime>,
    record: &InstanceRecord,
    handlers: &crate::ops::handler::Handlers,
    trigger: &Trigger,
    outcome: Result<serde_json::Value, ErrorInfo>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<(), Abort> {
    // The journal is read from the store: what waits for a commit (the success of the
    // step before the failure) goes there first, so its handler gets its output; and so
    // does a commit that carries it and is still on its way (the driver's flush, dropped
    // when the workflow returned), which the read must not overtake.
    if state.has_deferred() {
        state.commit_now(Vec::new()).await.map_err(Abort::Store)?;
    } else {
        state.carried().await.map_err(Abort::Store)?;
    }
    let journal = inner
        .env
        .store
        .journal(state.lease.instance)
        .await
        .map_err(Abort::Store)?;
    // The rollback phase pauses and hibernates like the forward phase: a pause waits for
    // the handler in flight, a long back-off lets the instance go. The next lifetime finds
    // the stored trigger and carries on where this one stopped.
    let rollback = std::pin::pin!(crate::ops::rollback::roll_back(
        state, handlers, trigger, journal
    ));
    let Some(rollback) = run_phase(inner, state, rollback, shutdown).await? else {
        return Ok(());
    };
    finish(inner, state, record, outcome, rollback, trigger.terminate).await
}

enum Next<T> {
    Done(T),
    Drained,
    Hibernate(Hibernation),
    Pause,
    /// The driver's commit of deferred writes failed (made when writes wait for a commit,
    /// a step's success, a sleep's completion, a cancelled step, and the phase is pending,
    /// so the log stays live; the ops' own commits, when one comes first, take them along).
    Failed(cairn_store::Error),
    /// The worker went away, and what its answers settled before it went is committed.
    WorkerLost,
}

/// Starts the driver's commit of deferred writes, if any wait and none is on its way:
/// `Ready(Ok)` once nothing waits for a commit.
fn flush_deferred<'a>(
    state: &'a Lifetime,
    flush: &mut Option<Flushing<'a>>,
    cx: &mut std::task::Context<'_>,
) -> Poll<Result<(), cairn_store::Error>> {
    if flush.is_some() {
        return Poll::Pending;
    }
    if !state.has_deferred() {
        return Poll::Ready(Ok(()));
    }
    let mut commit: Flushing<'a> = Box::pin(state.commit_now(Vec::new()));
    match commit.as_mut().poll(cx) {
        Poll::Ready(Ok(_)) if state.has_deferred() => {
            // Deferred meanwhile: look again.
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        Poll::Ready(Ok(_)) => Poll::Ready(Ok(())),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => {
            *flush = Some(commit);
            Poll::Pending
        }
    }
}

/// The driver's commit of deferred writes, on its way.
type Flushing<'a> =
    Pin<Box<dyn Future<Output = Result<InstanceStatus, cairn_store::Error>> + Send + 'a>>;
type Rereading<'a> =
    Pin<Box<dyn Future<Output = Result<Option<InstanceStatus>, cairn_store::Error>> + Send + 'a>>;

/// Whether the instance was created and never started: queued, with no first start on
/// record. Such an instance has no journal (see its one use in `one_lifetime`).
fn never_started(record: &InstanceRecord) -> bool {
    record.status == InstanceStatus::Queued && record.started_at.is_none()
}

/// The handlers a rollback will need: started steps with a handler whose compensation has
/// not finished yet.
fn handlers_needed(journal: &[cairn_core::StepRecord]) -> Vec<StepKey> {
    let compensated: std::collections::HashSet<(&str, u32)> = journal
        .iter()
        .filter(|r| r.key.kind == StepKind::Rollback && r.state != StepState::Running)
        .map(|r| (r.key.name.as_str(), r.key.count))
        .collect();
    journal
        .iter()
        .filter(|r| r.key.kind == StepKind::Run && r.has_rollback)
        .filter(|r| !compensated.contains(&(r.key.name.as_str(), r.key.count)))
        .map(|r| r.key.clone())
        .collect()
}

/// Polls one phase of a lifetime (the forward run, or the rollback) until it finishes:
/// `Some(output)`. After each `Pending`, a pending pause takes effect once no attempt is in
/// flight, and if every op waits durably for longer than the hot threshold the instance
/// hibernates (its wake-up recorded). Both end the lifetime (`None`), as does shutdown: the
/// future is dropped and the next lifetime replays to where this one stopped.
async fn run_phase<F: Future>(
    inner: &Runtime,
    state: &Lifetime,
    mut phase: Pin<&mut F>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Option<F::Output>, Abort> {
    let threshold = inner.hibernate_after;
    if *shutdown.borrow() {
        // Claimed just before the shutdown began: start no attempt.
        state.start_draining();
    }
    // The commit of deferred writes the driver makes when the workflow is pending without
    // one of its own: polled with the phase, not instead of it, since the workflow may be
    // waiting on a store call of its own (a stream's chunk read) that a store taking calls
    // in turn answers first.
    let mut flush: Option<Flushing<'_>> = None;
    // The read that decides a commit's answer left undecided by a pause or resume told
    // while it was on its way (`Lifetime::take_undecided`): polled with the phase, and,
    // like the flush, nothing pauses, hibernates or drains before it is done.
    let mut reread: Option<Rereading<'_>> = None;
    // Quiet polls in a row once the worker has gone (`Lifetime::worker_lost`).
    let mut quiet_polls = 0u32;
    loop {
        let next = futures::future::poll_fn(|cx| {
            state.polling();
            if reread.is_none() && state.take_undecided() {
                reread = Some(Box::pin(state.learn_stored_status(false)));
            }
            if let Some(read) = reread.as_mut()
                && let Poll::Ready(answer) = read.as_mut().poll(cx)
            {
                reread = None;
                if let Err(e) = answer {
                    tracing::warn!(workflow = %state.workflow, instance = %state.instance_id, error = %e, "the instance's status could not be read again; its gate stays as it is until the next commit's answer");
                }
            }
            if let Some(commit) = flush.as_mut()
                && let Poll::Ready(answer) = commit.as_mut().poll(cx)
            {
                flush = None;
                match answer {
                    Ok(_) => {}
                    Err(e) => return Poll::Ready(Next::Failed(e)),
                }
            }
            let lost = state.worker_lost();
            let polled = if lost {
                // Every answer the worker sent before it went is taken in this poll, not
                // only those the task's budget reaches (many failures first, a success
                // last, would otherwise look quiet twice).
                std::pin::Pin::new(&mut tokio::task::unconstrained(phase.as_mut())).poll(cx)
            } else {
                phase.as_mut().poll(cx)
            };
            match polled {
                Poll::Ready(output) => Poll::Ready(Next::Done(output)),
                // An op's commit (or the flush) is on its way: the driver's own commit would
                // wait for it (`Lifetime::committing`) while the op is not polled. Once it
                // is done, `control` wakes this loop.
                // The worker went away: what its answers settled before it went (a step's
                // success is only deferred) is committed, then the run stops. Not held by
                // an op's own commit on its way: an op the run no longer polls (a worker
                // that also broke the protocol) would hold it for ever; one that carries
                // a success is driven by the flush (`Lifetime::commit_now`), and one sent
                // lands or is fenced like any commit of a lifetime that stops.
                Poll::Pending if lost => {
                    match flush_deferred(state, &mut flush, cx) {
                        // Quiet twice, a task poll apart: an answer an op did not take in
                        // one poll (its task's budget spent) is taken in the next.
                        Poll::Ready(Ok(())) if quiet_polls > 0 => Poll::Ready(Next::WorkerLost),
                        Poll::Ready(Ok(())) => {
                            quiet_polls += 1;
                            cx.waker().wake_by_ref();
                            Poll::Pending
                        }
                        Poll::Ready(Err(e)) => Poll::Ready(Next::Failed(e)),
                        Poll::Pending => {
                            quiet_polls = 0;
                            Poll::Pending
                        }
                    }
                }
                Poll::Pending if state.committing() || reread.is_some() => Poll::Pending,
                Poll::Pending if state.draining() && state.in_flight() == 0 => {
                    Poll::Ready(Next::Drained)
                }
                Poll::Pending if state.pausing() && state.in_flight() == 0 => {
                    Poll::Ready(Next::Pause)
                }
                Poll::Pending => match state.hibernation() {
                    Some(h) if h.wake_at > state.now().saturating_add(threshold) => {
                        Poll::Ready(Next::Hibernate(h))
                    }
                    _ => match flush_deferred(state, &mut flush, cx) {
                        Poll::Ready(Err(e)) => Poll::Ready(Next::Failed(e)),
                        _ => Poll::Pending,
                    },
                },
            }
        });
        tokio::select! {
            next = next => match next {
                Next::Done(output) => return Ok(Some(output)),
                // Shutting down and every attempt in flight is recorded: let go, with the
                // writes still waiting for a commit (a step the workflow dropped).
                Next::Drained => {
                    if state.has_deferred() {
                        state.commit_now(Vec::new()).await.map_err(Abort::Store)?;
                    }
                    return Ok(None);
                }
                Next::Hibernate(h) => {
                    hibernate(inner, state, h).await?;
                    return Ok(None);
                }
                Next::Failed(e) => return Err(Abort::Store(e)),
                Next::WorkerLost => return Err(Abort::WorkerLost),
                Next::Pause => {
                    let writes = vec![Write::Pause {
                        at: state.now(),
                        record: state.log_entry(LogKind::WorkflowPaused, None, json!({})),
                    }];
                    let status = state.commit_now(writes).await.map_err(Abort::Store)?;
                    if status == InstanceStatus::Paused {
                        tracing::debug!(workflow = %state.workflow, instance = %state.instance_id, "paused");
                        return Ok(None);
                    }
                    // Resumed meanwhile (learnt by the commit): carry on.
                }
            },
            () = state.control.notified() => {}
            abort = state.aborted(), if !state.worker_lost() => match abort {
                // Answers the worker sent before it went may wait in the ops, not yet
                // taken: the phase is polled on (no attempt starts: the gate closed with
                // the loss) until they are recorded and committed (`Next::WorkerLost`).
                Abort::WorkerLost => {}
                abort => return Err(abort),
            },
            // Shutdown: no new attempt starts (the pause gate holds them), the ones in flight
            // finish and commit; the engine drops what is left at its drain deadline.
            () = stopped(shutdown), if !state.draining() => state.start_draining(),
        }
    }
}

/// Lets go of an instance of a worker's workflow whose version no connected worker runs:
/// it waits (its status kept if it never started) until a worker of the version connects
/// (`Store::wake_awaiting`).
async fn park(inner: &Runtime, state: &Lifetime, record: &InstanceRecord) -> Result<(), Abort> {
    let version = record.version.clone();
    state
        .commit_now(vec![
            state.log(
                LogKind::WorkflowWaiting,
                None,
                json!({ "wakeAt": null, "events": [], "awaitingWorker": version }),
            ),
            Write::Hibernate {
                wake_at: cairn_store::AWAITING_WORKER,
                event_types: Vec::new(),
                children: Vec::new(),
            },
        ])
        .await
        .map_err(Abort::Store)?;
    tracing::info!(workflow = %record.workflow, instance = %record.id, version = ?version, "no worker runs the instance's version; it waits for one");
    // A worker of the version that connected while this was written has woken what was
    // parked before: look again, so this one does not wait for the next.
    if let Some(version) = &version
        && inner.workers.serves(&record.workflow, version)
    {
        inner
            .env
            .store
            .wake_awaiting(&record.workflow, version, u64::MAX)
            .await
            .map_err(Abort::Store)?;
        inner.env.wake.notify_one();
    }
    Ok(())
}

/// Records that the instance waits until `h.wake_at` (or an event) and lets it go.
async fn hibernate(inner: &Runtime, state: &Lifetime, h: Hibernation) -> Result<(), Abort> {
    state
        .commit_now(vec![
            state.log(
                LogKind::WorkflowWaiting,
                None,
                json!({ "wakeAt": h.wake_at.as_millis(), "events": h.event_types }),
            ),
            Write::Hibernate {
                wake_at: h.wake_at,
                event_types: h.event_types,
                children: h.children,
            },
        ])
        .await
        .map_err(Abort::Store)?;
    tracing::debug!(workflow = %state.workflow, instance = %state.instance_id, wake_at = %h.wake_at, "hibernated");
    // Its wake-up is a new timer, or (an event already buffered) it is claimable at once.
    inner.env.wake.notify_one();
    Ok(())
}

async fn finish(
    inner: &Arc<Runtime>,
    state: &Lifetime,
    record: &InstanceRecord,
    outcome: Result<serde_json::Value, ErrorInfo>,
    rollback: Option<RollbackStatus>,
    terminated: bool,
) -> Result<(), Abort> {
    let now = state.now();
    let rollback_outcome = rollback;
    let status = match &outcome {
        _ if terminated => InstanceStatus::Terminated,
        Ok(_) => InstanceStatus::Complete,
        Err(_) => InstanceStatus::Errored,
    };
    // An instance that fails for good is logged at warn, once its end is committed.
    let failure = match &outcome {
        Err(error) if !terminated => Some((
            error.clone(),
            rollback_outcome.as_ref().map(|r| r.outcome.clone()),
        )),
        _ => None,
    };
    let writes = match outcome {
        // Terminated with rollback: the handlers ran; now it ends as a terminate does.
        _ if terminated => vec![
            Write::Status(StatusChange {
                ended_at: Some(now),
                release: true,
                rollback_outcome,
                ..StatusChange::to(InstanceStatus::Terminated)
            }),
            state.log(
                LogKind::WorkflowTerminated,
                None,
                json!({ "trigger": { "source": "api" } }),
            ),
        ],
        Ok(mut output) => vec![
            Write::Status(StatusChange {
                ended_at: Some(now),
                output: Some(output.to_string()),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            }),
            // Logs show byte sequences as their size.
            state.log(LogKind::WorkflowSuccess, None, {
                cairn_core::binary::summarise(&mut output);
                json!({ "result": output })
            }),
        ],
        Err(error) => {
            vec![
                Write::Status(StatusChange {
                    ended_at: Some(now),
                    error: Some(error.clone()),
                    release: true,
                    rollback_outcome,
                    ..StatusChange::to(InstanceStatus::Errored)
                }),
                state.log(LogKind::WorkflowFailure, None, json!({ "error": error })),
            ]
        }
    };
    state.commit_now(writes).await.map_err(Abort::Store)?;
    if let Some((error, rollback)) = failure {
        tracing::warn!(
            workflow = %state.workflow,
            instance = %state.instance_id,
            error.name = %error.name,
            error.message = %error.message,
            rollback = rollback.as_deref(),
            "instance failed"
        );
    }
    state.set_finished();
    let ran = state.started_at().map(|at| now.since(at));
    crate::telemetry::finished(state.env.seen(), &state.workflow, status, ran);
    tracing::debug!(workflow = %state.workflow, instance = %state.instance_id, status = %status, "finished");
    crate::engine::family::ended(
        inner,
        state.lease,
        status,
        record.parent.as_ref(),
        state.invoked(),
    )
    .await;
    Ok(())
}

/// Resolves once the engine is shutting down.
async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: drop it before returning.
    let stop = shutdown.wait_for(|stop| *stop).await.is_err();
    if stop {
        std::future::pending::<()>().await;
    }
}
