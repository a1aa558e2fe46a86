//! Crashes and stalls of whole engine processes sharing one PostgreSQL database.
//!
//! - Three engine processes run 500 instances mixing steps, a retry, sleeps (some long
//!   enough to hibernate), an event wait and rollbacks; a random engine is SIGKILLed and
//!   restarted 20 times at seeded moments. Every instance ends once, with the outcome of a
//!   fault-free run; no step is committed twice, no attempt number runs twice, every event
//!   is delivered once and every compensation recorded once.
//! - An engine SIGSTOPped inside a step for longer than its lease loses the instance to
//!   another engine, which finishes it; woken up, the first writes nothing.
//!
//! The engines are this test binary run again with `CAIRN_CRASH_CHILD` (their directory;
//! the schema is named after it) and `CAIRN_PG_CHILD` (what to do). Without
//! `CAIRN_TEST_PG_URL` these tests do nothing, after a loud notice.

#![cfg(feature = "postgres")]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Backend, FnWorkflow, Rng, builder_on, wf};
use cairn::prelude::*;
use cairn::store::{ListQuery, NewEvent, Sent, Store};
use cairn::{Clock, InstanceStatus, LogKind, WorkflowName};
use serde_json::json;

const INSTANCES: usize = 500;
const ENGINES: usize = 3;
const KILLS: usize = 20;
/// Short, so killed engines' instances move on soon; long enough that a busy engine on these two
/// shared cores renews in time.
const LEASE: Duration = Duration::from_secs(3);

/// What an instance `i{n}` returns when nothing fails.
fn expected_output(n: u64) -> u64 {
    n + 1 + 7 * n + 2
}

fn effect(dir: &Path, line: &str) {
    crate::support::append_line(&dir.join("effects.txt"), line);
}

/// The mixed workflow; every body and compensation appends `id step attempt pid`.
fn mixed(dir: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let dir = dir.clone();
        async move {
            let id = event.instance_id.to_string();
            let n: u64 = id[1..]
                .parse()
                .map_err(|e: std::num::ParseIntError| e.to_string())?;
            let body = |name: &'static str, value: u64, fail_first: bool| {
                let (dir, id) = (dir.clone(), id.clone());
                move |ctx: cairn::StepContext| {
                    effect(
                        &dir,
                        &format!("{id} {name} {} {}", ctx.attempt, std::process::id()),
                    );
                    async move {
                        // Widen the window in which a kill lands mid-attempt.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        if fail_first && ctx.attempt == 1 {
                            Err(cairn::StepError::from("first attempts fail"))
                        } else {
                            Ok(value)
                        }
                    }
                }
            };
            let a: u64 = step.run("a", body("a", n, false)).await?;
            let b: u64 = step
                .run("flaky", body("flaky", 1, true))
                .retries(Retries::constant(3, Duration::from_millis(20)))
                .await?;
            // Every fifth sleeps long enough to hibernate (and be claimed again, anywhere).
            let nap = if n.is_multiple_of(5) { 1_200 } else { 20 };
            step.sleep("nap", Duration::from_millis(nap)).await?;
            let go: StepEvent<u64> = step.wait_for_event("go", "go").await?;
            let undo = {
                let (dir, id) = (dir.clone(), id.clone());
                move |rb: Rollback<u64>| {
                    let (dir, id) = (dir.clone(), id.clone());
                    async move {
                        // A compensation interrupted by a kill runs again (at least once);
                        // its record is what must be there once.
                        let _ = rb;
                        effect(&dir, &format!("{id} undo_c - {}", std::process::id()));
                        Ok(())
                    }
                }
            };
            let c: u64 = step.run("c", body("c", 2, false)).rollback(undo).await?;
            if n.is_multiple_of(10) {
                return Err("boom".into());
            }
            Ok(json!(a + b + go.payload + c))
        }
    })
}

fn child_dir() -> Option<PathBuf> {
    crate::support::crash_child_dir().filter(|_| std::env::var_os("CAIRN_PG_CHILD").is_some())
}

