//! [`Runtime`]: the running engine's shared state, what the scheduler, the drivers and the
//! management client reach: the store environment, the registered workflows, the live set
//! of lifetimes in memory, and the signals between them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::WorkflowName;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::env::Env;
use crate::workflow::ErasedWorkflow;

pub(crate) struct Runtime {
    pub(crate) env: Arc<Env>,
    /// Instances with a lifetime in memory now (hibernated ones are not here).
    pub(crate) live: crate::engine::live::Live,
    /// Engine panics in a row, by instance: the retry waits longer after each.
    pub(crate) panics: Mutex<HashMap<cairn_store::InstanceRef, u32>>,
    /// Waits longer than this hibernate the instance.
    pub(crate) hibernate_after: Duration,
    /// How long shutdown waits for attempts in flight to finish.
    pub(crate) drain_timeout: Duration,
    pub(crate) workflows: HashMap<WorkflowName, Arc<dyn ErasedWorkflow>>,
    /// The concurrency limits of the workflows that have them.
    pub(crate) concurrency: HashMap<WorkflowName, crate::engine::concurrency::Concurrency>,
    pub(crate) names: Vec<WorkflowName>,
    /// The workers connected, running the workflows registered by them.
    pub(crate) workers: Arc<crate::engine::workers::Workers>,
    /// Claims and runs instances (not an engine opened only to check them).
    pub(crate) claims: bool,
    pub(crate) owner: String,
    pub(crate) max_running: usize,
    /// Renews the leases now rather than at the next tick (`leases.rs`): notices may have
    /// been lost, among them a stop of a lifetime running here.
    pub(crate) renew_now: tokio::sync::Notify,
    /// Bumped whenever an instance's status may have changed.
    pub(crate) changes: watch::Sender<u64>,
    /// Bumped after every successful store write, per instance and workflow (`announce.rs`).
    pub(crate) commits: Arc<crate::engine::announce::Commits>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// When the gauges were last read from the store; held while they are read.
    pub(crate) gauges_refreshed: tokio::sync::Mutex<Option<std::time::Instant>>,
    pub(crate) scheduler: Mutex<Option<JoinHandle<()>>>,
    /// The cron schedules declared, and their tasks until shutdown.
    pub(crate) schedules: Vec<Arc<crate::engine::schedules::Schedule>>,
    /// The shortest time between two ticks a schedule may have.
    pub(crate) min_schedule_interval: std::time::Duration,
    /// The schedules ticking now (declared in code or stored), by name, until shutdown.
    pub(crate) schedule_tasks: Mutex<HashMap<String, Ticking>>,
    /// Held while the schedules ticking are brought in line with the store's.
    pub(crate) schedules_sync: tokio::sync::Mutex<()>,
    pub(crate) _temp_dir: Option<tempfile::TempDir>,
}

/// A schedule whose runner task is running.
pub(crate) struct Ticking {
    /// What it runs with: a change (a new definition, a resume) restarts the task.
    pub(crate) version: String,
    pub(crate) task: JoinHandle<()>,
}

impl Runtime {
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The status of `instance` may have changed.
    pub(crate) fn status_changed(&self, instance: cairn_store::InstanceRef) {
        self.commits.statuses.bump(&instance);
        self.changed();
    }

    /// The status of any instance may have changed (a purge, lost notices).
    pub(crate) fn statuses_changed(&self) {
        self.commits.statuses.bump_all();
        self.changed();
    }

    pub(crate) fn panics(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<cairn_store::InstanceRef, u32>> {
        self.panics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tells a running lifetime of `instance` that an event arrived, and the scheduler that
    /// a hibernating one may have become ready.
    pub(crate) fn event_sent(&self, instance: cairn_store::InstanceRef) {
        if let Some(state) = self.live.get(instance) {
            state.events.notify_waiters();
        }
        self.env.wake.notify_one();
    }
}
