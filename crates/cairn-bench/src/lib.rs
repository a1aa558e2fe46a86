//! Cairn's benchmark harness. Each workload returns [`Row`]s; [`print_table`] prints them
//! as markdown, each engine figure with its ratio to the raw storage bound measured in the
//! same run (the same rows written by a bare loop on the same SQLite settings), so the
//! numbers mean something on a noisy machine.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cairn_bench::BenchError> {
//! let dir = tempfile::tempdir()?;
//! let rows = cairn_bench::throughput(dir.path(), cairn_bench::Settings::default(), 100, 10).await?;
//! cairn_bench::print_table(&rows);
//! # Ok(()) }
//! ```

mod lists;
mod overhead;
mod peers;
mod postgres;
mod streams;

pub use lists::lists;
pub use overhead::overhead;
pub use peers::{PEER_SHAPES, peers};
pub use postgres::{engine_child as postgres_engine_child, postgres};
pub use streams::streams;

pub(crate) use events_on as measure_events;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn::prelude::*;
use cairn::sqlite::{Durability, Options, RawBound, raw_step_writes};
use cairn::{Clock, Timestamp};

/// A benchmark failure.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// One line of the results table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The workload.
    pub workload: String,
    /// What was measured.
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The value as a fraction of the raw storage bound, where one applies.
    pub ratio: Option<f64>,
}

impl Row {
    fn new(workload: &str, metric: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Row {
            workload: workload.into(),
            metric: metric.into(),
            value,
            unit,
            ratio: None,
        }
    }

    fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = Some(ratio);
        self
    }
}

/// Prints rows as a markdown table.
pub fn print_table(rows: &[Row]) {
    println!("| workload | metric | value | unit | vs raw bound |");
    println!("|---|---|---:|---|---:|");
    for r in rows {
        let ratio = r.ratio.map_or(String::new(), |x| format!("{x:.2}×"));
        println!(
            "| {} | {} | {} | {} | {ratio} |",
            r.workload,
            r.metric,
            fmt(r.value),
            r.unit
        );
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// Shared settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// SQLite durability.
    pub durability: Durability,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            durability: Durability::Full,
        }
    }
}

pub(crate) fn label(s: Settings) -> &'static str {
    match s.durability {
        Durability::Normal => "NORMAL",
        _ => "FULL",
    }
}

/// Resident memory of this process in bytes (Linux `/proc/self/status`), if known.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time this process has used so far, every thread's (those that ended too), user and
/// system (Linux `/proc/self/stat`, in clock ticks of 10 ms: measure a second or more), if
/// known. Unlike a rate, it hardly moves with what else the machine runs: the figure to
/// compare when a change saves work.
pub fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count the fields after its `)`.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let user: u64 = fields.nth(11)?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 10))
}

/// What the scheduler recorded of one thread: its time on a core, and its time runnable
/// but waiting for one (Linux `/proc/self/task/*/schedstat`, in nanoseconds).
#[derive(Debug, Clone, Copy)]
pub struct ThreadTimes {
    /// Time on a core.
    pub on_cpu: Duration,
    /// Time ready to run, waiting for a core (woken, or preempted).
    pub waiting: Duration,
}

impl ThreadTimes {
    /// The times since `before`, a reading of the same thread.
    fn since(self, before: ThreadTimes) -> Option<ThreadTimes> {
        Some(ThreadTimes {
            on_cpu: self.on_cpu.checked_sub(before.on_cpu)?,
            waiting: self.waiting.checked_sub(before.waiting)?,
        })
    }
}

/// The scheduler's times for the thread of this process whose name starts with `name`, if
/// there is one.
pub fn thread_times(name: &str) -> Option<ThreadTimes> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with(name) {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let mut fields = stat.split_whitespace().map(str::parse::<u64>);
            let on_cpu = fields.next()?.ok()?;
            let waiting = fields.next()?.ok()?;
            return Some(ThreadTimes {
                on_cpu: Duration::from_nanos(on_cpu),
                waiting: Duration::from_nanos(waiting),
            });
        }
    }
    None
}

/// The SQLite writer thread's name, as the kernel keeps it (15 bytes).
const WRITER_THREAD: &str = "cairn-sqlite-wr";

fn mib(bytes: Option<u64>) -> f64 {
    bytes.map_or(f64::NAN, |b| b as f64 / (1024.0 * 1024.0))
}

pub(crate) async fn engine_on(
    path: &Path,
    s: Settings,
    register: impl FnOnce(cairn::EngineBuilder) -> cairn::EngineBuilder,
) -> Result<Engine, BenchError> {
    engine_with_clock(path, s, Clock::system(), register).await
}

