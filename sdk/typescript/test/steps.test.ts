// The step API's bookkeeping, seen on the wire: ops numbered in call order, each settled
// by its opResult, callbacks, delay functions and rollback handlers run when the engine
// asks, and values turned into JSON. Each test plays the engine's side by hand.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  NonRetryableError,
  WorkflowEntrypoint,
  type WorkflowEvent,
  type WorkflowStep,
} from "@cairn-engine/workflows";
import { deferred, setup } from "./helpers.js";

describe("ops", () => {
  it("say idle once the code waits on ops only: after every op made at once, and after each answer", async () => {
    const gate = deferred();
    class Both extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.all([step.sleep("nap", "1 hour"), step.do("meanwhile", async () => 1)]);
        // Code outside steps that finishes soon, then one more op.
        await gate.promise;
        await step.do("after", async () => 2);
        return "done";
      }
    }
    const { engine, done } = await setup({ workflows: { both: Both } });
    engine.start("r1", "both");
    const idle = await engine.next({ type: "idle", run: "r1" });
    assert.equal(idle.ops, 2, "both ops of Promise.all come before the idle");
    assert.equal(idle.answers, 0);
    const sent = engine.received.filter((f) => f.run === "r1").map((f) => f.type);
    assert.deepEqual(sent, ["op", "op", "idle"]);
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: null });
    engine.send({ type: "opResult", run: "r1", seq: 1, ok: 1 });
    // Answered, the code runs on (the gate holds it): no idle while it may still make ops
    // with nothing pending... and once it makes one, idle counts it.
    gate.resolve();
    const next = await engine.next({ type: "idle", run: "r1", ops: 3 });
    assert.equal(next.ops, 3);
    assert.equal(next.answers, 2, "an idle tells the answers it had received");
    engine.send({ type: "stop", run: "r1", reason: "hibernated" });
    await done();
  });

  it("are numbered in call order before any is answered, and settle in any order (Promise.all)", async () => {
    class Parallel extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        const [a, b] = await Promise.all([
          step.do("first", async () => "a"),
          step.do("second", async () => "b"),
          step.sleep("nap", "1 hour"),
        ]);
        const c = await step.do("after", async () => "c");
        return [a, b, c];
      }
    }
    const { engine, done } = await setup({ workflows: { parallel: Parallel } });
    engine.start("r1", "parallel");
    const ops = await Promise.all([0, 1, 2].map((seq) => engine.next({ type: "op", run: "r1", seq })));
    assert.deepEqual(
      ops.map((o) => [o.seq, o.op, o.name]),
      [
        [0, "do", "first"],
        [1, "do", "second"],
        [2, "sleep", "nap"],
      ],
    );
    assert.deepEqual(ops[0], { type: "op", run: "r1", seq: 0, op: "do", name: "first", config: null, delayFunction: false });
    assert.equal(ops[2]!.duration, "1 hour");
    // Answered out of order: the values come from the engine (the journal), not the callbacks.
    engine.send({ type: "opResult", run: "r1", seq: 2, ok: null });
    engine.send({ type: "opResult", run: "r1", seq: 1, ok: "B" });
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: "A" });
    const after = await engine.next({ type: "op", run: "r1", seq: 3 });
    assert.equal(after.name, "after");
    engine.send({ type: "opResult", run: "r1", seq: 3, ok: "C" });
    assert.deepEqual(await engine.next({ type: "runResult", run: "r1" }), { type: "runResult", run: "r1", ok: ["A", "B", "C"] });
    await done();
  });

  it("reject with the engine's error name and message; a NonRetryableError comes back as one", async () => {
    class Catching extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        const caught: unknown[] = [];
        await step.do("charge", async () => 1).catch((e: unknown) => caught.push(e));
        await step.waitForEvent("approval", { type: "approved", timeout: "1 day" }).catch((e: unknown) => caught.push(e));
        return caught.map((e) => {
          const error = e as Error;
          return [error.name, error.message, error instanceof Error, error instanceof NonRetryableError];
        });
      }
    }
    const { engine, done } = await setup({ workflows: { catching: Catching } });
    engine.start("r1", "catching");
    await engine.next({ type: "op", seq: 0 });
    engine.send({ type: "opResult", run: "r1", seq: 0, error: { name: "NonRetryableError", message: "card declined" } });
    const wait = await engine.next({ type: "op", seq: 1 });
    assert.deepEqual(wait, { type: "op", run: "r1", seq: 1, op: "waitForEvent", name: "approval", eventType: "approved", timeout: "1 day" });
    engine.send({ type: "opResult", run: "r1", seq: 1, error: { name: "WorkflowTimeoutError", message: "Execution timed out after 86400000ms" } });
    const result = await engine.next({ type: "runResult" });
    assert.deepEqual(result.ok, [
      ["NonRetryableError", "card declined", true, true],
      ["WorkflowTimeoutError", "Execution timed out after 86400000ms", true, false],
    ]);
    await done();
  });

  it("waitForEvent, sleepUntil and invoke send their fields and return Cloudflare's shapes", async () => {
    class Kinds extends WorkflowEntrypoint<{ SHIPPING: { name: string } }> {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        const event = await step.waitForEvent<{ by: string }>("approval", { type: "approved" });
        await step.sleepUntil("launch", new Date("2027-01-01T00:00:00.000Z"));
        await step.sleepUntil("later", 1767225600000);
        const child = await step.invoke<{ tracking: string }>("ship", this.env.SHIPPING, { order: 17 });
        await step.invoke("audit", "audit", undefined, { detached: true });
        return { by: event.payload.by, type: event.type, at: event.timestamp.toISOString(), date: event.timestamp instanceof Date, child };
      }
    }
    const { engine, done } = await setup({ workflows: { kinds: Kinds }, env: { SHIPPING: { name: "shipping" } } });
    engine.start("r1", "kinds");
    const wait = await engine.next({ type: "op", seq: 0 });
    assert.deepEqual(wait, { type: "op", run: "r1", seq: 0, op: "waitForEvent", name: "approval", eventType: "approved" });
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: { payload: { by: "ada" }, type: "approved", timestamp: "2026-12-01T10:05:00.000Z" } });
    assert.equal((await engine.next({ type: "op", seq: 1 })).until, Date.parse("2027-01-01T00:00:00.000Z"));
    engine.send({ type: "opResult", run: "r1", seq: 1, ok: null });
    assert.equal((await engine.next({ type: "op", seq: 2 })).until, 1767225600000);
    engine.send({ type: "opResult", run: "r1", seq: 2, ok: null });
    const ship = await engine.next({ type: "op", seq: 3 });
    assert.deepEqual(ship, { type: "op", run: "r1", seq: 3, op: "invoke", name: "ship", workflow: "shipping", params: { order: 17 }, detached: false });
    engine.send({ type: "opResult", run: "r1", seq: 3, ok: { tracking: "T-1" } });
    const audit = await engine.next({ type: "op", seq: 4 });
    assert.deepEqual([audit.workflow, audit.params, audit.detached], ["audit", {}, true]);
    engine.send({ type: "opResult", run: "r1", seq: 4, ok: null });
    const result = await engine.next({ type: "runResult" });
    assert.deepEqual(result.ok, { by: "ada", type: "approved", at: "2026-12-01T10:05:00.000Z", date: true, child: { tracking: "T-1" } });
    await done();
  });

  it("started and never awaited, may fail (bad arguments, a wait's timeout) without an unhandled rejection", async () => {
    // Review finding: an unawaited `step.sleep("x", -1)` ended the worker's process, and
    // every worker that took the instance after it: a poison pill.
    class Careless extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        void step.sleep("bad", -1);
        void step.do("", async () => 1);
        void step.waitForEvent("dropped", { type: "t", timeout: "1 second" });
        return step.do("main", async () => "ok");
      }
    }
    const unhandled: unknown[] = [];
    const noted = (reason: unknown) => unhandled.push(reason);
    process.on("unhandledRejection", noted);
    try {
      const { engine, done } = await setup({ workflows: { careless: Careless } });
      engine.start("r1", "careless");
      await engine.next({ type: "op", seq: 1 });
      engine.send({ type: "opResult", run: "r1", seq: 0, error: { name: "WorkflowTimeoutError", message: "timed out" } });
      engine.send({ type: "attempt", run: "r1", task: "t1", seq: 1, attempt: 1 });
      assert.equal((await engine.next({ type: "attemptResult" })).ok, "ok");
      engine.send({ type: "opResult", run: "r1", seq: 1, ok: "ok" });
      assert.deepEqual(await engine.next({ type: "runResult" }), { type: "runResult", run: "r1", ok: "ok" });
      await new Promise((resolve) => setImmediate(resolve));
      assert.deepEqual(unhandled, []);
      await done();
    } finally {
      process.off("unhandledRejection", noted);
    }
  });

  it("read the event's payload as one copy per run: cheap to read in a loop, and replacing it is ignored", async () => {
    // Review finding: each read was a fresh deep copy, so a loop over a 200 KB payload's
    // items took over a minute and the worker lost its connection, again at every replay.
    class Reader extends WorkflowEntrypoint {
      async run(event: WorkflowEvent<{ items: { qty: number }[] }>, step: WorkflowStep) {
        const same = event.payload === event.payload;
        let total = 0;
        for (let k = 0; k < event.payload.items.length; k += 1) total += event.payload.items[k]!.qty;
        (event as { payload: unknown }).payload = { items: [] };
        return step.do("sum", async () => [same, total, event.payload.items.length, event.workflowName]);
      }
    }
    const items = Array.from({ length: 5000 }, (_, k) => ({ qty: k % 3, sku: `sku-${k}`, tags: ["a", "b"] }));
    const { engine, done } = await setup({ workflows: { reader: Reader } });
    const started = Date.now();
    engine.start("r1", "reader", { items });
    await engine.next({ type: "op", seq: 0 });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    const sum = items.reduce((n, item) => n + item.qty, 0);
    assert.deepEqual((await engine.next({ type: "attemptResult" })).ok, [true, sum, 5000, "reader"]);
    const took = Date.now() - started;
    assert.ok(took < 5000, `reading the payload 10,000 times took ${took} ms`);
    await done();
  });

  it("with bad arguments reject at once and consume no seq", async () => {
    class Careless extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        const errors: string[] = [];
        const untyped = step as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
        for (const call of [
          () => step.do("negative", { retries: { limit: -1, delay: 10 } }, async () => 1),
          () => step.do("odd backoff", { retries: { limit: 1, delay: 10, backoff: "sometimes" as "linear" } }, async () => 1),
          () => untyped.do!("no callback", { timeout: "1 minute" }),
          () => step.do("", async () => 1),
          () => step.sleep("forever", -5),
          () => step.sleepUntil("never", new Date("not a date")),
          () => step.waitForEvent("nothing", { type: "" }),
          () => step.invoke("child", "other", { n: 1n }),
          () => step.do("bad rollback", async () => 1, { rollback: "undo" as unknown as () => void }),
        ]) {
          await call().catch((e: Error) => errors.push(`${e.name}: ${e.message}`));
        }
        await step.do("first real op", async () => errors);
      }
    }
    const { engine, done } = await setup({ workflows: { careless: Careless } });
    engine.start("r1", "careless");
    const op = await engine.next({ type: "op" });
    assert.equal(op.seq, 0);
    assert.equal(op.name, "first real op");
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    const errors = (await engine.next({ type: "attemptResult" })).ok as string[];
    assert.equal(errors.length, 9);
    for (const error of errors) assert.match(error, /^TypeError: /);
    assert.match(errors[7]!, /cannot be sent as JSON/);
    await done();
  });
});

