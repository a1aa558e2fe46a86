//! [`Concurrency`]: how many instances of a workflow run at once per concurrency key, and
//! how fast they may start. The store keeps the slots (`cairn_store::Concurrency`); this is
//! the configuration a workflow is registered with.

use std::time::Duration;

/// The limits of each concurrency key of a workflow (see
/// [`EngineBuilder::concurrency`](crate::EngineBuilder::concurrency)). An instance created
/// with a key ([`CreateOptions::concurrency_key`](crate::CreateOptions::concurrency_key))
/// runs only while it holds one of the key's slots: it takes one when it starts or resumes,
/// and gives it back when it ends, is paused, or hibernates (sleeps or waits for longer than
/// the hot threshold), unless [`Concurrency::hold_while_waiting`]. Instances over the limit
/// stay `queued` and start by priority, then age, as slots free — across engines on
/// PostgreSQL too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub(crate) limit: u32,
    pub(crate) rate: Option<(u32, Duration)>,
    pub(crate) hold_while_waiting: bool,
}

impl Concurrency {
    /// At most `limit` instances of one key run at once (at least 1).
    pub fn limit(limit: u32) -> Self {
        Concurrency {
            limit: limit.max(1),
            rate: None,
            hold_while_waiting: false,
        }
    }

    /// And at most `starts` of them start (or resume) per `per`, per key.
    pub fn rate(mut self, starts: u32, per: Duration) -> Self {
        self.rate = Some((starts.max(1), per.max(Duration::from_millis(1))));
        self
    }

    /// A sleeping or waiting (hibernated) instance keeps its slot.
    pub fn hold_while_waiting(mut self) -> Self {
        self.hold_while_waiting = true;
        self
    }

    /// The store's form for an instance created with `key`.
    pub(crate) fn for_key(self, key: String) -> cairn_store::Concurrency {
        cairn_store::Concurrency {
            key,
            limit: self.limit,
            rate: self.rate,
            hold_while_waiting: self.hold_while_waiting,
        }
    }
}
