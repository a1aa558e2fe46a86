//! The [`Engine`]: the registry of workflows, the scheduler that claims runnable instances
//! up to the concurrency limit, and the drivers that run them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::{DEFAULT_PAYLOAD_LIMIT, DEFAULT_STEP_LIMIT, WorkflowName};
use cairn_store::{Retention, Store};
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::clock::Clock;
use crate::error::Error;
use crate::workflow::{ErasedWorkflow, Registered, Workflow};

/// The default limit on concurrently running instances.
pub const DEFAULT_MAX_RUNNING: usize = 1_000;

/// Leases never expire: the store has exactly one engine (SQLite, guarded by its lock file).
const UNBOUNDED_LEASE: Duration = Duration::from_secs(100 * 365 * 86_400);

pub(crate) struct Limits {
    pub(crate) step_limit: u32,
    pub(crate) payload_limit: usize,
}

/// What every run of every instance shares.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Clock,
    pub(crate) limits: Limits,
}

pub(crate) struct EngineInner {
    pub(crate) shared: Arc<Shared>,
    /// Instances with a lifetime in memory now (hibernated ones are not here).
    live: Mutex<HashMap<cairn_store::InstanceRef, Arc<crate::replay::RunState>>>,
    /// Engine panics in a row, by instance: the retry waits longer after each.
    panics: Mutex<HashMap<cairn_store::InstanceRef, u32>>,
    /// Waits longer than this hibernate the instance.
    pub(crate) hibernate_after: Duration,
    /// How long shutdown waits for attempts in flight to finish.
    drain_timeout: Duration,
    /// Retention by workflow, defaults applied.
    pub(crate) retention: HashMap<WorkflowName, Retention>,
    pub(crate) workflows: HashMap<WorkflowName, Arc<dyn ErasedWorkflow>>,
    names: Vec<WorkflowName>,
    owner: String,
    max_running: usize,
    /// Wakes the scheduler: an instance became runnable or a slot freed up.
    pub(crate) wake: Notify,
    /// Bumped whenever an instance's status may have changed; status waiters watch it.
    pub(crate) changes: watch::Sender<u64>,
    /// Bumped after every successful store write, per instance and workflow (`announce.rs`).
    pub(crate) commits: Arc<crate::announce::Commits>,
    pub(crate) shutdown: watch::Sender<bool>,
    scheduler: Mutex<Option<JoinHandle<()>>>,
    _temp_dir: Option<tempfile::TempDir>,
}

impl EngineInner {
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(crate) fn live(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<cairn_store::InstanceRef, Arc<crate::replay::RunState>>>
    {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        if let Some(state) = self.live().get(&instance) {
            state.events.notify_waiters();
        }
        self.wake.notify_one();
    }
}

/// A running Cairn engine. Cheap to clone; all clones are the same engine.
///
/// Build one with [`Engine::builder`]; stop it with [`Engine::shutdown`].
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<EngineInner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workflows", &self.inner.names)
            .field("owner", &self.inner.owner)
            .finish()
    }
}

enum StoreChoice {
    Sqlite(PathBuf),
    Temporary,
    Custom(Arc<dyn Store>),
}

/// Configures and starts an [`Engine`].
pub struct EngineBuilder {
    store: Option<StoreChoice>,
    clock: Option<Clock>,
    workflows: Vec<(String, Arc<dyn ErasedWorkflow>)>,
    max_running: usize,
    step_limit: u32,
    payload_limit: usize,
    hibernate_after: Duration,
    drain_timeout: Duration,
    retention: Retention,
    workflow_retention: Vec<(String, Retention)>,
    #[cfg(feature = "sqlite")]
    sqlite: cairn_sqlite::Options,
}

/// The default retention of finished instances: 7 days, after success and after error.
pub const DEFAULT_RETENTION: Retention = Retention {
    success: Duration::from_secs(7 * 86_400),
    error: Duration::from_secs(7 * 86_400),
};

