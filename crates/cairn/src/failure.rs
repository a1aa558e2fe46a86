//! How workflow code fails: [`StepError`] from step bodies, [`NonRetryableError`] to stop
//! retries, and [`WorkflowError`], the error `run` and every step op return.
//!
//! The conversions follow one rule: `?` on any ordinary error means "retryable", and only
//! an explicit [`NonRetryableError`] (or [`ResultExt::non_retryable`]) stops retries. That is
//! why neither [`NonRetryableError`], [`StepError`] nor [`WorkflowError`] implements
//! `std::error::Error`: each has a blanket `From<E: Into<BoxError>>`, which would otherwise
//! overlap with its own identity conversion.

use std::fmt;

use cairn_core::ErrorInfo;

/// Any error a step body or a workflow can raise.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The `name` of an ordinary error.
pub(crate) const ERROR: &str = "Error";
/// The `name` of a non-retryable error.
pub(crate) const NON_RETRYABLE: &str = "NonRetryableError";
/// The `name` of a timeout.
pub(crate) const TIMEOUT: &str = "WorkflowTimeoutError";
/// The `name` of an engine-side failure of a step.
pub(crate) const INTERNAL: &str = "WorkflowInternalError";
/// The message of an attempt whose lifetime died before recording its outcome.
pub(crate) const INTERRUPTED: &str = "Attempt failed due to internal workflows error";
/// The `name` of a failed delay function.
pub(crate) const DELAY_FAILED: &str = "NonRetryableDelayError";
/// A step the workflow stopped awaiting while an attempt ran (it lost a `select!`).
pub(crate) const CANCELLED: &str = "StepCancelled";
/// The `name` of an `invoke` whose child was terminated.
pub(crate) const CHILD_TERMINATED: &str = "ChildTerminatedError";
/// The `name` of an `invoke` whose child was deleted before it finished.
pub(crate) const CHILD_DELETED: &str = "ChildDeletedError";

/// An error that stops retries at once: the step fails after this attempt.
///
/// ```
/// use cairn::NonRetryableError;
/// let e = NonRetryableError::new("card declined");
/// assert_eq!(e.to_string(), "NonRetryableError: card declined");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonRetryableError {
    name: String,
    message: String,
}

impl NonRetryableError {
    /// A non-retryable error with Cloudflare's default name, `NonRetryableError`.
    pub fn new(message: impl Into<String>) -> Self {
        NonRetryableError {
            name: NON_RETRYABLE.into(),
            message: strip_prefix(message.into()),
        }
    }

    /// A non-retryable error with a custom name.
    pub fn with_name(name: impl Into<String>, message: impl Into<String>) -> Self {
        NonRetryableError {
            name: name.into(),
            message: strip_prefix(message.into()),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A leading `"NonRetryableError: "` is redundant with the name (SPEC §1.9).
fn strip_prefix(message: String) -> String {
    match message.strip_prefix("NonRetryableError:") {
        Some(rest) => rest.trim_start().to_owned(),
        None => message,
    }
}

impl fmt::Display for NonRetryableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&ErrorInfo::new(&self.name, &self.message), f)
    }
}

/// Turns any `Result` into one whose error stops retries.
pub trait ResultExt<T> {
    /// Maps the error to a [`NonRetryableError`] with its message.
    ///
    /// # Errors
    /// The original error, as non-retryable.
    fn non_retryable(self) -> Result<T, NonRetryableError>;
}

impl<T, E: fmt::Display> ResultExt<T> for Result<T, E> {
    fn non_retryable(self) -> Result<T, NonRetryableError> {
        self.map_err(|e| NonRetryableError::new(e.to_string()))
    }
}

/// What a step body returns on failure. Built from any error with `?` (retryable) or from
/// a [`NonRetryableError`] (not retried).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub(crate) info: ErrorInfo,
    pub(crate) retryable: bool,
}

impl StepError {
    /// A retryable error with Cloudflare's default name, `Error`.
    pub fn retryable(message: impl Into<String>) -> Self {
        StepError {
            info: ErrorInfo::new(ERROR, message),
            retryable: true,
        }
    }

    /// Whether the engine will retry after this error (if the limit allows).
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The stored `{name, message}`.
    pub fn info(&self) -> &ErrorInfo {
        &self.info
    }
}

impl<E: Into<BoxError>> From<E> for StepError {
    fn from(e: E) -> Self {
        StepError::retryable(e.into().to_string())
    }
}

impl From<NonRetryableError> for StepError {
    fn from(e: NonRetryableError) -> Self {
        StepError {
            info: ErrorInfo::new(e.name, e.message),
            retryable: false,
        }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.info, f)
    }
}

/// The error a workflow's `run` returns, and what a failed step op returns to workflow code.
///
/// It is `{name, message}`, exactly what the instance's status shows when it escapes `run`.
/// Catch it to continue (the step's failure stays cached), or propagate it with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowError {
    info: ErrorInfo,
}

impl WorkflowError {
    /// An error with a name and a message.
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        WorkflowError {
            info: ErrorInfo::new(name, message),
        }
    }

    /// The error from a stored `{name, message}`.
    pub fn from_info(info: ErrorInfo) -> Self {
        WorkflowError { info }
    }

    /// The error's name, e.g. `Error`, `NonRetryableError`, `WorkflowTimeoutError`.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The error's message.
    pub fn message(&self) -> &str {
        &self.info.message
    }

    /// Whether this is a non-retryable error.
    pub fn is_non_retryable(&self) -> bool {
        self.info.name == NON_RETRYABLE
    }

    /// The stored `{name, message}`.
    pub fn info(&self) -> &ErrorInfo {
        &self.info
    }

    /// Consumes the error into its `{name, message}`.
    pub fn into_info(self) -> ErrorInfo {
        self.info
    }
}

impl<E: Into<BoxError>> From<E> for WorkflowError {
    fn from(e: E) -> Self {
        WorkflowError::new(ERROR, e.into().to_string())
    }
}

impl From<NonRetryableError> for WorkflowError {
    fn from(e: NonRetryableError) -> Self {
        WorkflowError::new(e.name, e.message)
    }
}

impl From<StepError> for WorkflowError {
    fn from(e: StepError) -> Self {
        WorkflowError { info: e.info }
    }
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.info, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> Result<(), std::io::Error> {
        Err(std::io::Error::other("disk on fire"))
    }

    #[test]
    fn question_mark_is_retryable() {
        let f = || -> Result<(), StepError> {
            io()?;
            Ok(())
        };
        let e = f().expect_err("fails");
        assert!(e.is_retryable());
        assert_eq!(e.info(), &ErrorInfo::new("Error", "disk on fire"));
    }

    #[test]
    fn non_retryable_keeps_its_name_and_strips_the_prefix() {
        let f = || -> Result<(), StepError> {
            io().non_retryable()?;
            Ok(())
        };
        let e = f().expect_err("fails");
        assert!(!e.is_retryable());
        assert_eq!(e.info().name, "NonRetryableError");
        let e = NonRetryableError::new("NonRetryableError: already said");
        assert_eq!(e.message(), "already said");
        let w: WorkflowError = NonRetryableError::new("").into();
        assert!(w.is_non_retryable());
        assert_eq!(w.message(), "");
    }

    #[test]
    fn strings_convert() {
        let w: WorkflowError = "plain".into();
        assert_eq!(w.info(), &ErrorInfo::new("Error", "plain"));
        let s: StepError = String::from("owned").into();
        assert_eq!(s.info().message, "owned");
    }
}
