//! Seed "How we built saga rollbacks", the "before" version: the same transfer with the
//! compensation written by hand in a catch block. It must track what completed, undo it in
//! reverse, keep going when an undo fails, and re-raise. Compare with `bank_transfer.rs`,
//! where each step carries its own rollback.
//!
//! Run: `cargo run --example bank_transfer_before_rollback`

use std::sync::{Arc, Mutex};

use cairn::prelude::*;

/// A tiny bank: one balance per side, for the comparison.
#[derive(Default)]
pub struct Ledger {
    /// (bank A balance, bank B balance).
    pub balances: Mutex<(i64, i64)>,
}

/// Debit, credit, notify — with a hand-written catch block.
pub struct ManualTransfer {
    /// The ledger.
    pub ledger: Arc<Ledger>,
}

impl Workflow for ManualTransfer {
    const NAME: &'static str = "manual-transfer";
    type Params = i64;
    type Output = ();

    async fn run(
        &self,
        event: WorkflowEvent<i64>,
        step: WorkflowStep,
    ) -> Result<(), WorkflowError> {
        let amount = event.payload;
        let ledger = &self.ledger;
        // Track what completed, to know what to undo.
        let mut debit_a = None;
        let mut credit_b = None;
        let attempt: Result<(), WorkflowError> = async {
            debit_a = Some(
                step.run("debit-bank-a", |_| async {
                    ledger.balances.lock().expect("lock").0 -= amount;
                    Ok(())
                })
                .await?,
            );
            credit_b = Some(
                step.run("credit-bank-b", |_| async {
                    ledger.balances.lock().expect("lock").1 += amount;
                    Ok(())
                })
                .await?,
            );
            step.run("notify", |_| async {
                Err::<(), _>(NonRetryableError::new("mail server rejected the message").into())
            })
            .await
        }
        .await;
        if let Err(error) = attempt {
            // Unwind in reverse. Each undo is its own durable step and must keep going if one fails.
            if credit_b.is_some() {
                let undo = step
                    .run("reverse-credit-b", |_| async {
                        ledger.balances.lock().expect("lock").1 -= amount;
                        Ok(())
                    })
                    .await;
                if let Err(e) = undo {
                    eprintln!("reverse-credit-b failed: {e}");
                }
            }
            if debit_a.is_some() {
                let undo = step
                    .run("refund-debit-a", |_| async {
                        ledger.balances.lock().expect("lock").0 += amount;
                        Ok(())
                    })
                    .await;
                if let Err(e) = undo {
                    eprintln!("refund-debit-a failed: {e}");
                }
            }
            return Err(error);
        }
        Ok(())
    }
}

/// Runs the transfer; returns the balances after it failed and was undone.
pub async fn demo(builder: cairn::EngineBuilder) -> Result<(i64, i64), Box<dyn std::error::Error>> {
    let ledger = Arc::new(Ledger {
        balances: Mutex::new((10_000, 0)),
    });
    let engine = builder
        .register(ManualTransfer {
            ledger: ledger.clone(),
        })
        .start()
        .await?;
    let status = engine
        .workflow::<ManualTransfer>()
        .create(CreateOptions::new(2_500))
        .await?
        .wait()
        .await?;
    let balances = *ledger.balances.lock().expect("lock");
    println!(
        "{}: balances after the hand-written undo: A {}, B {}",
        status.status, balances.0, balances.1
    );
    engine.shutdown().await;
    Ok(balances)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
