//! Introspection: the mocks a test sets on one instance or on every instance of a workflow
//! ([`Modifier`]), and the waiters that read what the instance did.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::{
    ErrorInfo, EventType, InstanceId, InstanceStatus, StepKey, StepKind, StepState, WorkflowName,
};
use cairn_store::{InstanceRecord, InstanceRef, ListQuery};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::Instance;
use crate::engine::Engine;
use crate::hooks::{Forced, Hooks, Modifiers, Scope, StepRef};

/// The test engine's current engine, shared with its introspectors: after
/// `TestEngine::reopen` they reach the new one, and waiters hear of the change.
#[derive(Debug, Clone)]
pub(crate) struct EngineCell(Arc<(std::sync::RwLock<Engine>, tokio::sync::watch::Sender<u64>)>);

impl EngineCell {
    pub(crate) fn new(engine: Engine) -> Self {
        EngineCell(Arc::new((
            std::sync::RwLock::new(engine),
            tokio::sync::watch::channel(0).0,
        )))
    }

    pub(crate) fn get(&self) -> Engine {
        self.0
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, engine: Engine) {
        *self
            .0
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = engine;
        self.0.1.send_modify(|n| *n += 1);
    }

    /// Sees a new value at every [`EngineCell::set`].
    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.1.subscribe()
    }
}

/// How long a waiter waits on the virtual clock before giving up: only a test whose
/// instance can never reach what it waits for gets there (at once, in wall time).
const GIVE_UP_AFTER: Duration = Duration::from_secs(10 * 365 * 86_400);

/// A step as the workflow names it: its name, and which occurrence when the name repeats
/// (1 unless given). `"charge"` and `("charge", 2)` convert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    name: String,
    count: u32,
}

impl Step {
    /// The first step named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            count: 1,
        }
    }

    /// The `count`-th step named so (1-based).
    #[must_use]
    pub fn count(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    fn key(&self) -> StepRef {
        (self.name.clone(), self.count)
    }
}

impl From<&str> for Step {
    fn from(name: &str) -> Self {
        Step::new(name)
    }
}

impl From<String> for Step {
    fn from(name: String) -> Self {
        Step::new(name)
    }
}

impl From<(&str, u32)> for Step {
    fn from((name, count): (&str, u32)) -> Self {
        Step::new(name).count(count)
    }
}

/// A test's failure: a mock set twice, an instance that reached another final status, a
/// step that failed, a value that does not decode. Its message says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestError(String);

impl TestError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        TestError(message.into())
    }
}

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TestError {}

impl From<crate::error::Error> for TestError {
    fn from(e: crate::error::Error) -> Self {
        TestError(e.to_string())
    }
}

impl From<cairn_store::Error> for TestError {
    fn from(e: cairn_store::Error) -> Self {
        TestError(e.to_string())
    }
}

/// The error a mocked attempt fails with: a message (named `Error`, as a thrown error is)
/// or a full [`ErrorInfo`]. Retryable, like any error a body returns, unless made with
/// [`MockError::non_retryable`].
#[derive(Debug, Clone, PartialEq)]
pub struct MockError {
    info: ErrorInfo,
    retryable: bool,
}

impl MockError {
    /// A `NonRetryableError` with `message`: the step fails at this attempt.
    pub fn non_retryable(message: impl Into<String>) -> Self {
        MockError {
            info: ErrorInfo::new(crate::failure::NON_RETRYABLE, message),
            retryable: false,
        }
    }
}

impl From<&str> for MockError {
    fn from(message: &str) -> Self {
        ErrorInfo::new(crate::failure::ERROR, message).into()
    }
}

impl From<String> for MockError {
    fn from(message: String) -> Self {
        ErrorInfo::new(crate::failure::ERROR, message).into()
    }
}

impl From<ErrorInfo> for MockError {
    fn from(info: ErrorInfo) -> Self {
        MockError {
            info,
            retryable: true,
        }
    }
}

/// The mocks of one instance or of every instance of a workflow. Set them before the
/// instance reaches the step; they hold across its restarts and the engine's reopenings.
/// A mocked step's body never runs; what the mock makes it return is committed and replayed
/// like a real result, with the same records.
#[derive(Debug, Clone)]
pub struct Modifier {
    hooks: Arc<Hooks>,
    scope: Scope,
}

