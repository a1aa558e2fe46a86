//! Seed "Rules of Workflows": wrap a race in one step. A race between two steps would cache
//! both and a replay could pick the other winner; racing plain futures inside a single step
//! caches the winner once, and every replay (here: after an engine restart) sees the same.
//!
//! Run: `cargo run --example race_in_one_step`

use std::sync::Arc;

use cairn::prelude::*;
use tokio::sync::Notify;

/// Races two lookups inside one step.
pub struct Race {
    /// Notified (and the run stopped) after the race, to show a replay.
    pub stop_after_race: Option<Arc<Notify>>,
}

impl Workflow for Race {
    const NAME: &'static str = "race";
    type Params = ();
    type Output = String;

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<String, WorkflowError> {
        // ✅ The race is inside one step: its winner is what gets cached.
        let winner: String = step
            .run("race step", |_| async {
                let first = async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "first".to_string()
                };
                let second = async { "second".to_string() };
                tokio::select! {
                    w = first => Ok(w),
                    w = second => Ok(w),
                }
            })
            .await?;
        if let Some(stop) = &self.stop_after_race {
            stop.notify_one();
            std::future::pending::<()>().await;
        }
        let result: String = step
            .run("another step", |_| {
                let w = winner.clone();
                async move { Ok(format!("the race was won by {w}")) }
            })
            .await?;
        Ok(result)
    }
}

/// Runs the example on the database at `path`, restarting the engine after the race.
pub async fn demo(
    path: &std::path::Path,
    clock: cairn::Clock,
) -> Result<String, Box<dyn std::error::Error>> {
    let stop = Arc::new(Notify::new());
    let first = Engine::builder()
        .sqlite(path)
        .clock(clock.clone())
        .register(Race {
            stop_after_race: Some(stop.clone()),
        })
        .start()
        .await?;
    first
        .workflow::<Race>()
        .create(CreateOptions::new(()).id("race-1"))
        .await?;
    stop.notified().await;
    first.shutdown().await;
    let second = Engine::builder()
        .sqlite(path)
        .clock(clock)
        .register(Race {
            stop_after_race: None,
        })
        .start()
        .await?;
    let output = second
        .workflow::<Race>()
        .get("race-1")
        .await?
        .wait()
        .await?
        .output
        .unwrap_or_default();
    println!("{output}");
    second.shutdown().await;
    Ok(output)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    demo(&dir.path().join("cairn.db"), cairn::Clock::system()).await?;
    Ok(())
}
