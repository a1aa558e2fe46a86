// TypeScript and Rust workflows as each other's children, on a real `cairn serve` (CAIRN_BIN):
// a TypeScript workflow invokes the server's demo Rust workflows (`greet`, and `checkout`
// declined, whose error it catches) and a TypeScript one with `step.invoke`; the Rust demo
// workflow `relay` invokes a TypeScript one. Outputs, errors and the parent/child links are
// checked through the API.

import assert from "node:assert/strict";
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
import { type Details, Server, skipWithoutBin, token } from "./real-engine.js";

/** How many times each TypeScript child's step body ran, by instance id. */
const bodies = new Map<string, number>();

class Doubler extends WorkflowEntrypoint<unknown, { x: number; fail?: boolean }> {
  async run(event: WorkflowEvent<{ x: number; fail?: boolean }>, step: WorkflowStep) {
    const doubled = await step.do("double", async () => {
      bodies.set(event.instanceId, (bodies.get(event.instanceId) ?? 0) + 1);
      if (event.payload.fail) throw new NonRetryableError(`cannot double ${event.payload.x}`);
      return event.payload.x * 2;
    });
    return { doubled, by: "typescript" };
  }
}

class Parent extends WorkflowEntrypoint<unknown, { name: string }> {
  async run(event: WorkflowEvent<{ name: string }>, step: WorkflowStep) {
    // A Rust child: the demo's greet.
    const greeting = await step.invoke<string>("greet them", "greet", { name: event.payload.name });
    // A Rust child that fails for good: its error is this step's, and can be caught.
    let declined: string | undefined;
    try {
      await step.invoke("pay", "checkout", { decline: true });
    } catch (error) {
      declined = `${(error as Error).name}: ${(error as Error).message}`;
    }
    // A TypeScript child, named by its binding.
    const child = await step.invoke<{ doubled: number }>("double it", workflowBinding("ts-doubler"), { x: 21 });
    return { greeting, declined, child };
  }
}

describe("TypeScript and Rust workflows as each other's children", { skip: skipWithoutBin("children.test.ts") }, () => {
  let server: Server;
  let worker: CairnWorker;

  before(async () => {
    server = await Server.start();
    worker = serve({
      url: server.url,
      token,
      workflows: { "ts-parent": Parent, "ts-doubler": Doubler },
      version: "children-1",
      heartbeatMs: 0,
      logger: new Lines(),
    });
    await worker.ready;
  });

  after(async () => {
    await worker?.close({ timeoutMs: 1_000 });
    await server?.close();
  });

  it("a TypeScript workflow invokes Rust workflows (greet; checkout, declined) and a TypeScript one", async () => {
    const parent = workflowBinding<{ name: string }>("ts-parent", { url: server.url, token });
    await parent.create({ id: "p1", params: { name: "Ada" } });
    const done = await server.settled("ts-parent", "p1");
    assert.equal(done.status, "complete", JSON.stringify(done.error));
    // A child's error keeps its name, its message saying which child it was.
    const checkout = (done.children as Details[]).find((c) => c.workflow === "checkout")!;
    assert.deepEqual(done.output, {
      greeting: "Hello, Ada!",
      declined: `NonRetryableError: child checkout/${checkout.id} errored: card declined`,
      child: { doubled: 42, by: "typescript" },
    });

    // The links, both ways: each child was started by its step of p1.
    const children = (done.children as Details[]).map((c) => [c.workflow, c.step, c.status]);
    assert.deepEqual(children.sort(), [
      ["checkout", "pay", "errored"],
      ["greet", "greet them", "complete"],
      ["ts-doubler", "double it", "complete"],
    ]);
    for (const child of done.children as Details[]) {
      const details = await server.details(child.workflow, child.id);
      assert.equal(details.parent.workflow, "ts-parent");
      assert.equal(details.parent.id, "p1");
      assert.equal(details.parent.step, child.step);
    }
    const greet = await server.details("greet", (done.children as Details[]).find((c) => c.workflow === "greet")!.id);
    assert.equal(greet.output, "Hello, Ada!");
    assert.deepEqual(greet.params, { name: "Ada" });
    const invokes = (done.steps as Details[]).filter((s) => s.type === "invoke").map((s) => [s.name, s.success]);
    assert.deepEqual(invokes, [
      ["greet them", true],
      ["pay", false],
      ["double it", true],
    ]);
    const tsChild = (done.children as Details[]).find((c) => c.workflow === "ts-doubler")!;
    assert.equal(bodies.get(tsChild.id), 1);
  });

  it("the Rust workflow relay invokes a TypeScript workflow, and gets its output or its error", async (t) => {
    const names = (await server.api("GET", "/api/workflows")).body.workflows.map((w: { name: string }) => w.name);
    if (!names.includes("relay")) {
      t.skip(`${process.env.CAIRN_BIN} has no demo workflow relay (a Rust parent of any workflow by name)`);
      return;
    }
    let answer = await server.api("POST", "/api/workflows/relay/instances", { instance_id: "r1", params: { workflow: "ts-doubler", params: { x: 5 } } });
    assert.equal(answer.status, 201, JSON.stringify(answer.body));
    const done = await server.settled("relay", "r1");
    assert.equal(done.status, "complete", JSON.stringify(done.error));
    assert.deepEqual(done.output, { workflow: "ts-doubler", output: { doubled: 10, by: "typescript" } });
    const [child] = done.children as Details[];
    assert.equal(child.workflow, "ts-doubler");
    const childDetails = await server.details("ts-doubler", child.id);
    assert.deepEqual(childDetails.params, { x: 5 });
    assert.equal(childDetails.parent.workflow, "relay");
    assert.equal(childDetails.version, "children-1");

    // The TypeScript child fails for good: the Rust parent fails with its error.
    answer = await server.api("POST", "/api/workflows/relay/instances", { instance_id: "r2", params: { workflow: "ts-doubler", params: { x: 7, fail: true } } });
    assert.equal(answer.status, 201);
    const failed = await server.settled("relay", "r2");
    assert.equal(failed.status, "errored");
    const failedId = (failed.children as Details[])[0]!.id;
    assert.deepEqual(failed.error, { name: "NonRetryableError", message: `child ts-doubler/${failedId} errored: cannot double 7` });
    const failedChild = await server.details("ts-doubler", failedId);
    assert.equal(failedChild.status, "errored");
    assert.equal(bodies.get(failedChild.id), 1, "a NonRetryableError is not retried");
  });
});
