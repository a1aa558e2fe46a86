//! Seed "How we built saga rollbacks": a transfer between two banks. Each step declares its
//! own compensation. The notification fails for good, so the instance fails, and the
//! rollbacks run in reverse start order: bank B's credit is debited back, then bank A's
//! debit refunded. Both balances end where they started.
//!
//! Run: `cargo run --example bank_transfer`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn::prelude::*;

/// A fake bank: balances, and idempotency keys already applied.
#[derive(Default)]
pub struct Bank {
    balances: Mutex<HashMap<String, i64>>,
    applied: Mutex<Vec<String>>,
}

impl Bank {
    /// A bank with one account.
    pub fn with(account: &str, balance: i64) -> Arc<Self> {
        let bank = Bank::default();
        bank.balances
            .lock()
            .expect("lock")
            .insert(account.into(), balance);
        Arc::new(bank)
    }

    /// Applies `delta` to `account` once per idempotency `key`.
    fn apply(&self, account: &str, delta: i64, key: &str) -> String {
        let mut applied = self.applied.lock().expect("lock");
        if !applied.iter().any(|k| k == key) {
            applied.push(key.to_owned());
            *self
                .balances
                .lock()
                .expect("lock")
                .entry(account.into())
                .or_insert(0) += delta;
        }
        format!("tx-{key}")
    }

    /// An account's balance.
    pub fn balance(&self, account: &str) -> i64 {
        self.balances
            .lock()
            .expect("lock")
            .get(account)
            .copied()
            .unwrap_or(0)
    }
}

/// What to transfer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Transfer {
    /// Account at bank A.
    pub from: String,
    /// Account at bank B.
    pub to: String,
    /// Amount in cents.
    pub amount: i64,
    /// Make the notification fail (to show the rollback).
    pub fail_notify: bool,
}

/// Debit A, credit B, notify both.
pub struct BankTransfer {
    /// Bank A.
    pub bank_a: Arc<Bank>,
    /// Bank B.
    pub bank_b: Arc<Bank>,
}

impl Workflow for BankTransfer {
    const NAME: &'static str = "bank-transfer";
    type Params = Transfer;
    type Output = String;

    async fn run(
        &self,
        event: WorkflowEvent<Transfer>,
        step: WorkflowStep,
    ) -> Result<String, WorkflowError> {
        let t = event.payload;
        let (a, b) = (self.bank_a.clone(), self.bank_b.clone());
        let (from, to, amount) = (t.from.clone(), t.to.clone(), t.amount);

        let debit: String = step
            .run("debit-bank-a", |ctx| {
                let (a, from) = (a.clone(), from.clone());
                async move { Ok(a.apply(&from, -amount, ctx.idempotency_key())) }
            })
            .rollback({
                let (a, from) = (a.clone(), from.clone());
                move |rb: Rollback<String>| {
                    let (a, from) = (a.clone(), from.clone());
                    async move {
                        // Refund the debit: its own idempotency key, safe to retry.
                        a.apply(
                            &from,
                            amount,
                            &format!("{}:rollback", rb.ctx.idempotency_key()),
                        );
                        Ok(())
                    }
                }
            })
            .await?;

        let credit: String = step
            .run("credit-bank-b", |ctx| {
                let (b, to) = (b.clone(), to.clone());
                async move { Ok(b.apply(&to, amount, ctx.idempotency_key())) }
            })
            .rollback({
                let (b, to) = (b.clone(), to.clone());
                move |rb: Rollback<String>| {
                    let (b, to) = (b.clone(), to.clone());
                    async move {
                        if rb.output.is_none() {
                            return Ok(()); // never credited: nothing to undo
                        }
                        b.apply(
                            &to,
                            -amount,
                            &format!("{}:rollback", rb.ctx.idempotency_key()),
                        );
                        Ok(())
                    }
                }
            })
            .await?;

        step.run("notify", |_| async move {
            if t.fail_notify {
                Err(NonRetryableError::new("mail server rejected the message").into())
            } else {
                Ok(())
            }
        })
        .await?;
        Ok(format!("{debit}, {credit}"))
    }
}

/// Runs a transfer that succeeds and one whose notification fails; returns the balances
/// after each (A's account, B's account) and the failed instance's rollback outcome.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<(Vec<(i64, i64)>, String), Box<dyn std::error::Error>> {
    let (bank_a, bank_b) = (Bank::with("alice", 10_000), Bank::with("bob", 0));
    let engine = builder
        .register(BankTransfer {
            bank_a: bank_a.clone(),
            bank_b: bank_b.clone(),
        })
        .start()
        .await?;
    let client = engine.workflow::<BankTransfer>();
    let mut balances = Vec::new();
    let mut outcome = String::new();
    for (id, fail_notify) in [("transfer-ok", false), ("transfer-fails", true)] {
        let params = Transfer {
            from: "alice".into(),
            to: "bob".into(),
            amount: 2_500,
            fail_notify,
        };
        let status = client
            .create(CreateOptions::new(params).id(id))
            .await?
            .wait()
            .await?;
        println!(
            "{id}: {} {:?}",
            status.status,
            status.error.map(|e| e.message)
        );
        if let Some(rollback) = status.rollback {
            println!("  rollback {}", rollback.outcome);
            outcome = rollback.outcome;
        }
        let now = (bank_a.balance("alice"), bank_b.balance("bob"));
        println!("  alice at bank A: {}, bob at bank B: {}", now.0, now.1);
        balances.push(now);
    }
    engine.shutdown().await;
    Ok((balances, outcome))
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(Engine::builder().temporary()).await?;
    Ok(())
}
