//! Managing instances: [`WorkflowClient`] (typed) and [`UntypedWorkflow`] (JSON) to create
//! and look up instances, and [`Instance`] to read their status, details and event log.

use std::marker::PhantomData;

use cairn_core::{
    ErrorInfo, InstanceId, InstanceStatus, LogEntry, LogKind, LogRecord, MAX_BATCH, WorkflowName,
};
use cairn_store::{ControlOutcome, ControlRequest, Created, InstanceRecord, NewInstance};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::details::InstanceDetails;
use crate::engine::Engine;
use crate::error::Error;
use crate::workflow::Workflow;

/// Options for creating one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateOptions<P> {
    /// The instance id; generated (a UUID) when `None`.
    pub id: Option<String>,
    /// The params, the workflow's `event.payload`.
    pub params: P,
    /// How long to keep the instance once finished; `None` fields keep the workflow's.
    #[serde(skip)]
    pub retention: InstanceRetention,
}

/// A per-instance retention override.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstanceRetention {
    /// Kept this long after completing.
    pub success: Option<std::time::Duration>,
    /// Kept this long after erroring or being terminated.
    pub error: Option<std::time::Duration>,
}

impl<P> CreateOptions<P> {
    /// An instance with these params and a generated id.
    pub fn new(params: P) -> Self {
        CreateOptions {
            id: None,
            params,
            retention: InstanceRetention::default(),
        }
    }

    /// Sets the instance id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Keeps the instance this long after it completes (instead of the workflow's retention).
    pub fn success_retention(mut self, d: std::time::Duration) -> Self {
        self.retention.success = Some(d);
        self
    }

    /// Keeps the instance this long after it errors or is terminated.
    pub fn error_retention(mut self, d: std::time::Duration) -> Self {
        self.retention.error = Some(d);
        self
    }
}

impl<P: Default> Default for CreateOptions<P> {
    fn default() -> Self {
        Self::new(P::default())
    }
}

impl<P> CreateOptions<P> {
    fn with_params<Q>(self, params: Q) -> CreateOptions<Q> {
        CreateOptions {
            id: self.id,
            params,
            retention: self.retention,
        }
    }
}

/// One entry a detailed batch create could not create.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchError {
    /// Its position in the batch.
    pub index: usize,
    /// Its id, if it had a valid one.
    pub id: Option<String>,
    /// The stable error code, e.g. `instance.already_exists`.
    pub code: String,
    /// What was wrong.
    pub message: String,
}

/// The result of [`WorkflowClient::create_batch_detailed`].
#[derive(Debug, Clone)]
pub struct BatchCreated<O> {
    /// The instances created, in input order.
    pub created: Vec<Instance<O>>,
    /// One entry per input that was not created.
    pub errors: Vec<BatchError>,
}

/// The result of [`UntypedWorkflow::delete_batch`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchDeleted {
    /// The ids deleted, one per input position that named an existing instance.
    pub deleted: Vec<String>,
    /// One entry per input position that could not be deleted.
    pub errors: Vec<BatchError>,
}

/// An instance's status: Cloudflare's `{status, output, error}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status<O> {
    /// Where the instance is.
    pub status: InstanceStatus,
    /// `run`'s return value, when complete.
    pub output: Option<O>,
    /// The error that escaped `run`, when errored.
    pub error: Option<ErrorInfo>,
    /// How the rollback went, when one ran.
    pub rollback: Option<crate::ops::RollbackStatus>,
}

/// One row of an instance listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceSummary {
    /// The instance id.
    pub id: InstanceId,
    /// Its status.
    pub status: InstanceStatus,
    /// When it was created.
    pub created: cairn_core::Timestamp,
    /// When it first started.
    pub started: Option<cairn_core::Timestamp>,
    /// When it finished.
    pub ended: Option<cairn_core::Timestamp>,
}

/// The longest idempotency key of [`Instance::send_event_with_key`], in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// What [`Instance::send_event_with_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    /// The event was buffered for the instance.
    Buffered,
    /// An event with this key was sent before: nothing was delivered again.
    Duplicate,
}

