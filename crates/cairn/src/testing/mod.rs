//! Testing workflows: a test engine in one line, introspection with step mocks, and a
//! deterministic fault simulator (feature `testing`; guide: `docs/testing.md`).
//!
//! ```no_run
//! # use cairn::prelude::*;
//! # struct Checkout;
//! # impl Workflow for Checkout {
//! #     const NAME: &'static str = "checkout";
//! #     type Params = u64;
//! #     type Output = String;
//! #     async fn run(&self, e: WorkflowEvent<u64>, step: WorkflowStep) -> Result<String, WorkflowError> {
//! #         let id: String = step.run("charge card", |_| async { Ok("ch_live".to_string()) }).await?;
//! #         step.sleep("cool off", "30 days").await?;
//! #         Ok(id)
//! #     }
//! # }
//! use cairn::testing::TestEngine;
//!
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! // #[tokio::test] async fn charges_once() {
//! let t = TestEngine::start(|b| b.register(Checkout)).await?;
//! let order = t.introspect::<Checkout>("order-1")?;
//! order
//!     .modify()
//!     .disable_sleeps()
//!     .mock_step_result("charge card", "ch_test")?;
//! t.workflow::<Checkout>()
//!     .create(CreateOptions::new(4200).id("order-1"))
//!     .await?;
//! order.wait_for_status(InstanceStatus::Complete).await?;
//! assert_eq!(order.output::<String>().await?, "ch_test");
//! # Ok(()) }
//! ```

mod faults;
mod introspect;
mod ledger;
mod simulate;
mod template;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{InstanceId, WorkflowName};

use crate::clock::Clock;
use crate::engine::{Engine, EngineBuilder};
use crate::error::Error;
use crate::hooks::Hooks;
use crate::workflow::Workflow;

use introspect::EngineCell;
pub use introspect::{
    InstanceIntrospector, MockError, Modifier, Step, TestError, WorkflowIntrospector,
};
pub use ledger::{Ledger, LedgerEntry};
pub use simulate::{Faults, Simulation, SimulationReport};

/// How the test engine registers what it runs: applied again at every [`TestEngine::reopen`].
type Register = Arc<dyn Fn(EngineBuilder) -> EngineBuilder + Send + Sync>;

/// An engine for tests: a temporary SQLite database, a virtual clock that jumps to the next
/// timer whenever every instance waits (a 30-day sleep costs no wall time), and hooks for
/// introspection ([`TestEngine::introspect`]). Derefs to the [`Engine`], so
/// `t.workflow::<W>()` creates instances as in production.
///
/// It needs a current-thread tokio runtime (`#[tokio::test]`, the default flavor): the
/// virtual clock is tokio's paused clock, which [`TestEngine::start`] pauses if the test did
/// not (`start_paused = true`). Set the clock with [`TestEngine::start_at`], not in the
/// closure: the closure is applied again at each reopen.
pub struct TestEngine {
    engine: Engine,
    /// The same engine, for the introspectors (they follow a reopen).
    current: EngineCell,
    /// One virtual clock for every engine it opens: a reopen does not turn time back.
    clock: Clock,
    hooks: Arc<Hooks>,
    path: PathBuf,
    register: Register,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEngine")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for TestEngine {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl TestEngine {
    /// Starts a test engine with what `register` adds to the builder (workflows, limits,
    /// retention; the store and the clock are the test engine's). The virtual clock starts
    /// at the current time.
    ///
    /// # Errors
    /// [`Error::Config`] outside a current-thread tokio runtime, or when the builder is
    /// refused (a workflow registered twice, say).
    pub async fn start(
        register: impl Fn(EngineBuilder) -> EngineBuilder + Send + Sync + 'static,
    ) -> Result<TestEngine, Error> {
        freeze_time()?;
        Self::start_with(Clock::virtual_now(), register).await
    }

    /// [`TestEngine::start`] with the virtual clock starting at `at` (launch day, say).
    ///
    /// # Errors
    /// As [`TestEngine::start`].
    pub async fn start_at(
        at: cairn_core::Timestamp,
        register: impl Fn(EngineBuilder) -> EngineBuilder + Send + Sync + 'static,
    ) -> Result<TestEngine, Error> {
        freeze_time()?;
        Self::start_with(Clock::virtual_at(at), register).await
    }

