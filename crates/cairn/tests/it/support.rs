//! Helpers shared by the behaviour tests: engines on a temporary SQLite database with a
//! virtual clock, and readers of the event log.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cairn::sqlite::{Durability, Options};
use cairn::{Clock, Engine, EngineBuilder, Instance, LogKind, LogRecord, StepKey};

/// The store the behaviour tests run on. The same test code runs on both (`sqlite.rs`,
/// `postgres.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A builder with the virtual clock on the database `path` names: the file itself on
/// SQLite (durability NORMAL: a process crash loses nothing; only power loss could, which
/// tests do not simulate), a schema named after it on PostgreSQL, so a second engine built
/// for the same path opens the same data. Without a PostgreSQL server
/// (`CAIRN_TEST_PG_URL`), PostgreSQL tests run on SQLite, after a loud notice.
pub fn builder_on(backend: Backend, path: &Path) -> EngineBuilder {
    #[cfg(feature = "postgres")]
    if backend == Backend::Postgres
        && let Some(url) = cairn::postgres::test_url()
    {
        return Engine::builder()
            .postgres_options(
                cairn::postgres::Options::new(url)
                    .schema(schema_for(path))
                    .connections(4),
            )
            .clock(Clock::virtual_now());
    }
    #[cfg(not(feature = "postgres"))]
    if backend == Backend::Postgres {
        use std::io::Write as _;
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: built without the postgres feature; postgres:: tests run on SQLite ***\n"
            );
        });
    }
    Engine::builder()
        .sqlite(path)
        .sqlite_options(Options::default().durability(Durability::Normal))
        .clock(Clock::virtual_now())
}

/// A schema name for a test database path: the same path, the same schema.
pub fn schema_for(path: &Path) -> String {
    // FNV-1a: stable across runs and processes.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in path.to_string_lossy().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("t_{hash:016x}")
}

/// [`builder_on`] SQLite.
pub fn builder_at(path: &Path) -> EngineBuilder {
    builder_on(Backend::Sqlite, path)
}

/// A temporary directory and the database path inside it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    (dir, path)
}

/// A started engine with `register` applied, on a fresh database of `backend`.
pub async fn engine_on(
    backend: Backend,
    register: impl FnOnce(EngineBuilder) -> EngineBuilder,
) -> (Engine, tempfile::TempDir) {
    let (dir, path) = temp_db();
    let engine = register(builder_on(backend, &path)).start().await.unwrap();
    (engine, dir)
}

/// [`engine_on`] SQLite.
pub async fn engine(
    register: impl FnOnce(EngineBuilder) -> EngineBuilder,
) -> (Engine, tempfile::TempDir) {
    engine_on(Backend::Sqlite, register).await
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

/// The instance's status now.
pub async fn status_of<O: serde::de::DeserializeOwned>(
    instance: &Instance<O>,
) -> cairn::InstanceStatus {
    instance.status().await.unwrap().status
}

/// Waits until the instance has `status`.
pub async fn until_status(instance: &Instance<Value>, status: cairn::InstanceStatus) {
    instance.wait_for(|s| s.status == status).await.unwrap();
}

/// Waits until the instance has `status`, in virtual time an hour at a time, and fails
/// after `hours`: for a test whose defect leaves the instance waiting on something no timer
/// ends, where [`until_status`] would hang.
pub async fn until_status_within_hours(
    instance: &Instance<Value>,
    status: cairn::InstanceStatus,
    hours: u32,
) {
    let mut waited = 0;
    while status_of(instance).await != status {
        assert!(waited < hours, "not {status:?} after {waited} h");
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        waited += 1;
    }
}

/// Waits until `done`, for what the engine does just after a commit a test has seen.
/// Yields without moving the virtual clock (no timer fires while it waits); fails after
/// 30 s of real time, saying it waited for `what`.
pub async fn yield_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "still waiting for {what}"
        );
        tokio::task::yield_now().await;
    }
}

