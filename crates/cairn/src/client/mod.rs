//! Managing instances: [`WorkflowClient`] (typed) and [`UntypedWorkflow`] (JSON) to create
//! and look up instances, and [`Instance`] to read their status, details and event log. The
//! top layer: it drives the engine below through the store and the runtime's live set.

pub(crate) mod create;
pub(crate) mod details;
pub(crate) mod instance;
mod output;
mod replay;
mod schedules;
pub(crate) mod workflow;

use std::marker::PhantomData;

use crate::engine::Engine;
use crate::error::Error;
use crate::workflow::Workflow;
use cairn_core::WorkflowName;

pub use create::{BatchCreated, BatchDeleted, BatchError, CreateOptions, InstanceRetention};
pub use details::{
    AttemptDetails, DETAILS_OUTPUT_LIMIT, InstanceDetails, Relative, SlotWait, StepDetails,
};
pub use instance::{Delivery, Instance, MAX_IDEMPOTENCY_KEY, Status};
pub use output::{StepOutput, StepSelector};
pub use schedules::ScheduleEntry;
pub use workflow::{InstancePage, InstanceSummary, ListOptions, UntypedWorkflow, WorkflowClient};

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

    /// The JSON handle of the workflow named `name`: one registered in Rust, or one a
    /// worker has registered (`docs/worker-protocol.md`), connected now or not.
    ///
    /// # Errors
    /// [`Error::InvalidId`] for an invalid name, [`Error::UnknownWorkflow`] if none is registered.
    pub fn workflow_by_name(&self, name: &str) -> Result<UntypedWorkflow, Error> {
        let name = WorkflowName::new(name)?;
        if !self.inner.workflows.contains_key(&name) && !self.inner.env.remote.knows(&name) {
            return Err(Error::UnknownWorkflow(name.to_string()));
        }
        Ok(UntypedWorkflow {
            engine: self.clone(),
            name,
        })
    }

    /// One page of the instances `options` select across every workflow (or of `workflow`),
    /// newest first: the dashboard's listing. Each row names its workflow.
    ///
    /// # Errors
    /// An unknown workflow, a cursor not handed out by a listing, or a store failure.
    pub async fn list_instances(
        &self,
        workflow: Option<&str>,
        options: &ListOptions,
    ) -> Result<InstancePage, Error> {
        let workflow = workflow
            .map(|w| self.workflow_by_name(w).map(|w| w.name))
            .transpose()?;
        workflow::list(self, workflow, options).await
    }

    /// How many instances [`Engine::list_instances`] would list in all its pages (a scan of
    /// the matching rows: for a confirmation such as "terminate 1,204 instances?").
    ///
    /// # Errors
    /// An unknown workflow, or a store failure.
    pub async fn count_instances(
        &self,
        workflow: Option<&str>,
        options: &ListOptions,
    ) -> Result<u64, Error> {
        let workflow = workflow
            .map(|w| self.workflow_by_name(w).map(|w| w.name))
            .transpose()?;
        workflow::count(self, workflow, options).await
    }
}
