//! Seed "Rules of Workflows": build state only from step returns. Workflow code outside
//! steps runs again on every replay, so a list filled by side effects would be empty after
//! a restart; a list made of step outputs is rebuilt exactly.
//!
//! The engine is stopped after the two fetches (as a crash or hibernation would) and a new
//! engine on the same database finishes the instance.
//!
//! Run: `cargo run --example state_from_steps`

use std::sync::Arc;

use cairn::prelude::*;
use tokio::sync::Notify;

/// Picks a cat from a list built from two steps.
pub struct PickCat {
    /// Notified when the first lifetime reaches the point where it will be stopped.
    pub stop_here: Option<Arc<Notify>>,
}

impl Workflow for PickCat {
    const NAME: &'static str = "pick-cat";
    type Params = ();
    type Output = String;

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<String, WorkflowError> {
        // ✅ The list is made of step returns: identical in every lifetime.
        let (first, second) = futures::try_join!(
            step.run("get first cutest cat from KV", |_| async {
                Ok("cat-1".to_string())
            }),
            step.run("get second cutest cat from KV", |_| async {
                Ok("cat-2".to_string())
            }),
        )?;
        let image_list = vec![first, second];
        if let Some(stop) = &self.stop_here {
            // The first engine lifetime ends here.
            stop.notify_one();
            std::future::pending::<()>().await;
        }
        let chosen: String = step
            .run("choose a cat from the list and download it", |_| {
                let list = image_list.clone();
                async move { Ok(format!("downloaded {} of {:?}", list[1], list)) }
            })
            .await?;
        Ok(chosen)
    }
}

/// Runs the example on the database at `path`, restarting the engine midway.
pub async fn demo(
    path: &std::path::Path,
    clock: cairn::Clock,
) -> Result<String, Box<dyn std::error::Error>> {
    let stop = Arc::new(Notify::new());
    let first = Engine::builder()
        .sqlite(path)
        .clock(clock.clone())
        .register(PickCat {
            stop_here: Some(stop.clone()),
        })
        .start()
        .await?;
    first
        .workflow::<PickCat>()
        .create(CreateOptions::new(()).id("cats"))
        .await?;
    stop.notified().await;
    first.shutdown().await;
    println!("first engine stopped after both fetches");

    let second = Engine::builder()
        .sqlite(path)
        .clock(clock)
        .register(PickCat { stop_here: None })
        .start()
        .await?;
    let output = second
        .workflow::<PickCat>()
        .get("cats")
        .await?
        .wait()
        .await?
        .output
        .unwrap_or_default();
    println!("second engine replayed the fetches from the journal: {output}");
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
