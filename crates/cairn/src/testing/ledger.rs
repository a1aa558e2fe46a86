//! The side effects workflow code records itself, in the user's world: what the simulator
//! checks step bodies against without relying on the engine's own account of them.

use std::sync::{Arc, Mutex};

use crate::context::StepContext;

/// A record of step bodies kept by the workflow code itself: each body calls
/// [`Ledger::record`] with the [`StepContext`] it received, as it would write to a bank or
/// send an email. Cheap to clone; every clone shares one record.
///
/// A [`Simulation`](crate::testing::Simulation) given the ledger
/// ([`Simulation::ledger`](crate::testing::Simulation::ledger)) checks, from the ledger
/// and the journal alone, that no step body ran twice for the same attempt and that none ran
/// after its step ended (no attempt above the journal's last). Those checks hold whatever
/// the engine reports, so they also catch a body that the engine runs where it does not
/// count it (outside its attempt loop, on a replay).
///
/// ```no_run
/// # use cairn::prelude::*;
/// use cairn::testing::{Ledger, Simulation};
///
/// struct Charge {
///     ledger: Ledger,
/// }
///
/// impl Workflow for Charge {
///     const NAME: &'static str = "charge";
///     type Params = u64;
///     type Output = u64;
///     async fn run(&self, e: WorkflowEvent<u64>, step: WorkflowStep) -> Result<u64, WorkflowError> {
///         let ledger = self.ledger.clone();
///         step.run("charge card", move |ctx| {
///             let ledger = ledger.clone();
///             async move {
///                 ledger.record(&ctx); // beside the real side effect
///                 Ok(e.payload)
///             }
///         })
///         .await
///     }
/// }
///
/// # async fn t() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = Ledger::new();
/// let for_engines = ledger.clone();
/// Simulation::new::<Charge>(4200)?
///     .register(move |b| b.register(Charge { ledger: for_engines.clone() }))
///     .ledger(&ledger)
///     .run()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<LedgerEntry>>>);

/// One step body run, as a [`Ledger`] recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerEntry {
    /// The step's idempotency key (`<workflow>/<instance>/<created>/<name>/<count>`): it
    /// names the instance the body ran for.
    pub key: String,
    /// The step's name.
    pub name: String,
    /// Which step of that name (1-based).
    pub count: u32,
    /// The attempt the body ran for.
    pub attempt: u32,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Records that the body of `ctx`'s step runs for `ctx`'s attempt. Call it once per
    /// call of the body, inside it.
    pub fn record(&self, ctx: &StepContext) {
        self.lock().push(LedgerEntry {
            key: ctx.idempotency_key().to_owned(),
            name: ctx.step.name.clone(),
            count: ctx.step.count,
            attempt: ctx.attempt,
        });
    }

    /// Every body run recorded so far, in order.
    pub fn entries(&self) -> Vec<LedgerEntry> {
        self.lock().clone()
    }

    /// Empties the ledger and returns what it held: the simulator starts each run afresh.
    pub(crate) fn take(&self) -> Vec<LedgerEntry> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LedgerEntry>> {
        // A panic while holding the lock leaves a whole entry or none.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
