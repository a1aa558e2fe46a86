//! [`RemoteRun`]: a workflow whose code runs on a worker, as the driver runs any workflow.
//!
//! Each op the worker reports is made here, in the order the code made it, with the same
//! `WorkflowStep` calls a Rust workflow makes: so the identity, journal, attempts, retries,
//! timeouts, rollback, hibernation, pause and terminate of a worker's workflow are the
//! engine's own, and only the bodies (a step's callback, a delay function, a rollback
//! handler) run on the worker, one task at a time as the engine asks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::ErrorInfo;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

use crate::config::{Delay, DelayContext, DelayValue, StepConfig};
use crate::context::StepContext;
use crate::engine::workers::protocol::{self, Op, OpKind, Outcome, StopReason, TaskKind};
use crate::engine::workers::session::{RunChannel, RunEvent, Slot};
use crate::failure::{BoxError, ERROR, INTERNAL, StepError, WorkflowError};
use crate::lifetime::Abort;
use crate::ops::{Rollback, WorkflowStep};
use crate::workflow::{ErasedWorkflow, WorkflowEvent};

/// One lifetime's run of an instance on a worker that holds a slot for it.
pub(crate) struct RemoteRun {
    slot: Mutex<Option<Slot>>,
    /// The version of the code the instance is pinned to.
    version: String,
}

impl RemoteRun {
    pub(crate) fn new(slot: Slot, version: String) -> Self {
        RemoteRun {
            slot: Mutex::new(Some(slot)),
            version,
        }
    }
}

/// The run on the worker, held by the run's future and by the rollback handlers it
/// registered: when the last of them goes, the worker is told the run stopped, and why.
struct RunHandle {
    channel: Arc<RunChannel>,
    _slot: Slot,
    /// `run()` returned: the instance ends now (or rolls back first, with this handle).
    returned: std::sync::atomic::AtomicBool,
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        let lifetime = &self.channel.lifetime;
        let returned = self.returned.load(std::sync::atomic::Ordering::SeqCst);
        let reason = if lifetime.finished() {
            StopReason::Done
        } else if let Some(abort) = lifetime.abort_reason() {
            match abort {
                Abort::Stopped => StopReason::Stopped,
                _ => StopReason::Lost,
            }
        } else if lifetime.draining() {
            StopReason::Lost
        } else if lifetime.pausing() {
            StopReason::Paused
        } else if returned {
            StopReason::Done
        } else {
            StopReason::Hibernated
        };
        self.channel.session.close_run(&self.channel.id);
        self.channel.send(protocol::stop(&self.channel.id, reason));
    }
}

impl ErasedWorkflow for RemoteRun {
    fn check_params(&self, _params: &Value) -> Result<(), String> {
        // Any JSON: the worker's code checks what it needs.
        Ok(())
    }

    fn run(
        self: Arc<Self>,
        event: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> BoxFuture<'static, Result<Value, WorkflowError>> {
        Box::pin(async move {
            let slot = self
                .slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let Some(slot) = slot else {
                return Err(WorkflowError::new(INTERNAL, "a worker's run started twice"));
            };
            let (channel, mut events) = slot.session.open_run(Arc::clone(&step.lifetime));
            let handle = Arc::new(RunHandle {
                channel,
                _slot: slot,
                returned: std::sync::atomic::AtomicBool::new(false),
            });
            // The params as the client gave them (stored with `$` keys escaped).
            let mut params = event.payload;
            cairn_core::binary::external(&mut params);
            handle.channel.send(protocol::start(
                &handle.channel.id,
                event.workflow_name.as_str(),
                &self.version,
                event.instance_id.as_str(),
                &params,
                event.timestamp,
                step.lifetime.checking(),
            ));
            tracing::debug!(workflow = %event.workflow_name, instance = %event.instance_id, run = %handle.channel.id, worker = %handle.channel.session.worker, "started a run on a worker");
            // While the worker's code runs (from the start, and after each answer until it
            // says it waits on ops only), the instance is busy: it does not hibernate, as a
            // Rust workflow does not while its future is being polled.
            let mut busy = Some(step.lifetime.activity());
            // The worker's code numbers its ops as it makes them, and this loop polls every
            // op whenever it is woken: steps made together start in that order.
            step.lifetime.start_in_call_order();
            let mut ops: FuturesUnordered<Performed> = FuturesUnordered::new();
            let mut made = 0u64;
            let mut answered = 0u64;
            loop {
                tokio::select! {
                    // The ops first: an answer the worker sent before its `runResult` (an op
                    // the code did not await) is taken before the run's end drops that op,
                    // so a success it reported is recorded, not cancelled.
                    biased;
                    Some((seq, result)) = ops.next(), if !ops.is_empty() => {
                        busy.get_or_insert_with(|| step.lifetime.activity());
                        answered += 1;
                        handle
                            .channel
                            .send(protocol::op_result(&handle.channel.id, seq, result.as_ref()));
                    }
                    event = events.recv() => match event {
                        Some(RunEvent::Op(op)) => {
                            if op.seq != made {
                                return broken(&handle, &step, format!(
                                    "op {} of run {} came where op {made} was due: ops are numbered from 0 in the order the code makes them",
                                    op.seq, handle.channel.id
                                )).await;
                            }
                            made += 1;
                            ops.push(perform(&handle, &step, *op));
                        }
                        // Idle only if it is about every op made and every answer sent:
                        // an idle the worker sent before an answer reached it is stale (the
                        // answer may make the code go on: it says idle again if not).
                        Some(RunEvent::Idle { ops: n, answers }) => {
                            if n == made && answers.is_none_or(|a| a == answered) {
                                busy = None;
                            }
                        }
                        Some(RunEvent::Returned(outcome)) => {
                            // Ops still pending (unanswered, or an attempt's failure still
                            // committing) are dropped with the run, as a Rust workflow's are
                            // when `run` returns without them.
                            handle.returned.store(true, std::sync::atomic::Ordering::SeqCst);
                            return returned(outcome);
                        }
                        None => return std::future::pending().await,
                    },
                }
            }
        })
    }
}

