//! Seed "Rules of Workflows": base conditions on deterministic values: step outputs and the
//! event payload. A random decision is made inside a step, so every replay takes the same
//! branch.
//!
//! Run: `cargo run --example conditional_steps`

use cairn::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
/// The instance params.
pub struct Params {
    /// `premium` or anything else.
    pub user_type: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FeatureFlags {
    enable_email_notifications: bool,
}

/// Runs steps depending on config, payload and a recorded random decision.
pub struct Conditional;

impl Workflow for Conditional {
    const NAME: &'static str = "conditional";
    type Params = Params;
    type Output = Vec<String>;

    async fn run(
        &self,
        event: WorkflowEvent<Params>,
        step: WorkflowStep,
    ) -> Result<Vec<String>, WorkflowError> {
        let mut ran = Vec::new();
        let config: FeatureFlags = step
            .run("fetch config", |_| async {
                Ok(FeatureFlags {
                    enable_email_notifications: true,
                })
            })
            .await?;
        // ✅ Condition on a step output.
        if config.enable_email_notifications {
            step.run("send email", |_| async { Ok(()) }).await?;
            ran.push("send email".to_string());
        }
        // ✅ Condition on the event payload.
        if event.payload.user_type == "premium" {
            step.run("premium processing", |_| async { Ok(()) }).await?;
            ran.push("premium processing".to_string());
        }
        // ✅ A non-deterministic value, wrapped in a step: decided once, replayed forever.
        let should_process: bool = step
            .run("decide randomly", |_| async {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .subsec_nanos();
                Ok(nanos % 2 == 0)
            })
            .await?;
        if should_process {
            step.run("conditionally do something", |_| async { Ok(()) })
                .await?;
            ran.push("conditionally do something".to_string());
        }
        Ok(ran)
    }
}

/// Runs the example for a premium and a free user.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<Vec<Vec<String>>, Box<dyn std::error::Error>> {
    let engine = builder.register(Conditional).start().await?;
    let mut outputs = Vec::new();
    for user_type in ["premium", "free"] {
        let instance = engine
            .workflow::<Conditional>()
            .create(CreateOptions::new(Params {
                user_type: user_type.into(),
            }))
            .await?;
        let ran = instance.wait().await?.output.unwrap_or_default();
        println!("{user_type} user ran: {ran:?}");
        outputs.push(ran);
    }
    engine.shutdown().await;
    Ok(outputs)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
