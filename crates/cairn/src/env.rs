//! [`Env`]: what every lifetime shares (today's store, clock and limits), below the runtime
//! so that a lifetime and its ops need nothing from the engine above them.

use std::sync::Arc;

use cairn_store::Store;

use crate::clock::Clock;

pub(crate) struct Limits {
    pub(crate) step_limit: u32,
    pub(crate) payload_limit: usize,
}

/// What every lifetime of every instance shares: the store, the clock, the limits.
pub(crate) struct Env {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Clock,
    pub(crate) limits: Limits,
}
