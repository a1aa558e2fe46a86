//! [`Instance`]: one instance's status, waits, log, details, events and control.

use std::marker::PhantomData;

use cairn_core::{ErrorInfo, InstanceId, InstanceStatus, LogRecord, WorkflowName};
use cairn_store::{ControlOutcome, ControlRequest, InstanceRecord, InstanceRef};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::details::InstanceDetails;
use crate::engine::Engine;
use crate::error::Error;

/// An instance's status: Cloudflare's `{status, output, error}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status<O> {
    /// Where the instance is.
    pub status: InstanceStatus,
    /// `run`'s return value, when complete.
    pub output: Option<O>,
    /// The error that escaped `run`, when errored.
    pub error: Option<ErrorInfo>,
    /// How the rollback went, when one ran.
    pub rollback: Option<crate::ops::RollbackStatus>,
}

/// The longest idempotency key of [`Instance::send_event_with_key`], in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// What [`Instance::send_event_with_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    /// The event was buffered for the instance.
    Buffered,
    /// An event with this key was sent before: nothing was delivered again.
    Duplicate,
}

/// What a wait waits for.
enum Until<F> {
    /// The instance's end (complete, errored or terminated).
    Ended,
    /// A status the predicate accepts.
    Satisfied(F),
}

impl<F> Until<F> {
    fn done<T>(&mut self, status: &Status<T>) -> bool
    where
        F: FnMut(&Status<T>) -> bool,
    {
        match self {
            Until::Ended => status.status.is_terminal(),
            Until::Satisfied(done) => done(status),
        }
    }
}

/// A handle to one instance. Its output decodes as `O`.
pub struct Instance<O = serde_json::Value> {
    pub(crate) engine: Engine,
    pub(crate) workflow: WorkflowName,
    pub(crate) id: InstanceId,
    /// The row this handle's `create` wrote, when it was created through it: a wait then
    /// watches that row's status before its first read, instead of reading once to learn
    /// which row to watch. A hint: deleted and created again, the id names another row,
    /// which the wait finds and watches instead.
    pub(crate) created_as: Option<InstanceRef>,
    pub(crate) _output: PhantomData<fn() -> O>,
}

impl<O> Clone for Instance<O> {
    fn clone(&self) -> Self {
        Instance {
            engine: self.engine.clone(),
            workflow: self.workflow.clone(),
            id: self.id.clone(),
            created_as: self.created_as,
            _output: PhantomData,
        }
    }
}

impl<O> std::fmt::Debug for Instance<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("workflow", &self.workflow)
            .field("id", &self.id)
            .finish()
    }
}

impl Instance<serde_json::Value> {
    pub(crate) fn typed<O>(self) -> Instance<O> {
        Instance {
            engine: self.engine,
            workflow: self.workflow,
            id: self.id,
            created_as: self.created_as,
            _output: PhantomData,
        }
    }
}

impl<O: DeserializeOwned> Instance<O> {
    /// The instance id.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }

    /// The workflow's name.
    pub fn workflow(&self) -> &WorkflowName {
        &self.workflow
    }

    pub(crate) async fn record(&self) -> Result<InstanceRecord, Error> {
        self.engine
            .inner
            .env
            .store
            .instance(&self.workflow, &self.id)
            .await?
            .ok_or_else(|| Error::InstanceNotFound {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
            })
    }

    /// The instance's status, output and error.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] once the instance is deleted; [`Error::Store`] when the
    /// stored output does not decode as `O`.
    pub async fn status(&self) -> Result<Status<O>, Error> {
        let record = self.record().await?;
        self.status_of(record)
    }

    /// [`Instance::status`] with the output as the HTTP API answers it: the JSON as stored,
    /// in which byte sequences are `{"$bytes": "<base64>"}`, and every key as it was written
    /// (`cairn_core::binary::external`), whatever `O` is.
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn stored_status(&self) -> Result<Status<serde_json::Value>, Error> {
        let record = self.record().await?;
        status_from(&self.id, record, cairn_core::binary::external_value)
    }

    fn status_of(&self, record: InstanceRecord) -> Result<Status<O>, Error> {
        status_from(&self.id, record, cairn_core::binary::from_str)
    }

    /// Waits until the instance's status satisfies `done`, and returns it.
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn wait_for(&self, done: impl FnMut(&Status<O>) -> bool) -> Result<Status<O>, Error> {
        self.wait_decoded(Until::Satisfied(done), cairn_core::binary::from_str)
            .await
    }

