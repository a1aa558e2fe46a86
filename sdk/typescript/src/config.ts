// A step's configuration: Cloudflare's types, and the checks and conversions that turn it
// into the `config` of an op. The engine parses duration strings (one grammar for every
// language); the SDK only refuses what the protocol's schema would, so a bad config fails
// the call that passed it rather than the connection.

import type { WireDuration, WireStepConfig } from "./protocol.js";

/** The units of Cloudflare's duration strings. */
export type WorkflowDurationLabel = "second" | "minute" | "hour" | "day" | "week" | "month" | "year";

/** `"30 seconds"`, `"1 hour"`, … or a number of milliseconds. */
export type WorkflowSleepDuration = `${number} ${WorkflowDurationLabel}${"s" | ""}` | number;

/**
 * A duration as users type it: milliseconds, or a string the engine parses
 * (`"10 seconds"`, `"2 hours"`; see the engine's duration grammar).
 */
export type WorkflowDuration = WorkflowSleepDuration | string;
export type WorkflowDelayDuration = WorkflowDuration;
export type WorkflowTimeoutDuration = WorkflowDuration;
export type WorkflowRetentionDuration = WorkflowDuration;

export type WorkflowBackoff = "constant" | "linear" | "exponential";

/** What a retry delay function receives: the failed attempt's context and its error. */
export interface WorkflowDynamicDelayContext {
  ctx: WorkflowStepContext;
  error: Error;
}

/** A retry delay function: called after a failed attempt that will be retried. */
export type WorkflowDelayFunction = (
  args: WorkflowDynamicDelayContext,
) => WorkflowDuration | Promise<WorkflowDuration>;

/** Cloudflare's `WorkflowStepConfig`. */
export interface WorkflowStepConfig {
  retries?: {
    /** Retries after the first attempt (attempts total `limit + 1`). */
    limit: number;
    delay: WorkflowDuration | WorkflowDelayFunction;
    backoff?: WorkflowBackoff;
  };
  /** Per attempt. */
  timeout?: WorkflowDuration;
  /** Show `"[REDACTED]"` instead of the output in every view of it. */
  sensitive?: "output";
}

/** What a step's callback receives. */
export interface WorkflowStepContext {
  step: { name: string; count: number };
  /** 1 on the first try, 2 on the first retry, … */
  attempt: number;
  /** The step's config with the defaults filled in (`retries.delay` absent if a function). */
  config: WorkflowStepConfig;
}

/** Cloudflare's (and the engine's) defaults, shown in `ctx.config`. */
const DEFAULTS = { limit: 5, delay: 10_000, backoff: "exponential", timeout: "10 minutes" } as const;

/**
 * A duration for the wire: a string as it is (the engine parses it), a number as whole
 * milliseconds.
 *
 * @throws TypeError for a negative or non-finite number, an empty string, or anything else.
 */
export function wireDuration(value: unknown, what: string): WireDuration {
  if (typeof value === "string" && value.trim() !== "") return value;
  if (typeof value === "number" && Number.isFinite(value) && value >= 0) return Math.round(value);
  throw new TypeError(`${what} must be a duration ("30 seconds") or a number of milliseconds, not ${describe(value)}`);
}

/**
 * The op's `config`: the user's config with every duration checked and functions left out.
 * `delayFunction` is true when `retries.delay` is a function: the engine then asks for each
 * delay.
 *
 * @throws TypeError for a config the schema would refuse.
 */
export function wireConfig(
  config: WorkflowStepConfig | undefined,
  step: string,
): { config: WireStepConfig | null; delayFunction: boolean } {
  if (config === undefined || config === null) return { config: null, delayFunction: false };
  if (typeof config !== "object") throw new TypeError(`the config of step "${step}" must be an object`);
  const wire: WireStepConfig = {};
  let delayFunction = false;
  if (config.retries !== undefined) {
    const { limit, delay, backoff } = config.retries;
    const retries: NonNullable<WireStepConfig["retries"]> = {};
    if (limit !== undefined) {
      if (!Number.isInteger(limit) || limit < 0) {
        throw new TypeError(`retries.limit of step "${step}" must be a whole number from 0, not ${describe(limit)}`);
      }
      retries.limit = limit;
    }
    if (typeof delay === "function") delayFunction = true;
    else if (delay !== undefined) retries.delay = wireDuration(delay, `retries.delay of step "${step}"`);
    if (backoff !== undefined) {
      if (backoff !== "constant" && backoff !== "linear" && backoff !== "exponential") {
        throw new TypeError(`retries.backoff of step "${step}" must be constant, linear or exponential, not ${describe(backoff)}`);
      }
      retries.backoff = backoff;
    }
    wire.retries = retries;
  }
  if (config.timeout !== undefined) wire.timeout = wireDuration(config.timeout, `the timeout of step "${step}"`);
  if (config.sensitive !== undefined) wire.sensitive = config.sensitive;
  return { config: wire, delayFunction };
}

/**
 * `ctx.config`: the user's config over the defaults, `retries` merged key by key, a delay
 * function left out (SPEC §1.3). A fresh object each time, so user code cannot change what
 * later attempts see.
 */
export function resolvedConfig(config: WorkflowStepConfig | undefined): WorkflowStepConfig {
  const retries = config?.retries;
  const delay = retries?.delay ?? DEFAULTS.delay;
  const resolved = {
    retries: {
      limit: retries?.limit ?? DEFAULTS.limit,
      ...(typeof delay === "function" ? {} : { delay }),
      backoff: retries?.backoff ?? DEFAULTS.backoff,
    },
    timeout: config?.timeout ?? DEFAULTS.timeout,
    ...(config?.sensitive === undefined ? {} : { sensitive: config.sensitive }),
  };
  // `delay` is left out for a delay function, as Cloudflare does; the type says it is there.
  return resolved as WorkflowStepConfig;
}

/** A value in an error message, short. */
export function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (typeof value === "bigint") return `${value}n`;
  if (value === null || typeof value !== "object") return String(value);
  return Array.isArray(value) ? "an array" : "an object";
}
