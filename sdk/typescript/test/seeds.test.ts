// Every TypeScript workflow of Cloudflare's documents in shared/seeds (transcribed in
// cloudflare-examples.ts) on a real `cairn serve` (CAIRN_BIN), each checked for the outcome its
// document gives, through Cairn's HTTP API: status, output, error, and the steps in the
// details. The services the examples call (KV, a bucket, the hosts they fetch, banks, …) are
// stand-ins, installed as the globals and bindings the examples name, that record what really
// ran, outside the engine.
//
// Two devices stand in for time and for the engine's lifecycle:
// - A sleep of hours is checked where it stands: the instance waits, its wake time is the
//   sleep's start plus the duration, and its worker holds no run (it hibernated). What the
//   documents say happens after it, hours later, is not waited for.
// - "The engine restarts" is a pause then a resume while a step body is held: the body ends,
//   the run stops, and the resumed run starts again from the top, its finished steps answering
//   from the journal, as after an engine restart or a wake from hibernation.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  CairnApiError,
  CairnWorkflow,
  type CairnWorker,
  NonRetryableError,
  type WorkflowClass,
  WorkflowEntrypoint,
  type WorkflowEvent,
  type WorkflowInstanceCreateOptions,
  type WorkflowStep,
  serve,
  workflowBinding,
} from "@cairn-engine/workflows";
import {
  AwaitSteps,
  CallAnApi,
  CatchAndContinue,
  ChargeOnce,
  Conditional,
  CutestCats,
  CutestCatsBad,
  DeterministicNames,
  DoNotMutate,
  type Env,
  GranularSteps,
  GranularStepsBad,
  LargeData,
  MyWorkflow,
  OrderWorkflow,
  Race,
  RaceBad,
  RaceNested,
  SagaByHand,
  SagaWithRollbacks,
  SideEffects,
  SleepUntil,
  Sleepy,
  StartOrder,
  SyncCustomer,
  Transfer,
  batchHandler,
  defaultConfig,
  fetchHandler,
} from "./cloudflare-examples.js";
import { Lines, deferred } from "./helpers.js";
import { type Details, Server, WorkerProcess, fixture, skipWithoutBin, token, until } from "./real-engine.js";

const HOUR = 3_600_000;

// ---- stand-ins ------------------------------------------------------------------------------

/** A step body held at a stand-in until the test lets it go. */
class Hold {
  readonly #reached = deferred();
  readonly #gate = deferred();
  /** Resolves once the body reached the stand-in. */
  get reached(): Promise<void> {
    return this.#reached.promise;
  }
  /** Called by the stand-in: waits there. */
  async wait(): Promise<void> {
    this.#reached.resolve();
    await this.#gate.promise;
  }
  release(): void {
    this.#gate.resolve();
  }
}

/** A KV namespace: `get` answers a copy of the entry (null when there is none) and is recorded. */
class StandInKv {
  readonly reads: (string | undefined)[] = [];
  readonly #holds = new Map<string, Hold>();
  constructor(readonly entries: Record<string, unknown>) {}

  /** The next read of `key` waits at the returned hold. */
  holdNext(key: string): Hold {
    const hold = new Hold();
    this.#holds.set(key, hold);
    return hold;
  }

  get = async (key: string): Promise<any> => {
    this.reads.push(key);
    const hold = this.#holds.get(key);
    if (hold !== undefined) {
      this.#holds.delete(key);
      await hold.wait();
    }
    const value = this.entries[key];
    return value === undefined ? null : structuredClone(value);
  };
}

/** An R2 bucket: keys to text. */
class StandInBucket {
  readonly objects = new Map<string, string>();
  put = async (key: string, value: string): Promise<void> => {
    this.objects.set(key, value);
  };
  get = async (key: string): Promise<{ json(): Promise<unknown> }> => {
    const text = this.objects.get(key);
    assert.ok(text !== undefined, `the bucket has no ${key}`);
    return { json: async () => JSON.parse(text) };
  };
}

/** The blog's banks: every call is a ledger line (bank, operation, account, amount, reference). */
class StandInBank {
  constructor(
    readonly name: string,
    readonly ledger: string[],
    /** Operations (`"debit"`, `"credit"`) that fail for good. */
    readonly failing: string[] = [],
  ) {}
  debit = (...args: unknown[]) => this.#call("debit", args);
  credit = (...args: unknown[]) => this.#call("credit", args);
  async #call(operation: string, args: unknown[]): Promise<{ id: string }> {
    const [account, amount, reference] =
      typeof args[0] === "object" && args[0] !== null
        ? [(args[0] as { accountId: string }).accountId, (args[0] as { amount: number }).amount, (args[0] as { idempotencyKey: string }).idempotencyKey]
        : args;
    this.ledger.push([`${this.name}.${operation}`, account, amount, reference].filter((part) => part !== undefined).join(" "));
    if (this.failing.includes(operation)) throw new NonRetryableError(`bank ${this.name} refused the ${operation}`);
    return { id: `${this.name}-${operation}-${this.ledger.length}` };
  }
}

/** The documents' other workflow binding: counts `create` calls, and can hold one. */
class CountingBinding extends CairnWorkflow {
  calls = 0;
  /** The id each call created, by call number (from 1). */
  readonly created = new Map<number, string>();
  /** Holds for `create` calls, by call number. */
  readonly holds = new Map<number, Hold>();
  override async create(options?: WorkflowInstanceCreateOptions) {
    const call = ++this.calls;
    await this.holds.get(call)?.wait();
    const instance = await super.create(options);
    this.created.set(call, instance.id);
    return instance;
  }
}

/** The workflow the side-effects example creates instances of. */
class AnotherWorkflow extends WorkflowEntrypoint {
  async run() {
    return "done";
  }
}

