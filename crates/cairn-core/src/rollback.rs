//! What the store keeps about a saga rollback: what triggered it, and how it ended.

use serde::{Deserialize, Serialize};

use crate::record::ErrorInfo;

/// Why an instance is being rolled back, stored when the rollback begins so that a crash,
/// pause or hibernation in the middle of it resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackTrigger {
    /// The error that escaped `run` (or a termination's).
    pub error: ErrorInfo,
    /// A terminate with rollback: the instance ends `terminated`, not `errored`.
    #[serde(default)]
    pub terminate: bool,
    /// `ROLLBACK_START` has been recorded.
    #[serde(default)]
    pub started: bool,
}

impl RollbackTrigger {
    /// The trigger of `terminate_with_rollback`.
    pub fn terminate() -> Self {
        RollbackTrigger {
            error: ErrorInfo::new("Terminated", "Instance terminated during rollback"),
            terminate: true,
            started: false,
        }
    }

    /// The trigger of a workflow that failed with `error`.
    pub fn error(error: ErrorInfo) -> Self {
        RollbackTrigger {
            error,
            terminate: false,
            started: false,
        }
    }
}

/// How a rollback ended, as `status()` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackStatus {
    /// `completed` or `failed`.
    pub outcome: String,
    /// The handler error that stopped the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}
