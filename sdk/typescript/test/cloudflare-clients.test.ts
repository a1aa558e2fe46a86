// Cloudflare's own clients against a real `cairn serve` (CAIRN_BIN), through Cloudflare's
// routes (`/client/v4`): wrangler (CAIRN_TEST_WRANGLER, a launcher that .ci/cloudflare-tools.sh
// installs) and Cloudflare's TypeScript SDK (the npm package `cloudflare`, a devDependency)
// manage the instances of a TypeScript workflow exactly as those of a Rust one. Both
// workflows do the same thing (the demo's Rust `approval`, and `ts-approval` here, written on
// the SDK): each client runs the same sequence on both, checks what it prints or returns, and
// checks the outcome through Cairn's own API; wrangler's descriptions of the two are the same
// once names, ids and times are set aside.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import Cloudflare from "cloudflare";
import { type CairnWorker, WorkflowEntrypoint, type WorkflowEvent, type WorkflowStep, serve } from "@cairn-engine/workflows";
import { Lines } from "./helpers.js";
import { Server, skipWithoutBin, token } from "./real-engine.js";

const ACCOUNT = "acc-ts-123";
const wranglerBin = process.env.CAIRN_TEST_WRANGLER;

/** The demo's Rust `approval`, in TypeScript: a step, then an `approved` event for up to a day. */
class TsApproval extends WorkflowEntrypoint<unknown, Record<string, unknown>> {
  async run(event: WorkflowEvent<Record<string, unknown>>, step: WorkflowStep) {
    await step.do("notify approver", async () => {});
    const answer = await step.waitForEvent("wait for approval", { type: "approved", timeout: "1 day" });
    return { request: event.payload, approval: answer.payload };
  }
}

/** The two workflows the SDK's sequence runs on: Rust's first. */
const WORKFLOWS = ["approval", "ts-approval"] as const;

