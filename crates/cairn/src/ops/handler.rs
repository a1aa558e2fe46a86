//! Rollback handlers: what `.rollback(handler)` on a step registers, erased to run on the
//! step's stored output, and the per-lifetime registry the rollback reads them from.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use cairn_core::{ErrorInfo, StepKey};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;

use crate::config::StepConfig;
use crate::context::StepContext;
use crate::failure::StepError;

/// The rollback handlers the ops of one lifetime registered, by the key of their step.
/// Held by the lifetime's [`WorkflowStep`](crate::WorkflowStep) and read by the rollback.
#[derive(Default)]
pub(crate) struct Handlers {
    by_step: std::sync::Mutex<HashMap<StepKey, Handler>>,
    /// Registrations since the registration replay last looked.
    registrations: std::sync::atomic::AtomicUsize,
}

impl Handlers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<StepKey, Handler>> {
        self.by_step
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn register(&self, key: &StepKey, handler: Handler) {
        self.registrations
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.map().insert(key.clone(), handler);
    }

    pub(crate) fn get(&self, key: &StepKey) -> Option<Handler> {
        self.map().get(key).cloned()
    }

    /// Whether a handler is registered for every one of `keys`.
    pub(crate) fn cover(&self, keys: &[StepKey]) -> bool {
        let map = self.map();
        keys.iter().all(|k| map.contains_key(k))
    }

    /// How many handlers were registered since the last call.
    pub(crate) fn take_progress(&self) -> usize {
        self.registrations
            .swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

/// What a rollback handler receives.
#[derive(Debug, Clone)]
pub struct Rollback<T> {
    /// The error that is failing the instance (for a terminate: `Terminated`).
    pub error: ErrorInfo,
    /// The step's stored output, or `None` if it never returned one (it failed, or was
    /// interrupted). Handlers must cope with `None`.
    pub output: Option<T>,
    /// The forward step's context (its name, count, last attempt and config).
    pub ctx: StepContext,
    /// `"<name>-<count>"`.
    pub step_name: String,
}

/// The erased input of a handler.
pub(crate) struct RollbackInput {
    pub(crate) error: ErrorInfo,
    pub(crate) output: Option<String>,
    pub(crate) ctx: StepContext,
    pub(crate) step_name: String,
}

type HandlerFn = dyn Fn(RollbackInput) -> BoxFuture<'static, Result<(), StepError>> + Send + Sync;

/// A registered handler with its config.
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) call: Arc<HandlerFn>,
    pub(crate) config: StepConfig,
}

impl Handler {
    pub(crate) fn new<T, H, Fut>(handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: Fn(Rollback<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let call: Arc<HandlerFn> = Arc::new(move |input: RollbackInput| {
            let output = match input.output.as_deref().map(crate::panic::from_json::<T>) {
                None => Ok(None),
                Some(Ok(v)) => Ok(Some(v)),
                Some(Err(e)) => Err(e),
            };
            match output {
                Ok(output) => Box::pin(handler(Rollback {
                    error: input.error,
                    output,
                    ctx: input.ctx,
                    step_name: input.step_name,
                })),
                Err(e) => {
                    let message =
                        format!("the stored output does not decode for the rollback handler: {e}");
                    Box::pin(async move { Err(crate::NonRetryableError::new(message).into()) })
                }
            }
        });
        Handler {
            call,
            config: StepConfig::default(),
        }
    }
}
