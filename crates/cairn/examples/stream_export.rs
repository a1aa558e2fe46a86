//! Large outputs by stream: an export step writes 5 MB of CSV, far past the 1 MiB output
//! limit, as a stream. The engine stores it in 256 KiB chunks as it is read; the next step
//! reads the stored bytes back chunk by chunk (never the whole export in memory) and
//! "uploads" it, counting rows and bytes. After a replay the stream comes from the store:
//! the export does not run again.
//!
//! Run: `cargo run --example stream_export`

use cairn::prelude::*;
use futures::StreamExt;

/// How the export went: rows and bytes read back from the stored stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uploaded {
    /// Lines read back.
    pub rows: u64,
    /// Bytes read back.
    pub bytes: u64,
}

/// Exports `params` rows of CSV as a stream, then uploads what was stored.
pub struct StreamExport;

impl Workflow for StreamExport {
    const NAME: &'static str = "stream-export";
    type Params = u64;
    type Output = Uploaded;

    async fn run(
        &self,
        event: WorkflowEvent<u64>,
        step: WorkflowStep,
    ) -> Result<Uploaded, WorkflowError> {
        let rows = event.payload;
        // ✅ A large output as a stream: stored in chunks, exempt from the 1 MiB limit.
        let export = step
            .run_stream("export orders", move |_| async move {
                let lines = (0..rows).map(|i| {
                    Ok::<_, std::io::Error>(format!(
                        "{i},order-{i},{}.{:02}\n",
                        i * 7 % 1_000,
                        i % 100
                    ))
                });
                Ok(futures::stream::iter(lines))
            })
            .await?;
        // Reads the stored bytes chunk by chunk: memory holds one 256 KiB chunk at a time.
        let mut stream = export;
        let (mut lines, mut bytes) = (0u64, 0u64);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
            bytes += chunk.len() as u64;
        }
        let uploaded: Uploaded = step
            .run("record the upload", move |_| async move {
                Ok(Uploaded { rows: lines, bytes })
            })
            .await?;
        Ok(uploaded)
    }
}

/// Runs the example; returns the output and the export's size as stored.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(Uploaded, u64), Box<dyn std::error::Error>> {
    let engine = builder.register(StreamExport).start().await?;
    let instance = engine
        .workflow::<StreamExport>()
        .create(CreateOptions::new(200_000).id("export-1"))
        .await?;
    let output = instance.wait().await?.output.ok_or("no output")?;
    let stored = instance.stream_storage().await?;
    println!(
        "uploaded {} rows, {} bytes; {stored} bytes stored in chunks",
        output.rows, output.bytes
    );
    engine.shutdown().await;
    Ok((output, stored))
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(
        Engine::builder()
            .temporary()
            .clock(cairn::Clock::virtual_now()),
    )
    .await?;
    Ok(())
}