describe("Cloudflare's clients manage TypeScript instances as Rust ones", { skip: skipWithoutBin("cloudflare-clients.test.ts") }, () => {
  let server: Server;
  let worker: CairnWorker;

  before(async () => {
    server = await Server.start({ accountId: ACCOUNT });
    worker = serve({ url: server.url, token, workflows: { "ts-approval": TsApproval }, version: "cf-1", heartbeatMs: 0, logger: new Lines() });
    await worker.ready;
  });

  after(async () => {
    await worker?.close({ timeoutMs: 1_000 });
    await server?.close();
  });

  const status = async (workflow: string, id: string) => (await server.details(workflow, id)).status as string;

  describe("wrangler", { skip: wranglerBin === undefined ? loud("CAIRN_TEST_WRANGLER is not set; it names a wrangler launcher (.ci/cloudflare-tools.sh installs one)") : false }, () => {
    /** Runs wrangler against the server: whether it succeeded, and what it printed (both streams). */
    function wrangler(...args: string[]): Promise<{ ok: boolean; out: string }> {
      const home = join(server.dir, "home");
      mkdirSync(home, { recursive: true });
      const env: Record<string, string | undefined> = {
        ...process.env,
        CLOUDFLARE_API_BASE_URL: `${server.url}/client/v4`,
        CLOUDFLARE_ACCOUNT_ID: ACCOUNT,
        CLOUDFLARE_API_TOKEN: token,
        WRANGLER_SEND_METRICS: "false",
        WRANGLER_HIDE_BANNER: "true",
        HOME: home,
        XDG_CONFIG_HOME: join(home, ".config"),
        NO_COLOR: "1",
        FORCE_COLOR: "0",
      };
      for (const proxy of ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]) delete env[proxy];
      return new Promise((resolve, reject) => {
        const child = spawn(wranglerBin!, args, { cwd: home, env, stdio: ["ignore", "pipe", "pipe"] });
        let out = "";
        child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
        child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString()));
        child.on("error", reject);
        child.on("close", (code) => resolve({ ok: code === 0, out }));
      });
    }

    /** Runs wrangler and expects success, and no `undefined` in what it printed. */
    async function run(...args: string[]): Promise<string> {
      const { ok, out } = await wrangler(...args);
      assert.ok(ok, `wrangler ${args.join(" ")} failed:\n${out}`);
      assert.ok(!out.includes("undefined"), `wrangler ${args.join(" ")} printed undefined:\n${out}`);
      return out;
    }

    it("lists and describes the TypeScript workflow with the Rust ones; triggers, lists, describes, pauses, resumes, sends an event to, terminates and restarts its instances", async () => {
      // Two chains at once (each wrangler command takes seconds of CPU): w1 to its end; the
      // workflows listed and described, w2 terminated and restarted.
      const [described] = await Promise.all([
        (async () => {
          const out = await run("workflows", "trigger", "ts-approval", '{"amount": 42}', "--id", "w1");
          assert.ok(out.includes('Workflow instance "w1" has been queued successfully'), out);
          await server.settled("ts-approval", "w1", ["waiting"]);
          assert.ok((await run("workflows", "instances", "pause", "ts-approval", "w1")).includes("was paused successfully"));
          assert.equal(await status("ts-approval", "w1"), "paused");
          assert.ok((await run("workflows", "instances", "resume", "ts-approval", "w1")).includes("was resumed successfully"));
          await server.settled("ts-approval", "w1", ["waiting"]);
          const sent = await run("workflows", "instances", "send-event", "ts-approval", "w1", "--type", "approved", "--payload", '{"by": "ada"}');
          assert.ok(sent.includes('The event with type "approved"'), sent);
          const done = await server.settled("ts-approval", "w1");
          assert.equal(done.status, "complete");
          assert.deepEqual(done.output, { request: { amount: 42 }, approval: { by: "ada" } });
          const description = await run("workflows", "instances", "describe", "ts-approval", "w1");
          assert.ok(description.includes("notify approver") && description.includes("wait for approval"), description);
          assert.ok(description.includes("Success:               ✅ Yes"), description);
          assert.ok(description.includes('{"payload":{"by":"ada"}'), description);
          const list = await run("workflows", "instances", "list", "ts-approval", "--status", "complete");
          assert.ok(list.includes("w1") && list.includes("Completed") && list.includes("Showing 1 instance from page 1"), list);
          return description;
        })(),
        (async () => {
          const [list, rust, ts] = [await run("workflows", "list"), await run("workflows", "describe", "approval"), await run("workflows", "describe", "ts-approval")];
          const names = (await server.api("GET", "/api/workflows")).body.workflows.map((w: { name: string }) => w.name);
          assert.ok(names.includes("ts-approval"));
          for (const name of names) assert.ok(list.includes(name), `${name} in:\n${list}`);
          assert.ok(list.includes(`Showing ${names.length} workflows from page 1`), list);
          assert.ok(rust.includes("Name:         approval"), rust);
          assert.ok(ts.includes("Name:         ts-approval") && ts.includes("Class Name:   ts-approval"), ts);
          assert.equal(normalize(ts), normalize(rust));

          await run("workflows", "trigger", "ts-approval", "--id", "w2");
          await server.settled("ts-approval", "w2", ["waiting"]);
          assert.ok((await run("workflows", "instances", "terminate", "ts-approval", "w2")).includes("was terminated successfully"));
          assert.equal(await status("ts-approval", "w2"), "terminated");
          assert.ok((await run("workflows", "instances", "restart", "ts-approval", "w2")).includes("was restarted successfully"));
          const restarted = await server.settled("ts-approval", "w2", ["waiting"]);
          assert.equal(restarted.steps.length, 2, "it ran again from the start, to its wait");
          const missing = await wrangler("workflows", "instances", "describe", "ts-approval", "missing");
          assert.ok(!missing.ok && missing.out.includes("[code: 10400]"), missing.out);
        })(),
      ]);
      // The Rust twin, taken to the same end through Cairn's API, as wrangler describes it.
      assert.equal((await server.api("POST", "/api/workflows/approval/instances", { instance_id: "w1", params: { amount: 42 } })).status, 201);
      await server.settled("approval", "w1", ["waiting"]);
      await server.api("POST", "/api/workflows/approval/instances/w1/events/approved", { by: "ada" });
      await server.settled("approval", "w1");
      const rust = await run("workflows", "instances", "describe", "approval", "w1");
      // The same description, once what differs by nature (names, ids, times) is set aside.
      assert.equal(normalize(described), normalize(rust));
    });
  });

  it("Cloudflare's TypeScript SDK (npm cloudflare) creates, gets, lists, pauses, resumes, sends events to, terminates and restarts both", async () => {
    const cf = new Cloudflare({ apiToken: token, baseURL: `${server.url}/client/v4`, maxRetries: 0 });
    const names: string[] = [];
    for await (const workflow of cf.workflows.list({ account_id: ACCOUNT })) names.push(workflow.name);
    assert.ok(names.includes("approval") && names.includes("ts-approval"), JSON.stringify(names));

    for (const workflow of WORKFLOWS) {
      const info = await cf.workflows.get(workflow, { account_id: ACCOUNT });
      assert.equal(info.name, workflow);
      const versions: { id: string }[] = [];
      for await (const version of cf.workflows.versions.list(workflow, { account_id: ACCOUNT })) versions.push(version);
      assert.equal(versions.length, 1, JSON.stringify(versions));
      // The version's graph: Cairn does not parse code, so the version with graph null.
      const graph = await cf.workflows.versions.graph(versions[0]!.id, { account_id: ACCOUNT, workflow_name: workflow });
      assert.equal(graph.id, versions[0]!.id);
      assert.equal(graph.graph, null);

      // Params as JSON text (the SDK's type) and as an object.
      const created = await cf.workflows.instances.create(workflow, { account_id: ACCOUNT, instance_id: "s1", params: JSON.stringify({ amount: 7 }) });
      assert.equal(created.id, "s1");
      assert.equal(created.workflow_id, info.id);
      assert.equal(created.version_id, versions[0]!.id);
      await cf.workflows.instances.create(workflow, { account_id: ACCOUNT, instance_id: "s2", params: { amount: 8 } as unknown as string });
      const bulk: string[] = [];
      for await (const made of cf.workflows.instances.bulk(workflow, { account_id: ACCOUNT, body: [{ instance_id: "b1" }, { instance_id: "b2" }] })) bulk.push(made.id);
      assert.deepEqual(bulk, ["b1", "b2"]);
      for (const id of ["s1", "s2", "b1", "b2"]) await server.settled(workflow, id, ["waiting"]);
      assert.deepEqual((await server.details(workflow, "s1")).params, { amount: 7 });
      assert.deepEqual((await server.details(workflow, "s2")).params, { amount: 8 });

      const listed: string[] = [];
      for await (const row of cf.workflows.instances.list(workflow, { account_id: ACCOUNT, status: "waiting", per_page: 2 })) listed.push(row.id);
      // (wrangler's test may have left its own instances waiting)
      assert.deepEqual(
        listed.filter((id) => /^[sb]\d$/.test(id)),
        ["b2", "b1", "s2", "s1"],
        "newest first, across pages",
      );

      const paused = await cf.workflows.instances.status.edit("s1", { account_id: ACCOUNT, workflow_name: workflow, status: "pause" });
      assert.equal(paused.status, "paused");
      assert.equal(await status(workflow, "s1"), "paused");
      await cf.workflows.instances.status.edit("s1", { account_id: ACCOUNT, workflow_name: workflow, status: "resume" });
      await server.settled(workflow, "s1", ["waiting"]);
      const sent = await cf.workflows.instances.events.create("approved", { account_id: ACCOUNT, workflow_name: workflow, instance_id: "s1", body: { by: "sdk" } });
      assert.equal(sent.instanceId, "s1");
      await server.settled(workflow, "s1");
      const got = await cf.workflows.instances.get("s1", { account_id: ACCOUNT, workflow_name: workflow });
      assert.equal(got.status, "complete");
      assert.deepEqual(got.output, { request: { amount: 7 }, approval: { by: "sdk" } });
      assert.deepEqual(
        got.steps.map((s) => [(s as { name?: string }).name, s.type]),
        [
          ["notify approver", "step"],
          ["wait for approval", "waitForEvent"],
        ],
      );
      const wait = await cf.workflows.instances.step("s1", { account_id: ACCOUNT, workflow_name: workflow, name: "wait for approval-1", type: "waitForEvent" });
      assert.deepEqual((wait as { output: { payload: unknown } }).output.payload, { by: "sdk" });

      const terminated = await cf.workflows.instances.status.edit("s2", { account_id: ACCOUNT, workflow_name: workflow, status: "terminate" });
      assert.equal(terminated.status, "terminated");
      assert.equal(await status(workflow, "s2"), "terminated");
      await cf.workflows.instances.status.edit("s2", { account_id: ACCOUNT, workflow_name: workflow, status: "restart" });
      await server.settled(workflow, "s2", ["waiting"]);

      await assert.rejects(cf.workflows.instances.get("nope", { account_id: ACCOUNT, workflow_name: workflow }), (error: unknown) => {
        assert.ok(error instanceof Cloudflare.NotFoundError, String(error));
        assert.equal((error as { errors: { code: number }[] }).errors[0]!.code, 10400);
        return true;
      });
      await assert.rejects(cf.workflows.instances.create(workflow, { account_id: ACCOUNT, instance_id: "s1" }), Cloudflare.ConflictError);
    }
  });

  it("Cloudflare's TypeScript SDK reaches Cairn with exactly the README's variables (new Cloudflare() with no options)", async () => {
    // The README's block: wrangler's variable and the SDKs' one. The SDK without its own
    // (CLOUDFLARE_BASE_URL) would send the call, and the token, to Cloudflare's real API.
    const saved = { ...process.env };
    try {
      for (const key of Object.keys(process.env)) if (key.startsWith("CLOUDFLARE_")) delete process.env[key];
      Object.assign(process.env, {
        CLOUDFLARE_API_BASE_URL: `${server.url}/client/v4`,
        CLOUDFLARE_BASE_URL: `${server.url}/client/v4`,
        CLOUDFLARE_ACCOUNT_ID: ACCOUNT,
        CLOUDFLARE_API_TOKEN: token,
      });
      const cf = new Cloudflare({ maxRetries: 0 });
      const made = await cf.workflows.instances.create("ts-approval", { account_id: process.env.CLOUDFLARE_ACCOUNT_ID!, instance_id: "readme-ts" });
      assert.equal(made.id, "readme-ts");
    } finally {
      for (const key of Object.keys(process.env)) if (!(key in saved)) delete process.env[key];
      Object.assign(process.env, saved);
    }
    assert.equal((await server.details("ts-approval", "readme-ts")).id, "readme-ts", "the instance is on Cairn");
  });
});

/** The skip reason, printed where it cannot be missed. */
function loud(reason: string): string {
  process.stderr.write(`\n*** SKIPPED the wrangler tests of cloudflare-clients.test.ts: ${reason} ***\n\n`);
  return reason;
}

/** Wrangler's description of an instance with its workflow's name, ids and times set aside. */
function normalize(text: string): string {
  return text
    .replace(/ts-approval|approval/g, "WORKFLOW")
    .replace(/\d{4}-\d\d-\d\dT[\d:.]+Z?|\d{1,2}\/\d{1,2}\/\d{4},? [\d:]+( [AP]M)?|\b\d{13}\b/g, "TIME")
    .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "UUID")
    .replace(/\d+(\.\d+)?\s*(ms|milliseconds?|s|seconds?)\b/g, "DURATION")
    .replace(/\s+$/gm, "");
}
