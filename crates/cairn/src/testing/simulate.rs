//! Deterministic simulation of one workflow under seeded faults, checked against a
//! fault-free run of the same workflow: see [`Simulation`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::{
    InstanceStatus, LogKind, LogRecord, StepKind, StepRecord, StepState, Timestamp, WorkflowName,
};
use serde::Serialize;

use crate::client::Instance;
use crate::clock::Clock;
use crate::engine::{Engine, EngineBuilder};
use crate::failure::INTERRUPTED;
use crate::hooks::{BodyRun, Hooks, Scope};
use crate::testing::faults::{FaultStore, Plan, Rng, StoreFaults};
use crate::testing::introspect::{Modifier, TestError};
use crate::workflow::Workflow;

/// The virtual time every run starts at unless set, so a fault-free run and a faulted one see
/// the same clock: 2030-01-01T00:00:00Z.
const START_MS: i64 = 1_893_456_000_000;

/// A run that has not ended after this much virtual time is stuck.
const STUCK_AFTER: Duration = Duration::from_secs(5 * 365 * 86_400);

/// Which faults a simulation injects, and how many per run.
///
/// Store faults hit the engine's writes (each commit, each event taken): with probability
/// `rate`, one of the kinds switched on. The simulator's own actions (clock jumps, a pause
/// and resume, an event sent again with its idempotency key) come at seeded virtual times.
/// At most `max` faults of all kinds per run, so every run can finish.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// The engine crashes (every lifetime dropped, the store reopened by a new engine) just
    /// before or just after a write lands.
    pub crashes: bool,
    /// A write fails and does not land.
    pub lost_writes: bool,
    /// A write lands but the engine is told it failed.
    pub landed_but_failed: bool,
    /// The store is unavailable for a few calls of any kind.
    pub outages: bool,
    /// The clock jumps ahead (up to two hours).
    pub clock_jumps: bool,
    /// An event is sent again with the same idempotency key (a client's retry).
    pub duplicate_events: bool,
    /// The instance is paused and resumed a while later.
    pub pauses: bool,
    /// The chance that a write meets a store fault.
    pub rate: f64,
    /// The most faults per run.
    pub max: u32,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            crashes: true,
            lost_writes: true,
            landed_but_failed: true,
            outages: true,
            clock_jumps: true,
            duplicate_events: true,
            pauses: true,
            rate: 0.2,
            max: 8,
        }
    }
}

impl Faults {
    /// No fault at all.
    pub fn none() -> Self {
        Faults {
            crashes: false,
            lost_writes: false,
            landed_but_failed: false,
            outages: false,
            clock_jumps: false,
            duplicate_events: false,
            pauses: false,
            rate: 0.0,
            max: 0,
        }
    }

    fn store(&self) -> StoreFaults {
        StoreFaults {
            rate: self.rate,
            lost: self.lost_writes,
            landed_but_failed: self.landed_but_failed,
            crashes: self.crashes,
            outages: self.outages,
        }
    }
}

/// What a simulation found: how many seeds ran, how many faults they saw, and the runs whose
/// outcome legitimately differs from the fault-free run (crashes used up a step's attempts:
/// an interrupted attempt counts, SPEC Part A.7).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SimulationReport {
    /// Seeds run.
    pub seeds: u64,
    /// Faults injected over all seeds.
    pub faults: u64,
    /// Engine crashes over all seeds.
    pub crashes: u64,
    /// Seeds whose status differs from the fault-free run because interrupted attempts
    /// used up a step's retries, with the status they reached.
    pub exhausted_by_interruptions: Vec<(u64, InstanceStatus)>,
    /// The faults each seed injected, in order (the same seed gives the same list).
    pub trace: Vec<(u64, Vec<String>)>,
}

type Register = Arc<dyn Fn(EngineBuilder) -> EngineBuilder + Send + Sync>;
type World = Arc<dyn Fn() -> Register + Send + Sync>;

