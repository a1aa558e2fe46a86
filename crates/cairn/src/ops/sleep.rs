//! `step.sleep` and `step.sleep_until`: durable timers stored as absolute wake times.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use cairn_core::{
    DurationError, LogKind, StepKey, StepKind, StepRecord, StepState, Timestamp, parse_duration,
};
use futures::future::BoxFuture;
use serde_json::json;
use tracing::Instrument;

use crate::failure::{ERROR, WorkflowError};
use crate::lifetime::Lifetime;
use crate::ops::WorkflowStep;

/// The longest sleep: 365 days.
pub const MAX_SLEEP: Duration = Duration::from_secs(365 * 86_400);

/// A duration given as a `Duration` or as a Cloudflare string such as `"1 hour"`.
pub trait IntoDuration {
    /// Converts, parsing strings with Cloudflare's grammar.
    ///
    /// # Errors
    /// A string that does not follow the grammar, quoted in the error.
    fn into_duration(self) -> Result<Duration, DurationError>;
}

impl IntoDuration for Duration {
    fn into_duration(self) -> Result<Duration, DurationError> {
        Ok(self)
    }
}

impl IntoDuration for &str {
    fn into_duration(self) -> Result<Duration, DurationError> {
        parse_duration(self)
    }
}

impl IntoDuration for String {
    fn into_duration(self) -> Result<Duration, DurationError> {
        parse_duration(&self)
    }
}

/// A point in time to sleep until.
pub trait IntoTimestamp {
    /// Converts.
    fn into_timestamp(self) -> Timestamp;
}

impl IntoTimestamp for Timestamp {
    fn into_timestamp(self) -> Timestamp {
        self
    }
}

impl IntoTimestamp for SystemTime {
    fn into_timestamp(self) -> Timestamp {
        Timestamp::from_system_time(self)
    }
}

/// A `step.sleep` or `step.sleep_until` op.
///
/// # Cancel safety
/// Dropping it loses nothing: the wake time is stored when the sleep starts, and a replay
/// waits only for what remains.
#[must_use = "a sleep does nothing unless awaited"]
pub struct SleepOp(BoxFuture<'static, Result<(), WorkflowError>>);

impl Future for SleepOp {
    type Output = Result<(), WorkflowError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _engine = crate::panic::EngineCode::enter();
        self.0.as_mut().poll(cx)
    }
}

enum Target {
    For(Result<Duration, DurationError>),
    Until(Timestamp),
}

impl WorkflowStep {
    /// Sleeps durably for `duration` (a `Duration` or a string like `"1 hour"`; at most 365
    /// days). The wake time is stored when the sleep starts: after a restart the instance
    /// wakes at the original time, and a long sleep costs a database row, not memory.
    /// Sleeps do not count towards the step limit.
    pub fn sleep(&self, name: impl Into<String>, duration: impl IntoDuration) -> SleepOp {
        self.sleep_op(name.into(), Target::For(duration.into_duration()))
    }

    /// Sleeps durably until `at`. Keyed on its name: a replay after the wake time returns at
    /// once. A time in the past at the first execution is an error.
    pub fn sleep_until(&self, name: impl Into<String>, at: impl IntoTimestamp) -> SleepOp {
        self.sleep_op(name.into(), Target::Until(at.into_timestamp()))
    }

    fn sleep_op(&self, name: String, target: Target) -> SleepOp {
        let state = Arc::clone(&self.lifetime);
        let key = self.lifetime.claim(StepKind::Sleep, name);
        SleepOp(Box::pin(async move {
            state.pause_gate().await;
            let result = sleep(Arc::clone(&state), key?, target).await;
            state.pause_gate().await;
            result
        }))
    }
}

