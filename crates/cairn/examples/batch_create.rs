//! Seed "Rules of Workflows": batch instance creation with `create_batch`. It is idempotent:
//! ids that already exist are skipped and left out of the result. Ids are unique per
//! workflow: a transaction or order id, or a composite `user-<random>` id, not a bare user id.
//!
//! Run: `cargo run --example batch_create`

use cairn::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
/// A user to welcome.
pub struct User {
    /// Their name.
    pub name: String,
}

/// Greets a user.
pub struct Welcome;

impl Workflow for Welcome {
    const NAME: &'static str = "welcome";
    type Params = User;
    type Output = String;

    async fn run(
        &self,
        event: WorkflowEvent<User>,
        step: WorkflowStep,
    ) -> Result<String, WorkflowError> {
        let name = event.payload.name;
        step.run("greet", |_| {
            let name = name.clone();
            async move { Ok(format!("Welcome, {name}!")) }
        })
        .await
    }
}

/// Creates four instances in one call, then again (all skipped); returns both results' ids.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(Vec<String>, Vec<String>), Box<dyn std::error::Error>> {
    let engine = builder.register(Welcome).start().await?;
    let users = [
        ("user1", "John"),
        ("user2", "Jane"),
        ("user3", "Alice"),
        ("user4", "Bob"),
    ];
    let batch = || {
        users
            .iter()
            .map(|(id, name)| {
                CreateOptions::new(User {
                    name: (*name).into(),
                })
                .id(*id)
            })
            .collect()
    };
    let client = engine.workflow::<Welcome>();
    let created = client.create_batch(batch()).await?;
    for instance in &created {
        println!(
            "{}: {}",
            instance.id(),
            instance.wait().await?.output.unwrap_or_default()
        );
    }
    let again = client.create_batch(batch()).await?;
    println!(
        "the same batch again created {} instances (existing ids are skipped)",
        again.len()
    );
    let ids = |v: &[cairn::Instance<String>]| v.iter().map(|i| i.id().to_string()).collect();
    let result = (ids(&created), ids(&again));
    engine.shutdown().await;
    Ok(result)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
