// Errors: the one users throw (NonRetryableError), the one the binding throws for an HTTP
// failure, and the conversions between JavaScript errors and the protocol's
// `{name, message}`.

import type { ErrorInfo, Thrown } from "./protocol.js";
import { UnstorableValueError } from "./values.js";

/**
 * Thrown from a step's callback (or a rollback handler), it fails the attempt and stops
 * its retries at once, as Cloudflare's `NonRetryableError` from `cloudflare:workflows`.
 */
export class NonRetryableError extends Error {
  constructor(message: string, name = "NonRetryableError") {
    super(message);
    this.name = name;
  }
}

/**
 * A failed call of the Cairn HTTP API (the Workflow binding): `code` is the server's stable
 * code (`instance.not_found`, …), also at the start of the message.
 */
export class CairnApiError extends Error {
  readonly code: string;
  readonly status: number;

  constructor(code: string, message: string, status: number) {
    super(`${code}: ${message}`);
    this.name = "CairnApiError";
    this.code = code;
    this.status = status;
  }
}

/**
 * Whether an error stops retries: Cloudflare matches on the name or the message's start. A
 * value that cannot be stored stops them too (every attempt would return its like).
 */
function isNonRetryable(error: unknown): boolean {
  if (error instanceof NonRetryableError || error instanceof UnstorableValueError) return true;
  if (!(error instanceof Error)) return false;
  return error.name === "NonRetryableError" || error.message.startsWith("NonRetryableError");
}

/**
 * What user code threw, as the protocol reports it. Anything may be thrown, not only Errors.
 *
 * A NonRetryableError is recorded as Cloudflare records it (SPEC §1.9): the message
 * without a leading `"NonRetryableError:"`, and an error recognised by its message alone
 * (`new Error("NonRetryableError: card declined")`) named `NonRetryableError`, as the
 * Rust SDK's `NonRetryableError::new` makes it.
 */
export function thrownInfo(error: unknown): Thrown {
  if (error instanceof Error) {
    let name = typeof error.name === "string" && error.name !== "" ? error.name : "Error";
    let message = typeof error.message === "string" ? error.message : String(error.message);
    const nonRetryable = isNonRetryable(error);
    if (nonRetryable && message.startsWith("NonRetryableError") && !(error instanceof NonRetryableError)) {
      name = "NonRetryableError";
    }
    if (nonRetryable && message.startsWith(PREFIX)) message = message.slice(PREFIX.length).trimStart();
    return { name, message, nonRetryable };
  }
  return { name: "Error", message: safeString(error), nonRetryable: false };
}

/** What Cloudflare strips from a NonRetryableError's message: the name says it already. */
const PREFIX = "NonRetryableError:";

/** A `runResult` error has no `nonRetryable`. */
export function errorInfo(error: unknown): ErrorInfo {
  const { name, message } = thrownInfo(error);
  return { name, message };
}

/**
 * The engine's `{name, message}` as an Error to throw into user code. A NonRetryableError
 * comes back as one, so `instanceof NonRetryableError` works on a step's final error.
 */
export function toError(info: ErrorInfo): Error {
  if (info.name === "NonRetryableError") return new NonRetryableError(info.message);
  const error = new Error(info.message);
  error.name = info.name;
  return error;
}

function safeString(value: unknown): string {
  try {
    return String(value);
  } catch {
    // An object whose toString throws (or a null-prototype object) still gets a message.
    return Object.prototype.toString.call(value);
  }
}
