//! What the journal and the event log hold: step records, lifecycle records and errors.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// An error as Cairn stores and shows it: Cloudflare's `{name, message}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The error's class, e.g. `Error`, `NonRetryableError`, `WorkflowTimeoutError`.
    pub name: String,
    /// The human-readable message.
    pub message: String,
}

/// The longest error name or message stored: every failed attempt stores one, so an
/// unbounded message (a whole response body, a huge debug dump) would grow the journal and
/// log without limit. Longer ones are cut at a character boundary and marked.
pub const MAX_ERROR_MESSAGE: usize = 8 * 1024;

/// `text` cut to at most [`MAX_ERROR_MESSAGE`] bytes plus a marker saying how much was cut.
pub fn cap_message(text: impl Into<String>) -> String {
    let mut text = text.into();
    if text.len() > MAX_ERROR_MESSAGE {
        let mut end = MAX_ERROR_MESSAGE;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let cut = text.len() - end;
        text.truncate(end);
        text.push_str(&format!("… [{cut} more bytes truncated]"));
    }
    text
}

impl ErrorInfo {
    /// Builds an error record; the name and message are capped at [`MAX_ERROR_MESSAGE`].
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorInfo {
            name: cap_message(name),
            message: cap_message(message),
        }
    }
}

impl fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}: {}", self.name, self.message)
        }
    }
}

/// The kind of a durable op. Each kind has its own name counters (SPEC §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    /// `step.run` (Cloudflare's `step.do`), named `step` as in Cloudflare's instance details.
    #[serde(rename = "step", alias = "do", alias = "run")]
    Run,
    /// `step.sleep` and `step.sleep_until`.
    Sleep,
    /// `step.wait_for_event`.
    #[serde(alias = "wait_for_event")]
    WaitForEvent,
    /// The rollback (saga compensation) of the `run` step with the same name and count.
    Rollback,
    /// `step.invoke`: a child workflow instance started by this step and awaited.
    Invoke,
}

impl StepKind {
    /// Stored code.
    pub fn code(self) -> i64 {
        match self {
            StepKind::Run => 0,
            StepKind::Sleep => 1,
            StepKind::WaitForEvent => 2,
            StepKind::Rollback => 3,
            StepKind::Invoke => 4,
        }
    }

    /// The kind with stored code `code`.
    pub fn from_code(code: i64) -> Option<Self> {
        [
            StepKind::Run,
            StepKind::Sleep,
            StepKind::WaitForEvent,
            StepKind::Rollback,
            StepKind::Invoke,
        ]
        .into_iter()
        .find(|k| k.code() == code)
    }

    /// The kind named `name`: Cloudflare's names (`step`, `sleep`, `waitForEvent`) or their
    /// aliases (`do` and `run`, `wait_for_event`), everywhere a user names a step's type.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "step" | "do" | "run" => Some(StepKind::Run),
            "sleep" => Some(StepKind::Sleep),
            "waitForEvent" | "wait_for_event" => Some(StepKind::WaitForEvent),
            "invoke" => Some(StepKind::Invoke),
            _ => None,
        }
    }

    /// The names [`StepKind::parse`] takes, for error messages.
    pub const NAMES: &'static str =
        "step, sleep, waitForEvent or invoke (also do, run, wait_for_event)";

    /// Cloudflare's name: `step`, `sleep`, `waitForEvent` (and Cairn's `rollback`, `invoke`).
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Run => "step",
            StepKind::Sleep => "sleep",
            StepKind::WaitForEvent => "waitForEvent",
            StepKind::Rollback => "rollback",
            StepKind::Invoke => "invoke",
        }
    }
}

/// A step's identity within an instance: `(kind, name, count)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepKey {
    /// The op kind.
    pub kind: StepKind,
    /// The step name.
    pub name: String,
    /// 1-based occurrence of `name` among ops of `kind` in this run.
    pub count: u32,
}