describe("configs and names Cloudflare's schema refuses", () => {
  it("a misspelled config key fails the call, and the step's count is not taken", async () => {
    // Review finding: `backof` and `timeOut` were dropped on the way to the engine, so the
    // step ran with the defaults in their place; a name the engine refused had taken a
    // count, so the next step of that name saw count 2 where the engine numbered 1.
    class Typos extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        const errors: string[] = [];
        const loose = step as unknown as { do: (...args: unknown[]) => Promise<unknown> };
        for (const config of [
          { retries: { limit: 1, delay: 10, backof: "linear" } },
          { timeOut: "30 seconds" },
          { retries: { limit: 3 } },
          { retries: "none" },
          { timeout: 0 },
          { timeout: "0" },
          { sensitive: "input" },
          [],
        ]) {
          await loose.do("x", config, async () => 1).catch((e: Error) => errors.push(`${e.name}: ${e.message}`));
        }
        for (const rollbackConfig of [{ retry: { limit: 1, delay: 1 } }, { sensitive: "output" }]) {
          await loose
            .do("x", async () => 1, { rollback: () => {}, rollbackConfig })
            .catch((e: Error) => errors.push(`${e.name}: ${e.message}`));
        }
        await step.do("x\nnewline", async () => 1).catch((e: Error) => errors.push(`${e.name}: ${e.message}`));
        await step.do("y".repeat(257), async () => 1).catch((e: Error) => errors.push(`${e.name}: ${e.message}`));
        const count = await step.do("x", async (ctx) => ctx.step.count);
        return { errors, count };
      }
    }
    const { engine, done } = await setup({ workflows: { typos: Typos } });
    engine.start("r1", "typos");
    const op = await engine.next({ type: "op" });
    assert.equal(op.seq, 0, "no refused call consumed a seq");
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    assert.equal((await engine.next({ type: "attemptResult" })).ok, 1, "ctx.step.count of the first real x");
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: 1 });
    const { errors } = (await engine.next({ type: "runResult" })).ok as { errors: string[] };
    assert.deepEqual(errors, [
      'TypeError: Step config for "x" is in a invalid format: retries.backof is not a key of it (retries.limit, retries.delay, retries.backoff)',
      'TypeError: Step config for "x" is in a invalid format: timeOut is not a key of it (retries, timeout, sensitive)',
      'TypeError: Step config for "x" is in a invalid format: retries needs both limit and delay',
      'TypeError: Step config for "x" is in a invalid format: retries must be an object, not "none"',
      'TypeError: Step config for "x" is in a invalid format: timeout must be more than 0',
      'TypeError: Step config for "x" is in a invalid format: timeout must be more than 0',
      'TypeError: Step config for "x" is in a invalid format: sensitive must be "output", not "input"',
      'TypeError: Step config for "x" is in a invalid format: it must be an object, not an array',
      'TypeError: Rollback config for "x" is in a invalid format: retry is not a key of it (retries, timeout)',
      'TypeError: Rollback config for "x" is in a invalid format: sensitive is not a key of it (retries, timeout)',
      'TypeError: Step name "x\\nnewline" exceeds max length (256 chars) or invalid characters found',
      `TypeError: Step name "${"y".repeat(257)}" exceeds max length (256 chars) or invalid characters found`,
    ]);
    await done();
  });

  it("the step context and a rollback's stepName take the count the engine numbered", async () => {
    const seen: unknown[] = [];
    class Numbered extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await step.do("pay", async (ctx) => ctx.step.count, {
          rollback: ({ ctx, stepName }) => {
            seen.push([ctx.step.count, stepName]);
          },
        });
      }
    }
    const { engine, done } = await setup({ workflows: { numbered: Numbered } });
    engine.start("r1", "numbered");
    await engine.next({ type: "op", seq: 0 });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1, step: { name: "pay", count: 3 } });
    assert.equal((await engine.next({ type: "attemptResult" })).ok, 3);
    const failure = { name: "Error", message: "later" };
    engine.send({ type: "opResult", run: "r1", seq: 0, error: failure });
    await engine.next({ type: "runResult" });
    engine.send({ type: "rollback", run: "r1", task: "t2", seq: 0, attempt: 1, step: { name: "pay", count: 3 }, error: failure });
    await engine.next({ type: "rollbackResult", task: "t2" });
    assert.deepEqual(seen, [[3, "pay-3"]]);
    await done();
  });
});

