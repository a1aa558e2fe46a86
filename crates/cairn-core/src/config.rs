//! Step configuration: retries, back-off, timeouts; defaults, the merge rule, validation and
//! the delay formula (SPEC §1.4, §3.5, Part A.1).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{format_duration, parse_duration};

/// Default retry limit: 5 retries, so 6 attempts in all.
pub const DEFAULT_RETRY_LIMIT: u32 = 5;
/// Default base delay between attempts.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(10);
/// Default per-attempt timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The most retries a step may ask for.
pub const MAX_RETRY_LIMIT: u32 = 10_000;

/// How the delay grows from one retry to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backoff {
    /// Every retry waits the base delay.
    Constant,
    /// Retry `n` waits `base × n`.
    Linear,
    /// Retry `n` waits `base × 2^(n−1)` (the default).
    #[default]
    Exponential,
}

impl Backoff {
    /// The wait before attempt `failed_attempt + 1`, where `failed_attempt` is the 1-based
    /// number of the attempt that just failed. Saturates instead of overflowing.
    pub fn delay(self, base: Duration, failed_attempt: u32) -> Duration {
        let n = u128::from(failed_attempt.max(1));
        let base_ms = base.as_millis();
        let ms = match self {
            Backoff::Constant => base_ms,
            Backoff::Linear => base_ms.saturating_mul(n),
            Backoff::Exponential => {
                let shift = (n - 1).min(127) as u32;
                base_ms.saturating_mul(1u128.checked_shl(shift).unwrap_or(u128::MAX))
            }
        };
        Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
    }
}

/// The base delay of a retry policy: a fixed duration or a function evaluated per failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDelay {
    /// A fixed base delay.
    Fixed(Duration),
    /// Computed by the step's delay function; persisted and logged as `"[dynamic]"`.
    Dynamic,
}

impl RetryDelay {
    /// The fixed delay, or `None` for a delay function.
    pub fn fixed(self) -> Option<Duration> {
        match self {
            RetryDelay::Fixed(d) => Some(d),
            RetryDelay::Dynamic => None,
        }
    }
}

/// The marker stored in place of a delay function.
pub const DYNAMIC_DELAY_MARKER: &str = "[dynamic]";

/// A step's retry policy after defaults are merged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedRetries {
    /// How many retries after the first attempt (attempts = limit + 1).
    pub limit: u32,
    /// The base delay.
    pub delay: RetryDelay,
    /// How the delay grows.
    pub backoff: Backoff,
}

/// A step's configuration after defaults are merged in: what `ctx.config` shows, what the
/// journal stores on the first execution, and what the retry loop obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// Retry policy.
    pub retries: ResolvedRetries,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// Whether the output is shown as `[REDACTED]` in every view.
    pub sensitive: bool,
}

impl Default for ResolvedConfig {
    fn default() -> Self {
        ResolvedConfig {
            retries: ResolvedRetries {
                limit: DEFAULT_RETRY_LIMIT,
                delay: RetryDelay::Fixed(DEFAULT_RETRY_DELAY),
                backoff: Backoff::Exponential,
            },
            timeout: DEFAULT_TIMEOUT,
            sensitive: false,
        }
    }
}

/// What a user overrides; `None` keeps the default. `retries` merges key by key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfigOverrides {
    /// Retry limit override.
    pub limit: Option<u32>,
    /// Base delay override.
    pub delay: Option<RetryDelay>,
    /// Back-off override.
    pub backoff: Option<Backoff>,
    /// Timeout override.
    pub timeout: Option<Duration>,
    /// Redact the output.
    pub sensitive: bool,
}

/// A configuration that cannot be used, naming the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigOverrides {
    /// Merges these overrides over `base` (the defaults) and validates the result.
    ///
    /// # Errors
    /// A retry limit above [`MAX_RETRY_LIMIT`] or a zero timeout.
    pub fn resolve_over(&self, base: ResolvedConfig) -> Result<ResolvedConfig, ConfigError> {
        let resolved = ResolvedConfig {
            retries: ResolvedRetries {
                limit: self.limit.unwrap_or(base.retries.limit),
                delay: self.delay.unwrap_or(base.retries.delay),
                backoff: self.backoff.unwrap_or(base.retries.backoff),
            },
            timeout: self.timeout.unwrap_or(base.timeout),
            sensitive: self.sensitive || base.sensitive,
        };
        resolved.validate()?;
        Ok(resolved)
    }
}

