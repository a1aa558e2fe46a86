// Cloudflare's documented TypeScript examples (shared/seeds: "Rules of Workflows", "Sleeping
// and retrying", the saga rollback post), with only their imports changed. This file is
// compiled with the tests: if the SDK's types stopped accepting Cloudflare code, the build
// would fail. exports.test.ts runs some of them.

import {
  WorkflowEntrypoint,
  type WorkflowEvent,
  type WorkflowStep,
  type WorkflowStepConfig,
  type Workflow,
} from "@cairn-engine/workflows";
import { NonRetryableError } from "@cairn-engine/workflows";

// ---- what the examples assume -------------------------------------------------------------

type Params = { user: string; userType?: string; data?: string; repoName?: string };

/** The user's own bindings, as they would pass them to `serve({ env })`. */
export interface Env {
  KV: { get(key: string, options?: { type: "json" }): Promise<any> };
  MY_BUCKET: { put(key: string, value: string): Promise<unknown>; get(key: string): Promise<{ json(): Promise<unknown> }> };
  MY_WORKFLOW: Workflow;
  ANOTHER_WORKFLOW: Workflow;
  DB_URL: string;
  DB_TOKEN: string;
}

declare function getRandomInt(min: number, max: number): number;
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
declare const bankA: {
  debit(args: { accountId: string; amount: number; idempotencyKey: string }): Promise<{ id: string }>;
  credit(args: { accountId: string; amount: number; idempotencyKey: string }): Promise<void>;
};

// ---- Rules of Workflows ---------------------------------------------------------------------

export class ChargeOnce extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const customer_id = 123456;
    await step.do(`charge ${customer_id} for its monthly subscription`, async () => {
      // Node types `json()` as unknown where Workers' types give any: the one line changed.
      const subscription: any = await fetch(`https://payment.processor/subscriptions/${customer_id}`).then((res) => res.json());
      if (subscription.charged) {
        return;
      }
      return await fetch(`https://payment.processor/subscriptions/${customer_id}`, {
        method: "POST",
        body: JSON.stringify({ amount: 10.0 }),
      });
    });
    return event.payload.user;
  }
}

export class CutestCats extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const imageList: string[] = await Promise.all([
      step.do("get first cutest cat from KV", async () => {
        return await this.env.KV.get("cutest-http-cat-1");
      }),
      step.do("get second cutest cat from KV", async () => {
        return await this.env.KV.get("cutest-http-cat-2");
      }),
    ]);
    await step.sleep("💤💤💤💤", "3 hours");
    await step.do("choose a random cat from the list and download it", async () => {
      const randomCat = imageList.at(getRandomInt(0, imageList.length));
      return await fetch(`https://http.cat/${randomCat}`);
    });
    return event.instanceId;
  }
}

export class SideEffects extends WorkflowEntrypoint<Env, Params> {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    console.log("This might be logged more than once");
    await step.do("do some stuff and have a log for when it runs", async () => {
      console.log("successfully did stuff");
    });
    const goodRandom = await step.do("create a random number", async () => {
      return Math.random();
    });
    const db = createDBConnection(this.env.DB_URL, this.env.DB_TOKEN);
    const goodInstance = await step.do("good step that returns state", async () => {
      const instance = await this.env.ANOTHER_WORKFLOW.create();
      return instance.id;
    });
    return [goodRandom, db, goodInstance];
  }
}

interface MyEvent {
  user: string;
  data: string;
}

export class DoNotMutate extends WorkflowEntrypoint<Env, MyEvent> {
  async run(event: WorkflowEvent<MyEvent>, step: WorkflowStep) {
    let userData = await step.do("good step that returns state", async () => {
      return await this.env.KV.get(event.payload.user);
    });
    let someOtherData = await step.do("following step that uses that state", async () => {
      return userData;
    });
    return someOtherData;
  }
}

export class Conditional extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const config = await step.do("fetch config", async () => {
      return await this.env.KV.get("feature-flags", { type: "json" });
    });
    if (config.enableEmailNotifications) {
      await step.do("send email", async () => {});
    }
    if (event.payload.userType === "premium") {
      await step.do("premium processing", async () => {});
    }
    const shouldProcess = await step.do("decide randomly", async () => {
      return Math.random() > 0.5;
    });
    if (shouldProcess) {
      await step.do("conditionally do something", async () => {});
    }
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class Race extends WorkflowEntrypoint<Env, Params> {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
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
      return race_return;
    });
  }
}

