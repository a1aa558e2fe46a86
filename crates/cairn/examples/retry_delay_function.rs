//! Seed "Pauses and retries": a delay function decides the wait after each failure. Rate
//! limits back off by `attempt × 30 seconds`, anything else waits 10 seconds (both fed
//! into the exponential back-off).
//!
//! Run: `cargo run --example retry_delay_function` (on a virtual clock: no real waiting).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cairn::prelude::*;

/// A customer API that rate-limits twice, fails once otherwise, then works.
#[derive(Default)]
pub struct CustomerApi {
    calls: AtomicU32,
}

impl CustomerApi {
    fn sync_customer(&self) -> Result<(), String> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err("429: rate limit exceeded".into()),
            2 => Err("503: upstream unavailable".into()),
            _ => Ok(()),
        }
    }
}

/// Syncs a customer with a dynamic retry delay.
pub struct SyncCustomer {
    /// The flaky API.
    pub api: Arc<CustomerApi>,
}

impl Workflow for SyncCustomer {
    const NAME: &'static str = "sync-customer";
    type Params = ();
    type Output = u32;

    async fn run(&self, _: WorkflowEvent<()>, step: WorkflowStep) -> Result<u32, WorkflowError> {
        step.run("sync customer", |ctx| {
            let api = self.api.clone();
            async move {
                api.sync_customer()?;
                Ok(ctx.attempt)
            }
        })
        .retries(Retries::new(
            5,
            Delay::sync(|d: &DelayContext| {
                if d.error.message.contains("rate limit") {
                    format!("{} seconds", d.ctx.attempt * 30)
                } else {
                    "10 seconds".to_string()
                }
            }),
        ))
        .await
    }
}

/// Runs the example; returns the retry delays in ms.
pub async fn demo(builder: cairn::EngineBuilder) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let engine = builder
        .register(SyncCustomer {
            api: Arc::new(CustomerApi::default()),
        })
        .start()
        .await?;
    let instance = engine
        .workflow::<SyncCustomer>()
        .create(CreateOptions::new(()))
        .await?;
    let attempts = instance.wait().await?.output.unwrap_or_default();
    let details = instance.details().await?;
    let mut delays = Vec::new();
    for a in &details.steps[0].attempts {
        println!(
            "attempt {}: {} {}",
            a.attempt,
            a.error
                .as_ref()
                .map_or("ok".to_string(), |e| e.message.clone()),
            a.retry_delay_ms
                .map_or(String::new(), |ms| format!("→ retry in {} s", ms / 1000)),
        );
        delays.extend(a.retry_delay_ms);
    }
    println!("succeeded on attempt {attempts}");
    engine.shutdown().await;
    Ok(delays)
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
