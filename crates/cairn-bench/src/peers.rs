//! `peers`: the workload the issue tracker used to compare Cairn with Restate and DBOS on
//! this machine, reproducible from the project. A workflow of 10 no-op durable steps;
//! "single" is one instance at a time, created and seen complete (p50 of `runs`);
//! "200@50" is 200 instances in a closed loop with 50 in flight; "1000@200" likewise.
//! Each shape runs embedded (`create` + `Instance::wait`) and over HTTP (one request per
//! instance, `POST …/instances?wait=60s`, on keep-alive connections of a small Rust client,
//! so the client's own cost stays small) against `cairn_server` on loopback in this process.
//! Beside each rate: the process's CPU per instance (the client's included) and the
//! writer's group commits per instance, which show where HTTP's share goes; and the HTTP
//! floor, `GET /healthz` on as many connections, which costs the same request handling
//! and transport without an instance.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cairn::prelude::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::{
    BenchError, NoOp, Row, Settings, cpu_since, cpu_time, label, median, per_step_micros,
    percentile,
};

/// One keep-alive HTTP/1.1 connection that posts JSON and reads a `Content-Length` answer.
pub(crate) struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    pub(crate) async fn open(port: u16) -> Result<Conn, BenchError> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream: BufReader::new(stream),
        })
    }

    async fn post(&mut self, path: &str, body: &str) -> Result<(u16, Vec<u8>), BenchError> {
        self.send("POST", path, body).await
    }

    /// A `GET`; answers the status and the body.
    pub(crate) async fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>), BenchError> {
        self.send("GET", path, "").await
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(u16, Vec<u8>), BenchError> {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.get_mut().write_all(request.as_bytes()).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("not an HTTP answer: {line:?}"))?;
        let mut length = 0;
        loop {
            line.clear();
            self.stream.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut answer = vec![0; length];
        self.stream.read_exact(&mut answer).await?;
        Ok((status, answer))
    }
}

/// Creates one instance over HTTP and waits for it in the same request.
async fn http_run(conn: &mut Conn, steps: u32) -> Result<(), BenchError> {
    let (status, body) = conn
        .post(
            "/api/workflows/noop/instances?wait=60s",
            &format!("{{\"params\": {steps}}}"),
        )
        .await?;
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    if status != 201 || answer["status"] != "complete" {
        return Err(format!("the instance did not complete: {status} {answer}").into());
    }
    Ok(())
}

async fn embedded_run(engine: &Engine, steps: u32) -> Result<(), BenchError> {
    let instance = engine
        .workflow::<NoOp>()
        .create(CreateOptions::new(steps))
        .await?;
    instance.wait().await?;
    Ok(())
}