impl StepKey {
    /// Cloudflare's log target, `"<name>-<count>"`.
    pub fn target(&self) -> String {
        format!("{}-{}", self.name, self.count)
    }
}

/// Where a step is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    /// Started, no final outcome yet.
    Running,
    /// Finished with an output.
    Succeeded,
    /// Finished with a final error.
    Failed,
    /// Dropped by the workflow while an attempt ran (the losing branch of a `select!`):
    /// final, and on replay the op never completes, so the race goes the same way again.
    Cancelled,
}

impl StepState {
    /// Stored code.
    pub fn code(self) -> i64 {
        match self {
            StepState::Running => 0,
            StepState::Succeeded => 1,
            StepState::Failed => 2,
            StepState::Cancelled => 3,
        }
    }

    /// The state with stored code `code`.
    pub fn from_code(code: i64) -> Option<Self> {
        [
            StepState::Running,
            StepState::Succeeded,
            StepState::Failed,
            StepState::Cancelled,
        ]
        .into_iter()
        .find(|s| s.code() == code)
    }
}

/// One journal entry: everything replay needs to know about a step, plus what the details
/// view shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Identity.
    pub key: StepKey,
    /// Start order within the instance (1-based): the order of rollbacks and of the details view.
    pub seq: u32,
    /// Where the step is.
    pub state: StepState,
    /// The resolved config, persisted on the first execution (see `ResolvedConfig::to_persisted_json`).
    /// Shared, not copied: a step's record is cloned for each of its writes, and a
    /// workflow's steps mostly share one config.
    pub config: std::sync::Arc<serde_json::Value>,
    /// Attempts started so far.
    pub attempts: u32,
    /// Whether the latest attempt started and has no recorded outcome. Found true on load,
    /// it means the process running it died: the attempt is recorded as failed.
    pub in_flight: bool,
    /// When the next attempt (or a sleep) is due.
    pub wake_at: Option<Timestamp>,
    /// The output as JSON text, when succeeded.
    pub output: Option<String>,
    /// The final error, when failed.
    pub error: Option<ErrorInfo>,
    /// When the first attempt started.
    pub started_at: Timestamp,
    /// When the final outcome was recorded.
    pub ended_at: Option<Timestamp>,
    /// Whether the step registered a rollback handler.
    pub has_rollback: bool,
}

macro_rules! log_kinds {
    ($($variant:ident = $code:literal, $name:literal;)*) => {
        /// A lifecycle record kind, with Cloudflare's numeric codes (SPEC §6.1).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        #[allow(missing_docs)] // each variant is the record of the same name in SPEC §6.1
        pub enum LogKind { $($variant,)* }

        impl LogKind {
            /// Every kind.
            pub const ALL: &'static [LogKind] = &[$(LogKind::$variant,)*];

            /// Cloudflare's numeric code, also the stored form.
            pub fn code(self) -> i64 {
                match self { $(LogKind::$variant => $code,)* }
            }

            /// The kind with code `code`.
            pub fn from_code(code: i64) -> Option<Self> {
                match code { $($code => Some(LogKind::$variant),)* _ => None }
            }

            /// The record's name, e.g. `STEP_START`.
            pub fn as_str(self) -> &'static str {
                match self { $(LogKind::$variant => $name,)* }
            }
        }
    };
}