/// The default drain deadline of [`Engine::shutdown`].
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The default hot threshold: waits longer than this hibernate the instance.
pub const DEFAULT_HIBERNATE_AFTER: Duration = Duration::from_secs(1);

impl Engine {
    /// Starts configuring an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder {
            store: None,
            clock: None,
            workflows: Vec::new(),
            max_running: DEFAULT_MAX_RUNNING,
            step_limit: DEFAULT_STEP_LIMIT,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            hibernate_after: DEFAULT_HIBERNATE_AFTER,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            retention: DEFAULT_RETENTION,
            workflow_retention: Vec::new(),
            #[cfg(feature = "sqlite")]
            sqlite: cairn_sqlite::Options::default(),
        }
    }

    /// How many instances have a run in memory right now. Hibernated instances (sleeping,
    /// waiting for an event or a retry) are not counted: they hold no memory.
    pub fn live_instances(&self) -> usize {
        self.inner.live().len()
    }

    /// The engine's clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.shared.clock
    }

    /// The names of the registered workflows, in registration order.
    pub fn workflow_names(&self) -> &[WorkflowName] {
        &self.inner.names
    }

    /// A receiver that sees a new value after every write this engine commits to its store:
    /// a live view that has read everything waits on it instead of polling. Writes made by
    /// other processes sharing the store are not seen.
    pub fn commits(&self) -> watch::Receiver<u64> {
        self.inner.commits.all()
    }

    /// Stops the engine, draining first: no new instance is claimed and no new attempt
    /// starts; attempts in flight finish and record their outcome (up to the drain deadline,
    /// [`EngineBuilder::drain_timeout`], 10 s by default); then every lifetime is dropped
    /// (its state is durable; it resumes by replay when an engine next opens the store) and
    /// the store is closed.
    ///
    /// An attempt still running at the deadline is recorded as interrupted on the next start.
    pub async fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        let scheduler = self.inner.scheduler.lock().ok().and_then(|mut s| s.take());
        if let Some(handle) = scheduler {
            let _ = handle.await;
        }
        if let Err(e) = self.inner.shared.store.close().await {
            tracing::warn!(error = %e, "closing the store failed");
        }
    }
}

impl EngineBuilder {
    /// Stores everything in the SQLite database at `path` (created if missing).
    #[cfg(feature = "sqlite")]
    pub fn sqlite(mut self, path: impl Into<PathBuf>) -> Self {
        self.store = Some(StoreChoice::Sqlite(path.into()));
        self
    }

    /// SQLite options (durability, readers).
    #[cfg(feature = "sqlite")]
    pub fn sqlite_options(mut self, options: cairn_sqlite::Options) -> Self {
        self.sqlite = options;
        self
    }

    /// Stores everything in a SQLite database in a fresh temporary directory, deleted when
    /// the engine is dropped. For tests and examples.
    #[cfg(feature = "sqlite")]
    pub fn temporary(mut self) -> Self {
        self.store = Some(StoreChoice::Temporary);
        self
    }

