// The worker's connection: hello and welcome, refusals, runs held at once, stop,
// reconnecting, pings and a graceful close.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { WorkflowEntrypoint, type WorkflowEvent, type WorkflowStep, serve } from "@cairn-engine/workflows";
import { deferred, Lines, setup } from "./helpers.js";
import { MockEngine } from "./mock-engine.js";

/** Makes one step and returns its output. */
class OneStep extends WorkflowEntrypoint {
  async run(event: WorkflowEvent<{ step?: string }>, step: WorkflowStep) {
    return step.do(event.payload.step ?? "work", async () => "done");
  }
}

describe("the handshake", () => {
  it("says hello with the workflows, the version and the concurrency, and sends the token", async () => {
    const previous = process.env.CAIRN_WORKFLOW_VERSION;
    process.env.CAIRN_WORKFLOW_VERSION = "2026-11-30.1";
    try {
      const engine = await MockEngine.start();
      const worker = serve({
        url: `${engine.url}/`,
        token: "s3cret",
        name: "checkout-worker@host-7",
        workflows: { checkout: OneStep, refund: OneStep },
        concurrency: 32,
        heartbeatMs: 0,
        logger: new Lines(),
      });
      const hello = await engine.handshake();
      assert.deepEqual(hello, {
        type: "hello",
        protocol: 1,
        worker: "checkout-worker@host-7",
        workflows: [
          { name: "checkout", version: "2026-11-30.1" },
          { name: "refund", version: "2026-11-30.1" },
        ],
        concurrency: 32,
      });
      assert.equal(engine.upgrades[0]!.headers.authorization, "Bearer s3cret");
      assert.equal(await worker.ready, "s1");
      assert.equal(worker.session, "s1");
      await worker.close();
      await engine.close();
      assert.deepEqual(engine.violations, []);
    } finally {
      if (previous === undefined) delete process.env.CAIRN_WORKFLOW_VERSION;
      else process.env.CAIRN_WORKFLOW_VERSION = previous;
    }
  });

  it("defaults the version to 1 and the concurrency to 16", async () => {
    const previous = process.env.CAIRN_WORKFLOW_VERSION;
    delete process.env.CAIRN_WORKFLOW_VERSION;
    try {
      const { engine, done } = await setup({ workflows: { w: OneStep } });
      const hello = engine.received[0]!;
      assert.deepEqual([hello.workflows, hello.concurrency], [[{ name: "w", version: "1" }], 16]);
      assert.equal(engine.upgrades[0]!.headers.authorization, process.env.CAIRN_TOKEN ? `Bearer ${process.env.CAIRN_TOKEN}` : undefined);
      await done();
    } finally {
      if (previous !== undefined) process.env.CAIRN_WORKFLOW_VERSION = previous;
    }
  });

  it("gives up when the engine refuses the hello", async () => {
    const { engine, worker, lines } = await setup({ workflows: { w: OneStep }, handshake: false });
    await engine.next({ type: "hello" });
    engine.send({ type: "error", code: "protocol.workflow", message: "w is registered by Rust code" });
    await assert.rejects(worker.ready, /refused this worker: protocol.workflow: w is registered by Rust code/);
    await assert.rejects(worker.closed, /protocol.workflow/);
    assert.equal(engine.connections, 1);
    assert.match(lines.errors[0]!, /giving up/);
    await engine.close();
    assert.deepEqual(engine.violations, []);
  });

  it("gives up on a 401 and retries a 503", async () => {
    const refusing = await MockEngine.start({ refuseWith: 401 });
    const refused = serve({ url: refusing.url, workflows: { w: OneStep }, heartbeatMs: 0, logger: new Lines() });
    await assert.rejects(refused.ready, /HTTP 401 \(the token is missing or wrong\)/);
    await refusing.close();

    const busy = await MockEngine.start({ refuseWith: 503 });
    const retrying = serve({ url: busy.url, workflows: { w: OneStep }, heartbeatMs: 0, logger: new Lines() });
    while (busy.upgrades.length < 3) await new Promise((resolve) => setTimeout(resolve, 20));
    await retrying.close();
    await assert.rejects(retrying.ready, /closed before the engine welcomed it/);
    await busy.close();
  });

  it("refuses options the engine would refuse", () => {
    assert.throws(() => serve({ workflows: {} }), /at least one workflow/);
    assert.throws(() => serve({ workflows: { "no spaces": OneStep } }), /workflow name/);
    assert.throws(() => serve({ workflows: { w: OneStep }, concurrency: 0 }), /concurrency/);
    assert.throws(() => serve({ workflows: { w: OneStep }, url: "ftp://host" }), /http/);
    // The engine's limits, not looser ones it would refuse at connect.
    assert.throws(() => serve({ workflows: { w: OneStep }, concurrency: 10_001 }), /1 to 10000/);
    assert.throws(() => serve({ workflows: { w: OneStep }, version: "v".repeat(101) }), /1-100 bytes/);
    assert.throws(() => serve({ workflows: { w: OneStep }, version: "é".repeat(51) }), /1-100 bytes/);
  });
});

