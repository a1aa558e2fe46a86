// One run of an instance on this worker: from the engine's `start` to its `stop`. A run
// calls the workflow's `run()` from the top, numbers its ops in call order, settles each
// op with the engine's `opResult`, and runs the callbacks, delay functions and rollback
// handlers the engine asks for, by the op's seq. Durable state is the engine's: dropping a
// run loses nothing, and its unsettled calls simply never settle (as a hibernated
// Cloudflare instance's future is dropped).

import { resolvedConfig, type WorkflowStepContext } from "./config.js";
import { executionContext, type WorkflowClass, type WorkflowEvent } from "./entrypoint.js";
import { errorInfo, thrownInfo, toError } from "./errors.js";
import type { Attempt, Delay, OpBody, OpResult, Rollback, Start, Thrown, ToEngine } from "./protocol.js";
import { type DoHandlers, type OpSink, RunStep } from "./step.js";
import { toJsonValue } from "./values.js";

/** Where log lines go (`console` by default). */
export interface Logger {
  warn(message: string): void;
  error(message: string): void;
}

/** What a run needs from the worker that holds it. */
export interface RunHost {
  /**
   * Sends `message`: `"sent"`, `"dropped"` (the worker is closing or disconnected: the
   * message goes nowhere and that is fine), or throws a RangeError for a frame over 2 MiB.
   */
  send(message: ToEngine): "sent" | "dropped";
  /** A task (attempt, delay, rollback) has finished, answered or not. */
  taskEnded(): void;
  logger: Logger;
}

interface PendingOp {
  resolve(value: unknown): void;
  reject(error: Error): void;
}

/** A `do` op's handlers with the count claimed when it was made. */
interface DoOp extends DoHandlers {
  count: number;
}

export class Run implements OpSink {
  readonly id: string;
  readonly #host: RunHost;
  #nextSeq = 0;
  /** `step.count`: the occurrence of each `do` name among this run's ops, claimed at call time. */
  readonly #counts = new Map<string, number>();
  readonly #pending = new Map<number, PendingOp>();
  /** By seq; kept after the op settles only if it has a rollback handler. */
  readonly #doOps = new Map<number, DoOp>();
  /** Tasks asked for and not answered yet; `cancel` removes one, so its late answer is not sent. */
  readonly #tasks = new Set<string>();
  #stopped = false;
  /** `run()` has returned or thrown. */
  #returned = false;
  /** An `idle` is due once the code has run what it can (see #settled). */
  #idleCheck = false;
  /** The `opResult`s received, told with each `idle`. */
  #answers = 0;

  constructor(id: string, host: RunHost) {
    this.id = id;
    this.#host = host;
  }

  /** Tasks running now (for a graceful close). */
  get tasksInFlight(): number {
    return this.#tasks.size;
  }

