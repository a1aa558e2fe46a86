//! The attempt loop every `step.run` and every rollback handler runs: look the step up,
//! run attempts with retries and timeouts, record each outcome, and record a step the
//! workflow dropped as cancelled.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use cairn_core::{
    DEFAULT_RETRY_DELAY, ErrorInfo, LogKind, REDACTED, ResolvedConfig, RetryDelay, StepKey,
    StepKind, StepRecord, StepState, parse_duration,
};
use futures::future::{BoxFuture, Either, select};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::config::{DelayContext, DelayFn, DelayValue, StepConfig};
use crate::context::{StepContext, StepId};
use crate::failure::{DELAY_FAILED, INTERNAL, StepError, TIMEOUT, WorkflowError};
use crate::hooks::{BodyRun, Forced};
use crate::lifetime::Lifetime;
use crate::ops::handler::Handler;
use crate::telemetry::AttemptOutcome;
use tracing::Instrument;

/// The config a first attempt persists for `resolved` (marked as a stream step's when
/// `stream`), and what reading it back gives (`resolved` should it not read back). A pure
/// function of its arguments, remembered for the last ones on this thread: a workflow's
/// steps mostly share one config, and building the JSON and parsing it back was a few per
/// cent of a no-op step's CPU. The persisted form is shared, not copied, by every record
/// that holds it.
fn persisted_config(
    resolved: ResolvedConfig,
    stream: bool,
) -> (Arc<serde_json::Value>, ResolvedConfig) {
    type Last = Option<(ResolvedConfig, bool, Arc<serde_json::Value>, ResolvedConfig)>;
    thread_local! {
        static LAST: std::cell::RefCell<Last> = const { std::cell::RefCell::new(None) };
    }
    let remembered = LAST.with(|last| match &*last.borrow() {
        Some((r, s, persisted, read)) if *r == resolved && *s == stream => {
            Some((persisted.clone(), *read))
        }
        _ => None,
    });
    if let Some(found) = remembered {
        return found;
    }
    let mut persisted = resolved.to_persisted_json();
    if stream && let Some(map) = persisted.as_object_mut() {
        map.insert("stream".into(), true.into());
    }
    let read = ResolvedConfig::from_persisted_json(&persisted).unwrap_or(resolved);
    let persisted = Arc::new(persisted);
    LAST.with(|last| *last.borrow_mut() = Some((resolved, stream, persisted.clone(), read)));
    (persisted, read)
}

/// How long a delay function may take.
const DELAY_FN_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Execution {
    state: Arc<Lifetime>,
    config: StepConfig,
    pub(crate) rollback: Option<Handler>,
    /// The records this execution writes: a step's or a rollback's.
    kinds: &'static LogKinds,
    /// An attempt of this execution is in flight (counted in `Lifetime::in_flight`).
    attempt_open: std::sync::atomic::AtomicBool,
    /// The step's record while it is in progress (an attempt running, or waiting to retry):
    /// what a drop records as cancelled.
    running: std::sync::Mutex<Option<StepRecord>>,
    /// A stream step (`ops/stream.rs`): its output is chunks its attempt wrote; a failure
    /// drops them, a success drops every other attempt's.
    pub(crate) stream: bool,
}

impl Drop for Execution {
    /// An execution dropped with its attempt in flight gives its count back, so a later
    /// pause is not held up by it. If the workflow dropped it (the op lost a `select!`;
    /// the lifetime itself goes on), the step is recorded as cancelled with this lifetime's
    /// next commit, instead of looking like an attempt a crash interrupted.
    fn drop(&mut self) {
        if *self.attempt_open.get_mut() {
            self.state.attempt_ended();
        }
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(mut record) = running.filter(|r| r.key.kind == StepKind::Run) else {
            return;
        };
        let key = record.key.clone();
        let state = &self.state;
        let mut records = Vec::with_capacity(2);
        let error = if record.in_flight {
            // Counted as cancelled when this write is committed (`Lifetime::commit_now`).
            let error = ErrorInfo::new(
                crate::failure::CANCELLED,
                format!(
                    "The workflow stopped awaiting step {} while attempt {} was running (for example, it lost a select!).",
                    key.target(),
                    record.attempts
                ),
            );
            records.push(state.log_entry(
                LogKind::AttemptFailure,
                Some(&key),
                json!({ "attempt": record.attempts, "error": error, "cancelled": true }),
            ));
            error
        } else {
            ErrorInfo::new(
                crate::failure::CANCELLED,
                format!(
                    "The workflow stopped awaiting step {} while it waited to retry after attempt {}.",
                    key.target(),
                    record.attempts
                ),
            )
        };
        record.state = StepState::Cancelled;
        record.in_flight = false;
        record.wake_at = None;
        record.ended_at = Some(state.now());
        record.error = Some(error.clone());
        records.push(state.log_entry(
            LogKind::StepFailure,
            Some(&key),
            json!({ "error": error, "cancelled": true }),
        ));
        // Conditional: if the step's outcome commit was already on its way when the op was
        // dropped and lands first, that outcome stands.
        state.defer(vec![cairn_store::Write::Cancel {
            step: record,
            records,
        }]);
    }
}