describe("runs", () => {
  it("get the event and env, as Cloudflare constructs entrypoints", async () => {
    class Greeter extends WorkflowEntrypoint<{ GREETING: string }, { name: string }> {
      async run(event: WorkflowEvent<{ name: string }>, _step: WorkflowStep) {
        this.ctx.waitUntil(Promise.resolve());
        return {
          text: `${this.env.GREETING}, ${event.payload.name}`,
          instanceId: event.instanceId,
          timestamp: event.timestamp.toISOString(),
        };
      }
    }
    // A class that does not extend WorkflowEntrypoint still gets `env`.
    class Plain {
      env?: { GREETING: string };
      async run() {
        return this.env?.GREETING;
      }
    }
    const { engine, done } = await setup({ workflows: { greet: Greeter, plain: Plain }, env: { GREETING: "Hello" } });
    engine.start("r1", "greet", { name: "Ada" }, "order-17");
    assert.deepEqual((await engine.next({ type: "runResult", run: "r1" })).ok, {
      text: "Hello, Ada",
      instanceId: "order-17",
      timestamp: "2026-12-01T10:00:00.000Z",
    });
    engine.start("r2", "plain");
    assert.equal((await engine.next({ type: "runResult", run: "r2" })).ok, "Hello");
    engine.start("r3", "missing");
    assert.match((await engine.next({ type: "runResult", run: "r3" })).error.message, /does not run workflow missing/);
    await done();
  });

  it("never exceed the concurrency: a start past it waits for a stop", async () => {
    const { engine, done } = await setup({ workflows: { w: OneStep }, concurrency: 2 });
    assert.equal(engine.received[0]!.concurrency, 2);
    engine.start("r1", "w");
    engine.start("r2", "w");
    engine.start("r3", "w");
    await engine.next({ type: "op", run: "r1" });
    await engine.next({ type: "op", run: "r2" });
    // A round trip after the three starts: had r3 started, its op would have come first.
    engine.send({ type: "attempt", run: "r2", task: "t1", seq: 0, attempt: 1 });
    await engine.next({ type: "attemptResult", task: "t1" });
    assert.equal(engine.received.filter((f) => f.run === "r3").length, 0);
    engine.send({ type: "stop", run: "r1", reason: "hibernated" });
    assert.equal((await engine.next({ type: "op", run: "r3" })).seq, 0);
    await done();
  });

  it("stop drops the run: its late results are not sent and later messages about it are ignored", async () => {
    const gate = deferred();
    const started = deferred();
    class Held extends WorkflowEntrypoint {
      async run(event: WorkflowEvent<{ hold: boolean }>, step: WorkflowStep) {
        const value = await step.do("held", async () => {
          if (event.payload.hold) {
            started.resolve();
            await gate.promise;
          }
          return "value";
        });
        return step.do("next", async () => value);
      }
    }
    const { engine, lines, done } = await setup({ workflows: { held: Held } });
    engine.start("r1", "held", { hold: true });
    await engine.next({ type: "op", run: "r1" });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    await started.promise;
    engine.send({ type: "stop", run: "r1", reason: "lost" });
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: "value" });
    // The same instance runs again, afresh: its ops are numbered from 0 again. Its op
    // coming back also shows the worker has read the stop.
    engine.start("r2", "held", { hold: false });
    const op = await engine.next({ type: "op", run: "r2" });
    assert.equal(op.seq, 0);
    gate.resolve();
    engine.send({ type: "opResult", run: "r2", seq: 0, ok: "value" });
    await engine.next({ type: "op", run: "r2", seq: 1 });
    assert.deepEqual(
      engine.received.filter((f) => f.run === "r1" && f.type !== "idle").map((f) => f.type),
      ["op"],
      "nothing about r1 after its stop: no attemptResult, no second op, no runResult",
    );
    assert.ok(lines.warnings.some((w) => /opResult message about run r1, not held here/.test(w)));
    await done();
  });
});

