//! Seed "Rules of Workflows": build state from step returns, then sleep three hours. The
//! engine hibernates the instance through the sleep (its future is dropped; it costs a row,
//! not memory) and, when the timer fires, replays it: the list comes back from the journal.
//!
//! Run: `cargo run --example sleepy_cats` (on a virtual clock: the three hours take no time).

use cairn::prelude::*;

/// Picks one of two cats after a nap.
pub struct SleepyCats;

impl Workflow for SleepyCats {
    const NAME: &'static str = "sleepy-cats";
    type Params = ();
    type Output = String;

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<String, WorkflowError> {
        // ✅ State made only of step returns: identical in every engine lifetime.
        let (first, second) = futures::try_join!(
            step.run("get first cutest cat from KV", |_| async {
                Ok("cat-1".to_string())
            }),
            step.run("get second cutest cat from KV", |_| async {
                Ok("cat-2".to_string())
            }),
        )?;
        let image_list = [first, second];

        // A long sleep hibernates the instance: the first lifetime ends here.
        step.sleep("💤💤💤💤", "3 hours").await?;

        // The second lifetime: `image_list` was rebuilt from the journal.
        step.run("choose a random cat from the list and download it", |ctx| {
            let list = image_list.clone();
            async move {
                // The choice is made inside a step, so it is recorded once.
                let i = ctx.idempotency_key().len() % list.len();
                Ok(format!("downloaded {} from {list:?}", list[i]))
            }
        })
        .await
    }
}

/// Runs the example; returns (status while sleeping, instances in memory then, output).
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(InstanceStatus, usize, String), Box<dyn std::error::Error>> {
    let engine = builder.register(SleepyCats).start().await?;
    let instance = engine
        .workflow::<SleepyCats>()
        .create(CreateOptions::new(()))
        .await?;
    let sleeping = instance
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await?
        .status;
    // The hibernation is committed (so the status reads `waiting`) just before the run
    // leaves memory: give it that moment.
    let started = std::time::Instant::now();
    while engine.live_instances() > 0 && started.elapsed() < std::time::Duration::from_secs(30) {
        tokio::task::yield_now().await;
    }
    let in_memory = engine.live_instances();
    println!("during the nap: status {sleeping}, instances in memory: {in_memory}");
    let started = engine.clock().now();
    let output = instance.wait().await?.output.unwrap_or_default();
    println!(
        "woke after {:?} of (virtual) time: {output}",
        engine.clock().now().since(started)
    );
    engine.shutdown().await;
    Ok((sleeping, in_memory, output))
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