/** The other form the sleeping document gives: "a UNIX timestamp (milliseconds) passed directly". */
class SleepUntilTimestamp extends WorkflowEntrypoint<unknown, { at: number }> {
  async run(event: WorkflowEvent<{ at: number }>, step: WorkflowStep) {
    await step.sleepUntil("sleep until X times out", event.payload.at);
  }
}

// ---- the details ----------------------------------------------------------------------------

/** `type:name#count` of each step, for messages. */
const stepList = (d: Details): string[] => (d.steps as Details[]).map((s) => `${s.type}:${s.name}#${s.count}`);

/** The step `name` (#`count`, of `type`) in the details; fails when there is none. */
function stepOf(d: Details, name: string, { type = "step", count = 1 }: { type?: string; count?: number } = {}): Details {
  const found = (d.steps as Details[]).find((s) => s.name === name && s.type === type && s.count === count);
  assert.ok(found, `${type} "${name}" #${count} among ${JSON.stringify(stepList(d))}`);
  return found;
}

/** Each attempt as `ok` or `name: message`. */
const attempts = (s: Details): string[] =>
  (s.attempts as Details[]).map((a) => (a.success ? "ok" : `${a.error?.name}: ${a.error?.message}`));

/** Whether every `step.do` in the details has ended. */
const ended = (d: Details): boolean => (d.steps as Details[]).every((s) => s.type !== "step" || s.end != null);

/** How long a sleep sleeps: its wake time minus its start. */
const sleptFor = (s: Details): number => Date.parse(s.until) - Date.parse(s.start);

// ---- the suite ------------------------------------------------------------------------------

