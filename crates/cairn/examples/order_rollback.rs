//! Seed "Pauses and retries": an order reserves inventory (with a rollback that releases the
//! reservation, under its own retry policy), then the payment processor rejects the charge
//! with a `NonRetryableError`. The instance fails and the reservation is released.
//!
//! Run: `cargo run --example order_rollback`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn::prelude::*;

/// A fake inventory: stock per item and open reservations.
#[derive(Default)]
pub struct Inventory {
    stock: Mutex<HashMap<String, u32>>,
    reservations: Mutex<HashMap<String, String>>,
}

impl Inventory {
    /// An inventory with `n` of `item`.
    pub fn with(item: &str, n: u32) -> Arc<Self> {
        let inventory = Inventory::default();
        inventory.stock.lock().expect("lock").insert(item.into(), n);
        Arc::new(inventory)
    }

    fn reserve(&self, item: &str, id: &str) -> Result<String, String> {
        let mut stock = self.stock.lock().expect("lock");
        let left = stock.get_mut(item).ok_or("unknown item")?;
        if *left == 0 {
            return Err("out of stock".into());
        }
        *left -= 1;
        self.reservations
            .lock()
            .expect("lock")
            .insert(id.into(), item.into());
        Ok(id.to_owned())
    }

    /// Releasing twice is harmless: safe to retry.
    fn release(&self, reservation: &str) {
        if let Some(item) = self.reservations.lock().expect("lock").remove(reservation) {
            *self.stock.lock().expect("lock").entry(item).or_insert(0) += 1;
        }
    }

    /// Units of `item` in stock.
    pub fn stock(&self, item: &str) -> u32 {
        self.stock
            .lock()
            .expect("lock")
            .get(item)
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reservation {
    reservation_id: String,
}

/// Reserve, then charge.
pub struct OrderWorkflow {
    /// The fake inventory.
    pub inventory: Arc<Inventory>,
}

impl Workflow for OrderWorkflow {
    const NAME: &'static str = "order";
    type Params = String;
    type Output = ();

    async fn run(
        &self,
        event: WorkflowEvent<String>,
        step: WorkflowStep,
    ) -> Result<(), WorkflowError> {
        let item = event.payload;
        let inventory = self.inventory.clone();
        step.run("reserve inventory", |ctx| {
            let (inventory, item) = (inventory.clone(), item.clone());
            async move {
                let reservation_id = inventory.reserve(&item, ctx.idempotency_key())?;
                Ok(Reservation { reservation_id })
            }
        })
        .rollback({
            let inventory = inventory.clone();
            move |rb: Rollback<Reservation>| {
                let inventory = inventory.clone();
                async move {
                    if let Some(r) = rb.output {
                        inventory.release(&r.reservation_id);
                    }
                    Ok(())
                }
            }
        })
        .rollback_config(&StepConfig {
            retries: Some(Retries::linear(3, Duration::from_secs(10))),
            timeout: Some(Duration::from_secs(120)),
            ..StepConfig::default()
        })
        .await?;

        step.run("charge card", |_| async {
            Err::<(), _>(NonRetryableError::new("payment processor rejected the charge").into())
        })
        .await?;
        Ok(())
    }
}

/// Runs one order; returns (stock before, stock after, status, error message, rollback outcome).
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(u32, u32, InstanceStatus, String, String), Box<dyn std::error::Error>> {
    let inventory = Inventory::with("book", 3);
    let engine = builder
        .register(OrderWorkflow {
            inventory: inventory.clone(),
        })
        .start()
        .await?;
    let before = inventory.stock("book");
    println!("stock before: {before}");
    let status = engine
        .workflow::<OrderWorkflow>()
        .create(CreateOptions::new("book".to_string()).id("order-1"))
        .await?
        .wait()
        .await?;
    let error = status.error.map(|e| e.to_string()).unwrap_or_default();
    let rollback = status.rollback.map(|r| r.outcome).unwrap_or_default();
    let after = inventory.stock("book");
    println!("order-1: {} ({error}); rollback {rollback}", status.status);
    println!("stock after: {after} (the reservation was released)");
    engine.shutdown().await;
    Ok((before, after, status.status, error, rollback))
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