impl Modifier {
    pub(crate) fn new(hooks: Arc<Hooks>, scope: Scope) -> Self {
        Modifier { hooks, scope }
    }

    fn change<R>(&self, f: impl FnOnce(&mut Modifiers) -> R) -> R {
        self.hooks.modify(self.scope.clone(), f)
    }

    /// Every sleep returns at once (its records are written as usual).
    pub fn disable_sleeps(&self) -> &Self {
        self.change(|m| m.all_sleeps_disabled = true);
        self
    }

    /// These sleeps return at once.
    pub fn disable_sleeps_of<S: Into<Step>>(&self, steps: impl IntoIterator<Item = S>) -> &Self {
        let steps: Vec<StepRef> = steps.into_iter().map(|s| s.into().key()).collect();
        self.change(|m| m.sleeps_disabled.extend(steps));
        self
    }

    /// Every retry starts at once, whatever its back-off.
    pub fn disable_retry_delays(&self) -> &Self {
        self.change(|m| m.all_retry_delays_disabled = true);
        self
    }

    /// Retries of these steps start at once.
    pub fn disable_retry_delays_of<S: Into<Step>>(
        &self,
        steps: impl IntoIterator<Item = S>,
    ) -> &Self {
        let steps: Vec<StepRef> = steps.into_iter().map(|s| s.into().key()).collect();
        self.change(|m| m.retry_delays_disabled.extend(steps));
        self
    }

    /// The step returns `value` instead of running its body (after any attempts a
    /// [`Modifier::mock_step_error`] with `times` fails first).
    ///
    /// # Errors
    /// The step's result is mocked already, or `value` does not serialise.
    pub fn mock_step_result(
        &self,
        step: impl Into<Step>,
        value: impl Serialize,
    ) -> Result<&Self, TestError> {
        let step = step.into();
        let json = cairn_core::binary::to_string(&value).map_err(|e| {
            TestError::new(format!(
                "the mocked result of step {:?} does not serialise: {e}",
                step.name
            ))
        })?;
        self.change(|m| {
            if m.results.contains_key(&step.key()) {
                return Err(TestError::new(format!(
                    "trying to mock step {:?} multiple times",
                    step.name
                )));
            }
            if m.always.contains_key(&step.key()) {
                return Err(TestError::new(format!(
                    "trying to mock the result of step {:?}, whose every attempt is mocked to fail",
                    step.name
                )));
            }
            m.results.insert(step.key(), json);
            Ok(())
        })?;
        Ok(self)
    }

    /// The stream step (`run_stream`) yields `bytes` instead of running its body: they are
    /// stored in chunks and read back like a stream the body returned.
    ///
    /// # Errors
    /// As [`Modifier::mock_step_result`].
    pub fn mock_stream_result(
        &self,
        step: impl Into<Step>,
        bytes: impl AsRef<[u8]>,
    ) -> Result<&Self, TestError> {
        self.mock_step_result(step, bytes.as_ref())
    }

    /// Attempts of the step fail with `error` instead of running its body: the next
    /// `times` attempts (consecutive calls queue up: two calls with 2 fail attempts 1–4),
    /// or every attempt when `times` is `None`.
    ///
    /// # Errors
    /// The step's result is mocked already (mock errors first).
    pub fn mock_step_error(
        &self,
        step: impl Into<Step>,
        error: impl Into<MockError>,
        times: Option<u32>,
    ) -> Result<&Self, TestError> {
        let error = error.into();
        self.force(
            step.into(),
            Forced::Error(error.info, error.retryable),
            times,
            "mock an error on",
        )
    }

    /// Attempts of the step time out instead of running its body (`WorkflowTimeoutError`,
    /// at once, in wall time and virtual time): the next `times` attempts, or all.
    ///
    /// # Errors
    /// The step's result is mocked already.
    pub fn force_step_timeout(
        &self,
        step: impl Into<Step>,
        times: Option<u32>,
    ) -> Result<&Self, TestError> {
        self.force(step.into(), Forced::Timeout, times, "force a timeout on")
    }