export class AwaitSteps extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    const goodIssues = await step.do(`fetch issues from GitHub`, async () => {
      let issues = await getIssues(event.payload.repoName);
      return issues;
    });
    return goodIssues;
  }
}

export class LargeData extends WorkflowEntrypoint<Env, Params> {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    const dataRef = await step.do("fetch and store large dataset", async () => {
      const response = await fetch("https://api.example.com/large-dataset");
      const data = await response.json();
      await this.env.MY_BUCKET.put("dataset-123", JSON.stringify(data));
      return { key: "dataset-123" };
    });
    const data = await step.do("process dataset", async () => {
      const stored = await this.env.MY_BUCKET.get(dataRef.key);
      return processData(await stored.json());
    });
    return data;
  }
}

export const fetchHandler = {
  async fetch(req: Request, env: Env): Promise<Response> {
    let userId = getUserId(req);
    let instanceId = getTransactionId();
    instanceId = `${getUserId(req)}-${crypto.randomUUID().slice(0, 6)}`;
    let { result } = await addNewInstanceToDB(userId, instanceId);
    let goodInstance = await env.MY_WORKFLOW.create({
      id: instanceId,
      params: payload,
    });
    return Response.json({
      id: goodInstance.id,
      details: await goodInstance.status(),
      result,
    });
  },
};

export const batchHandler = {
  async fetch(_req: Request, env: Env): Promise<Response> {
    let instances = [
      { id: "user1", params: { name: "John" } },
      { id: "user2", params: { name: "Jane" } },
      { id: "user3", params: { name: "Alice" } },
      { id: "user4", params: { name: "Bob" } },
    ];
    let createdInstances = await env.MY_WORKFLOW.createBatch(instances);
    return Response.json({ instances: createdInstances });
  },
};

// ---- Sleeping and retrying ------------------------------------------------------------------

export const defaultConfig: WorkflowStepConfig = {
  retries: {
    limit: 5,
    delay: 10000,
    backoff: "exponential",
  },
  timeout: "10 minutes",
};

export class Sleepy extends WorkflowEntrypoint<Env, Params> {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.sleep("sleep for a bit", "1 hour");
    const workflowsLaunchDate = Date.parse("24 Oct 2024 13:00:00 UTC");
    await step.sleepUntil("sleep until X times out", workflowsLaunchDate);
    let someState = await step.do(
      "call an API",
      {
        retries: {
          limit: 10,
          delay: "10 seconds",
          backoff: "exponential",
        },
        timeout: "30 minutes",
      },
      async () => {
        return 1;
      },
    );
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
    return someState;
  }
}

export class MyWorkflow extends WorkflowEntrypoint<Env, Params> {
  async run(event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.do("some step", async () => {
      if (!event.payload.data) {
        throw new NonRetryableError("event.payload.data did not contain the expected payload");
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

export class CatchAndContinue extends WorkflowEntrypoint<Env, Params> {
  async run(_event: WorkflowEvent<Params>, step: WorkflowStep) {
    await step.do("task", async () => {});
    try {
      await step.do("non-retryable-task", async () => {
        throw new NonRetryableError("oh no");
      });
    } catch (e) {
      console.log(`Step failed: ${(e as Error).message}`);
      await step.do("clean-up-task", async () => {});
    }
    await step.do("next-task", async () => {});
  }
}

// ---- Saga rollbacks (the blog post, with its step context) -----------------------------------

export class Transfer extends WorkflowEntrypoint<Env, { fromAccountId: string; amount: number; transferId: string }> {
  async run(event: WorkflowEvent<{ fromAccountId: string; amount: number; transferId: string }>, step: WorkflowStep) {
    const { fromAccountId, amount, transferId } = event.payload;
    const debit = await step.do(
      "debit-account-a",
      async () => {
        return await bankA.debit({ accountId: fromAccountId, amount, idempotencyKey: `${transferId}:debit-account-a` });
      },
      {
        rollback: async ({ output, error, ctx }) => {
          if (output === undefined) {
            return;
          }
          await bankA.credit({
            accountId: fromAccountId,
            amount,
            idempotencyKey: `${transferId}:rollback-${ctx.step.name}:${error.message}`,
          });
        },
      },
    );
    return debit.id;
  }
}