/// The lifecycle records an attempt loop writes: a step's or a rollback's.
pub(crate) struct LogKinds {
    pub(crate) step_start: LogKind,
    pub(crate) attempt_start: LogKind,
    pub(crate) attempt_success: LogKind,
    pub(crate) attempt_failure: LogKind,
    pub(crate) step_success: LogKind,
    pub(crate) step_failure: LogKind,
}

const RUN_KINDS: LogKinds = LogKinds {
    step_start: LogKind::StepStart,
    attempt_start: LogKind::AttemptStart,
    attempt_success: LogKind::AttemptSuccess,
    attempt_failure: LogKind::AttemptFailure,
    step_success: LogKind::StepSuccess,
    step_failure: LogKind::StepFailure,
};

/// How one attempt ended.
enum Outcome {
    Success(String),
    Failure(ErrorInfo, bool),
}

impl Execution {
    fn attempt_begin(&self) {
        self.state.attempt_started();
        self.attempt_open
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn attempt_finish(&self) {
        self.set_running(None);
        if self
            .attempt_open
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.state.attempt_ended();
        }
    }

    fn set_running(&self, record: Option<&StepRecord>) {
        *self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = record.cloned();
    }

    pub(crate) fn new(state: Arc<Lifetime>, config: StepConfig) -> Self {
        Execution {
            state,
            config,
            rollback: None,
            kinds: &RUN_KINDS,
            attempt_open: std::sync::atomic::AtomicBool::new(false),
            running: std::sync::Mutex::new(None),
            stream: false,
        }
    }

    /// Runs the op between two pause gates: while a pause is pending it neither starts nor
    /// hands its result back (the code after a completed step does not proceed). In a
    /// rollback-registration replay it only registers its handler and returns a stored
    /// outcome; anything else waits forever (the replay is dropped).
    ///
    /// `&mut self`, not `self`, here and in [`Execution::execute_with`]: an `async fn`
    /// keeps a by-value argument twice in its future (as argument and as local), and each
    /// step's future is one allocation. The caller owns the execution, whose `Drop` records
    /// a dropped step as cancelled.
    pub(crate) async fn execute<T, F, Fut>(
        &mut self,
        key: StepKey,
        body: F,
    ) -> Result<T, WorkflowError>
    where
        F: FnMut(StepContext) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
        T: Serialize + DeserializeOwned,
    {
        let state = Arc::clone(&self.state);
        if state.registering() {
            if let Some(outcome) = registered_outcome(&state, &key) {
                return outcome;
            }
            return std::future::pending().await;
        }
        state.pause_gate().await;
        let result = self.execute_with(key, body, &RUN_KINDS).await;
        state.pause_gate().await;
        result
    }

