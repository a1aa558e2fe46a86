#![doc = include_str!("../README.md")]

mod announce;
mod client;
mod clock;
mod config;
mod details;
mod driver;
mod engine;
mod error;
mod event;
mod failure;
mod gate;
mod panic;
mod replay;
mod rollback;
mod sleep;
mod step;
mod workflow;

pub use cairn_core::json;
pub use cairn_core::{
    Backoff, ErrorInfo, EventType, InstanceId, InstanceStatus, LogEntry, LogKind, LogRecord,
    MAX_BATCH, MAX_ERROR_MESSAGE, ResolvedConfig, RetryDelay, StepKey, StepKind, StepName,
    StepRecord, StepState, Timestamp, WorkflowName, format_duration, parse_duration,
};
pub use cairn_store::Retention;
pub use client::{
    BatchCreated, BatchDeleted, BatchError, CreateOptions, Delivery, Instance, InstancePage,
    InstanceRetention, MAX_IDEMPOTENCY_KEY, Status, UntypedWorkflow, WorkflowClient,
};
pub use clock::Clock;
pub use config::{Delay, DelayContext, DelayFn, DelayValue, Retries, StepConfig};
pub use details::{AttemptDetails, InstanceDetails, StepDetails};
pub use engine::{
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_HIBERNATE_AFTER, DEFAULT_MAX_RUNNING, DEFAULT_RETENTION, Engine,
    EngineBuilder,
};
pub use error::Error;
pub use event::{DEFAULT_EVENT_TIMEOUT, StepEvent, WaitOp};
pub use failure::{BoxError, NonRetryableError, ResultExt, StepError, WorkflowError};
pub use rollback::{Rollback, RollbackStatus};
pub use sleep::{IntoDuration, IntoTimestamp, MAX_SLEEP, SleepOp};
pub use step::{RunOp, StepContext, StepId, WorkflowStep};
pub use workflow::{Workflow, WorkflowEvent};

#[cfg(feature = "sqlite")]
pub use cairn_sqlite as sqlite;
/// Re-exported so users need not depend on it.
pub use cairn_store as store;

/// Everything a workflow author needs, in one import.
pub mod prelude {
    pub use crate::{
        Backoff, CreateOptions, Delay, DelayContext, Engine, InstanceStatus, NonRetryableError,
        ResultExt, Retries, Rollback, StepConfig, StepContext, StepError, StepEvent, Workflow,
        WorkflowError, WorkflowEvent, WorkflowStep,
    };
    pub use serde::{Deserialize, Serialize};
    pub use std::time::Duration;
}

/// The repository README's example, compiled as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;
