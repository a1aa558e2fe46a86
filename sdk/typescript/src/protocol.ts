// The worker protocol's messages, as docs/worker-protocol.md describes them and
// docs/worker-protocol.schema.json checks them. Nothing here does anything: the types keep
// what the worker sends and reads in one place, so a change to the protocol is a change
// to this file first.

/** The version of docs/worker-protocol.md this SDK speaks. */
export const PROTOCOL_VERSION = 1;

/** The largest frame either side may send (2 MiB). */
export const MAX_FRAME_BYTES = 2 * 1024 * 1024;

/** Milliseconds, or Cloudflare's duration grammar ("30 seconds"), parsed by the engine. */
export type WireDuration = number | string;

/** An error as the engine reports it. */
export interface ErrorInfo {
  name: string;
  message: string;
}

/** An error a worker reports for user code that threw. */
export interface Thrown extends ErrorInfo {
  nonRetryable: boolean;
}

/** Cloudflare's `WorkflowStepConfig` as it travels: durations only, no functions. */
export interface WireStepConfig {
  retries?: { limit?: number; delay?: WireDuration; backoff?: "constant" | "linear" | "exponential" };
  timeout?: WireDuration;
  /** Cloudflare's `sensitive: "output"`, passed through (the schema lets unknown keys by). */
  sensitive?: "output";
}

/** Exactly one of `ok` and `error`. */
export type Outcome<E> = { ok: unknown; error?: never } | { error: E; ok?: never };

// ---- worker → engine ------------------------------------------------------------------

export interface Hello {
  type: "hello";
  protocol: typeof PROTOCOL_VERSION;
  worker: string;
  workflows: { name: string; version: string }[];
  concurrency: number;
}

/** The body of an op, without the `type`, `run` and `seq` the run adds. */
export type OpBody =
  | {
      op: "do";
      name: string;
      config: WireStepConfig | null;
      delayFunction: boolean;
      rollback?: { config: WireStepConfig | null };
    }
  | { op: "sleep"; name: string; duration: WireDuration }
  | { op: "sleepUntil"; name: string; until: number }
  | { op: "waitForEvent"; name: string; eventType: string; timeout?: WireDuration }
  | { op: "invoke"; name: string; workflow: string; params: unknown; detached: boolean };

export type Op = { type: "op"; run: string; seq: number } & OpBody;

export type AttemptResult = { type: "attemptResult"; run: string; task: string } & Outcome<Thrown>;
export type DelayResult = { type: "delayResult"; run: string; task: string } & (
  | { ok: WireDuration | null; error?: never }
  | { error: Thrown; ok?: never }
);
export type RollbackResult = { type: "rollbackResult"; run: string; task: string } & Outcome<Thrown>;
export type RunResult = { type: "runResult"; run: string } & Outcome<ErrorInfo>;

/**
 * The run's code waits on ops only: it has made `ops` ops and runs nothing else until one
 * is answered. The engine hibernates a run only after the worker says so (after the start
 * and after each answer), so ops made together (`Promise.all`) all reach it first.
 * `answers` counts the `opResult`s received: an idle sent before an answer reached the
 * worker is stale (that answer may make the code go on), and the engine ignores it.
 */
export interface Idle {
  type: "idle";
  run: string;
  ops: number;
  answers: number;
}

export type ToEngine = Hello | Op | Idle | AttemptResult | DelayResult | RollbackResult | RunResult;

// ---- engine → worker ------------------------------------------------------------------

export interface Welcome {
  type: "welcome";
  protocol: number;
  session: string;
}

export interface ProtocolError {
  type: "error";
  code: string;
  message: string;
  run?: string;
  task?: string;
}

export interface Start {
  type: "start";
  run: string;
  workflow: string;
  version: string;
  check?: boolean;
  instance: { id: string; params: unknown; timestamp: string };
}

export type OpResult = { type: "opResult"; run: string; seq: number } & Outcome<ErrorInfo>;