impl ResolvedConfig {
    /// Checks the bounds Rust's types do not already enforce.
    ///
    /// # Errors
    /// A retry limit above [`MAX_RETRY_LIMIT`] or a zero timeout.
    pub fn validate(self) -> Result<(), ConfigError> {
        if self.retries.limit > MAX_RETRY_LIMIT {
            return Err(ConfigError(format!(
                "retries.limit {} exceeds the maximum of {MAX_RETRY_LIMIT}",
                self.retries.limit
            )));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError("timeout must be greater than 0".into()));
        }
        Ok(())
    }

    /// The wait before the next attempt after attempt `failed_attempt` failed, given the
    /// base delay (the fixed one, or the delay function's result).
    pub fn retry_wait(self, base: Duration, failed_attempt: u32) -> Duration {
        self.retries.backoff.delay(base, failed_attempt)
    }

    /// Whether a failure of attempt `attempt` (1-based) will be retried.
    pub fn will_retry(self, attempt: u32) -> bool {
        attempt <= self.retries.limit
    }

    /// The view the step body sees in `ctx.config`: a delay function is omitted, never leaked
    /// as its marker.
    pub fn to_context_json(self) -> serde_json::Value {
        self.to_json(false)
    }

    /// The form stored in the journal and shown in logs: a delay function is `"[dynamic]"`.
    pub fn to_persisted_json(self) -> serde_json::Value {
        self.to_json(true)
    }

    fn to_json(self, with_marker: bool) -> serde_json::Value {
        let mut retries = serde_json::Map::new();
        retries.insert("limit".into(), self.retries.limit.into());
        match self.retries.delay {
            RetryDelay::Fixed(d) => {
                retries.insert("delay".into(), duration_ms(d).into());
            }
            RetryDelay::Dynamic if with_marker => {
                retries.insert("delay".into(), DYNAMIC_DELAY_MARKER.into());
            }
            RetryDelay::Dynamic => {}
        }
        retries.insert(
            "backoff".into(),
            serde_json::to_value(self.retries.backoff).unwrap_or_default(),
        );
        let mut config = serde_json::Map::new();
        config.insert("retries".into(), retries.into());
        config.insert("timeout".into(), format_duration(self.timeout).into());
        if self.sensitive {
            config.insert("sensitive".into(), "output".into());
        }
        config.into()
    }

    /// Reads a config stored by [`ResolvedConfig::to_persisted_json`].
    ///
    /// # Errors
    /// When `value` is not a config in the persisted shape.
    pub fn from_persisted_json(value: &serde_json::Value) -> Result<Self, ConfigError> {
        // `stream` marks a stream step's config (the engine's, not a setting).
        let unmarked;
        let value = match value.as_object() {
            Some(map) if map.contains_key("stream") => {
                let mut map = map.clone();
                map.remove("stream");
                unmarked = serde_json::Value::Object(map);
                &unmarked
            }
            _ => value,
        };
        let crate::json::Object(spec) =
            crate::json::Object::<StepConfigSpec>::deserialize(value)
                .map_err(|e| ConfigError(format!("stored step config is unreadable: {e}")))?;
        let retries = spec
            .retries
            .ok_or_else(|| ConfigError("stored step config has no retries".into()))?;
        Ok(ResolvedConfig {
            retries: ResolvedRetries {
                limit: retries.limit,
                delay: retries.delay.into_delay()?,
                backoff: retries.backoff.unwrap_or_default(),
            },
            timeout: spec
                .timeout
                .map(DurationSpec::into_duration)
                .transpose()?
                .unwrap_or(DEFAULT_TIMEOUT),
            sensitive: spec.sensitive.is_some(),
        })
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration written by a user: a number of milliseconds or a duration string.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum DurationSpec {
    /// Milliseconds.
    Millis(f64),
    /// A duration string such as `"30 seconds"`.
    Text(String),
}

impl DurationSpec {
    /// Converts to a `Duration`.
    ///
    /// # Errors
    /// A negative, non-finite or unparseable value.
    pub fn into_duration(self) -> Result<Duration, ConfigError> {
        match self {
            DurationSpec::Millis(ms) if ms.is_finite() && ms >= 0.0 && ms < u64::MAX as f64 => {
                Ok(Duration::from_millis(ms.round() as u64))
            }
            DurationSpec::Millis(ms) => Err(ConfigError(format!("invalid duration {ms}"))),
            DurationSpec::Text(s) => parse_duration(&s).map_err(|e| ConfigError(e.to_string())),
        }
    }

    fn into_delay(self) -> Result<RetryDelay, ConfigError> {
        match self {
            DurationSpec::Text(s) if s == DYNAMIC_DELAY_MARKER => Ok(RetryDelay::Dynamic),
            other => other.into_duration().map(RetryDelay::Fixed),
        }
    }
}

/// The retry part of a step config written as JSON (both `limit` and `delay` required).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetriesSpec {
    /// Retry limit.
    pub limit: u32,
    /// Base delay.
    pub delay: DurationSpec,
    /// Back-off, exponential when omitted.
    #[serde(default)]
    pub backoff: Option<Backoff>,
}