    /// The attempt loop: look the step up, run attempts with retries and timeouts, and
    /// record each outcome with `kinds`' records.
    pub(crate) async fn execute_with<T, F, Fut>(
        &mut self,
        key: StepKey,
        mut body: F,
        kinds: &'static LogKinds,
    ) -> Result<T, WorkflowError>
    where
        F: FnMut(StepContext) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
        T: Serialize + DeserializeOwned,
    {
        self.kinds = kinds;
        let mut activity = self.state.activity();
        let state = &*self.state;
        let (overrides, delay_fn) = self.config.overrides();
        let resolved = overrides
            .resolve_over(ResolvedConfig::default())
            .map_err(|e| {
                WorkflowError::new(
                    crate::failure::ERROR,
                    format!(
                        "Step config for \"{}\" is in a invalid format: {e}",
                        key.name
                    ),
                )
            })?;

        // `None` for a step that lost a race last time: it never completes, so the race
        // goes the same way again. (No record is held across that wait.)
        let found = match state.take_record(&key) {
            Some(rec) if rec.state == StepState::Succeeded => return decode(&key, &rec),
            Some(rec) if rec.state == StepState::Cancelled => None,
            Some(rec) if rec.state == StepState::Failed => {
                return Err(WorkflowError::from_info(
                    rec.error
                        .unwrap_or_else(|| ErrorInfo::new(INTERNAL, "step failed")),
                ));
            }
            found => Some(found),
        };
        let Some(found) = found else {
            // Parked, it is not activity (the instance may hibernate).
            drop(activity);
            return std::future::pending().await;
        };
        // A span for the work this lifetime does on the step, its first commit included; a
        // step answered from the journal (above) has none, so a replay reports no attempt
        // twice.
        let span = if self.is_rollback() {
            tracing::info_span!("step.rollback", step.name = %key.name, step.count = key.count, outcome = tracing::field::Empty, otel.status_code = tracing::field::Empty)
        } else {
            tracing::info_span!("step.do", step.name = %key.name, step.count = key.count, outcome = tracing::field::Empty, otel.status_code = tracing::field::Empty)
        };
        let result = async {
            // `loaded`: the record comes from the journal, written by an earlier lifetime.
            // The config persisted at the first execution wins: changing code does not
            // change a step already in progress. A first attempt obeys what it persists, as
            // read back, so a replay obeys the same.
            let (record, loaded, config) = match found {
                Some(rec) => {
                    let config =
                        ResolvedConfig::from_persisted_json(&rec.config).unwrap_or(resolved);
                    (rec, true, config)
                }
                None => {
                    let (rec, config) = self.start_first_attempt(&key, resolved).await;
                    (rec, false, config)
                }
            };
            self.attempts(
                &key,
                &mut body,
                record,
                loaded,
                config,
                delay_fn,
                &mut activity,
            )
            .await
        }
        .instrument(span.clone())
        .await;
        if result.is_ok() {
            span.record("outcome", "success");
        } else {
            span.record("outcome", "error");
            span.record("otel.status_code", "ERROR");
        }
        result
    }

    /// A `STEP_START`'s `meta`. A step's leaves its configuration out: it is stored, and
    /// read back, with the step's row committed beside it (`Write::Log`); a copy of it in
    /// every step's commit cost ~7 % of the engine's instructions. A rollback handler's
    /// start (rare) carries its own.
    fn start_meta(&self, persisted: &serde_json::Value) -> serde_json::Value {
        let has_rollback = ("hasRollback".to_owned(), self.rollback.is_some().into());
        serde_json::Value::Object(if self.is_rollback() {
            // A clone of the map, not `json!`'s serialisation of it.
            serde_json::Map::from_iter([("config".to_owned(), persisted.clone()), has_rollback])
        } else {
            serde_json::Map::from_iter([has_rollback])
        })
    }

    /// Whether this execution runs a rollback handler rather than a step.
    fn is_rollback(&self) -> bool {
        self.kinds.step_start != LogKind::StepStart
    }

    /// Counts one attempt of this execution's step that ended with `outcome`.
    fn count_attempt(&self, key: &StepKey, outcome: AttemptOutcome, ran: Option<Duration>) {
        crate::telemetry::attempt(
            self.state.env.seen(),
            &self.state.workflow,
            &key.name,
            self.is_rollback(),
            outcome,
            ran,
        );
    }

