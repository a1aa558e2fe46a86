//! [`Env`]: what every lifetime shares (today's store, clock and limits), below the runtime
//! so that a lifetime and its ops need nothing from the engine above them.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use cairn_core::WorkflowName;

use cairn_store::{Retention, Store};

use crate::clock::Clock;

pub(crate) struct Limits {
    pub(crate) step_limit: u32,
    pub(crate) payload_limit: usize,
    /// The most bytes an instance's stream outputs may hold together.
    pub(crate) stream_storage: u64,
}

/// What every lifetime of every instance shares: the store, the clock, the limits, and
/// how long the engine's leases hold.
pub(crate) struct Env {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Clock,
    pub(crate) limits: Limits,
    pub(crate) leases: Leases,
    /// The last hour's counts for the dashboard's charts.
    pub(crate) activity: crate::telemetry::Activity,
    /// The workflows this engine runs, with their retention (defaults applied): what a
    /// new instance (created by a client or by a parent's `invoke`) is kept for.
    pub(crate) retention: HashMap<WorkflowName, Retention>,
    /// Wakes the scheduler: an instance became runnable (a child created by a parent's
    /// commit, say) or a slot freed up.
    pub(crate) wake: tokio::sync::Notify,
    /// A test's mocks and observers (`cairn::testing`); `None` in every other engine.
    pub(crate) hooks: Option<Arc<crate::hooks::Hooks>>,
    /// The workflows workers run (`docs/worker-protocol.md`), as the store knows them.
    pub(crate) remote: RemoteWorkflows,
}

/// Where a new instance of a workflow goes: what it is kept for, and the version of its
/// code it is pinned to (a workflow run by workers; `None` for one in Rust).
pub(crate) struct Target {
    pub(crate) retention: Retention,
    pub(crate) version: Option<String>,
}

/// The workflows workers have registered, each with its versions oldest first (the newest
/// is the one registered last): read from the store at start and after each registration,
/// so creates and invokes know them while no worker is connected.
pub(crate) struct RemoteWorkflows {
    versions: std::sync::RwLock<HashMap<WorkflowName, Vec<String>>>,
    /// What their instances are kept for (the engine's default retention).
    pub(crate) retention: Retention,
}

impl RemoteWorkflows {
    pub(crate) fn new(retention: Retention) -> Self {
        RemoteWorkflows {
            versions: std::sync::RwLock::default(),
            retention,
        }
    }

    /// Replaces what is known with the store's registrations, oldest first.
    pub(crate) fn load(&self, registered: Vec<cairn_store::WorkflowVersion>) {
        let mut versions: HashMap<WorkflowName, Vec<String>> = HashMap::new();
        for v in registered {
            versions.entry(v.workflow).or_default().push(v.version);
        }
        *self
            .versions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = versions;
    }

    /// The newest version of `workflow`, if workers run it.
    pub(crate) fn newest(&self, workflow: &WorkflowName) -> Option<String> {
        self.versions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(workflow)
            .and_then(|v| v.last().cloned())
    }

    /// Whether workers have registered `workflow`.
    pub(crate) fn knows(&self, workflow: &WorkflowName) -> bool {
        self.versions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(workflow)
    }

    /// Every workflow workers have registered, by name.
    pub(crate) fn names(&self) -> Vec<WorkflowName> {
        let mut names: Vec<WorkflowName> = self
            .versions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }
}

impl Env {
    /// Where a new instance of `workflow` goes, or `None` when this engine knows no such
    /// workflow (neither registered in Rust nor by a worker).
    pub(crate) fn target(&self, workflow: &WorkflowName) -> Option<Target> {
        if let Some(retention) = self.retention.get(workflow) {
            return Some(Target {
                retention: *retention,
                version: None,
            });
        }
        let version = self.remote.newest(workflow)?;
        Some(Target {
            retention: self.remote.retention,
            version: Some(version),
        })
    }

    /// Now, and where [`crate::telemetry`] counts it per minute.
    pub(crate) fn seen(&self) -> crate::telemetry::Seen<'_> {
        (&self.activity, self.clock.now())
    }

    /// For a unit test: a SQLite store in `dir`, the system clock, small limits, leases
    /// that never expire, and no workflows.
    #[cfg(test)]
    pub(crate) fn for_tests(dir: &std::path::Path) -> Arc<Env> {
        let store = cairn_sqlite::SqliteStore::open(dir.join("db"), Default::default()).unwrap();
        Arc::new(Env {
            store: Arc::new(store),
            clock: Clock::system(),
            limits: Limits {
                step_limit: 10,
                payload_limit: 1024,
                stream_storage: 1 << 20,
            },
            leases: Leases::new(UNBOUNDED_LEASE),
            activity: crate::telemetry::Activity::default(),
            retention: HashMap::new(),
            wake: tokio::sync::Notify::new(),
            hooks: None,
            remote: RemoteWorkflows::new(Retention {
                success: Duration::MAX,
                error: Duration::MAX,
            }),
        })
    }
}

/// How long this engine's leases hold: for the TTL from a lease's claim or its last
/// renewal (each lifetime keeps its own, `Lifetime::lease_until`). A lifetime writes only
/// while its lease holds, less a margin ([`Leases::usable`]); past that it must assume
/// another engine owns the instance (`engine/leases.rs`).
pub(crate) struct Leases {
    ttl: Duration,
}

/// A lease that never runs out in practice: one engine per store (SQLite).
pub(crate) const UNBOUNDED_LEASE: Duration = Duration::from_secs(100 * 365 * 86_400);

impl Leases {
    pub(crate) fn new(ttl: Duration) -> Self {
        Leases { ttl }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether leases expire (several engines may share the store).
    pub(crate) fn expire(&self) -> bool {
        self.ttl < UNBOUNDED_LEASE
    }

    /// How long after its claim or renewal a lease may still be written under: the TTL
    /// less a tenth, so a write sent just before the end still lands before another engine
    /// may claim.
    pub(crate) fn usable(&self) -> Duration {
        self.ttl - self.ttl / 10
    }
}
