// Every TypeScript workflow of Cloudflare's documents in shared/seeds ("Rules of Workflows",
// in Russian and the rest of its English page; "Sleeping and retrying"; the blog post on saga
// rollbacks), for seeds.test.ts, which runs each one on a real `cairn serve`, and
// exports.test.ts. The file is compiled with the tests: if the SDK's types stopped accepting
// Cloudflare's code, the build would fail.
//
// The code is the documents' code, comments included, indented by two spaces instead of a tab.
// What differs, and nothing else:
// - the imports;
// - the class names (every example is `MyWorkflow` in the documents), and `export default`
//   handlers are named consts;
// - `WorkflowEntrypoint` below is the SDK's with this file's `Env` and `Params` as its
//   defaults: the documents write `extends WorkflowEntrypoint` and use `this.env.KV` (as
//   Workers' generated `Env` allows), which strict TypeScript refuses with an `unknown` env;
// - a `// @ts-expect-error` line above each line strict TypeScript refuses although it runs
//   as written (a local the document never reads, a parameter without a type, `e.message` on
//   an `unknown`, a rollback's `output.id` that may be undefined);
// - a fragment (lines of a longer workflow) sits in the `run` of a class of ours, which takes
//   the fragment's free variables from the payload; the blog's elided `{ ... }` is
//   `{ /* ... */ }`.
// The functions and services the documents assume (getIssues, bankA, the hosts they fetch, …)
// are declared here; the tests install them as globals.

import {
  WorkflowEntrypoint as SdkWorkflowEntrypoint,
  NonRetryableError,
  type Workflow,
  type WorkflowEvent,
  type WorkflowStep,
  type WorkflowStepConfig,
} from "@cairn-engine/workflows";

// ---- what the documents assume ------------------------------------------------------------

export type Params = { user: string; userType?: string; data?: string; repoName?: string };

/** The bindings the examples use, as a user passes them to `serve({ env })`. */
export interface Env {
  KV: { get(key: string, options?: { type: "json" }): Promise<any> };
  MY_BUCKET: { put(key: string, value: string): Promise<unknown>; get(key: string): Promise<{ json(): Promise<unknown> }> };
  MY_WORKFLOW: Workflow;
  ANOTHER_WORKFLOW: Workflow;
  DB_URL: string;
  DB_TOKEN: string;
}

/** `extends WorkflowEntrypoint` as the documents write it: `this.env` is an `Env`. */
abstract class WorkflowEntrypoint<E = Env, P = Params> extends SdkWorkflowEntrypoint<E, P> {}

/** What a workers' `fetch` resolves to, as the documents read it (`res.json()` is `any`). */
type WorkersResponse = Omit<Response, "json"> & { json(): Promise<any> };
// This module's `fetch` is the global one (the tests route the documents' hosts), typed so.
declare function fetch(input: string, init?: RequestInit): Promise<WorkersResponse>;

/** A bank as the blog calls it: by position in its first listings, by object in its last. */
export interface Bank {
  debit(account: string, amount: number, reference?: string): Promise<{ id: string }>;
  debit(args: { accountId: string; amount: number; idempotencyKey: string }): Promise<{ id: string }>;
  credit(account: string, amount: number, reference?: string): Promise<{ id: string }>;
  credit(args: { accountId: string; amount: number; idempotencyKey: string }): Promise<{ id: string }>;
}

declare function createDBConnection(url: string, token: string): unknown;
declare function getIssues(repo: string | undefined): Promise<string[]>;
declare function processData(data: unknown): unknown;
declare function reserveInventory(): Promise<{ id: string }>;
declare function releaseInventory(id: string): Promise<void>;
declare function syncCustomer(): Promise<void>;
declare function getUserId(req: Request): string;
declare function getTransactionId(): string;
declare function addNewInstanceToDB(userId: string, instanceId: string): Promise<{ result: unknown }>;
declare const payload: unknown;
declare const bankA: Bank;
declare const bankB: Bank;
declare function notifyBoth(from: string, to: string, amount: number): Promise<void>;
declare function alertOnCall(what: string, error: unknown): Promise<void>;
declare function sendTransferConfirmation(details: object): Promise<void>;
declare const serviceA: { call(): Promise<unknown> };
declare const serviceB: { call(): Promise<unknown> };