    /// Runs the step's attempts from `record` (`loaded` from the journal, or just started)
    /// until one succeeds or the step fails for good.
    #[allow(clippy::too_many_arguments)]
    async fn attempts<T, F, Fut>(
        &self,
        key: &StepKey,
        body: &mut F,
        mut record: StepRecord,
        loaded: bool,
        config: ResolvedConfig,
        delay_fn: Option<DelayFn>,
        activity: &mut crate::lifetime::Activity,
    ) -> Result<T, WorkflowError>
    where
        F: FnMut(StepContext) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
        T: Serialize + DeserializeOwned,
    {
        let key = key.clone();
        let state = &*self.state;
        // In progress from here on: dropped by the workflow, it is cancelled. (A record
        // just started is in progress already, since its start was queued.)
        if loaded {
            self.set_running(Some(&record));
        }

        if loaded && record.in_flight {
            // The lifetime that ran this attempt died before recording its outcome: the
            // attempt failed and counts (SPEC Part A.7).
            let error = ErrorInfo::new(INTERNAL, crate::failure::INTERRUPTED);
            // Recording its outcome ends it, like any attempt in flight.
            self.attempt_begin();
            let failed = self
                .record_failure(&key, &mut record, &config, delay_fn.as_ref(), error, true)
                .await;
            self.count_attempt(&key, AttemptOutcome::Interrupted, None);
            failed?;
            self.set_running(Some(&record));
        }

        loop {
            if !record.in_flight {
                if let Some(wake_at) = record.wake_at {
                    // A retry back-off: a durable wait the instance may hibernate through.
                    activity
                        .wait(wake_at, None, std::future::pending::<()>())
                        .await;
                }
                self.start_next_attempt(&key, &mut record).await;
                self.set_running(Some(&record));
            }
            let ctx = StepContext::new(
                StepId {
                    name: key.name.clone(),
                    count: key.count,
                },
                record.attempts,
                config,
                state.idempotency_prefix(),
            );
            let began = std::time::Instant::now();
            let span = tracing::info_span!(
                "step.attempt",
                attempt = record.attempts,
                outcome = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            );
            let forced = self.forced(&key, record.attempts);
            self.report_run(&key, record.attempts, forced.is_some());
            let (outcome, timed_out) = match forced {
                Some(forced) => {
                    forced_outcome::<T>(&key, forced, &config, state.env.limits.payload_limit)
                }
                None => self.run_body(&key, body, ctx, &config, &span).await,
            };
            let ran = Some(began.elapsed());
            match outcome {
                Outcome::Success(json) => {
                    let decoded = decode_json(&key, &json);
                    // The record's last use: its success's write takes it.
                    self.record_success(&key, record, &config, json);
                    span.record("outcome", "success");
                    self.count_attempt(&key, AttemptOutcome::Success, ran);
                    return decoded;
                }
                Outcome::Failure(error, retryable) => {
                    let outcome = if timed_out {
                        AttemptOutcome::Timeout
                    } else {
                        AttemptOutcome::Error
                    };
                    let failed = self
                        .record_failure(
                            &key,
                            &mut record,
                            &config,
                            delay_fn.as_ref(),
                            error,
                            retryable,
                        )
                        .await;
                    span.record("outcome", outcome.as_str());
                    span.record("otel.status_code", "ERROR");
                    self.count_attempt(&key, outcome, ran);
                    failed?;
                    // Waiting to retry: still in progress, so a drop now cancels it too.
                    self.set_running(Some(&record));
                }
            }
        }
    }

    /// For a stream step, the write that drops what its failed attempt wrote (no attempt
    /// of a step that has not succeeded holds an output).
    fn drop_chunks(&self, key: &StepKey) -> Option<cairn_store::Write> {
        self.stream.then(|| cairn_store::Write::DropChunks {
            step: key.clone(),
            keep: None,
        })
    }

    /// The commit carrying [`Self::drop_chunks`] has landed: the storage limit stops
    /// counting what the failed attempt's stream took in.
    fn chunks_dropped(&self, key: &StepKey) {
        if self.stream {
            self.state.stream_dropped(key);
        }
    }

    /// What a test's hooks make this attempt do instead of running the body (never for a
    /// rollback handler).
    fn forced(&self, key: &StepKey, attempt: u32) -> Option<Forced> {
        let state = &*self.state;
        let hooks = state.env.hooks.as_ref()?;
        if self.is_rollback() {
            return None;
        }
        let forced = hooks.attempt(state.who(), key, attempt)?;
        if self.stream && matches!(forced, Forced::Result(_)) {
            // Mocked bytes are written as the stream, by the stream op's body.
            return None;
        }
        Some(forced)
    }

    /// Tells a test's hooks that the body of `key` (or a mock standing in for it) runs for
    /// `attempt`.
    fn report_run(&self, key: &StepKey, attempt: u32, mocked: bool) {
        let state = &*self.state;
        if let Some(hooks) = &state.env.hooks {
            hooks.body_ran(BodyRun {
                workflow: state.workflow.clone(),
                instance: state.instance_id.clone(),
                step: key.clone(),
                attempt,
                rollback: self.is_rollback(),
                mocked,
            });
        }
    }