    /// Uses a custom store.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(StoreChoice::Custom(store));
        self
    }

    /// Uses `clock` (the system clock by default). With a virtual clock, store calls are
    /// made so that tokio's paused time never jumps while one is in flight.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Registers a workflow under its `NAME`.
    pub fn register<W: Workflow>(mut self, workflow: W) -> Self {
        self.workflows
            .push((W::NAME.to_owned(), Arc::new(Registered(workflow))));
        self
    }

    /// At most `n` instances run at once; the rest stay `queued` (default 1,000).
    pub fn max_running(mut self, n: usize) -> Self {
        self.max_running = n.max(1);
        self
    }

    /// At most `n` `step.run` calls per instance run (default 10,000).
    pub fn step_limit(mut self, n: u32) -> Self {
        self.step_limit = n;
        self
    }

    /// The limit on step outputs, params and event payloads in bytes of JSON (default 1 MiB).
    pub fn payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = bytes;
        self
    }

    /// Waits longer than `threshold` hibernate the instance: its wake-up is recorded, its
    /// future dropped, and it resumes by replay (default 1 second).
    pub fn hibernate_after(mut self, threshold: Duration) -> Self {
        self.hibernate_after = threshold;
        self
    }

    /// How long [`Engine::shutdown`] lets attempts in flight finish before it drops them
    /// (default 10 seconds). Zero drops them at once.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// How long finished instances are kept before they are purged and their ids freed
    /// (default 7 days after success and after error).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Retention for the instances of one workflow, overriding [`EngineBuilder::retention`].
    pub fn workflow_retention(mut self, workflow: &str, retention: Retention) -> Self {
        self.workflow_retention
            .push((workflow.to_owned(), retention));
        self
    }

    /// Opens the store, recovers what the last engine left running, and starts scheduling.
    ///
    /// # Errors
    /// [`Error::Config`] for a missing store, an invalid or duplicate workflow name, or a
    /// store that cannot be opened.
    pub async fn start(self) -> Result<Engine, Error> {
        let mut workflows = HashMap::new();
        let mut names = Vec::new();
        for (name, workflow) in self.workflows {
            let name = WorkflowName::new(name).map_err(|e| Error::Config(e.to_string()))?;
            if workflows.insert(name.clone(), workflow).is_some() {
                return Err(Error::Config(format!(
                    "workflow {name:?} is registered twice"
                )));
            }
            names.push(name);
        }
        let mut retention: HashMap<WorkflowName, Retention> =
            names.iter().map(|n| (n.clone(), self.retention)).collect();
        for (name, r) in self.workflow_retention {
            let name = WorkflowName::new(name).map_err(|e| Error::Config(e.to_string()))?;
            match retention.get_mut(&name) {
                Some(slot) => *slot = r,
                None => {
                    return Err(Error::Config(format!(
                        "retention set for workflow {name:?}, which is not registered"
                    )));
                }
            }
        }
        let mut temp_dir = None;
        let store: Arc<dyn Store> = match self.store {
            None => {
                return Err(Error::Config(
                    "no store configured: call .sqlite(path), .temporary() or .store(..)".into(),
                ));
            }
            Some(StoreChoice::Custom(store)) => store,
            #[cfg(feature = "sqlite")]
            Some(choice @ (StoreChoice::Sqlite(_) | StoreChoice::Temporary)) => {
                let path = match choice {
                    StoreChoice::Sqlite(path) => path,
                    _ => {
                        let dir = tempfile::tempdir().map_err(|e| {
                            Error::Config(format!("create a temporary directory: {e}"))
                        })?;
                        let path = dir.path().join("cairn.db");
                        temp_dir = Some(dir);
                        path
                    }
                };
                let options = self.sqlite;
                let opened = tokio::task::spawn_blocking(move || {
                    cairn_sqlite::SqliteStore::open(&path, options)
                })
                .await
                .map_err(|e| Error::Config(format!("open the database: {e}")))?
                .map_err(|e| Error::Config(e.to_string()))?;
                Arc::new(opened)
            }
            #[cfg(not(feature = "sqlite"))]
            Some(_) => return Err(Error::Config("built without the sqlite feature".into())),
        };
        let clock = self.clock.unwrap_or_else(Clock::system);
        let store: Arc<dyn Store> = if clock.is_virtual() {
            Arc::new(crate::gate::Gate(store))
        } else {
            store
        };
        let commits = Arc::new(crate::announce::Commits::new());
        let store: Arc<dyn Store> = Arc::new(crate::announce::Announcing {
            store,
            commits: Arc::clone(&commits),
        });
        let inner = Arc::new(EngineInner {
            live: Mutex::new(HashMap::new()),
            panics: Mutex::new(HashMap::new()),
            hibernate_after: self.hibernate_after,
            drain_timeout: self.drain_timeout,
            retention,
            shared: Arc::new(Shared {
                store,
                clock,
                limits: Limits {
                    step_limit: self.step_limit,
                    payload_limit: self.payload_limit,
                },
            }),
            workflows,
            names,
            owner: format!("engine-{}", uuid::Uuid::new_v4().simple()),
            max_running: self.max_running,
            wake: Notify::new(),
            changes: watch::channel(0).0,
            commits,
            shutdown: watch::channel(false).0,
            scheduler: Mutex::new(None),
            _temp_dir: temp_dir,
        });
        let handle = tokio::spawn(schedule(Arc::clone(&inner)));
        if let Ok(mut slot) = inner.scheduler.lock() {
            *slot = Some(handle);
        }
        Ok(Engine { inner })
    }
}