/// Runs one workflow with given params under seeded faults, and checks every run against a
/// fault-free one:
///
/// - the same final status and output (unless interrupted attempts used up a step's
///   retries, which the report lists);
/// - no step body (nor rollback handler) ran twice for the same attempt, and each step's
///   successful attempt ran exactly once;
/// - each compensation recorded once, in reverse start order, and the same ones as the
///   fault-free run's.
///
/// A failing seed is named in the error, with the faults it injected;
/// [`Simulation::seed`] replays it alone. Runs need a current-thread tokio runtime
/// (`#[tokio::test]`); the clock is virtual.
///
/// ```no_run
/// # use cairn::prelude::*;
/// # struct Checkout;
/// # impl Workflow for Checkout {
/// #     const NAME: &'static str = "checkout";
/// #     type Params = u64;
/// #     type Output = u64;
/// #     async fn run(&self, e: WorkflowEvent<u64>, step: WorkflowStep) -> Result<u64, WorkflowError> {
/// #         step.run("charge", move |_| async move { Ok(e.payload) }).await
/// #     }
/// # }
/// use cairn::testing::Simulation;
/// # async fn t() -> Result<(), Box<dyn std::error::Error>> {
/// let report = Simulation::new::<Checkout>(4200)?
///     .register(|b| b.register(Checkout))
///     .seeds(0..200)
///     .run()
///     .await?;
/// println!("{report:?}");
/// # Ok(()) }
/// ```
pub struct Simulation {
    world: World,
    workflow: WorkflowName,
    params: serde_json::Value,
    events: Vec<(String, serde_json::Value)>,
    seeds: std::ops::Range<u64>,
    faults: Faults,
    start: Timestamp,
    attempts_in_output: bool,
    mocks: Option<Mocks>,
}

type Mocks = Arc<dyn Fn(&Modifier) -> Result<(), TestError> + Send + Sync>;

impl std::fmt::Debug for Simulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("workflow", &self.workflow)
            .field("params", &self.params)
            .field("seeds", &self.seeds)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

/// One run's outcome and what the checks read.
#[derive(Debug)]
struct Run {
    status: InstanceStatus,
    output: Option<serde_json::Value>,
    error: Option<cairn_core::ErrorInfo>,
    journal: Vec<StepRecord>,
    log: Vec<LogRecord>,
    bodies: Vec<BodyRun>,
    injected: Vec<String>,
    crashes: u64,
}

impl Simulation {
    /// A simulation of `W` with `params`. Say what its engines run with
    /// [`Simulation::register`] or [`Simulation::world`]. Seeds `0..100` and
    /// [`Faults::default`] unless set.
    ///
    /// # Errors
    /// Params that do not serialise.
    pub fn new<W: Workflow>(params: W::Params) -> Result<Simulation, TestError> {
        let params = cairn_core::binary::to_value(&params)
            .map_err(|e| TestError::new(format!("the params do not serialise: {e}")))?;
        let workflow = WorkflowName::new(W::NAME).map_err(|e| TestError::new(e.to_string()))?;
        Ok(Simulation {
            world: Arc::new(|| -> Register { Arc::new(|b| b) }),
            workflow,
            params,
            events: Vec::new(),
            seeds: 0..100,
            faults: Faults::default(),
            start: Timestamp::from_millis(START_MS),
            attempts_in_output: false,
            mocks: None,
        })
    }

    /// What every engine of every run registers (workflows without state of their own).
    #[must_use]
    pub fn register(
        self,
        register: impl Fn(EngineBuilder) -> EngineBuilder + Send + Sync + 'static,
    ) -> Self {
        let register: Register = Arc::new(register);
        Simulation {
            world: Arc::new(move || Arc::clone(&register)),
            ..self
        }
    }