    /// Runs one attempt of the body against the step's timeout: its outcome, and whether
    /// the timeout ended it.
    async fn run_body<T, F, Fut>(
        &self,
        key: &StepKey,
        body: &mut F,
        ctx: StepContext,
        config: &ResolvedConfig,
        span: &tracing::Span,
    ) -> (Outcome, bool)
    where
        F: FnMut(StepContext) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
        T: Serialize + DeserializeOwned,
    {
        let state = &*self.state;
        // A panic while the body builds its future is an attempt failure too.
        let mut attempt = std::pin::pin!(
            crate::panic::guarded(|| span.in_scope(|| body(ctx))).instrument(span.clone())
        );
        // Counted from once the body has built its future, as always.
        let deadline = state.env.clock.now().saturating_add(config.timeout);
        // The timeout's timer is set only once the body is pending: a body that is done
        // in its first poll (most are, or are waiting on I/O by then) costs no timer, whose
        // setting and cancelling on the runtime's timer wheel was ~2 % of a no-op step. It
        // runs out at the same `deadline` either way, and the body wins a tie, as before.
        let mut timer = None;
        let timed = std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = attempt.as_mut().poll(cx) {
                return Poll::Ready(Either::Left(done));
            }
            timer
                .get_or_insert_with(|| state.env.clock.sleep_until(deadline))
                .as_mut()
                .poll(cx)
                .map(Either::Right)
        })
        .await;
        let timed_out = matches!(timed, Either::Right(()));
        let outcome = match timed {
            Either::Left(Ok(Ok(value))) => {
                // A stream step's output is its meta: its bytes are exempt from the limit.
                let limit = if self.stream {
                    usize::MAX
                } else {
                    state.env.limits.payload_limit
                };
                value_outcome(key, &value, limit)
            }
            Either::Left(Ok(Err(e))) => Outcome::Failure(e.info, e.retryable),
            Either::Left(Err(panic)) => Outcome::Failure(
                ErrorInfo::new(
                    crate::failure::ERROR,
                    format!("the step body panicked: {}", crate::panic::message(&*panic)),
                ),
                true,
            ),
            Either::Right(()) => Outcome::Failure(timeout_error(config.timeout), true),
        };
        (outcome, timed_out)
    }

    /// Starts the step's first attempt: its record, and the config it obeys (what it
    /// persists, read back).
    async fn start_first_attempt(
        &self,
        key: &StepKey,
        resolved: ResolvedConfig,
    ) -> (StepRecord, ResolvedConfig) {
        let kinds = self.kinds;
        let state = &*self.state;
        // No new attempt starts while a pause is pending, nor before the instance's first
        // start has landed (a step started beside the first one waits for it here, before
        // it counts as in progress: dropped meanwhile, it has started nothing to cancel).
        state.pause_gate().await;
        // Its place in the start order is taken before that wait, in the order the code
        // started its steps; on a worker, the waiting ones queue their starts in that order.
        let seq = state.next_seq();
        let turn = state.start_in_turn(seq).await;
        // A pause learnt (or a shutdown begun) while it waited for the first start, or for
        // its turn, holds it at the gate too: no new attempt starts under a pause. It keeps
        // its turn meanwhile, so that on a worker the later ones still start after it.
        state.pause_gate().await;
        self.attempt_begin();
        let now = state.now();
        let (persisted, config) = persisted_config(resolved, self.stream);
        let record = StepRecord {
            key: key.clone(),
            seq,
            state: StepState::Running,
            config: Arc::clone(&persisted),
            attempts: 1,
            in_flight: true,
            wake_at: None,
            output: None,
            error: None,
            started_at: now,
            ended_at: None,
            has_rollback: self.rollback.is_some(),
        };
        // In progress from the moment its start is queued (in the commit's first poll): an
        // op dropped while that start is on its way, or while its answer waits for earlier
        // commits (`Lifetime::commit_now`), is recorded as cancelled, not left running.
        self.set_running(Some(&record));
        let mut commit = std::pin::pin!(state.commit(vec![
            state.log_at(
                kinds.step_start,
                Some(key),
                self.start_meta(&persisted),
                now,
            ),
            state.log_at(kinds.attempt_start, Some(key), json!({ "attempt": 1 }), now),
            cairn_store::Write::Step(record.clone()),
        ]));
        // Its first poll queues the start (the first start has landed): the next step
        // started beside this one may queue its own from then on, after it.
        let queued = futures::poll!(commit.as_mut());
        drop(turn);
        if queued.is_pending() {
            commit.await;
        }
        (record, config)
    }

    async fn start_next_attempt(&self, key: &StepKey, record: &mut StepRecord) {
        let kinds = self.kinds;
        let state = &*self.state;
        state.pause_gate().await;
        self.attempt_begin();
        record.attempts += 1;
        record.in_flight = true;
        record.wake_at = None;
        // In progress from the moment its start is queued, as a first attempt is: an op
        // dropped while this start is on its way is recorded as cancelled at this attempt,
        // not at the last one (which left this attempt's start without an outcome).
        self.set_running(Some(record));
        state
            .commit(vec![
                state.log(
                    kinds.attempt_start,
                    Some(key),
                    json!({ "attempt": record.attempts }),
                ),
                cairn_store::Write::Step(record.clone()),
            ])
            .await;
    }

    fn record_success(
        &self,
        key: &StepKey,
        mut record: StepRecord,
        config: &ResolvedConfig,
        json: String,
    ) {
        let kinds = self.kinds;
        let state = &*self.state;
        let now = state.now();
        let shown = if self.stream {
            crate::ops::stream_meta::stream_view(&json, config.sensitive)
        } else if config.sensitive {
            serde_json::Value::from(REDACTED)
        } else {
            cairn_core::binary::view(&json)
        };
        let attempt = record.attempts;
        record.state = StepState::Succeeded;
        record.in_flight = false;
        record.output = Some(json);
        record.ended_at = Some(now);
        let mut writes = vec![
            state.log_at(
                kinds.attempt_success,
                Some(key),
                json!({ "attempt": attempt }),
                now,
            ),
            state.log_at(
                kinds.step_success,
                Some(key),
                json!({ "result": shown }),
                now,
            ),
            cairn_store::Write::Step(record),
        ];
        if self.stream {
            // The output is this attempt's chunks: any other attempt's are garbage.
            writes.push(cairn_store::Write::DropChunks {
                step: key.clone(),
                keep: Some(attempt),
            });
        }
        // Not a commit of its own: the success rides with the lifetime's next commit,
        // which comes before anything the output can lead to. Code that goes on to the
        // next op (a step's or a retry's start, a sleep, a wait, an invoke) commits it
        // with that op's start, before the op's body runs; code that returns commits it
        // with the instance's end; code that awaits anything else is pending, and the
        // driver commits it then (its flush, `engine/driver.rs`). Until then it is an
        // attempt whose outcome is not recorded: a crash runs it again, as it would have
        // a moment earlier (SPEC A.7). One commit per sequential step instead of two.
        state.defer(writes);
        self.attempt_finish();
    }

    /// Records a failed attempt. Returns `Ok` when another attempt is scheduled (the record
    /// then holds its wake time) and the step's final error otherwise.
    ///
    /// Boxed: a failure is the rare path, and its future (a delay function's call, a
    /// commit) would otherwise enlarge every step's future, which is one allocation.
    fn record_failure<'a>(
        &'a self,
        key: &'a StepKey,
        record: &'a mut StepRecord,
        config: &'a ResolvedConfig,
        delay_fn: Option<&'a DelayFn>,
        error: ErrorInfo,
        retryable: bool,
    ) -> BoxFuture<'a, Result<(), WorkflowError>> {
        Box::pin(async move {
            let kinds = self.kinds;
            let state = &*self.state;
            let attempt = record.attempts;
            let mut final_error = error.clone();
            if retryable && config.will_retry(attempt) {
                let no_delay = state
                    .env
                    .hooks
                    .as_ref()
                    .is_some_and(|h| h.retry_delay_disabled(state.who(), key));
                let base = if no_delay {
                    Ok(Duration::ZERO)
                } else {
                    self.base_delay(key, record, config, delay_fn, &error).await
                };
                match base {
                    Ok(base) => {
                        let wait = if no_delay {
                            Duration::ZERO
                        } else {
                            config.retry_wait(base, attempt)
                        };
                        record.in_flight = false;
                        record.wake_at = Some(state.now().saturating_add(wait));
                        let mut writes = vec![
                            state.log(
                                kinds.attempt_failure,
                                Some(key),
                                json!({ "attempt": attempt, "error": error, "retryDelayMs": wait.as_millis() as u64 }),
                            ),
                            cairn_store::Write::Step(record.clone()),
                        ];
                        writes.extend(self.drop_chunks(key));
                        state.commit(writes).await;
                        self.chunks_dropped(key);
                        self.attempt_finish();
                        tracing::info!(
                            workflow = %state.workflow,
                            instance = %state.instance_id,
                            step = %key.name,
                            count = key.count,
                            attempt,
                            error.name = %error.name,
                            error.message = %error.message,
                            retry_in_ms = wait.as_millis() as u64,
                            "attempt failed; retrying"
                        );
                        return Ok(());
                    }
                    Err(delay_error) => final_error = delay_error,
                }
            }
            record.state = StepState::Failed;
            record.in_flight = false;
            record.wake_at = None;
            record.error = Some(final_error.clone());
            record.ended_at = Some(state.now());
            let mut writes = vec![
                state.log(
                    kinds.attempt_failure,
                    Some(key),
                    json!({ "attempt": attempt, "error": error }),
                ),
                state.log(
                    kinds.step_failure,
                    Some(key),
                    json!({ "error": final_error }),
                ),
                cairn_store::Write::Step(record.clone()),
            ];
            writes.extend(self.drop_chunks(key));
            state.commit(writes).await;
            self.chunks_dropped(key);
            self.attempt_finish();
            // The workflow may catch it; if not, the instance's failure is logged at warn.
            tracing::info!(
                workflow = %state.workflow,
                instance = %state.instance_id,
                step = %key.name,
                count = key.count,
                attempts = attempt,
                error.name = %final_error.name,
                error.message = %final_error.message,
                "step failed"
            );
            Err(WorkflowError::from_info(final_error))
        })
    }

    /// The base of the back-off for the retry after `error`: the fixed delay, or the delay
    /// function's answer. A failing delay function is the step's final error.
    async fn base_delay(
        &self,
        key: &StepKey,
        record: &StepRecord,
        config: &ResolvedConfig,
        delay_fn: Option<&DelayFn>,
        error: &ErrorInfo,
    ) -> Result<Duration, ErrorInfo> {
        let state = &*self.state;
        let function = match (config.retries.delay, delay_fn) {
            (RetryDelay::Fixed(d), _) => return Ok(d),
            // The code no longer has the function the step started with: use the default.
            (RetryDelay::Dynamic, None) => return Ok(DEFAULT_RETRY_DELAY),
            (RetryDelay::Dynamic, Some(f)) => f,
        };
        let fail = |what: String| {
            ErrorInfo::new(
                DELAY_FAILED,
                format!("The delay function for step \"{}\" {what}", key.target()),
            )
        };
        let ctx = DelayContext {
            ctx: StepContext::new(
                StepId {
                    name: key.name.clone(),
                    count: key.count,
                },
                record.attempts,
                *config,
                state.idempotency_prefix(),
            ),
            error: error.clone(),
        };
        let call = std::pin::pin!(crate::panic::guarded(|| (function.0)(ctx)));
        match select(call, state.env.clock.sleep(DELAY_FN_TIMEOUT)).await {
            Either::Left((Err(panic), _)) => Err(fail(format!(
                "threw an error: panicked: {}",
                crate::panic::message(&*panic)
            ))),
            Either::Left((Ok(Ok(DelayValue::Duration(d))), _)) => Ok(d),
            Either::Left((Ok(Ok(DelayValue::Text(s))), _)) => parse_duration(&s).map_err(|_| {
                fail("returned an invalid delay value (expected a number of ms or a duration string like \"30 seconds\")".into())
            }),
            Either::Left((Ok(Err(e)), _)) => Err(fail(format!("threw an error: {e}"))),
            Either::Right(((), _)) => Err(fail("did not return within 5 seconds".into())),
        }
    }
}

