//! A sleep or an event wait the workflow stopped awaiting (it lost a `select!`) is recorded
//! as cancelled, as a step is (`Execution`'s `Drop`). Left as it was, started and never
//! finished, a replay would finish it: a sleep once its wake time has passed, a wait once
//! an event of its type is buffered. The race it lost would then go the other way, and the
//! replay take a branch the run never took.

use std::sync::Arc;

use cairn_core::{ErrorInfo, LogKind, StepRecord, StepState};
use serde_json::json;

use crate::lifetime::Lifetime;

/// Armed while a started sleep or wait is awaited; [`Waiting::finished`] once it has an
/// outcome. Dropped armed, it queues the op's cancel for the lifetime's next commit.
/// Conditional in the store (`Write::Cancel`): an outcome that landed first stands. A
/// lifetime that ends makes no further commit, so the ops it drops as it ends (hibernating,
/// pausing, shutting down) stay as they are.
pub(crate) struct Waiting {
    state: Arc<Lifetime>,
    record: Option<StepRecord>,
    /// The record that ends the op in the log: `SLEEP_COMPLETE` or `WAIT_COMPLETE`, marked
    /// `cancelled`.
    ends_with: LogKind,
}

impl Waiting {
    pub(crate) fn new(state: &Arc<Lifetime>, record: &StepRecord, ends_with: LogKind) -> Self {
        Waiting {
            state: Arc::clone(state),
            record: Some(record.clone()),
            ends_with,
        }
    }

    /// The op has its outcome (or is about to commit it): nothing to cancel.
    pub(crate) fn finished(mut self) {
        self.record = None;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        let state = &self.state;
        let key = record.key.clone();
        let error = ErrorInfo::new(
            crate::failure::CANCELLED,
            format!(
                "The workflow stopped awaiting {} {} (for example, it lost a select!).",
                if self.ends_with == LogKind::SleepComplete {
                    "sleep"
                } else {
                    "wait"
                },
                key.target()
            ),
        );
        record.state = StepState::Cancelled;
        record.wake_at = None;
        record.ended_at = Some(state.now());
        let records = vec![state.log_entry(
            self.ends_with,
            Some(&key),
            json!({ "error": error, "cancelled": true }),
        )];
        record.error = Some(error);
        state.defer(vec![cairn_store::Write::Cancel {
            step: record,
            records,
        }]);
        if self.ends_with == LogKind::WaitComplete {
            // A take of this wait's may have landed: its cancel puts the event back. Another
            // wait for the type looks again, and its take commits the cancel first.
            state.events.notify_waiters();
        }
    }
}
