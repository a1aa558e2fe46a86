//! `step.wait_for_event`: wait for an event sent to the instance, with a timeout.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cairn_core::{
    DurationError, ErrorInfo, EventType, LogKind, StepKey, StepKind, StepRecord, StepState,
    Timestamp,
};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::Instrument;

use crate::failure::{ERROR, INTERNAL, TIMEOUT, WorkflowError};
use crate::lifetime::Lifetime;
use crate::ops::WorkflowStep;
use crate::ops::sleep::{IntoDuration, MAX_SLEEP};

/// The default `wait_for_event` timeout: 24 hours.
pub const DEFAULT_EVENT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The shortest allowed timeout.
pub(crate) const MIN_EVENT_TIMEOUT: Duration = Duration::from_secs(1);

/// An event as a wait receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEvent<T> {
    /// The payload sent.
    pub payload: T,
    /// When it was sent.
    pub timestamp: Timestamp,
    /// Its type.
    #[serde(rename = "type")]
    pub event_type: EventType,
}

type Started<T> = BoxFuture<'static, Result<StepEvent<T>, WorkflowError>>;
type Start<T> = Box<dyn FnOnce(Result<Duration, DurationError>) -> Started<T> + Send>;

/// A `step.wait_for_event` op; set its timeout with [`WaitOp::timeout`].
///
/// # Cancel safety
/// Dropping it loses nothing: an event is consumed only in the same commit that records it
/// as the wait's result.
#[must_use = "a wait does nothing unless awaited"]
pub struct WaitOp<T> {
    timeout: Result<Duration, DurationError>,
    start: Option<Start<T>>,
    running: Option<Started<T>>,
    _payload: PhantomData<fn() -> T>,
}

impl<T> WaitOp<T> {
    /// How long to wait before failing with `WorkflowTimeoutError` (1 second to 365 days;
    /// 24 hours by default). A `Duration` or a string like `"1 day"`.
    pub fn timeout(mut self, timeout: impl IntoDuration) -> Self {
        self.timeout = timeout.into_duration();
        self
    }
}

impl<T> Future for WaitOp<T> {
    type Output = Result<StepEvent<T>, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _engine = crate::panic::EngineCode::enter();
        let this = self.get_mut();
        if let Some(start) = this.start.take() {
            let timeout = std::mem::replace(&mut this.timeout, Ok(DEFAULT_EVENT_TIMEOUT));
            this.running = Some(start(timeout));
        }
        match this.running.as_mut() {
            Some(running) => running.as_mut().poll(cx),
            None => Poll::Ready(Err(WorkflowError::new(
                INTERNAL,
                "wait polled after completion",
            ))),
        }
    }
}

impl WorkflowStep {
    /// Waits for an event of `event_type` sent to this instance, returning it with its
    /// payload decoded as `T`. Events sent earlier (even before the instance started) are
    /// buffered per type and taken first in, first out. Consuming an event and recording it
    /// as this wait's result are one commit: each event is delivered once. A timeout is
    /// cached like any final outcome. While waiting, the instance may hibernate.
    pub fn wait_for_event<T>(
        &self,
        name: impl Into<String>,
        event_type: impl Into<String>,
    ) -> WaitOp<T>
    where
        T: DeserializeOwned + Send + 'static,
    {
        let state = Arc::clone(&self.lifetime);
        let key = self.lifetime.claim(StepKind::WaitForEvent, name.into());
        let event_type = EventType::new(event_type.into());
        // Which of the instance's waits for this type it is, for a test's mocked events.
        let ordinal = match (&state.env.hooks, &event_type) {
            (Some(_), Ok(t)) => self.lifetime.wait_ordinal(t),
            _ => 0,
        };
        WaitOp {
            timeout: Ok(DEFAULT_EVENT_TIMEOUT),
            start: Some(Box::new(move |timeout| {
                Box::pin(async move {
                    let event_type =
                        event_type.map_err(|e| WorkflowError::new(ERROR, e.to_string()))?;
                    state.pause_gate().await;
                    // Armed from the wait's start until the workflow has its outcome: past
                    // the pause gate after it too, where a wait that has taken its event
                    // may still be dropped (a `select!` another branch wins on resume).
                    let mut armed = None;
                    let result = wait(
                        Arc::clone(&state),
                        key?,
                        event_type,
                        timeout,
                        ordinal,
                        &mut armed,
                    )
                    .await;
                    state.pause_gate().await;
                    if let Some(armed) = armed {
                        armed.finished();
                    }
                    result
                })
            })),
            running: None,
            _payload: PhantomData,
        }
    }
}

