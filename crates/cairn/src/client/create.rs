//! Creating instances: [`CreateOptions`], per-instance retention, and what batches report.

use cairn_core::{InstanceId, WorkflowName};
use cairn_store::NewInstance;
use serde::{Deserialize, Serialize};

use crate::client::instance::Instance;
use crate::error::Error;

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
    /// The concurrency key it runs under (1–100 characters): at most the workflow's
    /// [`Concurrency`](crate::Concurrency) limit of instances with the same key run at once.
    #[serde(
        default,
        rename = "concurrencyKey",
        skip_serializing_if = "Option::is_none"
    )]
    pub concurrency_key: Option<String>,
    /// Among the instances waiting for a slot of the key, higher priorities start first
    /// (default 0).
    #[serde(default)]
    pub priority: i32,
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
            concurrency_key: None,
            priority: 0,
        }
    }

    /// Sets the instance id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Runs it under concurrency key `key` (see [`CreateOptions::concurrency_key`]).
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// Its priority among the instances waiting for a slot of its key.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
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
            concurrency_key: self.concurrency_key,
            priority: self.priority,
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

/// The result of [`WorkflowClient::create_batch_detailed`](crate::WorkflowClient::create_batch_detailed).
#[derive(Debug, Clone)]
pub struct BatchCreated<O> {
    /// The instances created, in input order.
    pub created: Vec<Instance<O>>,
    /// One entry per input that was not created.
    pub errors: Vec<BatchError>,
}

/// The result of [`UntypedWorkflow::delete_batch`](crate::UntypedWorkflow::delete_batch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchDeleted {
    /// The ids deleted, one per input position that named an existing instance.
    pub deleted: Vec<String>,
    /// One entry per input position that could not be deleted.
    pub errors: Vec<BatchError>,
}

/// The JSON form of typed create options.
pub(crate) fn options_to_json<P: Serialize>(
    workflow: &WorkflowName,
    options: CreateOptions<P>,
) -> Result<CreateOptions<serde_json::Value>, Error> {
    let params =
        cairn_core::binary::to_value(&options.params).map_err(|e| Error::InvalidParams {
            workflow: workflow.to_string(),
            reason: e.to_string(),
        })?;
    Ok(options.with_params(params))
}

/// One entry of a batch after validation.
pub(crate) struct Prepared {
    pub(crate) index: usize,
    pub(crate) id: InstanceId,
    pub(crate) new: NewInstance,
}