describe("attempts", () => {
  it("call the callback with the step context and answer its value", async () => {
    class Counting extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        const config = { retries: { limit: 2, delay: "1 second", backoff: "constant" as const } };
        const first = await step.do("charge", config, async (ctx) => ctx);
        const second = await step.do("charge", async (ctx) => ctx);
        return [first, second];
      }
    }
    const { engine, done } = await setup({ workflows: { counting: Counting } });
    engine.start("r1", "counting");
    const op = await engine.next({ type: "op", seq: 0 });
    assert.deepEqual(op.config, { retries: { limit: 2, delay: "1 second", backoff: "constant" } });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    const first = await engine.next({ type: "attemptResult", task: "t1" });
    assert.deepEqual(first, {
      type: "attemptResult",
      run: "r1",
      task: "t1",
      ok: {
        attempt: 1,
        step: { name: "charge", count: 1 },
        config: { retries: { limit: 2, delay: "1 second", backoff: "constant" }, timeout: "10 minutes" },
      },
    });
    // The engine's resolved config (as it sends it, delay in ms) shows the code's own
    // values as given: Cloudflare's ctx.config.retries.delay is "1 second" (SPEC E6).
    engine.send({
      type: "attempt",
      run: "r1",
      task: "t1b",
      seq: 0,
      attempt: 2,
      config: { retries: { limit: 2, delay: 1000, backoff: "constant" }, timeout: "10 minutes" },
    });
    assert.deepEqual((await engine.next({ type: "attemptResult", task: "t1b" })).ok.config, {
      retries: { limit: 2, delay: "1 second", backoff: "constant" },
      timeout: "10 minutes",
    });
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: first.ok });
    await engine.next({ type: "op", seq: 1 });
    engine.send({ type: "attempt", run: "r1", task: "t2", seq: 1, attempt: 3 });
    const second = await engine.next({ type: "attemptResult", task: "t2" });
    assert.deepEqual(second.ok, {
      attempt: 3,
      step: { name: "charge", count: 2 },
      config: { retries: { limit: 5, delay: 10000, backoff: "exponential" }, timeout: "10 minutes" },
    });
    await done();
  });

  it("answer what the callback threw, NonRetryableError with nonRetryable", async () => {
    class RateLimited extends Error {
      override name = "RateLimited";
    }
    class Throwing extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.allSettled([
          step.do("timeout", async () => {
            throw new Error("timeout talking to bank");
          }),
          step.do("declined", async () => {
            throw new NonRetryableError("card declined");
          }),
          step.do("custom", async () => {
            throw new RateLimited("slow down");
          }),
          step.do("string", async () => {
            throw "not an error";
          }),
          step.do("sync throw", () => {
            throw new TypeError("no");
          }),
        ]);
      }
    }
    const { engine, done } = await setup({ workflows: { throwing: Throwing } });
    engine.start("r1", "throwing");
    await engine.next({ type: "op", seq: 4 });
    for (const seq of [0, 1, 2, 3, 4]) engine.send({ type: "attempt", run: "r1", task: `t${seq}`, seq, attempt: 1 });
    const errors = await Promise.all([0, 1, 2, 3, 4].map((seq) => engine.next({ type: "attemptResult", task: `t${seq}` })));
    assert.deepEqual(
      errors.map((e) => e.error),
      [
        { name: "Error", message: "timeout talking to bank", nonRetryable: false },
        { name: "NonRetryableError", message: "card declined", nonRetryable: true },
        { name: "RateLimited", message: "slow down", nonRetryable: false },
        { name: "Error", message: "not an error", nonRetryable: false },
        { name: "TypeError", message: "no", nonRetryable: false },
      ],
    );
    await done();
  });

  it("record a NonRetryableError known by its message's prefix as Cloudflare does: named so, prefix stripped", async () => {
    // Review finding: `new Error("NonRetryableError: card declined")` stopped the retries
    // but was recorded as {name: "Error", message: "NonRetryableError: card declined"}.
    class Prefixed extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.allSettled([
          step.do("plain", async () => {
            throw new Error("NonRetryableError: card declined");
          }),
          step.do("typed", async () => {
            throw new NonRetryableError("NonRetryableError:  card declined");
          }),
          step.do("renamed", async () => {
            throw new NonRetryableError("NonRetryableError: no stock", "OutOfStock");
          }),
          step.do("bare", async () => {
            throw new Error("NonRetryableError");
          }),
        ]);
      }
    }
    const { engine, done } = await setup({ workflows: { prefixed: Prefixed } });
    engine.start("r1", "prefixed");
    await engine.next({ type: "op", seq: 3 });
    for (const seq of [0, 1, 2, 3]) engine.send({ type: "attempt", run: "r1", task: `t${seq}`, seq, attempt: 1 });
    const errors = await Promise.all([0, 1, 2, 3].map((seq) => engine.next({ type: "attemptResult", task: `t${seq}` })));
    assert.deepEqual(
      errors.map((e) => e.error),
      [
        { name: "NonRetryableError", message: "card declined", nonRetryable: true },
        { name: "NonRetryableError", message: "card declined", nonRetryable: true },
        { name: "OutOfStock", message: "no stock", nonRetryable: true },
        // No colon: nothing to strip, but known by its message all the same.
        { name: "NonRetryableError", message: "NonRetryableError", nonRetryable: true },
      ],
    );
    await done();
  });

  it("send undefined as null, Dates as ISO strings, and fail on what JSON cannot hold", async () => {
    // Arrays `depth` deep around a string of brackets, which count for nothing.
    const nested = (depth: number): unknown => {
      let value: unknown = "[[{{\\\"";
      for (let level = 0; level < depth; level += 1) value = level % 2 === 0 ? [value] : { k: value };
      return value;
    };
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    class Values extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.allSettled([
          step.do("nothing", async () => undefined),
          step.do("when", async () => new Date("2026-01-02T03:04:05.000Z")),
          step.do("holes", async () => ({ a: undefined, b: [undefined, 1] })),
          step.do("bigint", async () => 10n),
          step.do("cycle", async () => cycle),
          step.do("huge", async () => "x".repeat(3 * 1024 * 1024)),
          step.do("deep", async () => nested(100)),
          step.do("too deep", async () => nested(101)),
        ]);
        return undefined;
      }
    }
    const { engine, done } = await setup({ workflows: { values: Values } });
    engine.start("r1", "values");
    await engine.next({ type: "op", seq: 7 });
    const seqs = [0, 1, 2, 3, 4, 5, 6, 7];
    for (const seq of seqs) engine.send({ type: "attempt", run: "r1", task: `t${seq}`, seq, attempt: 1 });
    const results = await Promise.all(seqs.map((seq) => engine.next({ type: "attemptResult", task: `t${seq}` })));
    assert.equal(results[0]!.ok, null);
    assert.ok("ok" in results[0]!, "ok is present, as null");
    assert.equal(results[1]!.ok, "2026-01-02T03:04:05.000Z");
    assert.deepEqual(results[2]!.ok, { b: [null, 1] });
    assert.equal(results[3]!.error.name, "TypeError");
    assert.match(results[3]!.error.message, /the output of step "bigint" cannot be sent as JSON: .*BigInt/);
    assert.match(results[4]!.error.message, /the output of step "cycle" cannot be sent as JSON: .*circular/i);
    assert.equal(results[5]!.error.name, "RangeError");
    assert.match(results[5]!.error.message, /2 MiB/);
    // As deep as the engine reads back, and one level deeper (JSON nested 128 deep does
    // not parse there, and a frame wraps the value in a few levels more).
    assert.deepEqual(results[6]!.ok, nested(100));
    assert.equal(results[7]!.error.name, "TypeError");
    assert.match(results[7]!.error.message, /the output of step "too deep" cannot be sent as JSON: it nests deeper than 100 levels/);
    for (const seq of seqs) engine.send({ type: "opResult", run: "r1", seq, ok: null });
    assert.deepEqual(await engine.next({ type: "runResult" }), { type: "runResult", run: "r1", ok: null });
    await done();
  });

  it("fail on binary data, which JSON would store as something else", async () => {
    // Review finding: a Uint8Array came back as {"0":1,…} and an ArrayBuffer as {}.
    class Binary extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.allSettled([
          step.do("bytes", async () => new Uint8Array([1, 2, 3])),
          step.do("buffer", async () => new ArrayBuffer(8)),
          step.do("nested", async () => ({ digest: new Int16Array(2) })),
        ]);
        return undefined;
      }
    }
    const { engine, done } = await setup({ workflows: { binary: Binary } });
    engine.start("r1", "binary");
    await engine.next({ type: "op", seq: 2 });
    for (const seq of [0, 1, 2]) engine.send({ type: "attempt", run: "r1", task: `t${seq}`, seq, attempt: 1 });
    const results = await Promise.all([0, 1, 2].map((seq) => engine.next({ type: "attemptResult", task: `t${seq}` })));
    for (const [result, type] of [[results[0]!, "Uint8Array"], [results[1]!, "ArrayBuffer"], [results[2]!, "Int16Array"]] as const) {
      assert.equal(result.error.name, "TypeError");
      assert.match(result.error.message, new RegExp(`cannot be sent as JSON: a ${type} is binary data`));
    }
    for (const seq of [0, 1, 2]) engine.send({ type: "opResult", run: "r1", seq, ok: null });
    await engine.next({ type: "runResult" });
    await done();
  });

  it("fail on a stream, a Blob, a Map or a Set, which JSON would store as {}", async () => {
    // Review finding: a step returning a ReadableStream (a stream step on Cloudflare)
    // "succeeded" with {} stored, and the code after it got {}.
    const values: [string, () => unknown, RegExp][] = [
      ["stream", () => new ReadableStream({ start: (c) => (c.enqueue(new Uint8Array([1])), c.close()) }), /a ReadableStream is not stored/],
      ["blob", () => new Blob(["x"]), /a Blob is binary data/],
      ["map", () => ({ byId: new Map([["a", 1]]) }), /a Map is not stored as JSON/],
      ["set", () => new Set([1]), /a Set is not stored as JSON/],
    ];
    class Unstorable extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.allSettled(values.map(([name, make]) => step.do(name, async () => make())));
        return undefined;
      }
    }
    const { engine, done } = await setup({ workflows: { unstorable: Unstorable } });
    engine.start("r1", "unstorable");
    await engine.next({ type: "op", seq: values.length - 1 });
    values.forEach((_, seq) => engine.send({ type: "attempt", run: "r1", task: `t${seq}`, seq, attempt: 1 }));
    for (const [seq, [name, , says]] of values.entries()) {
      const result = await engine.next({ type: "attemptResult", task: `t${seq}` });
      assert.equal(result.error?.name, "TypeError", name);
      assert.match(result.error.message, says, name);
      // Every attempt would return its like: no retries (Cloudflare's is fatal too).
      assert.equal(result.error.nonRetryable, true, name);
    }
    values.forEach((_, seq) => engine.send({ type: "opResult", run: "r1", seq, ok: null }));
    await engine.next({ type: "runResult" });
    await done();
  });

  it("a run whose output JSON cannot hold ends in an error, and the worker goes on", async () => {
    class BigOutput extends WorkflowEntrypoint {
      async run() {
        return { total: 5n };
      }
    }
    const { engine, done } = await setup({ workflows: { big: BigOutput } });
    engine.start("r1", "big");
    const result = await engine.next({ type: "runResult", run: "r1" });
    assert.equal(result.error.name, "TypeError");
    assert.match(result.error.message, /the output of workflow "big" cannot be sent as JSON/);
    engine.start("r2", "big");
    await engine.next({ type: "runResult", run: "r2" });
    await done();
  });

  it("a cancelled attempt's late result is not sent", async () => {
    const gate = deferred();
    const started = deferred();
    class Slow extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.all([
          step.do("slow", async () => {
            started.resolve();
            await gate.promise;
            return "late";
          }),
          step.do("fast", async () => "quick"),
        ]);
      }
    }
    const { engine, done } = await setup({ workflows: { slow: Slow } });
    engine.start("r1", "slow");
    await engine.next({ type: "op", seq: 1 });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    await started.promise;
    engine.send({ type: "cancel", run: "r1", task: "t1" });
    // The cancel is read before the next frame; then the slow callback ends.
    engine.send({ type: "attempt", run: "r1", task: "t2", seq: 1, attempt: 1 });
    await engine.next({ type: "attemptResult", task: "t2" });
    gate.resolve();
    engine.send({ type: "attempt", run: "r1", task: "t3", seq: 1, attempt: 2 });
    await engine.next({ type: "attemptResult", task: "t3" });
    assert.equal(engine.received.filter((f) => f.task === "t1").length, 0);
    await done();
  });
});