/// One page of [`UntypedWorkflow::list`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstancePage {
    /// The instances, newest first.
    pub instances: Vec<InstanceSummary>,
    /// Pass it to get the next page; `None` on the last one.
    pub cursor: Option<String>,
}

/// The opaque form of a list position: the store's instance reference, which is never
/// reused and grows with creation order, so a page boundary needs no live instance.
const CURSOR_PREFIX: &str = "c1.";

fn encode_cursor(instance: cairn_store::InstanceRef) -> String {
    format!("{CURSOR_PREFIX}{:x}", instance.0)
}

fn decode_cursor(cursor: &str) -> Result<cairn_store::InstanceRef, Error> {
    cursor
        .strip_prefix(CURSOR_PREFIX)
        .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        .filter(|n| *n > 0)
        .map(cairn_store::InstanceRef)
        .ok_or_else(|| Error::InvalidCursor(cursor.to_owned()))
}

/// A handle to one workflow's instances, typed by the workflow.
pub struct WorkflowClient<W> {
    untyped: UntypedWorkflow,
    _workflow: PhantomData<fn() -> W>,
}

impl<W> Clone for WorkflowClient<W> {
    fn clone(&self) -> Self {
        WorkflowClient {
            untyped: self.untyped.clone(),
            _workflow: PhantomData,
        }
    }
}

/// A handle to one workflow's instances with params and outputs as JSON: what the HTTP API
/// and the CLI use.
#[derive(Clone, Debug)]
pub struct UntypedWorkflow {
    engine: Engine,
    name: WorkflowName,
}

/// A handle to one instance. Its output decodes as `O`.
pub struct Instance<O = serde_json::Value> {
    engine: Engine,
    workflow: WorkflowName,
    id: InstanceId,
    _output: PhantomData<fn() -> O>,
}

impl<O> Clone for Instance<O> {
    fn clone(&self) -> Self {
        Instance {
            engine: self.engine.clone(),
            workflow: self.workflow.clone(),
            id: self.id.clone(),
            _output: PhantomData,
        }
    }
}

impl<O> std::fmt::Debug for Instance<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("workflow", &self.workflow)
            .field("id", &self.id)
            .finish()
    }
}

impl Engine {
    /// The typed handle of workflow `W`. Calls on it fail with
    /// [`Error::UnknownWorkflow`] if `W` was not registered.
    pub fn workflow<W: Workflow>(&self) -> WorkflowClient<W> {
        WorkflowClient {
            untyped: UntypedWorkflow {
                engine: self.clone(),
                name: WorkflowName::new(W::NAME).unwrap_or_else(|_| {
                    // An invalid NAME cannot have been registered; any valid placeholder keeps
                    // every call failing with UnknownWorkflow naming it.
                    WorkflowName::new("_invalid_workflow_name").expect("valid literal")
                }),
            },
            _workflow: PhantomData,
        }
    }

    /// The JSON handle of the workflow named `name`.
    ///
    /// # Errors
    /// [`Error::InvalidId`] for an invalid name, [`Error::UnknownWorkflow`] if none is registered.
    pub fn workflow_by_name(&self, name: &str) -> Result<UntypedWorkflow, Error> {
        let name = WorkflowName::new(name)?;
        if !self.inner.workflows.contains_key(&name) {
            return Err(Error::UnknownWorkflow(name.to_string()));
        }
        Ok(UntypedWorkflow {
            engine: self.clone(),
            name,
        })
    }
}

impl<W: Workflow> WorkflowClient<W> {
    /// Creates an instance; it runs as soon as a slot is free.
    ///
    /// # Errors
    /// An invalid id, an id already used by an instance of this workflow
    /// ([`Error::AlreadyExists`]), params over the size limit, or a store failure.
    pub async fn create(
        &self,
        options: CreateOptions<W::Params>,
    ) -> Result<Instance<W::Output>, Error> {
        self.untyped
            .create(options_to_json(options)?)
            .await
            .map(Instance::typed)
    }