    fn force(
        &self,
        step: Step,
        forced: Forced,
        times: Option<u32>,
        what: &str,
    ) -> Result<&Self, TestError> {
        self.change(|m| {
            let key = step.key();
            if m.results.contains_key(&key) {
                return Err(TestError::new(format!(
                    "trying to {what} step {:?} after mocking its result",
                    step.name
                )));
            }
            match times {
                None => {
                    m.always.insert(key, forced);
                }
                Some(times) => {
                    let next = m.next_attempt.entry(key.clone()).or_insert(1);
                    let attempts = m.attempts.entry(key).or_default();
                    for attempt in *next..next.saturating_add(times) {
                        attempts.insert(attempt, forced.clone());
                    }
                    *next = next.saturating_add(times);
                }
            }
            Ok(())
        })?;
        Ok(self)
    }

    /// An event of `event_type` with `payload`, received without anyone sending it: the
    /// instance's first wait for that type receives the first such mock, its second wait
    /// the second, and so on. It is received at the wait, before any event sent for real.
    ///
    /// # Errors
    /// An invalid event type, or a payload that does not serialise.
    pub fn mock_event(
        &self,
        event_type: &str,
        payload: impl Serialize,
    ) -> Result<&Self, TestError> {
        let event_type = EventType::new(event_type).map_err(|e| TestError::new(e.to_string()))?;
        let json = cairn_core::binary::to_string(&payload).map_err(|e| {
            TestError::new(format!("the mocked event payload does not serialise: {e}"))
        })?;
        self.change(|m| m.events.entry(event_type).or_default().push(json));
        Ok(self)
    }

    /// The wait times out at once (`WorkflowTimeoutError`, `Execution timed out after
    /// <its timeout>ms`), whatever is sent to the instance.
    pub fn force_event_timeout(&self, step: impl Into<Step>) -> &Self {
        let key = step.into().key();
        self.change(|m| {
            m.event_timeouts.insert(key);
        });
        self
    }

    /// Removes every mock of this scope (instances already past a mocked step keep what
    /// it committed).
    pub fn clear(&self) {
        self.change(|m| *m = Modifiers::default());
    }
}

/// One instance under test: its mocks ([`InstanceIntrospector::modify`]) and waiters.
#[derive(Debug, Clone)]
pub struct InstanceIntrospector {
    engine: EngineCell,
    modifier: Modifier,
    workflow: WorkflowName,
    id: InstanceId,
}

/// What a waiter found: done with a value, or not yet.
enum Look<R> {
    Done(Result<R, TestError>),
    Wait,
}

impl InstanceIntrospector {
    pub(crate) fn new(
        engine: EngineCell,
        hooks: Arc<Hooks>,
        workflow: WorkflowName,
        id: InstanceId,
    ) -> Self {
        InstanceIntrospector {
            engine,
            modifier: Modifier {
                hooks,
                scope: Scope::Instance(workflow.clone(), id.clone()),
            },
            workflow,
            id,
        }
    }

    /// This instance's mocks.
    pub fn modify(&self) -> &Modifier {
        &self.modifier
    }

    /// The instance id.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }

    /// A handle to the instance (pause, terminate, restart, send events, details).
    pub fn instance(&self) -> Instance {
        Instance {
            engine: self.engine.get(),
            workflow: self.workflow.clone(),
            id: self.id.clone(),
            created_as: None,
            _output: std::marker::PhantomData,
        }
    }

    /// Waits until the instance exists and `look` is done with what the store holds.
    async fn until<R>(
        &self,
        mut look: impl AsyncFnMut(&InstanceRecord) -> Result<Look<R>, TestError>,
    ) -> Result<R, TestError> {
        let mut reopened = self.engine.changes();
        let mut engine = self.engine.get();
        let mut commits = engine.commits();
        let give_up = engine.inner.env.clock.sleep(GIVE_UP_AFTER);
        let mut give_up = std::pin::pin!(give_up);
        loop {
            // After `TestEngine::reopen`, the new engine's commits.
            let current = self.engine.get();
            if !Arc::ptr_eq(&current.inner, &engine.inner) {
                engine = current;
                commits = engine.commits();
            }
            reopened.borrow_and_update();
            commits.borrow_and_update();
            let store = &engine.inner.env.store;
            if let Some(record) = store.instance(&self.workflow, &self.id).await?
                && let Look::Done(result) = look(&record).await?
            {
                return result;
            }
            tokio::select! {
                changed = commits.changed() => {
                    if changed.is_err() {
                        return Err(TestError::new("the engine stopped"));
                    }
                }
                // A reopen does not signal the old engine's commits.
                _ = reopened.changed() => {}
                () = &mut give_up => {
                    let now = store.instance(&self.workflow, &self.id).await?;
                    return Err(TestError::new(format!(
                        "instance {:?} of {:?} did not get there in {} days of virtual time (it is {})",
                        self.id.as_str(),
                        self.workflow.as_str(),
                        GIVE_UP_AFTER.as_secs() / 86_400,
                        now.map_or_else(|| "not created".to_owned(), |r| r.status.to_string()),
                    )));
                }
            }
        }
    }

