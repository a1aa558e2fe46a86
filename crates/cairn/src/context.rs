//! What a step body sees: [`StepContext`] with the step's [`StepId`], attempt and config.

use cairn_core::ResolvedConfig;
use serde::Serialize;

/// A step's name and its occurrence count in this run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepId {
    /// The name given to the op.
    pub name: String,
    /// 1-based occurrence of `name` among ops of the same kind in this run.
    pub count: u32,
}

/// What a step body receives on each attempt.
#[derive(Debug, Clone)]
pub struct StepContext {
    /// The step's name and count.
    pub step: StepId,
    /// 1 on the first attempt, 2 on the first retry, …
    pub attempt: u32,
    /// The resolved config, defaults merged in. A fresh copy per attempt: changing it
    /// changes nothing.
    pub config: ResolvedConfig,
    /// Made with the context, from the step it was made for: a body that changes its copy
    /// of `step` does not change its key.
    idempotency_key: String,
}

impl StepContext {
    /// `instance_key` is the instance's part of the key (`Lifetime::idempotency_prefix`).
    pub(crate) fn new(
        step: StepId,
        attempt: u32,
        config: ResolvedConfig,
        instance_key: &str,
    ) -> Self {
        use std::fmt::Write;
        // One allocation, sized to fit (a count has at most 10 digits).
        let mut idempotency_key = String::with_capacity(instance_key.len() + step.name.len() + 12);
        let _ = write!(
            idempotency_key,
            "{instance_key}/{}/{}",
            step.name, step.count
        );
        StepContext {
            step,
            attempt,
            config,
            idempotency_key,
        }
    }

    /// A key that is the same for every attempt and every replay of this step of this
    /// instance, and differs for every other step and instance: pass it to external APIs
    /// so an effect repeated by a retry happens once.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key is the step's the context was made for, whatever a body does to its copy.
    #[test]
    fn the_idempotency_key_is_the_steps_even_if_the_body_changes_its_context() {
        let step = StepId {
            name: "charge".into(),
            count: 12,
        };
        let mut ctx = StepContext::new(step, 1, ResolvedConfig::default(), "orders/o-1/1700");
        ctx.step.name = "refund".into();
        ctx.step.count = 1;
        assert_eq!(ctx.clone().idempotency_key(), "orders/o-1/1700/charge/12");
    }
}
