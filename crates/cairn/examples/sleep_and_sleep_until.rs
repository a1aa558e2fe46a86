//! Seed "Pauses and retries": `step.sleep` for a duration (a `Duration` or a string such as
//! `"1 hour"`) and `step.sleep_until` a point in time, here the seed's Workflows launch
//! date, 24 Oct 2024 13:00 UTC. The virtual clock starts the morning of that day.
//!
//! Run: `cargo run --example sleep_and_sleep_until`

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn::Timestamp;
use cairn::prelude::*;

/// 24 Oct 2024 13:00:00 UTC.
pub fn launch() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_729_774_800_000)
}

/// Sleeps, then sleeps until the launch.
pub struct Launch;

impl Workflow for Launch {
    const NAME: &'static str = "launch";
    type Params = ();
    type Output = ();

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<(), WorkflowError> {
        step.sleep("sleep for a bit", "1 hour").await?;
        step.sleep_until("sleep until X times out", launch())
            .await?;
        Ok(())
    }
}

/// Runs the example from 10:00 UTC on launch day; returns when each sleep ended.
pub async fn demo(path: &std::path::Path) -> Result<Vec<Timestamp>, Box<dyn std::error::Error>> {
    let start =
        Timestamp::from_millis(Timestamp::from_system_time(launch()).as_millis() - 3 * 3_600_000);
    let engine = Engine::builder()
        .sqlite(path)
        .clock(cairn::Clock::virtual_at(start))
        .register(Launch)
        .start()
        .await?;
    println!("now: {}", engine.clock().now());
    let instance = engine
        .workflow::<Launch>()
        .create(CreateOptions::new(()))
        .await?;
    instance.wait().await?;
    let mut ends = Vec::new();
    for record in instance.log(0).await? {
        if record.entry.kind == cairn::LogKind::SleepComplete {
            let step = record.entry.step.map(|k| k.name).unwrap_or_default();
            println!("{step:?} ended at {}", record.entry.at);
            ends.push(record.entry.at);
        }
    }
    engine.shutdown().await;
    Ok(ends)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    demo(&dir.path().join("cairn.db")).await?;
    Ok(())
}