/// The error of an attempt whose timeout elapsed.
fn timeout_error(timeout: Duration) -> ErrorInfo {
    ErrorInfo::new(
        TIMEOUT,
        format!("Execution timed out after {}ms", timeout.as_millis()),
    )
}

/// The outcome a test's hooks force on an attempt, and whether it counts as a timeout. A
/// mocked result that does not decode as the step's type fails the step, naming the mock.
fn forced_outcome<T: Serialize + DeserializeOwned>(
    key: &StepKey,
    forced: Forced,
    config: &ResolvedConfig,
    payload_limit: usize,
) -> (Outcome, bool) {
    match forced {
        // Decoded as the step's type and encoded again, as a body's value is: the journal
        // holds what the step returned, within the same limit.
        Forced::Result(json) => match crate::panic::from_json::<T>(&json) {
            Ok(value) => (value_outcome(key, &value, payload_limit), false),
            Err(e) => (
                Outcome::Failure(
                    ErrorInfo::new(
                        INTERNAL,
                        format!(
                            "The mocked result of step {} does not decode as the step's type: {e}",
                            key.target()
                        ),
                    ),
                    false,
                ),
                false,
            ),
        },
        Forced::Error(info, retryable) => (Outcome::Failure(info, retryable), false),
        Forced::Timeout => (Outcome::Failure(timeout_error(config.timeout), true), true),
    }
}