// ---- Rules of Workflows: make steps idempotent ----------------------------------------------

export class ChargeOnce extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const customer_id = 123456;
    // ✅ Good: Non-idempotent API/Binding calls are always done **after** checking if the operation is
    // still needed.
    await step.do(
      `charge ${customer_id} for its monthly subscription`,
      async () => {
        // API call to check if customer was already charged
        const subscription = await fetch(
          `https://payment.processor/subscriptions/${customer_id}`,
        ).then((res) => res.json());

        // return early if the customer was already charged, this can happen if the destination service dies
        // in the middle of the request but still commits it, or if the Workflows Engine restarts.
        if (subscription.charged) {
          return;
        }

        // non-idempotent call, this operation can fail and retry but still commit in the payment
        // processor - which means that, on retry, it would mischarge the customer again if the above checks
        // were not in place.
        return await fetch(
          `https://payment.processor/subscriptions/${customer_id}`,
          {
            method: "POST",
            body: JSON.stringify({ amount: 10.0 }),
          },
        );
      },
    );
  }
}

// ---- Rules of Workflows: make steps granular ------------------------------------------------

export class GranularSteps extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // ✅ Good: Unrelated API/Binding calls are self-contained, so that in case one of them fails
    // it can retry them individually. It also has an extra advantage: you can control retry or
    // timeout policies for each granular step - you might not to want to overload http.cat in
    // case of it being down.
    const httpCat = await step.do("get cutest cat from KV", async () => {
      return await this.env.KV.get("cutest-http-cat");
    });

    // @ts-expect-error: `image` is never read (noUnusedLocals)
    const image = await step.do("fetch cat image from http.cat", async () => {
      return await fetch(`https://http.cat/${httpCat}`);
    });
  }
}

export class GranularStepsBad extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: you are calling two separate services from within the same step. This might cause
    // some extra calls to the first service in case the second one fails, and in some cases, makes
    // the step non-idempotent altogether
    // @ts-expect-error: `image` is never read (noUnusedLocals)
    const image = await step.do("get cutest cat from KV", async () => {
      const httpCat = await this.env.KV.get("cutest-http-cat");
      return fetch(`https://http.cat/${httpCat}`);
    });
  }
}

// ---- Rules of Workflows: don't rely on state outside a step ---------------------------------

// The same function precedes both examples in the document.
// @ts-expect-error: parameters without types (noImplicitAny)
function getRandomInt(min, max) {
  const minCeiled = Math.ceil(min);
  const maxFloored = Math.floor(max);
  return Math.floor(Math.random() * (maxFloored - minCeiled) + minCeiled); // The maximum is exclusive and the minimum is inclusive
}

export class CutestCatsBad extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: `imageList` will be not persisted across engine's lifetimes. Which means that after hibernation,
    // `imageList` will be empty again, even though the following two steps have already ran.
    const imageList: string[] = [];

    await step.do("get first cutest cat from KV", async () => {
      const httpCat = await this.env.KV.get("cutest-http-cat-1");

      imageList.push(httpCat);
    });

    await step.do("get second cutest cat from KV", async () => {
      const httpCat = await this.env.KV.get("cutest-http-cat-2");

      imageList.push(httpCat);
    });

    // A long sleep can (and probably will) hibernate the engine which means that the first engine lifetime ends here
    await step.sleep("💤💤💤💤", "3 hours");

    // When this runs, it will be on the second engine lifetime - which means `imageList` will be empty.
    await step.do(
      "choose a random cat from the list and download it",
      async () => {
        const randomCat = imageList.at(getRandomInt(0, imageList.length));
        // this will fail since `randomCat` is undefined because `imageList` is empty
        return await fetch(`https://http.cat/${randomCat}`);
      },
    );
  }
}

