//! Managing instances: [`WorkflowClient`] (typed) and [`UntypedWorkflow`] (JSON) to create
//! and look up instances, and [`Instance`] to read their status, details and event log. The
//! top layer: it drives the engine below through the store and the runtime's live set.

pub(crate) mod create;
pub(crate) mod details;
pub(crate) mod instance;
pub(crate) mod workflow;

use std::marker::PhantomData;

use crate::engine::Engine;
use crate::error::Error;
use crate::workflow::Workflow;
use cairn_core::WorkflowName;

pub use create::{BatchCreated, BatchDeleted, BatchError, CreateOptions, InstanceRetention};
pub use details::{AttemptDetails, InstanceDetails, StepDetails};
pub use instance::{Delivery, Instance, MAX_IDEMPOTENCY_KEY, Status};
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