/// [`engine_on`], with the store at hand to count its commits (`SqliteStore::writes`).
pub(crate) async fn counted_engine_on(
    path: &Path,
    s: Settings,
    register: impl FnOnce(cairn::EngineBuilder) -> cairn::EngineBuilder,
) -> Result<(std::sync::Arc<cairn::sqlite::SqliteStore>, Engine), BenchError> {
    let store = std::sync::Arc::new(cairn::sqlite::SqliteStore::open(
        path,
        Options::default().durability(s.durability),
    )?);
    let builder = Engine::builder()
        .store(store.clone())
        .hibernate_after(Duration::from_millis(100));
    Ok((store, register(builder).start().await?))
}

async fn engine_with_clock(
    path: &Path,
    s: Settings,
    clock: Clock,
    register: impl FnOnce(cairn::EngineBuilder) -> cairn::EngineBuilder,
) -> Result<Engine, BenchError> {
    let builder = Engine::builder()
        .sqlite(path)
        .sqlite_options(Options::default().durability(s.durability))
        .clock(clock)
        .hibernate_after(Duration::from_millis(100));
    Ok(register(builder).start().await?)
}

/// `steps` no-op steps.
pub struct NoOp;

impl Workflow for NoOp {
    const NAME: &'static str = "noop";
    type Params = u32;
    type Output = u32;

    async fn run(
        &self,
        event: WorkflowEvent<u32>,
        step: WorkflowStep,
    ) -> Result<u32, WorkflowError> {
        for i in 0..event.payload {
            step.run(format!("step {i}"), |_| async move { Ok(i) })
                .await?;
        }
        Ok(event.payload)
    }
}

pub(crate) async fn create_all<W: Workflow>(
    engine: &Engine,
    params: impl Fn(usize) -> W::Params,
    n: usize,
    prefix: &str,
) -> Result<Vec<cairn::Instance<W::Output>>, BenchError> {
    let client = engine.workflow::<W>();
    let mut all = Vec::with_capacity(n);
    for chunk_start in (0..n).step_by(100) {
        let batch = (chunk_start..n.min(chunk_start + 100))
            .map(|i| CreateOptions::new(params(i)).id(format!("{prefix}{i}")))
            .collect();
        all.extend(client.create_batch(batch).await?);
    }
    Ok(all)
}

/// The raw storage bound with one commit per engine write (at most 2,000 units).
pub fn raw_per_commit(dir: &Path, s: Settings, units: usize) -> Result<RawBound, BenchError> {
    Ok(raw_step_writes(
        &dir.join("raw-commit.db"),
        s.durability,
        units.min(2_000),
        1,
        1,
    )?)
}

/// The raw storage bound batched, 512 units per commit, and the CPU time of one of its
/// no-op steps in µs (measured around the run, one thread; NaN where the system does not
/// tell, or the run was too short to measure).
pub fn raw_batched(dir: &Path, s: Settings, units: usize) -> Result<(RawBound, f64), BenchError> {
    raw_batched_across(dir, s, units, 1)
}

/// [`raw_batched`] with the steps spread round-robin over `instances` instances, as the
/// engine's group commits spread them: the rows land all over the tables' indexes instead
/// of at their ends (see [`raw_step_writes`]).
pub fn raw_batched_across(
    dir: &Path,
    s: Settings,
    units: usize,
    instances: usize,
) -> Result<(RawBound, f64), BenchError> {
    let file = if instances > 1 {
        "raw-spread.db"
    } else {
        "raw-batch.db"
    };
    let before = cpu_time();
    let bound = raw_step_writes(&dir.join(file), s.durability, units, 512, instances)?;
    let cpu = per_step_micros(cpu_since(before), bound.units as f64 / 2.0);
    Ok((bound, cpu))
}

/// The CPU time used since `before` (a [`cpu_time`]), if known.
pub(crate) fn cpu_since(before: Option<Duration>) -> Option<Duration> {
    cpu_time().zip(before).map(|(after, before)| after - before)
}

/// `used` over `steps`, in µs; NaN if unknown or too short to measure (no tick counted).
pub(crate) fn per_step_micros(used: Option<Duration>, steps: f64) -> f64 {
    used.filter(|d| !d.is_zero())
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6 / steps)
}

