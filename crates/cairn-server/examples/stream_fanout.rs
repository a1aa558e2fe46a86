//! How open live streams weigh on the engine: completes instances of a one-step workflow
//! while N idle SSE streams (per instance, on waiting instances; or per workflow) are open
//! on a real loopback server, and prints instances completed per second.
//!
//! `cargo run --release -p cairn-engine-server --example stream_fanout -- [streams] [instance|workflow|other-workflow]`

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use cairn::prelude::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Quick;

impl Workflow for Quick {
    const NAME: &'static str = "quick";
    type Params = Value;
    type Output = Value;

    async fn run(
        &self,
        _: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> Result<Value, WorkflowError> {
        let n: u32 = step.run("one", |_| async { Ok(1) }).await?;
        Ok(json!(n))
    }
}

struct Idle;

impl Workflow for Idle {
    const NAME: &'static str = "idle";
    type Params = Value;
    type Output = Value;

    async fn run(
        &self,
        _: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> Result<Value, WorkflowError> {
        let e: StepEvent<Value> = step.wait_for_event("never", "never").await?;
        Ok(e.payload)
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let streams: usize = args.next().map(|a| a.parse().unwrap()).unwrap_or(200);
    let kind = args.next().unwrap_or_else(|| "instance".into());
    let dir = tempfile::tempdir().unwrap();
    let engine = cairn::Engine::builder()
        .sqlite(dir.path().join("cairn.db"))
        .register(Quick)
        .register(Idle)
        .start()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = cairn_server::router(engine.clone());
    tokio::spawn(cairn_server::serve_router(
        listener,
        router,
        std::future::pending(),
    ));
    let idle = engine.workflow::<Idle>();
    let mut sockets = Vec::new();
    for i in 0..streams {
        let path = if kind == "workflow" {
            // Streams of the busy workflow: each must deliver every record.
            "/api/workflows/quick/stream".to_owned()
        } else if kind == "other-workflow" {
            // Streams of another, idle workflow: nothing for them to do.
            "/api/workflows/idle/stream".to_owned()
        } else {
            let id = format!("idle-{i}");
            idle.create(cairn::CreateOptions::new(json!({})).id(id.clone()))
                .await
                .unwrap();
            format!("/api/workflows/idle/instances/{id}/stream")
        };
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        socket
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        sockets.push(socket);
    }
    // Drain what the streams send so their buffers never fill.
    for mut socket in sockets {
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            while socket.read(&mut buf).await.map(|n| n > 0).unwrap_or(false) {}
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let quick = engine.workflow::<Quick>();
    let n = 2_000;
    let started = Instant::now();
    let mut handles = Vec::new();
    for chunk in 0..(n / 100) {
        let batch: Vec<_> = (0..100)
            .map(|i| cairn::CreateOptions::new(json!({})).id(format!("q-{chunk}-{i}")))
            .collect();
        handles.extend(quick.create_batch(batch).await.unwrap());
    }
    for h in handles {
        h.wait().await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{streams} idle {kind} streams: {n} instances in {secs:.2} s = {:.0} instances/s",
        n as f64 / secs
    );
    std::process::exit(0);
}