export class CutestCats extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // ✅ Good: imageList state is exclusively comprised of step returns - this means that in the event of
    // multiple engine lifetimes, imageList will be built accordingly
    const imageList: string[] = await Promise.all([
      step.do("get first cutest cat from KV", async () => {
        return await this.env.KV.get("cutest-http-cat-1");
      }),

      step.do("get second cutest cat from KV", async () => {
        return await this.env.KV.get("cutest-http-cat-2");
      }),
    ]);

    // A long sleep can (and probably will) hibernate the engine which means that the first engine lifetime ends here
    await step.sleep("💤💤💤💤", "3 hours");

    // When this runs, it will be on the second engine lifetime - but this time, imageList will contain
    // the two most cutest cats
    await step.do(
      "choose a random cat from the list and download it",
      async () => {
        const randomCat = imageList.at(getRandomInt(0, imageList.length));
        // this will eventually succeed since `randomCat` is defined
        return await fetch(`https://http.cat/${randomCat}`);
      },
    );
  }
}

// ---- Rules of Workflows: avoid side effects outside step.do --------------------------------

export class SideEffects extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: creating instances outside of steps
    // This might get called more than once creating more instances than expected
    // @ts-expect-error: `badInstance` is never read (noUnusedLocals)
    const badInstance = await this.env.ANOTHER_WORKFLOW.create();

    // 🔴 Bad: using non-deterministic functions outside of steps
    // this will produce different results if the instance has to restart, different runs of the same instance
    // might go through different paths
    const badRandom = Math.random();

    if (badRandom > 0) {
      // do some stuff
    }

    // ⚠️ Warning: This log may happen many times
    console.log("This might be logged more than once");

    await step.do("do some stuff and have a log for when it runs", async () => {
      // do some stuff

      // this log will only appear once
      console.log("successfully did stuff");
    });

    // ✅ Good: wrap non-deterministic function in a step
    // after running successfully will not run again
    // @ts-expect-error: `goodRandom` is never read (noUnusedLocals)
    const goodRandom = await step.do("create a random number", async () => {
      return Math.random();
    });

    // ✅ Good: calls that have no side effects can be done outside of steps
    // For Hyperdrive, create the connection inside each step instead of here.
    // @ts-expect-error: `db` is never read (noUnusedLocals)
    const db = createDBConnection(this.env.DB_URL, this.env.DB_TOKEN);

    // ✅ Good: run functions with side effects inside of a step
    // after running successfully will not run again
    // @ts-expect-error: `goodInstance` is never read (noUnusedLocals)
    const goodInstance = await step.do(
      "good step that returns state",
      async () => {
        const instance = await this.env.ANOTHER_WORKFLOW.create();

        return instance;
      },
    );
  }
}

// ---- Rules of Workflows: do not mutate your incoming events ---------------------------------

interface MyEvent {
  user: string;
  data: string;
}

export class DoNotMutate extends WorkflowEntrypoint {
  async run(event: WorkflowEvent<MyEvent>, step: WorkflowStep) {
    // 🔴 Bad: Mutating the event
    // This will not be persisted across steps and `event.payload` will
    // take on its original value.
    await step.do("bad step that mutates the incoming event", async () => {
      let userData = await this.env.KV.get(event.payload.user);
      event.payload = userData;
    });

    // ✅ Good: persist data by returning it as state from your step
    // Use that state in subsequent steps
    // @ts-expect-error: `userData` is never read (noUnusedLocals)
    let userData = await step.do("good step that returns state", async () => {
      return await this.env.KV.get(event.payload.user);
    });

    // @ts-expect-error: `someOtherData` is never read (noUnusedLocals)
    let someOtherData = await step.do(
      "following step that uses that state",
      async () => {
        // Access to userData here
        // Will always be the same if this step is retried
      },
    );
  }
}

// ---- Rules of Workflows: name steps deterministically ---------------------------------------

export class DeterministicNames extends WorkflowEntrypoint {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: Naming the step non-deterministically prevents it from being cached
    // This will cause the step to be re-run if subsequent steps fail.
    await step.do(`step #1 running at: ${Date.now()}`, async () => {
      let userData = await this.env.KV.get(event.payload.user);
      // Do not mutate event.payload
      event.payload = userData;
    });