describe("delay functions", () => {
  it("are flagged in the op and answer the engine's delay requests", async () => {
    class Sync extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await Promise.allSettled([
          step.do(
            "sync customer",
            {
              retries: {
                limit: 5,
                delay: ({ ctx, error }) => (error.message.includes("rate limit") ? `${ctx.attempt * 30} seconds` : "10 seconds"),
              },
            },
            async () => "synced",
          ),
          step.do("bad delay", { retries: { limit: 1, delay: () => -5 } }, async () => 1),
          step.do("throwing delay", { retries: { limit: 1, delay: async () => Promise.reject(new Error("no")) } }, async () => 1),
        ]);
      }
    }
    const { engine, done } = await setup({ workflows: { sync: Sync } });
    engine.start("r1", "sync");
    const op = await engine.next({ type: "op", seq: 0 });
    assert.deepEqual([op.delayFunction, op.config], [true, { retries: { limit: 5 } }]);
    await engine.next({ type: "op", seq: 2 });
    engine.send({ type: "delay", run: "r1", task: "t1", seq: 0, attempt: 2, error: { name: "Error", message: "rate limit" } });
    engine.send({ type: "delay", run: "r1", task: "t2", seq: 0, attempt: 1, error: { name: "Error", message: "down" } });
    engine.send({ type: "delay", run: "r1", task: "t3", seq: 1, attempt: 1, error: { name: "Error", message: "x" } });
    engine.send({ type: "delay", run: "r1", task: "t4", seq: 2, attempt: 1, error: { name: "Error", message: "x" } });
    assert.equal((await engine.next({ type: "delayResult", task: "t1" })).ok, "60 seconds");
    assert.equal((await engine.next({ type: "delayResult", task: "t2" })).ok, "10 seconds");
    // A value that is no delay is the engine's to refuse, with Cloudflare's message.
    assert.equal((await engine.next({ type: "delayResult", task: "t3" })).ok, -5);
    assert.deepEqual((await engine.next({ type: "delayResult", task: "t4" })).error, { name: "Error", message: "no", nonRetryable: false });
    await done();
  });
});