/// The worker broke the protocol about this run: the instance is let go (and runs again
/// after a back-off, as after an engine panic), nothing is recorded.
async fn broken(
    handle: &RunHandle,
    step: &WorkflowStep,
    message: String,
) -> Result<Value, WorkflowError> {
    tracing::warn!(run = %handle.channel.id, worker = %handle.channel.session.worker, "{message}");
    handle.channel.send(
        protocol::Refusal::new("protocol.sequence", message.clone())
            .about(&handle.channel.id)
            .frame(),
    );
    step.lifetime.abort(Abort::Panic(message));
    std::future::pending().await
}

/// What `run()` returned, as the instance's output or error.
fn returned(outcome: Outcome) -> Result<Value, WorkflowError> {
    match outcome {
        // Stored as a Rust workflow's output is: a user's `$` keys escaped.
        Ok(value) => cairn_core::binary::to_value(&value)
            .map_err(|e| WorkflowError::new(INTERNAL, format!("the output is not JSON: {e}"))),
        Err(e) => Err(WorkflowError::from_info(e.info())),
    }
}

type Performed = BoxFuture<'static, (u64, Result<Value, ErrorInfo>)>;

/// Makes op `op`: the same call a Rust workflow makes, taking the op's identity now (in
/// the order the ops came), and resolving with the op's result.
fn perform(handle: &Arc<RunHandle>, step: &WorkflowStep, op: Op) -> Performed {
    let seq = op.seq;
    let answer =
        move |result: Result<Value, WorkflowError>| (seq, result.map_err(WorkflowError::into_info));
    let refuse = move |message: String| -> Performed {
        Box::pin(std::future::ready((
            seq,
            Err(ErrorInfo::new(ERROR, message)),
        )))
    };
    match op.op {
        OpKind::Do => {
            let delay = op.delay_function.then(|| {
                let handle = Arc::clone(handle);
                Delay::function(move |d: DelayContext| {
                    let handle = Arc::clone(&handle);
                    async move { handle.delay(seq, d).await }
                })
            });
            let config = match step_config(op.config.as_ref(), delay) {
                Ok(config) => config,
                Err(e) => return refuse(format!("step \"{}\": {e}", op.name)),
            };
            let body_handle = Arc::clone(handle);
            let mut run = step
                .run(op.name.clone(), move |ctx: StepContext| {
                    let handle = Arc::clone(&body_handle);
                    async move { handle.attempt(seq, ctx).await }
                })
                .config(&config);
            if let Some(rollback) = op.rollback {
                let config = match step_config(rollback.config.as_ref(), None) {
                    Ok(config) => config,
                    Err(e) => return refuse(format!("the rollback of step \"{}\": {e}", op.name)),
                };
                let handle = Arc::clone(handle);
                run = run
                    .rollback(move |r: Rollback<Value>| {
                        let handle = Arc::clone(&handle);
                        async move { handle.roll_back(seq, r).await }
                    })
                    .rollback_config(&config);
            }
            Box::pin(async move { answer(run.await) })
        }
        OpKind::Sleep => {
            let sleep = match op.duration {
                Some(cairn_core::DurationSpec::Text(text)) => step.sleep(op.name, text),
                Some(millis) => match millis.into_duration() {
                    Ok(d) => step.sleep(op.name, d),
                    Err(e) => return refuse(e.to_string()),
                },
                None => return refuse(format!("sleep \"{}\" has no duration", op.name)),
            };
            Box::pin(async move { answer(sleep.await.map(|()| Value::Null)) })
        }
        OpKind::SleepUntil => {
            let Some(until) = op.until else {
                return refuse(format!("sleepUntil \"{}\" has no time", op.name));
            };
            let sleep = step.sleep_until(op.name, until);
            Box::pin(async move { answer(sleep.await.map(|()| Value::Null)) })
        }
        OpKind::WaitForEvent => {
            let Some(event_type) = op.event_type else {
                return refuse(format!("waitForEvent \"{}\" has no event type", op.name));
            };
            let mut wait = step.wait_for_event::<Value>(op.name, event_type);
            match op.timeout {
                Some(cairn_core::DurationSpec::Text(text)) => wait = wait.timeout(text),
                Some(millis) => match millis.into_duration() {
                    Ok(d) => wait = wait.timeout(d),
                    Err(e) => return refuse(e.to_string()),
                },
                None => {}
            }
            Box::pin(async move {
                answer(wait.await.map(|event| {
                    json!({
                        "payload": event.payload,
                        "type": event.event_type,
                        "timestamp": event.timestamp.to_rfc3339(),
                    })
                }))
            })
        }
        OpKind::Invoke => {
            let Some(workflow) = op.workflow else {
                return refuse(format!("invoke \"{}\" names no workflow", op.name));
            };
            let mut invoke = step.invoke_by_name(op.name, workflow, op.params);
            if op.detached {
                invoke = invoke.detached();
            }
            Box::pin(async move { answer(invoke.await) })
        }
    }
}

