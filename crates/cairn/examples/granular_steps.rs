//! Seed "Rules of Workflows": make steps granular. Two unrelated calls in two steps
//! retry independently: when the image service fails, the KV read is not repeated.
//!
//! Run: `cargo run --example granular_steps`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cairn::prelude::*;

/// Counts calls to two fake services; the image service fails twice.
#[derive(Default)]
pub struct Services {
    /// Reads from the KV store.
    pub kv_reads: AtomicU32,
    /// Fetches from the image service.
    pub image_fetches: AtomicU32,
}

/// Fetches the cutest cat.
pub struct CatWorkflow {
    /// The fake services.
    pub services: Arc<Services>,
}

impl Workflow for CatWorkflow {
    const NAME: &'static str = "cats";
    type Params = ();
    type Output = String;

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<String, WorkflowError> {
        // ✅ One call per step: each retries on its own, with its own policy.
        let http_cat: String = step
            .run("get cutest cat from KV", |_| {
                let s = self.services.clone();
                async move {
                    s.kv_reads.fetch_add(1, Ordering::SeqCst);
                    Ok("418".to_string())
                }
            })
            .await?;
        let image: String = step
            .run("fetch cat image from http.cat", |_| {
                let (s, code) = (self.services.clone(), http_cat.clone());
                async move {
                    if s.image_fetches.fetch_add(1, Ordering::SeqCst) < 2 {
                        return Err("http.cat is down".into());
                    }
                    Ok(format!("<image of cat {code}>"))
                }
            })
            .retries(Retries::exponential(5, Duration::from_secs(1)))
            .await?;
        Ok(image)
    }
}

/// Runs the example; returns the output and (KV reads, image fetches).
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(String, u32, u32), Box<dyn std::error::Error>> {
    let services = Arc::new(Services::default());
    let engine = builder
        .register(CatWorkflow {
            services: services.clone(),
        })
        .start()
        .await?;
    let instance = engine
        .workflow::<CatWorkflow>()
        .create(CreateOptions::new(()))
        .await?;
    let output = instance.wait().await?.output.unwrap_or_default();
    let (kv, img) = (
        services.kv_reads.load(Ordering::SeqCst),
        services.image_fetches.load(Ordering::SeqCst),
    );
    println!("output: {output}");
    println!("KV reads: {kv} (not repeated), image fetches: {img} (two failures, then success)");
    engine.shutdown().await;
    Ok((output, kv, img))
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
