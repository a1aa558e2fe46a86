// What the tests against a real `cairn serve` share: a server on a fresh database and a free
// port (killed, stopped and restarted on the same database at will), its API, worker
// processes (fixtures under test/fixtures, run from dist), a seeded random source, waits for
// conditions, and the clean-up of every process they start, even when a test fails.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The cairn binary to test (`CAIRN_BIN=…/cairn npm test`); without it these tests skip. */
export const bin = process.env.CAIRN_BIN;
export const token = "sdk-real-token";

/**
 * The `skip` option of a file's top-level describe: a loud message when CAIRN_BIN is unset,
 * printed once per file (node:test's own skip line is easy to miss).
 */
export function skipWithoutBin(file: string): string | false {
  if (bin !== undefined) return false;
  const reason = "set CAIRN_BIN to a cairn binary that serves /api/workers to run these";
  process.stderr.write(`\n*** SKIPPED ${file}: ${reason} ***\n\n`);
  return reason;
}

// ---- processes ------------------------------------------------------------------------------

const children = new Set<ChildProcess>();
// However the test process ends, no server or worker outlives it.
process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}

/** Sends `signal` and resolves once the process has exited. */
async function end(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill(signal);
  await exited;
}

/** The last lines a process wrote, for failure messages. */
class Tail {
  readonly #lines: string[] = [];
  #partial = "";
  constructor(readonly limit = 400) {}
  push(chunk: Buffer | string): string[] {
    const text = this.#partial + chunk.toString();
    const lines = text.split("\n");
    this.#partial = lines.pop() ?? "";
    for (const line of lines) {
      this.#lines.push(line);
      if (this.#lines.length > this.limit) this.#lines.shift();
    }
    return lines;
  }
  text(): string {
    return [...this.#lines, this.#partial].join("\n");
  }
}

export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Polls `probe` (every 50 ms) until it returns something other than undefined, and returns
 * that. Fails after `timeoutMs` with `what` and the probe's last complaint.
 */
export async function until<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last === undefined ? "" : `: ${String(last)}`}`);
    }
    await pause(50);
  }
}

// ---- the server -----------------------------------------------------------------------------

export interface ServerOptions {
  /** `--account-id` (Cloudflare's routes). */
  accountId?: string;
  /** Extra arguments for `cairn serve`. */
  args?: string[];
  /** Extra environment. */
  env?: Record<string, string>;
}

/** An answer of the API: its status and JSON body. */
export interface Answer {
  status: number;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  body: any;
}

/** The instance details the API gives (`GET /api/workflows/{name}/instances/{id}`), as tests read them. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Details = Record<string, any>;

/** A `cairn serve` on a database of its own, in a temporary directory removed by `close()`. */
export class Server {
  readonly dir: string;
  readonly db: string;
  readonly port: number;
  readonly url: string;
  readonly options: ServerOptions;
  /** How many times it has been started. */
  starts = 0;
  #child: ChildProcess | undefined;
  readonly #log = new Tail();

  private constructor(port: number, options: ServerOptions) {
    this.dir = mkdtempSync(join(tmpdir(), "cairn-sdk-real-"));
    this.db = join(this.dir, "cairn.db");
    this.port = port;
    this.url = `http://127.0.0.1:${port}`;
    this.options = options;
  }

  static async start(options: ServerOptions = {}): Promise<Server> {
    assert.ok(bin, "CAIRN_BIN is set");
    const server = new Server(await freePort(), options);
    await server.restart();
    return server;
  }

  /** The server's log lines (stderr), for failure messages. */
  get log(): string {
    return this.#log.text();
  }

  /** The last `n` lines of the log, without the request lines. */
  logTail(n = 40): string {
    return this.log
      .split("\n")
      .filter((line) => !line.includes("cairn::http"))
      .slice(-n)
      .join("\n");
  }

  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** Starts the server (again) on the same database and port; resolves once it answers. */
  async restart(): Promise<void> {
    assert.equal(this.#child, undefined, "the server is not running");
    const args = ["serve", "--db", this.db, "--addr", `127.0.0.1:${this.port}`, "--no-schedules", "--token", token];
    if (this.options.accountId !== undefined) args.push("--account-id", this.options.accountId);
    args.push(...(this.options.args ?? []));
    const child = track(
      spawn(bin!, args, {
        stdio: ["ignore", "ignore", "pipe"],
        env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "info", ...this.options.env },
      }),
    );
    this.#child = child;
    this.starts += 1;
    this.#log.push(`---- start ${this.starts} (pid ${child.pid})\n`);
    child.stderr!.on("data", (chunk: Buffer) => this.#log.push(chunk));
    child.once("exit", (code, signal) => {
      this.#log.push(`---- exited (${signal ?? code})\n`);
      if (this.#child === child) this.#child = undefined;
    });
    await until(
      `cairn serve to answer on ${this.url}\n${this.log}`,
      async () => {
        if (this.#child !== child) throw new Error("it exited");
        return (await fetch(`${this.url}/healthz`).then((r) => r.ok, () => false)) || undefined;
      },
      20_000,
    );
  }

  /** SIGKILL: the server dies at once, mid-write or not. */
  async kill(): Promise<void> {
    const child = this.#child;
    if (child === undefined) return;
    await end(child, "SIGKILL");
    this.#child = undefined;
  }

  /** SIGTERM: the server drains and stops. */
  async stop(): Promise<void> {
    const child = this.#child;
    if (child === undefined) return;
    await end(child, "SIGTERM");
    this.#child = undefined;
  }

  /** Kills the server and removes its directory. */
  async close(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** One request to the API, with the token. */
  async api(method: string, path: string, body?: unknown): Promise<Answer> {
    const headers: Record<string, string> = { authorization: `Bearer ${token}` };
    if (body !== undefined) headers["content-type"] = "application/json";
    const response = await fetch(`${this.url}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await response.text();
    let json: unknown = text;
    try {
      json = text === "" ? null : JSON.parse(text);
    } catch {
      // Not JSON: kept as text.
    }
    return { status: response.status, body: json };
  }

  /** An instance's details; fails on anything but 200. */
  async details(workflow: string, id: string): Promise<Details> {
    const answer = await this.api("GET", `/api/workflows/${workflow}/instances/${encodeURIComponent(id)}`);
    assert.equal(answer.status, 200, `GET ${workflow}/${id}: ${JSON.stringify(answer.body)}`);
    return answer.body as Details;
  }

  /** The instance's details once `test` holds for them (polls). */
  async detailsWhen(workflow: string, id: string, what: string, test: (d: Details) => boolean, timeoutMs = 30_000): Promise<Details> {
    let last: Details | undefined;
    try {
      return await until(
        `${workflow}/${id} to be ${what}`,
        async () => {
          last = await this.details(workflow, id);
          return test(last) ? last : undefined;
        },
        timeoutMs,
      );
    } catch (error) {
      throw new Error(`${(error as Error).message}\nlast details: ${JSON.stringify(last)}\nserver log:\n${this.logTail()}`);
    }
  }

  /** The instance's details once its status is one of `statuses`. */
  settled(workflow: string, id: string, statuses: string[] = ["complete", "errored", "terminated"], timeoutMs = 30_000): Promise<Details> {
    return this.detailsWhen(workflow, id, statuses.join(" or "), (d) => statuses.includes(d.status), timeoutMs);
  }

  /** The workers connected now (`GET /api/workers/connected`). */
  async connected(): Promise<{ worker: string; session: number | string; running: number; concurrency: number; workflows: [string, string][] }[]> {
    const answer = await this.api("GET", "/api/workers/connected");
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    return answer.body.workers;
  }

  /** Every instance of `workflow` (follows the cursor). */
  async instances(workflow: string, status?: string): Promise<{ id: string; status: string }[]> {
    const all: { id: string; status: string }[] = [];
    let cursor: string | null = null;
    do {
      const query = new URLSearchParams({ limit: "1000" });
      if (status !== undefined) query.set("status", status);
      if (cursor !== null) query.set("cursor", cursor);
      const answer = await this.api("GET", `/api/workflows/${workflow}/instances?${query}`);
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      all.push(...answer.body.instances);
      cursor = answer.body.cursor;
    } while (cursor !== null);
    return all;
  }
}

// ---- worker processes -----------------------------------------------------------------------

/** A fixture's path in dist: `fixture("crash-worker")`. */
export function fixture(name: string): string {
  return fileURLToPath(new URL(`./fixtures/${name}.js`, import.meta.url));
}

/**
 * A worker in a child node process. The fixture prints `connected <session>` on stdout at each
 * welcome (the SDK's `connected` event); `connected()` waits for the next one.
 */
export class WorkerProcess {
  readonly child: ChildProcess;
  readonly label: string;
  sessions = 0;
  readonly #out = new Tail();
  #waiters: (() => void)[] = [];

  constructor(script: string, label: string, env: Record<string, string>) {
    this.label = label;
    this.child = track(
      spawn(process.execPath, [script], {
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, ...env, WORKER_LABEL: label },
      }),
    );
    this.child.stdout!.on("data", (chunk: Buffer) => {
      for (const line of this.#out.push(chunk)) {
        if (line.startsWith("connected ")) {
          this.sessions += 1;
          for (const waiter of this.#waiters.splice(0)) waiter();
        }
      }
    });
    this.child.stderr!.on("data", (chunk: Buffer) => this.#out.push(chunk));
  }

  /** What the worker printed (stdout and stderr). */
  get output(): string {
    return this.#out.text();
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Resolves once the worker has been welcomed `n` times in all (default: at least once). */
  async connected(n = 1, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.sessions < n) {
      if (!this.alive) throw new Error(`worker ${this.label} exited:\n${this.output}`);
      if (Date.now() > deadline) throw new Error(`worker ${this.label} was not welcomed within ${timeoutMs} ms:\n${this.output}`);
      await Promise.race([new Promise<void>((resolve) => this.#waiters.push(resolve)), pause(100)]);
    }
  }

  /** SIGKILL: the worker dies at once, wherever its step bodies are. */
  kill(): Promise<void> {
    return end(this.child, "SIGKILL");
  }

  /** SIGTERM: the fixture closes its worker gracefully. */
  stop(): Promise<void> {
    return end(this.child, "SIGTERM");
  }
}

// ---- seeded randomness ----------------------------------------------------------------------

/**
 * A seeded random source (mulberry32): the seed comes from CAIRN_TEST_SEED, else the clock,
 * and is printed so that a failure can be replayed.
 */
export class Random {
  readonly seed: number;
  #state: number;

  constructor(test: string) {
    const given = process.env.CAIRN_TEST_SEED;
    this.seed = given !== undefined && given !== "" ? Number(given) >>> 0 : Date.now() >>> 0;
    this.#state = this.seed;
    process.stderr.write(`${test}: seed ${this.seed} (CAIRN_TEST_SEED=${this.seed} repeats it)\n`);
  }

  /** In [0, 1). */
  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** A whole number in [min, max]. */
  between(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }
}

// ---- the ledger of step bodies --------------------------------------------------------------

/** One line of a fixture's ledger: a step body started or finished. */
export interface LedgerLine {
  instance: string;
  step: string;
  attempt: number;
  phase: "start" | "end";
  worker: string;
}

export function readLedger(path: string): LedgerLine[] {
  let text = "";
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return [];
  }
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => {
      const [instance, step, attempt, phase, worker] = line.split(" ");
      return { instance: instance!, step: step!, attempt: Number(attempt), phase: phase as "start" | "end", worker: worker! };
    });
}
