//! `step.run`: the [`RunOp`] future and its config methods.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cairn_core::StepKind;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::{Retries, StepConfig};
use crate::context::StepContext;
use crate::failure::{INTERNAL, StepError, WorkflowError};
use crate::ops::WorkflowStep;
use crate::ops::attempt::Execution;
use crate::ops::handler::{Handler, Rollback};

impl WorkflowStep {
    /// Runs `body` as a durable step named `name` (Cloudflare's `step.do`).
    ///
    /// The body is called once per attempt until it succeeds or its retries run out; its
    /// result is stored and returned now and on every replay, without calling it again. Any
    /// error the body returns is retried; a [`NonRetryableError`](crate::NonRetryableError)
    /// is not. The final outcome (output or error) is cached either way.
    ///
    /// The output is stored as JSON, within [`EngineBuilder::payload_limit`](crate::EngineBuilder::payload_limit);
    /// bytes in it (`Vec<u8>`, `bytes::Bytes`, `serde_bytes`) are stored as base64 and
    /// count as their bytes. For more, see [`WorkflowStep::run_stream`].
    ///
    /// The step's identity, `(name, count)`, is taken when this is called, not when it is
    /// first polled, so concurrent steps (`futures::try_join!`) replay deterministically.
    #[doc(alias = "do")]
    pub fn run<'a, T, F, Fut>(&self, name: impl Into<String>, body: F) -> RunOp<'a, T>
    where
        F: FnMut(StepContext) -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, StepError>> + Send + 'a,
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let state = Arc::clone(&self.lifetime);
        let handlers = Arc::clone(&self.handlers);
        let key = self.lifetime.claim(StepKind::Run, name.into());
        RunOp::from_start(Box::new(move |config, rollback| {
            if let (Ok(key), Some(handler)) = (&key, &rollback) {
                handlers.register(key, handler.clone());
            }
            let mut run = Execution::new(state, config);
            run.rollback = rollback;
            Box::pin(async move { run.execute(key?, body).await })
        }))
    }
}

type Started<'a, T> = BoxFuture<'a, Result<T, WorkflowError>>;

/// A `step.run` op: a future with chained, consuming config methods.
///
/// The body's type is erased when the op is created, so the op's `Future` impl has no
/// bounds that mention the body's lifetimes: ops whose bodies borrow workflow locals can be
/// combined with `futures::try_join!` inside a `Send` workflow future.
///
/// # Cancel safety
/// Dropping it loses nothing durable: a started attempt without an outcome is recorded as
/// interrupted on the next replay and retried.
#[must_use = "a step does nothing unless awaited"]
pub struct RunOp<'a, T> {
    /// What `.retries()`, `.timeout()` and `.sensitive()` set.
    config: StepConfig,
    /// What `.config()` set, under them.
    base: Option<StepConfig>,
    rollback: Option<Handler>,
    rollback_config: Option<StepConfig>,
    start: Option<Start<'a, T>>,
    running: Option<Started<'a, T>>,
}

pub(crate) type Start<'a, T> =
    Box<dyn FnOnce(StepConfig, Option<Handler>) -> Started<'a, T> + Send + 'a>;

impl<'a, T> RunOp<'a, T> {
    /// An op that calls `start` with its config when first polled.
    pub(crate) fn from_start(start: Start<'a, T>) -> Self {
        RunOp {
            config: StepConfig::default(),
            base: None,
            rollback: None,
            rollback_config: None,
            start: Some(start),
            running: None,
        }
    }
}

impl<T> RunOp<'_, T> {
    /// Sets the retry policy.
    pub fn retries(mut self, retries: Retries) -> Self {
        self.config.retries = Some(retries);
        self
    }

    /// Sets the per-attempt timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// Shows the output as `[REDACTED]` in every log and status view; workflow code still
    /// gets the real value.
    pub fn sensitive(mut self) -> Self {
        self.config.sensitive = true;
        self
    }

    /// Uses a shared config as the base: what `.retries()`, `.timeout()` and `.sensitive()`
    /// set wins over it, in whichever order they are called.
    pub fn config(mut self, config: &StepConfig) -> Self {
        self.base = Some(config.clone());
        self
    }

    /// Declares how to compensate this step (saga rollback). If the instance later fails (or
    /// is terminated with rollback), the handler of every step that at least started runs,
    /// one at a time, in reverse start order, as a durable step with its own retries (see
    /// [`RunOp::rollback_config`]). It receives the error, the step's output (`None` if it
    /// never returned one) and the step's context. Handlers are `'static`: they may run
    /// after `run` has returned, or in a later process.
    pub fn rollback<H, Fut>(mut self, handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: Fn(Rollback<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        self.rollback = Some(Handler::new(handler));
        self
    }

    /// Retries and timeout of the rollback handler (merged over the step defaults, not over
    /// this step's config). Before or after [`RunOp::rollback`], either works.
    pub fn rollback_config(mut self, config: &StepConfig) -> Self {
        self.rollback_config = Some(config.clone());
        self
    }

    /// The step's config: the base from [`RunOp::config`] with the settings made one by one
    /// on top.
    fn effective_config(&mut self) -> StepConfig {
        let set = std::mem::take(&mut self.config);
        let mut config = self.base.take().unwrap_or_default();
        if set.retries.is_some() {
            config.retries = set.retries;
        }
        if set.timeout.is_some() {
            config.timeout = set.timeout;
        }
        config.sensitive |= set.sensitive;
        config
    }
}

impl<T> Future for RunOp<'_, T> {
    type Output = Result<T, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _engine = crate::panic::EngineCode::enter();
        let this = self.get_mut();
        if let Some(start) = this.start.take() {
            let config = this.effective_config();
            let mut rollback = this.rollback.take();
            if let (Some(handler), Some(config)) = (rollback.as_mut(), this.rollback_config.take())
            {
                handler.config = config;
            }
            this.running = Some(start(config, rollback));
        }
        match this.running.as_mut() {
            Some(running) => running.as_mut().poll(cx),
            None => Poll::Ready(Err(WorkflowError::new(
                INTERNAL,
                "step polled after completion",
            ))),
        }
    }
}