describe("Cloudflare's documented TypeScript workflows on a real cairn serve", { skip: skipWithoutBin("seeds.test.ts") }, () => {
  let server: Server;
  const workers: CairnWorker[] = [];
  const globals = globalThis as unknown as Record<string, unknown>;
  const installed = new Set<string>();
  /** What the examples' code logged (console.log), in order. */
  const logged: string[] = [];
  const realLog = console.log;
  const realFetch = globalThis.fetch;
  /** The hosts the examples fetch: URL → stand-in. */
  const routes = new Map<string, (init?: RequestInit) => Promise<Response> | Response>();

  /** Puts a stand-in where the examples' code finds it: a global of that name. */
  function install(name: string, value: unknown): void {
    globals[name] = value;
    installed.add(name);
  }

  /** A worker of its own for a test: its workflows, its bindings. */
  async function worker(workflows: Record<string, WorkflowClass<Env>>, env: Partial<Env> = {}): Promise<CairnWorker> {
    const name = `seeds:${Object.keys(workflows).join("+")}`;
    const started = serve({ url: server.url, token, workflows, env: env as Env, name, version: "seeds-1", heartbeatMs: 0, logger: new Lines() });
    workers.push(started);
    await started.ready;
    return started;
  }

  async function start(workflow: string, id: string, params: unknown = {}): Promise<void> {
    const answer = await server.api("POST", `/api/workflows/${workflow}/instances`, { instance_id: id, params });
    assert.equal(answer.status, 201, JSON.stringify(answer.body));
  }

  async function setStatus(workflow: string, id: string, status: string): Promise<string> {
    const answer = await server.api("PATCH", `/api/workflows/${workflow}/instances/${id}/status`, { status });
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    return answer.body.status;
  }

  /**
   * The engine restarts the instance's code while a step body waits at `hold`: a pause (the
   * instance waits for the body), the body let go, then, once paused, `meanwhile` and a
   * resume. The resumed run replays from the top.
   */
  async function restartAt(workflow: string, id: string, hold: Hold, meanwhile?: () => void): Promise<void> {
    await hold.reached;
    assert.equal(await setStatus(workflow, id, "pause"), "waitingForPause");
    hold.release();
    await server.settled(workflow, id, ["paused"]);
    meanwhile?.();
    await setStatus(workflow, id, "resume");
  }

  /** Waits until the worker named `name` holds no run: its instances hibernated. */
  async function hibernated(name: string): Promise<void> {
    await until(`worker ${name} to hold no run`, async () => {
      const found = (await server.connected()).find((w) => w.worker === name);
      return found?.running === 0 ? true : undefined;
    }, 10_000);
  }

  before(async () => {
    server = await Server.start();
    // The hosts the examples fetch answer from their stand-ins; the engine's API goes through.
    globalThis.fetch = (async (input: string | URL | Request, init?: RequestInit) => {
      const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
      const route = routes.get(url);
      if (route !== undefined) return route(init);
      if (/^https:\/\/(payment\.processor|http\.cat|api\.example\.com)\//.test(url)) throw new Error(`no stand-in answers ${url}`);
      return realFetch(input, init);
    }) as typeof fetch;
    console.log = (...args: unknown[]) => void logged.push(args.map(String).join(" "));
  });

  after(async () => {
    console.log = realLog;
    globalThis.fetch = realFetch;
    for (const name of installed) delete globals[name];
    await Promise.all(workers.map((w) => w.close({ timeoutMs: 1_000 })));
    await server?.close();
  });

  // Each waits for a step's first retry (Cloudflare's default delay: 10 seconds), so they run
  // at once; each has its own worker, bindings and hosts.
  describe("Rules of Workflows: steps retried", { concurrency: true }, () => {
    it("the idempotent charge: the processor commits the charge and drops the connection; the retried step checks first and charges once", async () => {
      const processor = { charged: false, checks: 0, charges: 0 };
      routes.set("https://payment.processor/subscriptions/123456", (init) => {
        if ((init?.method ?? "GET") === "GET") {
          processor.checks += 1;
          return Response.json({ charged: processor.charged });
        }
        processor.charges += 1;
        processor.charged = true;
        // "the destination service dies in the middle of the request but still commits it"
        if (processor.charges === 1) throw new TypeError("fetch failed");
        return Response.json({ ok: true });
      });
      await worker({ "charge-once": ChargeOnce });
      await start("charge-once", "subscription-1", { user: "ada" });
      const done = await server.settled("charge-once", "subscription-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      assert.deepEqual(processor, { charged: true, checks: 2, charges: 1 });
      const charge = stepOf(done, "charge 123456 for its monthly subscription");
      assert.deepEqual(attempts(charge), ["TypeError: fetch failed", "ok"]);
      assert.equal(charge.attempts[0].retryDelayMs, 10_000);
      // The retry returned early: the customer was already charged.
      assert.equal(charge.output, null);
      // A step without a config gets the defaults the sleeping document lists.
      assert.deepEqual(charge.config, defaultConfig);
      assert.equal(done.output, null);
    });

    it("granular steps: when http.cat fails, only its step is retried; the KV read runs once", async () => {
      const kv = new StandInKv({ "cutest-http-cat": "418" });
      let fetches = 0;
      routes.set("https://http.cat/418", () => {
        fetches += 1;
        if (fetches === 1) throw new TypeError("fetch failed");
        return new Response("a teapot", { headers: { "content-type": "image/jpeg" } });
      });
      await worker({ "granular-steps": GranularSteps }, { KV: kv });
      await start("granular-steps", "cat-1");
      const done = await server.settled("granular-steps", "cat-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      assert.deepEqual(kv.reads, ["cutest-http-cat"]);
      assert.equal(fetches, 2);
      const read = stepOf(done, "get cutest cat from KV");
      assert.deepEqual(attempts(read), ["ok"]);
      assert.equal(read.output, "418");
      assert.deepEqual(attempts(stepOf(done, "fetch cat image from http.cat")), ["TypeError: fetch failed", "ok"]);
    });

    it("one step calling two services: when http.cat fails, the retry reads KV again", async () => {
      const kv = new StandInKv({ "cutest-http-cat": "200" });
      let fetches = 0;
      routes.set("https://http.cat/200", () => {
        fetches += 1;
        if (fetches === 1) throw new TypeError("fetch failed");
        return new Response("a cat", { headers: { "content-type": "image/jpeg" } });
      });
      await worker({ "granular-steps-bad": GranularStepsBad }, { KV: kv });
      await start("granular-steps-bad", "cat-1");
      const done = await server.settled("granular-steps-bad", "cat-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      // "some extra calls to the first service in case the second one fails"
      assert.deepEqual(kv.reads, ["cutest-http-cat", "cutest-http-cat"]);
      assert.equal(fetches, 2);
      assert.deepEqual(stepList(done), ["step:get cutest cat from KV#1"]);
      assert.deepEqual(attempts(stepOf(done, "get cutest cat from KV")), ["TypeError: fetch failed", "ok"]);
    });
  });

  describe("Rules of Workflows", () => {
    it("state outside a step: the steps' pushes are not in their outputs, and the instance hibernates on its 3-hour sleep", async () => {
      // The document's failure (imageList empty after hibernation) comes 3 hours later.
      const kv = new StandInKv({ "cutest-http-cat-1": "200", "cutest-http-cat-2": "418" });
      await worker({ "cutest-cats-bad": CutestCatsBad }, { KV: kv });
      await start("cutest-cats-bad", "cats-1");
      const waiting = await server.detailsWhen("cutest-cats-bad", "cats-1", "asleep", (d) => d.status === "waiting" && d.steps.length === 3);
      assert.deepEqual(stepList(waiting), ["step:get first cutest cat from KV#1", "step:get second cutest cat from KV#1", "sleep:💤💤💤💤#1"]);
      assert.equal(stepOf(waiting, "get first cutest cat from KV").output, null);
      assert.equal(stepOf(waiting, "get second cutest cat from KV").output, null);
      assert.equal(sleptFor(stepOf(waiting, "💤💤💤💤", { type: "sleep" })), 3 * HOUR);
      await hibernated("seeds:cutest-cats-bad");
      assert.deepEqual(kv.reads, ["cutest-http-cat-1", "cutest-http-cat-2"]);
    });

    it("state from step returns: the cats are the steps' outputs, kept while the instance hibernates on its 3-hour sleep", async () => {
      const kv = new StandInKv({ "cutest-http-cat-1": "200", "cutest-http-cat-2": "418" });
      await worker({ "cutest-cats": CutestCats }, { KV: kv });
      await start("cutest-cats", "cats-1");
      const waiting = await server.detailsWhen("cutest-cats", "cats-1", "asleep", (d) => d.status === "waiting" && d.steps.length === 3);
      assert.equal(stepOf(waiting, "get first cutest cat from KV").output, "200");
      assert.equal(stepOf(waiting, "get second cutest cat from KV").output, "418");
      assert.equal(sleptFor(stepOf(waiting, "💤💤💤💤", { type: "sleep" })), 3 * HOUR);
      await hibernated("seeds:cutest-cats");
    });

    it("side effects: after a restart the code outside steps runs again (an instance created, a log line, a DB connection) and the steps do not", async () => {
      const another = new CountingBinding("another-workflow", { url: server.url, token });
      // The second create is the step's (the first is the bad one, at the top of the run).
      const hold = new Hold();
      another.holds.set(2, hold);
      const connections: unknown[][] = [];
      install("createDBConnection", (...args: unknown[]) => (connections.push(args), { connected: true }));
      await worker(
        { "side-effects": SideEffects, "another-workflow": AnotherWorkflow },
        { ANOTHER_WORKFLOW: another, DB_URL: "postgres://db.example/app", DB_TOKEN: "db-token" },
      );
      const logs = logged.length;
      await start("side-effects", "effects-1");
      await restartAt("side-effects", "effects-1", hold);
      const done = await server.settled("side-effects", "effects-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      const lines = logged.slice(logs);
      assert.deepEqual(lines.filter((l) => l === "This might be logged more than once").length, 2, JSON.stringify(lines));
      assert.deepEqual(lines.filter((l) => l === "successfully did stuff").length, 1, JSON.stringify(lines));
      assert.deepEqual(connections, [
        ["postgres://db.example/app", "db-token"],
        ["postgres://db.example/app", "db-token"],
      ]);
      // Three instances: one per run outside the steps, one by the step.
      assert.equal(another.calls, 3);
      assert.equal((await server.instances("another-workflow")).length, 3);
      const random = stepOf(done, "create a random number");
      assert.deepEqual(attempts(random), ["ok"]);
      assert.ok(typeof random.output === "number" && random.output >= 0 && random.output < 1, String(random.output));
      const good = stepOf(done, "good step that returns state");
      assert.deepEqual(attempts(good), ["ok"]);
      // The step's instance is the one the second create made.
      assert.deepEqual(good.output, { id: another.created.get(2) });
      assert.deepEqual(attempts(stepOf(done, "do some stuff and have a log for when it runs")), ["ok"]);
    });

    it("the incoming event is not mutated across a restart: the resumed run's steps see the original payload", async () => {
      const kv = new StandInKv({ ada: { name: "Ada Lovelace", plan: "pro" } });
      const hold = kv.holdNext("ada");
      await worker({ "do-not-mutate": DoNotMutate }, { KV: kv });
      await start("do-not-mutate", "restarted", { user: "ada", data: "x" });
      await restartAt("do-not-mutate", "restarted", hold);
      const done = await server.settled("do-not-mutate", "restarted");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      assert.deepEqual(stepOf(done, "good step that returns state").output, { name: "Ada Lovelace", plan: "pro" });
      assert.deepEqual(kv.reads, ["ada", "ada"]);
      assert.deepEqual(done.params, { user: "ada", data: "x" });
      assert.equal(stepOf(done, "following step that uses that state").output, null);
    });

    it("the incoming event is not mutated across steps: the step after the mutating one sees the original payload", async () => {
      // The document: "This will not be persisted across steps and `event.payload` will take
      // on its original value" — here in one run, with no restart between the steps.
      const kv = new StandInKv({ ada: { name: "Ada Lovelace", plan: "pro" } });
      await worker({ "do-not-mutate-one-run": DoNotMutate }, { KV: kv });
      await start("do-not-mutate-one-run", "one-run", { user: "ada", data: "x" });
      const done = await server.settled("do-not-mutate-one-run", "one-run");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      assert.deepEqual(
        stepOf(done, "good step that returns state").output,
        { name: "Ada Lovelace", plan: "pro" },
        `the good step read KV with ${JSON.stringify(kv.reads[1])}, the user of the payload the bad step assigned`,
      );
    });

    it("step names: one made of Date.now() runs again after a restart; deterministic ones, dynamic ones included, do not", async () => {
      const kv = new StandInKv({
        ada: { user: "ada", name: "Ada Lovelace" },
        "cat-list": ["grumpy", "nyan"],
        grumpy: "Grumpy Cat",
        nyan: "Nyan Cat",
      });
      const hold = kv.holdNext("nyan");
      await worker({ "deterministic-names": DeterministicNames }, { KV: kv });
      const logs = logged.length;
      await start("deterministic-names", "names-1", { user: "ada" });
      await restartAt("deterministic-names", "names-1", hold);
      const done = await server.settled("deterministic-names", "names-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      const timed = (done.steps as Details[]).filter((s) => /^step #1 running at: \d+$/.test(s.name));
      assert.equal(timed.length, 2, JSON.stringify(stepList(done)));
      assert.notEqual(timed[0]!.name, timed[1]!.name);
      for (const s of timed) assert.deepEqual(attempts(s), ["ok"]);
      for (const name of ["fetch user data from KV", "get cat list from KV", "get cat: grumpy", "get cat: nyan"]) {
        assert.deepEqual(attempts(stepOf(done, name)), ["ok"], name);
      }
      assert.equal(stepOf(done, "get cat: grumpy").output, "Grumpy Cat");
      assert.equal(stepOf(done, "get cat: nyan").output, "Nyan Cat");
      assert.equal(logged.slice(logs).filter((l) => l.startsWith("fetched at ")).length, 1);
      // The timed step read "ada" in each run; "fetch user data from KV" once.
      assert.deepEqual(kv.reads, ["ada", "ada", "cat-list", "grumpy", "nyan", "ada"]);
    });

    it("Promise.race over two steps: both are kept, the second finished first, and the instance sleeps 2 hours before Another step", async () => {
      // After the 2 hours the run replays with both steps in the journal and the race returns
      // "first" (the document's outcome): that run is not waited for.
      await worker({ "race-bad": RaceBad });
      await start("race-bad", "race-1");
      const waiting = await server.detailsWhen("race-bad", "race-1", "asleep, both steps ended", (d) => d.status === "waiting" && d.steps.length === 3 && ended(d));
      const first = stepOf(waiting, "Promise first race");
      const second = stepOf(waiting, "Promise second race");
      assert.equal(first.output, "first");
      assert.equal(second.output, "second");
      assert.ok(Date.parse(second.end) < Date.parse(first.end), `second ended ${second.end}, first ${first.end}`);
      const sleep = stepOf(waiting, "Sleep step", { type: "sleep" });
      assert.equal(sleptFor(sleep), 2 * HOUR);
      // "A step inside a Promise will run until it finishes": the run went on to the sleep with
      // "second", and the loser ran to its end after that.
      assert.ok(Date.parse(sleep.start) < Date.parse(first.end), `the sleep began ${sleep.start}, first ended ${first.end}`);
      assert.deepEqual(attempts(first), ["ok"]);
      await hibernated("seeds:race-bad");
    });

    it("Promise.race of steps inside a step (the Russian page's good example): the outer step keeps second", async () => {
      await worker({ "race-nested": RaceNested });
      await start("race-nested", "race-1");
      const waiting = await server.detailsWhen("race-nested", "race-1", "asleep, every step ended", (d) => d.status === "waiting" && d.steps.length === 4 && ended(d));
      assert.equal(stepOf(waiting, "Promise step").output, "second");
      assert.equal(stepOf(waiting, "Promise second race").output, "second");
      assert.equal(sleptFor(stepOf(waiting, "Sleep step", { type: "sleep" })), 2 * HOUR);
      await hibernated("seeds:race-nested");
    });

    it("Promise.race inside one step: the step keeps second, the winner, and the instance sleeps 2 hours", async () => {
      await worker({ race: Race });
      await start("race", "race-1");
      const waiting = await server.detailsWhen("race", "race-1", "asleep", (d) => d.status === "waiting" && d.steps.length === 2);
      assert.deepEqual(stepList(waiting), ["step:race step#1", "sleep:Sleep step#1"]);
      const race = stepOf(waiting, "race step");
      assert.deepEqual(attempts(race), ["ok"]);
      assert.equal(race.output, "second");
      assert.equal(sleptFor(stepOf(waiting, "Sleep step", { type: "sleep" })), 2 * HOUR);
      await hibernated("seeds:race");
    });

    it("unique ids: the handler's id made of the user alone fails on that user's second request; the composite ids do not collide", async () => {
      const mapping: [string, string][] = [];
      install("getUserId", (req: Request) => new URL(req.url).searchParams.get("user"));
      install("getTransactionId", () => "txn-1");
      install("addNewInstanceToDB", async (userId: string, instanceId: string) => (mapping.push([userId, instanceId]), { result: "stored" }));
      install("payload", { name: "Ada" });
      const env = { MY_WORKFLOW: workflowBinding("greet", { url: server.url, token }) } as Env;
      const response = await fetchHandler.fetch(new Request("https://app.example/orders?user=ada"), env);
      const body = (await response.json()) as { id: string; details: { status: string } };
      assert.match(body.id, /^ada-[0-9a-f]{6}$/);
      assert.ok(["queued", "running", "complete"].includes(body.details.status), JSON.stringify(body.details));
      assert.deepEqual(mapping, [["ada", body.id]]);
      for (const id of ["ada", body.id]) {
        const done = await server.settled("greet", id);
        assert.equal(done.output, "Hello, Ada!");
      }
      await assert.rejects(
        fetchHandler.fetch(new Request("https://app.example/orders?user=ada"), env),
        (error: unknown) => error instanceof CairnApiError && error.code === "instance.already_exists",
      );
      assert.equal(mapping.length, 1);
    });

    it("a step nobody awaits: the workflow completes without waiting for it, and its state is lost", async () => {
      const held = new Hold();
      const calls: (string | undefined)[] = [];
      install("getIssues", async (repo: string | undefined) => {
        calls.push(repo);
        // The step nobody awaits is still running when the workflow returns.
        if (calls.length === 1) await held.wait();
        return [`${repo}#1`, `${repo}#2`];
      });
      await worker({ "await-steps": AwaitSteps });
      try {
        await start("await-steps", "issues-1", { user: "ada", repoName: "cairn" });
        const done = await server.settled("await-steps", "issues-1");
        assert.equal(done.status, "complete", JSON.stringify(done.error));
        assert.equal(done.output, null);
        assert.deepEqual(stepOf(done, "fetch issues from GitHub", { count: 2 }).output, ["cairn#1", "cairn#2"]);
        const lost = stepOf(done, "fetch issues from GitHub", { count: 1 });
        assert.equal(lost.success, false);
        assert.equal(lost.cancelled, true);
        assert.deepEqual(calls, ["cairn", "cairn"]);
      } finally {
        held.release();
      }
    });

    it("a step nobody awaits that fails: its error is swallowed, the workflow completes and the worker process lives on", async () => {
      // A worker process of its own, with no handler for unhandled rejections, as a user's.
      const proc = new WorkerProcess(fixture("examples-worker"), "await-steps", { CAIRN_URL: server.url, CAIRN_TOKEN: token, WORKFLOW: "await-steps-process" });
      try {
        await proc.connected();
        await start("await-steps-process", "cairn-issues", { user: "ada", repoName: "cairn-issues" });
        const outcome = await until("the instance to complete, or its worker to die", async () => {
          if (!proc.alive) return "died";
          const d = await server.details("await-steps-process", "cairn-issues");
          return d.status === "complete" ? d : undefined;
        }, 15_000);
        assert.ok(proc.alive, `the worker process died:\n${proc.output}`);
        const done = outcome as Details;
        assert.equal(done.output, null);
        const failed = stepOf(done, "fetch issues from GitHub", { count: 1 });
        assert.deepEqual(attempts(failed), ["NonRetryableError: GitHub is down for cairn-issues"]);
        assert.deepEqual(stepOf(done, "fetch issues from GitHub", { count: 2 }).output, ["cairn-issues#1", "cairn-issues#2"]);
      } finally {
        await proc.kill();
      }
    });

    it("conditions on a step's output and on the payload: after a restart they follow the journal, whatever KV says by then", async () => {
      const kv = new StandInKv({ "feature-flags": { enableEmailNotifications: true } });
      const hold = kv.holdNext("feature-flags");
      // The bad branch draws Math.random() outside a step: fixed (> 0.5) so that its step is
      // known; "decide randomly" draws inside its step, once.
      const random = Math.random;
      Math.random = () => 0.75;
      try {
        await worker({ conditional: Conditional }, { KV: kv });
        await start("conditional", "flags-1", { user: "ada", userType: "premium" });
        await restartAt("conditional", "flags-1", hold, () => {
          kv.entries["feature-flags"] = { enableEmailNotifications: false };
        });
        const done = await server.settled("conditional", "flags-1");
        assert.equal(done.status, "complete", JSON.stringify(done.error));
        assert.deepEqual(stepList(done), [
          "step:fetch config#1",
          "step:send email#1",
          "step:premium processing#1",
          "step:maybe do something#1",
          "step:decide randomly#1",
          "step:conditionally do something#1",
        ]);
        assert.deepEqual(stepOf(done, "fetch config").output, { enableEmailNotifications: true });
        assert.deepEqual(kv.reads, ["feature-flags"]);
        const decided = stepOf(done, "decide randomly");
        assert.deepEqual(attempts(decided), ["ok"]);
        assert.equal(decided.output, true);
      } finally {
        Math.random = random;
      }
    });

    it("batching: createBatch skips the ids the one-by-one creates made, and returns none", async () => {
      const env = { MY_WORKFLOW: workflowBinding("greet", { url: server.url, token }) } as Env;
      const response = await batchHandler.fetch(new Request("https://app.example/batch"), env);
      assert.deepEqual(await response.json(), { instances: [] });
      for (const [id, name] of [["user1", "John"], ["user2", "Jane"], ["user3", "Alice"], ["user4", "Bob"]]) {
        const done = await server.settled("greet", id!);
        assert.equal(done.output, `Hello, ${name}!`);
      }
    });

    describe("large data", () => {
      let dataset: unknown;
      let fetches = 0;
      let bucket: StandInBucket;
      const processed: unknown[] = [];
      before(async () => {
        routes.set("https://api.example.com/large-dataset", () => {
          fetches += 1;
          return Response.json(dataset);
        });
        install("processData", (data: { rows: unknown[] }) => (processed.push(data), { rows: data.rows.length }));
        bucket = new StandInBucket();
        await worker({ "large-data": LargeData }, { MY_BUCKET: bucket });
      });

      /** Rows of about 100 bytes of JSON each. */
      const rows = (bytes: number) => ({ rows: Array.from({ length: Math.round(bytes / 100) }, (_, i) => ({ id: i, text: "x".repeat(80) })) });

      it("under 1 MiB: the dataset goes to the bucket and the next step reads it back by its key", async () => {
        dataset = rows(600_000);
        fetches = 0;
        await start("large-data", "600KB");
        const done = await server.settled("large-data", "600KB");
        assert.equal(done.status, "complete", JSON.stringify(done.error));
        assert.deepEqual(stepOf(done, "fetch and store large dataset").output, { key: "dataset-123" });
        assert.equal(bucket.objects.get("dataset-123"), JSON.stringify(dataset));
        assert.deepEqual(stepOf(done, "process dataset").output, { rows: 6_000 });
        assert.deepEqual(processed, [dataset]);
        assert.equal(fetches, 2);
      });

      for (const [label, id, bytes] of [["1.5 MiB", "one-and-a-half-mib", 1.5 * 1_048_576], ["3 MiB", "three-mib", 3 * 1_048_576]] as const) {
        it(`a step returning ${label} fails, at its first attempt, and the workflow errors`, async () => {
          dataset = rows(bytes);
          fetches = 0;
          bucket.objects.clear();
          await start("large-data", id);
          try {
            // Decided: the step ended, or a retry is due.
            const decided = await server.detailsWhen("large-data", id, "failed or retrying", (d) => d.steps[0]?.success != null || d.steps[0]?.retriesAt != null);
            const big = stepOf(decided, "fetch large dataset");
            assert.equal(big.success, false, `the step's attempts: ${JSON.stringify(attempts(big))}, retried at ${big.retriesAt}`);
            assert.equal(big.retriesAt, null);
            const done = await server.settled("large-data", id);
            assert.equal(done.status, "errored");
            assert.match(done.error.message, /too large/);
            assert.deepEqual(stepList(done), ["step:fetch large dataset#1"]);
            assert.equal(bucket.objects.size, 0);
            assert.equal(fetches, 1);
          } finally {
            // A retried step would go on for minutes.
            await server.api("PATCH", `/api/workflows/large-data/instances/${id}/status`, { status: "terminate" });
          }
        });
      }
    });
  });

  describe("Sleeping and retrying", () => {
    it('step.sleep("1 hour"): the instance waits, its wake time an hour after the sleep began', async () => {
      await worker({ sleepy: Sleepy });
      await start("sleepy", "nap-1");
      const waiting = await server.detailsWhen("sleepy", "nap-1", "asleep", (d) => d.status === "waiting" && d.steps.length === 1);
      assert.equal(sleptFor(stepOf(waiting, "sleep for a bit", { type: "sleep" })), HOUR);
      await hibernated("seeds:sleepy");
    });

    it("step.sleepUntil the document's date, now past: the instance errors as on Cloudflare, which refuses a time in the past", async () => {
      // The document's date is the Workflows launch, 24 Oct 2024. Cloudflare's sleepUntil
      // throws this very error for a time before now (workers-sdk, workflows-shared); the next
      // test sleeps until a time to come.
      await worker({ "sleep-until": SleepUntil });
      await start("sleep-until", "launch");
      const done = await server.settled("sleep-until", "launch");
      assert.equal(done.status, "errored");
      assert.deepEqual(done.error, { name: "Error", message: "You can't sleep until a time in the past, time-traveler" });
    });

    it("step.sleepUntil a UNIX timestamp in milliseconds: the instance waits until exactly then", async () => {
      const at = Date.now() + 90 * 60_000;
      await worker({ "sleep-until-timestamp": SleepUntilTimestamp });
      await start("sleep-until-timestamp", "later", { at });
      const waiting = await server.detailsWhen("sleep-until-timestamp", "later", "asleep", (d) => d.status === "waiting" && d.steps.length === 1);
      assert.equal(stepOf(waiting, "sleep until X times out", { type: "sleep" }).until, new Date(at).toISOString());
    });

    it("a step's own retry config is the one it runs with: 10 retries, 10 seconds, exponential, 30 minutes", async () => {
      await worker({ "call-an-api": CallAnApi });
      await start("call-an-api", "api-1");
      const done = await server.settled("call-an-api", "api-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      const call = stepOf(done, "call an API");
      assert.deepEqual(call.config, { retries: { limit: 10, delay: 10_000, backoff: "exponential" }, timeout: "30 minutes" });
      assert.deepEqual(attempts(call), ["ok"]);
      assert.equal(call.output, null);
    });

    it("the delay function: 30 seconds times the attempt after a rate limit, 10 seconds after another error", async () => {
      await worker({ "sync-customer": SyncCustomer });
      for (const [id, message, delay] of [["rate-limited", "rate limit exceeded", 30_000], ["reset", "connection reset", 10_000]] as const) {
        install("syncCustomer", async () => {
          throw new Error(message);
        });
        await start("sync-customer", id);
        try {
          const retrying = await server.detailsWhen("sync-customer", id, "retrying", (d) => d.steps[0]?.retriesAt != null);
          const sync = stepOf(retrying, "sync customer");
          assert.deepEqual(attempts(sync), [`Error: ${message}`]);
          assert.equal(sync.attempts[0].retryDelayMs, delay, id);
          // The retry is due that long after the attempt (to the engine's clock readings, a few ms apart).
          const due = Date.parse(sync.retriesAt) - Date.parse(sync.attempts[0].end);
          assert.ok(Math.abs(due - delay) < 1_000, `${id}: due ${due} ms after the attempt`);
        } finally {
          await setStatus("sync-customer", id, "terminate");
        }
      }
    });

    it("NonRetryableError not caught: the instance errors at once, its step tried once; with the payload it completes", async () => {
      await worker({ "my-workflow": MyWorkflow });
      await start("my-workflow", "no-data", { user: "ada" });
      await start("my-workflow", "with-data", { user: "ada", data: "payload" });
      const failed = await server.settled("my-workflow", "no-data");
      assert.equal(failed.status, "errored");
      assert.deepEqual(failed.error, { name: "NonRetryableError", message: "event.payload.data did not contain the expected payload" });
      const some = stepOf(failed, "some step");
      assert.deepEqual(attempts(some), ["NonRetryableError: event.payload.data did not contain the expected payload"]);
      assert.equal(some.retriesAt, null);
      assert.equal((await server.settled("my-workflow", "with-data")).status, "complete");
    });

    it("a rollback handler: the reservation is released, with the step's rollbackConfig, before the instance errors", async () => {
      const reserved: string[] = [];
      const released: string[] = [];
      install("reserveInventory", async () => (reserved.push("res-42"), { id: "res-42" }));
      install("releaseInventory", async (id: string) => void released.push(id));
      await worker({ "order-workflow": OrderWorkflow });
      await start("order-workflow", "order-1");
      const done = await server.settled("order-workflow", "order-1");
      assert.equal(done.status, "errored");
      assert.deepEqual(done.error, { name: "NonRetryableError", message: "payment processor rejected the charge" });
      assert.deepEqual(done.rollback, { outcome: "completed" });
      assert.deepEqual(reserved, ["res-42"]);
      assert.deepEqual(released, ["res-42"]);
      assert.deepEqual(stepList(done), ["step:reserve inventory#1", "step:charge card#1", "rollback:reserve inventory#1"]);
      const rollback = stepOf(done, "reserve inventory", { type: "rollback" });
      assert.equal(rollback.success, true);
      assert.deepEqual(rollback.config, { retries: { limit: 3, delay: 10_000, backoff: "linear" }, timeout: "2 minutes" });
    });

    it("NonRetryableError caught: the clean-up step runs and the workflow goes on to the end", async () => {
      await worker({ "catch-and-continue": CatchAndContinue });
      const logs = logged.length;
      await start("catch-and-continue", "caught-1");
      const done = await server.settled("catch-and-continue", "caught-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      assert.deepEqual(stepList(done), ["step:task#1", "step:non-retryable-task#1", "step:clean-up-task#1", "step:next-task#1"]);
      assert.deepEqual(attempts(stepOf(done, "non-retryable-task")), ["NonRetryableError: oh no"]);
      assert.deepEqual(logged.slice(logs), ["Step failed: oh no"]);
      assert.equal(done.rollback ?? null, null);
    });
  });

  describe("Saga rollbacks (the blog post)", () => {
    const transfer = { from: "alice", to: "bob", amount: 100 };

    /** Banks A and B on one ledger, and a notifyBoth that fails for good. */
    function banks(failing: { A?: string[]; B?: string[] } = {}): string[] {
      const ledger: string[] = [];
      install("bankA", new StandInBank("A", ledger, failing.A));
      install("bankB", new StandInBank("B", ledger, failing.B));
      install("notifyBoth", async () => {
        throw new NonRetryableError("the mail server refused the message");
      });
      install("alertOnCall", async (what: string) => void ledger.push(`alert: ${what}`));
      return ledger;
    }

    it("compensation by hand: the catch block undoes the credit, then the debit, and the instance errors with notify's error", async () => {
      const ledger = banks();
      await worker({ "saga-by-hand": SagaByHand });
      await start("saga-by-hand", "transfer-1", transfer);
      const done = await server.settled("saga-by-hand", "transfer-1");
      assert.equal(done.status, "errored");
      assert.deepEqual(done.error, { name: "NonRetryableError", message: "the mail server refused the message" });
      assert.deepEqual(ledger, ["A.debit alice 100", "B.credit bob 100", "B.debit bob 100 B-credit-2", "A.credit alice 100 A-debit-1"]);
      assert.deepEqual(stepList(done), [
        "step:debit-bank-a#1",
        "step:credit-bank-b#1",
        "step:notify#1",
        "step:reverse-credit-b#1",
        "step:refund-debit-a#1",
      ]);
    });

    it("rollbacks: the handlers undo the credit, then the debit (reverse step-start order), then the instance errors", async () => {
      const ledger = banks();
      await worker({ "saga-with-rollbacks": SagaWithRollbacks });
      await start("saga-with-rollbacks", "transfer-1", transfer);
      const done = await server.settled("saga-with-rollbacks", "transfer-1");
      assert.equal(done.status, "errored");
      assert.deepEqual(done.error, { name: "NonRetryableError", message: "the mail server refused the message" });
      assert.deepEqual(done.rollback, { outcome: "completed" });
      assert.deepEqual(ledger, ["A.debit alice 100", "B.credit bob 100", "B.debit bob 100 B-credit-2", "A.credit alice 100 A-debit-1"]);
      assert.deepEqual(stepList(done), [
        "step:debit-bank-a#1",
        "step:credit-bank-b#1",
        "step:notify#1",
        "rollback:credit-bank-b#1",
        "rollback:debit-bank-a#1",
      ]);
    });

    const ids = { fromAccountId: "acc-a", toAccountId: "acc-b", amount: 250 };

    it("the transfer: the confirmation fails, and both rollbacks run in reverse order with their idempotency keys", async () => {
      const ledger = banks();
      const confirmations: unknown[] = [];
      install("sendTransferConfirmation", async (details: unknown) => {
        confirmations.push(details);
        throw new NonRetryableError("the mailer is down");
      });
      await worker({ transfer: Transfer });
      await start("transfer", "t-1", { ...ids, transferId: "t-1" });
      const done = await server.settled("transfer", "t-1");
      assert.equal(done.status, "errored");
      assert.deepEqual(done.error, { name: "NonRetryableError", message: "the mailer is down" });
      assert.deepEqual(done.rollback, { outcome: "completed" });
      assert.deepEqual(ledger, [
        "A.debit acc-a 250 t-1:debit-account-a",
        "B.credit acc-b 250 t-1:credit-account-b",
        "B.debit acc-b 250 t-1:rollback-credit-account-b",
        "A.credit acc-a 250 t-1:rollback-debit-account-a",
      ]);
      assert.deepEqual(confirmations, [{}]);
      assert.deepEqual(stepList(done).filter((s) => s.startsWith("rollback:")), ["rollback:credit-account-b#1", "rollback:debit-account-a#1"]);
    });

    it("the transfer: the credit fails, its own rollback gets no output and does nothing, and the debit is refunded", async () => {
      const ledger = banks({ B: ["credit"] });
      await worker({ "transfer-credit-fails": Transfer });
      await start("transfer-credit-fails", "t-2", { ...ids, transferId: "t-2" });
      const done = await server.settled("transfer-credit-fails", "t-2");
      assert.equal(done.status, "errored");
      assert.deepEqual(done.error, { name: "NonRetryableError", message: "bank B refused the credit" });
      assert.deepEqual(done.rollback, { outcome: "completed" });
      assert.deepEqual(ledger, [
        "A.debit acc-a 250 t-2:debit-account-a",
        "B.credit acc-b 250 t-2:credit-account-b",
        "A.credit acc-a 250 t-2:rollback-debit-account-a",
      ]);
      assert.deepEqual(stepList(done), [
        "step:debit-account-a#1",
        "step:credit-account-b#1",
        "rollback:credit-account-b#1",
        "rollback:debit-account-a#1",
      ]);
      for (const name of ["credit-account-b", "debit-account-a"]) assert.equal(stepOf(done, name, { type: "rollback" }).success, true, name);
    });

    it("a step starts when step.do is called, not when it is awaited: first starts before second", async () => {
      const started: string[] = [];
      const secondStarted = deferred();
      install("serviceA", {
        call: async () => {
          started.push("A");
          // Ends only once second has started: the two run at once.
          await secondStarted.promise;
          return "a";
        },
      });
      install("serviceB", {
        call: async () => {
          started.push("B");
          secondStarted.resolve();
          return "b";
        },
      });
      await worker({ "start-order": StartOrder });
      await start("start-order", "order-1");
      const done = await server.settled("start-order", "order-1");
      assert.equal(done.status, "complete", JSON.stringify(done.error));
      assert.deepEqual(started, ["A", "B"]);
      assert.equal(stepOf(done, "first").output, "a");
      assert.equal(stepOf(done, "second").output, "b");
      assert.ok(Date.parse(stepOf(done, "first").start) <= Date.parse(stepOf(done, "second").start));
    });
  });
});
