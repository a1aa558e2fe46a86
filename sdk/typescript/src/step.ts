// `WorkflowStep`: what a workflow's `run(event, step)` calls. Each method checks its
// arguments, turns the call into one op and hands it, with the functions the engine may
// ask for later (callback, delay function, rollback handler), to the run. The run numbers
// the op at once, before anything is awaited: that is what makes `Promise.all` over steps
// replay in the same order.

import { type WorkflowDuration, type WorkflowStepConfig, type WorkflowStepContext, describe, wireConfig, wireDuration } from "./config.js";
import type { OpBody } from "./protocol.js";
import { toJsonValue } from "./values.js";

/** A step's callback: called once per attempt, its value is the step's output. */
export type WorkflowStepCallback<T> = (ctx: WorkflowStepContext) => T | Promise<T>;

/** Cloudflare's rollback config: retries and timeout only. */
export type WorkflowStepRollbackConfig = Pick<WorkflowStepConfig, "retries" | "timeout">;

/** What a rollback handler receives. */
export interface WorkflowRollbackContext<T = unknown> {
  /** The step's output, or `undefined` if it never returned one (it failed, or was interrupted). */
  output: T | undefined;
  /** The error that is failing the instance. */
  error: Error;
  /** The forward step's context; `attempt` is the rollback's own attempt. */
  ctx: WorkflowStepContext;
  /** `"<name>-<count>"` (Cloudflare keeps it for older code). */
  stepName: string;
}

export type WorkflowRollbackHandler<T = unknown> = (args: WorkflowRollbackContext<T>) => unknown;

/** The trailing options of `step.do`: a compensation for the saga. */
export interface WorkflowStepRollbackOptions<T = unknown> {
  rollback: WorkflowRollbackHandler<T>;
  rollbackConfig?: WorkflowStepRollbackConfig;
}

/** What `waitForEvent` returns. */
export interface WorkflowStepEvent<T> {
  payload: Readonly<T>;
  timestamp: Date;
  type: string;
}

/** Options of `step.invoke` (Cairn only). */
export interface InvokeOptions {
  /** The child outlives its parent, and the step returns once it has started. */
  detached?: boolean;
}

/** The functions a `do` op keeps for the tasks the engine asks for. */
export interface DoHandlers {
  name: string;
  config: WorkflowStepConfig | undefined;
  callback: WorkflowStepCallback<unknown>;
  rollback?: WorkflowStepRollbackOptions<unknown>;
}

/** Where a WorkflowStep sends its ops: the run it belongs to. */
export interface OpSink {
  /** Numbers and sends the op now; settles with the engine's answer. */
  submit(body: OpBody, handlers?: DoHandlers): Promise<unknown>;
}

const MAX_NAME = 256;
const MAX_EVENT_TYPE = 100;

/**
 * The `step` of `run(event, step)`: Cloudflare's `WorkflowStep`, plus `invoke` (Cairn only).
 * Abstract and without private state, as Cloudflare's, so a test double that implements
 * the methods type-checks; a run gets a `RunStep`.
 */
export abstract class WorkflowStep {
  /**
   * A durable step: `callback` runs (once per attempt, retried per `config`) until it
   * returns; its output is stored and every later run of the instance gets it back
   * without calling `callback` again. `rollback` compensates the step if the instance
   * fails later.
   */
  abstract do<T>(name: string, callback: WorkflowStepCallback<T>, options?: WorkflowStepRollbackOptions<T>): Promise<T>;
  abstract do<T>(
    name: string,
    config: WorkflowStepConfig,
    callback: WorkflowStepCallback<T>,
    options?: WorkflowStepRollbackOptions<T>,
  ): Promise<T>;

  /** Sleeps for `duration` (milliseconds, or `"1 hour"`): the instance hibernates meanwhile. */
  abstract sleep(name: string, duration: WorkflowDuration): Promise<void>;

  /** Sleeps until `timestamp` (a Date, or milliseconds since the epoch). */
  abstract sleepUntil(name: string, timestamp: Date | number): Promise<void>;

  /**
   * Waits for an event of `type` sent to this instance (`instance.sendEvent`), at most
   * `timeout` (default 24 hours; then it throws a `WorkflowTimeoutError`).
   */
  abstract waitForEvent<T = unknown>(
    name: string,
    options: { type: string; timeout?: WorkflowDuration },
  ): Promise<WorkflowStepEvent<T>>;

  /**
   * **Cairn only** (Cloudflare has no such call): starts an instance of `workflow` as this
   * instance's child and returns its output (its error is this step's error). The child's
   * id is derived from this instance and the step, so a replay never starts it twice.
   * `workflow` is a name, or a binding (`env.OTHER_WORKFLOW`).
   */
  abstract invoke<T = unknown>(
    name: string,
    workflow: string | { readonly name: string },
    params?: unknown,
    options?: InvokeOptions,
  ): Promise<T>;
}

/** The WorkflowStep of one run: checks each call's arguments and submits it as an op. */
export class RunStep extends WorkflowStep {
  readonly #ops: OpSink;

  constructor(ops: OpSink) {
    super();
    this.#ops = ops;
  }