log_kinds! {
    WorkflowQueued = 0, "WORKFLOW_QUEUED";
    WorkflowStart = 1, "WORKFLOW_START";
    WorkflowSuccess = 2, "WORKFLOW_SUCCESS";
    WorkflowFailure = 3, "WORKFLOW_FAILURE";
    WorkflowTerminated = 4, "WORKFLOW_TERMINATED";
    StepStart = 5, "STEP_START";
    StepSuccess = 6, "STEP_SUCCESS";
    StepFailure = 7, "STEP_FAILURE";
    SleepStart = 8, "SLEEP_START";
    SleepComplete = 9, "SLEEP_COMPLETE";
    AttemptStart = 10, "ATTEMPT_START";
    AttemptSuccess = 11, "ATTEMPT_SUCCESS";
    AttemptFailure = 12, "ATTEMPT_FAILURE";
    WaitStart = 14, "WAIT_START";
    WaitComplete = 15, "WAIT_COMPLETE";
    WaitTimedOut = 16, "WAIT_TIMED_OUT";
    RollbackStart = 17, "ROLLBACK_START";
    RollbackStepStart = 18, "ROLLBACK_STEP_START";
    RollbackAttemptStart = 19, "ROLLBACK_ATTEMPT_START";
    RollbackAttemptSuccess = 20, "ROLLBACK_ATTEMPT_SUCCESS";
    RollbackAttemptFailure = 21, "ROLLBACK_ATTEMPT_FAILURE";
    RollbackStepSuccess = 22, "ROLLBACK_STEP_SUCCESS";
    RollbackStepFailure = 23, "ROLLBACK_STEP_FAILURE";
    RollbackComplete = 24, "ROLLBACK_COMPLETE";
    RollbackFailed = 25, "ROLLBACK_FAILED";
    WorkflowPaused = 100, "WORKFLOW_PAUSED";
    WorkflowResumed = 101, "WORKFLOW_RESUMED";
    WorkflowWaiting = 102, "WORKFLOW_WAITING";
    ChildStart = 103, "CHILD_START";
    ChildComplete = 104, "CHILD_COMPLETE";
    ChildFailure = 105, "CHILD_FAILURE";
}

impl fmt::Display for LogKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lifecycle record to append to an instance's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    /// What happened.
    pub kind: LogKind,
    /// When (RFC 3339 in JSON).
    #[serde(with = "crate::time::rfc3339")]
    pub at: Timestamp,
    /// The step it concerns, if any.
    pub step: Option<StepKey>,
    /// The record's metadata (SPEC §6.1), e.g. `{attempt, error, retryDelayMs}`.
    pub meta: serde_json::Value,
}

/// A stored lifecycle record with its monotonic id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Monotonic across the whole store: a record with a larger id was committed later.
    pub id: u64,
    /// The record.
    #[serde(flatten)]
    pub entry: LogEntry,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_capped_with_a_marker() {
        let short = ErrorInfo::new("Error", "boom");
        assert_eq!(short.message, "boom");
        let long = ErrorInfo::new("Error", "é".repeat(10_000));
        assert!(
            long.message.len() < MAX_ERROR_MESSAGE + 64,
            "{}",
            long.message.len()
        );
        assert!(
            long.message.ends_with("… [11808 more bytes truncated]"),
            "{}",
            &long.message[8000..]
        );
        assert!(long.message.starts_with("éé"));
    }

    #[test]
    fn log_kind_codes_round_trip() {
        for kind in LogKind::ALL {
            assert_eq!(LogKind::from_code(kind.code()), Some(*kind));
        }
        assert_eq!(LogKind::AttemptFailure.code(), 12);
        assert_eq!(LogKind::RollbackFailed.code(), 25);
        assert_eq!(
            serde_json::to_value(LogKind::StepStart).expect("ser"),
            "STEP_START"
        );
    }

    #[test]
    fn step_key_target() {
        let key = StepKey {
            kind: StepKind::Run,
            name: "charge".into(),
            count: 2,
        };
        assert_eq!(key.target(), "charge-2");
        assert_eq!(serde_json::to_value(StepKind::Run).expect("ser"), "step");
        for alias in ["\"do\"", "\"run\"", "\"step\""] {
            assert_eq!(
                serde_json::from_str::<StepKind>(alias).ok(),
                Some(StepKind::Run)
            );
        }
        assert_eq!(
            serde_json::from_str::<StepKind>("\"wait_for_event\"").ok(),
            Some(StepKind::WaitForEvent)
        );
    }
}
