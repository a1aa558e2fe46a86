// Against a real `cairn serve`: set CAIRN_BIN to a cairn binary that serves /api/workers
// (`CAIRN_BIN=../../target/debug/cairn npm test`). Without it these tests are skipped, and
// the mock engine's tests (framing only) are all that runs.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  type CairnWorker,
  NonRetryableError,
  WorkflowEntrypoint,
  type WorkflowEvent,
  type WorkflowStep,
  serve,
  workflowBinding,
} from "@cairn-engine/workflows";
import { Lines } from "./helpers.js";

const bin = process.env.CAIRN_BIN;
const token = "sdk-test-token";

/** Compensations that ran, by instance id. */
const compensated: string[] = [];

class Checkout extends WorkflowEntrypoint<unknown, { amount: number }> {
  async run(event: WorkflowEvent<{ amount: number }>, step: WorkflowStep) {
    const [hold, price] = await Promise.all([
      step.do("reserve", async () => ({ hold: 5 }), {
        rollback: async () => {
          compensated.push(event.instanceId);
        },
      }),
      step.do("price", async (ctx) => event.payload.amount * ctx.step.count),
    ]);
    await step.sleep("cool off", "1 second");
    const approval = await step.waitForEvent<{ by: string }>("approval", { type: "approved", timeout: "1 minute" });
    if (approval.payload.by === "nobody") {
      await step.do("charge", async () => {
        throw new NonRetryableError("card declined");
      });
    }
    return { hold: hold.hold, price, by: approval.payload.by };
  }
}

/** A step whose delay function returns a value that is no delay. */
class BadDelay extends WorkflowEntrypoint<unknown, unknown> {
  async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
    await step.do("flaky", { retries: { limit: 1, delay: () => -5 } }, async () => {
      throw new Error("down");
    });
  }
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** The instance's status once it is one of `statuses` (polls the API; at most 30 s). */
async function settled(url: string, workflow: string, id: string, statuses: string[]): Promise<Record<string, unknown>> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const response = await fetch(`${url}/api/workflows/${workflow}/instances/${id}`, { headers: { authorization: `Bearer ${token}` } });
    const details = (await response.json()) as Record<string, unknown>;
    if (statuses.includes(details.status as string)) return details;
    if (Date.now() > deadline) throw new Error(`${id} is still ${details.status}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("against cairn serve", { skip: bin === undefined ? "set CAIRN_BIN to a cairn binary to run these" : false }, () => {
  let server: ChildProcess;
  let url = "";
  let dir = "";
  let worker: CairnWorker;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "cairn-sdk-"));
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    server = spawn(bin!, ["serve", "--db", join(dir, "cairn.db"), "--addr", `127.0.0.1:${port}`, "--no-schedules", "--token", token], {
      stdio: ["ignore", "ignore", "inherit"],
    });
    for (let tries = 0; ; tries += 1) {
      const up = await fetch(`${url}/healthz`).then((r) => r.ok, () => false);  // open without the token
      if (up) break;
      if (tries > 300) throw new Error("cairn serve did not start");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    worker = serve({ url, workflows: { "ts-checkout": Checkout, "ts-bad-delay": BadDelay }, version: "test-1", token, heartbeatMs: 0, logger: new Lines() });
    const timeout = setTimeout(() => void worker.close(), 10_000);
    await worker.ready.catch((error: Error) => {
      throw new Error(`${bin} did not welcome the worker within 10 s (does it serve /api/workers?): ${error.message}`);
    });
    clearTimeout(timeout);
  });

  after(async () => {
    await worker?.close();
    server?.kill();
    rmSync(dir, { recursive: true, force: true });
  });

  it("runs a workflow to the end: parallel steps, a sleep, an event", async () => {
    const binding = workflowBinding<{ amount: number }>("ts-checkout", { url, token });
    const instance = await binding.create({ id: "order-1", params: { amount: 21 } });
    await settled(url, "ts-checkout", "order-1", ["waiting", "running"]);
    await instance.sendEvent({ type: "approved", payload: { by: "ada" } });
    await settled(url, "ts-checkout", "order-1", ["complete", "errored"]);
    assert.deepEqual(await instance.status(), { status: "complete", output: { hold: 5, price: 21, by: "ada" } });
  });

  it("fails on a NonRetryableError and runs the rollback handler", async () => {
    const binding = workflowBinding<{ amount: number }>("ts-checkout", { url, token });
    const instance = await binding.create({ id: "order-2", params: { amount: 1 } });
    await instance.sendEvent({ type: "approved", payload: { by: "nobody" } });
    await settled(url, "ts-checkout", "order-2", ["errored", "complete"]);
    const status = await instance.status();
    assert.equal(status.status, "errored");
    assert.deepEqual(status.error, { name: "NonRetryableError", message: "card declined" });
    assert.deepEqual(compensated, ["order-2"]);
  });

  it("fails a step whose delay function returns a negative number with Cloudflare's message", async () => {
    const instance = await workflowBinding("ts-bad-delay", { url, token }).create({ id: "bad-delay" });
    await settled(url, "ts-bad-delay", "bad-delay", ["errored", "complete"]);
    assert.deepEqual((await instance.status()).error, {
      name: "NonRetryableDelayError",
      message:
        'The delay function for step "flaky-1" returned an invalid delay value (expected a number of ms or a duration string like "30 seconds")',
    });
  });

  it("finishes an instance on a new worker after the first one closed", async () => {
    const binding = workflowBinding<{ amount: number }>("ts-checkout", { url, token });
    const instance = await binding.create({ id: "order-3", params: { amount: 2 } });
    await settled(url, "ts-checkout", "order-3", ["waiting"]);
    await worker.close();
    worker = serve({ url, workflows: { "ts-checkout": Checkout }, version: "test-1", token, heartbeatMs: 0, logger: new Lines() });
    await worker.ready;
    await instance.sendEvent({ type: "approved", payload: { by: "grace" } });
    await settled(url, "ts-checkout", "order-3", ["complete", "errored"]);
    assert.deepEqual((await instance.status()).output, { hold: 5, price: 2, by: "grace" });
  });
});
