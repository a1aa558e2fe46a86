// `serve`: a worker process's connection to the engine. It says hello, holds the runs the
// engine starts on it (at most `concurrency`), routes each message to its run, and
// reconnects with back-off when the connection drops: runs then start afresh, because
// the engine starts them again from its journal.

import { EventEmitter } from "node:events";
import { hostname } from "node:os";
import { Connection, workersUrl } from "./connection.js";
import { describe } from "./config.js";
import type { WorkflowClass } from "./entrypoint.js";
import {
  FATAL_CODES,
  type Hello,
  PROTOCOL_VERSION,
  type Start,
  type ToEngine,
  type ToWorker,
  encodeFrame,
  readMessage,
} from "./protocol.js";
import { type Logger, Run, type RunHost } from "./run.js";

export type { Logger } from "./run.js";

export interface ServeOptions<Env = unknown> {
  /** The Cairn server: `http://host:8787` (default `CAIRN_URL`, else `http://127.0.0.1:8787`). */
  url?: string;
  /** The server's bearer token (default `CAIRN_TOKEN`). */
  token?: string;
  /** The workflows this worker runs, by name: `{ checkout: CheckoutWorkflow }`. */
  workflows: Record<string, WorkflowClass<Env>>;
  /** What each workflow gets as `this.env`: its bindings (KV, R2, other workflows, …). */
  env?: Env;
  /** How many runs this worker takes at once (default 16). */
  concurrency?: number;
  /** The version of this code (default `CAIRN_WORKFLOW_VERSION`, else "1"): instances stay on theirs. */
  version?: string;
  /** A name for logs and the dashboard (default host:pid). */
  name?: string;
  /** Where warnings go (default `console`). */
  logger?: Logger;
  /** How often to ping the server, in ms (default 15 000; 0 never). */
  heartbeatMs?: number;
}

const WORKFLOW_NAME = /^[a-zA-Z0-9_][a-zA-Z0-9_-]{0,63}$/;
const FIRST_RETRY_MS = 100;
const MAX_RETRY_MS = 5_000;

/**
 * Connects to the engine and runs `workflows` until `close()`. Returns at once; `ready`
 * says when the engine has accepted the worker.
 *
 * @throws TypeError for options the engine would refuse (a bad workflow name, …).
 */
export function serve<Env = unknown>(options: ServeOptions<Env>): CairnWorker {
  return new CairnWorker(options as ServeOptions<unknown>);
}

/**
 * A running worker. Events: `connected` (session id) at each welcome, `disconnected`
 * (reason) each time the connection drops.
 */
export class CairnWorker extends EventEmitter {
  /** The session of the first welcome; rejects if the worker stops before one (a refused token, `close()`). */
  readonly ready: Promise<string>;
  /** Settles when the worker has stopped: after `close()`, or rejected when the engine refused it for good. */
  readonly closed: Promise<void>;

  readonly #url: string;
  readonly #token: string | undefined;
  readonly #workflows: Record<string, WorkflowClass<unknown>>;
  readonly #env: unknown;
  readonly #hello: Hello;
  readonly #logger: Logger;
  readonly #heartbeatMs: number;
  readonly #runs = new Map<string, Run>();
  /** Starts past `concurrency`: the engine should never send them, but if it does they wait for a stop. */
  #queued: Start[] = [];
  #connection: Connection | undefined;
  #session: string | undefined;
  #retryMs = FIRST_RETRY_MS;
  #retryTimer: NodeJS.Timeout | undefined;
  #closing = false;
  #stopped = false;
  /** Set when the engine refuses the worker in a way retrying cannot fix. */
  #refusal: Error | undefined;
  #settleReady!: { resolve(session: string): void; reject(error: Error): void; done: boolean };
  #settleClosed!: { resolve(): void; reject(error: Error): void };

