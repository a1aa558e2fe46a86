//! Seed "Rules of Workflows": name steps deterministically. A step per list entry is fine
//! when the list is a step output traversed in order; a name built from the clock is not
//! (it would never be found in the journal again).
//!
//! Run: `cargo run --example deterministic_names`

use cairn::prelude::*;

/// Fetches every cat of a list, one step per cat.
pub struct CatList;

impl Workflow for CatList {
    const NAME: &'static str = "cat-list";
    type Params = ();
    type Output = Vec<String>;

    async fn run(
        &self,
        _: WorkflowEvent<()>,
        step: WorkflowStep,
    ) -> Result<Vec<String>, WorkflowError> {
        // ✅ A stable name; dynamic values go into the output, not the name.
        let cat_list: Vec<String> = step
            .run("get cat list from KV", |_| async {
                Ok(vec![
                    "tom".to_string(),
                    "felix".to_string(),
                    "garfield".to_string(),
                ])
            })
            .await?;
        let mut cats = Vec::new();
        for cat in &cat_list {
            // ✅ Dynamic names built from a step output, in a stable order.
            let fetched: String = step
                .run(format!("get cat: {cat}"), |ctx| {
                    let cat = cat.clone();
                    async move {
                        Ok(format!(
                            "{cat} (step {:?} #{})",
                            ctx.step.name, ctx.step.count
                        ))
                    }
                })
                .await?;
            cats.push(fetched);
        }
        Ok(cats)
    }
}

/// Runs the example; returns the step names in start order.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let engine = builder.register(CatList).start().await?;
    let instance = engine
        .workflow::<CatList>()
        .create(CreateOptions::new(()))
        .await?;
    for line in instance.wait().await?.output.unwrap_or_default() {
        println!("{line}");
    }
    let names: Vec<String> = instance
        .details()
        .await?
        .steps
        .into_iter()
        .map(|s| s.name)
        .collect();
    println!("steps: {names:?}");
    engine.shutdown().await;
    Ok(names)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
