//! Cairn's domain model, free of IO and of any async runtime.
//!
//! Everything here is pure data and pure functions: validated ids ([`InstanceId`],
//! [`WorkflowName`], [`StepName`], [`EventType`]), Cloudflare's duration grammar
//! ([`parse_duration`]), step configuration with its defaults, merge rule and back-off
//! formula ([`ResolvedConfig`], [`Backoff`]), instance statuses ([`InstanceStatus`]), and the
//! records the journal and the event log hold ([`StepRecord`], [`LogEntry`]).
//!
//! ```
//! use std::time::Duration;
//! use cairn_core::{parse_duration, Backoff};
//!
//! let base = parse_duration("10 seconds")?;
//! assert_eq!(Backoff::Exponential.delay(base, 3), Duration::from_secs(40));
//! # Ok::<(), cairn_core::DurationError>(())
//! ```

pub mod binary;
mod config;
mod duration;
mod id;
pub mod json;
mod record;
mod rollback;
mod status;
mod time;

pub use config::{
    Backoff, ConfigError, ConfigOverrides, DEFAULT_RETRY_DELAY, DEFAULT_RETRY_LIMIT,
    DEFAULT_TIMEOUT, DYNAMIC_DELAY_MARKER, DurationSpec, MAX_RETRY_LIMIT, ResolvedConfig,
    ResolvedRetries, RetriesSpec, RetryDelay, SensitiveSpec, StepConfigSpec,
};
pub use duration::{DurationError, MAX_DURATION, format_duration, parse_duration};
pub use id::{
    EventType, IdError, InstanceId, MAX_ADDRESSABLE_ID_LEN, MAX_EVENT_TYPE_LEN,
    MAX_INSTANCE_ID_LEN, MAX_STEP_NAME_LEN, MAX_WORKFLOW_NAME_LEN, RESERVED_INSTANCE_IDS, StepName,
    WorkflowName, is_addressable_id,
};
pub use record::{
    ErrorInfo, LogEntry, LogKind, LogRecord, MAX_ERROR_MESSAGE, StepKey, StepKind, StepRecord,
    StepState, cap_message,
};
pub use rollback::{RollbackStatus, RollbackTrigger};
pub use status::InstanceStatus;
pub use time::{Timestamp, rfc3339};

/// The default limit on a step output, on params and on event payloads: 1 MiB.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1 << 20;
/// The default limit on `step.run` calls per instance.
pub const DEFAULT_STEP_LIMIT: u32 = 10_000;
/// The most instances one `create_batch` or `delete_batch` call takes.
pub const MAX_BATCH: usize = 100;
/// What every view shows instead of a sensitive step's output.
pub const REDACTED: &str = "[REDACTED]";