    /// Waits until the instance has `status` (it may be created later). Fails at once when
    /// it reaches a different final status, saying which.
    ///
    /// # Errors
    /// Another final status reached; the store failing.
    pub async fn wait_for_status(&self, status: InstanceStatus) -> Result<(), TestError> {
        let id = self.id.clone();
        self.until(async |record: &InstanceRecord| {
            if record.status == status {
                return Ok(Look::Done(Ok(())));
            }
            if record.status.is_terminal() {
                return Ok(Look::Done(Err(TestError::new(format!(
                    "The instance {:?} has reached status '{}'. This is a finite status that prevents it from ever reaching the expected status of '{status}'.",
                    id.as_str(),
                    record.status
                )))));
            }
            Ok(Look::Wait)
        })
        .await
    }

    /// Waits until the `run` step has succeeded and returns its output, decoded as `T`.
    ///
    /// # Errors
    /// The step failed for good, or the instance ended without it succeeding; the output
    /// does not decode as `T`.
    pub async fn wait_for_step_result<T: DeserializeOwned>(
        &self,
        step: impl Into<Step>,
    ) -> Result<T, TestError> {
        let step = step.into();
        let key = StepKey {
            kind: StepKind::Run,
            name: step.name.clone(),
            count: step.count,
        };
        let store = Arc::clone(&self.engine.get().inner.env.store);
        let json = self
            .until(async |record: &InstanceRecord| {
                let journal = store.journal(record.instance).await?;
                match journal.into_iter().find(|s| s.key == key) {
                    Some(s) if s.state == StepState::Succeeded => {
                        Ok(Look::Done(Ok(s.output.unwrap_or_else(|| "null".into()))))
                    }
                    Some(s) if s.state == StepState::Failed || s.state == StepState::Cancelled => {
                        Ok(Look::Done(Err(TestError::new(format!(
                            "step {} failed: {}",
                            key.target(),
                            s.error.map_or_else(String::new, |e| e.to_string())
                        )))))
                    }
                    _ if record.status.is_terminal() => {
                        Ok(Look::Done(Err(TestError::new(format!(
                            "instance {:?} ended ({}) without step {} succeeding",
                            record.id.as_str(),
                            record.status,
                            key.target()
                        )))))
                    }
                    _ => Ok(Look::Wait),
                }
            })
            .await?;
        crate::panic::from_json(&json).map_err(|e| {
            TestError::new(format!(
                "the output of step {} does not decode as the expected type: {e}",
                key.target()
            ))
        })
    }

    /// Waits until the stream step (`run_stream`) has succeeded and returns its bytes,
    /// read from the store as a replay reads them.
    ///
    /// # Errors
    /// As [`InstanceIntrospector::wait_for_step_result`]; the step is not a stream step.
    /// A sensitive stream's bytes are read too: the test is the workflow's own code.
    pub async fn wait_for_step_stream(
        &self,
        step: impl Into<Step>,
    ) -> Result<crate::StepStream, TestError> {
        let step = step.into();
        let meta = self
            .wait_for_step_result::<serde_json::Value>(step.clone())
            .await?;
        let meta: crate::ops::stream_meta::StreamMeta = serde_json::from_value(meta)
            .map_err(|_| TestError::new(format!("step {:?} is not a stream step", step.name)))?;
        let record = self.record().await?;
        let key = StepKey {
            kind: StepKind::Run,
            name: step.name,
            count: step.count,
        };
        // Read even if the step is sensitive: the test is the workflow's own code.
        Ok(crate::StepStream::new(
            Arc::clone(&self.engine.get().inner.env.store),
            record.instance,
            key,
            &meta,
        ))
    }

