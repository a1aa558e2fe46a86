//! Step configuration as users write it: [`StepConfig`], [`Retries`] and [`Delay`], including
//! a delay function evaluated after each failed attempt.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{Backoff, ConfigError, ConfigOverrides, ErrorInfo, RetryDelay, StepConfigSpec};
use futures::future::BoxFuture;

use crate::context::StepContext;
use crate::failure::BoxError;

/// A step's configuration; every field left `None` keeps the default (limit 5, delay
/// 10 seconds, exponential back-off, 10 minute timeout). Share one between steps with
/// `.config(..)`.
///
/// ```
/// use std::time::Duration;
/// use cairn::{Retries, StepConfig};
///
/// let careful = StepConfig {
///     retries: Some(Retries::constant(3, Duration::from_secs(2))),
///     timeout: Some(Duration::from_secs(30)),
///     ..StepConfig::default()
/// };
/// # let _ = careful;
/// ```
#[derive(Clone, Default, Debug)]
pub struct StepConfig {
    /// Retry policy.
    pub retries: Option<Retries>,
    /// Per-attempt timeout.
    pub timeout: Option<Duration>,
    /// Show the output as `[REDACTED]` in every log and status view.
    pub sensitive: bool,
}

impl StepConfig {
    /// Parses Cloudflare's JSON step config, e.g.
    /// `{"retries": {"limit": 3, "delay": "5 seconds", "backoff": "linear"}, "timeout": "1 minute"}`.
    /// Unknown keys, a `retries` without `limit` or `delay`, bad durations, a zero timeout and a
    /// `sensitive` other than `"output"` are rejected.
    ///
    /// # Errors
    /// [`ConfigError`] naming what is wrong.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let o = StepConfigSpec::parse(json)?;
        Ok(StepConfig {
            retries: o.limit.map(|limit| Retries {
                limit,
                delay: match o.delay {
                    Some(RetryDelay::Fixed(d)) => Delay::Fixed(d),
                    _ => Delay::Fixed(cairn_core::DEFAULT_RETRY_DELAY),
                },
                backoff: o.backoff,
            }),
            timeout: o.timeout,
            sensitive: o.sensitive,
        })
    }

    pub(crate) fn overrides(&self) -> (ConfigOverrides, Option<DelayFn>) {
        let mut o = ConfigOverrides {
            timeout: self.timeout,
            sensitive: self.sensitive,
            ..ConfigOverrides::default()
        };
        let mut function = None;
        if let Some(r) = &self.retries {
            o.limit = Some(r.limit);
            o.backoff = r.backoff;
            o.delay = Some(match &r.delay {
                Delay::Fixed(d) => RetryDelay::Fixed(*d),
                Delay::Function(f) => {
                    function = Some(f.clone());
                    RetryDelay::Dynamic
                }
            });
        }
        (o, function)
    }
}

/// A retry policy: `limit` retries after the first attempt, waiting `delay` grown by
/// `backoff` (exponential when `None`).
#[derive(Clone, Debug)]
pub struct Retries {
    /// Retries after the first attempt; attempts = limit + 1. At most 10,000.
    pub limit: u32,
    /// The base delay.
    pub delay: Delay,
    /// How the delay grows; exponential when `None`.
    pub backoff: Option<Backoff>,
}

impl Retries {
    /// `limit` retries with base `delay`, default (exponential) back-off.
    pub fn new(limit: u32, delay: impl Into<Delay>) -> Self {
        Retries {
            limit,
            delay: delay.into(),
            backoff: None,
        }
    }

    /// The same delay before every retry.
    pub fn constant(limit: u32, delay: impl Into<Delay>) -> Self {
        Self::new(limit, delay).backoff(Backoff::Constant)
    }

    /// `delay × n` before retry `n`.
    pub fn linear(limit: u32, delay: impl Into<Delay>) -> Self {
        Self::new(limit, delay).backoff(Backoff::Linear)
    }

    /// `delay × 2^(n−1)` before retry `n`.
    pub fn exponential(limit: u32, delay: impl Into<Delay>) -> Self {
        Self::new(limit, delay).backoff(Backoff::Exponential)
    }

    /// No retries: one attempt.
    pub fn none() -> Self {
        Self::new(0, Duration::ZERO)
    }

    /// Sets the back-off.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }
}

/// The base delay of a retry policy.
#[derive(Clone, Debug)]
pub enum Delay {
    /// A fixed duration.
    Fixed(Duration),
    /// A function of the failed attempt, evaluated after each failure that will be retried.
    Function(DelayFn),
}

impl From<Duration> for Delay {
    fn from(d: Duration) -> Self {
        Delay::Fixed(d)
    }
}

/// What a delay function returns: a duration or a duration string such as `"30 seconds"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelayValue {
    /// A duration.
    Duration(Duration),
    /// A duration string, parsed with Cloudflare's grammar.
    Text(String),
}

impl From<Duration> for DelayValue {
    fn from(d: Duration) -> Self {
        DelayValue::Duration(d)
    }
}

impl From<String> for DelayValue {
    fn from(s: String) -> Self {
        DelayValue::Text(s)
    }
}

impl From<&str> for DelayValue {
    fn from(s: &str) -> Self {
        DelayValue::Text(s.to_owned())
    }
}

/// What a delay function receives: the failed attempt's context and its error.
#[derive(Debug, Clone)]
pub struct DelayContext {
    /// The failed attempt's context (`config` has no delay).
    pub ctx: StepContext,
    /// The error that failed the attempt.
    pub error: ErrorInfo,
}

type DelayFuture = BoxFuture<'static, Result<DelayValue, BoxError>>;

/// A delay function; build one with [`Delay::function`] or [`Delay::sync`].
#[derive(Clone)]
pub struct DelayFn(pub(crate) Arc<dyn Fn(DelayContext) -> DelayFuture + Send + Sync>);

impl std::fmt::Debug for DelayFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DelayFn")
    }
}

impl Delay {
    /// An async, fallible delay function. Its result is the *base* of the back-off formula.
    /// If it fails, takes longer than 5 seconds or returns an invalid duration, the step
    /// fails at once with `NonRetryableDelayError`.
    pub fn function<F, Fut, V, E>(f: F) -> Self
    where
        F: Fn(DelayContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        V: Into<DelayValue>,
        E: Into<BoxError>,
    {
        Delay::Function(DelayFn(Arc::new(move |ctx| {
            let fut = f(ctx);
            Box::pin(async move { fut.await.map(Into::into).map_err(Into::into) })
        })))
    }

    /// A plain delay function, e.g. `Delay::sync(|d| if d.error.message.contains("rate limit")
    /// { format!("{} seconds", d.ctx.attempt * 30) } else { "10 seconds".into() })`.
    pub fn sync<F, V>(f: F) -> Self
    where
        F: Fn(&DelayContext) -> V + Send + Sync + 'static,
        V: Into<DelayValue>,
    {
        Delay::Function(DelayFn(Arc::new(move |ctx| {
            let value = f(&ctx).into();
            Box::pin(async move { Ok(value) })
        })))
    }
}