async fn sleep(state: Arc<Lifetime>, key: StepKey, target: Target) -> Result<(), WorkflowError> {
    if state.registering() {
        // Replaying only to register rollback handlers: a finished sleep returns at once;
        // one that never finished (still waiting, or cancelled: it lost a `select!`) never
        // returns, as nothing after it ran. The replay check stops at one that never
        // started, as at any new work.
        return match state.take_record(&key) {
            Some(rec) if rec.state == StepState::Succeeded => Ok(()),
            Some(_) => std::future::pending().await,
            None => {
                state.note_new_work(&key);
                std::future::pending().await
            }
        };
    }
    let mut activity = state.activity();
    let (record, waiting) = match state.take_record(&key) {
        Some(rec) if rec.state == StepState::Succeeded => return Ok(()),
        // It lost a `select!`: it never finishes, so the race goes the same way again.
        // Parked, it is not activity (the instance may hibernate).
        Some(rec) if rec.state == StepState::Cancelled => {
            drop(activity);
            return std::future::pending().await;
        }
        Some(rec) => {
            let waiting = super::abandoned::Waiting::new(&state, &rec, LogKind::SleepComplete);
            (rec, waiting)
        }
        None => {
            let now = state.now();
            // A test that disabled this sleep (`cairn::testing`): it starts and ends now.
            let disabled = state
                .env
                .hooks
                .as_ref()
                .is_some_and(|h| h.sleep_disabled(state.who(), &key));
            let wake_at = match target {
                Target::For(duration) => {
                    let d = duration.map_err(|e| WorkflowError::new(ERROR, e.to_string()))?;
                    if d > MAX_SLEEP {
                        return Err(WorkflowError::new(
                            ERROR,
                            format!(
                                "sleep \"{}\" of {} ms exceeds the maximum of 365 days",
                                key.name,
                                d.as_millis()
                            ),
                        ));
                    }
                    now.saturating_add(d)
                }
                Target::Until(at) if at < now => {
                    return Err(WorkflowError::new(
                        ERROR,
                        "You can't sleep until a time in the past, time-traveler",
                    ));
                }
                Target::Until(at) => {
                    if at.since(now) > MAX_SLEEP {
                        return Err(WorkflowError::new(
                            ERROR,
                            format!(
                                "sleep_until \"{}\" targets {at}, more than 365 days away",
                                key.name
                            ),
                        ));
                    }
                    at
                }
            };
            let wake_at = if disabled { now } else { wake_at };
            let record = StepRecord {
                key: key.clone(),
                seq: state.next_seq(),
                state: StepState::Running,
                config: json!({}).into(),
                attempts: 0,
                in_flight: false,
                wake_at: Some(wake_at),
                output: None,
                error: None,
                started_at: now,
                ended_at: None,
                has_rollback: false,
            };
            // Armed before the start is sent: dropped while it is on its way, the cancel
            // goes with the next commit (one that lands first finds nothing to cancel).
            let waiting = super::abandoned::Waiting::new(&state, &record, LogKind::SleepComplete);
            state
                .commit(vec![
                    state.log(
                        LogKind::SleepStart,
                        Some(&key),
                        json!({ "durationMs": wake_at.since(now).as_millis() as u64, "wakeAt": wake_at.as_millis() }),
                    ),
                    cairn_store::Write::Step(record.clone()),
                ])
                .await;
            (record, waiting)
        }
    };
    let wake_at = record.wake_at.unwrap_or_else(|| state.now());
    // A span for the part of the sleep this lifetime waits (a hibernated sleep has one per
    // lifetime); a sleep answered from the journal has none.
    let span = tracing::info_span!(
        "step.sleep",
        step.name = %key.name,
        step.count = key.count,
        wake_at = %wake_at,
    );
    async {
        activity
            .wait(wake_at, None, std::future::pending::<()>())
            .await;
        waiting.finished();
        let done = StepRecord {
            state: StepState::Succeeded,
            wake_at: None,
            ended_at: Some(state.now()),
            ..record
        };
        // Not a commit of its own: the completion rides with the lifetime's next commit
        // (the next step's start, the end, a hibernation or pause; the drain at shutdown).
        // A wake-up is not an effect anyone can see: if the lifetime dies first, the
        // replay finds the sleep due and completes it again, at no cost. One commit fewer
        // per sleep (a woken instance that finishes costs two instead of three).
        state.defer(vec![
            state.log(LogKind::SleepComplete, Some(&key), json!({})),
            cairn_store::Write::Step(done),
        ]);
        Ok(())
    }
    .instrument(span)
    .await
}