/// Claims runnable instances while there are free slots and runs each in a driver task.
async fn schedule(inner: Arc<EngineInner>) {
    let mut drivers = JoinSet::new();
    let mut shutdown = inner.shutdown.subscribe();
    let mut failures = 0u32;
    // Claim only when there may be something to claim: at start, when woken (new or woken
    // instances), when a timer is due, or when a slot frees up after a claim that filled
    // every slot. A lifetime that merely ended changes nothing claimable.
    let mut claim_now = true;
    loop {
        if *shutdown.borrow_and_update() {
            break;
        }
        while drivers.try_join_next().is_some() {}
        let free = inner.max_running.saturating_sub(drivers.len());
        let mut filled = false;
        if std::mem::take(&mut claim_now) && free > 0 && !inner.names.is_empty() {
            let now = inner.shared.clock.now();
            match inner
                .shared
                .store
                .claim(&inner.owner, &inner.names, now, UNBOUNDED_LEASE, free)
                .await
            {
                Ok(claimed) => {
                    failures = 0;
                    filled = claimed.len() == free;
                    for c in claimed {
                        drivers.spawn(crate::driver::drive(Arc::clone(&inner), c));
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "claiming instances failed; retrying");
                    let backoff = Duration::from_millis(100 << failures.min(8));
                    tokio::select! {
                        () = inner.shared.clock.sleep(backoff) => {}
                        _ = shutdown.changed() => {}
                    }
                    claim_now = true;
                    continue;
                }
            }
        }
        if filled {
            // Maybe more are ready; go round once a slot frees up.
            tokio::select! {
                Some(_) = drivers.join_next() => {}
                _ = shutdown.changed() => {}
            }
            claim_now = true;
            continue;
        }
        // Purge finished instances whose retention is over.
        let store = &inner.shared.store;
        let now = inner.shared.clock.now();
        let next_purge = match store.next_purge().await {
            Ok(Some(at)) if at <= now => match store.purge(now, 1_000).await {
                Ok(purged) => {
                    tracing::debug!(purged, "purged finished instances");
                    inner.changed();
                    claim_now = true;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purging finished instances failed");
                    Some(now.saturating_add(Duration::from_secs(60)))
                }
            },
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next purge failed");
                Some(now.saturating_add(Duration::from_secs(60)))
            }
        };
        // Sleep until the earliest timer of a hibernating instance or purge, a wake-up, or
        // a free slot.
        let next_ready = match store.next_ready(&inner.names).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next wake-up failed");
                Some(now.saturating_add(Duration::from_secs(1)))
            }
        };
        let next_ready = match (next_ready, next_purge) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timer = async {
            match next_ready {
                Some(at) => inner.shared.clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = inner.wake.notified() => claim_now = true,
            () = timer => claim_now = true,
            Some(_) = drivers.join_next(), if !drivers.is_empty() => {}
            _ = shutdown.changed() => {}
        }
    }
    // Drain: drivers have seen the shutdown; attempts in flight finish and commit, then
    // each lifetime lets go. Whatever is still running at the deadline is dropped (its
    // attempt is recorded as interrupted by the next engine).
    let drained = async { while drivers.join_next().await.is_some() {} };
    tokio::select! {
        () = drained => {}
        () = inner.shared.clock.sleep(inner.drain_timeout) => {
            tracing::warn!(running = drivers.len(), "drain deadline reached; dropping the attempts still running");
        }
    }
    drivers.abort_all();
    while drivers.join_next().await.is_some() {}
}