    // ✅ Good: give steps a deterministic name.
    // Return dynamic values in your state, or log them instead.
    // @ts-expect-error: `state` is never read (noUnusedLocals)
    let state = await step.do("fetch user data from KV", async () => {
      let userData = await this.env.KV.get(event.payload.user);
      console.log(`fetched at ${Date.now()}`);
      return userData;
    });

    // ✅ Good: steps that are dynamically named are constructed in a deterministic way.
    // In this case, `catList` is a step output, which is stable, and `catList` is
    // traversed in a deterministic fashion (no shuffles or random accesses) so,
    // it's fine to dynamically name steps (e.g: create a step per list entry).
    let catList = await step.do("get cat list from KV", async () => {
      return await this.env.KV.get("cat-list");
    });

    for (const cat of catList) {
      await step.do(`get cat: ${cat}`, async () => {
        return await this.env.KV.get(cat);
      });
    }
  }
}

// ---- Rules of Workflows: take care with Promise.race() and Promise.any() ---------------------

// helper sleep method (the same in the three examples)
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class RaceBad extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: The `Promise.race` is not surrounded by a `step.do`, which may cause non-deterministic caching behavior.
    const race_return = await Promise.race([
      step.do("Promise first race", async () => {
        await sleep(1000);
        return "first";
      }),
      step.do("Promise second race", async () => {
        return "second";
      }),
    ]);

    await step.sleep("Sleep step", "2 hours");

    return await step.do("Another step", async () => {
      // This step will return `first`, even though the `Promise.race` first returned `second`.
      return race_return;
    });
  }
}

/** The Russian page's "good" example, which the English page replaced by `Race` (no nesting). */
export class RaceNested extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // ✅ Good: The `Promise.race` is surrounded by a `step.do`, ensuring deterministic caching behavior.
    const race_return = await step.do("Promise step", async () => {
      return await Promise.race([
        step.do("Promise first race", async () => {
          await sleep(1000);
          return "first";
        }),
        step.do("Promise second race", async () => {
          return "second";
        }),
      ]);
    });

    await step.sleep("Sleep step", "2 hours");

    return await step.do("Another step", async () => {
      // This step will return `second` because the `Promise.race` was surround by the `step.do` method.
      return race_return;
    });
  }
}

export class Race extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // ✅ Good: The `Promise.race` is surrounded by a single `step.do`, ensuring deterministic
    // caching behavior, and it does not nest `step.do` calls inside the race.
    const race_return = await step.do("race step", async () => {
      return await Promise.race([
        (async () => {
          await sleep(1000);
          return "first";
        })(),
        (async () => {
          return "second";
        })(),
      ]);
    });

    await step.sleep("Sleep step", "2 hours");

    return await step.do("Another step", async () => {
      // This step will return `second` because the `Promise.race` was surrounded by the `step.do` method.
      return race_return;
    });
  }
}

// ---- Rules of Workflows: instance IDs are unique --------------------------------------------

// This is in the same file as your Workflow definition
export const fetchHandler = {
  async fetch(req: Request, env: Env): Promise<Response> {
    // 🔴 Bad: Use an ID that isn't unique across future Workflow invocations
    let userId = getUserId(req); // Returns the userId
    // @ts-expect-error: `badInstance` is never read (noUnusedLocals)
    let badInstance = await env.MY_WORKFLOW.create({
      id: userId,
      params: payload,
    });

    // ✅ Good: use an ID that is unique
    // e.g. a transaction ID, order ID, or task ID are good options
    let instanceId = getTransactionId(); // e.g. assuming transaction IDs are unique
    // or: compose a composite ID and store it in your database
    // so that you can track all instances associated with a specific user or merchant.
    instanceId = `${getUserId(req)}-${crypto.randomUUID().slice(0, 6)}`;
    // @ts-expect-error: `result` is never read (noUnusedLocals)
    let { result } = await addNewInstanceToDB(userId, instanceId);
    let goodInstance = await env.MY_WORKFLOW.create({
      id: instanceId,
      params: payload,
    });

    return Response.json({
      id: goodInstance.id,
      details: await goodInstance.status(),
    });
  },
};

