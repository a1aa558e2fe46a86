//! The [`Engine`]: the registry of workflows, the scheduler that claims runnable instances
//! up to the concurrency limit, and the drivers that run them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::{DEFAULT_PAYLOAD_LIMIT, DEFAULT_STEP_LIMIT, WorkflowName};
use cairn_store::{Retention, Store};
use tokio::sync::watch;

pub(crate) mod announce;
pub(crate) mod blocking;
pub(crate) mod check;
pub(crate) mod concurrency;
mod driver;
pub(crate) mod family;
mod gauges;
pub(crate) mod leases;
pub(crate) mod live;
mod remote;
pub(crate) mod runtime;
mod scheduler;
pub(crate) mod schedules;
pub(crate) mod workers;

use crate::clock::Clock;
use crate::env::{Env, Limits};
use crate::error::Error;
use crate::workflow::{ErasedWorkflow, Registered, Workflow};

use crate::engine::runtime::Runtime;

/// The default limit on concurrently running instances.
pub const DEFAULT_MAX_RUNNING: usize = 1_000;

/// A running Cairn engine. Cheap to clone; all clones are the same engine.
///
/// Build one with [`Engine::builder`]; stop it with [`Engine::shutdown`].
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Runtime>,
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
    #[cfg(feature = "postgres")]
    Postgres(cairn_postgres::Options),
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
    stream_storage: u64,
    hibernate_after: Duration,
    drain_timeout: Duration,
    retention: Retention,
    workflow_retention: Vec<(String, Retention)>,
    concurrency: Vec<(String, concurrency::Concurrency)>,
    lease_ttl: Option<Duration>,
    schedules: Vec<schedules::Schedule>,
    min_schedule_interval: Duration,
    /// Claims and runs instances (off for an engine opened only to check them).
    claims: bool,
    /// A test's mocks and observers (`cairn::testing`).
    hooks: Option<Arc<crate::hooks::Hooks>>,
    /// The custom store already makes its calls from blocking threads (see `blocking.rs`).
    store_blocking: bool,
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
            stream_storage: crate::ops::DEFAULT_STREAM_STORAGE,
            hibernate_after: DEFAULT_HIBERNATE_AFTER,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            retention: DEFAULT_RETENTION,
            workflow_retention: Vec::new(),
            concurrency: Vec::new(),
            lease_ttl: None,
            schedules: Vec::new(),
            min_schedule_interval: schedules::DEFAULT_MIN_INTERVAL,
            claims: true,
            hooks: None,
            store_blocking: false,
            #[cfg(feature = "sqlite")]
            sqlite: cairn_sqlite::Options::default(),
        }
    }

    /// How many instances have a run in memory right now. Hibernated instances (sleeping,
    /// waiting for an event or a retry) are not counted: they hold no memory.
    pub fn live_instances(&self) -> usize {
        self.inner.live.len()
    }

    /// Sets the gauges of [`crate::telemetry`] from the store and from memory now
    /// (instances by status, due backlog, pending timers, lifetimes held). The engine does
    /// this every 15 s on its own; an exporter that scrapes calls it first for exact values.
    ///
    /// # Errors
    /// When the store cannot be read.
    pub async fn refresh_gauges(&self) -> Result<(), Error> {
        gauges::refresh(&self.inner).await.map_err(Error::from)
    }

    /// The engine's clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.env.clock
    }

    /// What this engine did in each minute of the last hour (the minutes from `since` on,
    /// oldest first), counted in memory since it started: see [`crate::telemetry::Activity`].
    pub fn activity(&self, since: cairn_core::Timestamp) -> Vec<crate::telemetry::ActivityMinute> {
        self.inner.env.activity.since(since)
    }

    /// The id of the newest lifecycle record in the store: a stream cursor from which only
    /// what happens next is read.
    ///
    /// # Errors
    /// A store failure.
    pub async fn log_head(&self) -> Result<u64, crate::error::Error> {
        Ok(self.inner.env.store.log_head().await?)
    }

    /// The names of the workflows this engine knows: those registered in Rust, in
    /// registration order, then those workers have registered (`docs/worker-protocol.md`),
    /// by name.
    pub fn workflow_names(&self) -> Vec<WorkflowName> {
        let mut names = self.inner.names.clone();
        names.extend(self.inner.env.remote.names());
        names
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
        // No tick starts an instance once shutdown began.
        let ticking = self
            .inner
            .schedule_tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
            .into_values()
            .map(|t| t.task)
            .collect::<Vec<_>>();
        // Runners stuck on a store that does not answer are not waited for forever: one
        // deadline for all of them.
        let aborts: Vec<_> = ticking
            .iter()
            .map(tokio::task::JoinHandle::abort_handle)
            .collect();
        let all = futures::future::join_all(ticking);
        if tokio::time::timeout(self.inner.drain_timeout, all)
            .await
            .is_err()
        {
            for task in aborts {
                task.abort();
            }
        }
        let scheduler = self.inner.scheduler.lock().ok().and_then(|mut s| s.take());
        if let Some(handle) = scheduler {
            let _ = handle.await;
        }
        // Every run has ended: the workers' connections end, and they reconnect to the
        // next engine.
        self.inner.workers.close_all();
        // Every lifetime has let go: give the leases up, so another engine (or the next
        // start) takes the instances over at once instead of after the lease TTL.
        if let Err(e) = self.inner.env.store.release_all(&self.inner.owner).await {
            tracing::warn!(error = %e, "releasing the leases failed; they expire after their TTL");
        }
        // Releasing completes pending pauses (`waitingForPause` becomes `paused`).
        self.inner.statuses_changed();
        if let Err(e) = self.inner.env.store.close().await {
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

    /// Uses a PostgreSQL database (`postgres://user:password@host:port/database`): several
    /// engine processes, on several machines, may share it. Leases then expire
    /// ([`EngineBuilder::lease_ttl`], 30 s by default).
    #[cfg(feature = "postgres")]
    pub fn postgres(self, url: impl Into<String>) -> Self {
        self.postgres_options(cairn_postgres::Options::new(url))
    }

    /// Uses a PostgreSQL database with these options (schema, connections).
    #[cfg(feature = "postgres")]
    pub fn postgres_options(mut self, options: cairn_postgres::Options) -> Self {
        self.store = Some(StoreChoice::Postgres(options));
        self
    }

    /// How long a claim holds an instance without renewal, where several engines share the
    /// store: an engine that dies, stalls or loses its network gives its instances up
    /// this long after its last renewal (every third of it). Default: 30 s on PostgreSQL;
    /// on SQLite and custom stores leases do not expire unless this is set.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl.max(Duration::from_millis(30)));
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

    /// Starts a workflow on a cron schedule (see [`Schedule`](crate::Schedule)): every engine
    /// that declares it runs it, and each tick fires once among them.
    pub fn schedule(mut self, schedule: schedules::Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Registers a workflow under its `NAME`.
    pub fn register<W: Workflow>(mut self, workflow: W) -> Self {
        self.workflows
            .push((W::NAME.to_owned(), Arc::new(Registered(workflow))));
        self
    }

    /// Opened to look, not to run (the replay check): no instance is claimed, and the
    /// store is neither migrated nor recovered (a database of another schema version is
    /// refused).
    pub(crate) fn check_only(mut self) -> Self {
        self.claims = false;
        #[cfg(feature = "sqlite")]
        {
            self.sqlite.check_only = true;
        }
        #[cfg(feature = "postgres")]
        if let Some(StoreChoice::Postgres(options)) = &mut self.store {
            options.check_only = true;
        }
        self
    }

    /// Runs with a test's mocks and observers (`cairn::testing`).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn hooks(mut self, hooks: Arc<crate::hooks::Hooks>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// The custom store makes its calls from blocking threads already (the simulator's,
    /// which decides its faults before it hands a call over): not wrapped again.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn store_calls_blocking(mut self) -> Self {
        self.store_blocking = true;
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

    /// The limit on step outputs, params and event payloads in bytes of JSON (default 1 MiB);
    /// byte sequences in them count as their bytes, not their base64.
    pub fn payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = bytes;
        self
    }

    /// The most bytes one instance's stream step outputs (`step.run_stream`) may hold
    /// together (default 1 GiB). A stream that would go over fails its step for good.
    pub fn stream_storage_limit(mut self, bytes: u64) -> Self {
        self.stream_storage = bytes;
        self
    }

    /// Waits longer than `threshold` hibernate the instance: its wake-up is recorded, its
    /// future dropped, and it resumes by replay (default 1 second).
    pub fn hibernate_after(mut self, threshold: Duration) -> Self {
        self.hibernate_after = threshold;
        self
    }

    /// The shortest time between two ticks a schedule may have (default a minute): one that
    /// would fire more often, declared or created over the API, is refused. Lower it (to a
    /// second at least) for schedules that must run every few seconds.
    pub fn min_schedule_interval(mut self, interval: Duration) -> Self {
        self.min_schedule_interval = interval.max(Duration::from_secs(1));
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

    /// Limits the instances of `workflow` that run at once per concurrency key (and,
    /// optionally, how fast they start): see [`Concurrency`](crate::Concurrency). Instances
    /// created without a key are not limited.
    pub fn concurrency(mut self, workflow: &str, limits: concurrency::Concurrency) -> Self {
        self.concurrency.push((workflow.to_owned(), limits));
        self
    }

    /// What [`EngineBuilder::start`] does below the client layer: opens the store,
    /// recovers what the last engine left running, and starts scheduling instances (the
    /// cron schedules, which create instances through the client, start above it).
    pub(crate) async fn build(self) -> Result<Engine, Error> {
        crate::telemetry::describe();
        let mut workflows = HashMap::new();
        let mut names = Vec::new();
        for (name, workflow) in self.workflows {
            let name = WorkflowName::new(name).map_err(|e| Error::config_from(e.to_string(), e))?;
            if workflows.insert(name.clone(), workflow).is_some() {
                return Err(Error::config(format!(
                    "workflow {name:?} is registered twice"
                )));
            }
            names.push(name);
        }
        crate::telemetry::zero(&names);
        let mut scheduled: Vec<Arc<schedules::Schedule>> = Vec::new();
        for s in self.schedules {
            if !names.iter().any(|n| n.as_str() == s.workflow()) {
                return Err(Error::config(format!(
                    "schedule {:?} starts workflow {:?}, which is not registered",
                    s.name(),
                    s.workflow()
                )));
            }
            if scheduled.iter().any(|o| o.name() == s.name()) {
                return Err(Error::config(format!(
                    "schedule {:?} is declared twice",
                    s.name()
                )));
            }
            let now = self.clock.as_ref().map_or_else(
                || cairn_core::Timestamp::from_system_time(std::time::SystemTime::now()),
                Clock::now,
            );
            s.check(now, self.min_schedule_interval)
                .map_err(|e| Error::InvalidSchedule(e.to_string()))?;
            scheduled.push(Arc::new(s));
        }
        let mut retention: HashMap<WorkflowName, Retention> =
            names.iter().map(|n| (n.clone(), self.retention)).collect();
        for (name, r) in self.workflow_retention {
            let name = WorkflowName::new(name).map_err(|e| Error::config_from(e.to_string(), e))?;
            match retention.get_mut(&name) {
                Some(slot) => *slot = r,
                None => {
                    return Err(Error::config(format!(
                        "retention set for workflow {name:?}, which is not registered"
                    )));
                }
            }
        }
        let mut limits = HashMap::new();
        for (name, c) in self.concurrency {
            let name = WorkflowName::new(name).map_err(|e| Error::config_from(e.to_string(), e))?;
            if !retention.contains_key(&name) {
                return Err(Error::config(format!(
                    "concurrency set for workflow {name:?}, which is not registered"
                )));
            }
            limits.insert(name, c);
        }
        let mut temp_dir = None;
        #[cfg(feature = "postgres")]
        let default_ttl = match &self.store {
            Some(StoreChoice::Postgres(_)) => leases::DEFAULT_LEASE_TTL,
            _ => crate::env::UNBOUNDED_LEASE,
        };
        #[cfg(not(feature = "postgres"))]
        let default_ttl = crate::env::UNBOUNDED_LEASE;
        let lease_ttl = self.lease_ttl.unwrap_or(default_ttl);
        let store: Arc<dyn Store> = match self.store {
            None => {
                return Err(Error::config(
                    "no store configured: call .sqlite(path), .temporary() or .store(..)",
                ));
            }
            Some(StoreChoice::Custom(store)) => store,
            #[cfg(feature = "postgres")]
            Some(StoreChoice::Postgres(options)) => {
                // Under a paused tokio clock (a virtual clock in tests) the connect timeouts
                // would fire at once while the network is awaited: open on a blocking
                // thread, which holds the paused clock still, as every call does later.
                let virtual_clock = self.clock.as_ref().is_some_and(Clock::is_virtual);
                let opened = if virtual_clock {
                    let runtime = tokio::runtime::Handle::current();
                    tokio::task::spawn_blocking(move || {
                        runtime.block_on(cairn_postgres::PostgresStore::open(options))
                    })
                    .await
                    .map_err(|e| Error::config_from(format!("open the database: {e}"), e))?
                } else {
                    cairn_postgres::PostgresStore::open(options).await
                };
                Arc::new(opened.map_err(|e| Error::config_from(e.to_string(), e))?)
            }
            #[cfg(feature = "sqlite")]
            Some(choice @ (StoreChoice::Sqlite(_) | StoreChoice::Temporary)) => {
                let path = match choice {
                    StoreChoice::Sqlite(path) => path,
                    _ => {
                        let dir = tempfile::tempdir().map_err(|e| {
                            Error::config_from(format!("create a temporary directory: {e}"), e)
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
                .map_err(|e| Error::config_from(format!("open the database: {e}"), e))?
                .map_err(|e| {
                    if e.is_in_use() {
                        Error::DatabaseInUse(e.to_string())
                    } else {
                        Error::config_from(e.to_string(), e)
                    }
                })?;
                Arc::new(opened)
            }
            #[cfg(not(feature = "sqlite"))]
            Some(StoreChoice::Sqlite(_) | StoreChoice::Temporary) => {
                return Err(Error::config("built without the sqlite feature"));
            }
        };
        let clock = self.clock.unwrap_or_else(Clock::system);
        // tokio's clock can be paused only on a current-thread runtime: on another, a
        // virtual clock runs with real time, and store calls need no blocking thread (a
        // hand-off there and back per call; the wake-up benchmark's clock is virtual).
        let pausable = tokio::runtime::Handle::try_current().map_or(true, |h| {
            h.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread
        });
        let store: Arc<dyn Store> = if clock.is_virtual() && pausable && !self.store_blocking {
            Arc::new(crate::engine::blocking::Blocking(store))
        } else {
            store
        };
        let commits = Arc::new(crate::engine::announce::Commits::new());
        let store: Arc<dyn Store> = Arc::new(crate::engine::announce::Announcing {
            store,
            commits: Arc::clone(&commits),
        });
        let env = Arc::new(Env {
            store,
            clock,
            limits: Limits {
                step_limit: self.step_limit,
                payload_limit: self.payload_limit,
                stream_storage: self.stream_storage,
            },
            leases: crate::env::Leases::new(lease_ttl),
            activity: crate::telemetry::Activity::default(),
            retention,
            wake: tokio::sync::Notify::new(),
            hooks: self.hooks,
            remote: crate::env::RemoteWorkflows::new(self.retention),
        });
        let workers = Arc::new(workers::Workers::new(Arc::clone(&env)));
        // What workers registered before: creates know their workflows with none connected.
        // (A store opened only to check may be of a schema from before workers.)
        match workers.reload().await {
            Err(e) if self.claims => {
                return Err(Error::config_from(
                    format!("read the workers' workflows: {e}"),
                    e,
                ));
            }
            _ => {}
        }
        let inner = Arc::new(Runtime {
            live: live::Live::default(),
            panics: Mutex::new(HashMap::new()),
            hibernate_after: self.hibernate_after,
            drain_timeout: self.drain_timeout,
            env,
            workflows,
            names,
            workers,
            claims: self.claims,
            owner: format!("engine-{}", uuid::Uuid::new_v4().simple()),
            max_running: self.max_running,
            renew_now: tokio::sync::Notify::new(),
            changes: watch::channel(0).0,
            commits,
            shutdown: watch::channel(false).0,
            gauges_refreshed: tokio::sync::Mutex::new(None),
            scheduler: Mutex::new(None),
            schedules: scheduled,
            min_schedule_interval: self.min_schedule_interval,
            schedule_tasks: Mutex::new(HashMap::new()),
            schedules_sync: tokio::sync::Mutex::new(()),
            concurrency: limits,
            _temp_dir: temp_dir,
        });
        if let Some(changes) = inner.env.store.changes() {
            tokio::spawn(remote::follow(Arc::clone(&inner), changes));
        }
        if inner.env.leases.expire() && self.claims && !inner.env.clock.is_virtual() {
            tokio::spawn(workers::follow(
                Arc::clone(&inner.workers),
                inner.shutdown.subscribe(),
            ));
        }
        if !inner.env.clock.is_virtual() {
            tokio::spawn(gauges::keep(Arc::clone(&inner)));
        }
        if self.claims {
            let handle = tokio::spawn(scheduler::schedule(Arc::clone(&inner)));
            if let Ok(mut slot) = inner.scheduler.lock() {
                *slot = Some(handle);
            }
        }
        Ok(Engine { inner })
    }
}
