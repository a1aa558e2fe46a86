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
use crate::testing::faults::{FaultStore, Live, Plan, Rng, StoreFaults};
use crate::testing::introspect::{Modifier, TestError};
use crate::testing::ledger::{Ledger, LedgerEntry};
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
    /// Half the crashes leave zombies (with `crashes` on): the crashed engine is not
    /// dropped at once but lives on for up to a minute of virtual time, and its lifetimes'
    /// writes (and its writes at the crash) reach the live database once the new engine has
    /// claimed the instance. The fence must refuse every one of them.
    pub zombies: bool,
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
            zombies: true,
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
            zombies: false,
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
            zombies: self.zombies,
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
    /// Crashes whose engine lived on as a zombie, over all seeds.
    pub zombies: u64,
    /// Writes of zombie engines that the live store refused (each one the fence held).
    pub zombie_writes_refused: u64,
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
/// - each step's attempts, as the event log records them, are 1 to the journal's count:
///   each started once, in order, none skipped, each with one outcome;
/// - with a [`Ledger`] the workflow's step bodies record into
///   ([`Simulation::ledger`]): by the ledger alone, no body ran twice for an attempt, none
///   ran after its step ended, and the successful attempt's body ran;
/// - every event sent (a duplicate with its idempotency key too) was buffered once,
///   delivered at most once, in the order sent per type, and what no wait took is still
///   buffered at the end (nothing, when every wait took one);
/// - no write of a crashed engine's zombie lifetimes was accepted after another engine
///   claimed the instance;
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
    ledger: Option<Ledger>,
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
    /// The simulated instance's body runs as the workflow's ledger recorded them.
    ledger: Option<Vec<LedgerEntry>>,
    injected: Vec<String>,
    crashes: u64,
    zombies: u64,
    zombie_refused: u64,
    /// Writes of zombies that the live store accepted.
    violations: Vec<String>,
    /// Every event send and the store's answer: its idempotency key, and whether it was
    /// buffered.
    sends: Vec<(Option<String>, cairn_store::Sent)>,
    /// Sends the store refused with an error of its own (see `Plan::send_errors`).
    send_errors: Vec<String>,
    /// The events still buffered for the instance at the end, oldest first.
    buffered: Vec<cairn_store::StoredEvent>,
    /// Event types the run's mocks deliver (no account is kept for them).
    mocked_events: HashSet<String>,
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
            ledger: None,
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

    /// The ledger the workflow's step bodies record into ([`Ledger::record`]): every run
    /// (the fault-free one too) is checked against it, independently of what the engine
    /// reports. The simulation empties it at the start of each run.
    #[must_use]
    pub fn ledger(mut self, ledger: &Ledger) -> Self {
        self.ledger = Some(ledger.clone());
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
        self.check_run(&baseline)
            .map_err(|e| TestError::new(format!("the fault-free run: {e}")))?;
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
            report.zombies += run.zombies;
            report.zombie_writes_refused += run.zombie_refused;
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
        self.check_run(run)?;
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

    /// The checks every run must pass on its own, the fault-free one too.
    fn check_run(&self, run: &Run) -> Result<(), String> {
        if let Some(violation) = run.violations.first() {
            return Err(format!(
                "the fence let a stale lifetime write: {violation} ({} such writes)",
                run.violations.len()
            ));
        }
        check_bodies(run)?;
        check_attempts(run)?;
        check_ledger(run)?;
        self.check_events(run)?;
        check_compensations(run)
    }

    /// Every event the run sent is accounted for: each buffered once however often it
    /// was sent with its key, taken at most once, in the order sent per type, and what was
    /// not taken still buffered at the end (nothing, when every wait took one).
    fn check_events(&self, run: &Run) -> Result<(), String> {
        if let Some(error) = run.send_errors.first() {
            return Err(format!(
                "the store refused an event send instead of answering it ({} such): {error}",
                run.send_errors.len()
            ));
        }
        // The order the events were buffered in, by index.
        let mut buffered = Vec::new();
        for (i, _) in self.events.iter().enumerate() {
            let key = event_key(i);
            let times = run
                .sends
                .iter()
                .filter(|(k, sent)| {
                    k.as_deref() == Some(key.as_str())
                        && matches!(sent, cairn_store::Sent::Buffered(_))
                })
                .count();
            if times > 1 {
                return Err(format!(
                    "event {i} (key {key}) was buffered {times} times: a send with its idempotency key was not taken for the retry it is"
                ));
            }
        }
        for (key, sent) in &run.sends {
            if let (Some(i), cairn_store::Sent::Buffered(_)) =
                (key.as_deref().and_then(event_index), sent)
                && i < self.events.len()
            {
                buffered.push(i);
            }
        }
        let mut waits: HashMap<String, u32> = HashMap::new();
        for r in run
            .log
            .iter()
            .filter(|r| r.entry.kind == LogKind::WaitComplete)
        {
            let step = r.entry.step.as_ref().map(cairn_core::StepKey::target);
            let n = waits.entry(step.clone().unwrap_or_default()).or_default();
            *n += 1;
            if *n > 1 {
                return Err(format!("wait {step:?} completed {n} times"));
            }
        }
        let mut types: Vec<&str> = self.events.iter().map(|(t, _)| t.as_str()).collect();
        types.sort_unstable();
        types.dedup();
        for event_type in types {
            if run.mocked_events.contains(event_type) {
                continue;
            }
            // What the log shows of each event buffered, in the order buffered.
            let sent: Vec<(String, serde_json::Value)> = buffered
                .iter()
                .filter(|i| self.events[**i].0 == event_type)
                .map(|i| stored_and_logged(&self.events[*i].1))
                .collect::<Result<_, _>>()?;
            let taken: Vec<&serde_json::Value> = run
                .log
                .iter()
                .filter(|r| {
                    r.entry.kind == LogKind::WaitComplete && r.entry.meta["type"] == event_type
                })
                .map(|r| &r.entry.meta["payload"])
                .collect();
            let expected: Vec<&serde_json::Value> = sent
                .iter()
                .map(|(_, logged)| logged)
                .take(taken.len())
                .collect();
            if taken.len() > sent.len() || taken != expected {
                let order: Vec<&serde_json::Value> = sent.iter().map(|(_, l)| l).collect();
                return Err(format!(
                    "the waits for {event_type:?} took {taken:?}, but the events were buffered in the order {order:?} (each is delivered once, first in first out)"
                ));
            }
            let left: Vec<&str> = run
                .buffered
                .iter()
                .filter(|e| e.event_type.as_str() == event_type)
                .map(|e| e.payload.as_str())
                .collect();
            let untaken: Vec<&str> = sent[taken.len()..]
                .iter()
                .map(|(stored, _)| stored.as_str())
                .collect();
            if left != untaken {
                return Err(format!(
                    "after the run the store buffers {left:?} of type {event_type:?}, but the events no wait took are {untaken:?}"
                ));
            }
        }
        if let Some(stray) = run
            .buffered
            .iter()
            .find(|e| !self.events.iter().any(|(t, _)| t == e.event_type.as_str()))
        {
            return Err(format!(
                "after the run the store buffers an event nobody sent: {stray:?}"
            ));
        }
        Ok(())
    }

    /// One run: `seed` drives the faults (`None`: none).
    async fn run_once(&self, seed: Option<u64>) -> Result<Run, TestError> {
        let dir = tempfile::tempdir()
            .map_err(|e| TestError::new(format!("create a temporary directory: {e}")))?;
        let register = (self.world)();
        let hooks = Arc::new(Hooks::recording());
        let scope = Scope::Workflow {
            workflow: self.workflow.clone(),
            since: None,
        };
        if let Some(mocks) = &self.mocks {
            mocks(&Modifier::new(Arc::clone(&hooks), scope.clone()))?;
        }
        let mocked_events: HashSet<String> = hooks.modify(scope, |m| {
            m.events.keys().map(|t| t.as_str().to_owned()).collect()
        });
        if let Some(ledger) = &self.ledger {
            // What an earlier run (or the test itself) left.
            ledger.take();
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
            live: Arc::new(Live::default()),
        };
        let (engine, store, raw) = opener.open().await?;
        let mut run = Running {
            opener,
            engine,
            store,
            raw,
            crashes: 0,
            zombies: Vec::new(),
            zombies_seen: 0,
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
            && (self.faults.clock_jumps
                || (self.faults.duplicate_events && !self.events.is_empty())
                || self.faults.pauses);
        let stuck = clock.sleep(STUCK_AFTER);
        let mut stuck = std::pin::pin!(stuck);
        let mut resume_at: Option<Timestamp> = None;
        let status = loop {
            let instance = run.instance(&self.workflow).await?;
            // Once the budget is spent no action is taken: waking up for one anyway would
            // turn a day's wait into thousands of idle turns (each reading the instance).
            let acting = actions
                && plan
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .budget
                    > 0;
            let next_action = clock.sleep(Duration::from_millis(1 + rng.below(30_000)));
            let resume: futures::future::BoxFuture<'static, ()> = match resume_at {
                Some(at) => clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            let zombie_ends: futures::future::BoxFuture<'static, ()> = match run.next_zombie_end() {
                Some(at) => clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                biased;
                () = crashed.notified() => {}
                status = instance.wait() => if let Ok(status) = status {
                    break status;
                },
                () = zombie_ends => run.end_zombies(false).await,
                () = resume => {
                    if instance.resume().await.is_ok() {
                        resume_at = None;
                    }
                }
                () = next_action, if acting => {
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
        // Zombies still about try their last writes now; then they are gone.
        run.end_zombies(true).await;
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
        let buffered = run.buffered_events(record.instance).await?;
        run.engine.shutdown().await;
        let prefix = format!("{}/sim/", self.workflow);
        let ledger = self.ledger.as_ref().map(|ledger| {
            ledger
                .take()
                .into_iter()
                .filter(|e| e.key.starts_with(&prefix))
                .collect()
        });
        let (injected, violations, zombie_refused, sends, send_errors) = {
            let mut plan = plan
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (
                plan.injected.clone(),
                std::mem::take(&mut plan.violations),
                plan.zombie_refused,
                std::mem::take(&mut plan.sends),
                std::mem::take(&mut plan.send_errors),
            )
        };
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
            ledger,
            injected,
            crashes: run.crashes,
            zombies: run.zombies_seen,
            zombie_refused,
            violations,
            sends,
            send_errors,
            buffered,
            mocked_events,
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
            .send_event_with_key(event_type, payload, &event_key(i))
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
                    .send_event_with_key(event_type, payload, &event_key(i))
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
    /// The run's live store, where zombies' calls go.
    live: Arc<Live>,
}

impl Opener {
    /// A new engine on the run's database: the engine, its fault store, and the database
    /// under it (for the simulator's own reads).
    async fn open(
        &self,
    ) -> Result<(Engine, Arc<FaultStore>, Arc<cairn_sqlite::SqliteStore>), TestError> {
        let path = self.path.clone();
        let inner = tokio::task::spawn_blocking(move || {
            super::template::create(&path);
            cairn_sqlite::SqliteStore::open(
                &path,
                cairn_sqlite::Options::default().durability(cairn_sqlite::Durability::Normal),
            )
        })
        .await
        .map_err(|e| TestError::new(format!("open the database: {e}")))?
        .map_err(|e| TestError::new(format!("open the database: {e}")))?;
        let raw = Arc::new(inner);
        // The faults are decided on the runtime's thread, in the order the tasks call the
        // store (the same order for the same seed); the SQLite calls under them run on
        // blocking threads, which keeps the paused clock still while they work.
        let store = Arc::new(FaultStore::new(
            Arc::new(crate::engine::blocking::Blocking(
                Arc::clone(&raw) as Arc<dyn cairn_store::Store>
            )),
            Arc::clone(&self.plan),
            Arc::clone(&self.crashed),
            Arc::clone(&self.live),
        ));
        self.live.set(&store);
        let builder = Engine::builder()
            .store(Arc::clone(&store) as Arc<dyn cairn_store::Store>)
            .store_calls_blocking()
            .clock(self.clock.clone())
            .drain_timeout(Duration::from_secs(1))
            .hooks(Arc::clone(&self.hooks));
        Ok(((self.register)(builder).start().await?, store, raw))
    }
}

/// A crashed engine that lives on: its lifetimes run until `until`, their store calls
/// going to the live store.
struct Zombie {
    engine: Engine,
    store: Arc<FaultStore>,
    until: Timestamp,
}

/// A run's engine, replaced by a new one on the same database after each crash.
struct Running {
    opener: Opener,
    engine: Engine,
    store: Arc<FaultStore>,
    raw: Arc<cairn_sqlite::SqliteStore>,
    crashes: u64,
    /// Crashed engines living on.
    zombies: Vec<Zombie>,
    zombies_seen: u64,
}

impl Running {
    /// After a crash: the crashed engine shut down (its store lets nothing through), or
    /// left running as a zombie (its database handle closed: one engine per file), and a
    /// new one opened. Otherwise nothing.
    async fn recover(&mut self) -> Result<(), TestError> {
        if !self.store.is_dead() {
            return Ok(());
        }
        self.crashes += 1;
        let zombie_for = self.store.zombie_for();
        if zombie_for.is_none() {
            self.engine.shutdown().await;
        } else {
            let _ = self.store.inner.close().await;
        }
        self.store.end_outage();
        let (engine, store, raw) = self.opener.open().await?;
        let crashed_engine = std::mem::replace(&mut self.engine, engine);
        let crashed_store = std::mem::replace(&mut self.store, store);
        self.raw = raw;
        if let Some(lasts) = zombie_for {
            self.zombies_seen += 1;
            self.zombies.push(Zombie {
                engine: crashed_engine,
                store: crashed_store,
                until: self.opener.clock.now().saturating_add(lasts),
            });
        }
        Ok(())
    }

    /// When the next zombie's time is up.
    fn next_zombie_end(&self) -> Option<Timestamp> {
        self.zombies.iter().map(|z| z.until).min()
    }

    /// Ends the zombies whose time is up (`all`: every one): their calls still waiting go
    /// to the live store, then their engines shut down.
    async fn end_zombies(&mut self, all: bool) {
        let now = self.opener.clock.now();
        let (ending, living): (Vec<Zombie>, Vec<Zombie>) = std::mem::take(&mut self.zombies)
            .into_iter()
            .partition(|z| all || z.until <= now);
        self.zombies = living;
        for zombie in &ending {
            zombie.store.release_zombie();
        }
        for zombie in ending {
            zombie.engine.shutdown().await;
        }
    }

    /// The events still buffered for `instance`, read from the database itself.
    async fn buffered_events(
        &mut self,
        instance: cairn_store::InstanceRef,
    ) -> Result<Vec<cairn_store::StoredEvent>, TestError> {
        self.recover().await?;
        let raw = Arc::clone(&self.raw);
        // From a blocking thread, as every store call of the run: paused time stays still.
        tokio::task::spawn_blocking(move || {
            futures::executor::block_on(raw.buffered_events(instance))
        })
        .await
        .map_err(|e| TestError::new(format!("read the buffered events: {e}")))?
        .map_err(|e| TestError::new(format!("read the buffered events: {e}")))
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

/// The idempotency key of the simulation's `i`-th event: every send of it uses it.
fn event_key(i: usize) -> String {
    format!("sim-event-{i}")
}

/// Which event an idempotency key is the key of.
fn event_index(key: &str) -> Option<usize> {
    key.strip_prefix("sim-event-")?.parse().ok()
}

/// How an event payload is stored (its JSON text as buffered) and how a `WAIT_COMPLETE`
/// record shows it.
fn stored_and_logged(payload: &serde_json::Value) -> Result<(String, serde_json::Value), String> {
    let stored =
        cairn_core::binary::to_string(payload).map_err(|e| format!("an event payload: {e}"))?;
    let mut logged: serde_json::Value =
        serde_json::from_str(&stored).map_err(|e| format!("an event payload: {e}"))?;
    cairn_core::binary::summarise(&mut logged);
    Ok((stored, logged))
}

/// Each `run` and rollback step's attempts, as the event log records them, are exactly
/// 1 to its journal entry's count: each started once and in order (none skipped, none
/// repeated), each with one outcome, but for an attempt still in flight, and none beyond.
fn check_attempts(run: &Run) -> Result<(), String> {
    // (rollback, name, count) → attempts started, in log order; attempt → outcomes.
    type Id = (bool, String, u32);
    let mut starts: HashMap<Id, Vec<u64>> = HashMap::new();
    let mut outcomes: HashMap<Id, HashMap<u64, u32>> = HashMap::new();
    for r in &run.log {
        let Some(step) = &r.entry.step else { continue };
        let (rollback, start) = match r.entry.kind {
            LogKind::AttemptStart => (false, true),
            LogKind::RollbackAttemptStart => (true, true),
            LogKind::AttemptSuccess | LogKind::AttemptFailure => (false, false),
            LogKind::RollbackAttemptSuccess | LogKind::RollbackAttemptFailure => (true, false),
            _ => continue,
        };
        let id = (rollback, step.name.clone(), step.count);
        let attempt = r.entry.meta["attempt"].as_u64().unwrap_or(0);
        if start {
            starts.entry(id).or_default().push(attempt);
        } else {
            *outcomes.entry(id).or_default().entry(attempt).or_default() += 1;
        }
    }
    let what = |rollback: bool| if rollback { "rollback of step" } else { "step" };
    let mut journaled = HashSet::new();
    for record in &run.journal {
        let rollback = match record.key.kind {
            StepKind::Run => false,
            StepKind::Rollback => true,
            _ => continue,
        };
        let id = (rollback, record.key.name.clone(), record.key.count);
        let target = record.key.target();
        let n = u64::from(record.attempts);
        let started = starts.get(&id).cloned().unwrap_or_default();
        let expected: Vec<u64> = (1..=n).collect();
        if started != expected {
            return Err(format!(
                "the {} {target} recorded the attempt starts {started:?}, but its journal entry counts {n} attempts (expected {expected:?})",
                what(rollback)
            ));
        }
        let ended = outcomes.get(&id).cloned().unwrap_or_default();
        for attempt in 1..=n {
            let logged = ended.get(&attempt).copied().unwrap_or(0);
            let due = u32::from(attempt < n || !record.in_flight);
            if logged != due {
                return Err(format!(
                    "attempt {attempt} of the {} {target} has {logged} recorded outcomes, not {due}",
                    what(rollback)
                ));
            }
        }
        if let Some(beyond) = ended.keys().find(|a| **a == 0 || **a > n) {
            return Err(format!(
                "the {} {target} recorded an outcome of attempt {beyond}, but its journal entry counts {n} attempts",
                what(rollback)
            ));
        }
        journaled.insert(id);
    }
    if let Some((rollback, name, count)) = starts
        .keys()
        .chain(outcomes.keys())
        .find(|id| !journaled.contains(*id))
    {
        return Err(format!(
            "the log records attempts of the {} {name}-{count}, which the journal does not have",
            what(*rollback)
        ));
    }
    Ok(())
}

/// By the workflow's own ledger: no step body ran twice for one attempt, none ran for an
/// attempt the journal does not count (after its step succeeded, or past its last), and a
/// step that succeeded had its successful attempt's body run (unless a mock stood in).
fn check_ledger(run: &Run) -> Result<(), String> {
    let Some(ledger) = &run.ledger else {
        return Ok(());
    };
    let mut ran: HashMap<(&str, u32, u32), u32> = HashMap::new();
    for e in ledger {
        let n = ran
            .entry((e.name.as_str(), e.count, e.attempt))
            .or_default();
        *n += 1;
        if *n > 1 {
            return Err(format!(
                "by the workflow's ledger, the body of step {}-{} ran {n} times for attempt {}",
                e.name, e.count, e.attempt
            ));
        }
        let Some(record) = run.journal.iter().find(|r| {
            r.key.kind == StepKind::Run && r.key.name == e.name && r.key.count == e.count
        }) else {
            return Err(format!(
                "by the workflow's ledger, the body of step {}-{} ran (attempt {}), but the journal has no such step",
                e.name, e.count, e.attempt
            ));
        };
        if e.attempt > record.attempts {
            let when = if record.state == StepState::Succeeded {
                "after its step succeeded at attempt"
            } else {
                "past the journal's last attempt,"
            };
            return Err(format!(
                "by the workflow's ledger, the body of step {}-{} ran for attempt {} {when} {}",
                e.name, e.count, e.attempt, record.attempts
            ));
        }
    }
    for record in &run.journal {
        if record.key.kind != StepKind::Run || record.state != StepState::Succeeded {
            continue;
        }
        let (name, count) = (record.key.name.as_str(), record.key.count);
        let recorded = ran.keys().any(|(n, c, _)| *n == name && *c == count);
        let mocked = run.bodies.iter().any(|b| {
            !b.rollback
                && b.mocked
                && b.step.name == name
                && b.step.count == count
                && b.attempt == record.attempts
        });
        if recorded && !mocked && !ran.contains_key(&(name, count, record.attempts)) {
            return Err(format!(
                "step {} succeeded at attempt {}, but by the workflow's ledger no body ran for it",
                record.key.target(),
                record.attempts
            ));
        }
    }
    Ok(())
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
            config: serde_json::json!({}).into(),
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
            ledger: None,
            injected: Vec::new(),
            crashes: 0,
            zombies: 0,
            zombie_refused: 0,
            violations: Vec::new(),
            sends: Vec::new(),
            send_errors: Vec::new(),
            buffered: Vec::new(),
            mocked_events: HashSet::new(),
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

    fn start(name: &str, attempt: u32, id: u64) -> LogRecord {
        outcome(LogKind::AttemptStart, name, attempt, id)
    }

    #[test]
    fn attempt_numbers_that_skip_repeat_or_lack_an_outcome_are_reported() {
        let journal = vec![step("a", 0, 3, false)];
        let log = |starts: &[u32], outcomes: &[u32]| {
            let mut log: Vec<LogRecord> = starts.iter().map(|a| start("a", *a, 0)).collect();
            log.extend(
                outcomes
                    .iter()
                    .map(|a| outcome(LogKind::AttemptFailure, "a", *a, 0)),
            );
            log
        };
        let right = run(journal.clone(), log(&[1, 2, 3], &[1, 2, 3]), vec![]);
        assert!(check_attempts(&right).is_ok());
        let skipped = run(journal.clone(), log(&[1, 3], &[1, 3]), vec![]);
        let err = check_attempts(&skipped).unwrap_err();
        assert!(err.contains("attempt starts [1, 3]"), "{err}");
        let repeated = run(journal.clone(), log(&[1, 2, 2, 3], &[1, 2, 3]), vec![]);
        assert!(check_attempts(&repeated).is_err());
        let no_outcome = run(journal.clone(), log(&[1, 2, 3], &[1, 3]), vec![]);
        let err = check_attempts(&no_outcome).unwrap_err();
        assert!(err.contains("attempt 2 of the step a-1 has 0"), "{err}");
        let beyond = run(journal, log(&[1, 2, 3], &[1, 2, 3, 4]), vec![]);
        assert!(check_attempts(&beyond).unwrap_err().contains("attempt 4"));
        // An attempt still in flight has no outcome yet.
        let mut in_flight = step("a", 0, 2, false);
        in_flight.state = StepState::Running;
        in_flight.in_flight = true;
        let running = run(vec![in_flight], log(&[1, 2], &[1]), vec![]);
        assert!(check_attempts(&running).is_ok());
    }

    fn entry(name: &str, attempt: u32) -> LedgerEntry {
        LedgerEntry {
            key: format!("w/sim/0/{name}/1"),
            name: name.into(),
            count: 1,
            attempt,
        }
    }

    #[test]
    fn the_ledger_reports_a_body_run_twice_after_its_success_or_not_at_all() {
        let journal = vec![step("a", 0, 2, false)];
        let with = |entries: Vec<LedgerEntry>| Run {
            ledger: Some(entries),
            ..run(journal.clone(), vec![], vec![])
        };
        assert!(check_ledger(&with(vec![entry("a", 1), entry("a", 2)])).is_ok());
        let twice = check_ledger(&with(vec![entry("a", 1), entry("a", 2), entry("a", 2)]));
        assert!(twice.unwrap_err().contains("ran 2 times for attempt 2"));
        let after = check_ledger(&with(vec![entry("a", 1), entry("a", 2), entry("a", 3)]));
        assert!(
            after
                .unwrap_err()
                .contains("attempt 3 after its step succeeded at attempt 2")
        );
        let unseen = check_ledger(&with(vec![entry("a", 1)]));
        assert!(unseen.unwrap_err().contains("no body ran for it"));
        let stranger = check_ledger(&with(vec![entry("b", 1)]));
        assert!(stranger.unwrap_err().contains("no such step"));
    }

    fn simulation(events: Vec<(&str, serde_json::Value)>) -> Simulation {
        Simulation {
            world: Arc::new(|| -> Register { Arc::new(|b| b) }),
            workflow: WorkflowName::new("w").unwrap(),
            params: serde_json::Value::Null,
            events: events.into_iter().map(|(t, p)| (t.to_owned(), p)).collect(),
            seeds: 0..1,
            faults: Faults::none(),
            start: Timestamp::from_millis(0),
            attempts_in_output: false,
            mocks: None,
            ledger: None,
        }
    }

    fn taken(payload: &str, id: u64) -> LogRecord {
        LogRecord {
            id,
            entry: LogEntry {
                kind: LogKind::WaitComplete,
                at: Timestamp::from_millis(0),
                step: Some(StepKey {
                    kind: StepKind::WaitForEvent,
                    name: format!("wait {id}"),
                    count: 1,
                }),
                meta: serde_json::json!({ "payload": payload, "type": "go" }),
            },
        }
    }

    fn buffered(payload: &str) -> cairn_store::StoredEvent {
        cairn_store::StoredEvent {
            event_type: cairn_core::EventType::new("go").unwrap(),
            payload: format!("{payload:?}"),
            at: Timestamp::from_millis(0),
        }
    }

    #[test]
    fn events_taken_twice_out_of_order_or_left_behind_are_reported() {
        let sim = simulation(vec![
            ("go", serde_json::json!("one")),
            ("go", serde_json::json!("two")),
        ]);
        let sent = |keys: &[usize]| -> Vec<(Option<String>, cairn_store::Sent)> {
            keys.iter()
                .map(|i| {
                    (
                        Some(event_key(*i)),
                        cairn_store::Sent::Buffered(cairn_store::InstanceRef(1)),
                    )
                })
                .collect()
        };
        let with = |sends, log, left| Run {
            sends,
            buffered: left,
            ..run(vec![], log, vec![])
        };
        let right = with(sent(&[0, 1]), vec![taken("one", 1)], vec![buffered("two")]);
        assert!(sim.check_events(&right).is_ok());
        let all_taken = with(
            sent(&[0, 1]),
            vec![taken("one", 1), taken("two", 2)],
            vec![],
        );
        assert!(sim.check_events(&all_taken).is_ok());
        let newest_first = with(sent(&[0, 1]), vec![taken("two", 1)], vec![buffered("one")]);
        let err = sim.check_events(&newest_first).unwrap_err();
        assert!(err.contains("first in first out"), "{err}");
        let duplicate_buffered = with(sent(&[0, 1, 0]), vec![], vec![]);
        let err = sim.check_events(&duplicate_buffered).unwrap_err();
        assert!(err.contains("buffered 2 times"), "{err}");
        let left_behind = with(
            sent(&[0, 1]),
            vec![taken("one", 1), taken("two", 2)],
            vec![buffered("one")],
        );
        let err = sim.check_events(&left_behind).unwrap_err();
        assert!(err.contains("the store buffers"), "{err}");
        let lost = with(sent(&[0, 1]), vec![taken("one", 1)], vec![]);
        assert!(sim.check_events(&lost).is_err());
    }
}
