// A stand-in for the engine's side of /api/workers, for unit tests of the worker's framing
// and bookkeeping. It checks every frame, both ways, against docs/worker-protocol.schema.json:
// a test that passes has spoken the protocol exactly. The durable behaviour behind the
// messages is the engine's and is not imitated here.

import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";
import { WebSocket, WebSocketServer } from "ws";

// ajv-formats is CommonJS: an ESM default import is its `module.exports`, whose `default` is the plugin.
const addFormats = addFormatsModule.default;

const schemaPath = new URL("../../../../docs/worker-protocol.schema.json", import.meta.url);
const schema = JSON.parse(readFileSync(schemaPath, "utf8")) as { $id: string };
// Strict, except two style checks the schema does not follow and need not: `required` in
// `if`/`then` and `outcome` branches that declare neither properties nor `type: object`.
const ajv = new Ajv2020({ strict: true, strictRequired: false, strictTypes: false, allErrors: true });
addFormats(ajv);
ajv.addSchema(schema);
const toEngine = ajv.getSchema(`${schema.$id}#/$defs/toEngine`)!;
const toWorker = ajv.getSchema(`${schema.$id}#/$defs/toWorker`)!;

/** A message as JSON: tests read fields freely. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Frame = Record<string, any>;

/** Checks one frame against the schema; the errors as text, or undefined when it conforms. */
export function schemaErrors(direction: "toEngine" | "toWorker", frame: unknown): string | undefined {
  const validate = direction === "toEngine" ? toEngine : toWorker;
  return validate(frame) ? undefined : ajv.errorsText(validate.errors);
}

export interface MockEngineOptions {
  /** Answers the upgrade with this HTTP status instead of accepting it. */
  refuseWith?: number;
  /** false: never answer the worker's pings (a server that hangs). */
  autoPong?: boolean;
}

export class MockEngine {
  readonly url: string;
  /** Every frame a worker sent, in order, across connections. */
  readonly received: Frame[] = [];
  /** Frames that broke the schema (either way): a test ends by asserting there are none. */
  readonly violations: string[] = [];
  /** The upgrade requests, for their headers. */
  readonly upgrades: IncomingMessage[] = [];
  socket: WebSocket | undefined;
  connections = 0;
  /** For each connection (1-based), the index in `received` of its first frame. */
  readonly #firstFrame: number[] = [];
  readonly #http: Server;
  readonly #wss: WebSocketServer;
  #waiters: { match: (f: Frame) => boolean; resolve: (f: Frame) => void; from: number }[] = [];
  #connectionWaiters: (() => void)[] = [];

  private constructor(http: Server, wss: WebSocketServer, url: string) {
    this.#http = http;
    this.#wss = wss;
    this.url = url;
  }

  static async start(options: MockEngineOptions = {}): Promise<MockEngine> {
    const http = createServer();
    const wss = new WebSocketServer({ noServer: true, autoPong: options.autoPong ?? true });
    await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
    const { port } = http.address() as AddressInfo;
    const engine = new MockEngine(http, wss, `http://127.0.0.1:${port}`);
    http.on("upgrade", (request, socket, head) => {
      engine.upgrades.push(request);
      // A refused client resets the connection: that is expected, not a test failure.
      socket.on("error", () => {});
      if (request.url !== "/api/workers") {
        socket.end("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return;
      }
      if (options.refuseWith !== undefined) {
        socket.end(`HTTP/1.1 ${options.refuseWith} Refused\r\nContent-Length: 0\r\n\r\n`);
        return;
      }
      wss.handleUpgrade(request, socket, head, (ws) => engine.#accept(ws));
    });
    return engine;
  }

  #accept(ws: WebSocket): void {
    this.socket = ws;
    this.connections += 1;
    this.#firstFrame[this.connections] = this.received.length;
    ws.on("message", (data) => {
      const frame = JSON.parse(data.toString()) as Frame;
      const errors = schemaErrors("toEngine", frame);
      if (errors !== undefined) this.violations.push(`worker sent ${JSON.stringify(frame)}: ${errors}`);
      this.received.push(frame);
      this.#wake();
    });
    for (const waiter of this.#connectionWaiters.splice(0)) waiter();
  }

  #wake(): void {
    this.#waiters = this.#waiters.filter((w) => {
      const found = this.received.slice(w.from).find(w.match);
      if (found !== undefined) w.resolve(found);
      return found === undefined;
    });
  }

  /**
   * The first frame from index `from` on (default: any received so far) that matches,
   * waiting for it if need be.
   */
  next(match: Frame | ((f: Frame) => boolean), from = 0): Promise<Frame> {
    const test =
      typeof match === "function"
        ? (match as (f: Frame) => boolean)
        : (f: Frame) => Object.entries(match).every(([k, v]) => f[k] === v);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no frame matching ${typeof match === "function" ? match.toString() : JSON.stringify(match)}; got ${JSON.stringify(this.received)}`)), 5_000);
      this.#waiters.push({ match: test, from, resolve: (f) => { clearTimeout(timer); resolve(f); } });
      this.#wake();
    });
  }

  /** Waits for the nth accepted connection (1-based). */
  async connection(n: number): Promise<void> {
    while (this.connections < n) await new Promise<void>((resolve) => this.#connectionWaiters.push(resolve));
  }

  /** Sends a frame to the current connection, checking it too (a test must not feed the worker what the engine never sends). */
  send(frame: Frame): void {
    const errors = schemaErrors("toWorker", frame);
    if (errors !== undefined) this.violations.push(`test sent ${JSON.stringify(frame)}: ${errors}`);
    this.socket!.send(JSON.stringify(frame));
  }

  /** Waits for the hello of connection `n` and answers welcome. */
  async handshake(n = 1): Promise<Frame> {
    await this.connection(n);
    const hello = await this.next({ type: "hello" }, this.#firstFrame[n]);
    this.send({ type: "welcome", protocol: 1, session: `s${n}` });
    return hello;
  }

  /** Starts a run of `workflow`. */
  start(run: string, workflow: string, params: unknown = {}, id = `${run}-instance`): void {
    this.send({ type: "start", run, workflow, version: "1", instance: { id, params, timestamp: "2026-12-01T10:00:00.000Z" } });
  }

  /** Drops the current connection as a crashed server would. */
  drop(): void {
    this.socket?.terminate();
  }

  async close(): Promise<void> {
    for (const client of this.#wss.clients) client.terminate();
    this.#wss.close();
    await new Promise<void>((resolve) => this.#http.close(() => resolve()));
  }
}
