// The workflow of `cairn-bench peers` in TypeScript: 10 no-op durable steps, run by a
// worker of the SDK connected to the `cairn serve` at argv[2].
import { WorkflowEntrypoint, serve } from "@cairn-engine/workflows";

class Ten extends WorkflowEntrypoint {
  async run(_event, step) {
    for (let i = 0; i < 10; i++) await step.do(`step ${i}`, async () => i);
    return "done";
  }
}

const worker = serve({ url: process.argv[2], workflows: { ten: Ten }, concurrency: 1000, version: "bench" });
await worker.ready;
process.stdout.write("ready\n");
process.on("SIGTERM", () => void worker.close().then(() => process.exit(0)));
