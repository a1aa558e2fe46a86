//! Seed "Pauses and retries": a `NonRetryableError` stops retries at once, but workflow code
//! can catch it, run a clean-up step and carry on. The failure stays cached: a replay
//! re-raises it without running the step again.
//!
//! Run: `cargo run --example caught_non_retryable`

use cairn::prelude::*;

/// Tolerates one failing task.
pub struct Tolerant;

impl Workflow for Tolerant {
    const NAME: &'static str = "tolerant";
    type Params = ();
    type Output = Vec<String>;

    async fn run(
        &self,
        _: WorkflowEvent<()>,
        step: WorkflowStep,
    ) -> Result<Vec<String>, WorkflowError> {
        let mut log = Vec::new();
        step.run("task", |_| async { Ok(()) }).await?;
        log.push("task done".to_string());
        let attempt = step
            .run("non-retryable-task", |_| async {
                Err::<(), _>(NonRetryableError::new("oh no").into())
            })
            .await;
        if let Err(e) = attempt {
            log.push(format!("Step failed: {}", e.message()));
            step.run("clean-up-task", |_| async { Ok(()) }).await?;
            log.push("cleaned up".to_string());
        }
        // The workflow does not fail and continues.
        step.run("next-task", |_| async { Ok(()) }).await?;
        log.push("next task done".to_string());
        Ok(log)
    }
}

/// Runs the example; returns the workflow's log and its final status.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(Vec<String>, InstanceStatus), Box<dyn std::error::Error>> {
    let engine = builder.register(Tolerant).start().await?;
    let instance = engine
        .workflow::<Tolerant>()
        .create(CreateOptions::new(()))
        .await?;
    let status = instance.wait().await?;
    let log = status.output.clone().unwrap_or_default();
    for line in &log {
        println!("{line}");
    }
    println!("status: {}", status.status);
    engine.shutdown().await;
    Ok((log, status.status))
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
