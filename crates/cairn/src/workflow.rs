//! The [`Workflow`] trait users implement, the [`WorkflowEvent`] it receives, and the
//! type-erased form the engine keeps in its registry.

use std::future::Future;
use std::sync::Arc;

use cairn_core::{InstanceId, Timestamp, WorkflowName};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::failure::WorkflowError;
use crate::ops::WorkflowStep;

/// A durable workflow: async Rust whose side effects live in named steps.
///
/// `run` is called from the top on every start and every replay; each step returns its
/// stored result instead of running again once it has one. Code outside steps therefore
/// runs many times and must be deterministic (see the guide "Rules of workflows").
///
/// App dependencies (clients, pools) live on the implementing struct.
pub trait Workflow: Send + Sync + 'static {
    /// The workflow's name, unique within an engine (1–64 characters of `[a-zA-Z0-9_-]`).
    const NAME: &'static str;
    /// The params given at creation, stored as JSON.
    type Params: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What `run` returns: the instance's output, stored as JSON.
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// Runs (or replays) one instance.
    fn run(
        &self,
        event: WorkflowEvent<Self::Params>,
        step: WorkflowStep,
    ) -> impl Future<Output = Result<Self::Output, WorkflowError>> + Send;
}

impl WorkflowStep {
    /// Starts an instance of the workflow `C` as this instance's child and waits for it,
    /// durably: the parent may hibernate meanwhile (a child that runs for a month costs the
    /// parent no memory). Returns the child's output, or its end as this step's error: its
    /// own error (name kept, message naming the child) when it errored,
    /// `ChildTerminatedError` when it was terminated, `ChildDeletedError` when it was
    /// deleted first.
    ///
    /// The child is created once, in the commit that records this step, with an id derived
    /// from this instance and the step (`<parent id>-<step>-<count>-<hash>`); every replay
    /// finds the same child, and its outcome is kept in this instance's journal. `C` must
    /// be registered with the engine. A child still running when the parent ends is
    /// terminated with it (terminated *with rollback* when the parent is), unless the op is
    /// [`InvokeOp::detached`](crate::InvokeOp::detached); restarting the parent restarts the children of the steps it
    /// runs again. The step is not retried: a child retries its own steps, and a failed
    /// child is an outcome to handle (or let fail the parent, whose rollback then runs).
    pub fn invoke<C: Workflow>(
        &self,
        name: impl Into<String>,
        params: C::Params,
    ) -> crate::ops::InvokeOp<C::Output> {
        // `C::Params`'s Serialize impl is user code.
        let params = crate::panic::to_json(&params).map_err(|e| e.to_string());
        self.invoke_child(
            name.into(),
            crate::ops::invoke::Child {
                workflow: C::NAME.to_owned(),
                params,
            },
        )
    }
}

impl WorkflowStep {
    /// [`WorkflowStep::invoke`] for a workflow known by name, its params and output as
    /// JSON: a workflow run by workers (in TypeScript, say), or one registered in Rust
    /// whose type this code does not name. The same durable op: the child is created once,
    /// with the newest version of a worker's workflow, and its outcome journaled.
    pub fn invoke_by_name(
        &self,
        name: impl Into<String>,
        workflow: impl Into<String>,
        params: serde_json::Value,
    ) -> crate::ops::InvokeOp<serde_json::Value> {
        // Stored as a client's JSON is: a user's `$` keys escaped (`binary::external`'s
        // inverse), so the child reads exactly these params.
        let params = cairn_core::binary::to_value(&params)
            .map(|v| v.to_string())
            .map_err(|e| e.to_string());
        self.invoke_child(
            name.into(),
            crate::ops::invoke::Child {
                workflow: workflow.into(),
                params,
            },
        )
    }
}

/// The first argument of [`Workflow::run`]: the instance's params and identity. It is the
/// same on every replay and after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowEvent<P> {
    /// The params given at creation.
    pub payload: P,
    /// When the instance was created.
    pub timestamp: Timestamp,
    /// The instance's id.
    pub instance_id: InstanceId,
    /// The workflow's name.
    pub workflow_name: WorkflowName,
}

/// A workflow with its types erased to JSON, as the registry holds it.
pub(crate) trait ErasedWorkflow: Send + Sync + 'static {
    /// Checks that `params` decode as the workflow's `Params`.
    fn check_params(&self, params: &serde_json::Value) -> Result<(), String>;

    /// Runs the workflow on JSON params, returning the output as JSON.
    fn run(
        self: Arc<Self>,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> BoxFuture<'static, Result<serde_json::Value, WorkflowError>>;
}

pub(crate) struct Registered<W>(pub(crate) W);

impl<W: Workflow> ErasedWorkflow for Registered<W> {
    fn check_params(&self, params: &serde_json::Value) -> Result<(), String> {
        // `Params`' Deserialize impl is user code.
        crate::panic::from_value::<W::Params>(params)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn run(
        self: Arc<Self>,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> BoxFuture<'static, Result<serde_json::Value, WorkflowError>> {
        Box::pin(async move {
            let payload = crate::panic::from_value::<W::Params>(&event.payload).map_err(|e| {
                WorkflowError::new(
                    crate::failure::INTERNAL,
                    format!("the stored params do not decode as this workflow's params: {e}"),
                )
            })?;
            let event = WorkflowEvent {
                payload,
                timestamp: event.timestamp,
                instance_id: event.instance_id,
                workflow_name: event.workflow_name,
            };
            let output = self.0.run(event, step).await?;
            cairn_core::binary::to_value(&output).map_err(|e| {
                WorkflowError::new(
                    crate::failure::INTERNAL,
                    format!("the workflow's output is not serialisable: {e}"),
                )
            })
        })
    }
}
