// `WorkflowEntrypoint`: the class a workflow extends, shaped as Cloudflare's in
// `cloudflare:workers` so that code written for Cloudflare compiles unchanged.

import type { WorkflowStep } from "./step.js";

/** What `run` receives about the instance. */
export interface WorkflowEvent<T> {
  /** The instance's params. */
  payload: Readonly<T>;
  /** When the instance was created. */
  timestamp: Date;
  instanceId: string;
  /** The workflow's name. */
  workflowName: string;
}

/**
 * The `ctx` Cloudflare passes to an entrypoint. A worker has no request to extend, so
 * `waitUntil` only keeps a rejected promise from going unnoticed.
 */
export interface ExecutionContext {
  waitUntil(promise: Promise<unknown>): void;
  passThroughOnException(): void;
}

/** The `ctx` every entrypoint gets. */
export function executionContext(onRejected: (error: unknown) => void): ExecutionContext {
  return {
    waitUntil(promise) {
      Promise.resolve(promise).catch(onRejected);
    },
    passThroughOnException() {},
  };
}

/**
 * A workflow: extend it and implement `run`. The worker (`serve`) makes one instance per
 * run as Cloudflare does, `new MyWorkflow(ctx, env)`, with the `env` given to `serve`.
 */
export abstract class WorkflowEntrypoint<Env = unknown, Params = unknown> {
  protected ctx: ExecutionContext;
  protected env: Env;

  constructor(ctx: ExecutionContext, env: Env) {
    this.ctx = ctx;
    this.env = env;
  }

  /**
   * The workflow's code. It runs from the top on every run of the instance: steps that
   * finished answer from the journal at once, code outside steps runs again.
   */
  abstract run(event: Readonly<WorkflowEvent<Params>>, step: WorkflowStep): Promise<unknown>;
}

/** What `serve` accepts for a workflow: a class constructed as Cloudflare constructs one. */
export type WorkflowClass<Env = unknown> = new (
  ctx: ExecutionContext,
  env: Env,
) => { run(event: WorkflowEvent<any>, step: WorkflowStep): Promise<unknown> | unknown };