  /** Calls the workflow's `run()` and reports how it ended. */
  execute(start: Start, workflow: WorkflowClass<unknown>, env: unknown): void {
    // Cloudflare documents the event as immutable ("do not mutate the incoming event"):
    // assigning `payload` is ignored, so a step that replaces it changes nothing a later
    // step sees. The payload is one copy of the params per run, read as often as the code
    // likes (a fresh copy per read made a loop over its items quadratic: a 200 KB payload
    // read in a loop blocked the worker past its heartbeat, and the run never ended).
    // A change inside it lasts until the run replays, as on Cloudflare.
    const params = start.instance.params;
    let payload: unknown;
    let copied = false;
    const event: WorkflowEvent<unknown> = {
      get payload() {
        if (!copied) {
          payload = structuredClone(params);
          copied = true;
        }
        return payload as Readonly<unknown>;
      },
      set payload(_ignored) {},
      timestamp: new Date(start.instance.timestamp),
      instanceId: start.instance.id,
      workflowName: start.workflow,
    };
    const step = new RunStep(this);
    const ctx = executionContext((error) =>
      this.#host.logger.error(`run ${this.id}: a promise passed to ctx.waitUntil failed: ${errorInfo(error).message}`),
    );
    (async () => {
      // Cloudflare constructs entrypoints as `new Cls(ctx, env)`; a class whose constructor
      // does not call `super(ctx, env)` still gets its `env`.
      const entrypoint = new workflow(ctx, env) as { env?: unknown; run: (e: unknown, s: unknown) => unknown };
      if (entrypoint.env === undefined) entrypoint.env = env;
      return entrypoint.run(event, step);
    })().then(
      (output) => {
        this.#returned = true;
        let ok: unknown;
        try {
          ok = toJsonValue(output, `the output of workflow "${start.workflow}"`);
        } catch (error) {
          this.#reply({ type: "runResult", run: this.id, error: errorInfo(error) });
          return;
        }
        this.#reply({ type: "runResult", run: this.id, ok }, () => ({
          type: "runResult",
          run: this.id,
          error: { name: "RangeError", message: outcomeTooLarge },
        }));
      },
      (error) => {
        this.#returned = true;
        this.#reply({ type: "runResult", run: this.id, error: errorInfo(error) });
      },
    );
    this.#settled();
  }

  /**
   * Tells the engine, once the code has run all it can, that the run waits on ops only
   * (`idle`): only then may the engine hibernate it. Looked at after the start, each op
   * and each answer: one macrotask on (`setImmediate`, after every microtask), and again
   * while the code keeps making ops. Code that awaits something other than an op (a
   * `fetch` outside a step) may be taken for idle: as in Cloudflare, a hibernated run
   * replays from the top, so such code must be deterministic or inside a step.
   */
  #settled(): void {
    if (this.#idleCheck || this.#stopped) return;
    this.#idleCheck = true;
    const made = this.#nextSeq;
    setImmediate(() => {
      this.#idleCheck = false;
      if (this.#stopped || this.#returned) return;
      if (this.#nextSeq !== made) {
        this.#settled();
        return;
      }
      if (this.#pending.size === 0) return;
      this.#host.send({ type: "idle", run: this.id, ops: this.#nextSeq, answers: this.#answers });
    });
  }

  /** OpSink: numbers the op now (in call order) and sends it. */
  submit(body: OpBody, handlers?: DoHandlers): Promise<unknown> {
    if (this.#stopped) return new Promise(() => {});
    const seq = this.#nextSeq;
    // Send first: an op the frame limit refuses rejects here and consumes no seq.
    const sent = this.#host.send({ type: "op", run: this.id, seq, ...body });
    this.#nextSeq += 1;
    if (handlers !== undefined) {
      const count = (this.#counts.get(handlers.name) ?? 0) + 1;
      this.#counts.set(handlers.name, count);
      this.#doOps.set(seq, { ...handlers, count });
    }
    if (sent === "dropped") return new Promise(() => {});
    this.#settled();
    const result = new Promise((resolve, reject) => this.#pending.set(seq, { resolve, reject }));
    // A step the code never awaits may fail: its error is swallowed, as on Cloudflare, not
    // an unhandled rejection that ends the worker's process. Code that awaits it still
    // gets the error.
    result.catch(() => {});
    return result;
  }

  opResult(message: OpResult): void {
    // Counted as the engine counts what it sent, waiting or not (see `Idle`).
    this.#answers += 1;
    const pending = this.#pending.get(message.seq);
    if (pending === undefined) {
      this.#host.logger.warn(`run ${this.id}: an opResult for op #${message.seq}, which is not waiting`);
      // Counted all the same: say idle again with the count, or the engine, holding an
      // idle with the count before it, would never hear one it takes.
      this.#settled();
      return;
    }
    this.#pending.delete(message.seq);
    const op = this.#doOps.get(message.seq);
    // The callback and delay function are done with; a rollback handler may still be asked for.
    if (op !== undefined && op.rollback === undefined) this.#doOps.delete(message.seq);
    if (message.error !== undefined) pending.reject(toError(message.error));
    else pending.resolve(message.ok);
    this.#settled();
  }

  attempt(message: Attempt): void {
    const op = this.#doOps.get(message.seq);
    this.#task(message.task, async () => {
      if (op === undefined) throw new Error(`run ${this.id} has no step.do #${message.seq} waiting for an attempt`);
      // Called as a plain function: the callback's `this` is not the SDK's bookkeeping.
      const { callback } = op;
      const value = await callback(this.#context(op, message.attempt, message.step, message.config));
      return toJsonValue(value, `the output of step "${op.name}"`);
    }, (outcome) => ({ type: "attemptResult", run: this.id, task: message.task, ...outcome }));
  }

  delay(message: Delay): void {
    const op = this.#doOps.get(message.seq);
    this.#task(message.task, async () => {
      const delay = op?.config?.retries?.delay;
      if (op === undefined || typeof delay !== "function") {
        throw new Error(`run ${this.id} has no delay function for step #${message.seq}`);
      }
      const value = await delay({ ctx: this.#context(op, message.attempt, message.step), error: toError(message.error) });
      // A value that is no delay goes to the engine as it is (as null when JSON has no
      // form for it), which fails the step with Cloudflare's "returned an invalid delay value".
      return typeof value === "string" || (typeof value === "number" && Number.isFinite(value)) ? value : null;
    }, (outcome) => ({ type: "delayResult", run: this.id, task: message.task, ...outcome }) as ToEngine);
  }

  rollback(message: Rollback): void {
    const op = this.#doOps.get(message.seq);
    this.#task(message.task, async () => {
      if (op?.rollback === undefined) throw new Error(`run ${this.id} has no rollback handler for step #${message.seq}`);
      const ctx = this.#context(op, message.attempt, message.step);
      await op.rollback.rollback({
        output: "output" in message ? message.output : undefined,
        error: toError(message.error),
        ctx,
        stepName: `${ctx.step.name}-${ctx.step.count}`,
      });
      // What a handler returns is not kept: a rollback's outcome is done or failed.
      return null;
    }, (outcome) => ({ type: "rollbackResult", run: this.id, task: message.task, ...outcome }));
  }

  /** The engine gave up on the task (a timeout): its late answer is not sent. */
  cancel(task: string): void {
    this.#tasks.delete(task);
  }

  /** The run is over here: nothing about it is sent again, its calls never settle. */
  stop(): void {
    this.#stopped = true;
    this.#pending.clear();
    this.#doOps.clear();
    this.#tasks.clear();
  }

  /**
   * `ctx`: the step's name and count as the engine numbered it when it says (the count this
   * run claimed otherwise), and the engine's resolved config when it sends one (its
   * defaults are the truth), with the values the code gave shown as given: Cloudflare
   * shows `delay: "5 seconds"` as written, where the engine sends it resolved (5000).
   */
  #context(
    op: DoOp,
    attempt: number,
    numbered?: { name: string; count: number },
    config?: Record<string, unknown>,
  ): WorkflowStepContext {
    const step = { name: op.name, count: numbered?.count ?? op.count };
    const sent = config as WorkflowStepContext["config"] | undefined;
    if (sent === undefined) {
      return { step, attempt, config: resolvedConfig(op.config) };
    }
    const delay = op.config?.retries?.delay;
    const timeout = op.config?.timeout;
    const shown = {
      ...sent,
      ...(sent.retries === undefined || delay === undefined || typeof delay === "function"
        ? {}
        : { retries: { ...sent.retries, delay } }),
      ...(timeout === undefined ? {} : { timeout }),
    } as WorkflowStepContext["config"];
    return { step, attempt, config: shown };
  }

  /** Runs user code for a task and answers it, unless it was cancelled or the run stopped. */
  #task(task: string, work: () => Promise<unknown>, answer: (outcome: { ok: unknown } | { error: Thrown }) => ToEngine): void {
    this.#tasks.add(task);
    work()
      .then(
        (ok) => ({ ok }),
        (error: unknown) => ({ error: thrownInfo(error) }),
      )
      .then((outcome) => {
        if (!this.#tasks.delete(task) || this.#stopped) return;
        this.#reply(answer(outcome), () =>
          // Too large now is too large on every attempt: the step fails at once, as one
          // over the engine's payload limit does.
          answer({ error: { name: "RangeError", message: outcomeTooLarge, nonRetryable: true } }),
        );
      })
      .finally(() => this.#host.taskEnded());
  }

  /** Sends an answer; one over the frame limit is replaced by `instead()` (an error). */
  #reply(message: ToEngine, instead?: () => ToEngine): void {
    if (this.#stopped) return;
    try {
      this.#host.send(message);
    } catch (error) {
      if (error instanceof RangeError && instead !== undefined) {
        this.#reply(instead());
      } else {
        this.#host.logger.error(`run ${this.id}: could not send ${message.type}: ${errorInfo(error).message}`);
      }
    }
  }
}

const outcomeTooLarge = "the value is too large: a frame of the worker protocol holds 2 MiB of JSON";

