// Values crossing the durability boundary (step outputs, params, payloads) travel as JSON.
// Converting before a frame is built means a value JSON cannot hold fails the one call
// that made it, with a message naming it, instead of throwing inside the connection.

/**
 * A value that cannot be stored. Thrown for a step's output, it fails the step at once,
 * without retries: every attempt would return the same kind of value (Cloudflare ends the
 * step the same way, for a value it cannot serialise).
 */
export class UnstorableValueError extends TypeError {
  constructor(message: string) {
    super(message);
    this.name = "TypeError";
  }
}

/**
 * `value` as the JSON value the engine will store: `undefined` (and a function or symbol)
 * becomes `null`, a Date its ISO string, anything with `toJSON` what that returns.
 *
 * @throws UnstorableValueError (a TypeError) naming `what` for a value JSON.stringify
 * refuses (a BigInt, a cycle) or would store as something else (binary data, a Map).
 */
export function toJsonValue(value: unknown, what: string): unknown {
  let text: string | undefined;
  try {
    text = JSON.stringify(value, refuseBinary);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new UnstorableValueError(`${what} cannot be sent as JSON: ${reason}`);
  }
  // Nesting past the limit takes more brackets than that.
  if (text !== undefined && text.length > 2 * MAX_DEPTH && nestsDeeperThan(text, MAX_DEPTH)) {
    throw new UnstorableValueError(
      `${what} cannot be sent as JSON: it nests deeper than ${MAX_DEPTH} levels of arrays and objects, the most a stored value may`,
    );
  }
  return text === undefined ? null : JSON.parse(text);
}

/**
 * JSON.stringify's replacer: binary data is refused. JSON would store a `Uint8Array` as an
 * object of numbered keys and an `ArrayBuffer` (a `Blob`, a `ReadableStream`, a `Map`, a
 * `Set`) as `{}`, which come back as neither: a silent corruption, where a TypeError says
 * what to do. (A Node `Buffer` has a `toJSON` of
 * its own, which is what gets here.)
 */
function refuseBinary(_key: string, value: unknown): unknown {
  if (typeof value !== "object" || value === null) return value;
  const type = value.constructor?.name ?? "object";
  if (value instanceof ArrayBuffer || ArrayBuffer.isView(value) || (typeof Blob === "function" && value instanceof Blob)) {
    throw new TypeError(`a ${type} is binary data, which is not stored (encode it, as base64 say)`);
  }
  // Objects whose contents JSON does not see: each would be stored as {}.
  if (typeof ReadableStream === "function" && value instanceof ReadableStream) {
    throw new TypeError(`a ${type} is not stored: stream steps are not supported by this SDK yet (return the bytes encoded, as base64 say)`);
  }
  if (value instanceof Map || value instanceof Set) {
    throw new TypeError(`a ${type} is not stored as JSON (convert it: Object.fromEntries(map), [...set])`);
  }
  return value;
}

/**
 * How deep a stored value may nest, as the engine counts it (`[[1]]` is two deep): JSON
 * nested deeper does not read back in the engine, which refuses it where it enters.
 */
export const MAX_DEPTH = 100;

/** Whether JSON text nests deeper than `limit` arrays and objects (brackets in strings aside). */
function nestsDeeperThan(text: string, limit: number): boolean {
  let depth = 0;
  let inString = false;
  let escaped = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (escaped) escaped = false;
      else if (c === 0x5c) escaped = true;
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      depth += 1;
      if (depth > limit) return true;
    } else if (c === 0x5d || c === 0x7d) depth -= 1;
  }
  return false;
}