fn builder(dir: &Path) -> cairn::EngineBuilder {
    builder_on(Backend::Postgres, &dir.join("cairn.db"))
        .clock(Clock::system())
        .lease_ttl(LEASE)
}

/// A child engine of the kill test: creates the instances (idempotently) and runs until
/// every one has finished.
#[test]
fn pg_kill_child_entry() {
    let Some(dir) = child_dir() else { return };
    if std::env::var("CAIRN_PG_CHILD").as_deref() != Ok("kill") {
        return;
    }
    let instances: usize = std::env::var("CAIRN_PG_INSTANCES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(INSTANCES);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Few slots: the run lasts long enough for every kill to land mid-work. A start
        // whose connection is cut fails (an engine starts on a store it can reach, or says
        // why it cannot): on a loaded machine the first cut can land while it starts, so
        // this test's process starts it again, as a supervisor would.
        let engine = loop {
            match builder(&dir)
                .register(mixed(dir.clone()))
                .max_running(40)
                .start()
                .await
            {
                Ok(engine) => break engine,
                Err(e) => {
                    eprintln!("starting the engine failed ({e}); starting it again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let client = engine.workflow::<FnWorkflow>();
        // The calls of this test client retry while the connections are being cut (the
        // engine itself needs no help).
        for start in (0..instances).step_by(100) {
            let batch: Vec<_> = (start..instances.min(start + 100))
                .map(|i| CreateOptions::new(json!({})).id(format!("i{i}")))
                .collect();
            while client.create_batch(batch.clone()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let untyped = client.untyped();
        loop {
            let mut done = 0;
            for status in [
                InstanceStatus::Complete,
                InstanceStatus::Errored,
                InstanceStatus::Terminated,
            ] {
                done += untyped.count(status).await.unwrap_or(0);
            }
            if done as usize >= instances {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        engine.shutdown().await;
    });
}

/// The engine processes; killed if the test ends early (a panic), so none outlives it.
struct Engines(Vec<Child>);

impl Engines {
    /// Waits (up to two minutes) for every engine to finish its run successfully.
    fn finish(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        for (i, child) in self.0.iter_mut().enumerate() {
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "engine {i} failed: {status}");
                    break;
                }
                assert!(Instant::now() < deadline, "the engines did not finish");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_child(dir: &Path, test: &str, role: &str) -> Child {
    spawn_child_with(dir, test, role, INSTANCES)
}

fn spawn_child_with(dir: &Path, test: &str, role: &str, instances: usize) -> Child {
    spawn_child_on(
        dir,
        test,
        role,
        instances,
        &cairn::postgres::test_url().unwrap(),
    )
}

fn spawn_child_on(dir: &Path, test: &str, role: &str, instances: usize, url: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--test-threads=1"])
        .env("CAIRN_TEST_PG_URL", url)
        .env("CAIRN_CRASH_CHILD", dir)
        .env("CAIRN_PG_CHILD", role)
        .env("CAIRN_PG_INSTANCES", instances.to_string())
        // Its test harness's report (why it failed) goes with the parent's output.
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The store the children share, opened directly (no engine: nothing runs here).
async fn raw_store(dir: &Path) -> Arc<dyn Store> {
    raw_store_on(dir, &cairn::postgres::test_url().unwrap()).await
}

async fn raw_store_on(dir: &Path, url: &str) -> Arc<dyn Store> {
    let schema = crate::support::schema_for(&dir.join("cairn.db"));
    Arc::new(
        cairn::postgres::PostgresStore::open(cairn::postgres::Options::new(url).schema(schema))
            .await
            .unwrap(),
    )
}

/// The events, each sent twice with one key (a retried send): delivered once. Sent as the
/// instances appear.
async fn send_events(store: &dyn Store, instances: usize) {
    send_events_to(store, 0..instances).await;
}

/// [`send_events`] to instances `i{n}` for `n` in `range`.
async fn send_events_to(store: &dyn Store, range: std::ops::Range<usize>) {
    let workflow = WorkflowName::new("test").unwrap();
    let mut sent = HashSet::new();
    let start = Instant::now();
    while sent.len() < range.len() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "instances never created"
        );
        for n in range.clone() {
            if sent.contains(&n) {
                continue;
            }
            let id = cairn::InstanceId::new(format!("i{n}")).unwrap();
            for _ in 0..2 {
                let event = NewEvent {
                    event_type: cairn::EventType::new("go").unwrap(),
                    payload: (7 * n as u64).to_string(),
                    at: cairn::Timestamp::from_system_time(std::time::SystemTime::now()),
                    idempotency_key: Some(format!("go-{n}")),
                };
                match store.send_event(&workflow, &id, event).await {
                    Ok(Sent::Buffered(_) | Sent::Duplicate(_)) => {
                        sent.insert(n);
                    }
                    Ok(Sent::NotFound) => break,
                    // The server may be cutting connections: try again.
                    Err(cairn::store::Error::Unavailable(_)) => break,
                    other => panic!("send to i{n}: {other:?}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn all_instances(store: &dyn Store) -> Vec<cairn::store::InstanceRecord> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .list(ListQuery {
                workflow: Some(WorkflowName::new("test").unwrap()),
                after: before,
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.instance);
        out.extend(page);
    }
    out
}

#[test]
fn pg_engines_killed_at_random_lose_nothing_and_repeat_nothing() {
    if crate::support::crash_child_dir().is_some() || cairn::postgres::test_url().is_none() {
        return;
    }
    let seed = crate::support::test_seed("pg_engines_killed_at_random");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let test = "crash_postgres::pg_kill_child_entry";
    let mut engines = Engines(
        (0..ENGINES)
            .map(|_| spawn_child(dir.path(), test, "kill"))
            .collect(),
    );
    let children = &mut engines.0;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(raw_store(dir.path()));
    // Kill a random engine at seeded moments, and start it again. The events go out a
    // share after each kill, so no run can finish before every kill has landed (with the
    // share sent before its kill, a fast run finished in the last pause and the last kill
    // found no engine to kill).
    let mut kills = 0;
    let share = INSTANCES.div_ceil(KILLS);
    while kills < KILLS {
        std::thread::sleep(Duration::from_millis(rng.between(30, 300)));
        let victim = rng.below(ENGINES as u64) as usize;
        if let Some(status) = children[victim].try_wait().unwrap() {
            assert!(status.success(), "engine {victim} failed: {status}");
            break; // cannot happen: the last events go out after the last kill
        }
        children[victim].kill().unwrap(); // SIGKILL
        children[victim].wait().unwrap();
        children[victim] = spawn_child(dir.path(), test, "kill");
        let from = kills * share;
        rt.block_on(send_events_to(&*store, from..INSTANCES.min(from + share)));
        kills += 1;
    }
    engines.finish();
    eprintln!("killed an engine {kills} times");
    assert_eq!(kills, KILLS, "the run ended before every kill landed");
    rt.block_on(verify_mixed_run(&*store, dir.path(), INSTANCES));
}

/// Every instance ended once with its fault-free outcome; no step committed twice, no
/// attempt number twice, each event delivered once, each compensation recorded once.
async fn verify_mixed_run(store: &dyn Store, dir: &Path, expected: usize) {
    let instances = all_instances(store).await;
    assert_eq!(instances.len(), expected);
    let mut problems = Vec::new();
    for record in &instances {
        let id = record.id.to_string();
        let n: u64 = id[1..].parse().unwrap();
        if n.is_multiple_of(10) && record.status != InstanceStatus::Errored {
            problems.push(format!("{id}: {:?}, expected errored", record.status));
        }
        let log = store.log(record.instance, 0, 10_000).await.unwrap();
        if !n.is_multiple_of(10)
            && (record.status != InstanceStatus::Complete
                || record.output.as_deref() != Some(expected_output(n).to_string().as_str()))
        {
            let trail: Vec<String> = log
                .iter()
                .map(|r| {
                    format!(
                        "{} {} {}",
                        r.entry.kind.as_str(),
                        r.entry
                            .step
                            .as_ref()
                            .map(|k| k.target())
                            .unwrap_or_default(),
                        r.entry.meta
                    )
                })
                .collect();
            problems.push(format!(
                "{id}: {:?} {:?} {:?}\n  {}",
                record.status,
                record.output,
                record.error,
                trail.join("\n  ")
            ));
        }
        let mut successes: HashMap<String, usize> = HashMap::new();
        let mut attempts: HashSet<(String, u64)> = HashSet::new();
        let mut waits = 0;
        let mut compensations = 0;
        let mut ends = 0;
        for r in &log {
            let target = r
                .entry
                .step
                .as_ref()
                .map(|k| k.target())
                .unwrap_or_default();
            match r.entry.kind {
                LogKind::StepSuccess => *successes.entry(target).or_default() += 1,
                LogKind::AttemptStart => {
                    let attempt = r.entry.meta["attempt"].as_u64().unwrap_or(0);
                    if !attempts.insert((target.clone(), attempt)) {
                        problems.push(format!("{id}: attempt {attempt} of {target} started twice"));
                    }
                }
                LogKind::WaitComplete => waits += 1,
                LogKind::RollbackStepSuccess => compensations += 1,
                LogKind::WorkflowSuccess | LogKind::WorkflowFailure => ends += 1,
                _ => {}
            }
        }
        for (target, count) in &successes {
            if *count != 1 {
                problems.push(format!("{id}: {target} succeeded {count} times"));
            }
        }
        if waits != 1 {
            problems.push(format!("{id}: {waits} events delivered"));
        }
        if ends != 1 {
            problems.push(format!("{id}: ended {ends} times"));
        }
        let expected_compensations = usize::from(n.is_multiple_of(10));
        if compensations != expected_compensations {
            problems.push(format!("{id}: {compensations} compensations recorded"));
        }
    }
    // No attempt number ran twice: each (instance, step, attempt) in the effects once.
    let effects = std::fs::read_to_string(dir.join("effects.txt")).unwrap();
    let mut seen = HashSet::new();
    for line in effects.lines().filter(|l| !l.contains(" undo_c ")) {
        let mut parts = line.split(' ');
        let key: Vec<&str> = parts.by_ref().take(3).collect();
        if !seen.insert(key.clone()) {
            problems.push(format!("attempt ran twice: {line}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems[..problems.len().min(40)].join("\n")
    );
}

/// One instance whose first step runs for a while; each attempt appends `start`/`end`.
fn slow(dir: PathBuf) -> FnWorkflow {
    wf(move |_, step| {
        let dir = dir.clone();
        async move {
            let dir2 = dir.clone();
            let slow: u64 = step
                .run("slow", move |ctx| {
                    let dir = dir2.clone();
                    async move {
                        let pid = std::process::id();
                        effect(&dir, &format!("start {pid} {}", ctx.attempt));
                        tokio::time::sleep(Duration::from_millis(2_500)).await;
                        effect(&dir, &format!("end {pid} {}", ctx.attempt));
                        Ok(1)
                    }
                })
                .await?;
            let after: u64 = step.run("after", |_| async { Ok(2) }).await?;
            Ok(json!(slow + after))
        }
    })
}

/// A child engine of the stall test: creates `s` and runs until it has finished.
#[test]
fn pg_stall_child_entry() {
    let Some(dir) = child_dir() else { return };
    if std::env::var("CAIRN_PG_CHILD").as_deref() != Ok("stall") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = builder(&dir)
            .lease_ttl(Duration::from_secs(1))
            .register(slow(dir.clone()))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        let _ = client.create(CreateOptions::new(json!({})).id("s")).await;
        client.get("s").await.unwrap().wait().await.unwrap();
        engine.shutdown().await;
    });
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

fn effects(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("effects.txt")).unwrap_or_default()
}

#[test]
fn pg_a_stalled_engine_is_fenced_off_and_writes_nothing_after_it_wakes() {
    if crate::support::crash_child_dir().is_some() || cairn::postgres::test_url().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let test = "crash_postgres::pg_stall_child_entry";
    let mut engines = Engines(vec![spawn_child(dir.path(), test, "stall")]);
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let first = engines.0[0].id();
    wait_for("the first engine never started the step", &|| {
        effects(dir.path()).contains(&format!("start {first} 1"))
    });
    // Stopped inside the step for longer than its 1 s lease.
    signal(&engines.0[0], "-STOP");
    engines.0.push(spawn_child(dir.path(), test, "stall"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(raw_store(dir.path()));
    let workflow = WorkflowName::new("test").unwrap();
    let id = cairn::InstanceId::new("s").unwrap();
    let record = rt.block_on(async {
        let start = Instant::now();
        loop {
            let record = store.instance(&workflow, &id).await.unwrap().unwrap();
            if record.status == InstanceStatus::Complete {
                break record;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the second engine never finished it"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let before = rt.block_on(async {
        (
            store.log(record.instance, 0, 1000).await.unwrap(),
            store.journal(record.instance).await.unwrap(),
        )
    });
    // Woken: it stops the lifetime (its lease ran out) or its step body runs on to its end
    // first, whichever its tasks get to first; either way nothing reaches the database.
    signal(&engines.0[0], "-CONT");
    std::thread::sleep(Duration::from_millis(3_000));
    assert!(
        !effects(dir.path()).contains(&format!("start {first} 2")),
        "the woken engine started another attempt"
    );
    let after = rt.block_on(async {
        (
            store.log(record.instance, 0, 1000).await.unwrap(),
            store.journal(record.instance).await.unwrap(),
        )
    });
    assert_eq!(
        before, after,
        "the woken engine wrote after losing its lease"
    );
    let (log, journal) = after;
    assert_eq!(record.output.as_deref(), Some("3"));
    let successes = log
        .iter()
        .filter(|r| r.entry.kind == LogKind::StepSuccess)
        .count();
    assert_eq!(successes, 2, "one committed outcome per step");
    let attempts: Vec<u64> = log
        .iter()
        .filter(|r| {
            r.entry.kind == LogKind::AttemptStart
                && r.entry.step.as_ref().is_some_and(|k| k.name == "slow")
        })
        .map(|r| r.entry.meta["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(
        attempts,
        [1, 2],
        "the stalled attempt is recorded as interrupted"
    );
    assert!(
        journal
            .iter()
            .all(|s| s.state == cairn::StepState::Succeeded)
    );
    for child in &mut engines.0 {
        let status = child.wait().unwrap();
        assert!(status.success(), "an engine failed: {status}");
    }
}

/// Milliseconds since the epoch by the system clock, which every process here shares.
fn wall_ms() -> i64 {
    cairn::Timestamp::from_system_time(std::time::SystemTime::now()).as_millis()
}

/// The lease of the wake test: the stall is 1.5 of it.
const WAKE_LEASE: Duration = Duration::from_secs(2);

/// Three steps of 400 ms each; every attempt appends `<id> <step> <attempt> start|end <ms>`.
fn paced(dir: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let dir = dir.clone();
        async move {
            let id = event.instance_id.to_string();
            for name in ["a", "b", "c"] {
                let (dir, id) = (dir.clone(), id.clone());
                let _: u32 = step
                    .run(name, move |ctx| {
                        let (dir, id) = (dir.clone(), id.clone());
                        async move {
                            let at = wall_ms;
                            effect(&dir, &format!("{id} {name} {} start {}", ctx.attempt, at()));
                            tokio::time::sleep(Duration::from_millis(400)).await;
                            effect(&dir, &format!("{id} {name} {} end {}", ctx.attempt, at()));
                            Ok(1)
                        }
                    })
                    // An interrupted attempt runs again at once: the delays measured are
                    // the engine's, not a back-off's.
                    .retries(cairn::Retries::constant(5, Duration::ZERO))
                    .await?;
            }
            Ok(json!(3))
        }
    })
}

/// A child engine of the wake test: creates its instances and runs them, a few at a time,
/// until every one has finished.
#[test]
fn pg_wake_child_entry() {
    let Some(dir) = child_dir() else { return };
    if std::env::var("CAIRN_PG_CHILD").as_deref() != Ok("wake") {
        return;
    }
    let instances: usize = std::env::var("CAIRN_PG_INSTANCES")
        .unwrap()
        .parse()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = builder(&dir)
            .lease_ttl(WAKE_LEASE)
            .register(paced(dir.clone()))
            .max_running(8)
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        crate::support::create_numbered(&client, instances).await;
        crate::support::wait_numbered(&client, instances).await;
        engine.shutdown().await;
    });
}

/// The longest any instance waited for its next step after `woke` (ms since the epoch):
/// the gaps between one effect of an instance and its next (an attempt's own run from its
/// start to its end excepted), and from `woke` to the first effect of an instance that was
/// running then.
fn longest_delay_after(effects: &str, woke: i64) -> (i64, String) {
    let mut by_instance: HashMap<&str, Vec<(i64, &str, &str, &str)>> = HashMap::new();
    for line in effects.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        let [id, step, attempt, what, at] = p[..] else {
            continue;
        };
        by_instance
            .entry(id)
            .or_default()
            .push((at.parse().unwrap(), step, attempt, what));
    }
    let mut worst = (0, String::new());
    for (id, mut points) in by_instance {
        points.sort();
        let before = points.iter().filter(|p| p.0 < woke).count();
        let finished = points
            .iter()
            .any(|p| p.0 < woke && p.1 == "c" && p.3 == "end");
        let mut last: Option<(i64, &str, &str, &str)> =
            (before > 0 && !finished).then_some((woke, "", "", "woke"));
        for point in points.into_iter().skip(before) {
            if let Some(prev) = last {
                let own_run = prev.3 == "start" && point.3 == "end" && prev.1 == point.1;
                if !own_run && point.0 - prev.0 > worst.0 {
                    worst = (point.0 - prev.0, format!("{id}: {prev:?} -> {point:?}"));
                }
            }
            last = Some(point);
        }
    }
    worst
}

/// Issue 35: an engine SIGSTOPped for 1.5 leases while it runs and claims work (no other
/// engine to take its instances) stops the lifetimes whose leases ran out once, takes them
/// back, and is back to normal at once: no instance waits more than a lease after SIGCONT,
/// and every instance completes with each committed step run once.
#[test]
fn pg_an_engine_woken_from_a_stall_past_its_lease_runs_its_work_again_within_a_lease() {
    if crate::support::crash_child_dir().is_some() || cairn::postgres::test_url().is_none() {
        return;
    }
    const WORK: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let test = "crash_postgres::pg_wake_child_entry";
    let mut engines = Engines(vec![spawn_child_with(dir.path(), test, "wake", WORK)]);
    let started = Instant::now();
    while effects(dir.path()).lines().count() < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the engine never got going"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&engines.0[0], "-STOP");
    std::thread::sleep(WAKE_LEASE * 3 / 2);
    let woke = wall_ms();
    signal(&engines.0[0], "-CONT");
    engines.finish();
    let effects = effects(dir.path());
    let (delay, at) = longest_delay_after(&effects, woke);
    eprintln!(
        "the longest any instance waited after SIGCONT: {delay} ms ({at}); the lease is {} ms",
        WAKE_LEASE.as_millis()
    );
    assert!(
        u128::try_from(delay).unwrap() < WAKE_LEASE.as_millis(),
        "an instance waited {delay} ms after the stall: {at}"
    );
    // Every instance complete, each committed step's body run by one attempt after its last
    // start (an interrupted attempt is followed by a new one, never run twice).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(raw_store(dir.path()));
    let records = rt.block_on(all_instances(&*store));
    assert_eq!(records.len(), WORK);
    for record in records {
        assert_eq!(record.status, InstanceStatus::Complete, "{}", record.id);
    }
    let mut runs: HashMap<(String, String, String), usize> = HashMap::new();
    for line in effects.lines().filter(|l| l.contains(" start ")) {
        let p: Vec<&str> = line.split(' ').collect();
        *runs
            .entry((p[0].into(), p[1].into(), p[2].into()))
            .or_default() += 1;
    }
    assert!(
        runs.values().all(|n| *n == 1),
        "an attempt ran twice: {:?}",
        runs.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
}

/// Kills every connection the engines hold, several times while they work: everything
/// still completes once (the writer and the listener reconnect; work whose commit answer
/// was lost is replayed from what the store holds).
#[test]
fn pg_engines_survive_their_connections_being_killed() {
    if crate::support::crash_child_dir().is_some() || cairn::postgres::test_url().is_none() {
        return;
    }
    const N: usize = 150;
    let seed = crate::support::test_seed("pg_engines_survive_their_connections_being_killed");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let test = "crash_postgres::pg_kill_child_entry";
    let mut engines = Engines(
        (0..2)
            .map(|_| spawn_child_with(dir.path(), test, "kill", N))
            .collect(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(raw_store(dir.path()));
    let schema = crate::support::schema_for(&dir.path().join("cairn.db"));
    rt.block_on(async {
        let url = cairn::postgres::test_url().unwrap();
        let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut cuts = 0;
        let events = send_events(&*store, N);
        tokio::pin!(events);
        let mut events_done = false;
        while cuts < 6 {
            tokio::select! {
                () = &mut events, if !events_done => events_done = true,
                () = tokio::time::sleep(Duration::from_millis(rng.between(100, 500))) => {
                    // Every connection to this test's schema (named in the application
                    // name), the listeners' and the raw store's included.
                    let killed = admin
                        .query(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                             WHERE application_name = $1",
                            &[&format!("cairn:{schema}")],
                        )
                        .await
                        .unwrap()
                        .len();
                    eprintln!("cut {killed} connections");
                    cuts += 1;
                }
            }
        }
        if !events_done {
            events.await;
        }
    });
    engines.finish();
    // The raw store's own connections were cut too: it reconnects as the engines do.
    rt.block_on(verify_mixed_run(&*store, dir.path(), N));
}

/// The cluster script `.ci/run` uses.
fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/postgres.sh")
}

/// A PostgreSQL cluster of this test's own (it is restarted under load, which the shared
/// one must not be); stopped when dropped.
struct Cluster(PathBuf);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(cluster_script())
            .args(["stop", &self.0.to_string_lossy()])
            .status();
    }
}

/// Restarts PostgreSQL itself twice while two engines work: everything completes once.
#[test]
fn pg_engines_survive_a_postgres_restart() {
    if crate::support::crash_child_dir().is_some() || cairn::postgres::test_url().is_none() {
        return;
    }
    const N: usize = 150;
    let base = tempfile::tempdir().unwrap();
    // The postgres user (CI runs as root) must reach the cluster's directory.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let cluster_dir = base.path().join("cluster");
    let out = Command::new(cluster_script())
        .args(["start", &cluster_dir.to_string_lossy()])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "could not start a private cluster");
    let _cluster = Cluster(cluster_dir.clone());
    let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let dir = base.path().join("engines");
    std::fs::create_dir_all(&dir).unwrap();
    let test = "crash_postgres::pg_kill_child_entry";
    let mut engines = Engines(
        (0..2)
            .map(|_| spawn_child_on(&dir, test, "kill", N, &url))
            .collect(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(raw_store_on(&dir, &url));
    rt.block_on(send_events(&*store, N));
    let finished = |store: &dyn Store| {
        rt.block_on(async {
            let workflow = WorkflowName::new("test").unwrap();
            let mut n = 0;
            for s in [InstanceStatus::Complete, InstanceStatus::Errored] {
                n += store.count(&workflow, s).await.unwrap_or(0);
            }
            n as usize
        })
    };
    let before = finished(&*store);
    assert!(
        before < N,
        "the restarts must land while instances run ({before} done)"
    );
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let restarted = Command::new(cluster_script())
            .args(["restart", &cluster_dir.to_string_lossy()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(restarted.success(), "restart failed");
        eprintln!(
            "restarted PostgreSQL with {} of {N} instances finished",
            finished(&*store)
        );
    }
    engines.finish();
    rt.block_on(verify_mixed_run(&*store, &dir, N));
}
