// A workflow written for Cloudflare Workflows, run on Cairn: only the import changed
// (`cloudflare:workers` → `@cairn-engine/workflows`). `npm start` connects it to the
// `cairn serve` at CAIRN_URL (default http://127.0.0.1:8787), starts one instance and
// prints where to watch it.
import {
  NonRetryableError,
  WorkflowEntrypoint,
  type WorkflowEvent,
  type WorkflowStep,
  serve,
  workflowBinding,
} from "@cairn-engine/workflows";

type Env = { GREETINGS: Record<string, string> };
type Params = { name: string; language?: string };

export class HelloWorkflow extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // A step's result is stored: on every later run of this instance it is read back,
    // and the callback does not run again.
    const greeting = await step.do("pick a greeting", async () => {
      const word = this.env.GREETINGS[event.payload.language ?? "en"];
      if (word === undefined) throw new NonRetryableError(`no greeting in ${event.payload.language}`);
      return `${word}, ${event.payload.name}!`;
    });
    // Durable: the instance could sleep for a month without holding memory.
    await step.sleep("let it sink in", "2 seconds");
    const [length, shout] = await Promise.all([
      step.do("measure", async () => greeting.length),
      step.do("shout", { retries: { limit: 3, delay: "1 second", backoff: "constant" } }, async (ctx) => {
        // Fails on the first attempt to show a retry in the dashboard.
        if (ctx.attempt === 1) throw new Error("flaky network");
        return greeting.toUpperCase();
      }),
    ]);
    return { greeting, shout, length };
  }
}

const url = process.env.CAIRN_URL ?? "http://127.0.0.1:8787";
const worker = serve({
  url,
  workflows: { hello: HelloWorkflow },
  env: { GREETINGS: { en: "Hello", fr: "Bonjour", de: "Hallo" } },
  version: process.env.CAIRN_WORKFLOW_VERSION ?? "example-1",
});
await worker.ready;
console.log(`worker connected to ${url}: it runs the workflow "hello"`);

const hello = workflowBinding<Params>("hello", { url });
const instance = await hello.create({ params: { name: "Ada", language: "fr" } });
console.log(`started hello/${instance.id}: watch it at ${url}/workflows/hello/instances/${instance.id}`);
const deadline = Date.now() + 60_000;
for (;;) {
  const status = await instance.status();
  if (status.status === "complete" || status.status === "errored") {
    console.log(`hello/${instance.id} is ${status.status}:`, JSON.stringify(status.output ?? status.error));
    break;
  }
  if (Date.now() > deadline) break;
  await new Promise((resolve) => setTimeout(resolve, 500));
}
console.log("the worker keeps running (Ctrl-C to stop): start more with");
console.log(`  curl -X POST ${url}/api/workflows/hello/instances -H 'content-type: application/json' -d '{"params": {"name": "Grace"}}'`);
process.on("SIGINT", () => void worker.close().then(() => process.exit(0)));