    async fn start_with(
        clock: Clock,
        register: impl Fn(EngineBuilder) -> EngineBuilder + Send + Sync + 'static,
    ) -> Result<TestEngine, Error> {
        let dir = tempfile::tempdir()
            .map_err(|e| Error::config_from(format!("create a temporary directory: {e}"), e))?;
        let path = dir.path().join("cairn.db");
        let hooks = Arc::new(Hooks::default());
        let register: Register = Arc::new(register);
        let engine = open(&path, &clock, &hooks, &register).await?;
        Ok(TestEngine {
            current: EngineCell::new(engine.clone()),
            engine,
            clock,
            hooks,
            path,
            register,
            _dir: dir,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Shuts the engine down and starts a new one on the same database, as a deploy does:
    /// unfinished instances resume by replay. The introspectors' mocks stay in force.
    ///
    /// # Errors
    /// As [`TestEngine::start`].
    pub async fn reopen(&mut self) -> Result<(), Error> {
        self.engine.shutdown().await;
        self.engine = open(&self.path, &self.clock, &self.hooks, &self.register).await?;
        self.current.set(self.engine.clone());
        Ok(())
    }

    /// Introspects the instance `id` of `W`, whether it exists yet or not: set its mocks
    /// up before creating it, then wait for what it does.
    ///
    /// # Errors
    /// An id that is not a valid instance id.
    pub fn introspect<W: Workflow>(&self, id: &str) -> Result<InstanceIntrospector, TestError> {
        let workflow = workflow_name::<W>()?;
        let id = InstanceId::new(id).map_err(|e| TestError::new(e.to_string()))?;
        Ok(InstanceIntrospector::new(
            self.current.clone(),
            Arc::clone(&self.hooks),
            workflow,
            id,
        ))
    }

    /// Introspects every instance of `W` created from now on (by `create`, `create_batch`,
    /// a schedule or a parent's `invoke`): its mocks apply to each of them, and
    /// [`WorkflowIntrospector::instances`] lists them.
    ///
    /// # Errors
    /// A store failure.
    pub async fn introspect_workflow<W: Workflow>(
        &self,
    ) -> Result<WorkflowIntrospector, TestError> {
        WorkflowIntrospector::new(
            self.current.clone(),
            Arc::clone(&self.hooks),
            workflow_name::<W>()?,
        )
        .await
    }

    /// Shuts the engine down (draining) and removes its database.
    pub async fn shutdown(self) {
        self.engine.shutdown().await;
    }
}

fn workflow_name<W: Workflow>() -> Result<WorkflowName, TestError> {
    WorkflowName::new(W::NAME).map_err(|e| TestError::new(e.to_string()))
}

/// An engine on `path` with `clock` and `hooks`.
async fn open(
    path: &std::path::Path,
    clock: &Clock,
    hooks: &Arc<Hooks>,
    register: &Register,
) -> Result<Engine, Error> {
    let new = path.to_path_buf();
    tokio::task::spawn_blocking(move || template::create(&new))
        .await
        .map_err(|e| Error::config(format!("create the test database: {e}")))?;
    let builder = Engine::builder()
        .sqlite(path)
        .sqlite_options(
            // A test simulates no power loss: NORMAL loses nothing when a process dies.
            cairn_sqlite::Options::default().durability(cairn_sqlite::Durability::Normal),
        )
        .clock(clock.clone())
        .hooks(Arc::clone(hooks));
    register(builder).start().await
}

/// Pauses tokio's clock (the virtual clock follows it) unless the test already did.
fn freeze_time() -> Result<(), Error> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| {
        Error::config("the test engine runs inside a tokio runtime: use #[tokio::test]")
    })?;
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread {
        return Err(Error::config(
            "the test engine needs a current-thread runtime (#[tokio::test], not flavor = \"multi_thread\"): its virtual clock is tokio's paused clock",
        ));
    }
    // A paused clock does not move while this thread sleeps; a running one does.
    let before = tokio::time::Instant::now();
    std::thread::sleep(Duration::from_millis(2));
    if tokio::time::Instant::now() != before {
        tokio::time::pause();
    }
    Ok(())
}