    /// Creates up to 100 instances at once. Ids that already exist are skipped and left out
    /// of the result, which is in input order; any other invalid entry fails the whole batch.
    ///
    /// # Errors
    /// An empty batch, more than 100 entries, an invalid entry, or a store failure.
    pub async fn create_batch(
        &self,
        batch: Vec<CreateOptions<W::Params>>,
    ) -> Result<Vec<Instance<W::Output>>, Error> {
        let batch = batch
            .into_iter()
            .map(options_to_json)
            .collect::<Result<Vec<_>, Error>>()?;
        let created = self.untyped.create_batch(batch).await?;
        Ok(created.into_iter().map(Instance::typed).collect())
    }

    /// Creates up to 100 instances, reporting every entry it could not create (existing ids,
    /// ids repeated within the batch, invalid ids or params) instead of failing or skipping.
    ///
    /// # Errors
    /// An empty batch, more than 100 entries, or a store failure.
    pub async fn create_batch_detailed(
        &self,
        batch: Vec<CreateOptions<W::Params>>,
    ) -> Result<BatchCreated<W::Output>, Error> {
        let batch = batch
            .into_iter()
            .map(options_to_json)
            .collect::<Result<Vec<_>, Error>>()?;
        let result = self.untyped.create_batch_detailed(batch).await?;
        Ok(BatchCreated {
            created: result.created.into_iter().map(Instance::typed).collect(),
            errors: result.errors,
        })
    }

    /// The instance with this id.
    ///
    /// # Errors
    /// [`Error::InvalidId`] or [`Error::InstanceNotFound`].
    pub async fn get(&self, id: &str) -> Result<Instance<W::Output>, Error> {
        self.untyped.get(id).await.map(Instance::typed)
    }

    /// The JSON view of this workflow.
    pub fn untyped(&self) -> &UntypedWorkflow {
        &self.untyped
    }
}

/// The JSON form of typed create options.
fn options_to_json<P: Serialize>(
    options: CreateOptions<P>,
) -> Result<CreateOptions<serde_json::Value>, Error> {
    let params = serde_json::to_value(&options.params).map_err(|e| Error::InvalidParams {
        workflow: String::new(),
        reason: e.to_string(),
    })?;
    Ok(options.with_params(params))
}

/// One entry of a batch after validation.
struct Prepared {
    index: usize,
    id: InstanceId,
    new: NewInstance,
}

impl UntypedWorkflow {
    /// The workflow's name.
    pub fn name(&self) -> &WorkflowName {
        &self.name
    }