/// The outcome of an attempt that returned `value`: its JSON, unless it is over the payload
/// limit or does not serialise (both final failures).
fn value_outcome<T: Serialize>(key: &StepKey, value: &T, payload_limit: usize) -> Outcome {
    match crate::panic::to_json(value) {
        Ok(json) if cairn_core::binary::size(&json) > payload_limit => Outcome::Failure(
            ErrorInfo::new(
                INTERNAL,
                format!(
                    "Step {} output is too large: {} bytes. Maximum allowed size is {} bytes ({}).",
                    key.target(),
                    cairn_core::binary::size(&json),
                    payload_limit,
                    human_bytes(payload_limit)
                ),
            ),
            false,
        ),
        Ok(json) => Outcome::Success(json),
        Err(e) => Outcome::Failure(
            ErrorInfo::new(
                INTERNAL,
                format!(
                    "Value returned from step \"{}\" is not serialisable: {e}",
                    key.name
                ),
            ),
            false,
        ),
    }
}

fn human_bytes(n: usize) -> String {
    if n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// In a rollback-registration replay, the stored outcome of `key`, or `None` for a step
/// that has none (the replay waits there forever and is dropped). A plain function, so no
/// record is held across that wait: the step future stays small.
fn registered_outcome<T: DeserializeOwned>(
    state: &Lifetime,
    key: &StepKey,
) -> Option<Result<T, WorkflowError>> {
    match state.take_record(key) {
        Some(rec) if rec.state == StepState::Succeeded => Some(
            decode(key, &rec).inspect_err(|e| state.note_mismatch(key, e.message().to_owned())),
        ),
        Some(rec) if rec.state == StepState::Failed => Some(Err(WorkflowError::from_info(
            rec.error
                .unwrap_or_else(|| ErrorInfo::new(INTERNAL, "step failed")),
        ))),
        Some(_) => None,
        None => {
            state.note_new_work(key);
            None
        }
    }
}

fn decode<T: DeserializeOwned>(key: &StepKey, record: &StepRecord) -> Result<T, WorkflowError> {
    let json = record.output.as_deref().unwrap_or("null");
    // `T`'s Deserialize impl is user code.
    decode_json(key, json)
}

/// A step's output as the type the code expects (its `Deserialize` impl is user code).
fn decode_json<T: DeserializeOwned>(key: &StepKey, json: &str) -> Result<T, WorkflowError> {
    crate::panic::from_json(json).map_err(|e| decode_error(key, &e))
}

fn decode_error(key: &StepKey, e: &serde_json::Error) -> WorkflowError {
    WorkflowError::new(
        INTERNAL,
        format!(
            "Step \"{}\" has a stored output that does not decode as the type this code expects: {e}",
            key.target()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is remembered is the answer for the arguments asked, never the last ones'.
    #[test]
    fn each_config_gets_its_own_persisted_form_when_they_alternate() {
        let one = ResolvedConfig::default();
        let mut two = ResolvedConfig::default();
        two.retries.limit += 3;
        two.timeout = Duration::from_millis(1_500);
        let asked = [
            (one, false),
            (two, false),
            (one, true),
            (two, true),
            (one, false),
        ];
        for (resolved, stream) in asked {
            let mut expected = resolved.to_persisted_json();
            if stream && let Some(map) = expected.as_object_mut() {
                map.insert("stream".into(), true.into());
            }
            let (persisted, read) = persisted_config(resolved, stream);
            assert_eq!(*persisted, expected);
            assert_eq!(read, resolved);
        }
    }
}