  constructor(options: ServeOptions<unknown>) {
    super();
    const names = Object.keys(options.workflows ?? {});
    if (names.length === 0) throw new TypeError("serve needs at least one workflow");
    for (const name of names) {
      if (!WORKFLOW_NAME.test(name)) {
        throw new TypeError(`workflow name ${describe(name)} must be 1-64 characters of a-z, A-Z, 0-9, _ and -`);
      }
      if (typeof options.workflows[name] !== "function") throw new TypeError(`workflow ${name} must be a class`);
    }
    const version = options.version ?? process.env.CAIRN_WORKFLOW_VERSION ?? "1";
    // The engine's own limits (`MAX_VERSION_LEN`, `MAX_CONCURRENCY` in its protocol.rs): a
    // value it would refuse at connect is refused here, where the mistake was made.
    if (version === "" || Buffer.byteLength(version, "utf8") > 100) {
      throw new TypeError("the version must be 1-100 bytes of UTF-8");
    }
    const concurrency = options.concurrency ?? 16;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 10_000) {
      throw new TypeError(`concurrency must be a whole number from 1 to 10000, not ${describe(concurrency)}`);
    }
    this.#url = workersUrl(options.url ?? process.env.CAIRN_URL ?? "http://127.0.0.1:8787");
    this.#token = options.token ?? process.env.CAIRN_TOKEN;
    this.#workflows = options.workflows;
    this.#env = options.env ?? {};
    this.#logger = options.logger ?? console;
    this.#heartbeatMs = options.heartbeatMs ?? 15_000;
    this.#hello = {
      type: "hello",
      protocol: PROTOCOL_VERSION,
      worker: [...(options.name ?? `${hostname()}:${process.pid}`)].slice(0, 256).join(""),
      workflows: names.map((name) => ({ name, version })),
      concurrency,
    };
    this.ready = new Promise((resolve, reject) => {
      this.#settleReady = { resolve, reject, done: false };
    });
    this.closed = new Promise((resolve, reject) => {
      this.#settleClosed = { resolve, reject };
    });
    // Nobody need await these: a refusal is also logged, and must not crash the process.
    this.ready.catch(() => {});
    this.closed.catch(() => {});
    this.#connect();
  }

  /** The current session, while connected and welcomed. */
  get session(): string | undefined {
    return this.#session;
  }

  /**
   * Stops taking runs, lets the callbacks running now finish and send their results (at
   * most `timeoutMs`, default 10 s), then closes. Runs waiting on the engine are dropped:
   * the engine starts them again elsewhere.
   */
  close(options: { timeoutMs?: number } = {}): Promise<void> {
    if (!this.#closing && !this.#stopped) {
      this.#closing = true;
      this.#queued = [];
      clearTimeout(this.#retryTimer);
      setTimeout(() => this.#shutdown("the worker is closing"), options.timeoutMs ?? 10_000).unref();
      this.#drained();
    }
    return this.closed.catch(() => {});
  }

  #connect(): void {
    this.#retryTimer = undefined;
    const connection = new Connection(
      { url: this.#url, token: this.#token, heartbeatMs: this.#heartbeatMs },
      {
        open: () => this.#sendNow(this.#hello),
        message: (value) => this.#receive(value),
        malformed: (reason) => this.#logger.warn(`cairn worker: ignored ${reason}`),
        closed: (reason, fatal) => this.#disconnected(reason, fatal),
      },
    );
    this.#connection = connection;
  }

  #receive(value: unknown): void {
    let message: ToWorker;
    try {
      message = readMessage(value);
    } catch (error) {
      this.#logger.warn(`cairn worker: ignored ${(error as Error).message}`);
      return;
    }
    if (this.#session === undefined && message.type !== "welcome" && message.type !== "error") {
      this.#logger.warn(`cairn worker: ignored a ${message.type} message before the welcome`);
      return;
    }
    switch (message.type) {
      case "welcome":
        this.#session = message.session;
        this.#retryMs = FIRST_RETRY_MS;
        if (!this.#settleReady.done) {
          this.#settleReady.done = true;
          this.#settleReady.resolve(message.session);
        }
        this.emit("connected", message.session);
        return;
      case "error": {
        const about = [message.run && `run ${message.run}`, message.task && `task ${message.task}`].filter(Boolean).join(", ");
        const text = `${message.code}: ${message.message}${about ? ` (${about})` : ""}`;
        if (this.#session === undefined && FATAL_CODES.has(message.code)) {
          // The server closes after a refused hello; retrying with the same hello cannot help.
          this.#refusal = new Error(`the engine refused this worker: ${text}`);
          this.#connection?.close(text);
        } else {
          this.#logger.warn(`cairn worker: the engine reported ${text}`);
        }
        return;
      }
      case "start":
        this.#start(message);
        return;
      case "stop":
        this.#stop(message.run);
        return;
      default: {
        const run = this.#runs.get(message.run);
        if (run === undefined) {
          this.#logger.warn(`cairn worker: ignored a ${message.type} message about run ${message.run}, not held here`);
          return;
        }
        if (message.type === "opResult") run.opResult(message);
        else if (message.type === "attempt") run.attempt(message);
        else if (message.type === "delay") run.delay(message);
        else if (message.type === "rollback") run.rollback(message);
        else run.cancel(message.task);
      }
    }
  }

  #start(start: Start): void {
    if (this.#closing) return;
    if (this.#runs.has(start.run) || this.#queued.some((q) => q.run === start.run)) {
      this.#logger.warn(`cairn worker: ignored a second start of run ${start.run}`);
      return;
    }
    if (this.#runs.size >= this.#hello.concurrency) {
      this.#queued.push(start);
      return;
    }
    const run = new Run(start.run, this.#host);
    this.#runs.set(start.run, run);
    const workflow = Object.hasOwn(this.#workflows, start.workflow) ? this.#workflows[start.workflow] : undefined;
    if (workflow === undefined) {
      this.#host.send({
        type: "runResult",
        run: start.run,
        error: { name: "Error", message: `this worker does not run workflow ${start.workflow}` },
      });
      return;
    }
    run.execute(start, workflow, this.#env);
  }

  #stop(id: string): void {
    const run = this.#runs.get(id);
    if (run === undefined) {
      this.#queued = this.#queued.filter((q) => q.run !== id);
      return;
    }
    run.stop();
    this.#runs.delete(id);
    const next = this.#queued.shift();
    if (next !== undefined) this.#start(next);
    this.#drained();
  }

  /** What runs use to talk to the engine. */
  readonly #host: RunHost = {
    send: (message) => {
      // While closing, runs make no new work; answers to work already asked for still go.
      if (this.#closing && message.type === "op") return "dropped";
      return this.#sendNow(message) ? "sent" : "dropped";
    },
    taskEnded: () => this.#drained(),
    logger: { warn: (m) => this.#logger.warn(m), error: (m) => this.#logger.error(m) },
  };

  /** @throws RangeError for a frame over the limit. */
  #sendNow(message: ToEngine): boolean {
    return this.#connection?.send(encodeFrame(message)) ?? false;
  }

  /** While closing: closes once no task is running. */
  #drained(): void {
    if (!this.#closing) return;
    for (const run of this.#runs.values()) if (run.tasksInFlight > 0) return;
    this.#shutdown("the worker is closing");
  }

  #shutdown(reason: string): void {
    if (this.#connection === undefined) this.#finish();
    else this.#connection.close(reason);
  }

  #disconnected(reason: string, fatal: boolean): void {
    const wasWelcomed = this.#session !== undefined;
    this.#connection = undefined;
    this.#session = undefined;
    // The engine starts these runs again (here after the reconnect, or on another worker).
    for (const run of this.#runs.values()) run.stop();
    this.#runs.clear();
    this.#queued = [];
    if (wasWelcomed) this.emit("disconnected", reason);
    if (this.#closing) {
      this.#finish();
      return;
    }
    const refusal = this.#refusal ?? (fatal ? new Error(`the engine refused this worker: ${reason}`) : undefined);
    if (refusal !== undefined) {
      this.#logger.error(`cairn worker: ${refusal.message}; giving up`);
      this.#finish(refusal);
      return;
    }
    this.#logger.warn(`cairn worker: ${wasWelcomed ? "disconnected" : "could not connect"}: ${reason}; retrying in ${this.#retryMs} ms`);
    this.#retryTimer = setTimeout(() => this.#connect(), this.#retryMs);
    this.#retryMs = Math.min(this.#retryMs * 2, MAX_RETRY_MS);
  }

  #finish(error?: Error): void {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#closing = true;
    clearTimeout(this.#retryTimer);
    if (!this.#settleReady.done) {
      this.#settleReady.done = true;
      this.#settleReady.reject(error ?? new Error("the worker was closed before the engine welcomed it"));
    }
    if (error === undefined) this.#settleClosed.resolve();
    else this.#settleClosed.reject(error);
  }
}