/// A step config written as JSON, Cloudflare's `WorkflowStepConfig` shape, validated strictly:
/// unknown keys are rejected at both levels (SPEC §1.4, checklist V5).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepConfigSpec {
    /// Retry policy.
    #[serde(default, deserialize_with = "crate::json::optional_object")]
    pub retries: Option<RetriesSpec>,
    /// Per-attempt timeout.
    #[serde(default)]
    pub timeout: Option<DurationSpec>,
    /// Only `"output"` is allowed.
    #[serde(default)]
    pub sensitive: Option<SensitiveSpec>,
}

/// The only accepted value of `sensitive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SensitiveSpec {
    /// Redact the step output.
    #[serde(rename = "output")]
    Output,
}

impl StepConfigSpec {
    /// Parses and checks a JSON step config.
    ///
    /// # Errors
    /// Malformed JSON, unknown keys, a `retries` without `limit` or `delay`, an unparseable
    /// duration, a zero timeout or a `sensitive` other than `"output"`.
    pub fn parse(json: &str) -> Result<ConfigOverrides, ConfigError> {
        let spec: StepConfigSpec =
            crate::json::from_str(json).map_err(|e| ConfigError(e.to_string()))?;
        spec.into_overrides()
    }

    /// Converts to overrides, checking every value.
    ///
    /// # Errors
    /// An unparseable duration or a zero timeout.
    pub fn into_overrides(self) -> Result<ConfigOverrides, ConfigError> {
        let mut overrides = ConfigOverrides {
            sensitive: self.sensitive.is_some(),
            ..ConfigOverrides::default()
        };
        if let Some(retries) = self.retries {
            overrides.limit = Some(retries.limit);
            overrides.delay = Some(RetryDelay::Fixed(retries.delay.into_duration()?));
            overrides.backoff = retries.backoff;
        }
        if let Some(timeout) = self.timeout {
            let timeout = timeout.into_duration()?;
            if timeout.is_zero() {
                return Err(ConfigError("timeout must be greater than 0".into()));
            }
            overrides.timeout = Some(timeout);
        }
        ResolvedConfig::default().validate()?;
        overrides.resolve_over(ResolvedConfig::default())?;
        Ok(overrides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn backoff_formulas() {
        let table = [
            (Backoff::Constant, [1, 1, 1, 1]),
            (Backoff::Linear, [1, 2, 3, 4]),
            (Backoff::Exponential, [1, 2, 4, 8]),
        ];
        for (backoff, expected) in table {
            for (i, secs) in expected.iter().enumerate() {
                assert_eq!(
                    backoff.delay(S, i as u32 + 1),
                    S * *secs,
                    "{backoff:?} n={}",
                    i + 1
                );
            }
        }
    }

    #[test]
    fn prod_default_delays() {
        let c = ResolvedConfig::default();
        let waits: Vec<u64> = (1..=5)
            .map(|n| c.retry_wait(DEFAULT_RETRY_DELAY, n).as_secs())
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160]);
        assert!(c.will_retry(5));
        assert!(!c.will_retry(6), "limit 5 means 6 attempts");
    }