fn decode<T: DeserializeOwned>(key: &StepKey, json: &str) -> Result<StepEvent<T>, WorkflowError> {
    // `T`'s Deserialize impl is user code.
    crate::panic::from_json(json).map_err(|e| {
        WorkflowError::new(
            INTERNAL,
            format!(
                "the event received by wait \"{}\" does not decode as the expected type: {e}",
                key.target()
            ),
        )
    })
}

async fn wait<T: DeserializeOwned>(
    state: Arc<Lifetime>,
    key: StepKey,
    event_type: EventType,
    timeout: Result<Duration, DurationError>,
    ordinal: usize,
    armed: &mut Option<super::abandoned::Waiting>,
) -> Result<StepEvent<T>, WorkflowError> {
    if state.registering() {
        // Replaying only to register rollback handlers: a finished wait answers from the
        // journal; anything else consumes nothing and never returns.
        return match state.take_record(&key) {
            Some(rec) if rec.state == StepState::Succeeded => {
                decode(&key, rec.output.as_deref().unwrap_or("null"))
                    .inspect_err(|e| state.note_mismatch(&key, e.message().to_owned()))
            }
            Some(rec) if rec.state == StepState::Failed => Err(WorkflowError::from_info(
                rec.error
                    .unwrap_or_else(|| ErrorInfo::new(TIMEOUT, "wait failed")),
            )),
            Some(_) => std::future::pending().await,
            None => {
                state.note_new_work(&key);
                std::future::pending().await
            }
        };
    }
    let mut activity = state.activity();
    let mut record = match state.take_record(&key) {
        Some(rec) if rec.state == StepState::Succeeded => {
            return decode(&key, rec.output.as_deref().unwrap_or("null"));
        }
        Some(rec) if rec.state == StepState::Failed => {
            return Err(WorkflowError::from_info(
                rec.error
                    .unwrap_or_else(|| ErrorInfo::new(TIMEOUT, "wait failed")),
            ));
        }
        // It lost a `select!`: it never finishes, so the race goes the same way again.
        // Parked, it is not activity (the instance may hibernate).
        Some(rec) if rec.state == StepState::Cancelled => {
            drop(activity);
            return std::future::pending().await;
        }
        Some(rec) => {
            *armed = Some(super::abandoned::Waiting::new(
                &state,
                &rec,
                LogKind::WaitComplete,
            ));
            rec
        }
        None => {
            let timeout = timeout.map_err(|e| WorkflowError::new(ERROR, e.to_string()))?;
            if !(MIN_EVENT_TIMEOUT..=MAX_SLEEP).contains(&timeout) {
                return Err(WorkflowError::new(
                    ERROR,
                    format!(
                        "wait_for_event \"{}\" timeout of {} ms is out of range (1 second to 365 days)",
                        key.name,
                        timeout.as_millis()
                    ),
                ));
            }
            let now = state.now();
            if let Some(payload) = state
                .env
                .hooks
                .as_ref()
                .and_then(|h| h.mocked_event(state.who(), &event_type, ordinal))
                && !timeout_forced(&state, &key)
            {
                return mocked(&state, key, &event_type, timeout, &payload).await;
            }
            let record = StepRecord {
                key: key.clone(),
                seq: state.next_seq(),
                state: StepState::Running,
                config: json!({ "timeout": cairn_core::format_duration(timeout) }).into(),
                attempts: 0,
                in_flight: false,
                wake_at: Some(now.saturating_add(timeout)),
                output: None,
                error: None,
                started_at: now,
                ended_at: None,
                has_rollback: false,
            };
            // Armed before the start is sent: dropped while it is on its way, the cancel
            // goes with the next commit (one that lands first finds nothing to cancel).
            *armed = Some(super::abandoned::Waiting::new(
                &state,
                &record,
                LogKind::WaitComplete,
            ));
            state
                .commit(vec![
                    state.log(
                        LogKind::WaitStart,
                        Some(&key),
                        json!({ "event": event_type }),
                    ),
                    cairn_store::Write::Step(record.clone()),
                ])
                .await;
            record
        }
    };
    // A span for the part of the wait this lifetime spends (a hibernated wait has one per
    // lifetime); a wait answered from the journal has none.
    let span = tracing::info_span!(
        "step.wait_for_event",
        step.name = %key.name,
        step.count = key.count,
        event_type = %event_type,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let result = async {
        let deadline = record.wake_at.unwrap_or_else(|| state.now());
        // At the deadline, one last look: an event that landed just before it (its notice late
        // or lost, say from another engine) is delivered rather than left behind a timeout.
        let mut last_look = false;
        // A test forced this wait to time out (`cairn::testing`): no event is taken.
        if !timeout_forced(&state, &key) {
            loop {
                // Listen before looking, so an event sent in between is not missed.
                let arrived = state.events.notified();
                let mut arrived = std::pin::pin!(arrived);
                arrived.as_mut().enable();
                if let Some(event) = state.take_event(&key, &event_type).await {
                    let object = json!({
                        "payload": serde_json::from_str::<serde_json::Value>(&event.payload).unwrap_or_default(),
                        "timestamp": event.at,
                        "type": event.event_type,
                    });
                    return decode(&key, &object.to_string());
                }
                if last_look || state.now() >= deadline {
                    break;
                }
                if !activity
                    .wait(deadline, Some(event_type.clone()), arrived)
                    .await
                {
                    last_look = true;
                }
            }
        }
        // The timeout the wait was given, as stored when it started: a pause moves the
        // deadline by the time paused, which is no part of it.
        let timeout_ms = record.config["timeout"]
            .as_str()
            .and_then(|t| cairn_core::parse_duration(t).ok())
            .unwrap_or_else(|| deadline.since(record.started_at))
            .as_millis();
        let error = ErrorInfo::new(TIMEOUT, format!("Execution timed out after {timeout_ms}ms"));
        record.state = StepState::Failed;
        record.wake_at = None;
        record.error = Some(error.clone());
        record.ended_at = Some(state.now());
        state
            .commit(vec![
                state.log(
                    LogKind::WaitTimedOut,
                    Some(&key),
                    serde_json::to_value(&error).unwrap_or_default(),
                ),
                cairn_store::Write::Step(record),
            ])
            .await;
        Err(WorkflowError::from_info(error))
    }
    .instrument(span.clone())
    .await;
    match &result {
        Ok(_) => span.record("outcome", "received"),
        Err(e) if e.name() == TIMEOUT => span.record("outcome", "timeout"),
        // The event arrived but does not decode as the type the code expects.
        Err(_) => span
            .record("outcome", "error")
            .record("otel.status_code", "ERROR"),
    };
    result
}

/// Whether a test forced the wait `key` to time out.
fn timeout_forced(state: &Lifetime, key: &StepKey) -> bool {
    state
        .env
        .hooks
        .as_ref()
        .is_some_and(|h| h.event_timeout_forced(state.who(), key))
}

/// A wait that receives a test's mocked event (`cairn::testing`): started and completed in
/// one commit, with the records a delivered event leaves.
async fn mocked<T: DeserializeOwned>(
    state: &Lifetime,
    key: StepKey,
    event_type: &EventType,
    timeout: Duration,
    payload: &str,
) -> Result<StepEvent<T>, WorkflowError> {
    let now = state.now();
    let mut object = json!({
        "payload": serde_json::from_str::<serde_json::Value>(payload).unwrap_or_default(),
        "timestamp": now,
        "type": event_type,
    });
    let output = object.to_string();
    // Logs show byte sequences as their size.
    cairn_core::binary::summarise(&mut object);
    let record = StepRecord {
        key: key.clone(),
        seq: state.next_seq(),
        state: StepState::Succeeded,
        config: json!({ "timeout": cairn_core::format_duration(timeout) }).into(),
        attempts: 0,
        in_flight: false,
        wake_at: None,
        output: Some(output.clone()),
        error: None,
        started_at: now,
        ended_at: Some(now),
        has_rollback: false,
    };
    state
        .commit(vec![
            state.log(
                LogKind::WaitStart,
                Some(&key),
                json!({ "event": event_type }),
            ),
            state.log(LogKind::WaitComplete, Some(&key), object),
            cairn_store::Write::Step(record),
        ])
        .await;
    decode(&key, &output)
}
