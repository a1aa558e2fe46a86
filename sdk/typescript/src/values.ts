// Values crossing the durability boundary (step outputs, params, payloads) travel as JSON.
// Converting before a frame is built means a value JSON cannot hold fails the one call
// that made it, with a message naming it, instead of throwing inside the connection.

/**
 * `value` as the JSON value the engine will store: `undefined` (and a function or symbol)
 * becomes `null`, a Date its ISO string, anything with `toJSON` what that returns.
 *
 * @throws TypeError naming `what` for a value JSON.stringify refuses (a BigInt, a cycle).
 */
export function toJsonValue(value: unknown, what: string): unknown {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new TypeError(`${what} cannot be sent as JSON: ${reason}`);
  }
  return text === undefined ? null : JSON.parse(text);
}
