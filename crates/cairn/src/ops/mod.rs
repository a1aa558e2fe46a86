//! The durable ops a workflow calls on its [`WorkflowStep`]: `run` (with the attempt loop
//! and rollback handlers), `sleep`/`sleep_until`, `wait_for_event` and `invoke` (a child
//! workflow), and the rollback that compensates them. Ops work on one [`Lifetime`] and know nothing of the engine above.

pub(crate) mod abandoned;
pub(crate) mod attempt;
pub(crate) mod handler;
pub(crate) mod invoke;
pub(crate) mod rollback;
pub(crate) mod run;
pub(crate) mod sleep;
pub(crate) mod stream;
pub(crate) mod stream_meta;
pub(crate) mod wait;

use std::sync::Arc;

use crate::lifetime::Lifetime;

pub use handler::Rollback;
pub use invoke::InvokeOp;
pub use rollback::RollbackStatus;
pub use run::RunOp;
pub use sleep::{IntoDuration, IntoTimestamp, MAX_SLEEP, SleepOp};
pub use stream::{DEFAULT_STREAM_STORAGE, MAX_STREAM_ITEM, STREAM_CHUNK, StepStream, StreamOp};
pub use wait::{DEFAULT_EVENT_TIMEOUT, StepEvent, WaitOp};

/// The handle workflow code runs durable ops on. Cheap to clone; every clone belongs to the
/// same instance run.
#[derive(Clone)]
pub struct WorkflowStep {
    pub(crate) lifetime: Arc<Lifetime>,
    /// Where the ops register their rollback handlers.
    pub(crate) handlers: Arc<handler::Handlers>,
}

impl std::fmt::Debug for WorkflowStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowStep")
            .field("workflow", &self.lifetime.workflow)
            .field("instance", &self.lifetime.instance_id)
            .finish()
    }
}
