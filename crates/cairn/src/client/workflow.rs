//! Workflow handles: [`WorkflowClient`] (typed) and [`UntypedWorkflow`] (JSON) create,
//! look up, list, count and delete instances.

use std::marker::PhantomData;

use cairn_core::{IdError, InstanceId, InstanceStatus, LogEntry, LogKind, MAX_BATCH, WorkflowName};
use cairn_store::{Created, InstanceRef, NewInstance};
use serde::Serialize;
use serde_json::json;

use crate::client::create::{
    BatchCreated, BatchDeleted, BatchError, CreateOptions, Prepared, options_to_json,
};
use crate::client::instance::Instance;
use crate::engine::Engine;
use crate::error::Error;
use crate::workflow::Workflow;

/// One row of an instance listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceSummary {
    /// Its workflow (not serialised: a listing of one workflow names it once).
    #[serde(skip)]
    pub workflow: WorkflowName,
    /// The instance id.
    pub id: InstanceId,
    /// Its status.
    pub status: InstanceStatus,
    /// When it was created (RFC 3339 in JSON, as every time the API shows).
    #[serde(serialize_with = "cairn_core::rfc3339::serialize")]
    pub created: cairn_core::Timestamp,
    /// When it first started.
    #[serde(serialize_with = "cairn_core::rfc3339::option::serialize")]
    pub started: Option<cairn_core::Timestamp>,
    /// When it finished.
    #[serde(serialize_with = "cairn_core::rfc3339::option::serialize")]
    pub ended: Option<cairn_core::Timestamp>,
    /// The version of its workflow's code, for a workflow run by workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why it failed, when it has (errored): listings show failures without a lookup each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<cairn_core::ErrorInfo>,
    /// Its place in listings (see [`InstanceSummary::cursor`]).
    #[serde(skip)]
    position: cairn_store::InstanceRef,
    /// Whether it came from an oldest-first listing (its cursors continue that one).
    #[serde(skip)]
    oldest_first: bool,
}

impl InstanceSummary {
    /// A cursor ([`ListOptions::cursor`]) for the listing that continues right after this
    /// row: for callers that stop within a page (a filter of their own, a smaller page).
    pub fn cursor(&self) -> String {
        encode_cursor(self.position, self.oldest_first)
    }

    /// A cursor for the listing that starts at this row (it and everything after it in
    /// the listing's order): pins a newest-first listing, or an action over it, to the
    /// instances that existed when this row was read.
    pub fn cursor_including(&self) -> String {
        let position = if self.oldest_first {
            self.position.0.saturating_sub(1)
        } else {
            self.position.0.saturating_add(1)
        };
        encode_cursor(cairn_store::InstanceRef(position), self.oldest_first)
    }
}

/// Which instances a listing returns.
///
/// ```
/// use cairn::{InstanceStatus, ListOptions};
/// let waiting = ListOptions::default().status(InstanceStatus::Waiting).limit(100);
/// # let _ = waiting;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListOptions {
    /// Only instances in one of these statuses (any status when empty).
    pub statuses: Vec<InstanceStatus>,
    /// Only instances created at or after this time.
    pub created_from: Option<cairn_core::Timestamp>,
    /// Only instances created before this time.
    pub created_before: Option<cairn_core::Timestamp>,
    /// Only instances whose id starts with this.
    pub id_prefix: Option<String>,
    /// Start after this position: the previous page's [`InstancePage::cursor`].
    pub cursor: Option<String>,
    /// Oldest first instead of newest first; a cursor then continues towards newer rows.
    pub oldest_first: bool,
    /// At most this many (default 50).
    pub limit: usize,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions {
            statuses: Vec::new(),
            created_from: None,
            created_before: None,
            id_prefix: None,
            cursor: None,
            oldest_first: false,
            limit: 50,
        }
    }
}

impl ListOptions {
    /// Only instances in `status` (or in another status given this way).
    pub fn status(mut self, status: InstanceStatus) -> Self {
        if !self.statuses.contains(&status) {
            self.statuses.push(status);
        }
        self
    }

