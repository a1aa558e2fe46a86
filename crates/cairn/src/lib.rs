#![doc = include_str!("../README.md")]

mod client;
mod clock;
mod config;
mod context;
mod engine;
mod env;
mod error;
mod failure;
mod hooks;
mod lifetime;
mod ops;
mod panic;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod workflow;

pub use cairn_core::json;
pub use cairn_core::rfc3339;
pub use cairn_core::{
    Backoff, ErrorInfo, EventType, InstanceId, InstanceStatus, LogEntry, LogKind, LogRecord,
    MAX_BATCH, MAX_ERROR_MESSAGE, ResolvedConfig, RetryDelay, StepKey, StepKind, StepName,
    StepRecord, StepState, Timestamp, WorkflowName, format_duration, parse_duration,
};
pub use cairn_store::{Retention, WorkflowLogPage};
pub use client::{
    AttemptDetails, BatchCreated, BatchDeleted, BatchError, CreateOptions, DETAILS_OUTPUT_LIMIT,
    Delivery, Instance, InstanceDetails, InstancePage, InstanceRetention, InstanceSummary,
    ListOptions, MAX_IDEMPOTENCY_KEY, Relative, ScheduleEntry, SlotWait, Status, StepDetails,
    StepOutput, StepSelector, UntypedWorkflow, WorkflowClient,
};
pub use clock::Clock;
pub use config::{Delay, DelayContext, DelayFn, DelayValue, Retries, StepConfig};
pub use context::{StepContext, StepId};
pub use engine::check::{ReplayFindings, ReplayReport};
pub use engine::concurrency::Concurrency;
pub use engine::leases::DEFAULT_LEASE_TTL;
pub use engine::schedules::{CatchUp, GRACE, Overlap, Schedule, ScheduleError};
pub use engine::workers::connect::{
    MAX_FRAME as MAX_WORKER_FRAME, VersionInfo, WorkerConnection, WorkerInfo, WorkerRefused,
};
pub use engine::{
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_HIBERNATE_AFTER, DEFAULT_MAX_RUNNING, DEFAULT_RETENTION, Engine,
    EngineBuilder,
};
pub use error::{Action, Error, ErrorSource};
pub use failure::{BoxError, NonRetryableError, ResultExt, StepError, WorkflowError};
pub use ops::{
    DEFAULT_EVENT_TIMEOUT, DEFAULT_STREAM_STORAGE, IntoDuration, IntoTimestamp, InvokeOp,
    MAX_SLEEP, MAX_STREAM_ITEM, Rollback, RollbackStatus, RunOp, STREAM_CHUNK, SleepOp, StepEvent,
    StepStream, StreamOp, WaitOp, WorkflowStep,
};
pub use workflow::{Workflow, WorkflowEvent};

#[cfg(feature = "postgres")]
pub use cairn_postgres as postgres;
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