    #[test]
    fn partial_override_keeps_other_defaults() {
        let o = ConfigOverrides {
            limit: Some(3),
            delay: Some(RetryDelay::Fixed(Duration::from_millis(500))),
            ..Default::default()
        };
        let r = o.resolve_over(ResolvedConfig::default()).expect("valid");
        assert_eq!(r.retries.backoff, Backoff::Exponential);
        assert_eq!(r.timeout, DEFAULT_TIMEOUT);
        assert_eq!(r.retries.limit, 3);
    }

    #[test]
    fn limits_are_validated() {
        let too_many = ConfigOverrides {
            limit: Some(10_001),
            ..Default::default()
        };
        let err = too_many
            .resolve_over(ResolvedConfig::default())
            .expect_err("too many");
        assert!(err.0.contains("10001") && err.0.contains("10000"), "{err}");
        let zero = ConfigOverrides {
            timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(zero.resolve_over(ResolvedConfig::default()).is_err());
    }

    #[test]
    fn json_views_of_a_dynamic_delay() {
        let c = ResolvedConfig {
            retries: ResolvedRetries {
                delay: RetryDelay::Dynamic,
                ..ResolvedConfig::default().retries
            },
            ..ResolvedConfig::default()
        };
        assert!(c.to_context_json()["retries"].get("delay").is_none());
        assert_eq!(c.to_persisted_json()["retries"]["delay"], "[dynamic]");
        assert_eq!(
            ResolvedConfig::from_persisted_json(&c.to_persisted_json()),
            Ok(c)
        );
        let d = ResolvedConfig::default();
        assert_eq!(d.to_context_json()["retries"]["delay"], 10_000);
        assert_eq!(d.to_context_json()["timeout"], "10 minutes");
        assert_eq!(
            ResolvedConfig::from_persisted_json(&d.to_persisted_json()),
            Ok(d)
        );
    }

    #[test]
    fn json_spec_validation() {
        for bad in [
            r#"{"retries":{"limit":1}}"#,
            r#"{"retries":{"delay":1}}"#,
            r#"{"retries":{"limit":1,"delay":1,"jitter":true}}"#,
            r#"{"retries":{"limit":1,"delay":"soon"}}"#,
            r#"{"timeout":0}"#,
            r#"{"timeout":"0"}"#,
            r#"{"sensitive":"input"}"#,
            r#"{"retry":{}}"#,
            r#"{"retries":{"limit":-1,"delay":1}}"#,
            r#"{"retries":{"limit":1,"delay":-5}}"#,
            "not json",
        ] {
            assert!(
                StepConfigSpec::parse(bad).is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn json_arrays_are_not_configs() {
        for bad in [
            "[]",
            r#"[[3,"5 seconds","linear"],"1 minute","output"]"#,
            r#"{"retries":[3,"5 seconds"]}"#,
            r#"{"retries":[3,"5 seconds","linear"],"timeout":"1 minute"}"#,
        ] {
            assert!(
                StepConfigSpec::parse(bad).is_err(),
                "{bad} should be rejected"
            );
        }
        for good in [
            r#"{"retries":{"limit":0,"delay":0}}"#,
            r#"{"retries":{"limit":3,"delay":"5 seconds","backoff":"linear"},"timeout":"1 minute"}"#,
            r#"{"sensitive":"output"}"#,
            "{}",
        ] {
            assert!(
                StepConfigSpec::parse(good).is_ok(),
                "{good} should be accepted"
            );
        }
    }

    /// Random JSON built from the config's own keys and typical values, most of it close to
    /// a config, some of it arrays and junk.
    fn config_like() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::{Value, json};
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            prop::sample::select(vec![-1i64, 0, 1, 3, 5, 9_999, 10_000, 10_001, 1 << 40])
                .prop_map(Value::from),
            prop::sample::select(vec![0.0f64, 0.4, 0.6, 2.5, 3.0, -0.5, 1e300])
                .prop_map(Value::from),
            prop::sample::select(vec![
                "output",
                "input",
                "5 seconds",
                "1 m",
                "5 m",
                "0",
                "1",
                "constant",
                "linear",
                "exponential",
                "[dynamic]",
                "soon",
                "10 minutes",
                "2 hours",
            ])
            .prop_map(Value::from),
        ];
        let key = prop::sample::select(vec![
            "retries",
            "timeout",
            "sensitive",
            "limit",
            "delay",
            "backoff",
            "jitter",
        ]);
        let any_json = leaf.clone().prop_recursive(3, 16, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(key.clone(), inner, 0..4).prop_map(|m| json!(m)),
            ]
        });
        let maybe = |s: BoxedStrategy<Value>| prop::option::weighted(0.6, s);
        let retries = (
            maybe(leaf.clone().boxed()),
            maybe(leaf.clone().boxed()),
            maybe(leaf.clone().boxed()),
        )
            .prop_map(|(limit, delay, backoff)| {
                let mut m = serde_json::Map::new();
                for (k, v) in [("limit", limit), ("delay", delay), ("backoff", backoff)] {
                    if let Some(v) = v {
                        m.insert(k.into(), v);
                    }
                }
                Value::Object(m)
            });
        let config = (
            maybe(prop_oneof![3 => retries, 1 => any_json.clone()].boxed()),
            maybe(leaf.clone().boxed()),
            maybe(leaf.boxed()),
        )
            .prop_map(|(retries, timeout, sensitive)| {
                let mut m = serde_json::Map::new();
                for (k, v) in [
                    ("retries", retries),
                    ("timeout", timeout),
                    ("sensitive", sensitive),
                ] {
                    if let Some(v) = v {
                        m.insert(k.into(), v);
                    }
                }
                Value::Object(m)
            });
        prop_oneof![4 => config, 1 => any_json]
    }