/// Raw bound rows.
pub fn raw(dir: &Path, s: Settings, units: usize) -> Result<Vec<Row>, BenchError> {
    let one = raw_per_commit(dir, s, units)?;
    let (batch, _) = raw_batched(dir, s, units)?;
    let w = format!("raw bound ({})", label(s));
    Ok(vec![
        Row::new(
            &w,
            "commits/s, one step write per commit",
            one.commits_per_sec(),
            "1/s",
        ),
        Row::new(&w, "one commit", 1e3 / one.commits_per_sec(), "ms"),
        Row::new(
            &w,
            "no-op steps/s, 512 writes per commit",
            batch.steps_per_sec(),
            "1/s",
        ),
    ])
}

/// `instances` concurrent instances of `steps` no-op steps, created with `create_batch`.
///
/// # Errors
/// When the engine or the database fails.
pub async fn throughput(
    dir: &Path,
    s: Settings,
    instances: usize,
    steps: u32,
) -> Result<Vec<Row>, BenchError> {
    let units = instances * steps as usize * 2;
    // The bound moves by as much as half within minutes on a shared machine: it is taken
    // right before the engine's run and right after, and the engine is compared with both
    // together (total rows over total time), so one lucky or unlucky pass does not decide.
    let before = raw_batched(dir, s, units)?;
    // The store at hand, to count the writer's group commits.
    let (store, engine) =
        counted_engine_on(&dir.join("throughput.db"), s, |b| b.register(NoOp)).await?;
    let writes_before = store.writes();
    let cpu_before = cpu_time();
    let writer_before = thread_times(WRITER_THREAD);
    let start = Instant::now();
    let all = create_all::<NoOp>(&engine, |_| steps, instances, "t").await?;
    for i in &all {
        i.wait().await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_since(cpu_before);
    let writer = thread_times(WRITER_THREAD)
        .zip(writer_before)
        .and_then(|(after, before)| after.since(before));
    let writer_cpu = writer.map(|w| w.on_cpu);
    let writes = store.writes();
    let rss = resident_bytes();
    engine.shutdown().await;
    // After the engine's run, so the engine does not run while the kernel writes back
    // what this bound left behind.
    let after = raw_batched(dir, s, units)?;
    let (spread, spread_cpu) = raw_batched_across(dir, s, units, instances)?;
    let raw_steps = RawBound {
        commits: before.0.commits + after.0.commits,
        units: before.0.units + after.0.units,
        elapsed: before.0.elapsed + after.0.elapsed,
    }
    .steps_per_sec();
    let raw_cpu = f64::midpoint(before.1, after.1);
    let total = (instances * steps as usize) as f64;
    let steps_per_sec = total / elapsed;
    let cpu_per_step = per_step_micros(cpu, total);
    let w = format!("throughput ({} × {steps} steps, {})", instances, label(s));
    Ok(vec![
        Row::new(&w, "durable no-op steps/s", steps_per_sec, "1/s")
            .ratio(steps_per_sec / raw_steps),
        Row::new(
            &w,
            format!(
                "raw bound, steps/s (before the engine's run {:.0}, after it {:.0})",
                before.0.steps_per_sec(),
                after.0.steps_per_sec()
            ),
            raw_steps,
            "1/s",
        ),
        // The same figures against the bound whose rows are spread over as many
        // instances as the engine's: how much of the gap is where the rows land.
        Row::new(
            &w,
            format!("raw bound spread over {instances} instances, steps/s"),
            spread.steps_per_sec(),
            "1/s",
        ),
        Row::new(
            &w,
            "durable no-op steps/s, to the spread bound",
            steps_per_sec,
            "1/s",
        )
        .ratio(steps_per_sec / spread.steps_per_sec()),
        Row::new(&w, "instances/s", instances as f64 / elapsed, "1/s"),
        // The ratio is the raw bound's CPU per step over the engine's, as the steps/s
        // ratio is the engine's rate over the bound's: the share of a step's CPU its rows
        // cost, whatever else the machine runs.
        Row::new(&w, "CPU per step, every thread", cpu_per_step, "µs")
            .ratio(raw_cpu / cpu_per_step),
        Row::new(&w, "CPU per step, to the spread bound", cpu_per_step, "µs")
            .ratio(spread_cpu / cpu_per_step),
        // The serial part: the SQLite writer thread alone, against the bound's CPU per
        // step (one thread too), and how much of the run it was on a core (its 50 µs of
        // looking for the next job included).
        Row::new(
            &w,
            "SQLite writer thread's CPU per step",
            per_step_micros(writer_cpu, total),
            "µs",
        )
        .ratio(raw_cpu / per_step_micros(writer_cpu, total)),
        Row::new(
            &w,
            "SQLite writer thread busy",
            writer_cpu.map_or(f64::NAN, |c| 100.0 * c.as_secs_f64() / elapsed),
            "%",
        ),
        // The rest of its time is this, or asleep: waiting for jobs, or for the disk (in
        // `COMMIT`'s sync at NORMAL's checkpoints; at FULL the syncer thread waits for it).
        Row::new(
            &w,
            "SQLite writer thread ready, waiting for a core",
            writer.map_or(f64::NAN, |t| 100.0 * t.waiting.as_secs_f64() / elapsed),
            "%",
        ),
        Row::new(
            &w,
            "SQLite writer's time in COMMIT (the WAL)",
            100.0 * (writes.commit_time - writes_before.commit_time).as_secs_f64() / elapsed,
            "%",
        ),
        Row::new(
            &w,
            "checkpoints beside the writer (NORMAL only)",
            (writes.checkpoints - writes_before.checkpoints) as f64,
            "",
        ),
        Row::new(
            &w,
            "write calls per group commit",
            (writes.jobs - writes_before.jobs) as f64
                / (writes.commits - writes_before.commits).max(1) as f64,
            "",
        ),
        Row::new(&w, "resident memory", mib(rss), "MiB"),
    ])
}

/// A parent that runs `NoOp` with its params as a child workflow (`step.invoke`).
pub struct Parent;

impl Workflow for Parent {
    const NAME: &'static str = "parent";
    type Params = u32;
    type Output = u32;

    async fn run(
        &self,
        event: WorkflowEvent<u32>,
        step: WorkflowStep,
    ) -> Result<u32, WorkflowError> {
        step.invoke::<NoOp>("child", event.payload).await
    }
}

/// What a child workflow costs: `instances` parents, each invoking a child of `steps`
/// no-op steps, next to the same children created directly, in one run.
///
/// # Errors
/// When the engine or the database fails.
pub async fn children(
    dir: &Path,
    s: Settings,
    instances: usize,
    steps: u32,
) -> Result<Vec<Row>, BenchError> {
    let engine = engine_on(&dir.join("children.db"), s, |b| {
        b.register(NoOp).register(Parent)
    })
    .await?;
    let start = Instant::now();
    let all = create_all::<NoOp>(&engine, |_| steps, instances, "flat").await?;
    for i in &all {
        i.wait().await?;
    }
    let flat = instances as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let all = create_all::<Parent>(&engine, |_| steps, instances, "p").await?;
    for i in &all {
        i.wait().await?;
    }
    let family = instances as f64 / start.elapsed().as_secs_f64();
    engine.shutdown().await;
    let w = format!(
        "children ({instances} × a child of {steps} steps, {})",
        label(s)
    );
    Ok(vec![
        Row::new(
            &w,
            "instances of the child workflow, created directly",
            flat,
            "1/s",
        ),
        Row::new(&w, "parents, each invoking one child", family, "1/s").ratio(family / flat),
    ])
}

/// What keyed concurrency costs: `instances` × `steps` no-op steps created without a key,
/// then with one of 10 keys under a limit they never reach, then under a limit of 20 per
/// key, in one run.
///
/// # Errors
/// When the engine or the database fails.
pub async fn keyed(
    dir: &Path,
    s: Settings,
    instances: usize,
    steps: u32,
) -> Result<Vec<Row>, BenchError> {
    let w = format!("keyed ({instances} × {steps} steps, 10 keys, {})", label(s));
    let mut rows = Vec::new();
    let mut plain = 0.0;
    for (i, (what, limit)) in [
        ("no key", None),
        ("keyed, limit never reached", Some(instances as u32)),
        ("keyed, 20 per key at once", Some(20)),
    ]
    .into_iter()
    .enumerate()
    {
        let engine = engine_on(&dir.join(format!("keyed-{i}.db")), s, |b| {
            let b = b.register(NoOp);
            match limit {
                Some(n) => b.concurrency("noop", cairn::Concurrency::limit(n)),
                None => b,
            }
        })
        .await?;
        let client = engine.workflow::<NoOp>();
        let start = Instant::now();
        let mut all = Vec::with_capacity(instances);
        for chunk in (0..instances).step_by(100) {
            let batch = (chunk..instances.min(chunk + 100))
                .map(|i| {
                    let options = CreateOptions::new(steps).id(format!("k{i}"));
                    if limit.is_some() {
                        options.concurrency_key(format!("key-{}", i % 10))
                    } else {
                        options
                    }
                })
                .collect();
            all.extend(client.create_batch(batch).await?);
        }
        for i in &all {
            i.wait().await?;
        }
        let per_sec = (instances * steps as usize) as f64 / start.elapsed().as_secs_f64();
        engine.shutdown().await;
        let row = Row::new(&w, format!("durable no-op steps/s, {what}"), per_sec, "1/s");
        if limit.is_none() {
            plain = per_sec;
            rows.push(row);
        } else {
            rows.push(row.ratio(per_sec / plain));
        }
    }
    Ok(rows)
}

/// The median of `samples` (the upper one of an even count).
pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One instance at a time, `runs` times, each `steps` no-op steps.
///
/// # Errors
/// When the engine or the database fails.
pub async fn latency(
    dir: &Path,
    s: Settings,
    runs: usize,
    steps: u32,
) -> Result<Vec<Row>, BenchError> {
    let one = raw_per_commit(dir, s, 2_000)?;
    let commit_ms = 1e3 / one.commits_per_sec();
    // The store at hand, to count the commits the runs make.
    let (store, engine) =
        counted_engine_on(&dir.join("latency.db"), s, |b| b.register(NoOp)).await?;
    let client = engine.workflow::<NoOp>();
    let mut times = Vec::with_capacity(runs);
    let before = store.writes();
    for i in 0..runs {
        let start = Instant::now();
        client
            .create(CreateOptions::new(steps).id(format!("l{i}")))
            .await?
            .wait()
            .await?;
        times.push(start.elapsed());
    }
    let after = store.writes();
    engine.shutdown().await;
    // One instance at a time: every commit in between is one of the runs'.
    let made = (after.commits - before.commits) as f64 / runs.max(1) as f64;
    times.sort();
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    // The bound stays the one of round 2's commits, so the gain of fewer shows: create,
    // claim, status running, two per step, final status.
    let commits = 4 + 2 * steps as usize;
    let bound_ms = commits as f64 * commit_ms;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let w = format!("latency ({steps} steps, {runs} runs, {})", label(s));
    Ok(vec![
        Row::new(&w, "end to end p50", ms(p50), "ms").ratio(ms(p50) / bound_ms),
        Row::new(&w, "end to end p99", ms(p99), "ms").ratio(ms(p99) / bound_ms),
        Row::new(
            &w,
            format!("bound: {commits} commits (round 2's) × one commit"),
            bound_ms,
            "ms",
        ),
        Row::new(&w, "commits made per instance", made, "").ratio(made / commits as f64),
        Row::new(
            &w,
            "per step (p50 / steps)",
            ms(p50) / f64::from(steps.max(1)),
            "ms",
        ),
    ])
}

/// Sleeps for an hour, then finishes.
pub struct Nap;

impl Workflow for Nap {
    const NAME: &'static str = "nap";
    type Params = ();
    type Output = ();

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<(), WorkflowError> {
        step.sleep("nap", "1 hour").await?;
        Ok(())
    }
}

/// Waits until `n` instances of `workflow` are in `status`, polling an indexed count (a
/// read the engine hardly notices) every 10 ms.
pub(crate) async fn until_count(
    engine: &Engine,
    workflow: &str,
    status: InstanceStatus,
    n: usize,
) -> Result<(), BenchError> {
    let client = engine.workflow_by_name(workflow)?;
    while client.count(status).await? < n as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Waits until the engine holds no instance in memory: a hibernating instance's status is
/// written before its lifetime has left, so the count is read once they have all gone (or,
/// if some never leave, after ten seconds, and the row shows how many stayed).
pub(crate) async fn until_unloaded(engine: &Engine) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let live = engine.live_instances();
        if live == 0 || Instant::now() >= deadline {
            return live;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `instances` instances sleeping an hour: resident memory while all are asleep; then an
/// engine whose clock is an hour ahead wakes them all: wake-ups per second.
///
/// # Errors
/// When the engine or the database fails.
pub async fn hibernation(
    dir: &Path,
    s: Settings,
    instances: usize,
) -> Result<Vec<Row>, BenchError> {
    let path = dir.join("hibernation.db");
    let before = resident_bytes();
    let engine = engine_on(&path, s, |b| b.register(Nap)).await?;
    let start = Instant::now();
    create_all::<Nap>(&engine, |_| (), instances, "h").await?;
    until_count(&engine, "nap", InstanceStatus::Waiting, instances).await?;
    let live = until_unloaded(&engine).await;
    let asleep = start.elapsed();
    let rss = resident_bytes();
    engine.shutdown().await;
    // An hour later: every timer is due.
    let later = Clock::virtual_at(
        Timestamp::from_system_time(std::time::SystemTime::now())
            .saturating_add(Duration::from_secs(3601)),
    );
    let start = Instant::now();
    let engine = engine_with_clock(&path, s, later, |b| b.register(Nap)).await?;
    until_count(&engine, "nap", InstanceStatus::Complete, instances).await?;
    let woke = start.elapsed().as_secs_f64();
    engine.shutdown().await;
    let w = format!("hibernation ({instances} sleeping, {})", label(s));
    Ok(vec![
        Row::new(
            &w,
            "time to create and hibernate all",
            asleep.as_secs_f64(),
            "s",
        ),
        Row::new(&w, "instances in memory while asleep", live as f64, ""),
        Row::new(&w, "resident memory while asleep", mib(rss), "MiB"),
        Row::new(&w, "resident memory before", mib(before), "MiB"),
        Row::new(
            &w,
            "timer wake-ups/s (to completion)",
            instances as f64 / woke,
            "1/s",
        ),
    ])
}

/// Waits for one event.
pub struct Await;

impl Workflow for Await {
    const NAME: &'static str = "await";
    type Params = ();
    type Output = u64;

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<u64, WorkflowError> {
        let e: StepEvent<u64> = step.wait_for_event("go", "go").timeout("1 day").await?;
        Ok(e.payload)
    }
}

/// `instances` instances waiting for an event; one `send_event` to each.
///
/// # Errors
/// When the engine or the database fails.
pub async fn events(dir: &Path, s: Settings, instances: usize) -> Result<Vec<Row>, BenchError> {
    let engine = engine_on(&dir.join("events.db"), s, |b| b.register(Await)).await?;
    events_on(
        engine,
        instances,
        format!("events ({instances} waiting, {})", label(s)),
    )
    .await
}

/// [`events`] on a started engine with [`Await`] registered; shuts it down.
async fn events_on(engine: Engine, instances: usize, w: String) -> Result<Vec<Row>, BenchError> {
    let all = create_all::<Await>(&engine, |_| (), instances, "e").await?;
    until_count(&engine, "await", InstanceStatus::Waiting, instances).await?;
    let start = Instant::now();
    // Sent 100 at a time, concurrently, as a busy API server would: one sender waiting for
    // each commit would measure the sender, not the engine.
    let mut sent = Vec::with_capacity(instances);
    for chunk in all.chunks(100) {
        let at = Timestamp::from_system_time(std::time::SystemTime::now());
        sent.extend(std::iter::repeat_n(at, chunk.len()));
        let sends = chunk.iter().map(|i| i.send_event("go", &1u64));
        for result in futures::future::join_all(sends).await {
            result?;
        }
    }
    let sending = start.elapsed().as_secs_f64();
    // The clock stops when the last instance is complete (counted as the hibernation
    // workload counts); each delivery's latency is read from the logs afterwards. (Reading
    // 10,000 logs one by one inside the timing measured the harness: half the run.)
    until_count(&engine, "await", InstanceStatus::Complete, instances).await?;
    let total = start.elapsed().as_secs_f64();
    let mut latencies = Vec::with_capacity(instances);
    for (i, at) in all.iter().zip(sent) {
        let done = i
            .log(0)
            .await?
            .into_iter()
            .find(|r| r.entry.kind == cairn::LogKind::WaitComplete);
        if let Some(r) = done {
            latencies.push(r.entry.at.since(at));
        }
    }
    engine.shutdown().await;
    latencies.sort();
    Ok(vec![
        Row::new(
            &w,
            "deliveries/s (send to resumed)",
            instances as f64 / total,
            "1/s",
        ),
        Row::new(&w, "send_event calls/s", instances as f64 / sending, "1/s"),
        Row::new(
            &w,
            "send to resume p50",
            percentile(&latencies, 0.5).as_secs_f64() * 1e3,
            "ms",
        ),
        Row::new(
            &w,
            "send to resume p99",
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
            "ms",
        ),
    ])
}

/// `steps` no-op steps, then an event wait.
pub struct LongJournal;

impl Workflow for LongJournal {
    const NAME: &'static str = "long-journal";
    type Params = u32;
    type Output = u32;

    async fn run(
        &self,
        event: WorkflowEvent<u32>,
        step: WorkflowStep,
    ) -> Result<u32, WorkflowError> {
        let ops: Vec<_> = (0..event.payload)
            .map(|i| step.run("step", move |_| async move { Ok(i) }))
            .collect();
        futures::future::try_join_all(ops).await?;
        step.wait_for_event::<()>("go", "go")
            .timeout("1 day")
            .await?;
        Ok(event.payload)
    }
}

/// Time to resume one instance whose journal holds `steps` completed steps.
///
/// # Errors
/// When the engine or the database fails.
pub async fn replay(dir: &Path, s: Settings, steps: u32) -> Result<Vec<Row>, BenchError> {
    let engine = engine_on(&dir.join("replay.db"), s, |b| {
        b.step_limit(steps + 1).register(LongJournal)
    })
    .await?;
    let instance = engine
        .workflow::<LongJournal>()
        .create(CreateOptions::new(steps).id("r"))
        .await?;
    instance
        .wait_for(|st| st.status == InstanceStatus::Waiting)
        .await?;
    let start = Instant::now();
    instance.send_event("go", &()).await?;
    instance.wait().await?;
    let resumed = start.elapsed().as_secs_f64() * 1e3;
    engine.shutdown().await;
    let w = format!("replay ({steps}-step journal, {})", label(s));
    Ok(vec![Row::new(
        &w,
        "event sent to complete (claim, load, replay, finish)",
        resumed,
        "ms",
    )])
}

/// Whether step bodies of [`Hold`] block (the process about to be killed) or return.
pub static HOLD: AtomicBool = AtomicBool::new(true);

/// One step that blocks while [`HOLD`] is set.
pub struct Hold;

impl Workflow for Hold {
    const NAME: &'static str = "hold";
    type Params = ();
    type Output = ();

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<(), WorkflowError> {
        step.run("work", |_| async {
            while HOLD.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(())
        })
        .retries(Retries::constant(3, Duration::ZERO))
        .await
    }
}

/// The child side of [`recovery`]: creates `instances` instances whose step blocks, and
/// prints `ready` once all are running, then waits to be killed.
///
/// # Errors
/// When the engine or the database fails.
pub async fn recovery_child(db: &Path, s: Settings, instances: usize) -> Result<(), BenchError> {
    let engine = engine_on(db, s, |b| b.max_running(instances).register(Hold)).await?;
    create_all::<Hold>(&engine, |_| (), instances, "k").await?;
    while engine.live_instances() < instances {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("ready");
    std::future::pending::<()>().await;
    Ok(())
}

/// SIGKILLs a child process with `instances` in-flight instances, restarts on the same
/// database, and measures the time until all run again and until all complete.
///
/// # Errors
/// When the child or the engine fails.
pub async fn recovery(
    dir: &Path,
    s: Settings,
    instances: usize,
    exe: &Path,
) -> Result<Vec<Row>, BenchError> {
    use std::io::BufRead as _;
    let db = dir.join("recovery.db");
    let mut child = std::process::Command::new(exe)
        .args(["recovery-child", "--db"])
        .arg(&db)
        .args(["--instances", &instances.to_string()])
        .args(["--durability", label(s)])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        return Err(format!("child said {line:?}").into());
    }
    child.kill()?;
    child.wait()?;
    HOLD.store(false, Ordering::SeqCst);
    let start = Instant::now();
    let engine = engine_on(&db, s, |b| b.max_running(instances).register(Hold)).await?;
    // "Running again": every instance has a lifetime in memory, or has already finished
    // (whichever comes first).
    let mut running_again = None;
    let client = engine.workflow_by_name("hold")?;
    loop {
        if running_again.is_none() && engine.live_instances() >= instances {
            running_again = Some(start.elapsed());
        }
        if client.count(InstanceStatus::Complete).await? >= instances as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let complete = start.elapsed();
    let running_again = running_again.unwrap_or(complete);
    engine.shutdown().await;
    let w = format!("recovery ({instances} in flight, SIGKILL, {})", label(s));
    Ok(vec![
        Row::new(
            &w,
            "restart to all running again (or done)",
            running_again.as_secs_f64(),
            "s",
        ),
        Row::new(&w, "restart to all complete", complete.as_secs_f64(), "s"),
    ])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mean(times: &[Duration]) -> Duration {
    times.iter().sum::<Duration>() / u32::try_from(times.len().max(1)).unwrap_or(u32::MAX)
}

/// Cost against stored history: for each size, a database holding that many finished
/// instances (97 % completed 10-step instances, 3 % waiting for an event; copies of
/// instances the engine wrote, see `cairn_sqlite::replicate_instances`), then the hot paths
/// measured on it: start-up, throughput of new 10-step instances, create p99,
/// send-to-resume, a first page and a next page of the list, describe (counts by status),
/// a workflow stream poll with nothing new, and bytes per instance.
///
/// # Errors
/// When the engine or the database fails.
pub async fn scale(dir: &Path, s: Settings, sizes: &[usize]) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    for &n in sizes {
        let path = dir.join(format!("scale-{n}.db"));
        // Templates written by the engine itself.
        let engine = engine_on(&path, s, |b| b.register(NoOp).register(Await)).await?;
        let ok = engine
            .workflow::<NoOp>()
            .create(CreateOptions::new(10).id("tpl"))
            .await?;
        ok.wait().await?;
        let waiting = engine
            .workflow::<Await>()
            .create(CreateOptions::new(()).id("tpl"))
            .await?;
        waiting
            .wait_for(|st| st.status == cairn::InstanceStatus::Waiting)
            .await?;
        engine.shutdown().await;
        let waiters = n * 3 / 100;
        cairn::sqlite::replicate_instances(
            &path,
            &[("noop", "tpl", n - waiters), ("await", "tpl", waiters)],
        )?;
        let bytes = std::fs::metadata(&path)?.len() as f64 / n.max(1) as f64;

        let started = Instant::now();
        let engine = engine_on(&path, s, |b| b.register(NoOp).register(Await)).await?;
        let startup = started.elapsed();
        let noop = engine.workflow::<NoOp>();

        // Throughput of new 10-step instances, 200 at once.
        let start = Instant::now();
        let all = create_all::<NoOp>(&engine, |_| 10, 200, "new-").await?;
        for i in &all {
            i.wait().await?;
        }
        let per_sec = 200.0 / start.elapsed().as_secs_f64();

        // Create latency, one at a time while earlier ones run.
        let mut creates = Vec::new();
        let mut created = Vec::new();
        for i in 0..200 {
            let t = Instant::now();
            created.push(
                noop.create(CreateOptions::new(10).id(format!("c-{i}")))
                    .await?,
            );
            creates.push(t.elapsed());
        }
        for i in &created {
            i.wait().await?;
        }
        creates.sort();

        // Send-to-resume on waiting instances.
        let waiting = create_all::<Await>(&engine, |_| (), 20, "w-").await?;
        for w in &waiting {
            w.wait_for(|st| st.status == cairn::InstanceStatus::Waiting)
                .await?;
        }
        let mut resumes = Vec::new();
        for w in &waiting {
            let t = Instant::now();
            w.send_event("go", &1u64).await?;
            w.wait().await?;
            resumes.push(t.elapsed());
        }
        resumes.sort();

        // Throughput again, now that the caches are warm.
        let start = Instant::now();
        let all = create_all::<NoOp>(&engine, |_| 10, 200, "warm-").await?;
        for i in &all {
            i.wait().await?;
        }
        let warm_per_sec = 200.0 / start.elapsed().as_secs_f64();

        // List pages, describe, stream poll.
        let untyped = noop.untyped();
        let (mut firsts, mut nexts, mut describes, mut polls) = (vec![], vec![], vec![], vec![]);
        for _ in 0..20 {
            let t = Instant::now();
            let page = untyped.list(&cairn::ListOptions::default()).await?;
            firsts.push(t.elapsed());
            let t = Instant::now();
            let cursor = page.cursor.unwrap_or_default();
            untyped
                .list(&cairn::ListOptions::default().cursor(cursor))
                .await?;
            nexts.push(t.elapsed());
            let t = Instant::now();
            for status in cairn::InstanceStatus::ALL {
                untyped.count(status).await?;
            }
            describes.push(t.elapsed());
            let t = Instant::now();
            untyped.log(u64::MAX >> 2, 500).await?;
            polls.push(t.elapsed());
        }
        engine.shutdown().await;

        let w = format!("scale ({n} stored, {})", label(s));
        rows.extend([
            Row::new(&w, "new 10-step instances/s", per_sec, "1/s"),
            Row::new(&w, "new 10-step instances/s, warm", warm_per_sec, "1/s"),
            Row::new(&w, "create p99", ms(percentile(&creates, 0.99)), "ms"),
            Row::new(
                &w,
                "send_event → resumed, p50",
                ms(percentile(&resumes, 0.5)),
                "ms",
            ),
            Row::new(&w, "list, first page of 50", ms(mean(&firsts)), "ms"),
            Row::new(&w, "list, next page", ms(mean(&nexts)), "ms"),
            Row::new(&w, "describe (8 counts)", ms(mean(&describes)), "ms"),
            Row::new(
                &w,
                "workflow stream poll, nothing new",
                ms(mean(&polls)),
                "ms",
            ),
            Row::new(&w, "start-up", ms(startup), "ms"),
            Row::new(&w, "bytes per stored instance", bytes, "B"),
        ]);
    }
    Ok(rows)
}