/// Waits until no lifetime is in memory. A lifetime leaves the live set just after its last
/// commit (a hibernation, a pause, an end), so a status read from the store can show that
/// commit a moment before.
pub async fn until_none_live(engine: &cairn::Engine) {
    yield_until("every lifetime to leave memory", || {
        engine.live_instances() == 0
    })
    .await;
}

/// Polls (in virtual time, 10 ms at a time) until the instance's log has `n` records of
/// `kind`. Only for records that are due within moments: a long timer would mean many polls.
pub async fn until_logged(instance: &Instance<Value>, kind: LogKind, n: usize) {
    while records(instance, kind).await.len() < n {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The seed of a randomised test: `CAIRN_TEST_SEED` or the clock; printed so a failure can
/// be repeated.
pub fn test_seed(test: &str) -> u64 {
    let seed = std::env::var("CAIRN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("{test} seed: {seed} (rerun with CAIRN_TEST_SEED={seed})");
    seed
}

/// A small seeded generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// Runs this test binary's test `child_test` as a child process on `dir` (the child reads
/// `CAIRN_CRASH_CHILD`), SIGKILLing it after a random 5..`max_ms` ms, `kills` times, then
/// lets one last run finish. Returns how many kills landed (fewer if a run finished first).
pub fn kill_repeatedly(
    dir: &Path,
    child_test: &str,
    seed: u64,
    kills: usize,
    max_ms: u64,
) -> usize {
    use std::process::{Command, Stdio};
    let spawn = || {
        Command::new(std::env::current_exe().unwrap())
            .args([child_test, "--exact", "--test-threads=1"])
            .env("CAIRN_CRASH_CHILD", dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut rng = Rng(seed);
    let mut landed = 0;
    while landed < kills {
        let mut child = spawn();
        std::thread::sleep(std::time::Duration::from_millis(rng.between(5, max_ms)));
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "child failed: {status}");
            break; // finished before it could be killed
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        landed += 1;
    }
    let last = spawn().wait().unwrap();
    assert!(last.success(), "the final child run failed: {last}");
    eprintln!("killed the child {landed} times");
    landed
}

/// Appends `line` to the file at `path`: crash tests count side effects outside the engine,
/// where a SIGKILL cannot roll them back.
pub fn append_line(path: &Path, line: &str) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// A current-thread runtime on a paused (virtual) clock, for tests that are plain `#[test]`
/// functions because they may run as a crash child.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// The directory a crash child works in (see [`kill_repeatedly`]); `None` in a normal run.
pub fn crash_child_dir() -> Option<PathBuf> {
    std::env::var_os("CAIRN_CRASH_CHILD").map(PathBuf::from)
}

/// Creates instances `i0`..`i{n-1}` of `W` with empty params; ids that already exist (a
/// child run after a kill) are skipped.
pub async fn create_numbered<W: cairn::Workflow<Params = Value>>(
    client: &cairn::WorkflowClient<W>,
    n: usize,
) {
    // Batches of at most 100, the API's limit.
    for start in (0..n).step_by(100) {
        let batch = (start..n.min(start + 100))
            .map(|i| cairn::CreateOptions::new(serde_json::json!({})).id(format!("i{i}")))
            .collect();
        client.create_batch(batch).await.unwrap();
    }
}

/// Waits until instances `i0`..`i{n-1}` of `W` have finished.
pub async fn wait_numbered<W: cairn::Workflow>(client: &cairn::WorkflowClient<W>, n: usize) {
    for i in 0..n {
        client
            .get(&format!("i{i}"))
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
}

use cairn::store::{
    Claimed, ControlOutcome, ControlRequest, Created, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Write,
};

/// Runs `work` with tokio's paused clock held still, as the engine makes its own store
/// calls under a virtual clock. A test reading a store directly (not through the engine)
/// otherwise lets the clock jump to the next timer while SQLite's thread or PostgreSQL
/// answers: a loaded machine saw a finished instance's 7-day retention purge it between
/// two reads of the test. A blocking task in flight keeps auto-advance off; this one only
/// waits for `work` to end. On the real clock it costs a thread hand-off.
pub async fn clock_still<T>(work: impl std::future::Future<Output = T>) -> T {
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || {
        // Returns when `done` is dropped.
        let _ = ended.recv();
    });
    let out = work.await;
    drop(done);
    holder.await.unwrap();
    out
}

/// The journal of instance `id` of `workflow`, read from `store` (which must hold it),
/// with the virtual clock still ([`clock_still`]).
pub async fn journal_of(store: &dyn Store, workflow: &str, id: &str) -> Vec<cairn::StepRecord> {
    clock_still(journal_now(store, workflow, id)).await
}

async fn journal_now(store: &dyn Store, workflow: &str, id: &str) -> Vec<cairn::StepRecord> {
    let record = store
        .instance(
            &cairn::WorkflowName::new(workflow).unwrap(),
            &cairn::InstanceId::new(id).unwrap(),
        )
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no instance {workflow}/{id} in the store"));
    store.journal(record.instance).await.unwrap()
}

/// A store that calls `before(method)` ahead of every call it delegates to `inner`: the hook
/// can panic, count, or fail the call (`Err`) to reproduce what a broken backend or an
/// engine bug does.
pub struct Hooked {
    pub inner: Arc<dyn Store>,
    pub before: Box<dyn Fn(&'static str) -> Result<(), cairn::store::Error> + Send + Sync>,
    /// Calls held until the test lets them through.
    pub gates: Gates,
    /// An operator's restart is stamped this much earlier: made through an engine whose
    /// clock is behind.
    pub restart_behind: std::time::Duration,
}

/// Store calls a test holds back: [`Gates::arm`] makes the next call of a method wait until
/// the test releases it (armed again, the call after that, and so on), so a test orders a store answer against the engine's other work
/// (a claim answered after a renewal was sent, say) without waiting for a duration.
#[derive(Clone, Default)]
pub struct Gates(Arc<Mutex<std::collections::HashMap<&'static str, Vec<Gate>>>>);

/// One held call: [`Gate::arrived`] resolves once the call is waiting, [`Gate::release`]
/// lets it through, and [`Gate::answered`] (for calls made through `hooked_lazy!`) gives
/// what the store answered, as `Debug` text.
#[derive(Clone)]
pub struct Gate(Arc<GateState>);

struct GateState {
    /// The held call is never made: released, it fails (a write that did not land).
    fails: bool,
    /// The held call is made only once released: nothing of it reaches the store before
    /// (a held call is otherwise made at once, and only its answer held, where the store
    /// sends it as it is called, as SQLite's does).
    unsent: bool,
    arrived: tokio::sync::Semaphore,
    release: tokio::sync::Semaphore,
    answer: Mutex<Option<String>>,
    answered: tokio::sync::Semaphore,
}

impl Gates {
    /// The next call of `method` waits at the returned gate.
    pub fn arm(&self, method: &'static str) -> Gate {
        self.arm_with(method, false, false)
    }

    /// The next call of `method` waits at the returned gate, and once released fails
    /// without reaching the store.
    pub fn arm_failing(&self, method: &'static str) -> Gate {
        self.arm_with(method, true, false)
    }

    /// The next `commit` waits at the returned gate before it is sent to the store: what
    /// the engine has the store do meanwhile lands first.
    pub fn arm_unsent_commit(&self) -> Gate {
        self.arm_with("commit", false, true)
    }

    fn arm_with(&self, method: &'static str, fails: bool, unsent: bool) -> Gate {
        let gate = Gate(Arc::new(GateState {
            fails,
            unsent,
            arrived: tokio::sync::Semaphore::new(0),
            release: tokio::sync::Semaphore::new(0),
            answer: Mutex::new(None),
            answered: tokio::sync::Semaphore::new(0),
        }));
        self.0
            .lock()
            .unwrap()
            .entry(method)
            .or_default()
            .push(gate.clone());
        gate
    }

    /// The gate armed first for `method`, taken only if it holds its call unsent.
    fn take_unsent(&self, method: &'static str) -> Option<Gate> {
        let unsent = self
            .0
            .lock()
            .unwrap()
            .get(method)
            .and_then(|armed| armed.first())
            .is_some_and(|gate| gate.0.unsent);
        if unsent { self.take(method) } else { None }
    }

    fn take(&self, method: &'static str) -> Option<Gate> {
        let mut gates = self.0.lock().unwrap();
        let armed = gates.get_mut(method)?;
        let gate = (!armed.is_empty()).then(|| armed.remove(0));
        if armed.is_empty() {
            gates.remove(method);
        }
        gate
    }
}

impl Gate {
    /// Resolves once the held call has arrived (panics after a minute without it).
    pub async fn arrived(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(60), self.0.arrived.acquire())
            .await
            .expect("the held call never came")
            .unwrap()
            .forget();
    }

    /// Whether the held call has arrived yet (it may be released before it does).
    pub fn has_arrived(&self) -> bool {
        self.0.arrived.available_permits() > 0
    }

    /// Lets the held call through.
    pub fn release(&self) {
        self.0.release.add_permits(1);
    }

    /// What the store answered the released call.
    pub async fn answered(&self) -> String {
        tokio::time::timeout(
            std::time::Duration::from_secs(60),
            self.0.answered.acquire(),
        )
        .await
        .expect("the released call never answered")
        .unwrap()
        .forget();
        self.0.answer.lock().unwrap().clone().unwrap()
    }

    async fn hold(&self) {
        self.0.arrived.add_permits(1);
        self.0.release.acquire().await.unwrap().forget();
    }

    fn answer(&self, answer: String) {
        *self.0.answer.lock().unwrap() = Some(answer);
        self.0.answered.add_permits(1);
    }
}

/// An engine builder on a fresh database of `backend` at `path` whose store holds the
/// calls `gates` arms (the system clock unless the caller sets another).
pub async fn gated_builder(backend: Backend, path: &Path, gates: Gates) -> EngineBuilder {
    gated_builder_on(raw_store_on(backend, path).await, gates)
}

/// [`gated_builder`] on `inner`, a store the test keeps a handle to (to act on the
/// database as another process would, past the engine's own notifications).
pub fn gated_builder_on(inner: Arc<dyn Store>, gates: Gates) -> EngineBuilder {
    Engine::builder().store(Arc::new(Hooked {
        inner,
        before: Box::new(|_| Ok(())),
        gates,
        restart_behind: std::time::Duration::ZERO,
    }))
}

/// An engine builder on a fresh database of `backend` at `path` whose operators' restarts
/// come stamped `behind` earlier, as from an engine whose clock is behind (the virtual clock).
pub async fn skewed_restarts_builder(
    backend: Backend,
    path: &Path,
    behind: std::time::Duration,
) -> EngineBuilder {
    Engine::builder()
        .store(Arc::new(Hooked {
            inner: raw_store_on(backend, path).await,
            before: Box::new(|_| Ok(())),
            gates: Gates::default(),
            restart_behind: behind,
        }))
        .clock(Clock::virtual_now())
}

/// The store of `backend` at `path`, opened directly.
pub async fn raw_store_on(backend: Backend, path: &Path) -> Arc<dyn Store> {
    match backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres if cairn::postgres::test_url().is_some() => {
            let options = cairn::postgres::Options::new(cairn::postgres::test_url().unwrap())
                .schema(schema_for(path));
            // On a blocking thread, as the engine opens it: a paused clock would fire the
            // connect timeouts at once while the network is awaited.
            let runtime = tokio::runtime::Handle::current();
            let store = tokio::task::spawn_blocking(move || {
                runtime.block_on(cairn::postgres::PostgresStore::open(options))
            })
            .await
            .unwrap()
            .unwrap();
            Arc::new(store)
        }
        _ => Arc::new(cairn::sqlite::SqliteStore::open(path, Default::default()).unwrap()),
    }
}

/// An engine builder on a fresh SQLite database at `path` behind a [`Hooked`] store
/// calling `before` (system clock unless the caller sets another).
pub fn hooked_builder(
    path: &Path,
    before: impl Fn(&'static str) -> Result<(), cairn::store::Error> + Send + Sync + 'static,
) -> EngineBuilder {
    let store = cairn::sqlite::SqliteStore::open(path, Default::default()).unwrap();
    Engine::builder().store(Arc::new(Hooked {
        inner: Arc::new(store),
        before: Box::new(before),
        gates: Gates::default(),
        restart_behind: std::time::Duration::ZERO,
    }))
}

macro_rules! hooked {
    ($self:ident, $name:literal, $call:expr) => {
        match ($self.before)($name) {
            Ok(()) => match $self.gates.take($name) {
                None => $call,
                // Never made: fails once released, as a write that did not land.
                Some(gate) if gate.0.fails => Box::pin(async move {
                    gate.hold().await;
                    Err(cairn::store::Error::Unavailable(
                        "a test's gate failed this call".into(),
                    ))
                }),
                Some(gate) => {
                    let call = $call;
                    Box::pin(async move {
                        gate.hold().await;
                        call.await
                    })
                }
            },
            Err(e) => Box::pin(async move { Err(e) }),
        }
    };
}

/// [`hooked!`] for a call made only once its gate (if armed) opens, so a held write reaches
/// the store after what the engine did meanwhile. The call runs in a task of its own: like a
/// request already sent to a database, it lands even if the engine stops waiting for it.
/// `$call` must own what it borrows.
macro_rules! hooked_lazy {
    ($self:ident, $name:literal, |$inner:ident| $call:expr) => {
        match ($self.before)($name) {
            Ok(()) => {
                let gate = $self.gates.take($name);
                let $inner = Arc::clone(&$self.inner);
                let task = tokio::spawn(async move {
                    let Some(gate) = gate else {
                        return $call.await;
                    };
                    gate.hold().await;
                    let answer = $call.await;
                    gate.answer(format!("{answer:?}"));
                    answer
                });
                Box::pin(async move {
                    task.await
                        .map_err(|e| cairn::store::Error::Unavailable(e.to_string()))?
                })
            }
            Err(e) => Box::pin(async move { Err(e) }),
        }
    };
}

impl Store for Hooked {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        hooked!(self, "create", self.inner.create(batch))
    }
    fn instance(
        &self,
        w: &cairn::WorkflowName,
        id: &cairn::InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        hooked!(self, "instance", self.inner.instance(w, id))
    }
    fn list(&self, q: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        hooked!(self, "list", self.inner.list(q))
    }
    fn count(&self, w: &cairn::WorkflowName, s: cairn::InstanceStatus) -> StoreFuture<'_, u64> {
        hooked!(self, "count", self.inner.count(w, s))
    }
    fn count_matching(&self, q: cairn_store::ListQuery) -> StoreFuture<'_, u64> {
        hooked!(self, "count_matching", self.inner.count_matching(q))
    }
    fn claim(
        &self,
        owner: &str,
        w: &[cairn::WorkflowName],
        now: cairn::Timestamp,
        ttl: std::time::Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        let (owner, w) = (owner.to_owned(), w.to_vec());
        hooked_lazy!(self, "claim", |inner| inner
            .claim(&owner, &w, now, ttl, limit))
    }
    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        hooked!(self, "release_all", self.inner.release_all(owner))
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: cairn::store::Lease,
        now: cairn::Timestamp,
        ttl: std::time::Duration,
    ) -> StoreFuture<'_, cairn::store::Lease> {
        hooked!(self, "reclaim", self.inner.reclaim(owner, lease, now, ttl))
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<cairn::store::Lease>,
        now: cairn::Timestamp,
        until: cairn::Timestamp,
    ) -> StoreFuture<'_, Vec<cairn::store::Lease>> {
        let owner = owner.to_owned();
        hooked_lazy!(self, "renew", |inner| inner
            .renew(&owner, leases, now, until))
    }
    fn journal(&self, i: InstanceRef) -> StoreFuture<'_, Vec<cairn::StepRecord>> {
        hooked!(self, "journal", self.inner.journal(i))
    }
    fn stream_chunk(
        &self,
        i: InstanceRef,
        step: cairn::StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        hooked!(
            self,
            "stream_chunk",
            self.inner.stream_chunk(i, step, attempt, epoch, index)
        )
    }
    fn stream_bytes(&self, i: InstanceRef) -> StoreFuture<'_, u64> {
        hooked!(self, "stream_bytes", self.inner.stream_bytes(i))
    }
    fn children(&self, i: InstanceRef) -> StoreFuture<'_, Vec<cairn::store::InstanceRecord>> {
        hooked!(self, "children", self.inner.children(i))
    }
    fn slot_position(&self, i: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        hooked!(self, "slot_position", self.inner.slot_position(i))
    }
    fn waiting_for_slots(
        &self,
        w: &cairn::WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        hooked!(
            self,
            "waiting_for_slots",
            self.inner.waiting_for_slots(w, limit)
        )
    }
    fn create_schedule(&self, s: cairn::store::StoredSchedule) -> StoreFuture<'_, bool> {
        hooked!(self, "create_schedule", self.inner.create_schedule(s))
    }
    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn::store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        hooked!(
            self,
            "set_schedule_state",
            self.inner.set_schedule_state(name, state)
        )
    }
    fn schedules(&self) -> StoreFuture<'_, Vec<cairn::store::StoredSchedule>> {
        hooked!(self, "schedules", self.inner.schedules())
    }
    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        hooked!(
            self,
            "delete_schedule",
            self.inner.delete_schedule(name, declared)
        )
    }
    fn register_versions(&self, v: Vec<cairn::store::WorkflowVersion>) -> StoreFuture<'_, ()> {
        hooked!(self, "register_versions", self.inner.register_versions(v))
    }
    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn::store::WorkflowVersion>> {
        hooked!(self, "workflow_versions", self.inner.workflow_versions())
    }
    fn unfinished_versions(
        &self,
        w: &cairn::WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        hooked!(
            self,
            "unfinished_versions",
            self.inner.unfinished_versions(w)
        )
    }
    fn wake_awaiting(&self, w: &cairn::WorkflowName, v: &str, n: u64) -> StoreFuture<'_, u64> {
        hooked!(self, "wake_awaiting", self.inner.wake_awaiting(w, v, n))
    }
    fn fire_tick(&self, t: cairn::store::ScheduleTick) -> StoreFuture<'_, cairn::store::TickFired> {
        hooked!(self, "fire_tick", self.inner.fire_tick(t))
    }
    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, cairn::InstanceStatus> {
        if let Some(gate) = self.gates.take_unsent("commit") {
            return Box::pin(async move {
                (self.before)("commit")?;
                gate.hold().await;
                self.inner.commit(lease, writes).await
            });
        }
        hooked!(self, "commit", self.inner.commit(lease, writes))
    }
    fn control(
        &self,
        w: &cairn::WorkflowName,
        id: &cairn::InstanceId,
        r: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let r = match r {
            ControlRequest::Restart {
                at,
                from,
                adopt: None,
            } => ControlRequest::Restart {
                at: cairn::Timestamp::from_millis(
                    at.as_millis() - i64::try_from(self.restart_behind.as_millis()).unwrap(),
                ),
                from,
                adopt: None,
            },
            r => r,
        };
        hooked!(self, "control", self.inner.control(w, id, r))
    }
    fn log(&self, i: InstanceRef, after: u64, limit: usize) -> StoreFuture<'_, Vec<LogRecord>> {
        hooked!(self, "log", self.inner.log(i, after, limit))
    }
    fn log_head(&self) -> StoreFuture<'_, u64> {
        hooked!(self, "log_head", self.inner.log_head())
    }
    fn workflow_log(
        &self,
        w: &cairn::WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn::store::WorkflowLogPage> {
        hooked!(
            self,
            "workflow_log",
            self.inner.workflow_log(w, after, limit)
        )
    }
    fn next_ready(&self, w: &[cairn::WorkflowName]) -> StoreFuture<'_, Option<cairn::Timestamp>> {
        hooked!(self, "next_ready", self.inner.next_ready(w))
    }
    fn timers(
        &self,
        w: &cairn::WorkflowName,
        now: cairn::Timestamp,
    ) -> StoreFuture<'_, cairn::store::Timers> {
        hooked!(self, "timers", self.inner.timers(w, now))
    }
    fn send_event(
        &self,
        w: &cairn::WorkflowName,
        id: &cairn::InstanceId,
        e: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        hooked!(self, "send_event", self.inner.send_event(w, id, e))
    }
    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        t: cairn::EventType,
        at: cairn::Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        // Lazy: a take on its way lands even if the wait that sent it is dropped.
        hooked_lazy!(self, "take_event", |inner| inner
            .take_event(lease, step, t, at))
    }
    fn purge(&self, now: cairn::Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        hooked!(self, "purge", self.inner.purge(now, limit))
    }
    fn next_purge(&self) -> StoreFuture<'_, Option<cairn::Timestamp>> {
        hooked!(self, "next_purge", self.inner.next_purge())
    }
    fn changes(&self) -> Option<futures::stream::BoxStream<'static, cairn::store::Changes>> {
        self.inner.changes()
    }
    fn close(&self) -> StoreFuture<'_, ()> {
        self.inner.close()
    }
}