    /// SPEC §1.4 and checklist V5, written down independently of serde: what a step config
    /// written as JSON means, or `None` when it must be rejected.
    fn config_model(v: &serde_json::Value) -> Option<ConfigOverrides> {
        use serde_json::Value;
        let only = |m: &serde_json::Map<String, Value>, keys: &[&str]| {
            m.keys().all(|k| keys.contains(&k.as_str()))
        };
        let duration = |v: &Value| -> Option<Duration> {
            match v {
                Value::Number(n) => {
                    let ms = n.as_f64()?;
                    (0.0..1.8e19)
                        .contains(&ms)
                        .then(|| Duration::from_millis(ms.round() as u64))
                }
                Value::String(s) => parse_duration(s).ok(),
                _ => None,
            }
        };
        let top = v.as_object()?;
        if !only(top, &["retries", "timeout", "sensitive"]) {
            return None;
        }
        let mut o = ConfigOverrides::default();
        match top.get("retries") {
            None | Some(Value::Null) => {}
            Some(Value::Object(r)) => {
                if !only(r, &["limit", "delay", "backoff"]) {
                    return None;
                }
                let limit = u32::try_from(r.get("limit")?.as_u64()?).ok()?;
                if limit > MAX_RETRY_LIMIT {
                    return None;
                }
                o.limit = Some(limit);
                o.delay = Some(RetryDelay::Fixed(duration(r.get("delay")?)?));
                o.backoff = match r.get("backoff") {
                    None | Some(Value::Null) => None,
                    Some(b) => Some(match b.as_str()? {
                        "constant" => Backoff::Constant,
                        "linear" => Backoff::Linear,
                        "exponential" => Backoff::Exponential,
                        _ => return None,
                    }),
                };
            }
            Some(_) => return None,
        }
        match top.get("timeout") {
            None | Some(Value::Null) => {}
            Some(t) => {
                let t = duration(t)?;
                if t.is_zero() {
                    return None;
                }
                o.timeout = Some(t);
            }
        }
        match top.get("sensitive") {
            None | Some(Value::Null) => {}
            Some(s) if s == "output" => o.sensitive = true,
            Some(_) => return None,
        }
        Some(o)
    }

    proptest! {
        #[test]
        fn config_parser_matches_the_documented_contract(v in config_like()) {
            let text = v.to_string();
            prop_assert_eq!(StepConfigSpec::parse(&text).ok(), config_model(&v), "config {}", text);
        }
    }

    proptest! {
        #[test]
        fn backoff_never_panics_and_is_monotonic(base_ms in 0u64..u64::MAX, n in 1u32..u32::MAX) {
            for backoff in [Backoff::Constant, Backoff::Linear, Backoff::Exponential] {
                let base = Duration::from_millis(base_ms);
                let now = backoff.delay(base, n);
                let next = backoff.delay(base, n.saturating_add(1));
                prop_assert!(next >= now);
                prop_assert!(now >= base.min(now));
            }
        }
    }
}