    /// The instance's output, decoded as `T`.
    ///
    /// # Errors
    /// The instance is not complete (its status is named), or does not exist.
    pub async fn output<T: DeserializeOwned>(&self) -> Result<T, TestError> {
        let record = self.record().await?;
        if record.status != InstanceStatus::Complete {
            return Err(TestError::new(format!(
                "the instance {:?} has no output: its status is '{}', not 'complete'",
                self.id.as_str(),
                record.status
            )));
        }
        crate::panic::from_json(record.output.as_deref().unwrap_or("null")).map_err(|e| {
            TestError::new(format!(
                "the output of instance {:?} does not decode as the expected type: {e}",
                self.id.as_str()
            ))
        })
    }

    /// The error the instance ended with.
    ///
    /// # Errors
    /// The instance is not errored (its status is named), or does not exist.
    pub async fn error(&self) -> Result<ErrorInfo, TestError> {
        let record = self.record().await?;
        match (record.status, record.error) {
            (InstanceStatus::Errored, Some(error)) => Ok(error),
            (status, _) => Err(TestError::new(format!(
                "the instance {:?} has no error: its status is '{status}', not 'errored'",
                self.id.as_str()
            ))),
        }
    }

    async fn record(&self) -> Result<InstanceRecord, TestError> {
        self.engine
            .get()
            .inner
            .env
            .store
            .instance(&self.workflow, &self.id)
            .await?
            .ok_or_else(|| {
                TestError::new(format!(
                    "instance {:?} of {:?} does not exist",
                    self.id.as_str(),
                    self.workflow.as_str()
                ))
            })
    }
}

/// Every instance of a workflow created since the introspector was made: their shared
/// mocks, and introspectors for each.
#[derive(Debug, Clone)]
pub struct WorkflowIntrospector {
    engine: EngineCell,
    modifier: Modifier,
    workflow: WorkflowName,
    /// The newest instance (of any workflow) when it was made: store references only grow.
    since: InstanceRef,
}

impl WorkflowIntrospector {
    pub(crate) async fn new(
        engine: EngineCell,
        hooks: Arc<Hooks>,
        workflow: WorkflowName,
    ) -> Result<Self, TestError> {
        let newest = engine
            .get()
            .inner
            .env
            .store
            .list(ListQuery {
                limit: 1,
                ..ListQuery::default()
            })
            .await?;
        let since = newest.first().map_or(InstanceRef(0), |r| r.instance);
        // Its own scope: a later introspector of the same workflow narrows nothing.
        let scope = Scope::Workflow {
            workflow: workflow.clone(),
            since: Some(since),
        };
        hooks.modify(scope.clone(), |_| ());
        Ok(WorkflowIntrospector {
            modifier: Modifier { hooks, scope },
            since,
            engine,
            workflow,
        })
    }

    /// The mocks every instance of the workflow gets (an instance's own mocks come first).
    pub fn modify(&self) -> &Modifier {
        &self.modifier
    }

    /// Introspectors for the instances created since this introspector was made, oldest
    /// first.
    ///
    /// # Errors
    /// A store failure.
    pub async fn instances(&self) -> Result<Vec<InstanceIntrospector>, TestError> {
        let engine = self.engine.get();
        let store = &engine.inner.env.store;
        let mut found = Vec::new();
        let mut before = None;
        loop {
            let page = store
                .list(ListQuery {
                    workflow: Some(self.workflow.clone()),
                    after: before,
                    limit: 500,
                    ..ListQuery::default()
                })
                .await?;
            let last = page.last().map(|r| r.instance);
            let full = page.len() == 500;
            let mut older = false;
            for record in page {
                if record.instance <= self.since {
                    older = true;
                    break;
                }
                found.push(InstanceIntrospector::new(
                    self.engine.clone(),
                    Arc::clone(&self.modifier.hooks),
                    self.workflow.clone(),
                    record.id,
                ));
            }
            if older || !full {
                break;
            }
            before = last;
        }
        found.reverse();
        Ok(found)
    }
}
