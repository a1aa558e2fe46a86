// The package as users import it: the names Cloudflare code imports are all there, and
// Cloudflare's examples (cloudflare-examples.ts, type-checked by the build) run.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import * as sdk from "@cairn-engine/workflows";
import type { WorkflowEvent, WorkflowStep, WorkflowStepEvent } from "@cairn-engine/workflows";
import { Conditional, OrderWorkflow } from "./cloudflare-examples.js";
import { setup } from "./helpers.js";

describe("the package", () => {
  it("exports the values Cloudflare code imports, and Cairn's own", () => {
    // `cloudflare:workers`: WorkflowEntrypoint, WorkflowStep (the types WorkflowEvent,
    // WorkflowStepConfig, … are checked by cloudflare-examples.ts); `cloudflare:workflows`:
    // NonRetryableError.
    for (const name of ["WorkflowEntrypoint", "WorkflowStep", "NonRetryableError"]) {
      assert.equal(typeof (sdk as Record<string, unknown>)[name], "function", name);
    }
    assert.deepEqual(Object.keys(sdk).sort(), [
      "CairnApiError",
      "CairnWorker",
      "CairnWorkflow",
      "NonRetryableError",
      "WorkflowEntrypoint",
      "WorkflowInstance",
      "WorkflowStep",
      "serve",
      "workflowBinding",
    ]);
    const error = new sdk.NonRetryableError("no");
    assert.equal(error.name, "NonRetryableError");
    assert.ok(error instanceof Error);
  });

  it("declares ESM with types, for Node 20 and later", () => {
    const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
    assert.equal(manifest.type, "module");
    assert.deepEqual(manifest.exports["."], { types: "./dist/index.d.ts", import: "./dist/index.js" });
    assert.equal(manifest.engines.node, ">=20");
    assert.deepEqual(Object.keys(manifest.dependencies), ["ws"]);
  });

  it("lets a workflow be unit-tested with a hand-made WorkflowStep, as on Cloudflare", async () => {
    // WorkflowStep is abstract with no private state: a plain object that has its methods is one.
    const calls: string[] = [];
    const fake: WorkflowStep = {
      do: async (name: string, ...rest: unknown[]) => {
        calls.push(name);
        const callback = rest.find((r) => typeof r === "function") as (ctx: unknown) => unknown;
        return callback({ attempt: 1, step: { name, count: 1 }, config: {} });
      },
      sleep: async (name: string) => void calls.push(name),
      sleepUntil: async (name: string) => void calls.push(name),
      waitForEvent: async <T>(name: string) => {
        calls.push(name);
        return { payload: { by: "ada" } as T, timestamp: new Date(0), type: "approved" } satisfies WorkflowStepEvent<T>;
      },
      invoke: async <T>(name: string) => (calls.push(name), null as T),
    };
    class Approval extends sdk.WorkflowEntrypoint<unknown, { amount: number }> {
      async run(event: WorkflowEvent<{ amount: number }>, step: WorkflowStep) {
        // The callback's type is the step's: `total` is a number, not a Promise.
        const total: number = await step.do("total", async () => event.payload.amount * 2);
        const approval = await step.waitForEvent<{ by: string }>("approval", { type: "approved" });
        return `${total} by ${approval.payload.by}`;
      }
    }
    const event = { payload: { amount: 21 }, timestamp: new Date(0), instanceId: "i", workflowName: "approval" };
    assert.equal(await new Approval({ waitUntil() {}, passThroughOnException() {} }, {}).run(event, fake), "42 by ada");
    assert.deepEqual(calls, ["total", "approval"]);
  });

  it("runs Cloudflare's rollback example: the handler gets the reservation back", async () => {
    const { engine, done } = await setup({ workflows: { order: OrderWorkflow, conditional: Conditional } });
    engine.start("r1", "order");
    const reserve = await engine.next({ type: "op", seq: 0 });
    assert.equal(reserve.name, "reserve inventory");
    assert.deepEqual(reserve.rollback.config, { retries: { limit: 3, delay: "10 seconds", backoff: "linear" }, timeout: "2 minutes" });
    // Replayed from the journal: the callback (reserveInventory, declared only) never runs.
    engine.send({ type: "opResult", run: "r1", seq: 0, ok: { reservationId: "res-9" } });
    await engine.next({ type: "op", seq: 1 });
    engine.send({ type: "attempt", run: "r1", task: "t1", seq: 1, attempt: 1 });
    const attempt = await engine.next({ type: "attemptResult", task: "t1" });
    assert.deepEqual(attempt.error, { name: "NonRetryableError", message: "payment processor rejected the charge", nonRetryable: true });
    engine.send({ type: "opResult", run: "r1", seq: 1, error: { name: attempt.error.name, message: attempt.error.message } });
    assert.equal((await engine.next({ type: "runResult" })).error.name, "NonRetryableError");
    engine.send({ type: "rollback", run: "r1", task: "t2", seq: 0, attempt: 1, output: { reservationId: "res-9" }, error: { name: "NonRetryableError", message: "payment processor rejected the charge" } });
    // releaseInventory is only declared in the examples: calling it is the handler's failure.
    const rollback = await engine.next({ type: "rollbackResult", task: "t2" });
    assert.match(rollback.error.message, /releaseInventory is not defined/);
    await done();
  });

  it("runs Cloudflare's conditional example from journal answers", async () => {
    // The example's bad branch draws Math.random() outside a step: fixed here (> 0.5, the
    // branch is taken) so that its ops are known. "decide randomly" answers from the journal:
    // its body, the other draw, never runs.
    const random = Math.random;
    Math.random = () => 0.75;
    try {
      const { engine, done } = await setup({ workflows: { conditional: Conditional } });
      engine.start("r1", "conditional", { user: "u", userType: "premium" });
      const answers: [string, unknown][] = [
        ["fetch config", { enableEmailNotifications: false }],
        ["premium processing", null],
        ["maybe do something", null],
        ["decide randomly", true],
        ["conditionally do something", null],
      ];
      for (const [seq, [name, ok]] of answers.entries()) {
        assert.equal((await engine.next({ type: "op", seq })).name, name);
        engine.send({ type: "opResult", run: "r1", seq, ok });
      }
      assert.deepEqual(await engine.next({ type: "runResult" }), { type: "runResult", run: "r1", ok: null });
      await done();
    } finally {
      Math.random = random;
    }
  });
});
