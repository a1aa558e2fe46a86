// A step's configuration: Cloudflare's types, and the checks and conversions that turn it
// into the `config` of an op. The engine parses duration strings (one grammar for every
// language); the SDK refuses the rest of what Cloudflare's schema would, so a bad config
// fails the call that passed it, before the step is counted, rather than the connection.

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
 * @throws TypeError (or what `refuse` makes of the reason) for a negative or non-finite
 * number, an empty string, or anything else.
 */
export function wireDuration(
  value: unknown,
  what: string,
  refuse: (why: string) => Error = (why) => new TypeError(why),
): WireDuration {
  if (typeof value === "string" && value.trim() !== "") return value;
  if (typeof value === "number" && Number.isFinite(value) && value >= 0) return Math.round(value);
  throw refuse(`${what} must be a duration ("30 seconds") or a number of milliseconds, not ${describe(value)}`);
}

/** The keys Cloudflare's schema allows, at each level (`.strict()` on both, SPEC §1.4). */
const CONFIG_KEYS = ["retries", "timeout", "sensitive"];
/** A rollback's config has no `sensitive` (SPEC §1.10). */
const ROLLBACK_CONFIG_KEYS = ["retries", "timeout"];
const RETRIES_KEYS = ["limit", "delay", "backoff"];

/**
 * The op's `config`: the user's config with every duration checked and functions left out.
 * `delayFunction` is true when `retries.delay` is a function: the engine then asks for each
 * delay.
 *
 * Checked as strictly as Cloudflare's schema: a key it does not know (`backof`,
 * `timeOut`), `retries` without both `limit` and `delay`, or a `sensitive` other than
 * `"output"` is refused here, before the step is counted, rather than run with the
 * defaults in its place.
 *
 * @throws TypeError `Step config for "<name>" is in a invalid format: …` (or `Rollback
 * config for …`, whose keys are only `retries` and `timeout`) for a config the schema
 * would refuse.
 */
export function wireConfig(
  config: WorkflowStepConfig | undefined,
  step: string,
  which: "Step config" | "Rollback config" = "Step config",
): { config: WireStepConfig | null; delayFunction: boolean } {
  const invalid = (why: string) => new TypeError(`${which} for "${step}" is in a invalid format: ${why}`);
  if (config === undefined || config === null) return { config: null, delayFunction: false };
  if (typeof config !== "object" || Array.isArray(config)) throw invalid(`it must be an object, not ${describe(config)}`);
  unknownKey(config, which === "Step config" ? CONFIG_KEYS : ROLLBACK_CONFIG_KEYS, "", invalid);
  const wire: WireStepConfig = {};
  let delayFunction = false;
  if (config.retries !== undefined) {
    const given: unknown = config.retries;
    if (typeof given !== "object" || given === null || Array.isArray(given)) {
      throw invalid(`retries must be an object, not ${describe(given)}`);
    }
    unknownKey(given, RETRIES_KEYS, "retries.", invalid);
    const { limit, delay, backoff } = config.retries;
    if (limit === undefined || delay === undefined) throw invalid("retries needs both limit and delay");
    const retries: NonNullable<WireStepConfig["retries"]> = {};
    if (!Number.isInteger(limit) || limit < 0) {
      throw invalid(`retries.limit must be a whole number from 0, not ${describe(limit)}`);
    }
    retries.limit = limit;
    if (typeof delay === "function") delayFunction = true;
    else retries.delay = wireDuration(delay, "retries.delay", invalid);
    if (backoff !== undefined) {
      if (backoff !== "constant" && backoff !== "linear" && backoff !== "exponential") {
        throw invalid(`retries.backoff must be constant, linear or exponential, not ${describe(backoff)}`);
      }
      retries.backoff = backoff;
    }
    wire.retries = retries;
  }
  if (config.timeout !== undefined) {
    if (config.timeout === 0 || (typeof config.timeout === "string" && config.timeout.trim() === "0")) {
      throw invalid("timeout must be more than 0");
    }
    wire.timeout = wireDuration(config.timeout, "timeout", invalid);
  }
  if (config.sensitive !== undefined) {
    if (config.sensitive !== "output") throw invalid(`sensitive must be "output", not ${describe(config.sensitive)}`);
    wire.sensitive = config.sensitive;
  }
  return { config: wire, delayFunction };
}

/** Refuses the first key of `object` that is not one of `known`. */
function unknownKey(object: object, known: string[], prefix: string, invalid: (why: string) => TypeError): void {
  const key = Object.keys(object).find((k) => !known.includes(k));
  if (key !== undefined) {
    throw invalid(`${prefix}${key} is not a key of it (${known.map((k) => prefix + k).join(", ")})`);
  }
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