// ---- Rules of Workflows: await your steps ---------------------------------------------------

export class AwaitSteps extends WorkflowEntrypoint {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: The step isn't await'ed, and any state or errors is swallowed before it returns.
    // @ts-expect-error: `badIssues` is never read (noUnusedLocals)
    const badIssues = step.do(`fetch issues from GitHub`, async () => {
      // The step will return before this call is done
      let issues = await getIssues(event.payload.repoName);
      return issues;
    });

    // ✅ Good: The step is correctly await'ed.
    // @ts-expect-error: `goodIssues` is never read (noUnusedLocals)
    const goodIssues = await step.do(`fetch issues from GitHub`, async () => {
      let issues = await getIssues(event.payload.repoName);
      return issues;
    });

    // Rest of your Workflow goes here!
  }
}

// ---- Rules of Workflows: use conditional logic carefully ------------------------------------

export class Conditional extends WorkflowEntrypoint {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const config = await step.do("fetch config", async () => {
      return await this.env.KV.get("feature-flags", { type: "json" });
    });

    // ✅ Good: Condition based on step output (deterministic)
    if (config.enableEmailNotifications) {
      await step.do("send email", async () => {
        // Send email logic
      });
    }

    // ✅ Good: Condition based on event payload (deterministic)
    if (event.payload.userType === "premium") {
      await step.do("premium processing", async () => {
        // Premium-only logic
      });
    }

    // 🔴 Bad: Condition based on non-deterministic value outside a step
    // This could behave differently if the Workflow restarts
    if (Math.random() > 0.5) {
      await step.do("maybe do something", async () => {});
    }

    // ✅ Good: Wrap non-deterministic values in a step
    const shouldProcess = await step.do("decide randomly", async () => {
      return Math.random() > 0.5;
    });
    if (shouldProcess) {
      await step.do("conditionally do something", async () => {});
    }
  }
}

// ---- Rules of Workflows: batch multiple Workflow invocations --------------------------------

export const batchHandler = {
  // @ts-expect-error: `req` is never read (noUnusedParameters)
  async fetch(req: Request, env: Env): Promise<Response> {
    let instances = [
      { id: "user1", params: { name: "John" } },
      { id: "user2", params: { name: "Jane" } },
      { id: "user3", params: { name: "Alice" } },
      { id: "user4", params: { name: "Bob" } },
    ];

    // 🔴 Bad: Create them one by one, which is more likely to hit creation rate limits.
    for (let instance of instances) {
      await env.MY_WORKFLOW.create({
        id: instance.id,
        params: instance.params,
      });
    }

    // ✅ Good: Batch calls together
    // This improves throughput.
    let createdInstances = await env.MY_WORKFLOW.createBatch(instances);
    return Response.json({ instances: createdInstances });
  },
};

// ---- Rules of Workflows: non-stream step return values are limited to 1 MiB -----------------

// The document is cut after this example's last `}` but one: the class's closing brace is ours.
export class LargeData extends WorkflowEntrypoint {
  // @ts-expect-error: `event` is never read (noUnusedParameters)
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    // 🔴 Bad: Returning a large response that may exceed 1 MiB
    // @ts-expect-error: `largeData` is never read (noUnusedLocals)
    const largeData = await step.do("fetch large dataset", async () => {
      const response = await fetch("https://api.example.com/large-dataset");
      return await response.json(); // Could exceed 1 MiB
    });

    // ✅ Good: Store large structured data externally and return a reference
    const dataRef = await step.do("fetch and store large dataset", async () => {
      const response = await fetch("https://api.example.com/large-dataset");
      const data = await response.json();
      // Store in R2 and return a reference
      await this.env.MY_BUCKET.put("dataset-123", JSON.stringify(data));
      return { key: "dataset-123" };
    });

    // Retrieve the data in a later step when needed
    // @ts-expect-error: `data` is never read (noUnusedLocals)
    const data = await step.do("process dataset", async () => {
      const stored = await this.env.MY_BUCKET.get(dataRef.key);
      return processData(await stored.json());
    });
  }
}

