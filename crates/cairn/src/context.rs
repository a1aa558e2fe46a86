//! What a step body sees: [`StepContext`] with the step's [`StepId`], attempt and config.

use std::sync::{Arc, OnceLock};

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
    /// The instance's part of the idempotency key (`Lifetime::idempotency_prefix`).
    pub(crate) instance_key: Arc<str>,
    /// The whole key, made when first asked for (most bodies never ask).
    pub(crate) idempotency_key: OnceLock<String>,
}

impl StepContext {
    pub(crate) fn new(
        step: StepId,
        attempt: u32,
        config: ResolvedConfig,
        instance_key: Arc<str>,
    ) -> Self {
        StepContext {
            step,
            attempt,
            config,
            instance_key,
            idempotency_key: OnceLock::new(),
        }
    }

    /// A key that is the same for every attempt and every replay of this step of this
    /// instance, and differs for every other step and instance: pass it to external APIs
    /// so an effect repeated by a retry happens once.
    pub fn idempotency_key(&self) -> &str {
        self.idempotency_key.get_or_init(|| {
            format!(
                "{}/{}/{}",
                self.instance_key, self.step.name, self.step.count
            )
        })
    }
}
