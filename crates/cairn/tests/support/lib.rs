//! Helpers shared by the behaviour tests: engines on a temporary SQLite database with a
//! virtual clock, and readers of the event log.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cairn::sqlite::{Durability, Options};
use cairn::{Clock, Engine, EngineBuilder, Instance, LogKind, LogRecord, StepKey};

/// A builder on a fresh database in `dir` with the virtual clock; durability NORMAL (a
/// process crash loses nothing; only power loss could, which tests do not simulate).
pub fn builder_at(path: &Path) -> EngineBuilder {
    Engine::builder()
        .sqlite(path)
        .sqlite_options(Options::default().durability(Durability::Normal))
        .clock(Clock::virtual_now())
}

/// A temporary directory and the database path inside it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    (dir, path)
}

/// A started engine with `register` applied, on a temporary database.
pub async fn engine(
    register: impl FnOnce(EngineBuilder) -> EngineBuilder,
) -> (Engine, tempfile::TempDir) {
    let (dir, path) = temp_db();
    let engine = register(builder_at(&path)).start().await.unwrap();
    (engine, dir)
}

/// The kinds of an instance's log records, in order.
pub async fn kinds<O: serde::de::DeserializeOwned>(instance: &Instance<O>) -> Vec<LogKind> {
    instance
        .log(0)
        .await
        .unwrap()
        .iter()
        .map(|r| r.entry.kind)
        .collect()
}

/// The log records of one kind.
pub async fn records<O: serde::de::DeserializeOwned>(
    instance: &Instance<O>,
    kind: LogKind,
) -> Vec<LogRecord> {
    instance
        .log(0)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.entry.kind == kind)
        .collect()
}

/// The step each record of `kind` concerns, in order.
pub async fn targets<O: serde::de::DeserializeOwned>(
    instance: &Instance<O>,
    kind: LogKind,
) -> Vec<String> {
    records(instance, kind)
        .await
        .iter()
        .map(|r| {
            r.entry
                .step
                .as_ref()
                .map(StepKey::target)
                .unwrap_or_default()
        })
        .collect()
}

/// Counts calls; shared between a test and the workflow it registers.
#[derive(Clone, Default, Debug)]
pub struct Counter(Arc<AtomicU32>);

impl Counter {
    pub fn bump(&self) -> u32 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Records values seen by workflow code.
#[derive(Clone, Debug)]
pub struct Seen<T>(Arc<Mutex<Vec<T>>>);

impl<T> Default for Seen<T> {
    fn default() -> Self {
        Seen(Arc::default())
    }
}

impl<T: Clone> Seen<T> {
    pub fn push(&self, value: T) {
        self.0.lock().unwrap().push(value);
    }
    pub fn all(&self) -> Vec<T> {
        self.0.lock().unwrap().clone()
    }
}

use std::future::Future;

use cairn::{Workflow, WorkflowError, WorkflowEvent, WorkflowStep};
use futures::future::BoxFuture;
use serde_json::Value;

type RunFn = Arc<
    dyn Fn(WorkflowEvent<Value>, WorkflowStep) -> BoxFuture<'static, Result<Value, WorkflowError>>
        + Send
        + Sync,
>;

/// A workflow whose `run` is a closure; `N` picks its name from [`NAMES`].
pub struct FnWorkflow<const N: usize = 0>(RunFn);

pub const NAMES: [&str; 3] = ["test", "second", "third"];

impl<const N: usize> Workflow for FnWorkflow<N> {
    const NAME: &'static str = NAMES[N];
    type Params = Value;
    type Output = Value;

    fn run(
        &self,
        event: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> impl Future<Output = Result<Value, WorkflowError>> + Send {
        (self.0)(event, step)
    }
}

/// A workflow named `test` running `f`.
pub fn wf<F, Fut>(f: F) -> FnWorkflow<0>
where
    F: Fn(WorkflowEvent<Value>, WorkflowStep) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, WorkflowError>> + Send + 'static,
{
    named::<0, _, _>(f)
}

/// A workflow named `NAMES[N]` running `f`.
pub fn named<const N: usize, F, Fut>(f: F) -> FnWorkflow<N>
where
    F: Fn(WorkflowEvent<Value>, WorkflowStep) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, WorkflowError>> + Send + 'static,
{
    FnWorkflow(Arc::new(move |e, s| Box::pin(f(e, s))))
}

/// Creates one instance of the `test` workflow with `params` and waits for it to finish.
pub async fn run_to_end(engine: &Engine, params: Value) -> Instance<Value> {
    let instance = engine
        .workflow::<FnWorkflow<0>>()
        .create(cairn::CreateOptions::new(params))
        .await
        .unwrap();
    instance.wait().await.unwrap();
    instance
}
