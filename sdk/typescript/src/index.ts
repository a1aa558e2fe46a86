// The package's public API, the only module users import. The names are Cloudflare's
// (`cloudflare:workers`, `cloudflare:workflows`, the global `Workflow`), so moving code
// to Cairn changes its imports and nothing else.

export { WorkflowEntrypoint } from "./entrypoint.js";
export type { ExecutionContext, WorkflowClass, WorkflowEvent } from "./entrypoint.js";

export { WorkflowStep } from "./step.js";
export type {
  InvokeOptions,
  WorkflowStepRollbackConfig,
  WorkflowRollbackContext,
  WorkflowRollbackHandler,
  WorkflowStepCallback,
  WorkflowStepEvent,
  WorkflowStepRollbackOptions,
} from "./step.js";

export type {
  WorkflowBackoff,
  WorkflowDelayDuration,
  WorkflowDelayFunction,
  WorkflowDynamicDelayContext,
  WorkflowDuration,
  WorkflowDurationLabel,
  WorkflowRetentionDuration,
  WorkflowSleepDuration,
  WorkflowStepConfig,
  WorkflowStepContext,
  WorkflowTimeoutDuration,
} from "./config.js";

export { CairnApiError, NonRetryableError } from "./errors.js";

export { CairnWorkflow, WorkflowInstance, workflowBinding } from "./binding.js";
export type {
  BindingOptions,
  InstanceStatus,
  InstanceStatusName,
  RestartFrom,
  Workflow,
  WorkflowInstanceCreateOptions,
} from "./binding.js";

export { CairnWorker, serve } from "./worker.js";
export type { Logger, ServeOptions } from "./worker.js";