    /// [`Instance::wait`], answering in [`Instance::stored_status`]'s form: what the HTTP
    /// API's `create?wait` answers, read once (waiting, then reading the stored form, reads
    /// the instance twice at its end).
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn wait_stored(&self) -> Result<Status<serde_json::Value>, Error> {
        self.wait_ended(cairn_core::binary::external_value).await
    }

    /// Waits until the instance has ended, its output decoded by `decode`.
    async fn wait_ended<T>(
        &self,
        decode: fn(&str) -> serde_json::Result<T>,
    ) -> Result<Status<T>, Error> {
        self.wait_decoded(Until::<fn(&Status<T>) -> bool>::Ended, decode)
            .await
    }

    /// [`Instance::wait_for`] with the output decoded by `decode`.
    async fn wait_decoded<T>(
        &self,
        mut until: Until<impl FnMut(&Status<T>) -> bool>,
        decode: fn(&str) -> serde_json::Result<T>,
    ) -> Result<Status<T>, Error> {
        // This instance's own status signal (and, on a shared store, other engines'
        // writes to it, from their notices): a waiter is not woken by every other
        // instance's change.
        let statuses = &self.engine.inner.commits.statuses;
        // Watched before the read that checks it, so no change falls between the two.
        let mut watched = match self.created_as {
            Some(row) => row,
            None => self.record().await?.instance,
        };
        let mut changes = statuses.subscribe(&watched);
        // A notice can be lost (a listener reconnecting): on a shared store, look again
        // each second anyway. Not on SQLite, where no other process writes, nor under a
        // virtual clock (as the scheduler's poll): the runtime's clock jumps to the next
        // timer when idle, so the poll would walk a test's 30-day sleep a second at a time,
        // 2.6 million reads (a PostgreSQL test took minutes of CPU that way).
        let env = &self.engine.inner.env;
        let shared = env.leases.expire() && !env.clock.is_virtual();
        loop {
            let mut seen = *changes.borrow_and_update();
            let record = self.record().await?;
            if record.instance != watched {
                // Deleted and created again under the same id: a new row, with its own
                // signal. Watch that one, then read again.
                watched = record.instance;
                changes = statuses.subscribe(&watched);
                continue;
            }
            let status = status_from(&self.id, record, decode)?;
            if until.done(&status) {
                return Ok(status);
            }
            loop {
                if shared {
                    match tokio::time::timeout(std::time::Duration::from_secs(1), changes.changed())
                        .await
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return Ok(status),
                        // Nothing heard for a second: read again anyway.
                        Err(_) => break,
                    }
                } else if changes.changed().await.is_err() {
                    return Ok(status);
                }
                // The one news since the read is the instance's start: it is running, so a
                // wait for its end has nothing to read yet. Any other news, or more than
                // one, is read (a start that lands after the instance was terminated, from
                // a commit settled after its lifetime, must not hide the terminate).
                let now = *changes.borrow_and_update();
                if !(matches!(until, Until::Ended)
                    && crate::engine::announce::only_a_start_since(seen, now))
                {
                    break;
                }
                seen = now;
            }
        }
    }

    /// Waits until the instance is complete, errored or terminated, and returns its status.
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn wait(&self) -> Result<Status<O>, Error> {
        self.wait_ended(cairn_core::binary::from_str).await
    }

    /// [`Instance::wait`] for at most `timeout` (on the engine's clock): `None` when the
    /// instance has not finished by then.
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn wait_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> Result<Option<Status<O>>, Error> {
        tokio::select! {
            status = self.wait() => status.map(Some),
            () = self.engine.inner.env.clock.sleep(timeout) => Ok(None),
        }
    }

    /// A receiver that sees a new value after every write this engine commits to this
    /// instance: a live view that has read its whole log waits on it. Writes by other
    /// processes sharing the store are not seen.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] or a store failure.
    pub async fn commits(&self) -> Result<tokio::sync::watch::Receiver<u64>, Error> {
        let record = self.record().await?;
        Ok(self.engine.inner.commits.instance(record.instance))
    }

    /// The instance's lifecycle records with id greater than `after`, oldest first.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] or a store failure.
    pub async fn log(&self, after: u64) -> Result<Vec<LogRecord>, Error> {
        let record = self.record().await?;
        let store = &self.engine.inner.env.store;
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let page = store.log(record.instance, cursor, 1_000).await?;
            let Some(last) = page.last() else { break };
            cursor = last.id;
            let full = page.len() == 1_000;
            out.extend(page);
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// Sends an event: it is buffered per type, first in first out, until a
    /// `wait_for_event` of that type takes it, and wakes the instance if it hibernates.
    /// Works in every non-terminal status (also `queued` and `paused`).
    ///
    /// Without a key a send is not idempotent: a client that retries a send whose
    /// answer it lost (a crash, a timeout) delivers the event twice. Use
    /// [`Instance::send_event_with_key`] when retries are possible.
    ///
    /// # Errors
    /// An invalid event type, a payload over the size limit, [`Error::InstanceNotFound`], or
    /// [`Error::InstanceFinished`] for a finished instance.
    pub async fn send_event<P: Serialize>(
        &self,
        event_type: &str,
        payload: &P,
    ) -> Result<(), Error> {
        self.send(event_type, payload, None).await.map(drop)
    }

    /// [`Instance::send_event`] with an idempotency key (1–256 characters, no control
    /// characters): the first send with a key delivers the event; every later one with the
    /// same key to the same instance is acknowledged as [`Delivery::Duplicate`] and
    /// delivers nothing, also after the event was consumed or the instance finished. Keys
    /// are kept as long as the instance (a restart clears them with the buffered events).
    ///
    /// # Errors
    /// As [`Instance::send_event`], and [`Error::InvalidIdempotencyKey`].
    pub async fn send_event_with_key<P: Serialize>(
        &self,
        event_type: &str,
        payload: &P,
        key: &str,
    ) -> Result<Delivery, Error> {
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY || key.chars().any(char::is_control) {
            return Err(Error::InvalidIdempotencyKey(key.to_owned()));
        }
        self.send(event_type, payload, Some(key.to_owned())).await
    }

    async fn send<P: Serialize>(
        &self,
        event_type: &str,
        payload: &P,
        idempotency_key: Option<String>,
    ) -> Result<Delivery, Error> {
        let event_type = cairn_core::EventType::new(event_type)?;
        let payload = cairn_core::binary::to_string(payload)
            .map_err(|e| Error::InvalidEventPayload(e.to_string()))?;
        let limit = self.engine.inner.env.limits.payload_limit;
        let size = cairn_core::binary::size(&payload);
        if size > limit {
            return Err(Error::PayloadTooLarge {
                what: "event payload",
                size,
                limit,
            });
        }
        let event = cairn_store::NewEvent {
            event_type,
            payload,
            at: self.engine.inner.env.clock.now(),
            idempotency_key,
        };
        match self
            .engine
            .inner
            .env
            .store
            .send_event(&self.workflow, &self.id, event)
            .await?
        {
            cairn_store::Sent::Buffered(instance) => {
                self.engine.inner.event_sent(instance);
                Ok(Delivery::Buffered)
            }
            cairn_store::Sent::Duplicate(_) => Ok(Delivery::Duplicate),
            cairn_store::Sent::NotFound => Err(Error::InstanceNotFound {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
            }),
            cairn_store::Sent::Finished(status) => Err(Error::InstanceFinished {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
                status,
            }),
        }
    }

    async fn control(
        &self,
        request: cairn_store::ControlRequest,
        action: crate::error::Action,
    ) -> Result<(), Error> {
        let outcome = crate::engine::family::control(
            &self.engine.inner,
            &self.workflow,
            &self.id,
            request.clone(),
        )
        .await?;
        // The step a refused restart named.
        let from = match request {
            ControlRequest::Restart { from, .. } => from,
            _ => None,
        };
        match outcome {
            ControlOutcome::NotFound => Err(Error::InstanceNotFound {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
            }),
            ControlOutcome::Rejected(status) => Err(Error::CannotTransition {
                action,
                id: self.id.to_string(),
                status,
            }),
            ControlOutcome::StepNotFound => Err(Error::StepNotFound {
                name: from.map(|key| key.name).unwrap_or_default(),
            }),
            ControlOutcome::Compensated(compensated) => Err(Error::RestartAfterRollback {
                name: from.map(|key| key.target()).unwrap_or_default(),
                compensated,
            }),
            ControlOutcome::NoOp(_) | ControlOutcome::Done { .. } => Ok(()),
        }
    }

    /// Pauses the instance. A running instance becomes `waitingForPause`: attempts in flight
    /// finish and are recorded, no new one starts, and then it is `paused`. A sleeping or
    /// waiting one is paused at once; its timers stop counting down. Pausing a paused
    /// instance does nothing.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_pause` for a finished instance.
    pub async fn pause(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(ControlRequest::Pause { at }, crate::error::Action::Pause)
            .await
    }

    /// Resumes a paused instance (its timers shifted by the time spent paused) or cancels a
    /// pending pause. Resuming a running instance does nothing.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_resume` for a finished instance.
    pub async fn resume(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(ControlRequest::Resume { at }, crate::error::Action::Resume)
            .await
    }

    /// Terminates the instance from any non-terminal status: attempts in flight, sleeps and
    /// waits are cancelled, and nothing more runs.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_terminate` for a finished instance.
    pub async fn terminate(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(
            ControlRequest::Terminate { at, rollback: None },
            crate::error::Action::Terminate,
        )
        .await
    }

    /// Terminates the instance after compensating it: the rollback handlers of its steps
    /// run (reverse start order, error `Terminated: Instance terminated during rollback`),
    /// then it ends `terminated`. Works from every non-terminal status, also `paused`.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_terminate` for a finished instance.
    pub async fn terminate_with_rollback(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        let trigger = cairn_core::RollbackTrigger::terminate();
        self.control(
            ControlRequest::Terminate {
                at,
                rollback: Some(trigger),
            },
            crate::error::Action::Terminate,
        )
        .await
    }

    /// Restarts the instance from scratch, from any status: its journal, log, buffered
    /// events and timers are wiped and it runs again with its original params.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`].
    pub async fn restart(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(
            ControlRequest::Restart {
                at,
                from: None,
                adopt: None,
            },
            crate::error::Action::Restart,
        )
        .await
    }

    /// Restarts the instance from a step: the `count`-th (1-based) op of `kind` named
    /// `name`, in start order. Everything started before it keeps its stored results; it and
    /// everything after run again.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; [`Error::StepNotFound`] (`instance.cannot_restart`) when
    /// the instance has no such step; [`Error::RestartAfterRollback`] (the same code) when a
    /// step started before it was compensated by the instance's rollback.
    pub async fn restart_from(
        &self,
        kind: cairn_core::StepKind,
        name: &str,
        count: u32,
    ) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        let from = cairn_core::StepKey {
            kind,
            name: name.to_owned(),
            count: count.max(1),
        };
        self.control(
            ControlRequest::Restart {
                at,
                from: Some(from),
                adopt: None,
            },
            crate::error::Action::Restart,
        )
        .await
    }

    /// Deletes the instance and everything it owns; a running lifetime stops. The id can be
    /// used again afterwards.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`].
    pub async fn delete(&self) -> Result<(), Error> {
        self.control(ControlRequest::Delete, crate::error::Action::Delete)
            .await?;
        if crate::lifetime::is_current(&self.workflow, &self.id) {
            // A workflow deleting its own instance stops at this call: its lifetime is being
            // dropped, and nothing after the call may run.
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    /// Everything about the instance: status, params, timings and its steps with their
    /// attempts, in start order. Sensitive outputs show as `[REDACTED]`.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] or a store failure.
    pub async fn details(&self) -> Result<InstanceDetails, Error> {
        let record = self.record().await?;
        let journal = self.engine.inner.env.store.journal(record.instance).await?;
        let log = self.log(0).await?;
        let children = self
            .engine
            .inner
            .env
            .store
            .children(record.instance)
            .await?;
        let position = if record.waiting_for_slot {
            self.engine
                .inner
                .env
                .store
                .slot_position(record.instance)
                .await?
        } else {
            None
        };
        Ok(InstanceDetails::build(
            &record, &journal, &log, &children, position,
        ))
    }
}

/// An instance's status from its record, its output decoded by `decode`.
fn status_from<T>(
    id: &InstanceId,
    record: InstanceRecord,
    decode: impl FnOnce(&str) -> serde_json::Result<T>,
) -> Result<Status<T>, Error> {
    let output = match (&record.output, record.status) {
        (Some(json), InstanceStatus::Complete) => Some(decode(json).map_err(|e| {
            Error::Store(cairn_store::Error::Corrupt(format!(
                "the output of instance {:?} does not decode as the expected type: {e}",
                id.as_str()
            )))
        })?),
        _ => None,
    };
    Ok(Status {
        status: record.status,
        output,
        error: record
            .error
            .filter(|_| record.status == InstanceStatus::Errored),
        rollback: record.rollback_outcome,
    })
}
