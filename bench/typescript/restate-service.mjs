// The same workload on Restate: a service handler of 10 no-op durable steps (`ctx.run`),
// served by Restate's TypeScript SDK on port argv[2].
import * as restate from "@restatedev/restate-sdk";

// The SDK uses Promise.withResolvers (Node 22); on Node 20 it is supplied here.
Promise.withResolvers ??= function () {
  let resolve, reject;
  const promise = new this((a, b) => ((resolve = a), (reject = b)));
  return { promise, resolve, reject };
};

const bench = restate.service({
  name: "Bench",
  handlers: {
    run: async (ctx) => {
      for (let i = 0; i < 10; i++) await ctx.run(`step ${i}`, async () => i);
      return "done";
    },
  },
});

await restate.endpoint().bind(bench).listen(Number(process.argv[2]));
process.stdout.write("ready\n");