/// The most of `intervals` (start, end, in ms) that overlap at any moment; an end and a
/// start at the same moment do not overlap (the end's commit gave its slot back before the
/// start's claim took one). What the keyed-concurrency tests check their limits with.
pub fn most_at_once(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap()
}

/// The step bodies a crash test's child processes ran, as they recorded them
/// ([`append_line`] of `<instance> <step> <attempt>` to `path`): the attempts by instance
/// and step name.
pub fn read_effects(path: &Path) -> std::collections::HashMap<(String, String), Vec<u32>> {
    let mut runs: std::collections::HashMap<(String, String), Vec<u32>> = Default::default();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let mut p = line.split(' ');
        let (id, step, attempt) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
        runs.entry((id.into(), step.into()))
            .or_default()
            .push(attempt.parse().unwrap());
    }
    runs
}

/// No committed `step.run` of `details` ran again after its commit, and no attempt ran
/// twice: every body run [`read_effects`] recorded is one attempt of the journal's.
pub fn assert_no_body_reran(
    runs: &std::collections::HashMap<(String, String), Vec<u32>>,
    details: &cairn::InstanceDetails,
) {
    for step in details.steps.iter().filter(|s| s.kind == "step") {
        let seen = runs
            .get(&(details.id.clone(), step.name.clone()))
            .cloned()
            .unwrap_or_default();
        let last = step.attempts.last().unwrap().attempt;
        assert!(
            seen.iter().all(|a| *a <= last),
            "{} {} re-ran after commit: {seen:?}",
            details.id,
            step.name
        );
        let mut unique = seen.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            seen.len(),
            "{} {}: an attempt ran twice",
            details.id,
            step.name
        );
    }
}