/// A step's config as the worker sent it (Cloudflare's `WorkflowStepConfig`, or `null`),
/// with the delay function when the worker has one.
fn step_config(config: Option<&Value>, delay: Option<Delay>) -> Result<StepConfig, String> {
    let mut config = match config {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(config) => config.clone(),
    };
    if delay.is_some() {
        // The delay is a function: the config has none, and any will do to read the rest.
        if let Some(retries) = config.get_mut("retries").and_then(Value::as_object_mut) {
            retries.insert("delay".into(), Value::from(0));
        }
    }
    let mut parsed = StepConfig::from_json(&config.to_string()).map_err(|e| e.to_string())?;
    if let (Some(delay), Some(retries)) = (delay, parsed.retries.as_mut()) {
        retries.delay = delay;
    }
    Ok(parsed)
}

impl RunHandle {
    /// One attempt of op `seq`'s callback, on the worker.
    async fn attempt(&self, seq: u64, ctx: StepContext) -> Result<Value, StepError> {
        let id = &self.channel.id;
        match self
            .channel
            .ask(TaskKind::Attempt, |task| {
                protocol::attempt(id, task, seq, &ctx)
            })
            .await
        {
            Ok(value) => Ok(value),
            Err(e) => Err(StepError {
                info: e.info(),
                retryable: !e.non_retryable,
            }),
        }
    }

    /// Op `seq`'s delay function, on the worker: a number of milliseconds or a duration
    /// string.
    async fn delay(&self, seq: u64, d: DelayContext) -> Result<DelayValue, BoxError> {
        let id = &self.channel.id;
        match self
            .channel
            .ask(TaskKind::Delay, |task| {
                protocol::delay(id, task, seq, &d.ctx, &d.error)
            })
            .await
        {
            Ok(Value::String(text)) => Ok(DelayValue::Text(text)),
            Ok(value) => Ok(match value.as_f64() {
                Some(ms) if ms >= 0.0 => {
                    DelayValue::Duration(Duration::from_millis(ms.round() as u64))
                }
                // Any other value (a negative number, null, an object) is no delay. As text
                // it fails the duration grammar, which gives the step Cloudflare's
                // "returned an invalid delay value" rather than the message of a function
                // that threw.
                _ => DelayValue::Text(value.to_string()),
            }),
            Err(e) => Err(e.info().to_string().into()),
        }
    }

    /// Op `seq`'s rollback handler, on the worker.
    async fn roll_back(&self, seq: u64, r: Rollback<Value>) -> Result<(), StepError> {
        let id = &self.channel.id;
        // Read from the journal as the worker wrote it (keys unescaped).
        let output = r.output;
        match self
            .channel
            .ask(TaskKind::Rollback, |task| {
                protocol::rollback(id, task, seq, &r.ctx, output.as_ref(), &r.error)
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(StepError {
                info: e.info(),
                retryable: !e.non_retryable,
            }),
        }
    }
}