describe("rollback handlers", () => {
  it("are announced with their config and called with the output, the error and the step context", async () => {
    const seen: unknown[] = [];
    class Order extends WorkflowEntrypoint {
      async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
        await step.do(
          "reserve inventory",
          async () => ({ reservationId: "res-1" }),
          {
            rollback: async ({ output, error, ctx, stepName }) => {
              seen.push({ output, error: [error.name, error.message, error instanceof NonRetryableError], ctx, stepName });
            },
            rollbackConfig: { retries: { limit: 3, delay: "10 seconds", backoff: "linear" }, timeout: "2 minutes" },
          },
        );
        await step.do("charge card", { timeout: "1 minute" }, async () => 1, {
          rollback: () => {
            throw new NonRetryableError("cannot undo");
          },
        });
        await step.do("charge card", async () => {
          throw new NonRetryableError("payment processor rejected the charge");
        });
      }
    }
    const { engine, done } = await setup({ workflows: { order: Order } });
    engine.start("r1", "order");
    const reserve = await engine.next({ type: "op", seq: 0 });
    assert.deepEqual(reserve.rollback, { config: { retries: { limit: 3, delay: "10 seconds", backoff: "linear" }, timeout: "2 minutes" } });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 0, attempt: 1 });
    const output = (await engine.next({ type: "attemptResult", task: "t1" })).ok;
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: output });
    const charge = await engine.next({ type: "op", seq: 1 });
    assert.deepEqual(charge.rollback, { config: null });
    engine.send({ type: "opResult", run: "r1", seq: 1, ok: 1 });
    await engine.next({ type: "op", seq: 2 });
    engine.send({ type: "attempt", run: "r1", task: "t2", seq: 2, attempt: 1 });
    assert.equal((await engine.next({ type: "attemptResult", task: "t2" })).error.nonRetryable, true);
    const failure = { name: "NonRetryableError", message: "payment processor rejected the charge" };
    engine.send({ type: "opResult", run: "r1", seq: 2, error: failure });
    assert.deepEqual((await engine.next({ type: "runResult" })).error, failure);
    // Reverse start order, each a task of its own; the second step's handler throws.
    engine.send({ type: "rollback", run: "r1", task: "t3", seq: 1, attempt: 1, output: 1, error: failure });
    assert.deepEqual((await engine.next({ type: "rollbackResult", task: "t3" })).error, { name: "NonRetryableError", message: "cannot undo", nonRetryable: true });
    engine.send({ type: "rollback", run: "r1", task: "t4", seq: 0, attempt: 2, output, error: failure });
    assert.deepEqual(await engine.next({ type: "rollbackResult", task: "t4" }), { type: "rollbackResult", run: "r1", task: "t4", ok: null });
    engine.send({ type: "rollback", run: "r1", task: "t5", seq: 0, attempt: 1, error: { name: "Terminated", message: "terminated" } });
    await engine.next({ type: "rollbackResult", task: "t5" });
    assert.deepEqual(seen, [
      {
        output: { reservationId: "res-1" },
        error: ["NonRetryableError", "payment processor rejected the charge", true],
        ctx: {
          step: { name: "reserve inventory", count: 1 },
          attempt: 2,
          config: { retries: { limit: 5, delay: 10000, backoff: "exponential" }, timeout: "10 minutes" },
        },
        stepName: "reserve inventory-1",
      },
      {
        output: undefined,
        error: ["Terminated", "terminated", false],
        ctx: {
          step: { name: "reserve inventory", count: 1 },
          attempt: 1,
          config: { retries: { limit: 5, delay: 10000, backoff: "exponential" }, timeout: "10 minutes" },
        },
        stepName: "reserve inventory-1",
      },
    ]);
    engine.send({ type: "stop", run: "r1", reason: "done" });
    await done();
  });
});
