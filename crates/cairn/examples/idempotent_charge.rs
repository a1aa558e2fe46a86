//! Seed "Rules of Workflows": make non-idempotent calls idempotent by checking first.
//!
//! The charge step asks the payment processor whether this month's subscription is
//! already charged before charging. The processor here commits the first charge but its
//! reply is "lost", so the step is retried: the check prevents a double charge.
//!
//! Run: `cargo run --example idempotent_charge`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn::prelude::*;

/// A fake payment processor that commits a charge and then drops the reply once.
#[derive(Default)]
pub struct PaymentProcessor {
    charges: Mutex<HashMap<String, u32>>,
    drop_next_reply: Mutex<bool>,
}

impl PaymentProcessor {
    fn already_charged(&self, key: &str) -> bool {
        self.charges.lock().expect("lock").contains_key(key)
    }

    fn charge(&self, key: &str) -> Result<(), String> {
        *self
            .charges
            .lock()
            .expect("lock")
            .entry(key.to_owned())
            .or_insert(0) += 1;
        let mut drop = self.drop_next_reply.lock().expect("lock");
        if std::mem::take(&mut *drop) {
            return Err("connection reset after the charge was committed".into());
        }
        Ok(())
    }

    /// How many times `key` was charged.
    pub fn times_charged(&self, key: &str) -> u32 {
        self.charges
            .lock()
            .expect("lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// Charges a customer's monthly subscription.
pub struct MonthlyCharge {
    /// The fake payment processor.
    pub processor: Arc<PaymentProcessor>,
}

impl Workflow for MonthlyCharge {
    const NAME: &'static str = "monthly-charge";
    type Params = u64;
    type Output = String;

    async fn run(
        &self,
        event: WorkflowEvent<u64>,
        step: WorkflowStep,
    ) -> Result<String, WorkflowError> {
        let customer_id = event.payload;
        let outcome = step
            .run(
                format!("charge {customer_id} for its monthly subscription"),
                |ctx| {
                    let processor = self.processor.clone();
                    async move {
                        // ✅ Check before the non-idempotent call: it may have committed on an
                        // earlier attempt whose reply never arrived.
                        if processor.already_charged(ctx.idempotency_key()) {
                            return Ok(format!("already charged (attempt {})", ctx.attempt));
                        }
                        processor.charge(ctx.idempotency_key())?;
                        Ok(format!("charged (attempt {})", ctx.attempt))
                    }
                },
            )
            .retries(Retries::constant(3, Duration::from_secs(5)))
            .await?;
        Ok(outcome)
    }
}

/// Runs the example on `builder`, returning the instance output and the charge count.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(String, u32), Box<dyn std::error::Error>> {
    let processor = Arc::new(PaymentProcessor::default());
    *processor.drop_next_reply.lock().expect("lock") = true;
    let engine = builder
        .register(MonthlyCharge {
            processor: processor.clone(),
        })
        .start()
        .await?;
    let instance = engine
        .workflow::<MonthlyCharge>()
        .create(CreateOptions::new(123_456).id("charge-123456"))
        .await?;
    let output = instance.wait().await?.output.unwrap_or_default();
    let details = instance.details().await?;
    let key = format!(
        "monthly-charge/charge-123456/{}/charge 123456 for its monthly subscription/1",
        details.queued.as_millis()
    );
    let charged = processor.times_charged(&key);
    println!("attempts: {}", details.steps[0].attempts.len());
    for a in &details.steps[0].attempts {
        println!(
            "  attempt {}: success={:?} error={:?}",
            a.attempt,
            a.success,
            a.error.as_ref().map(|e| &e.message)
        );
    }
    println!("output: {output}");
    println!("times the customer was charged: {charged}");
    engine.shutdown().await;
    Ok((output, charged))
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The virtual clock makes the 5-second retry delay instant.
    demo(
        Engine::builder()
            .temporary()
            .clock(cairn::Clock::virtual_now()),
    )
    .await?;
    Ok(())
}