    /// An id given to a lookup: a valid instance id, or else an error. A cron-style id
    /// (SPEC §2.4 "addressable") is not invalid, but no instance here can have one: it is
    /// not found.
    fn lookup_id(&self, id: &str) -> Result<InstanceId, Error> {
        match InstanceId::new(id) {
            Ok(id) => Ok(id),
            Err(_) if cairn_core::is_addressable_id(id) => Err(Error::InstanceNotFound {
                workflow: self.name.to_string(),
                id: id.to_owned(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    fn prepare(
        &self,
        index: usize,
        options: CreateOptions<serde_json::Value>,
    ) -> Result<Prepared, (Option<String>, Error)> {
        let id = match options.id {
            Some(id) => InstanceId::new(id.clone()).map_err(|e| (Some(id), e.into()))?,
            None => InstanceId::new(uuid::Uuid::new_v4().to_string())
                .expect("a UUID is a valid instance id"),
        };
        let fail = |e: Error| (Some(id.to_string()), e);
        let workflow = self
            .engine
            .inner
            .workflows
            .get(&self.name)
            .ok_or_else(|| fail(Error::UnknownWorkflow(self.name.to_string())))?;
        let params = options.params;
        let text = params.to_string();
        let limit = self.engine.inner.env.limits.payload_limit;
        if text.len() > limit {
            return Err(fail(Error::PayloadTooLarge {
                what: "params",
                size: text.len(),
                limit,
            }));
        }
        workflow.check_params(&params).map_err(|reason| {
            fail(Error::InvalidParams {
                workflow: self.name.to_string(),
                reason,
            })
        })?;
        let now = self.engine.inner.env.clock.now();
        let defaults = self
            .engine
            .inner
            .retention
            .get(&self.name)
            .copied()
            .unwrap_or(crate::engine::DEFAULT_RETENTION);
        let retention = cairn_store::Retention {
            success: options.retention.success.unwrap_or(defaults.success),
            error: options.retention.error.unwrap_or(defaults.error),
        };
        Ok(Prepared {
            index,
            id: id.clone(),
            new: NewInstance {
                workflow: self.name.clone(),
                id,
                params: text,
                created_at: now,
                queued: LogEntry {
                    kind: LogKind::WorkflowQueued,
                    at: now,
                    step: None,
                    meta: json!({ "params": params, "trigger": { "source": "api" } }),
                },
                retention,
            },
        })
    }

    async fn insert(&self, prepared: Vec<Prepared>) -> Result<Vec<(Prepared, Created)>, Error> {
        let news = prepared.iter().map(|p| p.new.clone()).collect();
        let created = self.engine.inner.env.store.create(news).await?;
        if created.iter().any(|c| matches!(c, Created::New(_))) {
            self.engine.inner.wake.notify_one();
            self.engine.inner.changed();
        }
        Ok(prepared.into_iter().zip(created).collect())
    }

    fn instance(&self, id: InstanceId) -> Instance {
        Instance {
            engine: self.engine.clone(),
            workflow: self.name.clone(),
            id,
            _output: PhantomData,
        }
    }

    /// Creates an instance with JSON params (`{}` is Cloudflare's default).
    ///
    /// # Errors
    /// As [`WorkflowClient::create`], plus [`Error::InvalidParams`] when the params do not
    /// decode as the workflow's `Params`.
    pub async fn create(
        &self,
        options: CreateOptions<serde_json::Value>,
    ) -> Result<Instance, Error> {
        let prepared = self.prepare(0, options).map_err(|(_, e)| e)?;
        let id = prepared.id.clone();
        match self.insert(vec![prepared]).await?[..] {
            [(_, Created::New(_))] => Ok(self.instance(id)),
            _ => Err(Error::AlreadyExists {
                workflow: self.name.to_string(),
                id: id.to_string(),
            }),
        }
    }

    fn check_batch_size(len: usize) -> Result<(), Error> {
        if len == 0 {
            return Err(Error::BatchEmpty("batchCreate"));
        }
        if len > MAX_BATCH {
            return Err(Error::BatchTooLarge {
                operation: "batchCreate",
                len,
                max: MAX_BATCH,
            });
        }
        Ok(())
    }

    /// Array-form batch create with JSON params; see [`WorkflowClient::create_batch`].
    ///
    /// # Errors
    /// As [`WorkflowClient::create_batch`].
    pub async fn create_batch(
        &self,
        batch: Vec<CreateOptions<serde_json::Value>>,
    ) -> Result<Vec<Instance>, Error> {
        Self::check_batch_size(batch.len())?;
        let prepared = batch
            .into_iter()
            .enumerate()
            .map(|(i, o)| self.prepare(i, o).map_err(|(_, e)| e))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(self
            .insert(prepared)
            .await?
            .into_iter()
            .filter(|(_, c)| matches!(c, Created::New(_)))
            .map(|(p, _)| self.instance(p.id))
            .collect())
    }

    /// Detailed batch create with JSON params; see [`WorkflowClient::create_batch_detailed`].
    ///
    /// # Errors
    /// As [`WorkflowClient::create_batch_detailed`].
    pub async fn create_batch_detailed(
        &self,
        batch: Vec<CreateOptions<serde_json::Value>>,
    ) -> Result<BatchCreated<serde_json::Value>, Error> {
        Self::check_batch_size(batch.len())?;
        let mut errors = Vec::new();
        let mut prepared = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, options) in batch.into_iter().enumerate() {
            match self.prepare(i, options) {
                Ok(p) if !seen.insert(p.id.clone()) => errors.push(BatchError {
                    index: i,
                    id: Some(p.id.to_string()),
                    code: "instance.already_exists".into(),
                    message: format!(
                        "instance id {:?} is repeated within the batch",
                        p.id.as_str()
                    ),
                }),
                Ok(p) => prepared.push(p),
                Err((id, e)) => errors.push(BatchError {
                    index: i,
                    id,
                    code: e.code().into(),
                    message: e.to_string(),
                }),
            }
        }
        let mut created = Vec::new();
        if !prepared.is_empty() {
            for (p, outcome) in self.insert(prepared).await? {
                match outcome {
                    Created::New(_) => created.push(self.instance(p.id)),
                    Created::AlreadyExists => errors.push(BatchError {
                        index: p.index,
                        id: Some(p.id.to_string()),
                        code: "instance.already_exists".into(),
                        message: Error::AlreadyExists {
                            workflow: self.name.to_string(),
                            id: p.id.to_string(),
                        }
                        .to_string(),
                    }),
                }
            }
        }
        errors.sort_by_key(|e| e.index);
        Ok(BatchCreated { created, errors })
    }

    /// A receiver that sees a new value after every write this engine commits to any
    /// instance of this workflow. Writes by other processes sharing the store are not seen.
    pub fn commits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.engine.inner.commits.workflow(&self.name)
    }

    /// Lifecycle records of all this workflow's instances with id greater than `after`,
    /// oldest first (at most `limit`), each with its instance id.
    ///
    /// # Errors
    /// A store failure.
    pub async fn log(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(InstanceId, LogRecord)>, Error> {
        Ok(self
            .engine
            .inner
            .env
            .store
            .workflow_log(&self.name, after, limit)
            .await?)
    }

    /// How many of this workflow's instances are in `status`.
    ///
    /// # Errors
    /// A store failure.
    pub async fn count(&self, status: InstanceStatus) -> Result<u64, Error> {
        Ok(self
            .engine
            .inner
            .env
            .store
            .count(&self.name, status)
            .await?)
    }

    /// One page of this workflow's instances, newest first, optionally only those in
    /// `status`: `limit` of them after `cursor` (the previous page's [`InstancePage::cursor`];
    /// `None` for the first page). The cursor is a position in creation order, not an
    /// instance: it stays valid when instances on either side are deleted or purged.
    ///
    /// # Errors
    /// A cursor not handed out by [`UntypedWorkflow::list`] (`cursor.invalid`), or a store
    /// failure.
    pub async fn list(
        &self,
        status: Option<InstanceStatus>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<InstancePage, Error> {
        let before = cursor.map(decode_cursor).transpose()?;
        let rows = self
            .engine
            .inner
            .env
            .store
            .list(cairn_store::ListQuery {
                workflow: Some(self.name.clone()),
                status,
                before,
                limit,
            })
            .await?;
        let cursor = (rows.len() == limit && limit > 0)
            .then(|| rows.last().map(|r| encode_cursor(r.instance)))
            .flatten();
        Ok(InstancePage {
            instances: rows
                .into_iter()
                .map(|r| InstanceSummary {
                    id: r.id,
                    status: r.status,
                    created: r.created_at,
                    started: r.started_at,
                    ended: r.ended_at,
                })
                .collect(),
            cursor,
        })
    }

    /// Deletes up to 100 instances. The result has one entry per input position: an id
    /// given twice is deleted once but reported at both positions; an unknown id is an error
    /// entry (`instance.not_found`).
    ///
    /// # Errors
    /// An empty list, more than 100 ids, or an invalid id. A store failure deleting one id
    /// is reported at its positions (`store.unavailable`), not as an error of the call.
    pub async fn delete_batch(&self, ids: &[&str]) -> Result<BatchDeleted, Error> {
        if ids.is_empty() {
            return Err(Error::BatchEmpty("batchDeleteInstances"));
        }
        if ids.len() > MAX_BATCH {
            return Err(Error::BatchTooLarge {
                operation: "batchDeleteInstances",
                len: ids.len(),
                max: MAX_BATCH,
            });
        }
        // An invalid id fails the call; a cron-style id that no instance can have is a
        // per-position "not found".
        let parsed = ids
            .iter()
            .map(|id| match self.lookup_id(id) {
                Ok(id) => Ok(Ok(id)),
                Err(e @ Error::InstanceNotFound { .. }) => Ok(Err(e)),
                Err(e) => Err(e),
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let mut outcomes: std::collections::HashMap<InstanceId, Result<(), Error>> =
            std::collections::HashMap::new();
        for id in parsed.iter().filter_map(|p| p.as_ref().ok()) {
            if !outcomes.contains_key(id) {
                // Each unique id is attempted once; a store failure is that id's error.
                let result = self.instance(id.clone()).delete().await;
                outcomes.insert(id.clone(), result);
            }
        }
        let mut result = BatchDeleted {
            deleted: Vec::new(),
            errors: Vec::new(),
        };
        for (index, (given, id)) in ids.iter().zip(&parsed).enumerate() {
            let outcome = match id {
                Ok(id) => outcomes[id].as_ref().map(|()| id.to_string()),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(id) => result.deleted.push(id),
                Err(e) => result.errors.push(BatchError {
                    index,
                    id: Some((*given).to_owned()),
                    code: e.code().into(),
                    message: e.to_string(),
                }),
            }
        }
        Ok(result)
    }

    /// The instance with this id.
    ///
    /// # Errors
    /// [`Error::InvalidId`] or [`Error::InstanceNotFound`].
    pub async fn get(&self, id: &str) -> Result<Instance, Error> {
        let id = self.lookup_id(id)?;
        let instance = self.instance(id);
        instance.record().await?;
        Ok(instance)
    }
}

impl Instance<serde_json::Value> {
    fn typed<O>(self) -> Instance<O> {
        Instance {
            engine: self.engine,
            workflow: self.workflow,
            id: self.id,
            _output: PhantomData,
        }
    }
}

impl<O: DeserializeOwned> Instance<O> {
    /// The instance id.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }

    /// The workflow's name.
    pub fn workflow(&self) -> &WorkflowName {
        &self.workflow
    }

    pub(crate) async fn record(&self) -> Result<InstanceRecord, Error> {
        self.engine
            .inner
            .env
            .store
            .instance(&self.workflow, &self.id)
            .await?
            .ok_or_else(|| Error::InstanceNotFound {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
            })
    }

    /// The instance's status, output and error.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] once the instance is deleted; [`Error::Store`] when the
    /// stored output does not decode as `O`.
    pub async fn status(&self) -> Result<Status<O>, Error> {
        let record = self.record().await?;
        let output = match (&record.output, record.status) {
            (Some(json), InstanceStatus::Complete) => {
                Some(serde_json::from_str(json).map_err(|e| {
                    Error::Store(cairn_store::Error::Corrupt(format!(
                        "the output of instance {:?} does not decode as the expected type: {e}",
                        self.id.as_str()
                    )))
                })?)
            }
            _ => None,
        };
        Ok(Status {
            status: record.status,
            output,
            error: record
                .error
                .filter(|_| record.status == InstanceStatus::Errored),
            rollback: record
                .rollback_outcome
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok()),
        })
    }

    /// Waits until the instance's status satisfies `done`, and returns it.
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn wait_for(
        &self,
        mut done: impl FnMut(&Status<O>) -> bool,
    ) -> Result<Status<O>, Error> {
        let mut changes = self.engine.inner.changes.subscribe();
        loop {
            changes.borrow_and_update();
            let status = self.status().await?;
            if done(&status) {
                return Ok(status);
            }
            if changes.changed().await.is_err() {
                return Ok(status);
            }
        }
    }

    /// Waits until the instance is complete, errored or terminated, and returns its status.
    ///
    /// # Errors
    /// As [`Instance::status`].
    pub async fn wait(&self) -> Result<Status<O>, Error> {
        self.wait_for(|s| s.status.is_terminal()).await
    }

    /// A receiver that sees a new value after every write this engine commits to this
    /// instance: a live view that has read its whole log waits on it. Writes by other
    /// processes sharing the store are not seen.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] or a store failure.
    pub async fn commits(&self) -> Result<tokio::sync::watch::Receiver<u64>, Error> {
        let record = self.record().await?;
        Ok(self.engine.inner.commits.instance(record.instance))
    }

    /// The instance's lifecycle records with id greater than `after`, oldest first.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] or a store failure.
    pub async fn log(&self, after: u64) -> Result<Vec<LogRecord>, Error> {
        let record = self.record().await?;
        let store = &self.engine.inner.env.store;
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let page = store.log(record.instance, cursor, 1_000).await?;
            let Some(last) = page.last() else { break };
            cursor = last.id;
            let full = page.len() == 1_000;
            out.extend(page);
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// Sends an event: it is buffered per type, first in first out, until a
    /// `wait_for_event` of that type takes it, and wakes the instance if it hibernates.
    /// Works in every non-terminal status (also `queued` and `paused`).
    ///
    /// Without a key a send is not idempotent: a client that retries a send whose
    /// answer it lost (a crash, a timeout) delivers the event twice. Use
    /// [`Instance::send_event_with_key`] when retries are possible.
    ///
    /// # Errors
    /// An invalid event type, a payload over the size limit, [`Error::InstanceNotFound`], or
    /// [`Error::InstanceFinished`] for a finished instance.
    pub async fn send_event<P: Serialize>(
        &self,
        event_type: &str,
        payload: &P,
    ) -> Result<(), Error> {
        self.send(event_type, payload, None).await.map(drop)
    }

    /// [`Instance::send_event`] with an idempotency key (1–256 characters, no control
    /// characters): the first send with a key delivers the event; every later one with the
    /// same key to the same instance is acknowledged as [`Delivery::Duplicate`] and
    /// delivers nothing, also after the event was consumed or the instance finished. Keys
    /// are kept as long as the instance (a restart clears them with the buffered events).
    ///
    /// # Errors
    /// As [`Instance::send_event`], and [`Error::InvalidIdempotencyKey`].
    pub async fn send_event_with_key<P: Serialize>(
        &self,
        event_type: &str,
        payload: &P,
        key: &str,
    ) -> Result<Delivery, Error> {
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY || key.chars().any(char::is_control) {
            return Err(Error::InvalidIdempotencyKey(key.to_owned()));
        }
        self.send(event_type, payload, Some(key.to_owned())).await
    }

    async fn send<P: Serialize>(
        &self,
        event_type: &str,
        payload: &P,
        idempotency_key: Option<String>,
    ) -> Result<Delivery, Error> {
        let event_type = cairn_core::EventType::new(event_type)?;
        let payload = serde_json::to_string(payload).map_err(|e| Error::InvalidParams {
            workflow: self.workflow.to_string(),
            reason: format!("the event payload is not serialisable: {e}"),
        })?;
        let limit = self.engine.inner.env.limits.payload_limit;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge {
                what: "event payload",
                size: payload.len(),
                limit,
            });
        }
        let event = cairn_store::NewEvent {
            event_type,
            payload,
            at: self.engine.inner.env.clock.now(),
            idempotency_key,
        };
        match self
            .engine
            .inner
            .env
            .store
            .send_event(&self.workflow, &self.id, event)
            .await?
        {
            cairn_store::Sent::Buffered(instance) => {
                self.engine.inner.event_sent(instance);
                Ok(Delivery::Buffered)
            }
            cairn_store::Sent::Duplicate(_) => Ok(Delivery::Duplicate),
            cairn_store::Sent::NotFound => Err(Error::InstanceNotFound {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
            }),
            cairn_store::Sent::Finished(status) => Err(Error::InstanceFinished {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
                status,
            }),
        }
    }

    async fn control(
        &self,
        request: cairn_store::ControlRequest,
        action: &'static str,
    ) -> Result<(), Error> {
        let inner = &self.engine.inner;
        let outcome = inner
            .env
            .store
            .control(&self.workflow, &self.id, request.clone())
            .await?;
        match outcome {
            ControlOutcome::NotFound => Err(Error::InstanceNotFound {
                workflow: self.workflow.to_string(),
                id: self.id.to_string(),
            }),
            ControlOutcome::Rejected(status) => Err(Error::CannotTransition {
                action,
                id: self.id.to_string(),
                status,
            }),
            ControlOutcome::StepNotFound => Err(Error::StepNotFound {
                name: match request {
                    ControlRequest::Restart {
                        from: Some(key), ..
                    } => key.name,
                    _ => String::new(),
                },
            }),
            ControlOutcome::NoOp(_) => Ok(()),
            ControlOutcome::Done {
                instance,
                to,
                epoch,
                ..
            } => {
                // Only a lifetime that predates the transition: the scheduler may already
                // have claimed the instance again (after a restart) and started a new one.
                let live = inner
                    .live()
                    .get(&instance)
                    .filter(|state| state.lease.epoch <= epoch)
                    .cloned();
                match request {
                    ControlRequest::Pause { .. } | ControlRequest::Resume { .. } => {
                        if let Some(state) = live {
                            state.observe(to);
                        }
                    }
                    ControlRequest::Terminate { .. }
                    | ControlRequest::Restart { .. }
                    | ControlRequest::Delete => {
                        if let Some(state) = live {
                            state.abort(crate::lifetime::Abort::Stopped);
                        }
                    }
                }
                inner.wake.notify_one();
                inner.changed();
                Ok(())
            }
        }
    }

    /// Pauses the instance. A running instance becomes `waitingForPause`: attempts in flight
    /// finish and are recorded, no new one starts, and then it is `paused`. A sleeping or
    /// waiting one is paused at once; its timers stop counting down. Pausing a paused
    /// instance does nothing.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_pause` for a finished instance.
    pub async fn pause(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(ControlRequest::Pause { at }, "pause").await
    }

    /// Resumes a paused instance (its timers shifted by the time spent paused) or cancels a
    /// pending pause. Resuming a running instance does nothing.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_resume` for a finished instance.
    pub async fn resume(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(ControlRequest::Resume { at }, "resume").await
    }

    /// Terminates the instance from any non-terminal status: attempts in flight, sleeps and
    /// waits are cancelled, and nothing more runs.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_terminate` for a finished instance.
    pub async fn terminate(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(
            ControlRequest::Terminate { at, rollback: None },
            "terminate",
        )
        .await
    }

    /// Terminates the instance after compensating it: the rollback handlers of its steps
    /// run (reverse start order, error `Terminated: Instance terminated during rollback`),
    /// then it ends `terminated`. Works from every non-terminal status, also `paused`.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; `instance.cannot_terminate` for a finished instance.
    pub async fn terminate_with_rollback(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        let trigger =
            serde_json::to_string(&crate::ops::rollback::Trigger::terminate()).unwrap_or_default();
        self.control(
            ControlRequest::Terminate {
                at,
                rollback: Some(trigger),
            },
            "terminate",
        )
        .await
    }

    /// Restarts the instance from scratch, from any status: its journal, log, buffered
    /// events and timers are wiped and it runs again with its original params.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`].
    pub async fn restart(&self) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        self.control(ControlRequest::Restart { at, from: None }, "restart")
            .await
    }

    /// Restarts the instance from a step: the `count`-th (1-based) op of `kind` named
    /// `name`, in start order. Everything started before it keeps its stored results; it and
    /// everything after run again.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; [`Error::StepNotFound`] (`instance.cannot_restart`) when
    /// the instance has no such step.
    pub async fn restart_from(
        &self,
        kind: cairn_core::StepKind,
        name: &str,
        count: u32,
    ) -> Result<(), Error> {
        let at = self.engine.inner.env.clock.now();
        let from = cairn_core::StepKey {
            kind,
            name: name.to_owned(),
            count: count.max(1),
        };
        self.control(
            ControlRequest::Restart {
                at,
                from: Some(from),
            },
            "restart",
        )
        .await
    }

    /// Deletes the instance and everything it owns; a running lifetime stops. The id can be
    /// used again afterwards.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`].
    pub async fn delete(&self) -> Result<(), Error> {
        self.control(ControlRequest::Delete, "delete").await?;
        if crate::lifetime::is_current(&self.workflow, &self.id) {
            // A workflow deleting its own instance stops at this call: its lifetime is being
            // dropped, and nothing after the call may run.
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    /// Everything about the instance: status, params, timings and its steps with their
    /// attempts, in start order. Sensitive outputs show as `[REDACTED]`.
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`] or a store failure.
    pub async fn details(&self) -> Result<InstanceDetails, Error> {
        let record = self.record().await?;
        let journal = self.engine.inner.env.store.journal(record.instance).await?;
        let log = self.log(0).await?;
        Ok(InstanceDetails::build(&record, &journal, &log))
    }
}
