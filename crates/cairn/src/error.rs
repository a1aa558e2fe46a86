//! [`Error`]: what the management API (create, get, status, …) fails with. Each variant
//! names what was wrong and has a stable [`Error::code`], the code the HTTP API returns.

use cairn_core::IdError;

/// A management action on an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// `pause`.
    Pause,
    /// `resume`.
    Resume,
    /// `terminate` (with or without rollback).
    Terminate,
    /// `restart` (from scratch or from a step).
    Restart,
    /// `delete`.
    Delete,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Terminate => "terminate",
            Action::Restart => "restart",
            Action::Delete => "delete",
        })
    }
}

/// A management call that could not be done. Nothing was changed when it is returned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An id, name or event type is invalid; the message quotes it.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// No instance with this id exists in this workflow.
    #[error("Instance {id:?} of workflow {workflow:?} does not exist")]
    InstanceNotFound {
        /// The workflow.
        workflow: String,
        /// The id looked up.
        id: String,
    },
    /// No schedule with this name was declared ([`EngineBuilder::schedule`](crate::EngineBuilder::schedule)).
    #[error("no schedule {0:?} (cairn schedules list shows them)")]
    ScheduleNotFound(String),
    /// A schedule with this name exists (declared in code or created before).
    #[error("a schedule named {0:?} exists already")]
    ScheduleExists(String),
    /// The schedule is declared in code: it can be paused and resumed, not deleted.
    #[error(
        "schedule {0:?} is declared in the engine's code: pause it, or remove it from the code (then forget its stored state: `cairn schedules delete --forget`)"
    )]
    ScheduleInCode(String),
    /// A concurrency key that is empty, longer than 100 characters or has a control
    /// character.
    #[error("invalid concurrency key {0:?} (1-100 characters, no control characters)")]
    InvalidConcurrencyKey(String),
    /// A concurrency key given for a workflow with no concurrency limit.
    #[error(
        "workflow {0:?} has no concurrency limit: set one with EngineBuilder::concurrency to use keys"
    )]
    NoConcurrencyLimit(String),
    /// The schedule is not valid (name, cron expression, time zone, policies, params).
    #[error("{0}")]
    InvalidSchedule(String),
    /// An instance with this id exists in this workflow (ids are unique for as long as the
    /// instance is retained).
    #[error("Workflow instance with id {id:?} already exists in workflow {workflow:?}")]
    AlreadyExists {
        /// The workflow.
        workflow: String,
        /// The duplicate id.
        id: String,
    },
    /// The instance has finished (complete, errored or terminated): it takes no events.
    #[error("instance {id:?} of workflow {workflow:?} is {status} and takes no more events")]
    InstanceFinished {
        /// The workflow.
        workflow: String,
        /// The instance id.
        id: String,
        /// Its terminal status.
        status: cairn_core::InstanceStatus,
    },
    /// The transition is impossible from the instance's status (e.g. terminating a finished
    /// instance).
    #[error("Cannot {action} instance {id:?} since it is {status}, a finished state")]
    CannotTransition {
        /// The action asked for.
        action: Action,
        /// The instance id.
        id: String,
        /// Its status.
        status: cairn_core::InstanceStatus,
    },
    /// A restart from a step the instance has not run.
    #[error("Step {name:?} not found in execution history")]
    StepNotFound {
        /// The step name asked for.
        name: String,
    },
    /// A restart from a step that started after one the rollback compensated: the run
    /// would go on over an effect undone. Restart from that step, or from the start.
    #[error(
        "Cannot restart from step {name:?}: step {compensated} before it was compensated by the instance's rollback; restart from {compensated} or from the beginning"
    )]
    RestartAfterRollback {
        /// The step name asked for.
        name: String,
        /// The first step before it the rollback compensated, as `name-count`.
        compensated: String,
    },
    /// A step whose output was asked for has none: it does not exist, has not succeeded,
    /// or succeeded at another attempt than the one named.
    #[error("{0}")]
    NoStepOutput(String),
    /// No workflow with this name is registered on the engine.
    #[error("no workflow named {0:?} is registered on this engine")]
    UnknownWorkflow(String),
    /// The params do not decode as the workflow's `Params` type.
    #[error("params for workflow {workflow:?} do not match its Params type: {reason}")]
    InvalidParams {
        /// The workflow.
        workflow: String,
        /// The decoding error.
        reason: String,
    },
    /// An event's payload that cannot be stored (nested deeper than a payload may be, say).
    #[error("the event payload is not serialisable: {0}")]
    InvalidEventPayload(String),
    /// A payload is larger than the configured limit.
    #[error("{what} is {size} bytes; the limit is {limit} bytes")]
    PayloadTooLarge {
        /// What was too large (e.g. "params").
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A batch with no entries.
    #[error("{0} should have at least 1 instance")]
    BatchEmpty(&'static str),
    /// A batch with more entries than allowed.
    #[error("{operation} only supports {max} instances at a time, got {len}")]
    BatchTooLarge {
        /// The operation, e.g. `batchCreate`.
        operation: &'static str,
        /// Entries given.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// An event idempotency key that is empty, too long or has control characters.
    #[error(
        "invalid idempotency key {0:?}: expected 1 to 256 characters without control characters"
    )]
    InvalidIdempotencyKey(String),
    /// A list cursor that this engine did not hand out.
    #[error("invalid cursor {0:?}: pass the cursor of the previous page as it was returned")]
    InvalidCursor(String),
    /// The database is in use by another engine (one engine per SQLite file).
    #[error("{0}")]
    DatabaseInUse(String),
    /// The engine could not be built or started as configured.
    #[error("engine configuration: {message}")]
    Config {
        /// What was wrong.
        message: String,
        /// The error underneath, when there is one (an IO or SQLite error opening the
        /// database, an invalid name).
        #[source]
        source: Option<ErrorSource>,
    },
    /// The store failed; nothing was changed.
    #[error("store: {0}")]
    Store(#[from] cairn_store::Error),
}

/// An error kept as the source of another: shared, so [`Error`] stays `Clone`; two are
/// equal when they are the same error.
#[derive(Clone)]
pub struct ErrorSource(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl ErrorSource {
    fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ErrorSource(std::sync::Arc::new(error))
    }
}

impl PartialEq for ErrorSource {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for ErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for ErrorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl Error {
    /// A configuration error with nothing underneath.
    pub(crate) fn config(message: impl Into<String>) -> Self {
        Error::Config {
            message: message.into(),
            source: None,
        }
    }

    /// A configuration error caused by `source`.
    pub(crate) fn config_from(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Config {
            message: message.into(),
            source: Some(ErrorSource::new(source)),
        }
    }

    /// The stable code of this error, e.g. `instance.not_found`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidId(e) => e.code(),
            Error::InstanceNotFound { .. } => "instance.not_found",
            Error::AlreadyExists { .. } => "instance.already_exists",
            Error::InstanceFinished { .. } => "instance.finished",
            Error::CannotTransition { action, .. } => match action {
                Action::Pause => "instance.cannot_pause",
                Action::Resume => "instance.cannot_resume",
                Action::Terminate => "instance.cannot_terminate",
                Action::Restart => "instance.cannot_restart",
                Action::Delete => "instance.cannot_delete",
            },
            Error::StepNotFound { .. } | Error::RestartAfterRollback { .. } => {
                "instance.cannot_restart"
            }
            Error::NoStepOutput(_) => "step.not_found",
            Error::UnknownWorkflow(_) => "workflow.not_found",
            Error::ScheduleNotFound(_) => "schedule.not_found",
            Error::ScheduleExists(_) => "schedule.already_exists",
            Error::ScheduleInCode(_) => "schedule.declared_in_code",
            Error::InvalidSchedule(_) => "schedule.invalid",
            Error::InvalidConcurrencyKey(_) => "concurrency.invalid_key",
            Error::NoConcurrencyLimit(_) => "concurrency.not_configured",
            Error::InvalidParams { .. } => "params.invalid",
            Error::InvalidEventPayload(_) => "event.invalid_payload",
            Error::PayloadTooLarge { .. } => "payload.too_large",
            Error::BatchEmpty(_) => "batch.empty",
            Error::BatchTooLarge { .. } => "batch.too_large",
            Error::InvalidCursor(_) => "cursor.invalid",
            Error::InvalidIdempotencyKey(_) => "event.invalid_key",
            Error::DatabaseInUse(_) => "store.in_use",
            Error::Config { .. } => "engine.config",
            Error::Store(cairn_store::Error::Unavailable(_)) => "store.unavailable",
            Error::Store(_) => "internal",
        }
    }
}
