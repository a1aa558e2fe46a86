//! Demo workflows `cairn serve` registers, each a scenario of the original documents.

use cairn::prelude::*;

/// Greets someone in two steps.
pub(crate) struct Greet;

impl Workflow for Greet {
    const NAME: &'static str = "greet";
    type Params = serde_json::Value;
    type Output = String;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<String, WorkflowError> {
        let name = event.payload["name"].as_str().unwrap_or("world").to_owned();
        let greeting: String = step
            .run("compose greeting", |_| {
                let name = name.clone();
                async move { Ok(format!("Hello, {name}!")) }
            })
            .await?;
        step.run("deliver greeting", |_| {
            let g = greeting.clone();
            async move { Ok(g.len()) }
        })
        .await?;
        Ok(greeting)
    }
}

/// Waits (hibernated) for an `approved` event for up to a day.
pub(crate) struct Approval;

impl Workflow for Approval {
    const NAME: &'static str = "approval";
    type Params = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<serde_json::Value, WorkflowError> {
        step.run("notify approver", |_| async { Ok(()) }).await?;
        let answer = step
            .wait_for_event::<serde_json::Value>("wait for approval", "approved")
            .timeout("1 day")
            .await?;
        Ok(serde_json::json!({ "request": event.payload, "approval": answer.payload }))
    }
}

/// Sleeps, then finishes: watch it go `waiting` and come back.
pub(crate) struct Nap;

impl Workflow for Nap {
    const NAME: &'static str = "nap";
    type Params = serde_json::Value;
    type Output = ();

    async fn run(
        &self,
        _: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<(), WorkflowError> {
        step.sleep("nap", "30 seconds").await?;
        step.run("wake up", |_| async { Ok(()) }).await
    }
}

pub(crate) fn register(builder: cairn::EngineBuilder) -> cairn::EngineBuilder {
    builder.register(Greet).register(Approval).register(Nap)
}
