//! The workloads on PostgreSQL, next to the bare-PostgreSQL bound measured in the same run:
//! throughput with 1, 2 and 4 engine processes sharing one database (this process runs one
//! engine, children the others), latency, and the takeover of a dead engine's instances.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn::InstanceStatus;
use cairn::prelude::*;

use crate::{BenchError, Hold, NoOp, Row, create_all, percentile, resident_bytes};

fn builder(url: &str, schema: &str) -> cairn::EngineBuilder {
    Engine::builder()
        .postgres_options(cairn::postgres::Options::new(url).schema(schema))
        .hibernate_after(Duration::from_millis(100))
}

/// A fresh schema name for one measurement.
fn schema(what: &str) -> String {
    format!("bench_{what}_{}", std::process::id())
}

async fn drop_schema(url: &str, schema: &str) -> Result<(), BenchError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await?;
    drop(client);
    let _ = task.await;
    Ok(())
}

/// The engines started as children; killed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts a child engine (`cairn-bench pg-engine`) and waits until it is ready.
fn spawn_engine(
    exe: &std::path::Path,
    url: &str,
    schema: &str,
    role: &str,
    n: usize,
) -> Result<Child, BenchError> {
    use std::io::BufRead as _;
    let mut child = Command::new(exe)
        .args([
            "pg-engine",
            "--url",
            url,
            "--schema",
            schema,
            "--role",
            role,
        ])
        .args(["--instances", &n.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        return Err(format!("child engine said {line:?}").into());
    }
    Ok(child)
}

/// The child side: an engine on `schema` running no-op instances (`noop`), or holding
/// `instances` blocked instances (`hold`, for the takeover), until killed.
///
/// # Errors
/// When the engine fails.
pub async fn engine_child(
    url: &str,
    schema: &str,
    role: &str,
    instances: usize,
) -> Result<(), BenchError> {
    match role {
        "hold" => {
            let engine = builder(url, schema)
                .lease_ttl(TAKEOVER_TTL)
                .max_running(instances)
                .register(Hold)
                .start()
                .await?;
            create_all::<Hold>(&engine, |_| (), instances, "k").await?;
            while engine.live_instances() < instances {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            println!("ready");
            std::future::pending::<()>().await;
        }
        _ => {
            let _engine = builder(url, schema).register(NoOp).start().await?;
            println!("ready");
            std::future::pending::<()>().await;
        }
    }
    Ok(())
}

/// The lease of the takeover measurement.
const TAKEOVER_TTL: Duration = Duration::from_secs(5);

/// Every PostgreSQL workload, for each engine count.
///
/// # Errors
/// When the server or an engine fails.
pub async fn postgres(
    url: &str,
    engines: &[usize],
    instances: usize,
    steps: u32,
    exe: &std::path::Path,
) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    // The bare bound: the same rows (a journal upsert and a log row of two records per
    // unit), 512 units per transaction, and one per transaction.
    let raw_schema = schema("raw");
    let units = instances * steps as usize * 2;
    let batched =
        cairn::postgres::raw_step_writes(url, &raw_schema, units.min(100_000), 512).await?;
    let single = cairn::postgres::raw_step_writes(url, &raw_schema, 1_000, 1).await?;
    drop_schema(url, &raw_schema).await?;
    let w = "raw bound (PostgreSQL)";
    rows.push(Row::new(
        w,
        "no-op steps/s, 512 writes per transaction",
        batched.steps_per_sec(),
        "1/s",
    ));
    rows.push(Row::new(
        w,
        "commits/s, one step write per transaction",
        single.commits_per_sec(),
        "1/s",
    ));
    for &n in engines {
        rows.extend(throughput(url, n, instances, steps, exe, batched.steps_per_sec()).await?);
    }
    rows.extend(latency(url, 200, steps, single.commits_per_sec()).await?);
    rows.extend(events(url, 2_000).await?);
    rows.extend(hibernation(url, 10_000).await?);
    rows.extend(takeover(url, 200, exe).await?);
    Ok(rows)
}

async fn throughput(
    url: &str,
    engines: usize,
    instances: usize,
    steps: u32,
    exe: &std::path::Path,
    raw_steps_per_sec: f64,
) -> Result<Vec<Row>, BenchError> {
    let schema = schema(&format!("t{engines}"));
    drop_schema(url, &schema).await?;
    // This engine's store opened here, to read how its writer batched.
    let store = std::sync::Arc::new(
        cairn::postgres::PostgresStore::open(cairn::postgres::Options::new(url).schema(&schema))
            .await?,
    );
    let engine = Engine::builder()
        .store(store.clone())
        .lease_ttl(cairn::DEFAULT_LEASE_TTL)
        .hibernate_after(Duration::from_millis(100))
        .register(NoOp)
        .start()
        .await?;
    let _children = Children(
        (1..engines)
            .map(|_| spawn_engine(exe, url, &schema, "noop", 0))
            .collect::<Result<_, _>>()?,
    );
    let client = engine.workflow::<NoOp>();
    let untyped = client.untyped().clone();
    let start = Instant::now();
    create_all::<NoOp>(&engine, |_| steps, instances, "t").await?;
    while untyped.count(InstanceStatus::Complete).await? < instances as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let rss = resident_bytes();
    let batches = store.batch_stats();
    let (transactions, jobs, largest) = (batches.transactions(), batches.jobs(), batches.largest());
    engine.shutdown().await;
    drop(_children);
    drop_schema(url, &schema).await?;
    let steps_per_sec = (instances * steps as usize) as f64 / elapsed;
    let w =
        format!("PostgreSQL throughput ({instances} × {steps} steps, {engines} engine processes)");
    Ok(vec![
        Row::new(&w, "durable no-op steps/s", steps_per_sec, "1/s")
            .ratio(steps_per_sec / raw_steps_per_sec),
        Row::new(&w, "instances/s", instances as f64 / elapsed, "1/s"),
        Row::new(
            &w,
            "writes per transaction, this engine (mean)",
            jobs as f64 / transactions.max(1) as f64,
            "",
        ),
        Row::new(
            &w,
            "writes per transaction, this engine (largest)",
            largest as f64,
            "",
        ),
        Row::new(&w, "resident memory, this engine", crate::mib(rss), "MiB"),
    ])
}

async fn latency(
    url: &str,
    runs: usize,
    steps: u32,
    commits_per_sec: f64,
) -> Result<Vec<Row>, BenchError> {
    let schema = schema("latency");
    drop_schema(url, &schema).await?;
    let engine = builder(url, &schema).register(NoOp).start().await?;
    let client = engine.workflow::<NoOp>();
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs {
        let start = Instant::now();
        client
            .create(CreateOptions::new(steps).id(format!("l{i}")))
            .await?
            .wait()
            .await?;
        times.push(start.elapsed());
    }
    engine.shutdown().await;
    drop_schema(url, &schema).await?;
    times.sort();
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    let commits = 4 + 2 * steps as usize;
    let bound_ms = commits as f64 * 1e3 / commits_per_sec;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let w = format!("PostgreSQL latency ({steps} steps, {runs} runs, 1 engine)");
    Ok(vec![
        Row::new(&w, "end to end p50", ms(p50), "ms").ratio(ms(p50) / bound_ms),
        Row::new(&w, "end to end p99", ms(p99), "ms").ratio(ms(p99) / bound_ms),
        Row::new(
            &w,
            format!("bound: {commits} commits × one commit"),
            bound_ms,
            "ms",
        ),
    ])
}

/// Instances hibernated waiting for an event, then one `send_event` each.
async fn events(url: &str, instances: usize) -> Result<Vec<Row>, BenchError> {
    let schema = schema("events");
    drop_schema(url, &schema).await?;
    let engine = builder(url, &schema).register(crate::Await).start().await?;
    let rows = crate::measure_events(
        engine,
        instances,
        format!("PostgreSQL events ({instances} waiting, 1 engine)"),
    )
    .await?;
    drop_schema(url, &schema).await?;
    Ok(rows)
}

/// Instances sleeping an hour hold no memory; an engine whose clock is an hour ahead wakes
/// them all.
async fn hibernation(url: &str, instances: usize) -> Result<Vec<Row>, BenchError> {
    let schema = schema("hibernation");
    drop_schema(url, &schema).await?;
    let engine = builder(url, &schema).register(crate::Nap).start().await?;
    let start = Instant::now();
    create_all::<crate::Nap>(&engine, |_| (), instances, "h").await?;
    let naps = engine.workflow_by_name("nap")?;
    while naps.count(InstanceStatus::Waiting).await? < instances as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let live = crate::until_unloaded(&engine).await;
    let asleep = start.elapsed();
    let rss = resident_bytes();
    engine.shutdown().await;
    let later = cairn::Clock::virtual_at(
        cairn::Timestamp::from_system_time(std::time::SystemTime::now())
            .saturating_add(Duration::from_secs(3601)),
    );
    let start = Instant::now();
    let engine = builder(url, &schema)
        .clock(later)
        .register(crate::Nap)
        .start()
        .await?;
    let naps = engine.workflow_by_name("nap")?;
    while naps.count(InstanceStatus::Complete).await? < instances as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let woke = start.elapsed().as_secs_f64();
    engine.shutdown().await;
    drop_schema(url, &schema).await?;
    let w = format!("PostgreSQL hibernation ({instances} sleeping, 1 engine)");
    Ok(vec![
        Row::new(
            &w,
            "time to create and hibernate all",
            asleep.as_secs_f64(),
            "s",
        ),
        Row::new(&w, "instances in memory while asleep", live as f64, ""),
        Row::new(&w, "resident memory while asleep", crate::mib(rss), "MiB"),
        Row::new(
            &w,
            "timer wake-ups/s (to completion)",
            instances as f64 / woke,
            "1/s",
        ),
    ])
}

/// SIGKILLs an engine holding `instances` running instances; this process's engine takes
/// them over once their leases (5 s) run out.
async fn takeover(
    url: &str,
    instances: usize,
    exe: &std::path::Path,
) -> Result<Vec<Row>, BenchError> {
    let schema = schema("takeover");
    drop_schema(url, &schema).await?;
    let mut child = spawn_engine(exe, url, &schema, "hold", instances)?;
    child.kill()?;
    child.wait()?;
    crate::HOLD.store(false, std::sync::atomic::Ordering::SeqCst);
    let killed = Instant::now();
    let engine = builder(url, &schema)
        .max_running(instances)
        .register(Hold)
        .start()
        .await?;
    let client = engine.workflow_by_name("hold")?;
    while client.count(InstanceStatus::Complete).await? < instances as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = killed.elapsed();
    engine.shutdown().await;
    drop_schema(url, &schema).await?;
    let w = format!(
        "PostgreSQL takeover ({instances} in flight, SIGKILL, lease {} s)",
        TAKEOVER_TTL.as_secs()
    );
    Ok(vec![
        Row::new(
            &w,
            "kill to all complete on another engine",
            took.as_secs_f64(),
            "s",
        ),
        Row::new(
            &w,
            "target: lease + 1 s",
            TAKEOVER_TTL.as_secs_f64() + 1.0,
            "s",
        ),
    ])
}
