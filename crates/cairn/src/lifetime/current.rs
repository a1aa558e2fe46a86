//! Which instance's workflow code the current task runs: a task-local set around
//! `Workflow::run`, so a management call made from inside a workflow can tell it concerns
//! its own instance.

tokio::task_local! {
    /// The instance whose workflow code the current task is running.
    pub(crate) static CURRENT: (cairn_core::WorkflowName, cairn_core::InstanceId);
}

/// Whether the calling code is the workflow of this very instance.
pub(crate) fn is_current(workflow: &cairn_core::WorkflowName, id: &cairn_core::InstanceId) -> bool {
    CURRENT
        .try_with(|(w, i)| w == workflow && i == id)
        .unwrap_or(false)
}