export interface Attempt {
  type: "attempt";
  run: string;
  task: string;
  seq: number;
  attempt: number;
  /** The step's name and count, as the engine numbered it. */
  step?: { name: string; count: number };
  /** The step's config with the engine's defaults merged in: `ctx.config`. */
  config?: Record<string, unknown>;
}

export interface Cancel {
  type: "cancel";
  run: string;
  task: string;
}

export interface Delay {
  type: "delay";
  run: string;
  task: string;
  seq: number;
  attempt: number;
  step?: { name: string; count: number };
  error: ErrorInfo;
}

export interface Rollback {
  type: "rollback";
  run: string;
  task: string;
  seq: number;
  attempt: number;
  /** The forward step's name and count, as the engine numbered it. */
  step?: { name: string; count: number };
  /** Absent when the step never returned. */
  output?: unknown;
  /** What failed the instance (`Terminated` for a terminate with rollback). */
  error: ErrorInfo;
}

export interface Stop {
  type: "stop";
  run: string;
  reason: "done" | "hibernated" | "paused" | "stopped" | "lost";
}

export type ToWorker = Welcome | ProtocolError | Start | OpResult | Attempt | Cancel | Delay | Rollback | Stop;

/** The handshake errors after which trying again cannot help: the worker gives up. */
export const FATAL_CODES: ReadonlySet<string> = new Set([
  "protocol.version",
  "protocol.workflow",
  "auth.unauthorized",
]);

/**
 * `message` as one frame's text.
 *
 * @throws RangeError for a frame over MAX_FRAME_BYTES (the engine would refuse it).
 */
export function encodeFrame(message: ToEngine): string {
  const text = JSON.stringify(message);
  // Every character takes at least one byte: only a long text needs counting.
  if (text.length > MAX_FRAME_BYTES / 4 && Buffer.byteLength(text) > MAX_FRAME_BYTES) {
    throw new RangeError(`a ${message.type} frame of ${Buffer.byteLength(text)} bytes is over the protocol's ${MAX_FRAME_BYTES}`);
  }
  return text;
}

type Field = "string" | "integer" | "object";

/** The fields the worker relies on, per message type it reads. Unknown fields are ignored. */
const FIELDS: { [T in ToWorker["type"]]: Record<string, Field> } = {
  welcome: { session: "string" },
  error: { code: "string", message: "string" },
  start: { run: "string", workflow: "string", instance: "object" },
  opResult: { run: "string", seq: "integer" },
  attempt: { run: "string", task: "string", seq: "integer", attempt: "integer" },
  cancel: { run: "string", task: "string" },
  delay: { run: "string", task: "string", seq: "integer", attempt: "integer", error: "object" },
  rollback: { run: "string", task: "string", seq: "integer", attempt: "integer" },
  stop: { run: "string" },
};

/**
 * A frame's JSON as a message from the engine, checked for the fields the worker uses.
 *
 * @throws TypeError saying what is wrong with it.
 */
export function readMessage(value: unknown): ToWorker {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError("a frame that is not a JSON object");
  }
  const message = value as Record<string, unknown>;
  const type = message.type;
  if (typeof type !== "string" || !Object.hasOwn(FIELDS, type)) {
    throw new TypeError(`a message of unknown type ${JSON.stringify(type)}`);
  }
  for (const [field, kind] of Object.entries(FIELDS[type as ToWorker["type"]])) {
    const v = message[field];
    const ok =
      kind === "string" ? typeof v === "string" :
      kind === "integer" ? Number.isInteger(v) :
      typeof v === "object" && v !== null;
    if (!ok) throw new TypeError(`a ${type} message without a valid ${field}`);
  }
  if (type === "start") {
    const instance = message.instance as Record<string, unknown>;
    if (typeof instance.id !== "string" || typeof instance.timestamp !== "string") {
      throw new TypeError("a start message whose instance has no id or timestamp");
    }
  }
  return message as unknown as ToWorker;
}