// ---- Sleeping and retrying -----------------------------------------------------------------

/** A fragment: `step.sleep`. */
export class Sleepy extends WorkflowEntrypoint {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.sleep("sleep for a bit", "1 hour");
  }
}

/** A fragment: `step.sleepUntil` a date. */
export class SleepUntil extends WorkflowEntrypoint {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    // sleepUntil accepts a Date object as its second argument
    const workflowsLaunchDate = Date.parse("24 Oct 2024 13:00:00 UTC");
    await step.sleepUntil("sleep until X times out", workflowsLaunchDate);
  }
}

export const defaultConfig: WorkflowStepConfig = {
  retries: {
    limit: 5,
    delay: 10000,
    backoff: "exponential",
  },
  timeout: "10 minutes",
};

/** A fragment: a step's own retry config. */
export class CallAnApi extends WorkflowEntrypoint {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    // @ts-expect-error: `someState` is never read (noUnusedLocals)
    let someState = await step.do(
      "call an API",
      {
        retries: {
          limit: 10, // The total number of attempts
          delay: "10 seconds", // Delay between each retry
          backoff: "exponential", // Any of "constant" | "linear" | "exponential";
        },
        timeout: "30 minutes",
      },
      async () => {
        /* Step code goes here */
      },
    );
  }
}

/** A fragment: a delay function (the document shows it twice, identical). */
export class SyncCustomer extends WorkflowEntrypoint {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.do(
      "sync customer",
      {
        retries: {
          limit: 5,
          delay: ({ ctx, error }) => {
            if (error.message.includes("rate limit")) {
              return `${ctx.attempt * 30} seconds`;
            }

            return "10 seconds";
          },
        },
      },
      async () => {
        await syncCustomer();
      },
    );
  }
}

// In your step code:
export class MyWorkflow extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.do("some step", async () => {
      if (!event.payload.data) {
        throw new NonRetryableError(
          "event.payload.data did not contain the expected payload",
        );
      }
    });
  }
}

export class OrderWorkflow extends WorkflowEntrypoint<Env> {
  async run(_event: WorkflowEvent<unknown>, step: WorkflowStep) {
    await step.do(
      "reserve inventory",
      async () => {
        const reservation = await reserveInventory();
        return { reservationId: reservation.id };
      },
      {
        rollback: async ({ output }) => {
          const { reservationId } = output as { reservationId: string };
          await releaseInventory(reservationId);
        },
        rollbackConfig: {
          retries: { limit: 3, delay: "10 seconds", backoff: "linear" },
          timeout: "2 minutes",
        },
      },
    );

    await step.do("charge card", async () => {
      throw new NonRetryableError("payment processor rejected the charge");
    });
  }
}

/** A fragment (between the document's `...`): a step's error caught. */
export class CatchAndContinue extends WorkflowEntrypoint {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.do('task', async () => {
      // work to be done
    });

    try {
        await step.do('non-retryable-task', async () => {
        // work not to be retried
            throw new NonRetryableError('oh no');
        });
    } catch (e) {
        // @ts-expect-error: `e` is `unknown` (useUnknownInCatchVariables)
        console.log(`Step failed: ${e.message}`);
        await step.do('clean-up-task', async () => {
          // Clean up code here
        });
    }

    // the Workflow will not fail and will continue its execution

    await step.do('next-task', async() => {
      // more work to be done
    });
  }
}

// ---- The blog post on saga rollbacks ---------------------------------------------------------

/** The blog's transfers: from one account to another. */
export type BankTransfer = { from: string; to: string; amount: number };
export type AccountTransfer = { fromAccountId: string; toAccountId: string; amount: number; transferId: string };