  do<T>(name: string, callback: WorkflowStepCallback<T>, options?: WorkflowStepRollbackOptions<T>): Promise<T>;
  do<T>(
    name: string,
    config: WorkflowStepConfig,
    callback: WorkflowStepCallback<T>,
    options?: WorkflowStepRollbackOptions<T>,
  ): Promise<T>;
  do(name: string, ...rest: unknown[]): Promise<unknown> {
    try {
      checkName(name, "step.do");
      // Cloudflare's rule: a function in second place is the callback, else it is the config.
      const [config, callback, options] =
        typeof rest[0] === "function" ? [undefined, rest[0], rest[1]] : [rest[0] ?? undefined, rest[1], rest[2]];
      if (typeof callback !== "function") throw new TypeError(`step "${name}" requires a callback function`);
      const stepConfig = config as WorkflowStepConfig | undefined;
      const wire = wireConfig(stepConfig, name);
      const body: OpBody = { op: "do", name, config: wire.config, delayFunction: wire.delayFunction };
      const handlers: DoHandlers = { name, config: stepConfig, callback: callback as WorkflowStepCallback<unknown> };
      if (options !== undefined && options !== null) {
        const rollback = checkRollback(options, name);
        body.rollback = { config: wireConfig(rollback.rollbackConfig, name, "Rollback config").config };
        handlers.rollback = rollback;
      }
      return this.#ops.submit(body, handlers);
    } catch (error) {
      return quiet(Promise.reject(error));
    }
  }

  sleep(name: string, duration: WorkflowDuration): Promise<void> {
    try {
      checkName(name, "step.sleep");
      const body: OpBody = { op: "sleep", name, duration: wireDuration(duration, `the duration of sleep "${name}"`) };
      return quiet(this.#ops.submit(body).then(() => undefined));
    } catch (error) {
      return quiet(Promise.reject(error));
    }
  }

  sleepUntil(name: string, timestamp: Date | number): Promise<void> {
    try {
      checkName(name, "step.sleepUntil");
      const until = timestamp instanceof Date ? timestamp.getTime() : timestamp;
      if (typeof until !== "number" || !Number.isFinite(until)) {
        throw new TypeError(`sleepUntil "${name}" needs a Date or milliseconds since the epoch, not ${describe(timestamp)}`);
      }
      return quiet(this.#ops.submit({ op: "sleepUntil", name, until: Math.round(until) }).then(() => undefined));
    } catch (error) {
      return quiet(Promise.reject(error));
    }
  }

  waitForEvent<T = unknown>(
    name: string,
    options: { type: string; timeout?: WorkflowDuration },
  ): Promise<WorkflowStepEvent<T>> {
    try {
      checkName(name, "step.waitForEvent");
      const type = options?.type;
      if (typeof type !== "string" || type === "" || [...type].length > MAX_EVENT_TYPE) {
        throw new TypeError(`waitForEvent "${name}" needs an event type of 1 to ${MAX_EVENT_TYPE} characters, not ${describe(type)}`);
      }
      const body: OpBody = { op: "waitForEvent", name, eventType: type };
      if (options.timeout !== undefined) body.timeout = wireDuration(options.timeout, `the timeout of waitForEvent "${name}"`);
      return quiet(
        this.#ops.submit(body).then((ok) => {
          const event = (ok ?? {}) as { payload?: T; timestamp?: string; type?: string };
          return { payload: event.payload as T, timestamp: new Date(event.timestamp ?? Number.NaN), type: event.type ?? type };
        }),
      );
    } catch (error) {
      return quiet(Promise.reject(error));
    }
  }

  invoke<T = unknown>(
    name: string,
    workflow: string | { readonly name: string },
    params?: unknown,
    options?: InvokeOptions,
  ): Promise<T> {
    try {
      checkName(name, "step.invoke");
      const target = typeof workflow === "string" ? workflow : workflow?.name;
      if (typeof target !== "string" || target === "") {
        throw new TypeError(`invoke "${name}" needs a workflow name or binding, not ${describe(workflow)}`);
      }
      const body: OpBody = {
        op: "invoke",
        name,
        workflow: target,
        params: toJsonValue(params ?? {}, `the params of invoke "${name}"`),
        detached: options?.detached === true,
      };
      return this.#ops.submit(body) as Promise<T>;
    } catch (error) {
      return quiet(Promise.reject(error));
    }
  }
}

/**
 * `promise`, whose rejection is not unhandled when the code never awaits it: a step the
 * code starts and drops (bad arguments, a wait that times out) must not end the worker's
 * process, as Cloudflare swallows it. Code that awaits it still gets the error.
 */
function quiet<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => {});
  return promise;
}

function checkName(name: unknown, call: string): asserts name is string {
  if (typeof name !== "string" || name === "") {
    throw new TypeError(`${call} needs a name of 1 to ${MAX_NAME} characters, not ${describe(name)}`);
  }
  // Cloudflare's rule and message (the engine's too): refused here, before the step is
  // counted, as the engine refuses it before it counts it.
  if ([...name].length > MAX_NAME || /[\u0000-\u001f]/.test(name)) {
    throw new TypeError(`Step name ${JSON.stringify(name)} exceeds max length (${MAX_NAME} chars) or invalid characters found`);
  }
}

function checkRollback(options: unknown, name: string): WorkflowStepRollbackOptions<unknown> {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(`the rollback options of step "${name}" must be an object`);
  }
  const { rollback, rollbackConfig } = options as WorkflowStepRollbackOptions<unknown>;
  if (typeof rollback !== "function") throw new TypeError(`the rollback of step "${name}" must be a function`);
  // The protocol's `delay` task names a step, not its rollback: a rollback's delay must be a duration.
  if (typeof rollbackConfig?.retries?.delay === "function") {
    throw new TypeError(`rollbackConfig.retries.delay of step "${name}" must be a duration, not a function`);
  }
  return rollbackConfig === undefined ? { rollback } : { rollback, rollbackConfig };
}
