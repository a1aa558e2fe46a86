// Bad input from a worker, over a real WebSocket to a real `cairn serve` (CAIRN_BIN): frames
// written by hand (no SDK), so each one is exactly the mistake under test. Each gets the
// error code docs/worker-protocol.md gives it (frames checked against the schema too) and
// changes nothing durable: the instances involved are read back through the API, and the
// session goes on working afterwards.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import WebSocket from "ws";
import { schemaErrors } from "./mock-engine.js";
import { type Details, Server, pause, skipWithoutBin, token, until } from "./real-engine.js";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Frame = Record<string, any>;

/** A worker made by hand: one WebSocket, every frame it received kept in order. */
class RawWorker {
  readonly received: Frame[] = [];
  readonly socket: WebSocket;
  readonly closed: Promise<{ code: number; reason: string }>;
  readonly violations: string[] = [];
  #cursor = 0;
  #wake: (() => void)[] = [];

  private constructor(socket: WebSocket) {
    this.socket = socket;
    this.closed = new Promise((resolve) => socket.on("close", (code, reason) => resolve({ code, reason: reason.toString() })));
    socket.on("message", (data) => {
      const frame = JSON.parse(data.toString()) as Frame;
      const problem = schemaErrors("toWorker", frame);
      if (problem !== undefined) this.violations.push(`${JSON.stringify(frame)}: ${problem}`);
      this.received.push(frame);
      for (const wake of this.#wake.splice(0)) wake();
    });
    socket.on("close", () => {
      for (const wake of this.#wake.splice(0)) wake();
    });
  }

  /** Connects (with the token unless told otherwise); resolves once the socket is open. */
  static async open(server: Server, headers: Record<string, string> = { authorization: `Bearer ${token}` }): Promise<RawWorker> {
    const socket = new WebSocket(`ws://127.0.0.1:${server.port}/api/workers`, { headers, maxPayload: 64 * 1024 * 1024 });
    const worker = new RawWorker(socket);
    await new Promise<void>((resolve, reject) => {
      socket.once("open", () => resolve());
      socket.once("error", reject);
    });
    return worker;
  }

  /** Connects and says hello for `workflows` (version "1"); resolves with the welcome. */
  static async hello(server: Server, workflows: string[], concurrency = 4): Promise<RawWorker> {
    const worker = await RawWorker.open(server);
    worker.send({ type: "hello", protocol: 1, worker: "raw", workflows: workflows.map((name) => ({ name, version: "1" })), concurrency });
    const welcome = await worker.next("a welcome", (f) => f.type === "welcome" || f.type === "error");
    assert.equal(welcome.type, "welcome", JSON.stringify(welcome));
    return worker;
  }

  send(frame: Frame | string): void {
    this.socket.send(typeof frame === "string" ? frame : JSON.stringify(frame));
  }

  /** The next frame (after those already taken) that `match`es; the ones skipped stay readable by `all`. */
  async next(what: string, match: (f: Frame) => boolean, timeoutMs = 10_000): Promise<Frame> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      while (this.#cursor < this.received.length) {
        const frame = this.received[this.#cursor]!;
        this.#cursor += 1;
        if (match(frame)) return frame;
      }
      if (this.socket.readyState === WebSocket.CLOSED) throw new Error(`the connection closed before ${what}; received ${JSON.stringify(this.received)}`);
      if (Date.now() > deadline) throw new Error(`no ${what} within ${timeoutMs} ms; received ${JSON.stringify(this.received)}`);
      await Promise.race([new Promise<void>((resolve) => this.#wake.push(resolve)), pause(100)]);
    }
  }

  /** The next frame, whatever it is. */
  nextFrame(what: string, timeoutMs?: number): Promise<Frame> {
    return this.next(what, () => true, timeoutMs);
  }

  /** The `error` answered to `frame`, with `code`. */
  async refuses(frame: Frame | string, code: string): Promise<Frame> {
    this.send(frame);
    const error = await this.next(`an error ${code} for ${String(typeof frame === "string" ? frame : JSON.stringify(frame)).slice(0, 200)}`, (f) => f.type === "error");
    assert.equal(error.code, code, JSON.stringify(error));
    assert.equal(typeof error.message, "string");
    assert.ok(error.message.length > 0);
    return error;
  }

  close(): void {
    this.socket.terminate();
  }
}

/** The details that must not change: all of them, for an instance whose attempt runs. */
function durable(details: Details): string {
  return JSON.stringify(details);
}

describe("bad input from a worker", { skip: skipWithoutBin("protocol.test.ts") }, () => {
  let server: Server;
  const sockets: RawWorker[] = [];
  const connect = async (workflows: string[], concurrency?: number) => {
    const worker = await RawWorker.hello(server, workflows, concurrency);
    sockets.push(worker);
    return worker;
  };

  before(async () => {
    server = await Server.start();
  });

  after(async () => {
    for (const socket of sockets) socket.close();
    await server?.close();
  });

  /**
   * An instance of `workflow` started on `worker`, its run live: op 0 is a `do` whose attempt
   * the engine has asked for and the test has not answered (so the run holds its slot and
   * cannot hibernate). Resolves with the run, the task and the details then.
   */
  async function liveInstance(worker: RawWorker, workflow: string, id: string): Promise<{ run: string; task: string; details: Details }> {
    const created = await server.api("POST", `/api/workflows/${workflow}/instances`, { instance_id: id, params: { n: 1 } });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const start = await worker.next(`the start of ${id}`, (f) => f.type === "start" && f.instance.id === id);
    worker.send({ type: "op", run: start.run, seq: 0, op: "do", name: "work", config: null, delayFunction: false });
    worker.send({ type: "idle", run: start.run, ops: 1 });
    const attempt = await worker.next(`the attempt of ${id}`, (f) => f.type === "attempt" && f.run === start.run);
    const details = await server.detailsWhen(workflow, id, "running its attempt", (d) => d.steps.length === 1 && d.steps[0].attempts.length === 1);
    return { run: start.run, task: attempt.task, details };
  }

  /** Answers the live instance's attempt and ends its run with `output`; resolves with its final details. */
  async function finish(worker: RawWorker, workflow: string, id: string, run: string, task: string, output: unknown): Promise<Details> {
    worker.send({ type: "attemptResult", run, task, ok: "worked" });
    const answer = await worker.next(`the opResult of ${id}`, (f) => f.type === "opResult" && f.run === run && f.seq === 0);
    assert.equal(answer.ok, "worked");
    worker.send({ type: "runResult", run, ok: output });
    return server.settled(workflow, id);
  }

  it("refuses a bad handshake with its code and closes: version, workflow, first frame, token", async () => {
    const version = await RawWorker.open(server);
    sockets.push(version);
    await version.refuses({ type: "hello", protocol: 2, worker: "raw", workflows: [{ name: "v2", version: "1" }], concurrency: 1 }, "protocol.version");
    await version.closed;

    // A name that Rust code registered in the server (the demo's greet) cannot be a worker's.
    const taken = await RawWorker.open(server);
    sockets.push(taken);
    await taken.refuses({ type: "hello", protocol: 1, worker: "raw", workflows: [{ name: "greet", version: "1" }], concurrency: 1 }, "protocol.workflow");
    await taken.closed;

    const first = await RawWorker.open(server);
    sockets.push(first);
    await first.refuses({ type: "idle", run: "r1", ops: 0 }, "protocol.malformed");
    await first.closed;

    const garbage = await RawWorker.open(server);
    sockets.push(garbage);
    await garbage.refuses("{not json", "protocol.malformed");
    await garbage.closed;

    // Without the token the upgrade itself is refused with 401.
    const status = await new Promise<number>((resolve) => {
      const socket = new WebSocket(`ws://127.0.0.1:${server.port}/api/workers`);
      socket.on("unexpected-response", (_request, response) => resolve(response.statusCode ?? 0));
      socket.on("open", () => resolve(101));
      socket.on("error", () => {});
    });
    assert.equal(status, 401);

    // None of them registered anything.
    const workflows = (await server.api("GET", "/api/workflows")).body.workflows.map((w: { name: string }) => w.name);
    assert.ok(!workflows.includes("v2"), JSON.stringify(workflows));
    for (const socket of [version, taken, first, garbage]) assert.deepEqual(socket.violations, []);
  });

  it("answers malformed frames with protocol.malformed or protocol.unknown_type, and goes on", async () => {
    const worker = await connect(["bad-frames"]);
    const { run, task, details } = await liveInstance(worker, "bad-frames", "m1");

    await worker.refuses("not json at all", "protocol.malformed");
    await worker.refuses("[1, 2, 3]", "protocol.malformed");
    await worker.refuses("42", "protocol.malformed");
    await worker.refuses("null", "protocol.malformed");
    await worker.refuses({ run, seq: 1 }, "protocol.malformed");
    await worker.refuses({ type: 7, run }, "protocol.malformed");
    await worker.refuses({ type: "hello", protocol: 1, worker: "again", workflows: [{ name: "bad-frames", version: "2" }], concurrency: 1 }, "protocol.malformed");
    await worker.refuses({ type: "op", seq: 1, op: "sleep", name: "x", duration: 1 }, "protocol.malformed");
    await worker.refuses({ type: "op", run, seq: 1, op: "teleport", name: "x" }, "protocol.malformed");
    await worker.refuses({ type: "op", run, seq: 1, op: "sleep", duration: "1 second" }, "protocol.malformed");
    await worker.refuses({ type: "runResult", run, ok: 1, error: { name: "Error", message: "both" } }, "protocol.malformed");
    await worker.refuses({ type: "runResult", run }, "protocol.malformed");
    await worker.refuses({ type: "idle", run, ops: "many" }, "protocol.malformed");
    await worker.refuses({ type: "attemptResult", run, ok: 1 }, "protocol.malformed");
    await worker.refuses({ type: "teleport", run }, "protocol.unknown_type");
    const binary = worker.next("an error for a binary frame", (f) => f.type === "error");
    worker.socket.send(Buffer.from([1, 2, 3]), { binary: true });
    assert.equal((await binary).code, "protocol.malformed");

    // Nothing durable changed, and the session still works: the run goes on to its end.
    assert.equal(durable(await server.details("bad-frames", "m1")), durable(details));
    assert.equal((await server.api("GET", "/api/workflows/bad-frames/versions")).status, 200);
    const versions = (await server.api("GET", "/api/workflows/bad-frames")).body.versions.map((v: { version: string }) => v.version);
    assert.deepEqual(versions, ["1"], "the second hello registered no version");
    const done = await finish(worker, "bad-frames", "m1", run, task, { done: true });
    assert.equal(done.status, "complete");
    assert.deepEqual(done.output, { done: true });
    assert.deepEqual(worker.violations, []);
  });

  it("answers messages about an unknown run with protocol.stale, changing nothing", async () => {
    const worker = await connect(["unknown-run"]);
    const { run, task, details } = await liveInstance(worker, "unknown-run", "u1");
    const other = `${run}-nope`;
    for (const frame of [
      { type: "op", run: other, seq: 0, op: "do", name: "sneak", config: null, delayFunction: false },
      { type: "op", run: other, seq: 1, op: "sleep", name: "nap", duration: 1 },
      { type: "idle", run: other, ops: 1 },
      { type: "runResult", run: other, ok: "finished elsewhere" },
      { type: "runResult", run: other, error: { name: "Error", message: "failed elsewhere" } },
      { type: "attemptResult", run: other, task: "t1", ok: 1 },
      { type: "rollbackResult", run: other, task: "t1", ok: null },
      { type: "delayResult", run: other, task: "t1", ok: 10 },
    ]) {
      const error = await worker.refuses(frame, "protocol.stale");
      assert.equal(error.run, other, JSON.stringify(error));
    }
    // A task of the live run that was never asked for.
    const error = await worker.refuses({ type: "attemptResult", run, task: "t-never", ok: "forged" }, "protocol.stale");
    assert.equal(error.run, run);
    assert.equal(durable(await server.details("unknown-run", "u1")), durable(details));
    // The run is still this session's: it ends normally.
    const done = await finish(worker, "unknown-run", "u1", run, task, "normal");
    assert.equal(done.status, "complete");
    assert.equal(done.output, "normal");
    assert.deepEqual(worker.violations, []);
  });

  it("answers a stale task answer (answered twice, cancelled by a timeout, of a stopped run) with protocol.stale", async () => {
    const worker = await connect(["stale-task"]);
    const created = await server.api("POST", "/api/workflows/stale-task/instances", { instance_id: "s1" });
    assert.equal(created.status, 201);
    let start = await worker.next("the start of s1", (f) => f.type === "start");
    let run = start.run as string;
    const config = { retries: { limit: 2, delay: 100, backoff: "constant" }, timeout: "1 second" };
    worker.send({ type: "op", run, seq: 0, op: "do", name: "first", config, delayFunction: false });
    worker.send({ type: "idle", run, ops: 1 });
    const attempt = await worker.next("the attempt of first", (f) => f.type === "attempt" && f.run === run);
    worker.send({ type: "attemptResult", run, task: attempt.task, ok: "once" });
    assert.equal((await worker.next("first's opResult", (f) => f.type === "opResult" && f.seq === 0)).ok, "once");
    // The same answer again, and another value for it: stale, and the output stays.
    await worker.refuses({ type: "attemptResult", run, task: attempt.task, ok: "twice" }, "protocol.stale");
    await worker.refuses({ type: "attemptResult", run, task: attempt.task, error: { name: "Error", message: "late", nonRetryable: true } }, "protocol.stale");
    // The success is committed with the run's next commit or the engine's flush: wait for it.
    let details = await server.detailsWhen("stale-task", "s1", "first succeeded", (d) => d.steps[0]?.success === true);
    assert.equal(details.steps[0].output, "once");
    assert.equal(details.steps[0].attempts.length, 1);

    // An attempt past its timeout is given up (cancel); its late answer is stale.
    worker.send({ type: "op", run, seq: 1, op: "do", name: "slow", config, delayFunction: false });
    worker.send({ type: "idle", run, ops: 2 });
    const slow = await worker.next("the attempt of slow", (f) => f.type === "attempt" && f.seq === 1);
    const cancel = await worker.next("the cancel of slow's attempt", (f) => f.type === "cancel" && f.task === slow.task);
    assert.equal(cancel.run, run);
    await worker.refuses({ type: "attemptResult", run, task: slow.task, ok: "too late" }, "protocol.stale");
    const retry = await worker.next("slow's second attempt", (f) => f.type === "attempt" && f.seq === 1);
    assert.equal(retry.attempt, 2);
    details = await server.details("stale-task", "s1");
    const slowStep = details.steps.find((s: Details) => s.name === "slow");
    assert.equal(slowStep.attempts[0].success, false);
    assert.equal(slowStep.attempts[0].error.name, "WorkflowTimeoutError", JSON.stringify(slowStep.attempts[0]));
    assert.equal(slowStep.output, null, "the late answer was not kept");

    // Pause the instance: its run stops; answers about it afterwards are stale.
    assert.equal((await server.api("PATCH", "/api/workflows/stale-task/instances/s1/status", { status: "pause" })).status, 200);
    worker.send({ type: "attemptResult", run, task: retry.task, ok: "after a while" });
    await worker.next("the run's stop", (f) => f.type === "stop" && f.run === run);
    await server.settled("stale-task", "s1", ["paused"]);
    const frozen = await server.details("stale-task", "s1");
    await worker.refuses({ type: "attemptResult", run, task: retry.task, ok: "after the stop" }, "protocol.stale");
    await worker.refuses({ type: "op", run, seq: 2, op: "sleep", name: "nap", duration: 1 }, "protocol.stale");
    await worker.refuses({ type: "runResult", run, ok: "after the stop" }, "protocol.stale");
    assert.equal(durable(await server.details("stale-task", "s1")), durable(frozen));

    // Resumed, it runs again from its journal: first answers at once, slow is asked again.
    assert.equal((await server.api("PATCH", "/api/workflows/stale-task/instances/s1/status", { status: "resume" })).status, 200);
    start = await worker.next("the start after the resume", (f) => f.type === "start" && f.run !== run);
    run = start.run;
    worker.send({ type: "op", run, seq: 0, op: "do", name: "first", config, delayFunction: false });
    assert.equal((await worker.next("first from the journal", (f) => f.type === "opResult" && f.run === run && f.seq === 0)).ok, "once");
    worker.send({ type: "op", run, seq: 1, op: "do", name: "slow", config, delayFunction: false });
    const frame = await worker.next("slow's answer or attempt", (f) => f.run === run && ((f.type === "opResult" && f.seq === 1) || f.type === "attempt"));
    if (frame.type === "attempt") worker.send({ type: "attemptResult", run, task: frame.task, ok: "finally" });
    worker.send({ type: "runResult", run, ok: "end" });
    const done = await server.settled("stale-task", "s1");
    assert.equal(done.status, "complete", JSON.stringify(done));
    assert.deepEqual(worker.violations, []);
  });

  it("fails a step whose result is over the 1 MiB payload limit, at once, with a clear error; keeps nothing of it", async () => {
    const worker = await connect(["too-large"]);
    await server.api("POST", "/api/workflows/too-large/instances", { instance_id: "big" });
    const start = await worker.next("the start of big", (f) => f.type === "start");
    const run = start.run as string;
    const config = { retries: { limit: 5, delay: 100, backoff: "constant" } };
    worker.send({ type: "op", run, seq: 0, op: "do", name: "small", config, delayFunction: false });
    worker.send({ type: "idle", run, ops: 1 });
    const first = await worker.next("small's attempt", (f) => f.type === "attempt" && f.seq === 0);
    worker.send({ type: "attemptResult", run, task: first.task, ok: { fine: true } });
    await worker.next("small's opResult", (f) => f.type === "opResult" && f.seq === 0);

    worker.send({ type: "op", run, seq: 1, op: "do", name: "large", config, delayFunction: false });
    worker.send({ type: "idle", run, ops: 2 });
    const attempt = await worker.next("large's attempt", (f) => f.type === "attempt" && f.seq === 1);
    const big = "x".repeat(1024 * 1024 + 10); // over 1 MiB as JSON, well under a frame's 2 MiB
    worker.send({ type: "attemptResult", run, task: attempt.task, ok: big });
    const answer = await worker.next("large's opResult", (f) => f.type === "opResult" && f.seq === 1);
    assert.equal(answer.ok, undefined);
    assert.equal(answer.error.name, "WorkflowInternalError", JSON.stringify(answer));
    assert.match(answer.error.message, /too large/);
    assert.match(answer.error.message, /1048576|1 ?MiB/);

    const details = await server.detailsWhen("too-large", "big", "large failed", (d) => d.steps.find((s: Details) => s.name === "large")?.success === false);
    const large = details.steps.find((s: Details) => s.name === "large");
    assert.equal(large.success, false);
    assert.equal(large.output, null);
    assert.equal(large.attempts.length, 1, "not retried: more attempts cannot make the value smaller");
    assert.equal(large.error.name, "WorkflowInternalError");
    assert.ok(!JSON.stringify(details).includes("xxxxxxxxxx"), "nothing of the value was kept");
    const small = details.steps.find((s: Details) => s.name === "small");
    assert.deepEqual(small.output, { fine: true });

    // The code may catch the step's error and go on; a workflow output over the limit fails the instance.
    worker.send({ type: "runResult", run, ok: big });
    const done = await server.settled("too-large", "big");
    assert.equal(done.status, "errored", JSON.stringify({ ...done, output: String(done.output).slice(0, 40) }));
    assert.equal(done.output, null);
    assert.match(done.error.message, /too large/);
    assert.deepEqual(worker.violations, []);
  });

  it("answers a frame over 2 MiB with protocol.too_large and keeps nothing of it", async () => {
    const worker = await connect(["huge-frame"]);
    const { run, task, details } = await liveInstance(worker, "huge-frame", "h1");
    await worker.refuses({ type: "attemptResult", run, task, ok: "y".repeat(2 * 1024 * 1024 + 1024) }, "protocol.too_large");
    await worker.refuses({ type: "runResult", run, ok: "y".repeat(2 * 1024 * 1024 + 1024) }, "protocol.too_large");
    assert.equal(durable(await server.details("huge-frame", "h1")), durable(details));
    // The session goes on, and the attempt is still asked for.
    assert.equal((await finish(worker, "huge-frame", "h1", run, task, "small")).output, "small");
    assert.deepEqual(worker.violations, []);
  });

  it("gives up a run whose ops come out of order (protocol.sequence) and runs it again later", async () => {
    const worker = await connect(["out-of-order"]);
    await server.api("POST", "/api/workflows/out-of-order/instances", { instance_id: "o1" });
    const start = await worker.next("the start of o1", (f) => f.type === "start");
    const run = start.run as string;
    worker.send({ type: "op", run, seq: 0, op: "do", name: "one", config: null, delayFunction: false });
    const attempt = await worker.next("one's attempt", (f) => f.type === "attempt" && f.run === run);
    worker.send({ type: "attemptResult", run, task: attempt.task, ok: 1 });
    await worker.next("one's opResult", (f) => f.type === "opResult" && f.run === run);
    // A step's success is committed with the run's next commit, or by the engine's own flush
    // once the run waits: compare against the journal once it holds it, so that only a step
    // made by the op out of order can tell `after` from `before`.
    const before = await server.detailsWhen("out-of-order", "o1", "one succeeded", (d) => d.steps[0]?.success === true);
    const error = await worker.refuses({ type: "op", run, seq: 5, op: "do", name: "jumped", config: null, delayFunction: false }, "protocol.sequence");
    assert.equal(error.run, run);
    const stop = await worker.next("the run's stop", (f) => f.type === "stop" && f.run === run);
    assert.equal(stop.reason, "lost");
    const after = await server.details("out-of-order", "o1");
    assert.deepEqual(after.steps, before.steps, "the op out of order made no step");
    // The instance runs again (as after a crash), from its journal.
    const again = await worker.next("a new start of o1", (f) => f.type === "start" && f.instance.id === "o1", 30_000);
    assert.notEqual(again.run, run);
    worker.send({ type: "op", run: again.run, seq: 0, op: "do", name: "one", config: null, delayFunction: false });
    const replayed = await worker.next("one from the journal", (f) => f.type === "opResult" && f.run === again.run);
    assert.equal(replayed.ok, 1);
    worker.send({ type: "runResult", run: again.run, ok: "ok" });
    assert.equal((await server.settled("out-of-order", "o1")).status, "complete");
    assert.deepEqual(worker.violations, []);
  });

  it("refuses an answer of the wrong kind for a task (a delayResult for an attempt) and keeps nothing of it", async () => {
    const worker = await connect(["wrong-kind"]);
    await server.api("POST", "/api/workflows/wrong-kind/instances", { instance_id: "k1" });
    const start = await worker.next("the start of k1", (f) => f.type === "start");
    const run = start.run as string;
    worker.send({ type: "op", run, seq: 0, op: "do", name: "step", config: null, delayFunction: false });
    worker.send({ type: "idle", run, ops: 1 });
    const attempt = await worker.next("the attempt", (f) => f.type === "attempt" && f.run === run);
    // An attempt is answered by attemptResult: a delayResult or rollbackResult for it is not the step's output.
    worker.send({ type: "delayResult", run, task: attempt.task, ok: 5000 });
    worker.send({ type: "rollbackResult", run, task: attempt.task, ok: "not an output" });
    const answer = await worker.nextFrame("an answer to the wrongly typed results");
    await pause(300);
    const details = await server.details("wrong-kind", "k1");
    assert.equal(details.steps[0].output, null, `the step kept a delayResult as its output; the engine answered ${JSON.stringify(answer)}`);
    assert.equal(answer.type, "error", JSON.stringify(answer));
    assert.ok(["protocol.stale", "protocol.malformed"].includes(answer.code), JSON.stringify(answer));
    worker.send({ type: "attemptResult", run, task: attempt.task, ok: "the output" });
    await until("the real answer to count", async () => ((await server.details("wrong-kind", "k1")).steps[0].output === "the output" ? true : undefined));
  });

  it("a connection dropped by a frame over the transport's limit interrupts the attempt it was answering, and nothing else", async () => {
    const worker = await connect(["dropped"]);
    await server.api("POST", "/api/workflows/dropped/instances", { instance_id: "d1" });
    const start = await worker.next("the start of d1", (f) => f.type === "start");
    const run = start.run as string;
    const config = { retries: { limit: 3, delay: 100, backoff: "constant" } };
    worker.send({ type: "op", run, seq: 0, op: "do", name: "step", config, delayFunction: false });
    const attempt = await worker.next("the attempt", (f) => f.type === "attempt");
    worker.send({ type: "attemptResult", run, task: attempt.task, ok: "z".repeat(4 * 1024 * 1024) });
    const closed = await worker.closed;
    // What the server says as it drops the connection (a close code or nothing): reported, not prescribed.
    process.stderr.write(`a 4 MiB frame: the server closed the connection with ${closed.code} ${JSON.stringify(closed.reason)}; frames before: ${JSON.stringify(worker.received.slice(-2))}\n`);
    const details = await server.detailsWhen("dropped", "d1", "waiting for a worker", (d) => d.waitingForWorker === "1");
    assert.equal(details.steps[0].output, null);
    assert.ok(!JSON.stringify(details).includes("zzzzzzzzzz"));
    // Another worker of the version finishes it: the dropped attempt counted as interrupted.
    const next = await connect(["dropped"]);
    const again = await next.next("a new start of d1", (f) => f.type === "start");
    next.send({ type: "op", run: again.run, seq: 0, op: "do", name: "step", config, delayFunction: false });
    const retry = await next.next("the retry", (f) => f.type === "attempt");
    assert.equal(retry.attempt, 2);
    next.send({ type: "attemptResult", run: again.run, task: retry.task, ok: "small" });
    await next.next("the opResult", (f) => f.type === "opResult");
    next.send({ type: "runResult", run: again.run, ok: "done" });
    const done = await server.settled("dropped", "d1");
    assert.equal(done.status, "complete");
    assert.equal(done.steps[0].output, "small");
    assert.equal(done.steps[0].attempts.length, 2);
    assert.equal(done.steps[0].attempts[0].success, false);
  });
});