/** A fragment: compensation by hand, "before rollbacks". */
export class SagaByHand extends WorkflowEntrypoint<Env, BankTransfer> {
  async run(event: WorkflowEvent<BankTransfer>, step: WorkflowStep) {
    const { from, to, amount } = event.payload;
    // track what completed so we know what to undo
    // @ts-expect-error: `debitA` is declared without a type (noImplicitAny)
    let debitA;
    // @ts-expect-error: `creditB` is declared without a type (noImplicitAny)
    let creditB;
    try {
      debitA = await step.do("debit-bank-a", () => bankA.debit(from, amount));
      creditB = await step.do("credit-bank-b", () => bankB.credit(to, amount));
      await step.do("notify", () => notifyBoth(from, to, amount));
    } catch (error) {
      // unwind in reverse. each undo is its own durable step,
      // must be idempotent, and must keep going if one fails.
      if (creditB) {
        try {
          // @ts-expect-error: `creditB` is declared without a type (noImplicitAny)
          await step.do("reverse-credit-b", () => bankB.debit(to, amount, creditB.id));
        } catch (e) {
          await alertOnCall("reverse-credit-b failed", e);
        }
      }
      if (debitA) {
        try {
          // @ts-expect-error: `debitA` is declared without a type (noImplicitAny)
          await step.do("refund-debit-a", () => bankA.credit(from, amount, debitA.id));
        } catch (e) {
          await alertOnCall("refund-debit-a failed", e);
        }
      }
      throw error;
    }
  }
}

/** A fragment: the same with rollbacks. */
export class SagaWithRollbacks extends WorkflowEntrypoint<Env, BankTransfer> {
  async run(event: WorkflowEvent<BankTransfer>, step: WorkflowStep) {
    const { from, to, amount } = event.payload;
    // each step ships with its own undo. add a step,
    // add its rollback right here. no growing catch
    // block, no manual ordering, no replay logic.
    await step.do("debit-bank-a", () => bankA.debit(from, amount), {
      // @ts-expect-error: `output` may be undefined (strictNullChecks)
      rollback: async ({ output }) => bankA.credit(from, amount, output.id),
    });
    await step.do("credit-bank-b", () => bankB.credit(to, amount), {
      // @ts-expect-error: `output` may be undefined (strictNullChecks)
      rollback: async ({ output }) => bankB.debit(to, amount, output.id),
    });
    await step.do("notify", () => notifyBoth(from, to, amount));
  }
}

/** A fragment: the blog's transfer with idempotency keys. */
export class Transfer extends WorkflowEntrypoint<Env, AccountTransfer> {
  async run(event: WorkflowEvent<AccountTransfer>, step: WorkflowStep) {
    const { fromAccountId, toAccountId, amount, transferId } = event.payload;
    // @ts-expect-error: `debit` is never read (noUnusedLocals)
    const debit = await step.do(
      "debit-account-a",
      async () => {
        return await bankA.debit({
          accountId: fromAccountId,
          amount,
          idempotencyKey: `${transferId}:debit-account-a`,
        });
      },
      {
        rollback: async () => {
          await bankA.credit({
            accountId: fromAccountId,
            amount,
            idempotencyKey: `${transferId}:rollback-debit-account-a`,
          });
        },
      }
    );

    // The idempotency keys make both the forward operations and rollback operations safe to retry without duplicating the transfer

    // @ts-expect-error: `credit` is never read (noUnusedLocals)
    const credit = await step.do(
      "credit-account-b",
      async () => {
        return await bankB.credit({
          accountId: toAccountId,
          amount,
          idempotencyKey: `${transferId}:credit-account-b`,
        });
      },
      {
        rollback: async ({ output }) => {
          if (output === undefined) {
            return;
          }

          await bankB.debit({
            accountId: toAccountId,
            amount,
            idempotencyKey: `${transferId}:rollback-credit-account-b`,
          });
        },
      }
    );


    // If we fail here, we may want to revert all previous payments. Users should not have to wrap their code in complex try-catch logic just to revert two small payments (see below)

    await step.do("send-confirmation", async () => {
      await sendTransferConfirmation({ /* ... */ });
    });
  }
}

/** A fragment: a step starts where `step.do` is called, not where it is awaited. */
export class StartOrder extends WorkflowEntrypoint {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    const first = step.do("first", () => serviceA.call());

    await step.do("second", () => serviceB.call());

    await first;
  }
}
