// What the worker tests share: a worker on a mock engine, a logger that keeps lines, and a
// deferred value to hold a callback open.

import assert from "node:assert/strict";
import { type CairnWorker, type ServeOptions, serve } from "@cairn-engine/workflows";
import { MockEngine } from "./mock-engine.js";

export class Lines {
  readonly warnings: string[] = [];
  readonly errors: string[] = [];
  warn = (line: string): void => {
    this.warnings.push(line);
  };
  error = (line: string): void => {
    this.errors.push(line);
  };
}

export interface Setup {
  engine: MockEngine;
  worker: CairnWorker;
  lines: Lines;
  /** Closes the worker and the engine, then checks every frame kept to the schema. */
  done(): Promise<void>;
}

/** A mock engine and a worker connected to it, handshake done. */
export async function setup<Env>(options: Omit<ServeOptions<Env>, "url"> & { handshake?: boolean }): Promise<Setup> {
  const engine = await MockEngine.start();
  const lines = new Lines();
  const worker = serve({ heartbeatMs: 0, logger: lines, ...options, url: engine.url });
  if (options.handshake !== false) {
    await engine.handshake();
    await worker.ready;
  }
  return {
    engine,
    worker,
    lines,
    async done() {
      await worker.close({ timeoutMs: 1_000 });
      await engine.close();
      assert.deepEqual(engine.violations, [], "every frame conforms to docs/worker-protocol.schema.json");
    },
  };
}

export interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(error: unknown): void;
}

export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}