describe("the connection", () => {
  it("reconnects with back-off, says hello again, and the engine's runs start afresh", async () => {
    const gate = deferred();
    class Held extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        return step.do("held", async () => {
          await gate.promise;
          return "late";
        });
      }
    }
    const { engine, worker, done } = await setup({ workflows: { held: Held } });
    const events: string[] = [];
    worker.on("connected", (session: string) => events.push(`connected ${session}`));
    worker.on("disconnected", () => events.push("disconnected"));
    engine.start("r1", "held");
    await engine.next({ type: "op", run: "r1" });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    engine.drop();
    const hello = await engine.handshake(2);
    assert.equal(hello.type, "hello");
    assert.equal(engine.received.filter((f) => f.type === "hello").length, 2);
    gate.resolve();
    engine.start("r1", "held");
    const op = await engine.next((f) => f.type === "op" && f.run === "r1", engine.received.indexOf(hello));
    assert.equal(op.seq, 0);
    engine.send({ type: "attempt", run: "r1", task: "t2", seq: 0, attempt: 2 });
    await engine.next({ type: "attemptResult", task: "t2" });
    assert.equal(engine.received.filter((f) => f.task === "t1").length, 0, "the dropped attempt's result is not sent on the new session");
    assert.deepEqual(events, ["disconnected", "connected s2"]);
    await done();
  });

  it("answers the engine's pings and pings the engine", async () => {
    const { engine, done } = await setup({ workflows: { w: OneStep }, heartbeatMs: 20 });
    const socket = engine.socket!;
    const pong = new Promise((resolve) => socket.once("pong", resolve));
    socket.ping();
    await pong;
    await new Promise((resolve) => socket.once("ping", resolve));
    await done();
  });

  it("drops a connection whose server stopped answering pings, and reconnects", async () => {
    const engine = await MockEngine.start({ autoPong: false });
    const worker = serve({ url: engine.url, workflows: { w: OneStep }, heartbeatMs: 20, logger: new Lines() });
    await engine.handshake(1);
    const dropped = new Promise<string>((resolve) => worker.once("disconnected", resolve));
    assert.equal(await dropped, "the server stopped answering pings");
    await engine.handshake(2);
    await worker.close();
    await engine.close();
    assert.deepEqual(engine.violations, []);
  });

  it("closes gracefully: running callbacks finish and answer, new runs are not taken", async () => {
    const gate = deferred();
    const started = deferred();
    class Held extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        return step.do("held", async () => {
          started.resolve();
          await gate.promise;
          return "finished";
        });
      }
    }
    const { engine, worker, done } = await setup({ workflows: { held: Held } });
    engine.start("r1", "held");
    await engine.next({ type: "op" });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    await started.promise;
    const closing = worker.close();
    engine.start("r2", "held");
    gate.resolve();
    assert.equal((await engine.next({ type: "attemptResult", task: "t1" })).ok, "finished");
    await closing;
    assert.equal(engine.received.filter((f) => f.run === "r2").length, 0);
    await done();
  });
});
