//! `streams`: one instance streams a large output (500 MiB by default) through a stream
//! step, then a second run of the instance reads it back from the store; the process's peak
//! resident memory shows neither needs the stream in memory. The raw bound: the same
//! chunks written to a file, one `fsync` each (the engine commits each chunk).

use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use cairn::prelude::*;
use futures::StreamExt;

use crate::{BenchError, Row, Settings, engine_on, label, mib, resident_bytes};

/// Streams `params` MiB in 1 MiB items, waits for a `go` event (hibernated: a new engine
/// replays it), then reads the stored stream back and returns how many bytes it read.
struct Export;

impl Workflow for Export {
    const NAME: &'static str = "export";
    type Params = u64;
    type Output = u64;

    async fn run(
        &self,
        event: WorkflowEvent<u64>,
        step: WorkflowStep,
    ) -> Result<u64, WorkflowError> {
        let mib = event.payload;
        let stream = step
            .run_stream("export", move |_| async move {
                Ok(futures::stream::iter(0..mib)
                    .map(|i| Ok::<_, std::io::Error>(vec![(i % 251) as u8; 1 << 20])))
            })
            .timeout(Duration::from_secs(3_600))
            .await?;
        let _: StepEvent<serde_json::Value> = step.wait_for_event("hand over", "go").await?;
        let mut read = 0u64;
        let mut stream = stream;
        while let Some(chunk) = stream.next().await {
            read += chunk?.len() as u64;
        }
        Ok(read)
    }
}

/// Peak resident memory of this process in bytes (`VmHWM`), if known.
fn peak_resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The stream workload's rows.
///
/// # Errors
/// When the engine or the database fails.
pub async fn streams(dir: &Path, s: Settings, mib_total: u64) -> Result<Vec<Row>, BenchError> {
    let raw = raw_chunk_writes(&dir.join("raw-chunks"), mib_total)?;
    let before = resident_bytes();
    let engine = engine_on(&dir.join("streams.db"), s, |b| {
        b.register(Export).stream_storage_limit(u64::MAX)
    })
    .await?;
    let start = Instant::now();
    let instance = engine
        .workflow::<Export>()
        .create(CreateOptions::new(mib_total).id("export"))
        .await?;
    instance
        .wait_for(|st| st.status == InstanceStatus::Waiting || st.status.is_terminal())
        .await?;
    let written = start.elapsed().as_secs_f64();
    let after_write = peak_resident();
    engine.shutdown().await;
    // A new engine replays the instance and reads the stream back from the store.
    let engine = engine_on(&dir.join("streams.db"), s, |b| {
        b.register(Export).stream_storage_limit(u64::MAX)
    })
    .await?;
    let start = Instant::now();
    let instance = engine.workflow::<Export>().get("export").await?;
    instance.send_event("go", &serde_json::json!({})).await?;
    let status = instance.wait().await?;
    let read_back = start.elapsed().as_secs_f64();
    let peak = peak_resident();
    engine.shutdown().await;
    let bytes = mib_total * (1 << 20);
    if status.output != Some(bytes) {
        return Err(BenchError::from(format!(
            "the stream read back {:?} bytes, not {bytes}",
            status.output
        )));
    }
    let w = format!("streams ({mib_total} MiB, {})", label(s));
    let mb = mib_total as f64;
    Ok(vec![
        Row::new(&w, "write: MiB/s", mb / written, "MiB/s").ratio((mb / written) / raw),
        Row::new(&w, "replay and read back: MiB/s", mb / read_back, "MiB/s"),
        Row::new(&w, "resident memory before", mib(before), "MiB"),
        Row::new(
            &w,
            "peak resident memory after the write",
            mib(after_write),
            "MiB",
        ),
        Row::new(&w, "peak resident memory after the read", mib(peak), "MiB"),
    ])
}

/// MiB/s of `mib` MiB written to a file in 256 KiB chunks, one `fsync` each.
fn raw_chunk_writes(path: &Path, mib: u64) -> Result<f64, BenchError> {
    let mut file = std::fs::File::create(path)?;
    let chunk = vec![7u8; cairn::STREAM_CHUNK];
    let chunks = mib * (1 << 20) / cairn::STREAM_CHUNK as u64;
    let start = Instant::now();
    for _ in 0..chunks {
        file.write_all(&chunk).and_then(|()| file.sync_data())?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok(mib as f64 / elapsed)
}