    /// What the engines of one run register, made afresh for each run by `world`: state it
    /// creates (a fake bank) lives as long as the run, across the run's crashes, as an
    /// outside system would, and the next run starts with a new one.
    #[must_use]
    pub fn world<R>(self, world: impl Fn() -> R + Send + Sync + 'static) -> Self
    where
        R: Fn(EngineBuilder) -> EngineBuilder + Send + Sync + 'static,
    {
        Simulation {
            world: Arc::new(move || -> Register { Arc::new(world()) }),
            ..self
        }
    }

    /// Sends this event to the instance as soon as it is created (it waits in the
    /// instance's buffer until a wait takes it), with an idempotency key, so a duplicate
    /// send is a client's retry.
    ///
    /// # Errors
    /// A payload that does not serialise.
    pub fn event(mut self, event_type: &str, payload: impl Serialize) -> Result<Self, TestError> {
        let payload = cairn_core::binary::to_value(&payload)
            .map_err(|e| TestError::new(format!("the event payload does not serialise: {e}")))?;
        self.events.push((event_type.to_owned(), payload));
        Ok(self)
    }

    /// The seeds to run.
    #[must_use]
    pub fn seeds(mut self, seeds: std::ops::Range<u64>) -> Self {
        self.seeds = seeds;
        self
    }

    /// Runs one seed only (to replay a failure).
    #[must_use]
    pub fn seed(self, seed: u64) -> Self {
        self.seeds(seed..seed + 1)
    }

    /// When every run's virtual clock starts (2030-01-01 unless set): the same for the
    /// fault-free run and the faulted ones.
    #[must_use]
    pub fn start_at(mut self, at: Timestamp) -> Self {
        self.start = at;
        self
    }

    /// The workflow's output depends on attempt numbers (it returns `ctx.attempt`, say): a
    /// run whose attempts a fault interrupted (they count) may end with another output.
    /// Without this, any output but the fault-free run's fails the simulation.
    #[must_use]
    pub fn output_depends_on_attempts(mut self) -> Self {
        self.attempts_in_output = true;
        self
    }

    /// Mocks every run applies (the fault-free one too), as on a
    /// [`crate::testing::WorkflowIntrospector`]: pin a step whose result is random, so
    /// runs can be compared.
    #[must_use]
    pub fn mock(
        mut self,
        mocks: impl Fn(&Modifier) -> Result<(), TestError> + Send + Sync + 'static,
    ) -> Self {
        self.mocks = Some(Arc::new(mocks));
        self
    }

    /// The faults to inject.
    #[must_use]
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Runs the fault-free run, then every seed, checking each against it.
    ///
    /// # Errors
    /// The first seed that breaks a check: its number, what broke, and the faults it
    /// injected. Also the fault-free run failing to finish.
    pub async fn run(&self) -> Result<SimulationReport, TestError> {
        crate::testing::freeze_time().map_err(TestError::from)?;
        let baseline = self
            .run_once(None)
            .await
            .map_err(|e| TestError::new(format!("the fault-free run failed: {e}")))?;
        check_bodies(&baseline).map_err(|e| TestError::new(format!("the fault-free run: {e}")))?;
        let mut report = SimulationReport::default();
        for seed in self.seeds.clone() {
            let run = self.run_once(Some(seed)).await.map_err(|e| {
                TestError::new(format!(
                    "seed {seed}: {e} (replay it with Simulation::seed({seed}))"
                ))
            })?;
            report.seeds += 1;
            report.faults += run.injected.len() as u64;
            report.crashes += run.crashes;
            report.trace.push((seed, run.injected.clone()));
            match self.check(&baseline, &run) {
                Ok(None) => {}
                Ok(Some(status)) => report.exhausted_by_interruptions.push((seed, status)),
                Err(e) => {
                    return Err(TestError::new(format!(
                        "seed {seed}: {e}\n  faults injected: {:?}\n  replay it with Simulation::seed({seed})",
                        run.injected
                    )));
                }
            }
        }
        Ok(report)
    }

    /// Checks `run` against the fault-free `baseline`: `Ok(Some(status))` when it reached
    /// another status that interrupted attempts explain.
    fn check(&self, baseline: &Run, run: &Run) -> Result<Option<InstanceStatus>, String> {
        check_bodies(run)?;
        check_compensations(run)?;
        // The one legitimate divergence: interrupted attempts (they count) used up a
        // step's retries where the fault-free run's step did not fail.
        if let Some(step) = exhausted_by_interruptions(run, baseline) {
            tracing::debug!(step = %step, "the run diverged: interrupted attempts used up its retries");
            return Ok(Some(run.status));
        }
        if run.status != baseline.status {
            return Err(format!(
                "status {} ({:?}), but the fault-free run reached {} ({:?})",
                run.status, run.error, baseline.status, baseline.error
            ));
        }
        if run.output != baseline.output && !(self.attempts_in_output && interrupted(run)) {
            return Err(format!(
                "output {:?}, but the fault-free run returned {:?}",
                run.output, baseline.output
            ));
        }
        let (ours, theirs) = (compensated(run), compensated(baseline));
        if ours != theirs {
            return Err(format!(
                "compensated {ours:?}, but the fault-free run compensated {theirs:?}"
            ));
        }
        Ok(None)
    }

    /// One run: `seed` drives the faults (`None`: none).
    async fn run_once(&self, seed: Option<u64>) -> Result<Run, TestError> {
        let dir = tempfile::tempdir()
            .map_err(|e| TestError::new(format!("create a temporary directory: {e}")))?;
        let register = (self.world)();
        let hooks = Arc::new(Hooks::recording());
        if let Some(mocks) = &self.mocks {
            mocks(&Modifier::new(
                Arc::clone(&hooks),
                Scope::Workflow {
                    workflow: self.workflow.clone(),
                    since: None,
                },
            ))?;
        }
        let store_faults = seed.map(|_| self.faults.store());
        let budget = if seed.is_some() { self.faults.max } else { 0 };
        let plan = Arc::new(Mutex::new(Plan::new(
            seed.unwrap_or(0),
            store_faults,
            budget,
        )));
        // The simulator's own actions draw from their own generator, so they do not shift
        // the store's sequence.
        let mut rng = Rng::new(seed.unwrap_or(0) ^ 0x5eed_5eed_5eed_5eed);
        let crashed = Arc::new(tokio::sync::Notify::new());
        let clock = Clock::virtual_at(self.start);
        let opener = Opener {
            path: dir.path().join("cairn.db"),
            register,
            hooks: Arc::clone(&hooks),
            plan: Arc::clone(&plan),
            crashed: Arc::clone(&crashed),
            clock: clock.clone(),
        };
        let (engine, store) = opener.open().await?;
        let mut run = Running {
            opener,
            engine,
            store,
            crashes: 0,
        };

        let name = self.workflow.clone();
        let params = self.params.clone();
        run.call(|engine| {
            let (name, params) = (name.clone(), params.clone());
            async move {
                let workflow = engine.workflow_by_name(name.as_str())?;
                match workflow
                    .create_stored(crate::client::CreateOptions::new(params).id("sim"))
                    .await
                {
                    // Created by an earlier try whose answer was lost.
                    Ok(_) | Err(crate::error::Error::AlreadyExists { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await?;
        for i in 0..self.events.len() {
            run.call(|engine| self.send(engine, i)).await?;
        }

        let actions = seed.is_some()
            && (self.faults.clock_jumps || self.faults.duplicate_events || self.faults.pauses);
        let stuck = clock.sleep(STUCK_AFTER);
        let mut stuck = std::pin::pin!(stuck);
        let mut resume_at: Option<Timestamp> = None;
        let status = loop {
            let instance = run.instance(&self.workflow).await?;
            let next_action = clock.sleep(Duration::from_millis(1 + rng.below(30_000)));
            let resume: futures::future::BoxFuture<'static, ()> = match resume_at {
                Some(at) => clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                biased;
                () = crashed.notified() => {}
                status = instance.wait() => if let Ok(status) = status {
                    break status;
                },
                () = resume => {
                    if instance.resume().await.is_ok() {
                        resume_at = None;
                    }
                }
                () = next_action, if actions => {
                    self.act(&mut rng, &plan, &clock, &instance, &mut resume_at).await;
                }
                () = &mut stuck => {
                    let now = instance.status().await.map(|s| s.status.to_string());
                    return Err(TestError::new(format!(
                        "the instance did not finish in {} days of virtual time (it is {now:?})",
                        STUCK_AFTER.as_secs() / 86_400
                    )));
                }
            }
            // A crash (noticed above or not) or an outage: the next turn reopens or waits.
            run.recover().await?;
        };
        let name = self.workflow.clone();
        let record = run
            .call(|engine| {
                let name = name.clone();
                async move {
                    engine
                        .workflow_by_name(name.as_str())?
                        .get("sim")
                        .await?
                        .record()
                        .await
                }
            })
            .await?;
        let journal = run
            .call(
                |engine| async move { Ok(engine.inner.env.store.journal(record.instance).await?) },
            )
            .await?;
        let mut log = Vec::new();
        loop {
            let after = log.last().map_or(0, |r: &LogRecord| r.id);
            let page = run
                .call(|engine| async move {
                    Ok(engine
                        .inner
                        .env
                        .store
                        .log(record.instance, after, 1000)
                        .await?)
                })
                .await?;
            if page.is_empty() {
                break;
            }
            log.extend(page);
        }
        run.engine.shutdown().await;
        let injected = plan.lock().map(|p| p.injected.clone()).unwrap_or_default();
        Ok(Run {
            status: status.status,
            output: status.output,
            error: status.error,
            journal,
            log,
            bodies: hooks
                .runs()
                .into_iter()
                .filter(|r| r.instance.as_str() == "sim")
                .collect(),
            injected,
            crashes: run.crashes,
        })
    }

    /// Sends the `i`-th event with its idempotency key.
    async fn send(&self, engine: Engine, i: usize) -> Result<(), crate::error::Error> {
        let (event_type, payload) = &self.events[i];
        let instance = engine
            .workflow_by_name(self.workflow.as_str())?
            .get("sim")
            .await?;
        instance
            .send_event_with_key(event_type, payload, &format!("sim-event-{i}"))
            .await
            .map(|_| ())
    }

    /// One of the simulator's own faults, if the budget allows.
    async fn act(
        &self,
        rng: &mut Rng,
        plan: &Arc<Mutex<Plan>>,
        clock: &Clock,
        instance: &Instance,
        resume_at: &mut Option<Timestamp>,
    ) {
        let mut kinds = Vec::new();
        if self.faults.clock_jumps {
            kinds.push(0);
        }
        if self.faults.duplicate_events && !self.events.is_empty() {
            kinds.push(1);
        }
        if self.faults.pauses && resume_at.is_none() {
            kinds.push(2);
        }
        if kinds.is_empty() {
            return;
        }
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let amount = match kind {
            0 => 1 + rng.below(7200),
            1 => rng.below(self.events.len() as u64),
            _ => 1 + rng.below(600),
        };
        {
            let mut plan = plan
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if plan.budget == 0 {
                return;
            }
            plan.budget -= 1;
            plan.injected.push(match kind {
                0 => format!("clock jump {amount}s"),
                1 => format!("duplicate event {amount}"),
                _ => format!("pause for {amount}s"),
            });
        }
        match kind {
            0 => tokio::time::advance(Duration::from_secs(amount)).await,
            1 => {
                let i = amount as usize;
                let (event_type, payload) = &self.events[i];
                // A failure here is a client's failure, not the engine's: the check is
                // that a resend is never delivered twice.
                let _ = instance
                    .send_event_with_key(event_type, payload, &format!("sim-event-{i}"))
                    .await;
            }
            _ => {
                if instance.pause().await.is_ok() {
                    *resume_at = Some(clock.now().saturating_add(Duration::from_secs(amount)));
                }
            }
        }
    }
}

/// How a run opens (and, after each crash, reopens) its engine.
struct Opener {
    path: std::path::PathBuf,
    register: Register,
    hooks: Arc<Hooks>,
    plan: Arc<Mutex<Plan>>,
    crashed: Arc<tokio::sync::Notify>,
    clock: Clock,
}

impl Opener {
    async fn open(&self) -> Result<(Engine, Arc<FaultStore>), TestError> {
        let path = self.path.clone();
        let inner = tokio::task::spawn_blocking(move || {
            cairn_sqlite::SqliteStore::open(
                &path,
                cairn_sqlite::Options::default().durability(cairn_sqlite::Durability::Normal),
            )
        })
        .await
        .map_err(|e| TestError::new(format!("open the database: {e}")))?
        .map_err(|e| TestError::new(format!("open the database: {e}")))?;
        // The faults are decided on the runtime's thread, in the order the tasks call the
        // store (the same order for the same seed); the SQLite calls under them run on
        // blocking threads, which keeps the paused clock still while they work.
        let store = Arc::new(FaultStore::new(
            Arc::new(crate::engine::blocking::Blocking(Arc::new(inner))),
            Arc::clone(&self.plan),
            Arc::clone(&self.crashed),
        ));
        let builder = Engine::builder()
            .store(Arc::clone(&store) as Arc<dyn cairn_store::Store>)
            .store_calls_blocking()
            .clock(self.clock.clone())
            .drain_timeout(Duration::from_secs(1))
            .hooks(Arc::clone(&self.hooks));
        Ok(((self.register)(builder).start().await?, store))
    }
}

/// A run's engine, replaced by a new one on the same database after each crash.
struct Running {
    opener: Opener,
    engine: Engine,
    store: Arc<FaultStore>,
    crashes: u64,
}

impl Running {
    /// After a crash: the crashed engine shut down (its store lets nothing through), a new
    /// one opened. Otherwise nothing.
    async fn recover(&mut self) -> Result<(), TestError> {
        if self.store.is_dead() {
            self.crashes += 1;
            self.engine.shutdown().await;
            let (engine, store) = self.opener.open().await?;
            self.engine = engine;
            self.store = store;
        }
        Ok(())
    }

    /// Calls `f` on the engine until it succeeds, as a client retries: through outages
    /// (on the virtual clock) and crashes (on the next engine).
    async fn call<T, F, Fut>(&mut self, f: F) -> Result<T, TestError>
    where
        F: Fn(Engine) -> Fut,
        Fut: std::future::Future<Output = Result<T, crate::error::Error>>,
    {
        for _ in 0..10_000 {
            self.recover().await?;
            match f(self.engine.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) if e.code() == "store.unavailable" => {
                    if !self.store.is_dead() {
                        self.opener.clock.sleep(Duration::from_millis(100)).await;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(TestError::new("the store stayed unavailable"))
    }

    /// The simulated instance on the current engine.
    async fn instance(&mut self, workflow: &WorkflowName) -> Result<Instance, TestError> {
        let name = workflow.clone();
        self.call(|engine| {
            let name = name.clone();
            async move { engine.workflow_by_name(name.as_str())?.get("sim").await }
        })
        .await
    }
}

/// Whether an attempt of `run` was recorded as interrupted.
fn interrupted(run: &Run) -> bool {
    run.log.iter().any(is_interruption)
}

fn is_interruption(r: &LogRecord) -> bool {
    matches!(
        r.entry.kind,
        LogKind::AttemptFailure | LogKind::RollbackAttemptFailure
    ) && r.entry.meta["error"]["message"] == INTERRUPTED
}

/// A step of `run` that failed for good after using up its attempts, one of which was
/// interrupted, while the fault-free run's step of that name did not fail.
fn exhausted_by_interruptions(run: &Run, baseline: &Run) -> Option<String> {
    run.journal
        .iter()
        .filter(|s| s.key.kind == StepKind::Run && s.state == StepState::Failed)
        .filter(|s| {
            cairn_core::ResolvedConfig::from_persisted_json(&s.config)
                .is_ok_and(|c| !c.will_retry(s.attempts))
        })
        .filter(|s| {
            run.log
                .iter()
                .any(|r| r.entry.step.as_ref() == Some(&s.key) && is_interruption(r))
        })
        .find(|s| {
            !baseline
                .journal
                .iter()
                .any(|b| b.key == s.key && b.state == StepState::Failed)
        })
        .map(|s| s.key.target())
}

/// Each body run (or mock standing in for one) has exactly one recorded outcome for its
/// attempt, so no attempt ran twice and none ran after the step's success; each step
/// succeeded once at most, at an attempt whose body ran.
fn check_bodies(run: &Run) -> Result<(), String> {
    // (rollback, name, count, attempt) → attempt outcomes logged.
    let mut outcomes: HashMap<(bool, String, u32, u64), u32> = HashMap::new();
    let mut successes: HashMap<(bool, String, u32), u32> = HashMap::new();
    for r in &run.log {
        let Some(step) = &r.entry.step else { continue };
        let rollback = match r.entry.kind {
            LogKind::AttemptSuccess | LogKind::AttemptFailure => false,
            LogKind::RollbackAttemptSuccess | LogKind::RollbackAttemptFailure => true,
            LogKind::StepSuccess | LogKind::RollbackStepSuccess => {
                let rollback = r.entry.kind == LogKind::RollbackStepSuccess;
                *successes
                    .entry((rollback, step.name.clone(), step.count))
                    .or_default() += 1;
                continue;
            }
            _ => continue,
        };
        let attempt = r.entry.meta["attempt"].as_u64().unwrap_or(0);
        *outcomes
            .entry((rollback, step.name.clone(), step.count, attempt))
            .or_default() += 1;
    }
    let what = |rollback: bool| {
        if rollback { "rollback handler" } else { "body" }
    };
    let mut ran: HashMap<(bool, String, u32, u32), u32> = HashMap::new();
    for b in &run.bodies {
        *ran.entry((b.rollback, b.step.name.clone(), b.step.count, b.attempt))
            .or_default() += 1;
    }
    for ((rollback, name, count, attempt), n) in &ran {
        if *n > 1 {
            return Err(format!(
                "the {} of step {name}-{count} ran {n} times for attempt {attempt}",
                what(*rollback)
            ));
        }
        let logged = outcomes
            .get(&(*rollback, name.clone(), *count, u64::from(*attempt)))
            .copied()
            .unwrap_or(0);
        if logged != 1 {
            return Err(format!(
                "the {} of step {name}-{count} ran for attempt {attempt}, which has {logged} recorded outcomes (not 1)",
                what(*rollback)
            ));
        }
    }
    for ((rollback, name, count), n) in &successes {
        if *n > 1 {
            return Err(format!(
                "the {} of step {name}-{count} succeeded {n} times",
                what(*rollback)
            ));
        }
    }
    for step in &run.journal {
        if step.state != StepState::Succeeded
            || !matches!(step.key.kind, StepKind::Run | StepKind::Rollback)
        {
            continue;
        }
        let rollback = step.key.kind == StepKind::Rollback;
        let id = (
            rollback,
            step.key.name.clone(),
            step.key.count,
            step.attempts,
        );
        if !ran.contains_key(&id) {
            return Err(format!(
                "step {} succeeded at attempt {} but no body ran for that attempt",
                step.key.target(),
                step.attempts
            ));
        }
    }
    Ok(())
}

/// The steps whose compensation succeeded, in the order they ran.
fn compensated(run: &Run) -> Vec<String> {
    run.log
        .iter()
        .filter(|r| r.entry.kind == LogKind::RollbackStepSuccess)
        .filter_map(|r| r.entry.step.as_ref().map(cairn_core::StepKey::target))
        .collect()
}

/// Each compensation recorded once, in reverse start order of the steps.
fn check_compensations(run: &Run) -> Result<(), String> {
    let done = compensated(run);
    let mut unique = HashSet::new();
    for target in &done {
        if !unique.insert(target) {
            return Err(format!(
                "the compensation of step {target} was recorded twice"
            ));
        }
    }
    let mut started: Vec<&StepRecord> = run
        .journal
        .iter()
        .filter(|s| s.key.kind == StepKind::Run && s.has_rollback)
        .collect();
    started.sort_by_key(|s| std::cmp::Reverse(s.seq));
    let order: Vec<String> = started.iter().map(|s| s.key.target()).collect();
    let expected: Vec<&String> = order.iter().filter(|t| unique.contains(t)).collect();
    if done.iter().collect::<Vec<_>>() != expected {
        return Err(format!(
            "compensations ran in the order {done:?}, not in reverse start order {order:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{InstanceId, LogEntry, StepKey};

    fn key(kind: StepKind, name: &str) -> StepKey {
        StepKey {
            kind,
            name: name.into(),
            count: 1,
        }
    }

    fn body(name: &str, attempt: u32, rollback: bool) -> BodyRun {
        BodyRun {
            workflow: WorkflowName::new("w").unwrap(),
            instance: InstanceId::new("sim").unwrap(),
            step: key(StepKind::Run, name),
            attempt,
            rollback,
            mocked: false,
        }
    }

    fn step(name: &str, seq: u32, attempts: u32, has_rollback: bool) -> StepRecord {
        StepRecord {
            key: key(StepKind::Run, name),
            seq,
            state: StepState::Succeeded,
            config: serde_json::json!({}),
            attempts,
            in_flight: false,
            wake_at: None,
            output: Some("null".into()),
            error: None,
            started_at: Timestamp::from_millis(0),
            ended_at: None,
            has_rollback,
        }
    }

    fn outcome(kind: LogKind, name: &str, attempt: u32, id: u64) -> LogRecord {
        LogRecord {
            id,
            entry: LogEntry {
                kind,
                at: Timestamp::from_millis(0),
                step: Some(key(StepKind::Run, name)),
                meta: serde_json::json!({ "attempt": attempt }),
            },
        }
    }

    fn compensation(name: &str, id: u64) -> LogRecord {
        LogRecord {
            id,
            entry: LogEntry {
                kind: LogKind::RollbackStepSuccess,
                at: Timestamp::from_millis(0),
                step: Some(key(StepKind::Run, name)),
                meta: serde_json::json!({}),
            },
        }
    }

    fn run(journal: Vec<StepRecord>, log: Vec<LogRecord>, bodies: Vec<BodyRun>) -> Run {
        Run {
            status: InstanceStatus::Complete,
            output: None,
            error: None,
            journal,
            log,
            bodies,
            injected: Vec::new(),
            crashes: 0,
        }
    }

    #[test]
    fn a_body_that_ran_twice_for_one_attempt_is_reported() {
        let log = vec![
            outcome(LogKind::AttemptFailure, "a", 1, 1),
            outcome(LogKind::AttemptSuccess, "a", 2, 2),
        ];
        let twice = run(
            vec![step("a", 0, 2, false)],
            log.clone(),
            vec![
                body("a", 1, false),
                body("a", 2, false),
                body("a", 2, false),
            ],
        );
        let err = check_bodies(&twice).unwrap_err();
        assert!(err.contains("step a-1 ran 2 times for attempt 2"), "{err}");
        let once = run(
            vec![step("a", 0, 2, false)],
            log,
            vec![body("a", 1, false), body("a", 2, false)],
        );
        assert!(check_bodies(&once).is_ok());
    }

    #[test]
    fn a_body_run_without_its_own_outcome_is_reported() {
        // Attempt 3 ran after attempt 2 had succeeded, and nothing recorded it.
        let after_success = run(
            vec![step("a", 0, 2, false)],
            vec![
                outcome(LogKind::AttemptFailure, "a", 1, 1),
                outcome(LogKind::AttemptSuccess, "a", 2, 2),
            ],
            vec![
                body("a", 1, false),
                body("a", 2, false),
                body("a", 3, false),
            ],
        );
        let err = check_bodies(&after_success).unwrap_err();
        assert!(
            err.contains("attempt 3, which has 0 recorded outcomes"),
            "{err}"
        );
        // A step that succeeded twice.
        let twice = run(
            vec![step("a", 0, 1, false)],
            vec![
                outcome(LogKind::AttemptSuccess, "a", 1, 1),
                outcome(LogKind::StepSuccess, "a", 1, 2),
                outcome(LogKind::StepSuccess, "a", 1, 3),
            ],
            vec![body("a", 1, false)],
        );
        assert!(
            check_bodies(&twice)
                .unwrap_err()
                .contains("succeeded 2 times")
        );
    }

    #[test]
    fn a_step_that_succeeded_without_its_body_running_is_reported() {
        let unseen = run(
            vec![step("a", 0, 3, false)],
            vec![outcome(LogKind::AttemptFailure, "a", 2, 1)],
            vec![body("a", 2, false)],
        );
        let err = check_bodies(&unseen).unwrap_err();
        assert!(err.contains("succeeded at attempt 3"), "{err}");
    }

    #[test]
    fn compensations_twice_or_out_of_order_are_reported() {
        let journal = vec![step("a", 0, 1, true), step("b", 1, 1, true)];
        let right = run(
            journal.clone(),
            vec![compensation("b", 1), compensation("a", 2)],
            vec![],
        );
        assert!(check_compensations(&right).is_ok());
        let twice = run(
            journal.clone(),
            vec![compensation("b", 1), compensation("b", 2)],
            vec![],
        );
        assert!(check_compensations(&twice).unwrap_err().contains("twice"));
        let reversed = run(
            journal,
            vec![compensation("a", 1), compensation("b", 2)],
            vec![],
        );
        assert!(
            check_compensations(&reversed)
                .unwrap_err()
                .contains("reverse start order")
        );
    }
}