/// `total` instances, `in_flight` at a time; instances per second.
async fn closed_loop(
    engine: &Engine,
    port: Option<u16>,
    steps: u32,
    total: usize,
    in_flight: usize,
) -> Result<f64, BenchError> {
    let next = Arc::new(AtomicUsize::new(0));
    // The connections are open before the clock starts, as a client's pool would be:
    // 200 connects at once measure the kernel's accept queue, not the engine.
    let mut conns = Vec::with_capacity(in_flight);
    for _ in 0..in_flight {
        conns.push(match port {
            Some(port) => Some(Conn::open(port).await?),
            None => None,
        });
    }
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for mut conn in conns {
        let (engine, next) = (engine.clone(), Arc::clone(&next));
        workers.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total {
                match conn.as_mut() {
                    Some(conn) => http_run(conn, steps).await?,
                    None => embedded_run(&engine, steps).await?,
                }
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// p50 of `runs` single instances, one at a time.
async fn single(
    engine: &Engine,
    port: Option<u16>,
    steps: u32,
    runs: usize,
) -> Result<Duration, BenchError> {
    let mut conn = match port {
        Some(port) => Some(Conn::open(port).await?),
        None => None,
    };
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        match conn.as_mut() {
            Some(conn) => http_run(conn, steps).await?,
            None => embedded_run(engine, steps).await?,
        }
        times.push(start.elapsed());
    }
    times.sort();
    Ok(percentile(&times, 0.5))
}

/// The shapes of the table: 200 instances with 50 in flight, 1000 with 200.
pub const PEER_SHAPES: &[(usize, usize)] = &[(200, 50), (1000, 200)];

/// The `peers` table: single, then each closed-loop `shape` (total, in flight), embedded
/// and over HTTP, alternated `rounds` times; the median of each.
///
/// # Errors
/// When the engine, the server or the database fails.
pub async fn peers(
    dir: &Path,
    s: Settings,
    runs: usize,
    rounds: usize,
    shapes: &[(usize, usize)],
) -> Result<Vec<Row>, BenchError> {
    const STEPS: u32 = 10;
    // The store at hand, to count the writer's group commits.
    let (store, engine) =
        crate::counted_engine_on(&dir.join("peers.db"), s, |b| b.register(NoOp)).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cairn_server::serve(engine.clone(), listener, async move {
        let _ = stopped.await;
    }));
    // Warm up both paths (connections, statements, pages).
    closed_loop(&engine, None, STEPS, 50, 10).await?;
    closed_loop(&engine, Some(port), STEPS, 50, 10).await?;

    // [embedded, HTTP] samples: single first, then one per shape; for each shape also
    // [embedded, HTTP] samples of CPU per instance and of group commits per instance.
    let mut results: Vec<[Vec<f64>; 2]> = vec![Default::default(); shapes.len() + 1];
    let mut cpus: Vec<[Vec<f64>; 2]> = vec![Default::default(); shapes.len()];
    let mut commits: Vec<[Vec<f64>; 2]> = vec![Default::default(); shapes.len()];
    let mut floor = Vec::new();
    let floor_in_flight = shapes.iter().map(|&(_, n)| n).max().unwrap_or(1);
    for round in 0..rounds.max(1) {
        for http in [round % 2 == 1, round % 2 == 0] {
            let port = http.then_some(port);
            let k = usize::from(http);
            results[0][k].push(single(&engine, port, STEPS, runs).await?.as_secs_f64() * 1e3);
            for (i, &(total, in_flight)) in shapes.iter().enumerate() {
                let (cpu, writes) = (cpu_time(), store.writes());
                let rate = closed_loop(&engine, port, STEPS, total, in_flight).await?;
                let cpu = per_step_micros(cpu_since(cpu), total as f64);
                let after = store.writes();
                let made = (after.commits - writes.commits) as f64 / total as f64;
                if std::env::var_os("CAIRN_BENCH_SAMPLES").is_some() {
                    eprintln!(
                        "{total}@{in_flight} http={http}: {rate:.0} inst/s, {cpu:.0} µs CPU and {made:.2} group commits per instance"
                    );
                }
                results[i + 1][k].push(rate);
                cpus[i][k].push(cpu);
                commits[i][k].push(made);
            }
            if let Some(port) = port {
                floor.push(http_floor(port, 20_000, floor_in_flight).await?);
            }
        }
    }
    let _ = stop.send(());
    server.await??;
    engine.shutdown().await;

    let w = format!("peers (10 no-op steps, {rounds} rounds, {})", label(s));
    let (embedded, http) = (median(&results[0][0]), median(&results[0][1]));
    let mut rows = vec![
        Row::new(&w, "single p50, embedded", embedded, "ms"),
        Row::new(&w, "single p50, HTTP (create?wait)", http, "ms"),
        Row::new(&w, "single: HTTP minus embedded", http - embedded, "ms"),
    ];
    for (i, &(total, in_flight)) in shapes.iter().enumerate() {
        let (embedded, http) = (median(&results[i + 1][0]), median(&results[i + 1][1]));
        rows.push(Row::new(
            &w,
            format!("{total}@{in_flight}, embedded"),
            embedded,
            "inst/s",
        ));
        rows.push(Row::new(
            &w,
            format!("{total}@{in_flight}, HTTP"),
            http,
            "inst/s",
        ));
        rows.push(Row::new(
            &w,
            format!("{total}@{in_flight}: HTTP / embedded"),
            http / embedded,
            "×",
        ));
        // The same ratio taken within each round, where both sides ran minutes apart at
        // most: the machine's speed drifts by a third within a sitting, which the medians
        // of each side, taken apart, do not cancel.
        let paired: Vec<f64> = results[i + 1][0]
            .iter()
            .zip(&results[i + 1][1])
            .map(|(embedded, http)| http / embedded)
            .collect();
        rows.push(Row::new(
            &w,
            format!("{total}@{in_flight}: HTTP / embedded, median of each round's ratio"),
            median(&paired),
            "×",
        ));
        for (k, how) in ["embedded", "HTTP"].iter().enumerate() {
            rows.push(Row::new(
                &w,
                format!("{total}@{in_flight}, {how}: CPU per instance (every thread)"),
                median(&cpus[i][k]),
                "µs",
            ));
            rows.push(Row::new(
                &w,
                format!("{total}@{in_flight}, {how}: group commits per instance"),
                median(&commits[i][k]),
                "",
            ));
        }
    }
    rows.push(Row::new(
        &w,
        format!("HTTP floor: GET /healthz on {floor_in_flight} connections, CPU per request"),
        median(&floor),
        "µs",
    ));
    Ok(rows)
}

/// The HTTP floor: `requests` answers of `GET /healthz` on `in_flight` keep-alive
/// connections, closed loop; the process's CPU per request (client and server).
async fn http_floor(port: u16, requests: usize, in_flight: usize) -> Result<f64, BenchError> {
    let mut conns = Vec::with_capacity(in_flight);
    for _ in 0..in_flight {
        conns.push(Conn::open(port).await?);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let cpu = cpu_time();
    let mut workers = tokio::task::JoinSet::new();
    for mut conn in conns {
        let next = Arc::clone(&next);
        workers.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let (status, _) = conn.get("/healthz").await?;
                if status != 200 {
                    return Err(format!("/healthz answered {status}").into());
                }
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(per_step_micros(cpu_since(cpu), requests as f64))
}