    /// Only instances created at or after `at`.
    pub fn created_from(mut self, at: cairn_core::Timestamp) -> Self {
        self.created_from = Some(at);
        self
    }

    /// Only instances created before `at`.
    pub fn created_before(mut self, at: cairn_core::Timestamp) -> Self {
        self.created_before = Some(at);
        self
    }

    /// Only instances whose id starts with `prefix`.
    pub fn id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.id_prefix = Some(prefix.into());
        self
    }

    /// Oldest first (a cursor then continues towards newer rows).
    pub fn oldest_first(mut self) -> Self {
        self.oldest_first = true;
        self
    }

    /// The store's query for these options over `workflow` (every workflow when `None`).
    fn query(&self, workflow: Option<WorkflowName>) -> Result<cairn_store::ListQuery, Error> {
        Ok(cairn_store::ListQuery {
            workflow,
            statuses: self.statuses.clone(),
            created_from: self.created_from,
            created_before: self.created_before,
            id_prefix: self.id_prefix.clone(),
            after: self
                .cursor
                .as_deref()
                .map(|c| decode_cursor(c, self.oldest_first))
                .transpose()?,
            oldest_first: self.oldest_first,
            limit: self.limit,
        })
    }

    /// The page after `cursor`.
    pub fn cursor(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// At most `limit` instances.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// One page of a listing.
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
/// An oldest-first listing's cursors: a cursor continues the listing it came from, and
/// one of the other order is refused rather than read backwards.
const CURSOR_PREFIX_OLDEST_FIRST: &str = "a1.";

fn encode_cursor(instance: cairn_store::InstanceRef, oldest_first: bool) -> String {
    let prefix = if oldest_first {
        CURSOR_PREFIX_OLDEST_FIRST
    } else {
        CURSOR_PREFIX
    };
    format!("{prefix}{:x}", instance.0)
}

fn decode_cursor(cursor: &str, oldest_first: bool) -> Result<cairn_store::InstanceRef, Error> {
    let prefix = if oldest_first {
        CURSOR_PREFIX_OLDEST_FIRST
    } else {
        CURSOR_PREFIX
    };
    cursor
        .strip_prefix(prefix)
        .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        .filter(|n| *n > 0 || (oldest_first && *n == 0))
        .map(cairn_store::InstanceRef)
        .ok_or_else(|| Error::InvalidCursor(cursor.to_owned()))
}

/// A handle to one workflow's instances, typed by the workflow.
pub struct WorkflowClient<W> {
    pub(crate) untyped: UntypedWorkflow,
    pub(crate) _workflow: PhantomData<fn() -> W>,
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
    pub(crate) engine: Engine,
    pub(crate) name: WorkflowName,
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
            .create_stored(options_to_json(self.untyped.name(), options)?)
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
            .map(|o| options_to_json(self.untyped.name(), o))
            .collect::<Result<Vec<_>, Error>>()?;
        let created = self.untyped.create_batch_stored(batch).await?;
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
            .map(|o| options_to_json(self.untyped.name(), o))
            .collect::<Result<Vec<_>, Error>>()?;
        let result = self.untyped.create_batch_detailed_stored(batch).await?;
        Ok(BatchCreated {
            created: result.created.into_iter().map(Instance::typed).collect(),
            errors: result.errors,
        })
    }

    /// One page of this workflow's instances (see [`UntypedWorkflow::list`]).
    ///
    /// # Errors
    /// As [`UntypedWorkflow::list`].
    pub async fn list(&self, options: &ListOptions) -> Result<InstancePage, Error> {
        self.untyped.list(options).await
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

    /// The store's concurrency of an instance created with `key`.
    fn concurrency(&self, key: String) -> Result<cairn_store::Concurrency, Error> {
        if key.is_empty() || key.chars().count() > 100 || key.chars().any(char::is_control) {
            return Err(Error::InvalidConcurrencyKey(key));
        }
        let limits = self
            .engine
            .inner
            .concurrency
            .get(&self.name)
            .ok_or_else(|| Error::NoConcurrencyLimit(self.name.to_string()))?;
        Ok(limits.for_key(key))
    }

    /// The params as stored (JSON text) if the workflow takes them: they decode as its
    /// `Params` and are within the payload limit.
    pub(crate) fn check_params(&self, params: &serde_json::Value) -> Result<String, Error> {
        let workflow = self.engine.inner.workflows.get(&self.name);
        if workflow.is_none() && !self.engine.inner.env.remote.knows(&self.name) {
            return Err(Error::UnknownWorkflow(self.name.to_string()));
        }
        let text = params.to_string();
        let limit = self.engine.inner.env.limits.payload_limit;
        let size = cairn_core::binary::size(&text);
        if size > limit {
            return Err(Error::PayloadTooLarge {
                what: "params",
                size,
                limit,
            });
        }
        // A worker's workflow takes any JSON: its code checks what it needs.
        if let Some(workflow) = workflow {
            workflow
                .check_params(params)
                .map_err(|reason| Error::InvalidParams {
                    workflow: self.name.to_string(),
                    reason,
                })?;
        }
        Ok(text)
    }

    fn prepare(
        &self,
        index: usize,
        options: CreateOptions<serde_json::Value>,
    ) -> Result<Prepared, (Option<String>, Error)> {
        let id = match options.id {
            Some(id) if cairn_core::RESERVED_INSTANCE_IDS.contains(&id.as_str()) => {
                return Err((Some(id.clone()), IdError::ReservedInstanceId(id).into()));
            }
            Some(id) => InstanceId::new(id.clone()).map_err(|e| (Some(id), e.into()))?,
            None => InstanceId::new(uuid::Uuid::new_v4().to_string())
                .expect("a UUID is a valid instance id"),
        };
        let fail = |e: Error| (Some(id.to_string()), e);
        let text = self.check_params(&options.params).map_err(fail)?;
        // The params are stored whole once, in the instance's row; the log shows them (cut
        // when large), byte sequences as their size.
        let params = cairn_core::binary::log_view(&text);
        let concurrency = match options.concurrency_key {
            None => None,
            Some(key) => Some(self.concurrency(key).map_err(fail)?),
        };
        let now = self.engine.inner.env.clock.now();
        let target = self
            .engine
            .inner
            .env
            .target(&self.name)
            .ok_or_else(|| fail(Error::UnknownWorkflow(self.name.to_string())))?;
        let retention = cairn_store::Retention {
            success: options
                .retention
                .success
                .unwrap_or(target.retention.success),
            error: options.retention.error.unwrap_or(target.retention.error),
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
                    meta: json!({
                        "params": params,
                        "trigger": { "source": "api" },
                    }),
                },
                retention,
                parent: None,
                priority: options.priority,
                concurrency,
                version: target.version,
            },
        })
    }

    /// Writes the prepared instances; each comes back as its index in the batch, its id
    /// and what the store did.
    async fn insert(
        &self,
        prepared: Vec<Prepared>,
    ) -> Result<Vec<(usize, InstanceId, Created)>, Error> {
        let (names, news): (Vec<_>, Vec<_>) = prepared
            .into_iter()
            .map(|p| ((p.index, p.id), p.new))
            .unzip();
        let created = self.engine.inner.env.store.create(news).await?;
        let new = created
            .iter()
            .filter(|c| matches!(c, Created::New(_)))
            .count();
        self.created(new);
        Ok(names
            .into_iter()
            .zip(created)
            .map(|((index, id), created)| (index, id, created))
            .collect())
    }

    /// `new` instances were created: counted, and the scheduler and the live views woken.
    fn created(&self, new: usize) {
        if new > 0 {
            crate::telemetry::created(self.engine.inner.env.seen(), &self.name, new);
            self.engine.inner.env.wake.notify_one();
            self.engine.inner.changed();
        }
    }

    /// Fires `tick` of the schedule `schedule` (of `generation`): its instance is created
    /// with `options` (params stored) in the transaction that records the tick
    /// (`Store::fire_tick`).
    pub(crate) async fn fire_tick(
        &self,
        schedule: &str,
        generation: u64,
        declared: bool,
        tick: cairn_core::Timestamp,
        options: CreateOptions<serde_json::Value>,
        passed_over: bool,
    ) -> Result<cairn_store::TickFired, Error> {
        let prepared = self.prepare(0, options).map_err(|(_, e)| e)?;
        let fired = self
            .engine
            .inner
            .env
            .store
            .fire_tick(cairn_store::ScheduleTick {
                schedule: schedule.to_owned(),
                generation,
                tick,
                declared,
                instance: prepared.new,
                passed_over,
                ahead_after: self
                    .engine
                    .clock()
                    .now()
                    .saturating_add(crate::client::schedules::CLOCK_AHEAD),
            })
            .await?;
        self.created(usize::from(matches!(
            fired,
            cairn_store::TickFired::Fired(_)
        )));
        Ok(fired)
    }

    fn instance(&self, id: InstanceId) -> Instance {
        self.instance_of(id, None)
    }

    /// A handle to the instance `id`, which this client's create wrote as `row`.
    fn instance_of(&self, id: InstanceId, row: Option<InstanceRef>) -> Instance {
        Instance {
            engine: self.engine.clone(),
            workflow: self.name.clone(),
            id,
            created_as: row,
            _output: PhantomData,
        }
    }

    /// Creates an instance with JSON params (`{}` is Cloudflare's default). The params are
    /// stored so that they read back exactly as given, whatever their keys (a `$bytes` key
    /// is the user's, not a byte sequence).
    ///
    /// # Errors
    /// As [`WorkflowClient::create`], plus [`Error::InvalidParams`] when the params do not
    /// decode as the workflow's `Params`.
    pub async fn create(
        &self,
        options: CreateOptions<serde_json::Value>,
    ) -> Result<Instance, Error> {
        self.create_stored(self.stored(options)?).await
    }

    /// `options` with its params in their stored form (`cairn_core::binary`).
    fn stored(
        &self,
        options: CreateOptions<serde_json::Value>,
    ) -> Result<CreateOptions<serde_json::Value>, Error> {
        options_to_json(&self.name, options)
    }

    /// [`UntypedWorkflow::create`] with params already in their stored form (from a typed
    /// client, a schedule or the simulator, which wrote them with `cairn_core::binary`).
    pub(crate) async fn create_stored(
        &self,
        options: CreateOptions<serde_json::Value>,
    ) -> Result<Instance, Error> {
        let prepared = self.prepare(0, options).map_err(|(_, e)| e)?;
        let id = prepared.id.clone();
        match self.insert(vec![prepared]).await?[..] {
            [(_, _, Created::New(row))] => Ok(self.instance_of(id, Some(row))),
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
        let batch = batch
            .into_iter()
            .map(|o| self.stored(o))
            .collect::<Result<Vec<_>, Error>>()?;
        self.create_batch_stored(batch).await
    }

    /// [`UntypedWorkflow::create_batch`] with params in their stored form.
    pub(crate) async fn create_batch_stored(
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
            .filter_map(|(_, id, created)| match created {
                Created::New(row) => Some(self.instance_of(id, Some(row))),
                Created::AlreadyExists => None,
            })
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
        let batch = batch
            .into_iter()
            .map(|o| self.stored(o))
            .collect::<Vec<_>>();
        self.create_batch_detailed_results(batch).await
    }

    /// [`UntypedWorkflow::create_batch_detailed`] with params in their stored form.
    pub(crate) async fn create_batch_detailed_stored(
        &self,
        batch: Vec<CreateOptions<serde_json::Value>>,
    ) -> Result<BatchCreated<serde_json::Value>, Error> {
        self.create_batch_detailed_results(batch.into_iter().map(Ok).collect())
            .await
    }

    /// The detailed batch, each entry's params stored or why they could not be.
    async fn create_batch_detailed_results(
        &self,
        batch: Vec<Result<CreateOptions<serde_json::Value>, Error>>,
    ) -> Result<BatchCreated<serde_json::Value>, Error> {
        Self::check_batch_size(batch.len())?;
        let mut errors = Vec::new();
        let mut prepared = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, options) in batch.into_iter().enumerate() {
            let prepared_one = options
                .map_err(|e| (None, e))
                .and_then(|options| self.prepare(i, options));
            match prepared_one {
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
            for (index, id, outcome) in self.insert(prepared).await? {
                match outcome {
                    Created::New(row) => created.push(self.instance_of(id, Some(row))),
                    Created::AlreadyExists => errors.push(BatchError {
                        index,
                        id: Some(id.to_string()),
                        code: "instance.already_exists".into(),
                        message: Error::AlreadyExists {
                            workflow: self.name.to_string(),
                            id: id.to_string(),
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
    /// oldest first (at most `limit`), each with its instance id, and the id to resume
    /// after ([`WorkflowLogPage::scanned_to`](crate::WorkflowLogPage::scanned_to)), which
    /// moves past other workflows' records even when none of this one's are new.
    ///
    /// # Errors
    /// A store failure.
    pub async fn log(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<cairn_store::WorkflowLogPage, Error> {
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

    /// One page of this workflow's instances, newest first: see [`ListOptions`]. The cursor
    /// is a position in creation order, not an instance: it stays valid when instances on
    /// either side are deleted or purged.
    ///
    /// # Errors
    /// A cursor not handed out by a listing (`cursor.invalid`), or a store failure.
    pub async fn list(&self, options: &ListOptions) -> Result<InstancePage, Error> {
        list(&self.engine, Some(self.name.clone()), options).await
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

/// One page of the instances of `workflow` (of every workflow when `None`) that `options`
/// select, newest first.
pub(crate) async fn list(
    engine: &Engine,
    workflow: Option<WorkflowName>,
    options: &ListOptions,
) -> Result<InstancePage, Error> {
    let limit = options.limit;
    let query = options.query(workflow)?;
    if !prefix_can_match(&query) {
        return Ok(InstancePage {
            instances: Vec::new(),
            cursor: None,
        });
    }
    let rows = engine.inner.env.store.list(query).await?;
    let cursor = (rows.len() == limit && limit > 0)
        .then(|| {
            rows.last()
                .map(|r| encode_cursor(r.instance, options.oldest_first))
        })
        .flatten();
    Ok(InstancePage {
        instances: rows
            .into_iter()
            .map(|r| InstanceSummary {
                workflow: r.workflow,
                id: r.id,
                status: r.status,
                created: r.created_at,
                started: r.started_at,
                ended: r.ended_at,
                version: r.version,
                error: r.error,
                position: r.instance,
                oldest_first: options.oldest_first,
            })
            .collect(),
        cursor,
    })
}

/// How many instances of `workflow` (of every workflow when `None`) `options` select,
/// ignoring its cursor and limit.
pub(crate) async fn count(
    engine: &Engine,
    workflow: Option<WorkflowName>,
    options: &ListOptions,
) -> Result<u64, Error> {
    let query = options.query(workflow)?;
    if !prefix_can_match(&query) {
        return Ok(0);
    }
    Ok(engine.inner.env.store.count_matching(query).await?)
}

/// Whether an id could start with the query's prefix: ids are ASCII letters, digits, `_`
/// and `-`, so a prefix with anything else matches nothing (and is never sent to a store,
/// where a NUL byte is an error on PostgreSQL).
fn prefix_can_match(query: &cairn_store::ListQuery) -> bool {
    query.id_prefix.as_deref().is_none_or(|p| {
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}
